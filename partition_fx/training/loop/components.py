"""What a run is given besides its configuration: the input transform, likelihood, optimiser factories, chunks,
hooks, device and the checkpoint directory (:class:`Components`), checked once, and :func:`resolve`, which splits
``fit``'s and the trainer's keywords into a configuration and its components.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._validation import check_callable, check_device, check_directory, check_flag
from ...errors import PartitionArgumentError, PartitionTypeError
from ...job.train_config import TrainConfig
from ..objective.likelihoods import Likelihood, resolve_likelihood
from ..objective.objective import parameter_step_spread, takes_num_samples, widens
from ..sampling.chunks import DataChunks
from ..step.optim import OptimizerFactory, SchedulerFactory
from .hooks import Callback, TrainingHook


def check_takes_num_samples(hyper: nn.Module | None) -> None:
    """Refuse ``hyper_samples`` given for an input transform that cannot be asked for a number of samples."""
    if hyper is None:
        raise PartitionArgumentError(
            "hyper_samples sets the input transform's samples in hyperparameter steps, but there is no input "
            "transform: pass hyper=AffineAugmentation(...) or leave hyper_samples out"
        )
    if not takes_num_samples(hyper):
        raise PartitionArgumentError(
            f"hyper_samples needs an input transform whose forward takes num_samples= (as AffineAugmentation's "
            f"does); {type(hyper).__name__}.forward does not: leave hyper_samples out or add the argument"
        )


def check_widens(hyper: nn.Module | None, name: str, value: Any) -> None:
    """Refuse ``name`` (``train_range_factor`` other than 1, or ``train_range_factors``) given for an input
    transform that cannot widen its ranges."""
    if not widens(hyper):
        what = "there is no input transform" if hyper is None else f"{type(hyper).__name__} has no widened()"
        raise PartitionArgumentError(
            f"{name}={value} scales the input transform's ranges in parameter steps, but {what}; "
            f"pass an AffineAugmentation or leave {name} out"
        )


@dataclass(frozen=True)
class Components:
    """What a :class:`~partition_fx.training.PartitionedTrainer` is given besides its configuration (see
    :func:`~partition_fx.training.fit` for each). Checked on construction; ``likelihood``, ``checkpoint_dir``
    and ``device`` are stored resolved (a ``Likelihood`` module, a ``Path``, a ``torch.device``).

    Example::

        >>> components = Components(likelihood="regression")
        >>> type(components.likelihood).__name__, components.hooks
        ('Gaussian', ())
        >>> Components(optimizer="adam")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionTypeError: optimizer must be a callable ...
    """

    hyper: nn.Module | None = None
    likelihood: str | Likelihood | Callable[..., torch.Tensor] = "classification"
    optimizer: OptimizerFactory | None = None
    hyper_optimizer: OptimizerFactory | None = None
    scheduler: SchedulerFactory | None = None
    hyper_scheduler: SchedulerFactory | None = None
    chunks: DataChunks | torch.Tensor | Sequence[int] | None = None
    checkpoint_dir: str | Path | None = None
    device: torch.device | str | None = None
    hooks: Sequence[TrainingHook] = ()
    data_parallel: bool | None = None

    def __post_init__(self) -> None:
        if self.hyper is not None and not isinstance(self.hyper, nn.Module):
            raise PartitionTypeError(
                f"hyper must be an nn.Module (e.g. AffineAugmentation()), got {type(self.hyper).__name__}"
            )
        check_callable("optimizer", self.optimizer, "functools.partial(torch.optim.Adam, lr=1e-3)")
        check_callable("hyper_optimizer", self.hyper_optimizer, "functools.partial(torch.optim.Adam, lr=0.05)")
        schedule = "functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)"
        check_callable("scheduler", self.scheduler, schedule)
        check_callable("hyper_scheduler", self.hyper_scheduler, schedule)
        if self.data_parallel is not None:
            check_flag("data_parallel", self.data_parallel)
        self._set("hooks", check_sequence_of("hooks", self.hooks, TrainingHook, "TrainingHook s", "a TrainingHook"))
        self._set("likelihood", resolve_likelihood(self.likelihood))
        self._set("checkpoint_dir", check_directory("checkpoint_dir", self.checkpoint_dir))
        self._set("device", check_device(self.device))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a frozen dataclass stores its own normalised values


def resolve(where: str, config: TrainConfig | None, keywords: dict[str, Any]) -> tuple[TrainConfig, Components]:
    """The configuration (``config``, default the recommended one, changed by the configuration's keywords in
    ``keywords``) and the components (the other keywords) a run is built from; an unknown keyword is refused
    naming ``where`` and every keyword it takes.

    >>> config, components = resolve("fit", None, {"batch_size": 32, "likelihood": "regression"})
    >>> config.optimization.batch_size, type(components.likelihood).__name__
    (32, 'Gaussian')
    """
    if config is not None and not isinstance(config, TrainConfig):
        raise PartitionTypeError(f"{where}'s config must be a TrainConfig, got {type(config).__name__}")
    settings = TrainConfig.keywords()
    objects = {f.name for f in fields(Components)}
    unknown = sorted(set(keywords) - set(settings) - objects)
    if unknown:
        raise PartitionTypeError(
            f"{where} got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(sorted({*settings, *objects}))}"
        )
    changes = {k: v for k, v in keywords.items() if k in settings}
    if config is None and keywords.get("scheduler") is not None:
        # A scheduler factory of the user's replaces the recommended lr_schedule, which is what a restart
        # restarts: unless a restart is asked for by name (and refused), the factory spans both phases.
        changes.setdefault("finetune_schedule", "continue")
    config = (config if config is not None else TrainConfig.recommended()).replace(**changes)
    components = Components(**{k: v for k, v in keywords.items() if k in objects})
    if changes.get("hyper_samples") is not None:  # asked for by name: a transform must be able to take it
        check_takes_num_samples(components.hyper)
    factor, factors = config.hyper.train_range_factor, config.hyper.train_range_factors
    if "train_range_factor" in changes and factor != 1.0:  # likewise: a transform must be able to scale its ranges
        check_widens(components.hyper, "train_range_factor", factor)
    if changes.get("train_range_factors"):  # and to scale the ranges it names, each by its own
        check_widens(components.hyper, "train_range_factors", factors)
        parameter_step_spread(components.hyper, factor, factors)
    return config, components


def check_run_arguments(callbacks: Any, progress: Any) -> tuple[Callback, ...]:
    """``callbacks`` as a tuple if it is a list of callables ``cb(trainer, record)``, and ``progress`` None or a
    bool: what a run of the loop takes besides its configuration."""
    if progress is not None:
        check_flag("progress", progress)
    return check_sequence_of(
        "callbacks", callbacks, callable, "callables cb(trainer, record)", "a callable cb(trainer, record)"
    )


def check_sequence_of(
    name: str, values: Any, kind: type | Callable[[Any], bool], many: str, one: str
) -> tuple[Any, ...]:
    """``values`` as a tuple if it is a list of ``kind`` (a class, or a predicate such as ``callable``);
    ``many``/``one`` name what it holds in the refusal."""
    if callable(values) or isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise PartitionTypeError(f"{name} must be a list of {many}, got {values!r}")
    items: tuple[Any, ...] = tuple(values)
    for i, value in enumerate(items):
        if not (isinstance(value, kind) if isinstance(kind, type) else kind(value)):
            raise PartitionTypeError(f"{name}[{i}] must be {one}, got {value!r}")
    return items
