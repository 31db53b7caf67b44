"""One module per partitioned tensor: its C trained parts, its defaults, and the effective tensor of
subnetwork k.

Each part is its own flat ``nn.Parameter`` (``part1`` .. ``partC``), so stock ``torch.optim`` optimisers
keep per-partition state: a part that subnetwork k does not use never enters its graph, its ``.grad``
stays ``None`` and the optimiser skips it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from .assign import node_assignment, partition_layout, random_assignment

_GRAD_PARTITION: ContextVar[int | None] = ContextVar("partition_fx_grad_partition", default=None)


@contextmanager
def gradient_only_to(partition: int | None) -> Iterator[None]:
    """Inside the block, effective tensors pass gradients to partition ``partition`` only (0: to none;
    None: to every partition they use). The other parts enter the computation detached, so one backward
    over several such calls routes each loss to its own partition.

    >>> t = RandomPartitionedTensor(nn.Parameter(torch.ones(4)), (0.5, 0.5), seed=0, salt=0, default="init")
    >>> with gradient_only_to(2):
    ...     t(2).sum().backward()
    >>> t.part1.grad is None, t.part2.grad.tolist()
    (True, [1.0, 1.0])
    """
    token = _GRAD_PARTITION.set(partition)
    try:
        yield
    finally:
        _GRAD_PARTITION.reset(token)


class PartitionedTensor(nn.Module):
    """Base class: ``forward(k)`` returns the tensor subnetwork k uses (k in 0..C)."""

    kind: str
    num_partitions: int

    def part(self, k: int) -> nn.Parameter:
        """The trained values of partition k (1-based)."""
        return getattr(self, f"part{k}")

    def trained_parts(self, k: int) -> list[torch.Tensor]:
        """Parts 1..k as subnetwork k uses them: detached except where gradients may flow (see
        ``gradient_only_to``)."""
        parts = [self.part(i) for i in range(1, k + 1)]
        only = _GRAD_PARTITION.get()
        if only is None:
            return parts
        return [p if i == only else p.detach() for i, p in enumerate(parts, start=1)]

    def parts(self) -> list[nn.Parameter]:
        return [self.part(k) for k in range(1, self.num_partitions + 1)]

    def partition_sizes(self) -> list[int]:
        """Number of trainable entries each partition holds for this tensor."""
        return [p.numel() for p in self.parts()]

    def effective(self, k: int) -> torch.Tensor:
        return self(k)


class RandomPartitionedTensor(PartitionedTensor):
    """Random-weight partitioning (appendix C): each entry belongs to one partition.

    With ``node=True`` (node partitioning, for conv/linear weights and biases) the assignment is drawn per
    output unit (dim 0) and every entry of the unit's row follows it; ``kind`` is then ``"node"``. The
    storage and the effective tensor are the same either way.

    Subnetwork k takes the trained value of entries in partitions 1..k and the default elsewhere.
    ``index`` maps each entry to its place in ``cat(part1, ..., partC)`` (parts in flat order), so the
    effective tensor is one ``cat`` and one ``index_select``; defaults are kept in that same layout.
    """

    kind = "random"

    def __init__(
        self,
        value: torch.Tensor,
        proportions: Sequence[float],
        *,
        seed: int,
        salt: int,
        default: str,
        node: bool = False,
    ) -> None:
        super().__init__()
        self.kind = "node" if node else "random"
        self.num_partitions = len(proportions)
        self.shape = tuple(value.shape)
        self.default_mode = default
        flat = value.detach().reshape(-1)
        if node:
            assignment = node_assignment(self.shape, proportions, seed, salt, device="cpu")
        else:
            assignment = random_assignment(flat.numel(), proportions, seed, salt, device="cpu")
        order, index, sizes = partition_layout(assignment, self.num_partitions)
        laid_out = flat.index_select(0, order.to(flat.device))
        # int32 halves the index memory; index_select and its backward accept it.
        self.register_buffer("index", index.to(torch.int32).to(flat.device))
        # Where each partition starts in the partition-major layout (sizes are the parts' numels).
        self.offsets = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
        offset = 0
        for k, n in enumerate(sizes, start=1):
            part = laid_out[offset : offset + n].clone()
            self.register_parameter(f"part{k}", nn.Parameter(part, requires_grad=value.requires_grad))
            offset += n
        if default == "init":
            self.register_buffer("default", laid_out.clone())
        else:
            self.default = None

    def assignment(self) -> torch.Tensor:
        """The partition (0-based, uint8) of every entry, in the tensor's shape.

        >>> t = RandomPartitionedTensor(torch.zeros(3, 2), (0.5, 0.5), seed=0, salt=0, default="init", node=True)
        >>> t.assignment().tolist()  # node partitioning: whole rows
        [[0, 0], [0, 0], [1, 1]]
        """
        bounds = torch.tensor(self.offsets[1:-1], dtype=torch.int64, device=self.index.device)
        return torch.bucketize(self.index.long(), bounds, right=True).to(torch.uint8).view(self.shape)

    def _default_slice(self, start: int) -> torch.Tensor:
        """Defaults of partitions start+1..C, in layout order."""
        if self.default is None:
            return self.part1.new_zeros(self.offsets[-1] - self.offsets[start])
        return self.default[self.offsets[start] :]

    def forward(self, k: int) -> torch.Tensor:
        trained = self.trained_parts(k)
        if k < self.num_partitions:
            trained.append(self._default_slice(k))
        flat = trained[0] if len(trained) == 1 else torch.cat(trained)
        return flat.index_select(0, self.index).view(self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, kind={self.kind!r}, sizes={self.partition_sizes()}, default={self.default_mode!r}"


class ScalePartitionedTensor(PartitionedTensor):
    """Product or sum partitioning (appendix I.2) for norm affines and FixUp scalars.

    C copies s_1..s_C of the whole tensor; subnetwork k uses s_1 * ... * s_k (``"product"``) or
    s_1 + ... + s_k (``"sum"``). s_1 starts at the original value and the others at the identity (1 or
    0), so every subnetwork equals the original at conversion. Subnetwork 0 uses the default of s_1:
    its value at conversion (``default="init"``) or the identity (``default="zero"``, which for a
    scale means "no scaling" rather than multiplying by zero).
    """

    def __init__(self, value: torch.Tensor, num_partitions: int, *, kind: str, default: str) -> None:
        super().__init__()
        if kind not in ("product", "sum"):
            raise ValueError(f"kind must be 'product' or 'sum', got {kind!r}")
        self.kind = kind
        self.num_partitions = num_partitions
        self.shape = tuple(value.shape)
        self.default_mode = default
        trainable = value.requires_grad
        value = value.detach()
        identity = torch.ones_like(value) if kind == "product" else torch.zeros_like(value)
        for k in range(1, num_partitions + 1):
            start = value.clone() if k == 1 else identity.clone()
            self.register_parameter(f"part{k}", nn.Parameter(start, requires_grad=trainable))
        self.register_buffer("default", value.clone() if default == "init" else identity)

    def forward(self, k: int) -> torch.Tensor:
        if k == 0:
            return self.default
        # A view, never the Parameter itself: functional_call would register a Parameter it is given in
        # the leaf's _parameters and, when restoring, leave the meta stand-in there as a parameter.
        first, *rest = self.trained_parts(k)
        out = first.view(self.shape)
        for part in rest:
            out = out * part if self.kind == "product" else out + part
        return out

    def extra_repr(self) -> str:
        return f"shape={self.shape}, kind={self.kind!r}, default={self.default_mode!r}"
