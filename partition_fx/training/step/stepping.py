"""How a step's losses become updates: the backward under the run's precision (scaled for fp16), the
data-parallel average, the non-finite check, the optimiser steps and the loss history, without reading the
device after every step.

The trainer keeps losses and finiteness flags on the device and reads them every ``check_every`` steps, at every
evaluation and before any state is saved (``Precision``, ``NonfiniteWatch`` and the ``Stepper`` a
``PartitionedTrainer`` holds; why: docs/design.md, "Data-parallel steps"). What makes a step go
wrong is named: a non-finite loss or gradient (and the tensor it is in), a parameter left unpartitioned.

Data-parallel partitioned training (:class:`DataParallel`): one trainer per process under ``torchrun``. Every
rank builds the same trainer (same seed, so the same chunks and the same sampler): each iteration all ranks
draw the same partition k, hyperparameter chunk and global minibatch, and each takes its own contiguous share of
the minibatch (``shard``). After the backward pass the gradients of what is stepped (the partitions of k, and
psi) are averaged across ranks in ONE all-reduce (``average``), with the step's losses, so every rank takes the
same optimiser step on the gradient of the global minibatch's mean loss, as one process with the whole minibatch
would, and the models stay identical without being exchanged.

Why an explicit all-reduce rather than ``DistributedDataParallel``: docs/design.md, "Data-parallel steps".

What stays per rank: BatchNorm batch statistics (each rank normalises its share, as DDP without
``SyncBatchNorm``); running statistics are broadcast from rank 0 before every step, as DDP's
``broadcast_buffers=True`` does. Evaluations (LML, accuracies) run on every rank on the full data, so all ranks
keep the same history and best state; only rank 0 writes files (``is_writer``).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ...errors import PartitionArgumentError, PartitionTrainingError, PartitionWarning, first_names
from ...fx.partitioned_model import PartitionedModel

if TYPE_CHECKING:
    from ..objective.objective import Objective

# --- data parallelism ------------------------------------------------------------------------------------------------


class DataParallel:
    """The process group a trainer averages over (see the module docstring).

    >>> DataParallel.from_environment(None) is None  # no process group: a single process
    True
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    @classmethod
    def from_environment(cls, requested: bool | None) -> DataParallel | None:
        """The default process group when one is initialised with more than one process (``torchrun``) and
        ``requested`` is not False; None otherwise. ``requested=True`` without such a group is an error."""
        active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if requested and not active:
            raise PartitionArgumentError(
                "data_parallel=True needs an initialised process group with 2 or more processes: launch with "
                "torchrun --nproc_per_node=N and call torch.distributed.init_process_group() first"
            )
        return cls() if active and requested is not False else None

    @property
    def is_writer(self) -> bool:
        """Whether this process writes checkpoints, reports and exports (rank 0)."""
        return self.rank == 0

    def check_batch_size(self, name: str, size: int) -> None:
        if size % self.world_size:
            raise PartitionArgumentError(
                f"{name}={size} does not split evenly over {self.world_size} processes; use a multiple of "
                f"{self.world_size} (each process takes {name} / {self.world_size} examples of the global batch)"
            )

    def shard(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's contiguous share of each tensor's first dimension (equal shares)."""
        return tuple(t.chunk(self.world_size)[self.rank] for t in tensors)

    def broadcast(self, modules: Sequence[nn.Module | None], buffers_only: bool = False) -> None:
        """Rank 0's parameters (unless ``buffers_only``) and buffers on every rank."""
        for module in modules:
            if module is None:
                continue
            tensors = list(module.buffers()) if buffers_only else [*module.parameters(), *module.buffers()]
            for tensor in tensors:
                if tensor.numel():
                    dist.broadcast(tensor.data, src=0, group=self.group)

    def average(
        self, params: Sequence[torch.Tensor], losses: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """Average the gradients of ``params`` and the ``losses`` across ranks, in place, in one all-reduce;
        returns the averaged losses.

        A parameter that received no gradient on this rank (its partition had no example in this rank's
        share, e.g. in an every-partition step) contributes zeros; one that received none on any rank keeps
        ``grad=None``, so the optimiser still skips it on every rank. Only then is the device read (which
        parameters got a gradient anywhere); when every parameter has one here, nothing is read."""
        given = [loss.detach().float().reshape(1) for loss in losses if loss is not None]
        if not params and not given:
            return list(losses)
        device = params[0].device if params else given[0].device
        own = [p.grad for p in params]
        missing = [g is None for g in own]
        grads = [
            p.new_zeros(p.numel(), dtype=torch.float32) if g is None else g.reshape(-1).float()
            for p, g in zip(params, own)
        ]
        present = torch.tensor([not absent for absent in missing], dtype=torch.float32, device=device)
        flat = torch.cat([*grads, present, *given])
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        *averaged, counts, averaged_losses = flat.split([g.numel() for g in grads] + [len(params), len(given)])
        anywhere = counts.gt(0).tolist() if any(missing) else [True] * len(params)
        for p, g, grad, received in zip(params, own, averaged, anywhere):
            if not received:
                p.grad = None
            elif g is None:
                p.grad = grad.view_as(p).to(p.dtype)
            else:
                g.copy_(grad.view_as(p))
        values = iter(averaged_losses)
        return [None if loss is None else next(values).to(loss.dtype).reshape(loss.shape) for loss in losses]


# --- what makes a step go wrong --------------------------------------------------------------------------------------


def gradient_norm(params: Sequence[torch.Tensor]) -> float:
    """The total 2-norm of the gradients that exist (0.0 when none does)."""
    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def nonfinite_problem(value: float, params: Sequence[torch.Tensor], names: Callable[[], dict[int, str]]) -> str | None:
    """None if ``value`` and the gradients of ``params`` are finite, else what is not, e.g.
    ``gradient norm nan (in 0.weight partition 2, mask.logits)``. ``names()`` maps ``id(tensor)`` to a name;
    it is called only when something is not finite (every step runs this check).

    Example::

        >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([1.0, float("nan")])
        >>> nonfinite_problem(0.5, [p], lambda: {id(p): "w"})
        'gradient norm nan (in w)'
    """
    if not math.isfinite(value):
        return f"loss {value}"
    norm = gradient_norm(params)
    if math.isfinite(norm):
        return None
    named = names()
    bad = [named.get(id(p), "?") for p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        return f"gradient norm {norm} (in {first_names(bad)})"
    # Every gradient finite, their norm not: it overflowed. Name the largest, where the explosion is.
    peaks = {id(p): float(p.grad.abs().max()) for p in params if p.grad is not None and p.grad.numel()}
    largest = max(peaks, key=peaks.__getitem__)
    where = named.get(largest, "?")
    return f"gradient norm {norm} (every gradient finite, the largest {peaks[largest]:.2g} in {where})"


def _summed(*losses: torch.Tensor | None) -> torch.Tensor:
    """The sum of the ``losses`` given (not None), added as ``sum`` adds them (from 0); a step has at least one."""
    total = sum(loss for loss in losses if loss is not None)
    if not isinstance(total, torch.Tensor):
        raise PartitionArgumentError("a step needs a loss: the parameter loss, the hyperparameter loss or both")
    return total


def warn_about_shared_parameters(pmodel: PartitionedModel) -> None:
    """Warn about trainable parameters a config left unpartitioned: they bias the LML's first term."""
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
            stacklevel=4,
        )


# --- precision and the stepper ---------------------------------------------------------------------------------------


DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtype the forward runs in under ``torch.autocast`` for each of ``choices.PRECISIONS`` (None: no
autocast)."""


LAZY_CHECK_EVERY = 50
"""Steps between reads of an accelerator for the non-finite check, unless ``check_every`` says otherwise."""


class Precision:
    """The dtype a trainer's forwards run in (``torch.autocast``) and, for fp16, the ``GradScaler`` that keeps
    small gradients from flushing to zero. Parameters, gradients and optimiser state stay fp32.

    Example::

        >>> precision = Precision("bf16", torch.device("cpu"))
        >>> with precision.autocast():
        ...     torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype
        torch.bfloat16
        >>> Precision("fp16", torch.device("cpu")).scaler is not None  # with a warning: slow on a CPU
        True
    """

    def __init__(self, name: str, device: torch.device | None) -> None:
        self.name = name
        self.dtype = DTYPES[name]
        self.device_type = device.type if device is not None else "cpu"
        if name == "fp16" and self.device_type == "cpu":
            # Warned, not refused: it trains correctly (the loss scale too, which is how an fp16 GPU run is
            # reproduced on a laptop), only slowly: a CPU has no fast fp16 kernels, and bf16 has fp32's range.
            warnings.warn(
                "precision 'fp16' on a CPU runs many times slower than fp32 (19x in a 4-step run on a 2-core CPU): "
                "a CPU has no fast fp16 kernels; use 'fp32', or 'bf16' (--precision bf16), as fast as fp32 there "
                "but less stable at small images (docs/training.md, mixed precision)",
                PartitionWarning,
                stacklevel=3,
            )
        self.scaler = torch.amp.GradScaler(self.device_type) if name == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the forwards run in: autocast to ``dtype``, or nothing for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, total: torch.Tensor, inputs: Sequence[torch.Tensor]) -> None:
        """``total.backward(inputs=inputs)``, the loss scaled first under fp16."""
        (total if self.scaler is None else self.scaler.scale(total)).backward(inputs=inputs)

    def unscale(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Bring the gradients back to their true scale (fp16), so checks and stepping see true values."""
        if self.scaler is not None:
            for optimizer in optimizers:
                self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, scaled: bool) -> None:
        """Step ``optimizer``; under fp16 the scaler skips it when a gradient overflowed (``scaled``: this
        step's backward went through the scaler)."""
        if self.scaler is not None and scaled:
            self.scaler.step(optimizer)
        else:
            optimizer.step()

    def update(self, scaled: bool) -> None:
        """Adjust the fp16 loss scale after a scaled step (halve it on overflow, grow it when steady)."""
        if self.scaler is not None and scaled:
            self.scaler.update()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


@dataclass
class _Pending:
    """One step whose finiteness is still on the device."""

    step: int
    what: str
    loss_finite: torch.Tensor
    grads_finite: torch.Tensor | None
    params: list[torch.Tensor]


class NonfiniteWatch:
    """Device-side flags of the steps not yet checked: whether each step's loss and each gradient it
    stepped were finite. ``first_problem()`` reads them all in one transfer and names the first bad step.

    Example::

        >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([1.0, float("nan")])
        >>> watch = NonfiniteWatch()
        >>> watch.record(4, "parameter step of partition 2", torch.tensor(0.5), [p])
        >>> watch.first_problem(lambda: {id(p): "w"})
        (4, 'parameter step of partition 2', 'gradient (in w)')
        >>> len(watch)
        0
    """

    def __init__(self) -> None:
        self._pending: list[_Pending] = []

    def __len__(self) -> int:
        return len(self._pending)

    def record(self, step: int, what: str, total: torch.Tensor, params: Sequence[torch.Tensor]) -> None:
        """Note step ``step``'s loss ``total`` and the gradients of ``params``, without reading them."""
        with_grad = [p for p in params if p.grad is not None]
        grads_finite = None
        if with_grad:
            # One fused norm kernel per device and dtype (what torch.nn.utils.get_total_norm runs inside),
            # however many tensors: a flat group's storage is one of them.
            norms = torch._foreach_norm([g for p in with_grad if (g := p.grad) is not None])
            grads_finite = torch.stack([n.to(total.device) for n in norms]).isfinite()
        self._pending.append(_Pending(step, what, total.detach().isfinite(), grads_finite, with_grad))

    def first_problem(self, names: Callable[[], dict[int, str]]) -> tuple[int, str, str] | None:
        """``(step, what, problem)`` of the first recorded step whose loss or a gradient was not finite, or
        None; forgets every recorded step. ``names()`` maps ``id(parameter)`` to a name."""
        pending, self._pending = self._pending, []
        if not pending:
            return None
        flags = [
            torch.cat([p.loss_finite.reshape(1), p.grads_finite])
            if p.grads_finite is not None
            else p.loss_finite.reshape(1)
            for p in pending
        ]
        all_finite = torch.stack([f.all() for f in flags]).cpu()  # the one read of the device
        if bool(all_finite.all()):
            return None
        bad = pending[int((~all_finite).nonzero()[0])]
        if not bool(bad.loss_finite):
            return bad.step, bad.what, "loss"
        assert bad.grads_finite is not None
        named = names()
        which = [named.get(id(p), "?") for p, ok in zip(bad.params, bad.grads_finite.tolist()) if not ok]
        return bad.step, bad.what, f"gradient (in {first_names(which)})"


class Stepper:
    """Turns a step's losses into optimiser updates: one backward (scaled under fp16), the non-finite check,
    a step of each optimiser whose loss was given (and of its LR scheduler), psi's constraints, and the losses
    kept for the next evaluation.

    The check is done now (``check_every=1``, or ``on_nonfinite="skip"``, which must decide before stepping)
    or lazily (``NonfiniteWatch``, read every ``check_every`` steps and by :meth:`check_nonfinite`). A non-finite
    error names the tensors of ``objective`` (the model, input transform and likelihood); ``checkpoint_dir``
    and ``last_checkpoint_step`` say in it which checkpoint is kept.

    Example::

        >>> from partition_fx import partitionify
        >>> pmodel = partitionify(torch.nn.Linear(2, 1), 2)
        >>> from partition_fx.training.objective.objective import Objective
        >>> stepper = Stepper(torch.optim.SGD(pmodel.parameters(), lr=0.1), objective=Objective(pmodel))
        >>> loss = pmodel(torch.ones(1, 2), subnetwork=2).sum() ** 2
        >>> total = stepper.step(loss, None, pmodel.partition_parameters(2), "a step", at=0)
        >>> stepper.pending_losses() == ([float(loss.detach())], [])
        True
        >>> stepper.step(loss * float("nan"), None, [], "bad step", at=1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionTrainingError: step 1: non-finite loss nan in the bad step. Lower the learning ...
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        hyper_optimizer: torch.optim.Optimizer | None = None,
        *,
        objective: Objective,
        scheduler: Any = None,
        hyper_scheduler: Any = None,
        precision: Precision | None = None,
        data_parallel: DataParallel | None = None,
        check_every: int = 1,
        on_nonfinite: str = "raise",
        checkpoint_dir: Path | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.hyper_optimizer = hyper_optimizer
        self.objective = objective
        self.hyperparameters = objective.hyperparameters()
        """psi: what a hyperparameter loss's backward gives gradients to."""
        self.hyperparameter_modules = [m for _, m in objective.hyperparameter_modules()]
        """The modules whose constraints (``constrain_``) follow each hyperparameter update."""
        self.scheduler = scheduler
        self.hyper_scheduler = hyper_scheduler
        self.precision = precision if precision is not None else Precision("fp32", None)
        self.data_parallel = data_parallel
        self.check_every = check_every
        self.on_nonfinite = on_nonfinite
        self.checkpoint_dir = checkpoint_dir
        self.last_checkpoint_step: int | None = None
        """The step of the last checkpoint written (a non-finite error says it is kept)."""
        self.skipped_steps = 0
        """Steps skipped for a non-finite loss or gradient (``on_nonfinite="skip"``)."""
        self.watch = NonfiniteWatch()
        self.losses: list[torch.Tensor] = []
        self.hyper_losses: list[torch.Tensor] = []
        """The parameter and hyperparameter losses since the last evaluation, on the device."""

    def step(
        self,
        loss: torch.Tensor | None,
        hyper_loss: torch.Tensor | None,
        params: Sequence[nn.Parameter],
        what: str,
        at: int,
    ) -> torch.Tensor:
        """One backward of the given losses, then a step of each optimiser whose loss was given; returns the
        summed loss, detached and still on the device. ``what`` and ``at`` (the step's number) name the step in
        a non-finite error.

        ``backward(inputs=...)`` gives .grad only to ``params`` (the partitions being trained) and, with a
        hyper loss, to psi: every other part keeps grad None, which stock optimisers skip, so a partition's
        state advances only when it is stepped. The LR scheduler follows parameter steps."""
        hyper_optimizer = self.hyper_optimizer
        if hyper_loss is not None and hyper_optimizer is None:  # every scheme's hyperparameter step comes here
            raise PartitionArgumentError(
                "this iteration has a hyperparameter step, but these training steps learn no hyperparameters (the "
                "input transform's are fixed, or there is none): draw the iterations with "
                "PartitionedBatchSampler(chunks, config, hyperparameters=False)"
            )
        inputs = list(params) if loss is not None else []
        if hyper_loss is not None:
            inputs += self.hyperparameters
        total = _summed(loss, hyper_loss)
        stepped = [
            o for o, lo in ((self.optimizer, loss), (hyper_optimizer, hyper_loss)) if o is not None and lo is not None
        ]
        self._zero_grads()
        scaled = bool(inputs) and total.requires_grad
        if scaled:
            self.precision.backward(total, inputs)
        if self.data_parallel is not None:  # every rank steps on the global minibatch's gradients and losses
            loss, hyper_loss = self.data_parallel.average(inputs if scaled else [], [loss, hyper_loss])
            total = _summed(loss, hyper_loss)
        if scaled:
            self.precision.unscale(stepped)
        total = total.detach()
        # Under fp16 an overflowing gradient is the scaler's to handle (it skips the step and lowers the
        # scale); only a non-finite loss is a fault then.
        checked = inputs if self.precision.scaler is None else []
        if self._finite(total, what, checked, at):
            if loss is not None:
                self.precision.step(self.optimizer, scaled)
                self.losses.append(loss.detach())
            if hyper_loss is not None and hyper_optimizer is not None:  # both or neither (refused above)
                self.precision.step(hyper_optimizer, scaled)
                for m in self.hyperparameter_modules:
                    m.constrain_()
                if self.hyper_scheduler is not None:
                    self.hyper_scheduler.step()
                self.hyper_losses.append(hyper_loss.detach())
        self.precision.update(scaled)
        self._zero_grads()
        if loss is not None and self.scheduler is not None:
            self.scheduler.step()
        if len(self.watch) >= self.check_every:
            self.check_nonfinite(at)
        return total

    def _zero_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.hyper_optimizer is not None:
            self.hyper_optimizer.zero_grad(set_to_none=True)

    @property
    def checks_lazily(self) -> bool:
        """Whether finiteness is read every ``check_every`` steps rather than before each step."""
        return self.check_every > 1 and self.on_nonfinite == "raise"

    def _finite(self, total: torch.Tensor, what: str, params: Sequence[torch.Tensor], at: int) -> bool:
        """Whether to step: always when checking lazily (the flags are read later), otherwise whether the loss
        and gradients are finite now (raising, or counting a skipped step, when not)."""
        if self.checks_lazily:
            self.watch.record(at, what, total, params)
            return True
        problem = nonfinite_problem(float(total), params, self.objective.tensor_names)
        if problem is None:
            return True
        if self.on_nonfinite == "skip":
            self.skipped_steps += 1
            return False
        raise self._nonfinite_error(at, what, problem, "")

    def check_nonfinite(self, now: int) -> None:
        """Read the finiteness flags of the steps taken since the last check (one transfer from the device)
        and raise ``PartitionTrainingError`` naming the first step whose loss or a gradient was not finite
        (``now``: the current step, to say whether the weights were updated since)."""
        found = self.watch.first_problem(self.objective.storage_names)
        if found is not None:
            step, what, problem = found
            since = f" (found at step {now}: the weights were updated since)" if now > step + 1 else ""
            raise self._nonfinite_error(step, what, problem, since)

    def _nonfinite_error(self, step: int, what: str, problem: str, since: str) -> PartitionTrainingError:
        kept = (
            f"; the last checkpoint (step {self.last_checkpoint_step}) in {self.checkpoint_dir} is kept"
            if self.last_checkpoint_step is not None
            else ""
        )
        return PartitionTrainingError(
            f"step {step}: non-finite {problem} in the {what}{since}{kept}. Lower the learning rate, check the "
            "data for NaN/inf, train in fp32 if in bf16 or fp16, or skip such steps (on_nonfinite='skip', "
            "--on-nonfinite skip)"
        )

    def pending_losses(self) -> tuple[list[float], list[float]]:
        """The parameter and hyperparameter losses since the last evaluation, read from the device."""
        return _floats(self.losses), _floats(self.hyper_losses)

    def clear_losses(self) -> None:
        """Forget the pending losses (an evaluation has recorded them)."""
        self.losses, self.hyper_losses = [], []

    def state_dict(self) -> dict[str, Any]:
        """The optimisers', LR schedulers' and loss scaler's states, the skipped steps and the pending losses
        (as ``PartitionedTrainer.state_dict`` holds them)."""
        losses, hyper_losses = self.pending_losses()
        return {
            "skipped_steps": self.skipped_steps,
            "pending_losses": losses,
            "pending_hyper_losses": hyper_losses,
            "grad_scaler": self.precision.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "hyper_optimizer": self.hyper_optimizer.state_dict() if self.hyper_optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "hyper_scheduler": self.hyper_scheduler.state_dict() if self.hyper_scheduler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (other keys of ``state`` are ignored)."""
        if self.hyper_optimizer is not None and state["hyper_optimizer"] is not None:
            self.hyper_optimizer.load_state_dict(state["hyper_optimizer"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.hyper_scheduler is not None and state["hyper_scheduler"] is not None:
            self.hyper_scheduler.load_state_dict(state["hyper_scheduler"])
        self.skipped_steps = state["skipped_steps"]
        self.losses = [torch.tensor(v) for v in state["pending_losses"]]
        self.hyper_losses = [torch.tensor(v) for v in state["pending_hyper_losses"]]
        self.precision.load_state_dict(state["grad_scaler"])


def _floats(values: list[torch.Tensor]) -> list[float]:
    """``values`` (0-dim tensors) as floats, read in one transfer."""
    if not values:
        return []
    device = values[-1].device  # losses restored from a saved state are on the CPU
    return torch.stack([v.detach().float().to(device) for v in values]).tolist()
