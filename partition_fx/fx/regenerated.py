"""Regenerated layouts (``assignments="regenerated"``): the effective tensor placed by a partition membership
regenerated from the seed in forward and backward (``scatter_by_membership``, per tensor and per flat group),
and the memberships of many tensors at once (``FeistelSegments``: the same bits as ``assign.feistel_index``
per tensor, in a number of operations that does not grow with the number of tensors)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .assign import assignment_from_index, feistel_index, feistel_tables  # noqa: F401  (the doctests' definition)

FEISTEL_BATCHED_ENTRIES = 1 << 18
"""``FeistelSegments`` evaluates the tensors of one shape as a batch once they hold this many entries together
(256K); smaller sets go through one pass with the other small ones."""
_FEISTEL_BATCH_LIMIT = 1 << 21  # entries per batch: larger batches leave the CPU cache (docs/benchmarks.md)


class FeistelSegments:
    """The Feistel permutations (``feistel_index``) of many tensors, and their partition assignments, evaluated
    together: the same bits as one ``feistel_index`` per tensor, concatenated, in a number of operations that
    does not grow with the number of tensors.

    - Consecutive tensors with the same factors (a, b) holding ``FEISTEL_BATCHED_ENTRIES`` or more together
      are evaluated as [n, a, b] batches with their round tables stacked (at most ``2**21`` entries per
      batch), at the cost of their own permutations.
    - The others go through one pass over all their entries: each entry looks up its tensor's (a, b) and
      where its tensor's round tables begin, then takes the rounds of ``feistel_index``. The lookups and the
      integer division cost more per entry than a tensor's own permutation (CPU), affordable for few
      entries only (numbers in ``docs/benchmarks.md``).

    A flat group orders its members (small shape sets first, then by shape), so it makes one pass and one
    batch per large shape. Built once per group and device: it holds the round tables and a few numbers per
    tensor.

    >>> factors, sizes = [(32, 40), (33, 33), (729, 729)], [[640, 640], [1000, 89], [531441, 0]]
    >>> tables = [feistel_tables(a, b, seed=0, salt=salt) for salt, (a, b) in enumerate(factors)]
    >>> segments = FeistelSegments(factors, tables, sizes)
    >>> torch.equal(segments.permutation(), torch.cat([feistel_index(*f, t) for f, t in zip(factors, tables)]))
    True
    >>> torch.equal(segments.membership(), torch.cat([assignment_from_index(feistel_index(*f, t), s)
    ...                                               for f, t, s in zip(factors, tables, sizes)]))
    True
    """

    def __init__(
        self,
        factors: Sequence[tuple[int, int]],
        tables: Sequence[Sequence[torch.Tensor]],
        partition_sizes: Sequence[Sequence[int]],
    ) -> None:
        self.blocks: list[_SmallTensors | _SameShape] = []
        small: list[tuple[tuple[int, int], Sequence[torch.Tensor], Sequence[int]]] = []
        for (a, b), same_shape in itertools.groupby(zip(factors, tables, partition_sizes), key=lambda m: m[0]):
            run = list(same_shape)
            if len(run) * a * b < FEISTEL_BATCHED_ENTRIES:
                small += run
                continue
            if small:
                self.blocks.append(_SmallTensors(*zip(*small)))
                small = []
            per_batch = max(1, _FEISTEL_BATCH_LIMIT // (a * b))
            for i in range(0, len(run), per_batch):
                _, batch_tables, batch_sizes = zip(*run[i : i + per_batch])
                self.blocks.append(_SameShape(a, b, batch_tables, batch_sizes))
        if small:
            self.blocks.append(_SmallTensors(*zip(*small)))

    def permutation(self) -> torch.Tensor:
        """Every tensor's ``feistel_index``, concatenated (tensor-local positions)."""
        return torch.cat([block.permutation().view(-1) for block in self.blocks])

    def membership(self) -> torch.Tensor:
        """Every tensor's partition assignment (0-based, uint8), concatenated: the partition whose share of the
        tensor's permutation holds each entry's place, as ``assignment_from_index``."""
        pieces = [block.membership().view(-1) for block in self.blocks]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _bounds(partition_sizes: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Where each tensor's partitions 2..C begin in its permutation: [tensors, C - 1]."""
    return torch.tensor([list(itertools.accumulate(s))[:-1] for s in partition_sizes], dtype=dtype, device=device)


class _SameShape:
    """n tensors with the same factors (a, b): ``feistel_index`` broadcast over [n, a, b]."""

    def __init__(self, a: int, b: int, tables: Sequence[Sequence[torch.Tensor]], sizes: Sequence[Sequence[int]]):
        n, device = len(tables), tables[0][0].device
        self.a, self.b, self.n = a, b, n
        dtype = torch.int32 if n * max(a, b) + a * b < 2**31 else torch.int64
        self.tables = [torch.stack([t[h] for t in tables]).to(dtype).view(-1) for h in range(len(tables[0]))]
        self.rows = torch.arange(a, dtype=dtype, device=device).view(1, a, 1)
        self.columns = torch.arange(b, dtype=dtype, device=device).expand(n, a, b)
        # Tensor i's entries of round h's table start at i * (its length) in the flattened stack.
        self.starts = [torch.arange(0, n * size, size, dtype=dtype, device=device).view(n, 1, 1) for size in (b, a)]
        self.bounds = _bounds(sizes, dtype, device).view(n, -1, 1)

    def permutation(self) -> torch.Tensor:
        a, b, n = self.a, self.b, self.n
        first = self.tables[0].view(n, 1, b)
        left = (self.rows + first).remainder_(a)  # round 1 of feistel_index: r is still the column
        right = self.columns
        for h, table in enumerate(self.tables[1:], start=1):
            if h % 2:  # r = (r + G[l]) % b
                right = table.index_select(0, (left + self.starts[1]).view(-1)).view(n, a, b).add_(right).remainder_(b)
            else:  # l = (l + F[r]) % a
                left = table.index_select(0, (right + self.starts[0]).view(-1)).view(n, a, b).add_(left).remainder_(a)
        return left.mul_(b).add_(right).view(n, -1)

    def membership(self) -> torch.Tensor:
        permutation = self.permutation()
        out = torch.zeros(permutation.shape, dtype=torch.uint8, device=permutation.device)
        for j in range(self.bounds.shape[1]):
            out += permutation >= self.bounds[:, j]
        return out


class _SmallTensors:
    """Tensors of any factors in one pass over all their entries (per-entry lookups of a, b and table starts)."""

    def __init__(
        self,
        factors: Sequence[tuple[int, int]],
        tables: Sequence[Sequence[torch.Tensor]],
        partition_sizes: Sequence[Sequence[int]],
    ) -> None:
        device = tables[0][0].device
        sizes = [a * b for a, b in factors]
        self.total = sum(sizes)
        self.dtype = torch.int32 if 2 * self.total < 2**31 else torch.int64
        as_tensor = lambda values: torch.tensor(values, dtype=self.dtype, device=device)  # noqa: E731
        self.counts = torch.tensor(sizes, dtype=torch.int64, device=device)
        self.a, self.b = (as_tensor(list(column)) for column in zip(*factors))
        self.first = as_tensor(list(itertools.accumulate(sizes[:-1], initial=0)))
        # Round h's tables have one entry per column (h even: b of them) or per row (h odd: a).
        self.table_starts = [
            as_tensor(list(itertools.accumulate((len(t[h]) for t in tables[:-1]), initial=0))) for h in (0, 1)
        ]
        self.tables = [torch.cat([t[h] for t in tables]).to(self.dtype) for h in range(len(tables[0]))]
        self.bounds = _bounds(partition_sizes, self.dtype, device)

    def _tensor_of_entry(self) -> torch.Tensor:
        tensors = torch.arange(self.counts.numel(), device=self.counts.device)
        return torch.repeat_interleave(tensors, self.counts, output_size=self.total)

    def permutation(self, tensor: torch.Tensor | None = None) -> torch.Tensor:
        tensor = self._tensor_of_entry() if tensor is None else tensor
        a, b, first = (values.index_select(0, tensor) for values in (self.a, self.b, self.first))
        column_tables, row_tables = (starts.index_select(0, tensor) for starts in self.table_starts)
        position = torch.arange(self.total, dtype=self.dtype, device=tensor.device).sub_(first)
        left, right = torch.div(position, b, rounding_mode="floor"), position.remainder_(b)
        for h, table in enumerate(self.tables):
            if h % 2 == 0:  # as in feistel_index: l = (l + F[r]) % a
                left = table.index_select(0, column_tables + right).add_(left).remainder_(a)
            else:  # r = (r + G[l]) % b
                right = table.index_select(0, row_tables + left).add_(right).remainder_(b)
        return left.mul_(b).add_(right)

    def membership(self) -> torch.Tensor:
        tensor = self._tensor_of_entry()
        permutation = self.permutation(tensor)
        bounds = self.bounds.index_select(0, tensor)  # [entries, C - 1]
        return (permutation[:, None] >= bounds).sum(1, dtype=torch.uint8)


def scatter_by_membership(owner: Any, sources: Sequence[torch.Tensor]) -> torch.Tensor:
    """The flat effective tensor of regenerated layouts: entry i takes the next value of ``sources[p]``, p its
    partition in ``owner.membership()`` (0-based, flat), so each source lists its partition's entries in flat
    order; partitions without a source are zero. ``owner.offsets`` bound the partitions in ``cat(parts)``.
    The membership is regenerated in the backward pass too, never stored. Used per tensor and per flat group.

    >>> from partition_fx.fx.params import RandomPartitionedTensor
    >>> t = RandomPartitionedTensor(torch.arange(6.0), (0.5, 0.5), seed=0, salt=0, default="init")
    >>> torch.equal(scatter_by_membership(t, t.parts()), t.value(2))
    True
    """
    return _RegeneratedScatter.apply(owner, *sources)


class _RegeneratedScatter(torch.autograd.Function):
    """``scatter_by_membership``: the membership is regenerated from the seed in forward AND backward, so it
    is never stored, not even for the backward pass."""

    @staticmethod
    def forward(ctx: Any, owner: Any, *sources: torch.Tensor) -> torch.Tensor:
        ctx.owner = owner
        membership = owner.membership()
        offsets = owner.offsets
        # Partitions without a source (zero defaults) stay zero.
        full = len(sources) == len(offsets) - 1
        out = sources[0].new_empty(membership.numel()) if full else sources[0].new_zeros(membership.numel())
        for p, source in enumerate(sources):
            out.index_copy_(0, _positions(membership, p, offsets[p + 1] - offsets[p]), source)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        owner = ctx.owner
        membership = owner.membership()
        flat = grad.reshape(-1)
        offsets = owner.offsets
        grads = [
            flat.index_select(0, _positions(membership, p, offsets[p + 1] - offsets[p])) if need else None
            for p, need in enumerate(ctx.needs_input_grad[1:])
        ]
        return None, *grads


def _positions(membership: torch.Tensor, p: int, size: int) -> torch.Tensor:
    """The flat positions of partition ``p``'s ``size`` entries, ascending. On CPU ``nonzero`` (faster there
    than ``masked_select``/``masked_scatter`` and than ``nonzero_static``: ``docs/benchmarks.md``); elsewhere, and
    under torch.compile, ``nonzero_static``: the known size spares a host synchronisation and gives the
    compiled graph a static shape."""
    mask = membership == p
    if mask.device.type == "cpu" and not torch.compiler.is_compiling():
        return mask.nonzero().view(-1)
    return torch.nonzero_static(mask, size=size).view(-1)
