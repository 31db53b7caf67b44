"""Flat storage: the partitioned tensors of one kind, dtype and device in one buffer per partition.

One ``PartitionedTensor`` per original tensor, each with its own ``cat``/``index_select`` and their backward,
C gradient accumulations and C optimiser updates, made a training step's operators grow with the number of
tensors (on a GPU a host-bound step pays a kernel launch for each; numbers in ``docs/benchmarks.md``).
A ``FlatGroup`` holds the parts of all its member tensors as C flat ``nn.Parameter`` s (``part1`` ..
``partC``; part k is the concatenation of every member's part k), so subnetwork k's effective tensors of the
whole group are a constant number of operations:

- random-weight and node-partitioned tensors with a stored layout: one ``cat`` of parts 1..k and the
  defaults of partitions k+1..C (both partition-major over the group), one ``index_select`` by the group's
  layout index (``index``: each member row's position in ``cat(part1, ..., partC)``, int32, the same memory
  as the members' own indices; a row is an entry, or an output unit under node partitioning), one
  ``split`` into the members' views;
- product/sum scales: k-1 elementwise products or sums of the flat parts, one ``split``.

Stock optimisers still keep per-partition state (each group part is one parameter of one partition) and
their foreach kernels see C large tensors per group instead of C per tensor. The members stay the public
``PartitionedTensor`` s (``pmodel.partitioned_tensors()``): their ``part(k)`` is a view of the group's part
k, ``part_grad(k)`` its gradient, ``storage(k)`` the group parameter itself, and their own ``value(k)``
computes one tensor the per-tensor way, which is the definition the group is tested against.

Node-partitioned tensors are grouped by row length (the entries of one output unit): their index addresses
whole rows, one per unit, as their own did. ``"seed"`` defaults are regenerated for the whole group in one
pass (``assign.normal_segments``). Regenerated layouts (``assignments="regenerated"``) store no index: the
group regenerates every member's partition membership in forward and backward (``regenerated.FeistelSegments``:
one pass over the small members, one batch per large shape) and places the flat parts by it
(``regenerated.scatter_by_membership``: one ``index_copy`` per partition over the whole group).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast, overload

import torch
from torch import nn

from ..errors import PartitionError
from .assign import assignment_from_index, normal_segments
from .kinds import PARTITION_KINDS, partition_kind
from .params import HAND_OVER, PartitionedTensor, RandomPartitionedTensor, ScalePartitionedTensor, grad_partition
from .regenerated import FEISTEL_BATCHED_ENTRIES, FeistelSegments, scatter_by_membership

GROUP_ENTRIES = 1 << 22
"""A group closes once its members' first parts hold this many entries (4M; with 0.8 of each tensor in part 1,
about 5M entries in all). Gathers over one group then stay within a few tens of MB, as on CPU a single gather
over a whole large model is slower than per-tensor gathers (cache misses; ``docs/benchmarks.md``), while the
number of groups, and so of operators, still grows with the model's size, not with its number of tensors."""


def groupable(pt: PartitionedTensor) -> bool:
    """Whether ``pt`` can live in a ``FlatGroup``: its kind (``partition_fx.fx.kinds``) has a storage, as the
    product/sum scales and the random-weight and node-partitioned tensors have (stored or regenerated layout;
    any default: stored, zero, or regenerated from the seed)."""
    kind = PARTITION_KINDS.get(pt.kind)
    return kind is not None and kind.storage is not None


def _group_key(pt: PartitionedTensor) -> tuple[Any, ...]:
    """What tensors of one group share: kind, the attributes the kind groups by (for layouts: stored or
    regenerated, default, row length: node partitioning gathers whole rows), dtype, device, requires_grad, C."""
    part = pt.part(1)
    by_kind = tuple(getattr(pt, name) for name in partition_kind(pt.kind).group_by)
    return (pt.kind, *by_kind, part.dtype, part.device, part.requires_grad, pt.num_partitions)


def _regenerated_order(members: list[RandomPartitionedTensor]) -> list[RandomPartitionedTensor]:
    """Regenerated members sorted by shape, the shapes with few entries in all first: ``FeistelSegments`` then
    makes one pass over those and one batch per shape with many entries."""
    factors: list[tuple[int, int]] = []
    for pt in members:
        assert pt.feistel_factors is not None  # a regenerated layout
        factors.append(pt.feistel_factors)
    entries: collections.Counter[tuple[int, int]] = collections.Counter()
    for a, b in factors:
        entries[(a, b)] += a * b
    order = sorted(range(len(members)), key=lambda i: (entries[factors[i]] >= FEISTEL_BATCHED_ENTRIES, factors[i]))
    return [members[i] for i in order]


def flat_groups(tensors: Sequence[PartitionedTensor]) -> list[FlatGroup]:
    """Move every groupable tensor of ``tensors`` into a ``FlatGroup`` with the others of its kind, layout,
    default, dtype, device and ``requires_grad`` (in the order given; regenerated layouts by shape); returns
    the groups.

    >>> from partition_fx.fx.params import ScalePartitionedTensor
    >>> scales = [ScalePartitionedTensor(torch.ones(3), 2, kind="product", default="init") for _ in range(4)]
    >>> [group] = flat_groups(scales)
    >>> group.part1.shape, scales[2].part(1).shape, [len(t) for t in (group(2), group.members)]
    (torch.Size([12]), torch.Size([3]), [4, 4])
    """
    by_key: dict[tuple[Any, ...], list[PartitionedTensor]] = {}
    for pt in tensors:
        if groupable(pt) and not pt.is_flat:
            by_key.setdefault(_group_key(pt), []).append(pt)
    groups = []
    for members in by_key.values():
        blocks: list[list[PartitionedTensor]] = [[]]
        regenerated = getattr(members[0], "regenerated", False)
        for pt in _regenerated_order(cast("list[RandomPartitionedTensor]", members)) if regenerated else members:
            if blocks[-1] and sum(m.part(1).numel() for m in blocks[-1]) + pt.part(1).numel() > GROUP_ENTRIES:
                blocks.append([])
            blocks[-1].append(pt)
        groups += [FlatGroup(block) for block in blocks]
    return groups


class FlatGroup(nn.Module):
    """C flat parameters holding the parts of its member tensors; ``forward(k)`` returns every member's
    effective tensor of subnetwork k (under ``HAND_OVER``: the members themselves). Build with
    :func:`flat_groups`, which also hands each member its slot."""

    members: list[PartitionedTensor]  # kept in __dict__ (see __init__)
    part1: nn.Parameter  # part1 .. partC: registered in __init__
    index: torch.Tensor | None  # buffers
    default: torch.Tensor | None
    combine: Callable[[Any, Any], Any] | None

    def __init__(self, members: Sequence[PartitionedTensor]) -> None:
        super().__init__()
        first = members[0]
        self.kind = first.kind
        kind = partition_kind(first.kind)
        # Layouts gather rows through an index; copies combine whole parts (``kind.combine``).
        self.gathered = kind.storage == "layout"
        self.combine = kind.combine
        self.num_partitions = first.num_partitions
        self.__dict__["members"] = list(members)  # not submodules: they stay where partitionify put them
        self.shapes = [tuple(m.shape) for m in members]
        self.numels = [math.prod(shape) for shape in self.shapes]
        # Entries gathered together: a node-partitioned tensor's output unit (its row), else one entry.
        self.row: int = cast(RandomPartitionedTensor, first).per_unit if kind.units else 1
        c = self.num_partitions
        # sizes[k][i]: entries of member i in partition k (1-based k); starts: where they begin in group part k
        self.sizes: list[list[int]] = [[]] + [[m.part(k).numel() for m in members] for k in range(1, c + 1)]
        self.starts: list[list[int]] = [[]] + [[sum(row[:i]) for i in range(len(row))] for row in self.sizes[1:]]
        # Where each group part begins in cat(part1, ..., partC).
        self.offsets = [0]
        for k in range(1, c + 1):
            self.offsets.append(self.offsets[-1] + sum(self.sizes[k]))
        for k in range(1, c + 1):
            flat = torch.cat([m.part(k).detach().reshape(-1) for m in members])
            self.register_parameter(f"part{k}", nn.Parameter(flat, requires_grad=first.part(k).requires_grad))
        self.regenerated = bool(getattr(first, "regenerated", False))
        if self.regenerated:
            self.register_buffer("index", None)  # regenerated in every forward and backward (membership())
        elif self.gathered:
            # The index addresses rows: units of node-partitioned tensors, entries otherwise.
            positions = [
                self._positions(i, m.layout_index().long() * self.row) // self.row
                for i, m in enumerate(self._layout_members)
            ]
            dtype = torch.int32 if self.offsets[-1] < 2**31 else torch.int64
            self.register_buffer("index", torch.cat(positions).to(dtype))
        if self.gathered:
            defaults = [m.stored_defaults() for m in members]  # one group, one default mode: all None or none
            self.register_buffer(
                "default", None if defaults[0] is None else self._partition_major(cast("list[torch.Tensor]", defaults))
            )
            self.seeded = first.default_mode == "seed"
        else:
            scales = cast("list[ScalePartitionedTensor]", members)
            self.register_buffer("default", torch.cat([m.stored_defaults().reshape(-1) for m in scales]))
        for slot, member in enumerate(members):
            member.attach(self, slot)

    # --- layout ---------------------------------------------------------------------------------------------

    @property
    def _layout_members(self) -> list[RandomPartitionedTensor]:
        """The members of a group with a layout (``gathered``): random-weight or node-partitioned tensors."""
        return cast("list[RandomPartitionedTensor]", self.members)

    def _bases(self, slot: int) -> torch.Tensor:
        """Per partition (0-based): what to add to member ``slot``'s own layout position to get its position
        in the group's cat(part1, ..., partC)."""
        member = self._layout_members[slot]
        c = self.num_partitions
        bases = [self.offsets[k - 1] + self.starts[k][slot] - member.offsets[k - 1] for k in range(1, c + 1)]
        return torch.tensor(bases, dtype=torch.int64)

    def _positions(self, slot: int, layout: torch.Tensor) -> torch.Tensor:
        member = self._layout_members[slot]
        sizes = [b - a for a, b in zip(member.offsets, member.offsets[1:])]
        partition = assignment_from_index(layout, sizes).long()
        return layout + self._bases(slot).to(layout.device)[partition]

    def _partition_major(self, per_member: list[torch.Tensor]) -> torch.Tensor:
        """Member tensors in their own layout order -> one flat tensor in the group's partition-major order."""
        pieces = []
        for k in range(1, self.num_partitions + 1):
            for member, values in zip(self._layout_members, per_member):
                pieces.append(values.reshape(-1)[member.offsets[k - 1] : member.offsets[k]])
        return torch.cat(pieces)

    def _member_span(self, slot: int) -> tuple[int, int]:
        start = sum(self.numels[:slot])
        return start, start + self.numels[slot]

    # --- members' accessors (not the hot path) -----------------------------------------------------------------

    def storage(self, k: int) -> nn.Parameter:
        """Group part k: the parameter an optimiser steps for partition k of every member."""
        part: nn.Parameter = getattr(self, f"part{k}")
        return part

    @overload
    def member_part(self, slot: int, k: int, grad: Literal[False] = False) -> torch.Tensor: ...
    @overload
    def member_part(self, slot: int, k: int, grad: bool) -> torch.Tensor | None: ...
    def member_part(self, slot: int, k: int, grad: bool = False) -> torch.Tensor | None:
        """Member ``slot``'s part k: a view of group part k (of its ``.grad`` with ``grad=True``; None if
        there is none), flat for random-weight tensors and in the tensor's shape for scales."""
        source = self.storage(k).grad if grad else self.storage(k)
        if source is None:
            return None
        start = self.starts[k][slot]
        part = source[start : start + self.sizes[k][slot]]
        return part if self.gathered else part.view(self.shapes[slot])

    def member_layout_index(self, slot: int) -> torch.Tensor:
        """Member ``slot``'s layout index (its rows' positions in cat(its parts)), int32. Node-partitioned
        members' (one entry per output unit, read by every one-pass forward) are cached; the cache is
        cleared when a state dict is loaded."""
        if self.regenerated:
            raise PartitionError("this group regenerates its layout: use membership()")
        cache = self.__dict__.setdefault("_unit_index_cache", {})
        assert self.index is not None  # a stored layout
        key = (slot, self.index.device, self.index.data_ptr())
        if self.row > 1 and key in cache:
            cached: torch.Tensor = cache[key]
            return cached
        index = self._layout_index(slot)
        if self.row > 1:
            cache[key] = index
        return index

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        # The members' seeds and moments may change with the state too: rebuild from them on the next call.
        self.__dict__.pop("_unit_index_cache", None)
        self.__dict__.pop("_segments_cache", None)
        self.__dict__.pop("_feistel_cache", None)
        super()._load_from_state_dict(*args, **kwargs)

    def membership(self) -> torch.Tensor:
        """Regenerated layouts: the partition (0-based, uint8) of every member entry, flat in member order
        (one ``FeistelSegments`` pass over the group; the members' round tables are cached, nothing per entry)."""
        if not self.regenerated:
            raise PartitionError("this group stores its layout index (group.index)")
        return self._feistel_segments().membership()

    def _feistel_segments(self) -> FeistelSegments:
        # Built outside the scatter's autograd.Function as well (see _scattered): torch.compile refuses tensors
        # created inside its subgraph and kept in a cache.
        device = self.part1.device
        cache = self.__dict__.setdefault("_feistel_cache", {})
        if device not in cache:
            layouts = [m.feistel_layout() for m in self._layout_members]
            sizes = [[self.sizes[k][i] for k in range(1, self.num_partitions + 1)] for i in range(len(self.members))]
            cache[device] = FeistelSegments([(a, b) for a, b, _ in layouts], [t for _, _, t in layouts], sizes)
        segments: FeistelSegments = cache[device]
        return segments

    def _layout_index(self, slot: int) -> torch.Tensor:
        start, end = (i // self.row for i in self._member_span(slot))
        assert self.index is not None  # a stored layout
        positions = self.index[start:end].long() * self.row
        partition = assignment_from_index(positions, [b - a for a, b in zip(self.offsets, self.offsets[1:])]).long()
        return ((positions - self._bases(slot).to(positions.device)[partition]) // self.row).to(torch.int32)

    def member_defaults(self, slot: int) -> torch.Tensor | None:
        """Member ``slot``'s stored defaults: in its layout order (random-weight; None for zero defaults), or
        its default value (scales)."""
        if self.default is None:
            return None
        if not self.gathered:
            start, end = self._member_span(slot)
            return self.default[start:end].view(self.shapes[slot])
        pieces = []
        for k in range(1, self.num_partitions + 1):
            start = self.offsets[k - 1] + self.starts[k][slot]
            pieces.append(self.default[start : start + self.sizes[k][slot]])
        return torch.cat(pieces)

    # --- the hot path ------------------------------------------------------------------------------------

    def _trained(self, k: int) -> list[torch.Tensor]:
        only = grad_partition()
        parts: list[torch.Tensor] = [self.storage(i) for i in range(1, k + 1)]
        if only is None:
            return parts
        return [p if i == only else p.detach() for i, p in enumerate(parts, start=1)]

    def flat_value(self, k: int) -> torch.Tensor:
        """Every member's effective tensor of subnetwork k, flat and concatenated in member order."""
        if not self.gathered:
            assert self.default is not None and self.combine is not None  # whole copies: both always there
            if k == 0:
                return self.default
            first, *rest = self._trained(k)
            out = first
            for part in rest:
                out = self.combine(out, part)
            return out
        pieces = self._trained(k)
        if self.regenerated:
            return self._scattered(k, pieces)
        if k < self.num_partitions:
            if self.default is not None:
                pieces.append(self.default[self.offsets[k] :])
            elif self.seeded:
                pieces.append(self._seeded_tail(k))
            else:
                pieces.append(self.part1.new_zeros(self.offsets[-1] - self.offsets[k]))
        source = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        assert self.index is not None  # a stored layout
        if self.row == 1:
            return source.index_select(0, self.index)
        return source.view(-1, self.row).index_select(0, self.index).view(-1)

    def _scattered(self, k: int, pieces: list[torch.Tensor]) -> torch.Tensor:
        """Regenerated layouts: the parts of 1..k and the defaults of k+1..C placed by the membership (zero
        defaults are the scatter's fill)."""
        if k < self.num_partitions and (self.default is not None or self.seeded):
            tail = self.default[self.offsets[k] :] if self.default is not None else self._seeded_tail(k)
            pieces += tail.split([b - a for a, b in zip(self.offsets[k:], self.offsets[k + 1 :])])
        if not pieces:
            return self.part1.new_zeros(self.offsets[-1]).detach()
        self._feistel_segments()  # built here, outside the autograd.Function, for torch.compile
        return scatter_by_membership(self, pieces)

    def _seeded_tail(self, k: int) -> torch.Tensor:
        """The regenerated defaults of partitions k+1..C of every member (``default="seed"``), partition-major:
        one ``normal_segments`` pass over all (partition, member) ranges instead of one per member."""
        device = self.part1.device
        cache = self.__dict__.setdefault("_segments_cache", {})
        if (k, device) not in cache:
            generators = [m.default_generator() for m in self._layout_members]
            segments = [
                (stream, m.offsets[p - 1], self.sizes[p][i], mean, std)
                for p in range(k + 1, self.num_partitions + 1)
                for i, (m, (stream, mean, std)) in enumerate(zip(self._layout_members, generators))
            ]
            streams, starts, sizes, means, stds = zip(*segments)
            as_int = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
            moments = torch.tensor([means, stds], dtype=torch.float32, device=device)
            cache[(k, device)] = (as_int(streams), as_int(starts), as_int(sizes), moments)
        streams, starts, sizes, moments = cache[(k, device)]
        total = self.offsets[-1] - self.offsets[k]
        z = normal_segments(streams, starts, sizes, total)
        mean, std = (torch.repeat_interleave(row, sizes, output_size=total) for row in moments)
        return z.mul_(std).add_(mean).to(self.part1.dtype)

    def forward(self, k: int) -> tuple[Any, ...]:
        if HAND_OVER.get():
            return tuple(self.members)
        flat = self.flat_value(k)
        return tuple(t.view(shape) for t, shape in zip(flat.split(self.numels), self.shapes))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, members={len(self.members)}, sizes={[sum(s) for s in self.sizes[1:]]}"
