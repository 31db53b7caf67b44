"""What is trained: the model, its input transform and its likelihood, as one :class:`Objective`; and what
an input transform can be asked (:func:`takes_num_samples`, :func:`widens`, :func:`parameter_step_spread`)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import PartitionArgumentError, first_names
from ...fx.partitioned_model import PartitionedModel
from ...transforms.base import HyperparameterModule, WidensRanges, outermost_hyperparameter_modules
from ..checkpoint import (
    buffers_digest,
    checkpoint_identity,
    load_checkpoint,
    restore_module_states,
    state_tensors,
    write_checkpoint,
)
from .likelihoods import Likelihood

ModuleStates = dict[str, dict[str, torch.Tensor]]
"""``{"model": ..., "hyper": ..., "likelihood": ...}``: each module's state without what checkpoints leave out."""


class Objective:
    """What is trained, in one object: the model ``pmodel``, its input transform ``hyper`` and its
    ``likelihood`` (None: absent), whose parameters and hyperparameters (psi) training steps together.

    It answers what every part of training asks of the three: psi and the modules that hold it
    (:meth:`hyperparameters`, :meth:`hyperparameter_modules`, :meth:`hyperparameter_values`), their states as
    checkpoints hold them (:meth:`states`, :meth:`save`, :meth:`load`, :meth:`restore`, :meth:`is_current`: the
    model's rebuilt buffers left out, the layouts and the defaults unless ``checkpoint_defaults``, see
    ``PartitionedModel.rebuilt_buffers``: they never change), and the names a fault message gives a tensor
    (:meth:`tensor_names`, :meth:`storage_names`). The losses through its subnetworks are ``training.objective.lml``'s.

    Example::

        >>> import tempfile
        >>> from partition_fx import partitionify
        >>> objective = Objective(partitionify(nn.Linear(2, 2), 2))
        >>> kept = objective.states(copy_values=True)
        >>> path = Path(tempfile.mkdtemp()) / "last.safetensors"
        >>> objective.save(path, 3, kept, lml=-1.5)
        >>> objective.load(path)["step"], objective.is_current(kept)
        (3, True)
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        hyper: nn.Module | None = None,
        likelihood: Likelihood | None = None,
        *,
        checkpoint_defaults: bool = True,
    ) -> None:
        self.pmodel = pmodel
        self.hyper = hyper
        self.likelihood = likelihood
        self.checkpoint_defaults = checkpoint_defaults
        self._omitted: dict[str, Any] | None = None

    def place(self, device: torch.device | None) -> torch.device | None:
        """Move the modules to ``device`` (default: where the model's first trainable parameter, else its first
        buffer, is); returns the device (None for a model with neither)."""
        params = [p for p in self.pmodel.parameters() if p.requires_grad]
        first = params[0] if params else next(self.pmodel.buffers(), None)
        device = device if device is not None else (first.device if first is not None else None)
        if device is not None:
            for m in self.modules().values():
                m.to(device)
        return device

    @property
    def required_likelihood(self) -> Likelihood:
        """:attr:`likelihood`, for what scores examples through it (the training steps, the LML estimate): refused
        when the objective has none."""
        if self.likelihood is None:
            raise PartitionArgumentError(
                "this objective has no likelihood to score examples with: Objective(pmodel, hyper, Categorical()), "
                "or TrainingSteps.create(...), whose default is Categorical()"
            )
        return self.likelihood

    def modules(self) -> dict[str, nn.Module]:
        """The modules by the name their states are kept under."""
        found = {"model": self.pmodel, "hyper": self.hyper, "likelihood": self.likelihood}
        return {name: m for name, m in found.items() if m is not None}

    def _omitted_buffers(self) -> dict[str, torch.Tensor]:
        return self.pmodel.rebuilt_buffers(defaults=not self.checkpoint_defaults)

    def states(self, copy_values: bool = False) -> ModuleStates:
        """The modules' states without the buffers checkpoints leave out; detached, and copied with
        ``copy_values``."""
        rebuilt = self._omitted_buffers().keys()
        states = {
            name: {k: v.detach() for k, v in m.state_dict().items() if name != "model" or k not in rebuilt}
            for name, m in self.modules().items()
        }
        return copy.deepcopy(states) if copy_values else states

    def omitted(self) -> dict[str, Any]:
        """What checkpoints leave out of the model and the digest that recognises it:
        ``{"omitted": "layouts" or "layouts+defaults", "omitted_sha256": ...}``."""
        if self._omitted is None:
            kinds = "layouts" if self.checkpoint_defaults else "layouts+defaults"
            self._omitted = {"omitted": kinds, "omitted_sha256": buffers_digest(self._omitted_buffers())}
        return self._omitted

    def identity(self) -> dict[str, Any]:
        """The partitioning a checkpoint belongs to: model class, C, proportions and scheme
        (``checkpoint.checkpoint_identity``)."""
        return checkpoint_identity(self.pmodel)

    def save(
        self,
        path: str | Path,
        step: int,
        states: ModuleStates,
        *,
        lml: float | None = None,
        conditional_lml: float | None = None,
        final: bool = False,
        norm_statistics: str | None = None,
    ) -> None:
        """``states`` (as :meth:`states` gives them) in one safetensors file (atomic replace), with ``step``,
        the ``lml`` and ``conditional_lml`` of its evaluation (None: none estimated there), the configuration,
        ``final`` and ``norm_statistics`` (default
        ``"training"``, or ``"none"`` for a model without running statistics: see
        ``checkpoint.NORM_STATISTICS``) in its metadata."""
        if norm_statistics is None:
            norm_statistics = "training" if running_norms(self.pmodel) else "none"
        tensors = state_tensors(states, ".")
        meta = {
            "step": step,
            "lml": lml,
            "conditional_lml": conditional_lml,
            "final": final,
            "norm_statistics": norm_statistics,
            "storage": "flat",
        }
        write_checkpoint(path, tensors, {**meta, **self.identity(), **self.omitted()})

    def load(self, path: str | Path) -> dict[str, Any]:
        """Load the tensors :meth:`save` wrote; returns its metadata (``training.load_checkpoint``)."""
        return load_checkpoint(self.pmodel, path, hyper=self.hyper, likelihood=self.likelihood)

    def restore(self, states: ModuleStates, source: str = "the best state") -> None:
        """Load kept states (a missing module: empty); one that does not fit is refused naming ``source``."""
        restore_module_states(self.pmodel, self.modules(), states, source)

    def is_current(self, states: ModuleStates) -> bool:
        """Whether ``states`` are the current ones (BatchNorm running statistics aside, which the end of a run
        recalibrates): the same weights in every module."""
        norms = {id(m) for m in running_norms(self.pmodel)}
        statistics = {
            f"{name}.{key}" if name else key
            for name, m in self.pmodel.named_modules()
            if id(m) in norms
            for key, _ in m.named_buffers(recurse=False)
        }
        current = self.states()
        return all(
            torch.equal(value, current[name][key])
            for name, state in states.items()
            for key, value in state.items()
            if name != "model" or key not in statistics
        )

    # --- psi and the modules that hold it -----------------------------------------------------------

    def hyperparameter_modules(self) -> list[tuple[str, HyperparameterModule]]:
        """Every hyperparameter module (in the input transform, in the model, the likelihood) with the prefix
        its values are reported under.

        Example::

            >>> import torch
            >>> from partition_fx import partitionify
            >>> from partition_fx.transforms import InputMask
            >>> objective = Objective(partitionify(torch.nn.Linear(4, 2), 2), InputMask(4))
            >>> [(prefix, type(m).__name__) for prefix, m in objective.hyperparameter_modules()]
            [('', 'InputMask')]
        """
        found = outermost_hyperparameter_modules(self.hyper)
        found += self.pmodel.hyperparameter_modules()
        if isinstance(self.likelihood, HyperparameterModule):
            found.append(("", self.likelihood))
        return found

    def hyperparameter_values(self) -> dict[str, Any]:
        """The hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
        values: dict[str, Any] = {}
        for prefix, m in self.hyperparameter_modules():
            for key, value in m.hyperparameters().items():
                values[f"{prefix}.{key}" if prefix else key] = value
        return values

    def hyperparameters(self) -> list[nn.Parameter]:
        """psi: the trainable parameters of the model's hyperparameter modules, of ``hyper`` and of the
        likelihood, each once; refused if one is also a model parameter (it would be stepped twice)."""
        pmodel = self.pmodel
        seen: dict[int, nn.Parameter] = {}
        for _, m in pmodel.hyperparameter_modules():
            seen.update((id(p), p) for p in m.parameters() if p.requires_grad)
        for module in (self.hyper, self.likelihood):
            if module is not None:
                seen.update((id(p), p) for p in module.parameters() if p.requires_grad)
        model_params = {id(p) for k in range(1, pmodel.num_partitions + 1) for p in pmodel.partition_parameters(k)}
        if model_params & seen.keys():
            raise PartitionArgumentError("a hyperparameter is also a model parameter; hyper modules must be separate")
        return list(seen.values())

    # --- names for fault messages -------------------------------------------------------------------

    def _parameter_names(self) -> dict[int, str]:
        """``id(parameter) -> name`` for the model's own parameters and the hyperparameter modules'."""
        names = {id(p): n.removeprefix("module.") for n, p in self.pmodel.named_parameters()}
        for prefix, m in (("hyper", self.hyper), ("likelihood", self.likelihood)):
            if m is not None:
                names.update((id(p), f"{prefix}.{n}") for n, p in m.named_parameters())
        return names

    def tensor_names(self) -> dict[int, str]:
        """``id(tensor) -> name`` for every trainable tensor: ``0.weight partition 2``, ``hyper.logits``, ..."""
        names = self._parameter_names()
        shared: dict[int, list[str]] = {}  # a flat group's part: the members whose share of its gradient is bad
        for name, pt in self.pmodel.partitioned_tensors():
            for k in range(1, pt.num_partitions + 1):
                storage = pt.storage(k)
                if storage is pt.part(k):
                    names[id(storage)] = f"{name} partition {k}"
                    continue
                grad = pt.part_grad(k)
                bad = grad is not None and not torch.isfinite(grad).all()
                shared.setdefault(id(storage), [])
                if bad:
                    shared[id(storage)].append(name)
                    names[id(storage)] = ", ".join(f"{bad_name} partition {k}" for bad_name in shared[id(storage)])
        return names

    def storage_names(self) -> dict[int, str]:
        """``id(tensor) -> name`` for every trainable tensor once its gradient is gone (a lazy check): a flat
        group's storage of partition k is named by its members, ``0.weight, 0.bias and 4 more partition 2``."""
        names = self._parameter_names()
        members: dict[int, tuple[int, list[str]]] = {}
        for name, pt in self.pmodel.partitioned_tensors():
            for k in range(1, pt.num_partitions + 1):
                storage = pt.storage(k)
                if storage is pt.part(k):
                    names[id(storage)] = f"{name} partition {k}"
                else:
                    members.setdefault(id(storage), (k, []))[1].append(name)
        for key, (k, held) in members.items():
            names[key] = f"{first_names(held, 2)} partition {k}"
        return names


def widens(hyper: nn.Module | None) -> bool:
    """Whether ``train_range_factor`` applies to ``hyper``: it can draw from scaled ranges
    (:class:`~partition_fx.transforms.WidensRanges`)."""
    return isinstance(hyper, WidensRanges)


def parameter_step_spread(
    hyper: nn.Module | None, factor: float, factors: Mapping[str, float] | None
) -> float | dict[str, float]:
    """What partitioned training's parameter steps widen ``hyper``'s learned ranges by (``hyper.widened``):
    ``train_range_factor`` for every range, or, where ``train_range_factors`` names ranges, each of ``hyper``'s
    generators its own factor (those it names theirs, every other ``factor``). A name that is not one of ``hyper``'s
    generators is refused.

    >>> from partition_fx.transforms import AffineAugmentation
    >>> aug = AffineAugmentation(generators=["rotation", "scale"])
    >>> parameter_step_spread(aug, 0.5, None), parameter_step_spread(aug, 0.5, {"scale": 1.0})
    (0.5, {'rotation': 0.5, 'scale': 1.0})
    >>> parameter_step_spread(aug, 0.5, {"shear": 1.0})
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: train_range_factors names shear, but AffineAugmentation's ranges are ...
    """
    if not factors:
        return factor
    generators = tuple(getattr(hyper, "generators", ()))
    unknown = [name for name in factors if name not in generators]
    if unknown:
        what = (
            "there is no input transform"
            if hyper is None
            else f"{type(hyper).__name__}'s ranges are {', '.join(generators) or 'not named per generator'}"
        )
        raise PartitionArgumentError(
            f"train_range_factors names {unknown[0]}, but {what}; name its ranges or leave train_range_factors out"
        )
    return {**dict.fromkeys(generators, factor), **factors}


def takes_num_samples(hyper: nn.Module | None) -> bool:
    """Whether ``hyper``'s forward can be asked for a number of samples (``num_samples=``)."""
    if hyper is None:
        return False
    try:
        return "num_samples" in inspect.signature(hyper.forward).parameters
    except (TypeError, ValueError):  # a builtin or C forward without a signature
        return False


def running_norms(model: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    """The normalisation layers of ``model`` that keep running statistics (BatchNorm, and InstanceNorm with
    ``track_running_stats``): what :func:`recalibrate_norm_statistics` recomputes, what data-parallel training
    broadcasts from rank 0 and what federated training refuses. The one definition of them.

    >>> len(running_norms(nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm1d(2, track_running_stats=False))))
    1
    """
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]
