"""Checks of a conversion against its definition, for tests and for users converting their own models.

>>> import torch
>>> from partition_fx import partitionify
>>> from partition_fx.testing import perturb_partitions, assert_subnetworks_match_exports
>>> pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), 3)
>>> perturb_partitions(pmodel, seed=0)
>>> assert_subnetworks_match_exports(pmodel, (torch.randn(2, 4),))  # relative difference per subnetwork
{0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
"""

from __future__ import annotations

import operator
from typing import Any, cast

import torch

from .export import export_subnetwork, flat_tensors
from .fx.kinds import partition_kind
from .fx.params import PartitionedTensor, RandomPartitionedTensor
from .fx.partitioned_model import PartitionedModel


def perturb_partitions(pmodel: PartitionedModel, *, scale: float = 0.05, seed: int = 0) -> None:
    """Move every partition's trained values away from the defaults, in place, reproducibly.

    Random-weight parts and sum parts get ``scale`` times their tensor's RMS (at least ``scale``) of
    Gaussian noise; product parts are multiplied by ``1 + scale * noise`` and shifted by
    ``scale * noise``, so every subnetwork differs (also where a scale starts at zero).
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, pt in pmodel.partitioned_tensors():
            for part in pt.parts():
                if part.numel() == 0 or not part.is_floating_point():
                    continue
                noise = torch.randn(part.shape, generator=generator, dtype=torch.float32).to(part)
                if partition_kind(pt.kind).combine is operator.mul:
                    # multiply, and also shift, so zero-initialised scales (timm's zero_init_last) move too
                    shift = torch.randn(part.shape, generator=generator, dtype=torch.float32).to(part)
                    part.mul_(1 + scale * noise).add_(scale * shift)
                else:
                    rms = float(part.float().pow(2).mean().sqrt()) if part.numel() else 0.0
                    part.add_(noise * scale * max(rms, 1.0 if rms == 0 else rms))


def max_relative_difference(a: Any, b: Any) -> float:
    """Max |a - b| over all output tensors, relative to the largest |b| (at least 1e-12)."""
    ta, tb = flat_tensors(a), flat_tensors(b)
    if len(ta) != len(tb):
        raise AssertionError(f"outputs have {len(ta)} vs {len(tb)} tensors")
    worst = 0.0
    for x, y in zip(ta, tb):
        if x.shape != y.shape:
            raise AssertionError(f"output shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
        if x.numel() == 0:
            continue
        x, y = x.detach().double(), y.detach().double()
        scale = max(float(y.abs().max()), 1e-12)
        worst = max(worst, float((x - y).abs().max()) / scale)
    return worst


def _by_entry(membership: torch.Tensor, order: torch.Tensor, layout_values: torch.Tensor) -> torch.Tensor:
    """Values listed partition by partition, each partition's entries in flat order (a random/node tensor's
    ``cat(parts)`` and its defaults), put back at their entries."""
    out = torch.empty(membership.numel(), dtype=layout_values.dtype, device=layout_values.device)
    out[order] = layout_values.reshape(-1)
    return out


def _definition_of(pt: PartitionedTensor) -> Any:
    """``want(k)``: the tensor of subnetwork k by the definition, from ``pt``'s parts, defaults and layout.

    Layouts (random/node): each entry's partition (``membership``) picks part i's value (i <= k) or the
    default; a part lists its entries in flat order, as do the defaults of each partition (layout order).
    Copies (product/sum scales): parts 1..k combined by the kind's ``combine``, the stored default at k = 0.
    Nothing here reads ``FlatGroup.flat_value``, which both the forward and the export use."""
    kind = partition_kind(pt.kind)
    with torch.no_grad():
        if kind.storage == "copies":
            stored, combine = pt.stored_defaults(), kind.combine
            assert stored is not None and combine is not None  # copies store their default and combine them
            default = stored.detach().clone()
            parts = [p.detach().clone().view(pt.shape) for p in pt.parts()]

            def copies(k: int) -> torch.Tensor:
                if k == 0:
                    return default
                out = parts[0]
                for part in parts[1:k]:
                    out = combine(out, part)
                return out

            return copies
        assert kind.storage == "layout", f"{pt.kind}: no definition of this storage"
        layout = cast(RandomPartitionedTensor, pt)  # the layout kinds' tensor class
        membership = layout.membership().long()
        order = torch.argsort(membership, stable=True)  # entries partition by partition, flat order within
        trained = _by_entry(membership, order, torch.cat([p.detach().reshape(-1) for p in pt.parts()]))
        defaults = _by_entry(membership, order, layout.default_values().detach())

    def entries(k: int) -> torch.Tensor:
        return torch.where(membership < k, trained, defaults).view(pt.shape)

    return entries


def assert_subnetworks_match_exports(
    pmodel: PartitionedModel, inputs: tuple[Any, ...], *, rtol: float = 1e-5, subnetworks: list[int] | None = None
) -> dict[int, float]:
    """Invariant 1: for each k, ``pmodel(*inputs, subnetwork=k)`` equals ``export_subnetwork(pmodel, k)(*inputs)``,
    and every partitioned tensor of that export is subnetwork k's by the definition.

    Compared in ``pmodel``'s current mode, under ``torch.no_grad``; returns the relative difference per k.

    The forward and the export read the same effective tensors (``FlatGroup.flat_value``), so their agreement
    shows consistency, not the definition: a ``flat_value`` giving subnetwork k the partitions 1..k-1 passed it.
    So each exported tensor is also checked exactly against its parts, defaults and layout: the entries of
    partitions 1..k hold their trained values and the others the defaults (random/node), the product/sum of
    parts 1..k (scales).
    """
    definitions = {name: _definition_of(pt) for name, pt in pmodel.partitioned_tensors()}
    diffs = {}
    for k in subnetworks if subnetworks is not None else range(pmodel.num_partitions + 1):
        exported = export_subnetwork(pmodel, k)
        with torch.no_grad():
            got = pmodel(*inputs, subnetwork=k)
            want = exported(*inputs)
        diffs[k] = max_relative_difference(got, want)
        if not diffs[k] <= rtol:
            raise AssertionError(
                f"subnetwork {k} of {pmodel.original_class.__name__} differs from its export by {diffs[k]:.3g} "
                f"(relative to output scale; allowed {rtol})"
            )
        state = exported.state_dict()
        for name, definition in definitions.items():
            tensor = state[name]
            expected = definition(k).to(tensor.device, tensor.dtype)
            if not torch.equal(tensor, expected):
                wrong = int((tensor != expected).sum())
                raise AssertionError(
                    f"subnetwork {k} of {pmodel.original_class.__name__}: {wrong} entries of {name} are not "
                    f"subnetwork {k}'s by the definition (partitions 1..{k} trained, the others their defaults)"
                )
    return diffs
