"""One stock ``torch.optim`` optimiser with a param group per partition.

Each partition is its own set of flat ``nn.Parameter`` s, and a step of partition k leaves every other
partition's ``.grad`` at None, which stock optimisers (SGD, Adam, AdamW, ...) skip: a partition's
moments and step count advance only when it is stepped, with no custom optimiser. LR schedulers act on
all groups and follow the total iteration count (as in the paper).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._validation import check_choice
from ..errors import PartitionTypeError
from ..partitioned_model import PartitionedModel
from ..train_config import WEIGHT_DECAY_SCALINGS

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


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
