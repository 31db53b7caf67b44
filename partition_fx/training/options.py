"""The options of partitioned training, checked once where they enter the package.

``TrainerOptions`` holds what builds a :class:`~partition_fx.training.PartitionedTrainer` (hyperparameter
modules, likelihood, batch sizes, optimisers, chunks, ...); ``RunOptions`` holds what a run of it takes
(steps, evaluation interval, early stopping, callbacks). ``fit`` builds both from its keyword arguments, so
every argument is checked before anything is built or written, and each has one name, one default and one
check, here.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._validation import (
    check_callable,
    check_choice,
    check_device,
    check_directory,
    check_flag,
    check_int,
    check_seed,
)
from ..choices import COMPILE_MODES
from ..errors import PartitionArgumentError, PartitionError, PartitionTypeError
from .chunks import DataChunks
from .hooks import TrainingHook
from .likelihoods import Likelihood, resolve_likelihood
from .optim import WEIGHT_DECAY_SCALINGS, OptimizerFactory
from .stepping import PRECISIONS

Callback = Callable[[Any, dict[str, Any]], "bool | None"]
"""``cb(trainer, record)`` after each evaluation (``trainer``: the ``PartitionedTrainer``); True stops training."""

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]

HYPER_CHUNKS = ("one", "all")
"""How a hyperparameter step picks chunks: ``one`` drawn k (the paper's), or ``all`` chunks 2..C, weighted."""


def check_takes_num_samples(hyper: nn.Module | None) -> None:
    """Refuse ``hyper_samples`` for an input transform that cannot be asked for a number of samples."""
    if hyper is None:
        raise PartitionArgumentError(
            "hyper_samples sets the input transform's samples in hyperparameter steps, but there is no input "
            "transform: pass hyper=AffineAugmentation(...) or leave hyper_samples out"
        )
    try:
        accepts = "num_samples" in inspect.signature(hyper.forward).parameters
    except (TypeError, ValueError):  # a builtin or C forward without a signature
        accepts = False
    if not accepts:
        raise PartitionArgumentError(
            f"hyper_samples needs an input transform whose forward takes num_samples= (as AffineAugmentation's "
            f"does); {type(hyper).__name__}.forward does not: leave hyper_samples out or add the argument"
        )


@dataclass(frozen=True)
class TrainerOptions:
    """What a :class:`~partition_fx.training.PartitionedTrainer` is built with (see :func:`fit` for each).

    Checked on construction; ``likelihood``, ``checkpoint_dir`` and ``device`` are stored resolved (a
    ``Likelihood`` module, a ``Path``, a ``torch.device``).

    Example::

        >>> options = TrainerOptions(batch_size=32, seed=3)
        >>> options.batch_size, type(options.likelihood).__name__
        (32, 'Categorical')
        >>> TrainerOptions(batch_size=0)
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: batch_size must be an int >= 1, got 0
    """

    hyper: nn.Module | None = None
    likelihood: str | Likelihood | Callable[..., torch.Tensor] = "classification"
    batch_size: int = 128
    hyper_batch_size: int | None = None
    optimizer: OptimizerFactory | None = None
    hyper_optimizer: OptimizerFactory | None = None
    scheduler: SchedulerFactory | None = None
    hyper_scheduler: SchedulerFactory | None = None
    hyper_chunks: str = "one"
    hyper_samples: int | None = None
    weight_decay_scaling: str = "reciprocal"
    hyper_every: int = 1
    warmup_steps: int = 0
    chunks: DataChunks | torch.Tensor | Sequence[int] | None = None
    seed: int = 0
    eval_batch_size: int = 256
    eval_examples_per_chunk: int | None = None
    on_nonfinite: str = "raise"
    check_every: int | None = None
    precision: str = "fp32"
    compile: bool | str = False
    checkpoint_dir: str | Path | None = None
    device: torch.device | str | None = None
    fused: bool = False
    every_partition: bool = False
    checkpoint_defaults: bool = True
    hooks: Sequence[TrainingHook] = ()
    data_parallel: bool | None = None

    def __post_init__(self) -> None:
        if self.hyper is not None and not isinstance(self.hyper, nn.Module):
            raise PartitionTypeError(
                f"hyper must be an nn.Module (e.g. AffineAugmentation()), got {type(self.hyper).__name__}"
            )
        if self.on_nonfinite not in ("raise", "skip"):
            raise PartitionArgumentError(f"on_nonfinite must be 'raise' or 'skip', got {self.on_nonfinite!r}")
        check_callable("optimizer", self.optimizer, "functools.partial(torch.optim.Adam, lr=1e-3)")
        check_callable("hyper_optimizer", self.hyper_optimizer, "functools.partial(torch.optim.Adam, lr=0.05)")
        check_callable(
            "scheduler", self.scheduler, "functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)"
        )
        check_callable(
            "hyper_scheduler",
            self.hyper_scheduler,
            "functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)",
        )
        check_choice("hyper_chunks", self.hyper_chunks, HYPER_CHUNKS)
        check_choice("precision", self.precision, tuple(PRECISIONS))
        if not isinstance(self.compile, bool):
            check_choice("compile", self.compile, COMPILE_MODES)
        if self.check_every is not None:
            check_int("check_every", self.check_every)
        if self.hyper_samples is not None:
            check_int("hyper_samples", self.hyper_samples)
            check_takes_num_samples(self.hyper)
        check_flag("fused", self.fused)
        check_flag("every_partition", self.every_partition)
        check_flag("checkpoint_defaults", self.checkpoint_defaults)
        if self.data_parallel is not None:
            check_flag("data_parallel", self.data_parallel)
        self._set("hooks", _check_sequence_of("hooks", self.hooks, TrainingHook, "TrainingHook s", "a TrainingHook"))
        self._set("likelihood", resolve_likelihood(self.likelihood))
        check_seed("seed", self.seed)
        check_int("hyper_every", self.hyper_every)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_int("eval_batch_size", self.eval_batch_size)
        if self.eval_examples_per_chunk is not None:
            check_int("eval_examples_per_chunk", self.eval_examples_per_chunk)
        check_choice("weight_decay_scaling", self.weight_decay_scaling, WEIGHT_DECAY_SCALINGS)
        self._set("checkpoint_dir", check_directory("checkpoint_dir", self.checkpoint_dir))
        self._set("device", check_device(self.device))
        check_int("batch_size", self.batch_size)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a frozen dataclass stores its own normalised values

    @classmethod
    def from_kwargs(cls, where: str, kwargs: dict[str, Any]) -> TrainerOptions:
        """The options named in ``kwargs``; an unknown name is refused naming ``where`` and the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise PartitionTypeError(
                f"{where} got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(sorted(known))}"
            )
        return cls(**kwargs)


@dataclass(frozen=True)
class RunOptions:
    """What one run of the training loop takes (see :func:`fit`); ``eval_every`` defaults to ``steps // 10``.

    Example::

        >>> RunOptions(steps=40).eval_every
        4
    """

    steps: int
    eval_every: int | None = None
    patience: int | None = None
    restore_best: bool = False
    callbacks: Sequence[Callback] = field(default=())
    progress: bool | None = None
    recalibrate_norms: bool = True
    finetune_steps: int = 0

    def __post_init__(self) -> None:
        steps = check_int("steps", self.steps)
        check_int("finetune_steps", self.finetune_steps, 0)
        if self.finetune_steps > steps:
            raise PartitionArgumentError(
                f"finetune_steps ({self.finetune_steps}) must be at most steps ({steps}): they are the last "
                "iterations of the run, after partitioned training has learned the hyperparameters"
            )
        eval_every = self.eval_every if self.eval_every is not None else max(1, steps // 10)
        object.__setattr__(self, "eval_every", check_int("eval_every", eval_every))
        if self.patience is not None:
            check_int("patience", self.patience)
        check_flag("restore_best", self.restore_best)
        check_flag("recalibrate_norms", self.recalibrate_norms)
        if self.progress is not None:
            check_flag("progress", self.progress)
        callbacks = _check_sequence_of(
            "callbacks", self.callbacks, callable, "callables cb(trainer, record)", "a callable cb(trainer, record)"
        )
        object.__setattr__(self, "callbacks", callbacks)


def _check_sequence_of(
    name: str, values: Any, kind: type | Callable[[Any], bool], many: str, one: str
) -> tuple[Any, ...]:
    """``values`` as a tuple if it is a list of ``kind`` (a class, or a predicate such as ``callable``);
    ``many``/``one`` name what it holds in the refusal."""
    if callable(values) or isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise PartitionTypeError(f"{name} must be a list of {many}, got {values!r}")
    values = tuple(values)
    for i, value in enumerate(values):
        if not (isinstance(value, kind) if isinstance(kind, type) else kind(value)):
            raise PartitionTypeError(f"{name}[{i}] must be {one}, got {value!r}")
    return values


def build(name: str, factory: Callable[..., Any], *args: Any) -> Any:
    """``factory(*args)`` for a user's optimiser or scheduler factory; its refusal of its own arguments
    (``partial(torch.optim.Adam, lr=-1)``) is reported naming the argument."""
    try:
        return factory(*args)
    except PartitionError:
        raise
    except (TypeError, ValueError) as e:
        kind = PartitionTypeError if isinstance(e, TypeError) else PartitionArgumentError
        raise kind(f"{name} could not be built: {e}") from e


def check_optimizer(name: str, optimizer: object) -> torch.optim.Optimizer:
    """``optimizer`` if it is an optimiser whose learning rates and weight decays are finite and >= 0."""
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


def check_scheduler(scheduler: object, name: str = "scheduler") -> Any:
    """``scheduler`` if it has a ``step()`` (an LR scheduler)."""
    if not callable(getattr(scheduler, "step", None)):
        raise PartitionTypeError(
            f"{name} must be a callable returning an LR scheduler (with .step()), e.g. functools.partial("
            f"torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps); got {type(scheduler).__name__}"
        )
    return scheduler
