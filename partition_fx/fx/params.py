"""One module per partitioned tensor: its C trained parts, its defaults, and the effective tensor of
subnetwork k.

Each part is its own flat ``nn.Parameter`` (``part1`` .. ``partC``), so stock ``torch.optim`` optimisers
keep per-partition state: a part that subnetwork k does not use never enters its graph, its ``.grad``
stays ``None`` and the optimiser skips it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._validation import check_choice
from ..errors import PartitionCheckpointError, PartitionError, PartitionNotImplementedError, earlier_version
from .assign import (
    assignment_from_index,
    default_stream,
    feistel_factors,
    feistel_index,
    feistel_tables,
    layout_index,
    normal_values,
)
from .kinds import partition_kind, partition_kinds
from .regenerated import scatter_by_membership

if TYPE_CHECKING:
    from .flat import FlatGroup

_GRAD_PARTITION: ContextVar[int | None] = ContextVar("partition_fx_grad_partition", default=None)
# While set, calling a PartitionedTensor returns the tensor object itself, so that the rewritten graph hands
# it to its layer (``per_example.one_pass``) instead of a value.
HAND_OVER: ContextVar[bool] = ContextVar("partition_fx_hand_over", default=False)


def grad_partition() -> int | None:
    """The partition that effective tensors pass gradients to now (see ``gradient_only_to``; None: all)."""
    return _GRAD_PARTITION.get()


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
    """Base class: ``forward(k)`` (and ``value(k)``) return the tensor subnetwork k uses (k in 0..C).

    Its parts are its own parameters ``part1`` .. ``partC``, or, once ``partitionify`` has put it in flat
    storage (``partition_fx.fx.flat``), views of a ``FlatGroup`` 's parameters shared with other tensors:
    ``storage(k)`` is then the parameter an optimiser steps and ``part_grad(k)`` reads this tensor's share of
    its gradient.
    """

    kind: str
    num_partitions: int
    shape: tuple[int, ...]
    default_mode: str
    _flat: tuple[FlatGroup, int] | None = None  # (FlatGroup, slot) once in flat storage

    @property
    def is_flat(self) -> bool:
        """Whether the parts live in a ``FlatGroup`` (see ``partition_fx.fx.flat``)."""
        return self._flat is not None

    def attach(self, group: nn.Module, slot: int) -> None:
        """Hand this tensor's parameters and stored layout/defaults over to ``group`` (``FlatGroup`` calls it
        after copying them)."""
        for k in range(1, self.num_partitions + 1):
            del self._parameters[f"part{k}"]
        for name in ("index", "unit_index", "default"):
            self._buffers.pop(name, None)
            self.__dict__.pop(name, None)
        self.__dict__["_flat"] = (group, slot)  # a plain reference: the group is registered elsewhere

    def part(self, k: int) -> torch.Tensor:
        """The trained values of partition k (1-based): the parameter itself, or its view in flat storage."""
        if self._flat is not None:
            group, slot = self._flat
            return group.member_part(slot, k)
        part: nn.Parameter = getattr(self, f"part{k}")
        return part

    def storage(self, k: int) -> nn.Parameter:
        """The parameter that holds partition k's values (shared with the other tensors of a flat group).

        >>> t = RandomPartitionedTensor(torch.ones(4), (0.5, 0.5), seed=0, salt=0, default="init")
        >>> t.storage(1) is t.part(1)
        True
        """
        if self._flat is not None:
            return self._flat[0].storage(k)
        part: nn.Parameter = getattr(self, f"part{k}")
        return part

    def part_grad(self, k: int) -> torch.Tensor | None:
        """The gradient of part k (None when partition k received none)."""
        if self._flat is not None:
            group, slot = self._flat
            return group.member_part(slot, k, grad=True)
        return self.part(k).grad

    def trained_parts(self, k: int) -> list[torch.Tensor]:
        """Parts 1..k as subnetwork k uses them: detached except where gradients may flow (see
        ``gradient_only_to``)."""
        parts = [self.part(i) for i in range(1, k + 1)]
        only = _GRAD_PARTITION.get()
        if only is None:
            return parts
        return [p if i == only else p.detach() for i, p in enumerate(parts, start=1)]

    def parts(self) -> list[torch.Tensor]:
        return [self.part(k) for k in range(1, self.num_partitions + 1)]

    def stored_defaults(self) -> torch.Tensor | None:
        """The stored default values (random-weight: in layout order; None when they are not stored)."""
        if self._flat is not None:
            group, slot = self._flat
            return group.member_defaults(slot)
        default: torch.Tensor | None = getattr(self, "default", None)
        return default

    def partition_sizes(self) -> list[int]:
        """Number of trainable entries each partition holds for this tensor."""
        return [p.numel() for p in self.parts()]

    @classmethod
    def from_parameter(
        cls,
        value: torch.Tensor,
        kind: str,
        proportions: Sequence[float],
        *,
        seed: int,
        salt: int,
        default_salt: int,
        default: str,
        regenerate: bool,
    ) -> PartitionedTensor:
        """``value`` partitioned as ``kind`` (one this class builds, ``partition_fx.fx.kinds``), as ``partitionify``
        asks: ``salt`` seeds the layout (the layer's for output units), ``default_salt`` regenerated defaults.

        >>> ScalePartitionedTensor.from_parameter(
        ...     torch.ones(2), "sum", (0.5, 0.5), seed=0, salt=0, default_salt=0, default="init", regenerate=False)
        ScalePartitionedTensor(shape=(2,), kind='sum', default='init')
        """
        raise PartitionNotImplementedError(f"{cls.__name__} must implement from_parameter")

    def value(self, k: int) -> torch.Tensor:
        """The tensor subnetwork k uses."""
        raise PartitionNotImplementedError(f"{type(self).__name__} must implement value(k)")

    def forward(self, k: int) -> Any:
        return self if HAND_OVER.get() else self.value(k)


def _float64_values(bits: torch.Tensor) -> tuple[float, ...]:
    return tuple(bits.detach().cpu().view(torch.float64).tolist())


class RandomPartitionedTensor(PartitionedTensor):
    """Random-weight partitioning (appendix C): each entry belongs to one partition.

    With ``node=True`` (node partitioning, for conv/linear weights and biases) the assignment is drawn per
    output unit (dim 0) and every entry of the unit's row follows it; ``kind`` is then ``"node"``.

    Subnetwork k takes the trained value of entries in partitions 1..k and the default elsewhere. Each
    entry has a place in ``cat(part1, ..., partC)`` (``assign.layout_index``; whole rows for node
    partitioning), so the effective tensor is one ``cat`` and one ``index_select``; defaults are kept in
    that same layout. Where things live:

    - the layout index: an int32 buffer ``index`` (node partitioning: ``unit_index``, one entry per
      output unit), or, with ``regenerate=True`` and a tensor the Feistel permutation covers
      (``assign.random_assignment``), nothing: each entry's partition is regenerated from the seed in every
      forward and backward, and the effective tensor is built by one ``masked_scatter`` per partition (each
      part holds its entries in flat order, so both layouts agree);
    - the defaults: a buffer ``default`` (``"init"``), nothing (``"zero"``), or ``"seed"``: regenerated as
      ``mean + std * normal_values(seed, ...)`` from the tensor's mean and std at conversion, which also
      re-initialise the tensor (every subnetwork equals the re-initialised model at conversion).

    The seed and salts (buffer ``generator``) and the moments (buffer ``moments``: float64 bits, immune to
    ``.to(dtype)``) are part of the state_dict, so loading a checkpoint regenerates the same values whatever
    seed the model was converted with.
    """

    kind = "random"
    # Buffers, each registered only where the layout and default need it (see above).
    index: torch.Tensor
    unit_index: torch.Tensor
    generator: torch.Tensor
    moments: torch.Tensor
    default: torch.Tensor | None

    def __init__(
        self,
        value: torch.Tensor,
        proportions: Sequence[float],
        *,
        seed: int,
        salt: int,
        default: str,
        node: bool = False,
        regenerate: bool = False,
        default_salt: int | None = None,
    ) -> None:
        super().__init__()
        self.kind = "node" if node else "random"
        self.num_partitions = len(proportions)
        self.shape = tuple(value.shape)
        self.default_mode = default
        device = value.device
        flat = value.detach().reshape(-1)
        numel = flat.numel()
        units = self.shape[0] if node and self.shape else 1
        self.per_unit = numel // max(units, 1) if node else 1  # entries per output unit (its row)
        if node:
            index, sizes = layout_index(units, proportions, seed, salt)
            self.register_buffer("unit_index", index.to(torch.int32).to(device))
            sizes = [n * self.per_unit for n in sizes]
        else:
            index, sizes = layout_index(numel, proportions, seed, salt)
        self.feistel_factors = None if node or not regenerate else feistel_factors(numel)
        self.regenerated = self.feistel_factors is not None
        self._tables: list[torch.Tensor] | None = None
        if not node and not self.regenerated:
            # int32 halves the index memory; index_select and its backward accept it.
            self.register_buffer("index", index.to(torch.int32).to(device))
        # Where each partition starts in the partition-major layout (sizes are the parts' numels).
        self.offsets = [0, *itertools.accumulate(sizes)]
        # ``default_salt`` keeps a node-partitioned layer's weight and bias defaults apart (they share ``salt``).
        self._seed, self._salt, self._default_salt = seed, salt, salt if default_salt is None else default_salt
        if self.regenerated or default == "seed":
            generator = [self._seed, self._salt, self._default_salt]
            self.register_buffer("generator", torch.tensor(generator, dtype=torch.int64, device=device))
        if default == "seed":
            std, mean = torch.std_mean(flat.double(), correction=0) if numel else (torch.zeros(()), torch.zeros(()))
            # The float64 bits in an int64 buffer: ``.half()``/``.to(dtype)`` casts every floating buffer, and
            # rounded moments would silently change the regenerated defaults after a state_dict round trip.
            moments = torch.tensor([float(mean), float(std)], dtype=torch.float64).view(torch.int64)
            self.register_buffer("moments", moments.to(device))
            self._moments = _float64_values(self.moments)
            laid_out = self._seeded_defaults(0, device).to(flat.dtype)
        else:
            flat_index = self._expand_units(index.to(device)) if node else index.to(device).long()
            laid_out = flat.new_empty(numel).index_copy_(0, flat_index, flat)
        for k, n in enumerate(sizes, start=1):
            start = self.offsets[k - 1]
            part = laid_out[start : start + n].clone()
            self.register_parameter(f"part{k}", nn.Parameter(part, requires_grad=value.requires_grad))
        if default == "init":
            self.register_buffer("default", laid_out.clone())
        else:
            self.default = None

    @classmethod
    def from_parameter(
        cls, value: torch.Tensor, kind: str, proportions: Sequence[float], **how: Any
    ) -> RandomPartitionedTensor:
        return cls(value, proportions, node=partition_kind(kind).units, **how)  # how: the constructor's keywords

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        moments = state_dict.get(prefix + "moments")
        if moments is not None and moments.is_floating_point():  # loading would truncate them to integers
            raise PartitionCheckpointError(
                earlier_version(
                    f"state dict entry {prefix}moments", f"the moments as float64 bits; it holds {moments.dtype}"
                )
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        # Cached as Python numbers so that regenerating never syncs with the device.
        if hasattr(self, "generator"):
            self._seed, self._salt, self._default_salt = (int(v) for v in self.generator.tolist())
            self._tables = None  # regenerate the round tables for the loaded seed
        if hasattr(self, "moments"):
            self._moments = _float64_values(self.moments)

    def layout_index(self) -> torch.Tensor:
        """Each entry's position in ``cat(parts)`` (int32, flat; node partitioning: one per output unit).
        Regenerated indices are not materialised: see ``membership``."""
        if self.regenerated:
            raise PartitionError("this tensor regenerates its layout: use membership()")
        if self._flat is not None:
            group, slot = self._flat
            return group.member_layout_index(slot)
        return self.unit_index if self.kind == "node" else self.index

    def membership(self) -> torch.Tensor:
        """The partition (0-based, uint8) of every entry, flat."""
        sizes = [b - a for a, b in itertools.pairwise(self.offsets)]
        if not self.regenerated:
            return assignment_from_index(self._flat_index(), sizes)
        a, b, tables = self.feistel_layout()
        return assignment_from_index(feistel_index(a, b, tables), sizes)

    def feistel_layout(self) -> tuple[int, int, list[torch.Tensor]]:
        """A regenerated layout's permutation: ``(a, b, round tables)`` of ``assign.feistel_index`` (the
        tables on the parts' device; they hold a + b entries for a * b weights: cached, not persisted)."""
        if self.feistel_factors is None:
            raise PartitionError("this tensor stores its layout: use layout_index()")
        device = self.part(1).device
        if self._tables is None or self._tables[0].device != device:
            self._tables = feistel_tables(*self.feistel_factors, self._seed, self._salt, device)
        return (*self.feistel_factors, self._tables)

    def _expand_units(self, unit_index: torch.Tensor) -> torch.Tensor:
        """Node partitioning: the flat (int64) index of every entry from its unit's index."""
        rows = unit_index.long()[:, None] * self.per_unit
        return (rows + torch.arange(self.per_unit, device=unit_index.device)).view(-1)

    def unit_membership(self) -> torch.Tensor:
        """Node partitioning: the partition (1-based, int64) of every output unit."""
        unit_sizes = [(b - a) // self.per_unit for a, b in itertools.pairwise(self.offsets)]
        return assignment_from_index(self.layout_index(), unit_sizes).long() + 1

    def unit_defaults(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Node partitioning: the output units of partitions k+1..C and their default rows, both in layout
        order (only those rows are read or regenerated)."""
        unit_index = self.layout_index()
        layout_order = torch.empty_like(unit_index)
        layout_order[unit_index.long()] = torch.arange(
            unit_index.numel(), dtype=layout_order.dtype, device=layout_order.device
        )
        units = layout_order[self.offsets[k] // self.per_unit :].long()
        return units, self._default_slice(k).view(units.numel(), *self.shape[1:])

    def _flat_index(self) -> torch.Tensor:
        index = self.layout_index()
        return self._expand_units(index) if self.kind == "node" else index

    def _seeded_defaults(self, start: int, device: torch.device) -> torch.Tensor:
        """The regenerated defaults of layout positions ``start..`` (``default="seed"``)."""
        mean, std = self._moments
        z = normal_values(self._seed, self._default_salt, start, self.offsets[-1], device)
        return z.mul_(std).add_(mean)

    def default_generator(self) -> tuple[int, float, float]:
        """``(stream, mean, std)`` of the regenerated defaults (``default="seed"``): layout position i holds
        ``mean + std * z_i``, z_i the standard-normal value of counter i in ``stream``
        (``assign.normal_segments``)."""
        mean, std = self._moments
        return default_stream(self._seed, self._default_salt), mean, std

    def assignment(self) -> torch.Tensor:
        """The partition (0-based, uint8) of every entry, in the tensor's shape.

        >>> t = RandomPartitionedTensor(torch.zeros(3, 2), (0.5, 0.5), seed=0, salt=0, default="init", node=True)
        >>> t.assignment().tolist()  # node partitioning: whole rows
        [[0, 0], [0, 0], [1, 1]]
        """
        return self.membership().view(self.shape)

    def default_values(self) -> torch.Tensor:
        """The default of every entry, partition by partition in layout order (what ``cat(parts)`` lists the
        trained values in): zeros, the stored initial values, or those regenerated from the seed.

        >>> t = RandomPartitionedTensor(torch.ones(4), (0.5, 0.5), seed=0, salt=0, default="init")
        >>> t.default_values()
        tensor([1., 1., 1., 1.])
        """
        return self._default_slice(0)

    def _default_slice(self, start: int) -> torch.Tensor:
        """Defaults of partitions start+1..C, in layout order."""
        if self.default_mode == "seed":
            return self._seeded_defaults(self.offsets[start], self.part(1).device).to(self.part(1).dtype)
        stored = self.stored_defaults()
        if stored is None:
            return self.part(1).new_zeros(self.offsets[-1] - self.offsets[start])
        return stored[self.offsets[start] :]

    def value(self, k: int) -> torch.Tensor:
        trained = self.trained_parts(k)
        if self.regenerated:
            return self._regenerated_value(k, trained)
        if k < self.num_partitions:
            trained.append(self._default_slice(k))
        flat = trained[0] if len(trained) == 1 else torch.cat(trained)
        index = self.layout_index()
        if self.kind == "node":
            rows = flat.view(index.numel(), -1) if index.numel() else flat.view(0, 0)
            return rows.index_select(0, index).view(self.shape)
        return flat.index_select(0, index).view(self.shape)

    def _regenerated_value(self, k: int, trained: list[torch.Tensor]) -> torch.Tensor:
        if k < self.num_partitions and self.default_mode != "zero":  # zero defaults: the scatter's fill
            defaults = self._default_slice(k)
            start = self.offsets[k]
            trained += [defaults[a - start : b - start] for a, b in itertools.pairwise(self.offsets[k:])]
        if not trained:
            return self.part(1).new_zeros(self.shape).detach()
        return scatter_by_membership(self, trained).view(self.shape)

    def extra_repr(self) -> str:
        index = "regenerated" if self.regenerated else "stored"
        return (
            f"shape={self.shape}, kind={self.kind!r}, sizes={self.partition_sizes()}, "
            f"default={self.default_mode!r}, index={index}"
        )


class ScalePartitionedTensor(PartitionedTensor):
    """Product or sum partitioning (appendix I.2) for norm affines and FixUp scalars.

    C copies s_1..s_C of the whole tensor; subnetwork k uses s_1 * ... * s_k (``"product"``) or
    s_1 + ... + s_k (``"sum"``). s_1 starts at the original value and the others at the identity (1 or
    0), so every subnetwork equals the original at conversion. Subnetwork 0 uses the default of s_1:
    its value at conversion (``default="init"`` or ``"seed"``) or the identity (``default="zero"``, which for a
    scale means "no scaling" rather than multiplying by zero).
    """

    def __init__(self, value: torch.Tensor, num_partitions: int, *, kind: str, default: str) -> None:
        super().__init__()
        copies = [k.name for k in partition_kinds() if k.storage == "copies"]
        self.kind = check_choice("kind", kind, copies)
        self.num_partitions = num_partitions
        self.shape = tuple(value.shape)
        self.default_mode = default
        trainable = value.requires_grad
        value = value.detach()
        identity_value = partition_kind(kind).identity
        assert identity_value is not None  # every "copies" kind has one (register_kind)
        identity = torch.full_like(value, identity_value)
        for k in range(1, num_partitions + 1):
            start = value.clone() if k == 1 else identity.clone()
            self.register_parameter(f"part{k}", nn.Parameter(start, requires_grad=trainable))
        # "seed" keeps the value at conversion too: a scale's default is one small vector, and norm affines
        # start at constants that re-initialising would only reproduce.
        self.register_buffer("default", value.clone() if default in ("init", "seed") else identity)

    def value(self, k: int) -> torch.Tensor:
        if k == 0:
            return self.stored_defaults()
        # A view, never the Parameter itself: functional_call would register a Parameter it is given in
        # the leaf's _parameters and, when restoring, leave the meta stand-in there as a parameter.
        first, *rest = self.trained_parts(k)
        out = first.view(self.shape)
        combine = partition_kind(self.kind).combine
        assert combine is not None  # every "copies" kind has one (register_kind)
        for part in rest:
            out = combine(out, part)
        return out

    def stored_defaults(self) -> torch.Tensor:
        default = super().stored_defaults()
        assert default is not None  # a scale always stores its default
        return default

    @classmethod
    def from_parameter(
        cls, value: torch.Tensor, kind: str, proportions: Sequence[float], **how: Any
    ) -> ScalePartitionedTensor:
        return cls(value, len(proportions), kind=kind, default=how["default"])  # whole copies: no layout, no seed

    def extra_repr(self) -> str:
        return f"shape={self.shape}, kind={self.kind!r}, default={self.default_mode!r}"
