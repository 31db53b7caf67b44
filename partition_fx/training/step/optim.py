"""The optimisers and LR schedulers a trainer steps: one stock ``torch.optim`` optimiser with a param group per
partition (:func:`partition_optimizer`), the factories the configuration asks for (:func:`configured_factories`)
or the user's, built and checked (:func:`build_optimizers`), and their turn to the fine-tuning phase.

Each partition is its own set of flat ``nn.Parameter`` s, and a step of partition k leaves every other
partition's ``.grad`` at None, which stock optimisers (SGD, Adam, AdamW, ...) skip: a partition's moments and
step count advance only when it is stepped, with no custom optimiser. LR schedulers act on all groups and
follow the total iteration count (as in the paper).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import nn

from ..._validation import check_choice
from ...errors import PartitionArgumentError, PartitionError, PartitionTypeError
from ...fx.partitioned_model import PartitionedModel
from ...job.train_config import WEIGHT_DECAY_SCALINGS, TrainConfig

# --- one optimiser, a param group per partition ----------------------------------------------------------------------


OptimizerFactory = Callable[[Any], torch.optim.Optimizer]

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


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


def weight_decay_scales(chunk_sizes: Sequence[int], scaling: str = "reciprocal") -> list[float]:
    """Factor on the weight decay of partition k: N / |D_1:k| (``reciprocal``), its square root (``sqrt``),
    or 1 (``none``). Partition k trains on D_1:k only, so under the Gaussian-prior reading of weight decay
    (appendix I.1/I.4) its prior weighs more against less data; the final partition gets the factor 1.

    >>> weight_decay_scales([80, 10, 10])
    [1.25, 1.1111111111111112, 1.0]
    >>> weight_decay_scales([80, 10, 10], "sqrt")[0]
    1.118033988749895
    """
    scaling = check_choice("weight_decay_scaling", scaling, WEIGHT_DECAY_SCALINGS)
    total = sum(chunk_sizes)
    seen = 0
    scales = []
    for size in chunk_sizes:
        seen += size
        ratio = total / seen
        scales.append({"reciprocal": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling])
    return scales


def partition_optimizer(
    pmodel: PartitionedModel,
    factory: OptimizerFactory,
    chunk_sizes: Sequence[int],
    weight_decay_scaling: str = "reciprocal",
) -> torch.optim.Optimizer:
    """``factory(groups)`` with one group per partition (key ``partition``: 1..C) and the group's weight
    decay = the optimiser's own ``weight_decay`` times ``weight_decay_scales(...)[k-1]``.

    >>> from functools import partial
    >>> from partition_fx import partitionify
    >>> pmodel = partitionify(torch.nn.Linear(4, 2), 2, (0.5, 0.5))
    >>> opt = partition_optimizer(pmodel, partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.01), [75, 25])
    >>> [(g["partition"], round(g["weight_decay"], 6)) for g in opt.param_groups]
    [(1, 0.013333), (2, 0.01)]
    """
    scales = weight_decay_scales(chunk_sizes, weight_decay_scaling)
    groups = [
        {"params": params, "partition": k}
        for k in range(1, pmodel.num_partitions + 1)
        if (params := pmodel.partition_parameters(k))
    ]
    optimizer = factory(groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PartitionTypeError(
            f"optimizer must be a callable returning a torch.optim.Optimizer (e.g. functools.partial("
            f"torch.optim.Adam, lr=1e-3)), got {type(optimizer).__name__}"
        )
    for group in optimizer.param_groups:
        base = group.get("weight_decay", 0.0)
        group["base_weight_decay"] = base
        group["weight_decay"] = base * scales[group["partition"] - 1]
    return optimizer


# --- the configured optimisers and schedulers ------------------------------------------------------------------------


class Optimizers(NamedTuple):
    """The model optimiser (a param group per partition), the hyperparameter optimiser (None without
    hyperparameters) and their LR schedulers (None when not asked for)."""

    optimizer: torch.optim.Optimizer
    hyper_optimizer: torch.optim.Optimizer | None
    scheduler: Any
    hyper_scheduler: Any


def build_optimizers(
    pmodel: PartitionedModel,
    chunk_sizes: list[int],
    hyperparameters: list[nn.Parameter],
    *,
    optimizer: OptimizerFactory,
    hyper_optimizer: OptimizerFactory,
    scheduler: SchedulerFactory | None = None,
    hyper_scheduler: SchedulerFactory | None = None,
    weight_decay_scaling: str = "reciprocal",
) -> Optimizers:
    """Build each from its factory (``optimizer`` through ``optim.partition_optimizer``, its weight decay
    scaled per partition by ``weight_decay_scaling`` of the ``chunk_sizes``) and check it; a factory's refusal
    of its arguments is reported naming it.

    Example::

        >>> from partition_fx import partitionify
        >>> sgd = partial(torch.optim.SGD, lr=0.1)
        >>> built = build_optimizers(partitionify(nn.Linear(2, 2), 2), [8, 2], [], optimizer=sgd, hyper_optimizer=sgd)
        >>> len(built.optimizer.param_groups) >= 2, built.hyper_optimizer, built.scheduler
        (True, None, None)
    """
    model_optimizer = check_optimizer(
        "optimizer",
        partition_optimizer(pmodel, partial(build, "optimizer", optimizer), chunk_sizes, weight_decay_scaling),
    )
    psi_optimizer = None
    if hyperparameters:
        psi_optimizer = check_optimizer("hyper_optimizer", build("hyper_optimizer", hyper_optimizer, hyperparameters))
    model_scheduler = None
    if scheduler is not None:
        model_scheduler = check_scheduler(build("scheduler", scheduler, model_optimizer))
    psi_scheduler = None
    if hyper_scheduler is not None and psi_optimizer is not None:
        psi_scheduler = check_scheduler(build("hyper_scheduler", hyper_scheduler, psi_optimizer), "hyper_scheduler")
    return Optimizers(model_optimizer, psi_optimizer, model_scheduler, psi_scheduler)


def configured_factories(
    config: TrainConfig,
) -> tuple[OptimizerFactory, OptimizerFactory, SchedulerFactory | None]:
    """The optimisers and LR scheduler ``config`` asks for, as factories: Adam (or SGD with ``momentum``) on the
    weights (``lr``, ``weight_decay``), Adam on the hyperparameters (``hyper_lr``) and, with ``lr_schedule="cosine"``,
    ``CosineAnnealingLR`` over the run's steps down to 1/100 of the optimiser's learning rate (None: constant).
    A factory given to ``fit`` replaces the one built here.

    >>> model, hyper, schedule = configured_factories(TrainConfig.recommended(steps=10))
    >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    >>> model.keywords, hyper.keywords, schedule(sgd).eta_min
    ({'lr': 0.001, 'weight_decay': 0.0}, {'lr': 0.05}, 0.005)
    """
    optimization = config.optimization
    model: OptimizerFactory
    if optimization.optimizer == "sgd":
        model = partial(
            torch.optim.SGD, lr=optimization.lr, momentum=optimization.momentum, weight_decay=optimization.weight_decay
        )
    else:
        model = partial(torch.optim.Adam, lr=optimization.lr, weight_decay=optimization.weight_decay)
    hyper = partial(torch.optim.Adam, lr=config.hyper.lr)
    if optimization.lr_schedule == "constant":
        return model, hyper, None
    return model, hyper, partial(_cosine, steps=optimization.steps)


def check_finetune_schedule(config: TrainConfig, scheduler: SchedulerFactory | None) -> None:
    """Refuse ``finetune_schedule="restart"`` with a scheduler factory of the user's: what restarts is the
    configured ``lr_schedule``, which that factory replaces."""
    if scheduler is not None and config.finetuning.schedule == "restart":
        raise PartitionArgumentError(
            "finetune_schedule='restart' restarts the configured lr_schedule when fine-tuning begins, and a "
            "scheduler factory was given instead; pass finetune_schedule='continue' (your scheduler then spans "
            "both phases) or drop scheduler= and choose lr_schedule"
        )


def restarted_scheduler(
    config: TrainConfig, optimizer: torch.optim.Optimizer, steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A warm restart of ``config``'s LR schedule for the next ``steps`` steps (``finetune_schedule="restart"``):
    every param group of ``optimizer`` back at its initial learning rate, then ``lr_schedule`` over ``steps``
    (cosine to 1/100 of it; None for a constant rate). Saved whole by ``state_dict``, so loading its state into
    the run's first cosine scheduler, as a resumed run does, makes that one this.

    >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    >>> run = _cosine(sgd, steps=10)
    >>> for _ in range(8): sgd.step(); run.step()
    >>> restarted = restarted_scheduler(TrainConfig.recommended(steps=10), sgd, steps=2)
    >>> [round(group["lr"], 4) for group in sgd.param_groups], restarted.T_max
    ([0.5], 2)
    """
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    if config.optimization.lr_schedule == "constant":
        return None
    return _cosine(optimizer, steps)


def finetuning_scheduler(
    config: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    steps: int,
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Turn ``optimizer`` to the fine-tuning phase and return the LR scheduler its steps go on with.

    Every param group's weight decay returns to the unscaled one, since every weight now sees all N examples;
    the schedule carries on (``scheduler``; ``finetune_schedule="continue"``) or restarts over the ``steps``
    fine-tuning steps (:func:`restarted_scheduler`; ``"restart"``).

    >>> sgd = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "weight_decay": 0.5}], lr=0.1)
    >>> sgd.param_groups[0]["base_weight_decay"] = 0.1
    >>> carried_on = TrainConfig.recommended(steps=10, finetune_schedule="continue")
    >>> finetuning_scheduler(carried_on, sgd, None, steps=2) is None
    True
    >>> sgd.param_groups[0]["weight_decay"]
    0.1
    """
    for group in optimizer.param_groups:
        group["weight_decay"] = group["base_weight_decay"]
    if config.finetuning.schedule == "restart":
        return restarted_scheduler(config, optimizer, steps)
    return scheduler


def _cosine(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Cosine annealing over ``steps`` to 1/100 of the optimiser's learning rate."""
    eta_min = optimizer.defaults["lr"] / 100
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=eta_min)
