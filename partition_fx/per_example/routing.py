"""Which subnetwork each example of a batch goes through, and which partition its loss may train: the
checked per-example arguments that the grouped and the one-pass forward share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .._validation import check_per_example, check_subnetwork
from ..errors import PartitionArgumentError


@dataclass(frozen=True)
class Routing:
    """Per example: its subnetwork and the partition its loss may train (0: none; None: every one used)."""

    subnetworks: torch.Tensor
    grad_partitions: torch.Tensor | None


def batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The batch size of a call: the first dimension of its first tensor argument with one.

    >>> batch_size((3, torch.zeros(5, 2)), {})
    5
    """
    first = next((a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and a.dim()), None)
    if first is None:
        raise PartitionArgumentError("per-example subnetworks need a tensor input with a batch dimension")
    return first.shape[0]


def checked_routing(
    subnetworks: torch.Tensor, grad_partitions: int | torch.Tensor | None, batch: int, num_partitions: int
) -> Routing:
    """The per-example ``subnetwork`` and ``grad_partition`` arguments of a forward, checked: one integer
    per example in 0..C, and no example training a partition its subnetwork does not use. A single
    ``grad_partitions`` value applies to every example.

    >>> checked_routing(torch.tensor([2, 1]), 1, batch=2, num_partitions=2)
    Routing(subnetworks=tensor([2, 1]), grad_partitions=tensor([1, 1]))
    """
    ks = check_per_example("subnetwork", subnetworks, batch, num_partitions)
    if grad_partitions is None:
        return Routing(ks, None)
    gs = grad_partitions
    if not (isinstance(gs, torch.Tensor) and gs.dim() == 1):
        gs = torch.full((batch,), check_subnetwork(gs, num_partitions), dtype=torch.long, device=ks.device)
    gs = check_per_example("grad_partition", gs, batch, num_partitions).to(ks.device)
    wrong = torch.nonzero(gs > ks)  # one pass; no read of a value (routings built on the host stay there)
    if wrong.numel():
        i = int(wrong[0])
        raise PartitionArgumentError(
            f"example {i} would train partition {int(gs[i])} through subnetwork {int(ks[i])}, which "
            "does not use it; grad_partition must be <= subnetwork (0: no partition)"
        )
    return Routing(ks, gs)
