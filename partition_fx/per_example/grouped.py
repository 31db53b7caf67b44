"""Per-example subnetworks by grouping: one forward per distinct (subnetwork, gradient partition) pair.

Works for every model. Exact wherever an example's output does not depend on the other examples of its
batch: eval mode, or models without batch statistics. In train mode, BatchNorm normalises each group by
its own statistics (and updates its running statistics once per group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import PartitionArgumentError
from .routing import Routing

GroupForward = Callable[[tuple[Any, ...], dict[str, Any], int, "int | None"], Any]
"""``forward(args, kwargs, subnetwork, grad_partition)``: one group's batch through one subnetwork."""


def forward_grouped(
    forward: GroupForward, args: tuple[Any, ...], kwargs: dict[str, Any], routing: Routing, num_partitions: int
) -> Any:
    """Example i through subnetwork ``routing.subnetworks[i]``: the batch is grouped by subnetwork (and
    gradient partition), each group runs as one batch through ``forward``, and the outputs are put back
    in the original order. Every tensor argument whose first dimension is the batch size is split.

    >>> import torch
    >>> run = lambda args, kwargs, k, g: args[0] * k  # "subnetwork k" multiplies by k
    >>> forward_grouped(run, (torch.ones(3),), {}, Routing(torch.tensor([2, 0, 2]), None), num_partitions=2)
    tensor([2., 0., 2.])
    """
    ks, gs = routing.subnetworks, routing.grad_partitions
    batch = ks.numel()
    flat_args, spec = pytree.tree_flatten((args, kwargs))
    keys = ks * (num_partitions + 1) + (gs if gs is not None else 0)
    order: list[torch.Tensor] = []
    outputs: list[list[Any]] = []
    out_spec: pytree.TreeSpec | None = None
    for key in torch.unique(keys).tolist():
        idx = torch.nonzero(keys == key).flatten()
        k, g = divmod(key, num_partitions + 1)
        part = [a.index_select(0, idx.to(a.device)) if _is_batched(a, batch) else a for a in flat_args]
        group_args, group_kwargs = pytree.tree_unflatten(part, spec)
        out = forward(group_args, group_kwargs, int(k), g if gs is not None else None)
        leaves, out_spec = pytree.tree_flatten(out)
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0 or leaf.shape[0] != idx.numel():
                raise PartitionArgumentError(
                    "per-example subnetworks need every output to be a tensor with the batch as its first "
                    f"dimension; got {type(leaf).__name__}"
                )
        outputs.append(leaves)
        order.append(idx)
    perm = torch.cat(order)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(batch, device=perm.device)
    merged = [torch.cat(group).index_select(0, inverse.to(group[0].device)) for group in zip(*outputs)]
    assert out_spec is not None  # the batch has at least one example
    return pytree.tree_unflatten(merged, out_spec)


def _is_batched(value: Any, batch: int) -> bool:
    """Whether a call argument is split per example: a tensor whose first dimension is the batch size."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch
