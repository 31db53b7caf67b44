"""The state of training: the trained modules' states (model, input transform, likelihood), what checkpoints
hold and leave out of them, single-file checkpoints (``TrainedModules``); and the whole state a resumed run
continues from, with the run's evaluations and best state (``TrainingState``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PartitionCheckpointError
from ..partitioned_model import PartitionedModel
from .checkpoint import (
    buffers_digest,
    checkpoint_identity,
    cpu_copy,
    differences,
    load_checkpoint,
    restore_module_states,
    write_checkpoint,
)
from .chunks import Examples
from .lml import recalibrate_norm_statistics, running_norms
from .sampler import PartitionedSampler
from .stepping import Stepper
from .steps import TrainingSteps

ModuleStates = dict[str, dict[str, torch.Tensor]]
"""``{"model": ..., "hyper": ..., "likelihood": ...}``: each module's state without what checkpoints leave out."""


class TrainedModules:
    """The model ``pmodel``, input transform ``hyper`` and ``likelihood`` (None: absent) as checkpoints hold
    them. The model's rebuilt buffers are left out (the layouts, and the defaults unless
    ``checkpoint_defaults``: see ``PartitionedModel.rebuilt_buffers``); they never change.

    Example::

        >>> import tempfile
        >>> from partition_fx import partitionify
        >>> trained = TrainedModules(partitionify(nn.Linear(2, 2), 2))
        >>> kept = trained.states(copy_values=True)
        >>> path = Path(tempfile.mkdtemp()) / "last.safetensors"
        >>> trained.save(path, 3, kept, {"lml": -1.5})
        >>> trained.load(path)["step"], trained.is_current(kept)
        (3, True)
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        hyper: nn.Module | None = None,
        likelihood: nn.Module | None = None,
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
        record: dict[str, Any],
        *,
        final: bool = False,
        norm_statistics: str | None = None,
    ) -> None:
        """``states`` (as :meth:`states` gives them) in one safetensors file (atomic replace), with ``step``,
        the LMLs of its evaluation ``record``, the configuration, ``final`` and ``norm_statistics`` (default
        ``"training"``, or ``"none"`` for a model without running statistics: see
        ``checkpoint.NORM_STATISTICS``) in its metadata."""
        if norm_statistics is None:
            norm_statistics = "training" if running_norms(self.pmodel) else "none"
        tensors = {f"{name}.{k}": cpu_copy(v) for name, state in states.items() for k, v in state.items()}
        lml = {"lml": record.get("lml"), "conditional_lml": record.get("conditional_lml")}  # the step's estimates
        meta = {"step": step, **lml, "final": final, "norm_statistics": norm_statistics, "storage": "flat"}
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

    def recalibrated(
        self, states: ModuleStates, examples: Examples, batch_size: int, device: torch.device | None
    ) -> ModuleStates:
        """``states`` with the model's BatchNorm running statistics recalibrated for the final subnetwork over
        ``examples`` (``recalibrate_norm_statistics``), computed on a copy of the model: the model, and torch's
        random generators, stay as they are."""
        pmodel = copy.deepcopy(self.pmodel)
        pmodel.load_state_dict({**pmodel.state_dict(), **states["model"]})
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            recalibrate_norm_statistics(pmodel, examples, batch_size=batch_size, device=device)
        recalibrated = pmodel.state_dict()
        return {**states, "model": {k: recalibrated[k].detach() for k in states["model"]}}


class TrainingState:
    """Where a run is, and everything it needs to continue bit for bit: its evaluations (``history``), the best
    one so far (``best``: score, step and kept module states), the step fine-tuning began at
    (``finetune_start``), with the iterations done (``steps.step``), the ``modules``, the ``stepper``'s
    optimisers, schedulers and pending losses, and every random generator (torch's, the ``sampler``'s and the
    LML estimate's ``lml_generator``). ``configuration``: the options that change the iteration, which a saved
    state must match to resume (with the rest of :meth:`fingerprint`).

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical, PartitionedSampler, split_into_chunks
        >>> from partition_fx.training.steps import TrainingSteps
        >>> from partition_fx.training.stepping import Stepper
        >>> pmodel, examples = partitionify(nn.Linear(2, 2), 2), Examples((torch.randn(20, 2), torch.zeros(20).long()))
        >>> stepper = Stepper(torch.optim.SGD(pmodel.parameters(), lr=0.1), modules=(pmodel, None, None))
        >>> steps = TrainingSteps(pmodel, Categorical(), examples, stepper)
        >>> sampler = PartitionedSampler(split_into_chunks(20, (0.5, 0.5)), batch_size=4)
        >>> state = TrainingState(TrainedModules(pmodel), steps, stepper, sampler, torch.Generator(), {"fused": False})
        >>> saved = state.state_dict()
        >>> _ = steps.parameter_step(*sampler.parameter_batch()); steps.advance()
        >>> state.load_state_dict(saved); steps.step
        0
    """

    def __init__(
        self,
        modules: TrainedModules,
        steps: TrainingSteps,
        stepper: Stepper,
        sampler: PartitionedSampler,
        lml_generator: torch.Generator,
        configuration: dict[str, Any],
    ) -> None:
        self.modules = modules
        self.steps = steps
        self.stepper = stepper
        self.sampler = sampler
        self.lml_generator = lml_generator
        self.configuration = configuration
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, int, ModuleStates] | None = None
        self.finetune_start: int | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to resume: the partitioning, the data chunks and batch sizes, the
        ``configuration``, and the names and shapes of everything trained."""
        pmodel = self.modules.pmodel
        return {
            **self.modules.identity(),
            **self.modules.omitted(),
            "default": pmodel.default,
            "chunk_sizes": self.sampler.chunks.sizes,
            "num_examples": len(self.steps.examples),
            **self.configuration,
            "parameters": {name: list(p.shape) for name, p in pmodel.named_parameters()},
            "hyperparameters": [list(p.shape) for p in self.stepper.hyperparameters],
        }

    def add_evaluation(self, record: dict[str, Any], score: float | None) -> bool:
        """Append an evaluation's ``record`` to :attr:`history`; keep a copy of the modules' states as
        :attr:`best` when its ``score`` (None: not scored, as in fine-tuning) beats the best so far. Returns
        whether it did."""
        self.history.append(record)
        improved = score is not None and (self.best is None or score > self.best[0])
        if improved:
            self.best = (score, record["step"], self.modules.states(copy_values=True))
        return improved

    def state_dict(self) -> dict[str, Any]:
        """The state (see ``partition_fx.training.save_training_state`` for its form on disk), after the
        non-finite check: never one a non-finite step has updated."""
        self.stepper.check_nonfinite(self.steps.step)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        return {
            "step": self.steps.step,
            "history": self.history,
            "best": None if self.best is None else {"score": self.best[0], "step": self.best[1]},
            "best_modules": None if self.best is None else self.best[2],
            **self.stepper.state_dict(),  # skipped steps, pending losses, loss scale, optimisers, schedulers
            "modules": self.modules.states(),
            "finetune_start": self.finetune_start,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if cuda else [],
                "sampler": self.sampler.state_dict(),
                "lml": self.lml_generator.get_state(),
            },
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; a state from another configuration is refused, naming
        ``source`` and every field that differs, before anything changes."""
        differ = differences(state["fingerprint"], self.fingerprint())
        if differ:
            raise PartitionCheckpointError(f"{source} is from a different configuration ({differ})")
        self.modules.restore(state["modules"], source)
        self.stepper.load_state_dict(state)
        self.finetune_start = state["finetune_start"]
        self.steps.step = state["step"]
        self.history = state["history"]
        if state["best"] is not None:
            self.best = (state["best"]["score"], state["best"]["step"], state["best_modules"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.sampler.load_state_dict(state["rng"]["sampler"])
        self.lml_generator.set_state(state["rng"]["lml"])

    def save_checkpoint(
        self,
        path: str | Path,
        *,
        final: bool = False,
        norm_statistics: str | None = None,
        best: tuple[float, int, ModuleStates] | None = None,
    ) -> None:
        """The current modules (or ``best``, a ``(score, step, module states)`` as kept in :attr:`best`) in one
        checkpoint file with their step and its evaluation's LMLs (``TrainedModules.save``)."""
        if best is not None:
            _, step, states = best
            record = next((r for r in self.history if r["step"] == step), {})
        else:
            step, states = self.steps.step, self.modules.states()
            record = self.history[-1] if self.history else {}
        self.modules.save(path, step, states, record, final=final, norm_statistics=norm_statistics)
