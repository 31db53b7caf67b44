"""Partition assignment: exact per-tensor proportions from a counter-based hash.

The random numbers are a hash of (seed, tensor salt, element index) computed with int64 tensor ops,
so the same seed gives the same assignment on every run, device and torch version, and nothing but
the seed needs storing.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one stays below 2**63 in int64 arithmetic.
_M1 = 0x7FEB352D
_M2 = 0x4CA68B35
_GOLDEN = 0x1E3779B9


_CHUNK = 1 << 18  # elements hashed at a time: keeps the temporaries in cache (10x faster on 25M entries)


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """In place: a 32-bit avalanche hash (lowbias32 shape) of int64 values in [0, 2**32)."""
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp)
    x.mul_(_M1).bitwise_and_(_MASK32)
    torch.bitwise_right_shift(x, 15, out=tmp)
    x.bitwise_xor_(tmp)
    x.mul_(_M2).bitwise_and_(_MASK32)
    torch.bitwise_right_shift(x, 16, out=tmp)
    x.bitwise_xor_(tmp)
    return x


def _mix32(value: int) -> int:
    x = torch.tensor([value & _MASK32], dtype=torch.int64)
    return int(_mix32_(x, torch.empty_like(x)))


def name_salt(name: str) -> int:
    """A stable 32-bit salt for a parameter name (crc32: the same in every process and version)."""
    return zlib.crc32(name.encode("utf-8")) & _MASK32


def hash_keys(seed: int, salt: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Distinct non-negative int64 keys in hashed order: ``(hash31(seed, salt, i) << 32) | i``."""
    if numel >= 2**32:
        raise ValueError(f"tensors with >= 2**32 entries are not supported (got {numel})")
    stream = _mix32(_mix32((seed & _MASK32) ^ ((seed >> 32) & _MASK32)) ^ (salt & _MASK32))
    offset = (stream * _GOLDEN) & _MASK32
    keys = torch.empty(numel, dtype=torch.int64, device=device)
    for start in range(0, numel, _CHUNK):
        end = min(numel, start + _CHUNK)
        x = torch.arange(start, end, dtype=torch.int64, device=device)
        tmp = torch.empty_like(x)
        x.add_(offset).bitwise_and_(_MASK32)
        _mix32_(x, tmp).bitwise_xor_(stream)
        _mix32_(x, tmp).bitwise_right_shift_(1).bitwise_left_shift_(32)
        keys[start:end] = x.add_(torch.arange(start, end, dtype=torch.int64, device=device))
    return keys


def partition_sizes(numel: int, proportions: Sequence[float]) -> list[int]:
    """Entries per partition by largest-remainder rounding (ties go to the earlier partition).

    >>> partition_sizes(10, (0.8, 0.1, 0.1))
    [8, 1, 1]
    >>> partition_sizes(1, (1/3, 1/3, 1/3))
    [1, 0, 0]
    """
    quotas = [p * numel for p in proportions]
    sizes = [math.floor(q) for q in quotas]
    remainder = numel - sum(sizes)
    by_fraction = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_fraction[:remainder]:
        sizes[i] += 1
    return sizes


def random_assignment(
    numel: int, proportions: Sequence[float], seed: int, salt: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Partition (0-based, uint8) of each of ``numel`` entries, with exactly ``partition_sizes`` per partition.

    Entry i goes to the partition whose share of the sorted hash keys holds key i; the thresholds are
    found by selection (``kthvalue``), not a full sort.

    >>> a = random_assignment(10, (0.5, 0.5), seed=0, salt=1)
    >>> [int((a == k).sum()) for k in range(2)]
    [5, 5]
    """
    sizes = partition_sizes(numel, proportions)
    if numel == 0:
        return torch.zeros(0, dtype=torch.uint8, device=device)
    keys = hash_keys(seed, salt, numel, device)
    thresholds = []
    cumulative = 0
    for size in sizes[:-1]:
        cumulative += size
        if cumulative == 0:
            thresholds.append(-1)  # below every key: this partition is empty
        elif cumulative >= numel:
            thresholds.append(2**63 - 1)
        else:
            thresholds.append(int(torch.kthvalue(keys, cumulative).values))
    if not thresholds:
        return torch.zeros(numel, dtype=torch.uint8, device=device)
    bounds = torch.tensor(thresholds, dtype=torch.int64, device=device)
    # Partition = how many thresholds lie strictly below the key; key == threshold stays in the lower one.
    return torch.searchsorted(bounds, keys, side="left").to(torch.uint8)


def partition_layout(assignment: torch.Tensor, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The partition-major layout of a tensor's entries.

    Returns ``(order, index, sizes)``: ``order`` lists the flat positions of partition 0's entries,
    then partition 1's, ... (each in increasing position); ``index`` is its inverse, so
    ``torch.cat(parts)[index]`` rebuilds the flat tensor when ``parts[k] = flat[order][offsets[k]:...]``;
    ``sizes`` counts the entries per partition.

    >>> partition_layout(torch.tensor([1, 0, 1, 0], dtype=torch.uint8), 2)
    (tensor([1, 3, 0, 2]), tensor([2, 0, 3, 1]), [2, 2])
    """
    order = torch.argsort(assignment, stable=True)
    index = torch.empty_like(order)
    index[order] = torch.arange(order.numel(), device=order.device)
    sizes = torch.bincount(assignment.long(), minlength=num_partitions).tolist()
    return order, index, sizes


def node_assignment(
    shape: Sequence[int], proportions: Sequence[float], seed: int, salt: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Node partitioning (appendix C): each output unit (index along dim 0) goes to one partition, with
    exactly ``partition_sizes(shape[0], proportions)`` units per partition, and all its entries follow it.

    A layer's weight and bias get the same unit assignment when they share ``salt`` (the layer's name).

    >>> node_assignment((4, 3), (0.5, 0.5), seed=0, salt=7).view(4, 3)
    tensor([[1, 1, 1],
            [0, 0, 0],
            [0, 0, 0],
            [1, 1, 1]], dtype=torch.uint8)
    """
    units = int(shape[0]) if len(shape) else 1
    per_unit = math.prod(shape[1:]) if len(shape) > 1 else 1
    return random_assignment(units, proportions, seed, salt, device).repeat_interleave(per_unit)
