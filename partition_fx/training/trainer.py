"""``PartitionedTrainer`` and ``fit``: partitioned training with hyperparameters learned by the LML.

One iteration (appendix I.1): a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
subnetwork k, then (every ``hyper_every`` iterations after ``warmup_steps``) a hyperparameter step on a
minibatch of D_k, k ~ Cat(u_2..u_C), through subnetwork k-1. The model optimiser holds the partitions,
the hyperparameter optimiser holds psi: the parameters of ``hyper`` (an input transform such as
``AffineAugmentation``), of ``HyperparameterModule`` s inside the model (``ConcreteDropout``), and of the
likelihood (a Gaussian's noise scale).
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validation import check_seed
from ..errors import (
    PartitionArgumentError,
    PartitionError,
    PartitionTrainingError,
    PartitionTypeError,
    first_line,
)
from ..partitioned_model import PartitionedModel
from ..transforms.base import HyperparameterModule, outermost_hyperparameter_modules
from .chunks import DataChunks, Examples, chunks_from_assignment, split_into_chunks
from .likelihoods import Likelihood, resolve_likelihood
from .lml import LMLEstimate, apply_transform, estimate_lml, forward_log_likelihood, recalibrate_norm_statistics
from .optim import OptimizerFactory, partition_optimizer
from .resume import PartitionCheckpointError, cpu_copy, load_training_state, save_training_state
from .sampler import PartitionedSampler

Callback = Callable[["PartitionedTrainer", dict[str, Any]], "bool | None"]


@dataclass
class FitResult:
    """What ``fit`` returns; ``to_dict()`` is plain JSON."""

    lml: float
    """The final LML estimate (nats, summed over the training set), of the returned model."""
    history: list[dict[str, Any]]
    """Per evaluation: ``step``, ``lml``, ``lml_per_chunk``, ``lml_per_example``, ``conditional_lml`` (the sum
    over chunks 2..C, see ``LMLEstimate.conditional``), ``train_loss`` (mean
    parameter-step loss since the last evaluation), ``hyper_loss``, ``hyperparameters``, ``seconds``."""
    conditional_lml: float
    """The final estimate of log p(D_2:C | D_1, psi): the LML without its chunk-1 term."""
    hyperparameters: dict[str, Any]
    """Name -> value (plain floats/lists), e.g. ``{"rotation": 2.9, ...}`` (radians)."""
    steps: int
    best_step: int
    best_lml: float
    stopped_early: bool
    chunk_sizes: list[int]
    seconds: float
    skipped_steps: int = 0
    recalibrated_norms: int = 0
    """BatchNorm modules whose running statistics were recomputed for the final subnetwork at the end."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PartitionArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):  # a truthy "False" or "no" would silently switch the option on
        raise PartitionTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def _directory(name: str, value: object) -> Path | None:
    """A directory argument (it need not exist yet), refused before anything is written to it."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise PartitionTypeError(f"{name} must be a path (str or os.PathLike) or None, got {type(value).__name__}")
    if os.fspath(value) == "":
        raise PartitionArgumentError(f"{name} must not be empty; pass '.' to mean the current directory")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise PartitionArgumentError(f"{name} {str(path)!r} exists and is not a directory; pass a directory")
    return path


def _device(value: object) -> torch.device | None:
    """``device`` as a ``torch.device`` that can hold the model here, or a clear error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise PartitionTypeError(
            f"device must be a string such as 'cpu' or 'cuda:0', a torch.device or None, got {value!r}"
        )
    try:
        device = torch.device(value)
    except RuntimeError as e:
        raise PartitionArgumentError(
            f"device {value!r} is not a torch device ({e}); use e.g. 'cpu' or 'cuda'"
        ) from None
    if device.type == "meta":
        raise PartitionArgumentError(
            "device 'meta' holds no values: the model would lose its weights; use 'cpu' or 'cuda'"
        )
    try:
        torch.empty(0, device=device)
    except Exception as e:  # no driver, an index beyond the devices, torch built without it, no backend at all
        raise PartitionArgumentError(f"device {value!r} is not usable here ({first_line(e)}); use 'cpu'") from None
    return device


def _check_callable(name: str, value: object, example: str) -> None:
    if value is not None and not callable(value):
        raise PartitionTypeError(f"{name} must be a callable such as {example}, or None; got {value!r}")


def _built(name: str, factory: Callable[..., Any], *args: Any) -> Any:
    """``factory(*args)`` for a user's optimiser or scheduler factory; its refusal of its own arguments
    (``partial(torch.optim.Adam, lr=-1)``) is reported naming the argument."""
    try:
        return factory(*args)
    except PartitionError:
        raise
    except (TypeError, ValueError) as e:
        kind = PartitionTypeError if isinstance(e, TypeError) else PartitionArgumentError
        raise kind(f"{name} could not be built: {e}") from e


def _check_optimizer(name: str, optimizer: object) -> torch.optim.Optimizer:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PartitionTypeError(
            f"{name} must be a callable returning a torch.optim.Optimizer (e.g. functools.partial("
            f"torch.optim.Adam, lr=1e-3)), got {type(optimizer).__name__}"
        )
    for group in optimizer.param_groups:
        for key in ("lr", "weight_decay"):
            value = float(group.get(key, 0.0))
            if not (math.isfinite(value) and value >= 0):
                scaled = " after weight_decay_scaling" if key == "weight_decay" and "partition" in group else ""
                where = f" (partition {group['partition']}{scaled})" if "partition" in group else ""
                raise PartitionArgumentError(f"{name}'s {key} must be finite and >= 0, got {value}{where}")
    return optimizer


def _run_options(
    steps: object,
    eval_every: object,
    patience: object,
    restore_best: object,
    callbacks: object,
    progress: object,
    recalibrate_norms: object,
) -> tuple[int, int, int | None, tuple[Callback, ...]]:
    """The checked arguments of ``run`` (also checked by ``fit`` before it builds anything):
    ``(steps, eval_every, patience, callbacks)``."""
    steps = _positive_int("steps", steps)
    eval_every = _positive_int("eval_every", eval_every if eval_every is not None else max(1, steps // 10))
    if patience is not None:
        _positive_int("patience", patience)
    _flag("restore_best", restore_best)
    _flag("recalibrate_norms", recalibrate_norms)
    if progress is not None:
        _flag("progress", progress)
    if callable(callbacks) or isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise PartitionTypeError(f"callbacks must be a list of callables cb(trainer, record), got {callbacks!r}")
    for i, cb in enumerate(callbacks):
        if not callable(cb):
            raise PartitionTypeError(f"callbacks[{i}] must be a callable cb(trainer, record), got {cb!r}")
    return steps, eval_every, patience, tuple(callbacks)  # type: ignore[return-value]


def _save_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write via a temporary file in the same directory and ``os.replace``: readers see the old file or
    the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class PartitionedTrainer:
    """Partitioned training of ``pmodel`` on ``dataset`` with hyperparameters learned by the LML.

    See :func:`fit` for the arguments; the trainer exposes the single steps (``parameter_step``,
    ``hyper_step``, ``evaluate``) for custom loops and tests.
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        dataset: Any,
        *,
        hyper: nn.Module | None = None,
        likelihood: str | Likelihood | Callable[..., torch.Tensor] = "classification",
        batch_size: int = 128,
        hyper_batch_size: int | None = None,
        optimizer: OptimizerFactory | None = None,
        hyper_optimizer: OptimizerFactory | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        weight_decay_scaling: str = "reciprocal",
        hyper_every: int = 1,
        warmup_steps: int = 0,
        chunks: DataChunks | torch.Tensor | Sequence[int] | None = None,
        seed: int = 0,
        eval_batch_size: int = 256,
        eval_examples_per_chunk: int | None = None,
        on_nonfinite: str = "raise",
        checkpoint_dir: str | Path | None = None,
        device: torch.device | str | None = None,
        fused: bool = False,
        every_partition: bool = False,
    ) -> None:
        if not isinstance(pmodel, PartitionedModel):
            raise PartitionTypeError(
                f"fit needs a PartitionedModel (from partitionify(model)), got {type(pmodel).__name__}"
            )
        if hyper is not None and not isinstance(hyper, nn.Module):
            raise PartitionTypeError(
                f"hyper must be an nn.Module (e.g. AffineAugmentation()), got {type(hyper).__name__}"
            )
        if on_nonfinite not in ("raise", "skip"):
            raise PartitionArgumentError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
        _check_callable("optimizer", optimizer, "functools.partial(torch.optim.Adam, lr=1e-3)")
        _check_callable("hyper_optimizer", hyper_optimizer, "functools.partial(torch.optim.Adam, lr=0.05)")
        _check_callable(
            "scheduler", scheduler, "functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)"
        )
        self.pmodel = pmodel
        self.fused = _flag("fused", fused)
        self.every_partition = _flag("every_partition", every_partition)
        self.examples = Examples(dataset)
        self.hyper = hyper
        self.likelihood = resolve_likelihood(likelihood)
        self.seed = seed = check_seed("seed", seed)
        self.on_nonfinite = on_nonfinite
        self.hyper_every = _positive_int("hyper_every", hyper_every)
        self.warmup_steps = _positive_int("warmup_steps", warmup_steps, 0)
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        if eval_examples_per_chunk is not None:
            _positive_int("eval_examples_per_chunk", eval_examples_per_chunk)
        self.eval_examples_per_chunk = eval_examples_per_chunk
        self.checkpoint_dir = _directory("checkpoint_dir", checkpoint_dir)
        device = _device(device)

        c = pmodel.num_partitions
        n = len(self.examples)
        if chunks is None:
            self.chunks = split_into_chunks(n, pmodel.proportions, seed)
        elif isinstance(chunks, DataChunks):
            self.chunks = chunks
        else:
            try:
                assignment = torch.as_tensor(chunks)
            except (TypeError, ValueError, RuntimeError) as e:
                raise PartitionTypeError(
                    f"chunks must be DataChunks or one chunk id 1..{c} per example (a tensor or a sequence of ints), "
                    f"got {type(chunks).__name__} ({e})"
                ) from None
            if assignment.dim() == 1 and assignment.numel() != n:
                raise PartitionArgumentError(
                    f"chunks assigns {assignment.numel()} examples but the dataset has {n}: one chunk id per example"
                )
            try:
                self.chunks = chunks_from_assignment(assignment, c)
            except (PartitionArgumentError, PartitionTypeError) as e:
                raise type(e)(f"chunks: {e}") from None
        if self.chunks.num_chunks != c:
            raise PartitionArgumentError(f"{self.chunks.num_chunks} data chunks for a model with {c} partitions")
        if max(int(idx.max()) for idx in self.chunks.indices) >= n:
            raise PartitionArgumentError(f"the chunks index examples beyond the dataset's {n}")
        self.sampler = PartitionedSampler(self.chunks, _positive_int("batch_size", batch_size), hyper_batch_size, seed)

        params = [p for p in pmodel.parameters() if p.requires_grad]
        first = params[0] if params else next(pmodel.buffers(), None)
        self.device = device if device is not None else (first.device if first is not None else None)
        if self.device is not None:
            pmodel.to(self.device)
            for m in (hyper, self.likelihood):
                if m is not None:
                    m.to(self.device)

        shared = [
            r.names[0]
            for r in pmodel.records
            if r.treatment == "shared" and pmodel.module.get_parameter(r.names[0]).requires_grad
        ]
        if shared:
            warnings.warn(
                f"{len(shared)} parameter(s) left unpartitioned by the config ({', '.join(shared[:3])}"
                f"{', ...' if len(shared) > 3 else ''}) train with partition 1 on D_1 but are used by every "
                "subnetwork, including subnetwork 0 that scores D_1: the LML's first term is then biased. "
                "Freeze them (requires_grad=False) or partition them for an unbiased LML.",
                stacklevel=3,
            )
        self.hyperparameters_list = self._collect_hyperparameters()
        if self.hyperparameters_list and c < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs num_partitions >= 2 (chunk k is scored by subnetwork k-1); "
                "partitionify the model with 2 or more partitions"
            )
        if self.fused and any(any(True for _ in m.parameters()) for _, m in pmodel.hyperparameter_modules()):
            raise PartitionArgumentError(
                "fused=True does not support hyperparameter modules inside the model (e.g. ConcreteDropout) yet: "
                "the parameter examples' loss would reach them; use fused=False"
            )
        factory = partial(_built, "optimizer", optimizer or partial(torch.optim.Adam, lr=1e-3))
        self.optimizer = _check_optimizer(
            "optimizer", partition_optimizer(pmodel, factory, self.chunks.sizes, weight_decay_scaling)
        )
        self.hyper_optimizer = None
        if self.hyperparameters_list:
            hyper_factory = hyper_optimizer or partial(torch.optim.Adam, lr=1e-3)
            self.hyper_optimizer = _check_optimizer(
                "hyper_optimizer", _built("hyper_optimizer", hyper_factory, self.hyperparameters_list)
            )
        self.scheduler = _built("scheduler", scheduler, self.optimizer) if scheduler is not None else None
        if self.scheduler is not None and not callable(getattr(self.scheduler, "step", None)):
            raise PartitionTypeError(
                "scheduler must be a callable returning an LR scheduler (with .step()), e.g. functools.partial("
                f"torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps); got {type(self.scheduler).__name__}"
            )
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, int, dict[str, Any]] | None = None
        self.skipped_steps = 0
        self.last_checkpoint_step: int | None = None
        self._losses: list[float] = []
        self._hyper_losses: list[float] = []
        self._lml_generator = torch.Generator().manual_seed(seed + 1)

    # --- what is trained -------------------------------------------------------------------------

    def _collect_hyperparameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for _, m in self.pmodel.hyperparameter_modules():
            seen.update((id(p), p) for p in m.parameters() if p.requires_grad)
        for m in (self.hyper, self.likelihood):
            if m is not None:
                seen.update((id(p), p) for p in m.parameters() if p.requires_grad)
        model_params = {
            id(p) for k in range(1, self.pmodel.num_partitions + 1) for p in self.pmodel.partition_parameters(k)
        }
        if model_params & seen.keys():
            raise PartitionArgumentError("a hyperparameter is also a model parameter; hyper modules must be separate")
        return list(seen.values())

    def hyperparameter_modules(self) -> list[tuple[str, HyperparameterModule]]:
        """Every hyperparameter module with the prefix its values are reported under."""
        found = outermost_hyperparameter_modules(self.hyper)
        found += self.pmodel.hyperparameter_modules()
        if isinstance(self.likelihood, HyperparameterModule):
            found.append(("", self.likelihood))
        return found

    def hyperparameter_values(self) -> dict[str, Any]:
        """Current hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
        values: dict[str, Any] = {}
        for prefix, m in self.hyperparameter_modules():
            for key, value in m.hyperparameters().items():
                values[f"{prefix}.{key}" if prefix else key] = value
        return values

    # --- steps -------------------------------------------------------------------------------------

    def _check_finite(self, value: float, what: str, params: list[torch.Tensor]) -> bool:
        grads = [p.grad for p in params if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        if math.isfinite(value) and math.isfinite(norm):
            return True
        problem = f"loss {value}" if not math.isfinite(value) else f"gradient norm {norm} ({self._nonfinite(params)})"
        if self.on_nonfinite == "skip":
            self.skipped_steps += 1
            return False
        kept = (
            f"; the last checkpoint (step {self.last_checkpoint_step}) in {self.checkpoint_dir} is kept"
            if self.last_checkpoint_step is not None
            else ""
        )
        raise PartitionTrainingError(
            f"step {self.step}: non-finite {problem} in the {what}{kept}. Lower the learning rate, check the data "
            "for NaN/inf, or pass on_nonfinite='skip' to skip such steps"
        )

    def _nonfinite(self, params: list[torch.Tensor]) -> str:
        """Names the tensors whose gradient holds NaN/inf, e.g. ``0.weight partition 2, mask.logits``."""
        names = {id(p): n.removeprefix("module.") for n, p in self.pmodel.named_parameters()}
        for name, pt in self.pmodel.partitioned_tensors():
            names.update((id(part), f"{name} partition {k}") for k, part in enumerate(pt.parts(), start=1))
        for prefix, m in (("hyper", self.hyper), ("likelihood", self.likelihood)):
            if m is not None:
                names.update((id(p), f"{prefix}.{n}") for n, p in m.named_parameters())
        bad = [names.get(id(p), "?") for p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        return "in " + ", ".join(bad[:3]) + more

    def _train_mode(self) -> None:
        self.pmodel.train()
        if self.hyper is not None:
            self.hyper.train()

    def parameter_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, float]:
        """Train partition k (default: drawn by the sampler) on a minibatch of D_1:k; returns (k, loss)."""
        if k is None or indices is None:
            drawn_k, drawn = self.sampler.parameter_batch()
            k, indices = (drawn_k, drawn) if k is None else (k, indices if indices is not None else drawn)
        self._train_mode()
        x, y = self.examples.batch(indices, self.device)
        loss = -forward_log_likelihood(self.pmodel, self.likelihood, x, y, k, self.hyper, transform_grad=False).mean()
        what = f"parameter step of partition {k} (subnetwork {k}, data D_1:{k})"
        return k, self._step(loss, None, self.pmodel.partition_parameters(k), what)

    def hyper_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, float]:
        """Step psi on a minibatch of D_k through subnetwork k-1 (k in 2..C); returns (k, loss)."""
        if self.hyper_optimizer is None:
            raise PartitionArgumentError("there are no hyperparameters to step (pass hyper=... or use ConcreteDropout)")
        if k is None or indices is None:
            drawn_k, drawn = self.sampler.hyper_batch()
            k, indices = (drawn_k, drawn) if k is None else (k, indices if indices is not None else drawn)
        self._train_mode()
        x, y = self.examples.batch(indices, self.device)
        loss = -forward_log_likelihood(self.pmodel, self.likelihood, x, y, k - 1, self.hyper).mean()
        return k, self._step(None, loss, [], f"hyperparameter step (chunk D_{k} through subnetwork {k - 1})")

    def _hyper_due(self, step: int) -> bool:
        return self.hyper_optimizer is not None and step > self.warmup_steps and step % self.hyper_every == 0

    def iteration(self) -> None:
        """One iteration: the paper's parameter step then hyperparameter step (when due), or both in one
        forward and one backward (``fused=True``)."""
        if self.fused:
            self.fused_iteration()
            return
        if self.every_partition:
            self.parameter_step_every_partition()
        else:
            self.parameter_step()
        self.step += 1
        if self._hyper_due(self.step):
            self.hyper_step()

    def _detached_likelihood(self, outputs: torch.Tensor, targets: torch.Tensor, samples: int) -> torch.Tensor:
        """The likelihood with its own hyperparameters (a noise scale) detached: a parameter loss."""
        detached = {name: p.detach() for name, p in self.likelihood.named_parameters()}
        return torch.func.functional_call(self.likelihood, detached, (outputs, targets, samples))

    def _routed_losses(self, ks: torch.Tensor, indices: torch.Tensor, hyper: tuple[int, torch.Tensor] | None):
        """Parameter examples (example i through subnetwork ks[i], training partition ks[i]) and, if given,
        hyperparameter examples (chunk k through subnetwork k-1, training no partition) in one forward."""
        self._train_mode()
        xp, yp = self.examples.batch(indices, self.device)
        xp, samples_p = apply_transform(self.hyper, xp, grad=False)
        ks = ks.to(xp.device).repeat(samples_p)  # sample-major, like the inputs
        inputs, subnetworks, grads = [xp], [ks], [ks]
        if hyper is not None:
            k, hyper_indices = hyper
            xh, yh = self.examples.batch(hyper_indices, self.device)
            xh, samples_h = apply_transform(self.hyper, xh, grad=True)
            inputs.append(xh)
            subnetworks.append(torch.full((xh.shape[0],), k - 1, device=xh.device))
            grads.append(torch.zeros(xh.shape[0], dtype=torch.long, device=xh.device))
        out = self.pmodel(torch.cat(inputs), subnetwork=torch.cat(subnetworks), grad_partition=torch.cat(grads))
        n = xp.shape[0]
        parameter_loss = -self._detached_likelihood(out[:n], yp, samples_p).mean()
        hyper_loss = None if hyper is None else -self.likelihood(out[n:], yh, samples_h).mean()
        return parameter_loss, hyper_loss

    def parameter_step_every_partition(self) -> float:
        """A parameter step in which each example trains its own partition (``sampler.parameter_examples``):
        one forward and one backward, every partition drawn at least once updated."""
        ks, indices = self.sampler.parameter_examples()
        loss, _ = self._routed_losses(ks, indices, None)
        params, drawn = self._parameters_of(ks)
        return self._step(loss, None, params, f"parameter step of partitions {drawn}")

    def _parameters_of(self, ks: torch.Tensor) -> tuple[list[nn.Parameter], list[int]]:
        """The parameters of the partitions drawn in ``ks``, and those partitions."""
        drawn = torch.unique(ks).tolist()
        return [p for k in drawn for p in self.pmodel.partition_parameters(int(k))], drawn

    def fused_iteration(self) -> None:
        """The parameter step and (when due) the hyperparameter step of one iteration in ONE forward and ONE
        backward. Both gradients are taken at the same weights: the same gradients as the two steps of
        appendix I.1, except that the paper's hyper step sees partition k already updated."""
        if self.every_partition:
            ks, indices = self.sampler.parameter_examples()
        else:
            k, indices = self.sampler.parameter_batch()
            ks = torch.full((indices.numel(),), k)
        due = self._hyper_due(self.step + 1)
        hyper = self.sampler.hyper_batch() if due else None
        loss, hyper_loss = self._routed_losses(ks, indices, hyper)
        params, drawn = self._parameters_of(ks)
        self._step(loss, hyper_loss, params, f"fused iteration (partitions {drawn})")
        self.step += 1

    def _step(
        self, loss: torch.Tensor | None, hyper_loss: torch.Tensor | None, params: list[nn.Parameter], what: str
    ) -> float:
        """One backward of the given losses, then a step of each optimiser whose loss was given.

        ``backward(inputs=...)`` gives .grad only to ``params`` (the partitions being trained) and, with a
        hyper loss, to psi: every other part keeps grad None, which stock optimisers skip, so a partition's
        state advances only when it is stepped. The LR scheduler follows parameter steps."""
        inputs = list(params) if loss is not None else []
        if hyper_loss is not None:
            inputs += self.hyperparameters_list
        total = sum(x for x in (loss, hyper_loss) if x is not None)
        self.optimizer.zero_grad(set_to_none=True)
        if self.hyper_optimizer is not None:
            self.hyper_optimizer.zero_grad(set_to_none=True)
        if inputs and total.requires_grad:
            total.backward(inputs=inputs)
        value = float(total.detach())
        if self._check_finite(value, what, inputs):
            if loss is not None:
                self.optimizer.step()
                self._losses.append(float(loss.detach()))
            if hyper_loss is not None:
                self.hyper_optimizer.step()  # type: ignore[union-attr]
                for _, m in self.hyperparameter_modules():
                    m.constrain_()
                self._hyper_losses.append(float(hyper_loss.detach()))
        self.optimizer.zero_grad(set_to_none=True)
        if self.hyper_optimizer is not None:
            self.hyper_optimizer.zero_grad(set_to_none=True)
        if loss is not None and self.scheduler is not None:
            self.scheduler.step()
        return value

    # --- evaluation, checkpoints -------------------------------------------------------------------

    def estimate_lml(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters (see :func:`estimate_lml`)."""
        return estimate_lml(
            self.pmodel,
            self.examples,
            self.chunks,
            self.likelihood,
            self.hyper,
            batch_size=self.eval_batch_size,
            max_examples_per_chunk=self.eval_examples_per_chunk,
            generator=self._lml_generator,
            device=self.device,
        )

    def evaluate(self, started: float) -> dict[str, Any]:
        """Estimate the LML, append a history record, keep the best state, write checkpoints."""
        estimate = self.estimate_lml()
        mean = lambda xs: float(sum(xs) / len(xs)) if xs else None  # noqa: E731
        record = {
            "step": self.step,
            "lml": estimate.total,
            "lml_per_chunk": estimate.per_chunk,
            "lml_per_example": estimate.per_example,
            "conditional_lml": estimate.conditional,
            "train_loss": mean(self._losses),
            "hyper_loss": mean(self._hyper_losses),
            "hyperparameters": self.hyperparameter_values(),
            "seconds": round(time.perf_counter() - started, 3),
        }
        self._losses, self._hyper_losses = [], []
        self.history.append(record)
        improved = self.best is None or estimate.total > self.best[0]
        if improved:
            self.best = (estimate.total, self.step, self._state_copy())
        if self.checkpoint_dir is not None:
            self.save_checkpoint(self.checkpoint_dir / "last.safetensors")
            if improved:
                self.save_checkpoint(self.checkpoint_dir / "best.safetensors")
            save_training_state(self, self.checkpoint_dir / "resume")
            self.last_checkpoint_step = self.step
        return record

    def _modules(self) -> dict[str, nn.Module]:
        return {"model": self.pmodel, "hyper": self.hyper, "likelihood": self.likelihood}  # type: ignore[dict-item]

    def _state_copy(self) -> dict[str, Any]:
        return {
            name: copy.deepcopy({k: v.detach() for k, v in m.state_dict().items()})
            for name, m in self._modules().items()
            if m is not None
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        for name, m in self._modules().items():
            if m is not None:
                m.load_state_dict(state[name])

    def identity(self) -> dict[str, Any]:
        """The partitioning a checkpoint belongs to: model class, C, proportions and scheme."""
        return {
            "num_partitions": self.pmodel.num_partitions,
            "proportions": list(self.pmodel.proportions),
            "scheme": self.pmodel.scheme,
            "model": self.pmodel.original_class.__name__,
        }

    def module_tensors(self, sep: str) -> dict[str, torch.Tensor]:
        """CPU copies of the model's, input transform's and likelihood's state, keyed ``<module><sep><key>``."""
        return {
            f"{name}{sep}{key}": cpu_copy(value)
            for name, m in self._modules().items()
            if m is not None
            for key, value in m.state_dict().items()
        }

    def load_module_tensors(self, tensors: dict[str, torch.Tensor], sep: str) -> None:
        """The inverse of :meth:`module_tensors` (other keys in ``tensors`` are ignored)."""
        for name, m in self._modules().items():
            if m is not None:
                prefix = name + sep
                m.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})

    def save_checkpoint(self, path: str | Path) -> None:
        """Model, hyperparameter modules and likelihood in one safetensors file (atomic replace), with the
        step, the latest LML and the configuration in its metadata."""
        from safetensors.torch import save_file

        tensors = self.module_tensors(".")
        lml = self.history[-1]["lml"] if self.history else None
        metadata = {"partition_fx": json.dumps({"step": self.step, "lml": lml, **self.identity()})}
        _save_atomically(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Load the model/hyper/likelihood tensors written by ``save_checkpoint``; returns its metadata."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("partition_fx", "{}"))
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except (SafetensorError, OSError, json.JSONDecodeError) as e:
            raise PartitionCheckpointError(f"checkpoint {path} is missing, corrupted or truncated: {e}") from e
        differ = [
            f"{key}: saved {meta[key]!r}, this model {value!r}"
            for key, value in self.identity().items()
            if key in meta and meta[key] != value
        ]
        if differ:
            raise PartitionCheckpointError(f"checkpoint {path} is from a different configuration ({'; '.join(differ)})")
        self.load_module_tensors(tensors, ".")
        return meta

    # --- the loop ----------------------------------------------------------------------------------

    def run(
        self,
        steps: int,
        *,
        eval_every: int | None = None,
        patience: int | None = None,
        restore_best: bool = False,
        callbacks: Sequence[Callback] = (),
        progress: bool | None = None,
        recalibrate_norms: bool = True,
    ) -> FitResult:
        """Train for ``steps`` iterations (see :func:`fit`)."""
        steps, eval_every, patience, callbacks = _run_options(
            steps, eval_every, patience, restore_best, callbacks, progress, recalibrate_norms
        )
        from tqdm.auto import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        started = time.perf_counter()
        stopped_early = False
        bar = tqdm(total=steps, disable=not show, desc="partitioned training", unit="it", dynamic_ncols=True)
        try:
            end = self.step + steps
            while self.step < end:
                self.iteration()
                bar.update(1)
                if self.step % eval_every == 0 or self.step == end:
                    record = self.evaluate(started)
                    bar.set_postfix(lml=f"{record['lml']:.1f}", loss=f"{record['train_loss'] or float('nan'):.3f}")
                    stop = any(bool(cb(self, record)) for cb in callbacks)
                    assert self.best is not None
                    if patience is not None and len(self.history) - 1 - self._best_index() >= patience:
                        stopped_early = True
                    if stop or stopped_early:
                        stopped_early = True
                        break
        finally:
            bar.close()
        assert self.best is not None
        best_lml, best_step, best_state = self.best
        final = self.history[-1]
        if restore_best and best_step != self.step:
            self._load_state(best_state)
            final = next(r for r in self.history if r["step"] == best_step)
        recalibrated = 0
        if recalibrate_norms:
            recalibrated = recalibrate_norm_statistics(
                self.pmodel, self.examples, batch_size=self.eval_batch_size, device=self.device
            )
        return FitResult(
            lml=final["lml"],
            conditional_lml=final["conditional_lml"],
            history=self.history,
            hyperparameters=self.hyperparameter_values(),
            steps=self.step,
            best_step=best_step,
            best_lml=best_lml,
            stopped_early=stopped_early,
            chunk_sizes=self.chunks.sizes,
            seconds=round(time.perf_counter() - started, 3),
            skipped_steps=self.skipped_steps,
            recalibrated_norms=recalibrated,
        )

    def _best_index(self) -> int:
        assert self.best is not None
        return next(i for i, r in enumerate(self.history) if r["step"] == self.best[1])


def fit(
    pmodel: PartitionedModel,
    dataset: Any,
    *,
    hyper: nn.Module | None = None,
    likelihood: str | Likelihood | Callable[..., torch.Tensor] = "classification",
    steps: int,
    batch_size: int = 128,
    hyper_batch_size: int | None = None,
    optimizer: OptimizerFactory | None = None,
    hyper_optimizer: OptimizerFactory | None = None,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    weight_decay_scaling: str = "reciprocal",
    hyper_every: int = 1,
    warmup_steps: int = 0,
    chunks: DataChunks | torch.Tensor | Sequence[int] | None = None,
    seed: int = 0,
    eval_every: int | None = None,
    eval_batch_size: int = 256,
    eval_examples_per_chunk: int | None = None,
    patience: int | None = None,
    restore_best: bool = False,
    callbacks: Sequence[Callback] = (),
    on_nonfinite: str = "raise",
    checkpoint_dir: str | Path | None = None,
    progress: bool | None = None,
    recalibrate_norms: bool = True,
    fused: bool = False,
    every_partition: bool = False,
    device: torch.device | str | None = None,
    resume: str | Path | None = None,
) -> FitResult:
    """Train a partitioned model and learn its hyperparameters by the partitioned marginal likelihood.

    Args:
        pmodel: from ``partitionify`` (C >= 2 to learn hyperparameters).
        dataset: ``(inputs, targets)`` tensors, a ``TensorDataset``, or a map-style dataset of pairs.
        hyper: an input transform whose parameters are hyperparameters (``AffineAugmentation``,
            ``InputMask``, or a module holding several); ``HyperparameterModule`` s inside the model
            (``ConcreteDropout``) and a Gaussian likelihood's noise scale are learned too.
        likelihood: ``"classification"``, ``"regression"`` (Gaussian, learned noise scale), a
            ``Likelihood``, or ``fn(outputs, targets) -> per-example log-likelihood``.
        steps: iterations (each: one parameter step, plus a hyperparameter step when due).
        optimizer / hyper_optimizer: ``params -> torch.optim.Optimizer``, e.g.
            ``functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-4)``; both default to
            Adam(lr=1e-3). The model optimiser gets one param group per partition, with its weight decay
            scaled by ``weight_decay_scaling`` (``reciprocal``/``sqrt``/``none`` of |D_1:k|, see
            ``weight_decay_scales``). ``scheduler``: ``optimizer -> LR scheduler``, stepped every iteration.
        hyper_every / warmup_steps / hyper_batch_size: a hyperparameter step every ``hyper_every``
            iterations once ``warmup_steps`` have passed, on ``hyper_batch_size`` (default ``batch_size``).
        chunks: ``DataChunks`` or a per-example chunk id (1..C, e.g. by client); default: a random split
            with the model's proportions, from ``seed``.
        seed: an int in 0..2**63-1; seeds the chunks, the sampler and torch's global RNG (augmentation and
            dropout noise).
        eval_every: LML evaluation interval (default ``steps // 10``); the last step is always evaluated.
        eval_examples_per_chunk: score at most this many examples per chunk (an unbiased estimate).
        patience / restore_best: stop after ``patience`` evaluations without a better LML; return the
            state with the best LML (``restore_best``).
        callbacks: ``cb(trainer, record)`` after each evaluation; returning True stops training.
        on_nonfinite: ``"raise"`` (default: stop with the step and partition named) or ``"skip"`` the step.
        checkpoint_dir: write ``last.safetensors`` / ``best.safetensors`` at each evaluation (atomically).
        progress: a tqdm bar; default: only when stderr is a terminal.
        fused: the parameter and hyperparameter steps of an iteration in one forward and one backward
            (``PartitionedTrainer.fused_iteration``); not yet with hyperparameter modules inside the model.
        every_partition: each example of a parameter batch draws its own partition (k_i ~ Cat(u), example
            from D_1:k_i) and trains only it, so every partition is updated every iteration.
        resume: a ``resume`` directory written by an earlier ``fit(..., checkpoint_dir=...)`` (at
            ``checkpoint_dir/resume``, refreshed at every evaluation) with the same arguments: training
            continues from its step to ``steps`` in total, bit for bit as if it had not stopped (on CPU).
            A directory from another configuration is refused, naming what differs.
        recalibrate_norms: at the end, recompute BatchNorm running statistics for the final subnetwork
            over the training data (see ``recalibrate_norm_statistics``); they are shared by all
            subnetworks during training. The LML does not use them (it runs in training mode).

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import fit
        >>> from partition_fx.transforms import InputMask
        >>> x = torch.randn(200, 4); y = (x[:, 0] > 0).long()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        >>> pmodel = partitionify(model, 2, (0.7, 0.3))
        >>> result = fit(pmodel, (x, y), hyper=InputMask(4), steps=20, batch_size=32, progress=False)
        >>> sorted(result.hyperparameters), len(result.history), result.lml < 0
        (['mask'], 10, True)
    """
    total, eval_every, patience, callbacks = _run_options(  # eval_every: steps // 10 of the whole run, also resumed
        steps, eval_every, patience, restore_best, callbacks, progress, recalibrate_norms
    )
    resume = _directory("resume", resume)
    torch.manual_seed(check_seed("seed", seed))
    trainer = PartitionedTrainer(
        pmodel,
        dataset,
        hyper=hyper,
        likelihood=likelihood,
        batch_size=batch_size,
        hyper_batch_size=hyper_batch_size,
        optimizer=optimizer,
        hyper_optimizer=hyper_optimizer,
        scheduler=scheduler,
        weight_decay_scaling=weight_decay_scaling,
        hyper_every=hyper_every,
        warmup_steps=warmup_steps,
        chunks=chunks,
        seed=seed,
        eval_batch_size=eval_batch_size,
        eval_examples_per_chunk=eval_examples_per_chunk,
        on_nonfinite=on_nonfinite,
        checkpoint_dir=checkpoint_dir,
        device=device,
        fused=fused,
        every_partition=every_partition,
    )
    if resume is not None:
        load_training_state(trainer, resume)
        if trainer.step >= total:
            raise PartitionArgumentError(
                f"the run in {resume} is at step {trainer.step}, not before steps={total}: nothing to resume; "
                "pass a larger steps to train on (with the same LR schedule arguments)"
            )
    return trainer.run(
        total - trainer.step,
        eval_every=eval_every,
        patience=patience,
        restore_best=restore_best,
        callbacks=callbacks,
        progress=progress,
        recalibrate_norms=recalibrate_norms,
    )


__all__ = ["FitResult", "PartitionedTrainer", "fit"]
