"""Partition assignment: exact per-tensor proportions from a counter-based hash.

The random numbers are a hash of (seed, tensor salt, element index) computed with int64 tensor ops,
so the same seed gives the same assignment on every run, device and torch version, and nothing but
the seed needs storing.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Sequence
from statistics import NormalDist

import torch

from ..errors import PartitionArgumentError

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one stays below 2**63 in int64 arithmetic.
_M1 = 0x7FEB352D
_M2 = 0x4CA68B35
_GOLDEN = 0x1E3779B9


_MIN_FEISTEL_FACTOR = 32  # below this the Feistel rounds mix poorly: such tensors store their index
_FEISTEL_HALF_ROUNDS = 4
_NORMAL_BITS = 12
_NORMAL_KNOTS = 1 << _NORMAL_BITS
_DEFAULTS_STREAM = 0x5EED5EED

_CHUNK = 1 << 18  # elements hashed at a time: the temporaries stay in cache (speed-up: docs/benchmarks.md)


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
    """``_mix32_`` of one Python int (the same bits: no product exceeds 2**63). Plain ints, so
    torch.compile folds it instead of breaking its graph on a tensor ``.item()``."""
    x = value & _MASK32
    x ^= x >> 16
    x = (x * _M1) & _MASK32
    x ^= x >> 15
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def name_salt(name: str) -> int:
    """A stable 32-bit salt for a parameter name (crc32: the same in every process and version)."""
    return zlib.crc32(name.encode("utf-8")) & _MASK32


def _stream(seed: int, salt: int) -> int:
    return _mix32(_mix32((seed & _MASK32) ^ ((seed >> 32) & _MASK32)) ^ (salt & _MASK32))


def _hashed_(x: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """In place: the 32-bit hashes of counters ``x`` (int64) in ``stream`` (an int, or one per counter)."""
    x.add_((stream * _GOLDEN) & _MASK32).bitwise_and_(_MASK32)
    tmp = torch.empty_like(x)
    _mix32_(x, tmp).bitwise_xor_(stream)
    return _mix32_(x, tmp)


def hash32(stream: int, start: int, end: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """32-bit hashes (int64 values in [0, 2**32)) of the counters ``start..end-1`` in ``stream``."""
    out = torch.empty(end - start, dtype=torch.int64, device=device)
    for lo in range(start, end, _CHUNK):
        hi = min(end, lo + _CHUNK)
        out[lo - start : hi - start] = _hashed_(torch.arange(lo, hi, dtype=torch.int64, device=device), stream)
    return out


def hash_keys(seed: int, salt: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Distinct non-negative int64 keys in hashed order: ``(hash31(seed, salt, i) << 32) | i``."""
    if numel >= 2**32:
        raise PartitionArgumentError(f"tensors with >= 2**32 entries are not supported (got {numel})")
    keys = hash32(_stream(seed, salt), 0, numel, device)
    return keys.bitwise_right_shift_(1).bitwise_left_shift_(32).add_(torch.arange(numel, device=device))


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


def _ranked_assignment(
    numel: int, proportions: Sequence[float], seed: int, salt: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Entry i goes to the partition whose share of the sorted hash keys holds key i; the thresholds are
    found by selection (``kthvalue``), not a full sort."""
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


def random_assignment(
    numel: int, proportions: Sequence[float], seed: int, salt: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Partition (0-based, uint8) of each of ``numel`` entries, with exactly ``partition_sizes`` per partition.

    When ``numel`` has a divisor pair (a, b) with both >= 32, entry i belongs to the partition whose share of
    ``range(numel)`` holds ``feistel_index(...)[i]``, a seeded pseudo-random permutation that can be
    regenerated on the fly instead of stored. Smaller or awkwardly sized tensors rank hash keys instead
    (``_ranked_assignment``).

    >>> a = random_assignment(10, (0.5, 0.5), seed=0, salt=1)
    >>> [int((a == k).sum()) for k in range(2)]
    [5, 5]
    """
    sizes = partition_sizes(numel, proportions)
    factors = feistel_factors(numel)
    if factors is None:
        return _ranked_assignment(numel, proportions, seed, salt, device)
    return assignment_from_index(feistel_index(*factors, feistel_tables(*factors, seed, salt, device)), sizes)


def assignment_from_index(index: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """The partition (0-based, uint8) of each entry, from its rank (or position) in partition-major order."""
    # One comparison per boundary: faster than bucketize on CPU for the few partitions of a model (by how much:
    # docs/benchmarks.md).
    out = torch.zeros(index.shape, dtype=torch.uint8, device=index.device)
    for bound in list(itertools.accumulate(sizes))[:-1]:
        out += index >= bound
    return out


def layout_index(
    numel: int, proportions: Sequence[float], seed: int, salt: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, list[int]]:
    """Where each entry of a flat tensor lives in ``cat(part1, ..., partC)`` (each part holds its entries in
    flat order), and the parts' sizes.

    Keeping each part in flat order makes the gather that builds an effective tensor read C sequential
    streams, which a CPU's caches serve much faster than a random permutation of the same size (how much:
    docs/benchmarks.md).

    >>> index, sizes = layout_index(4, (0.5, 0.5), seed=0, salt=1)
    >>> sorted(index.tolist()), sizes
    ([0, 1, 2, 3], [2, 2])
    """
    assignment = random_assignment(numel, proportions, seed, salt, device)
    _, index, sizes = partition_layout(assignment, len(proportions))
    return index, sizes


def feistel_factors(numel: int) -> tuple[int, int] | None:
    """``(a, b)`` with ``a * b == numel`` and a the largest divisor <= sqrt(numel), when a >= 32."""
    for a in range(math.isqrt(numel), _MIN_FEISTEL_FACTOR - 1, -1):
        if numel % a == 0:
            return a, numel // a
    return None


def feistel_tables(a: int, b: int, seed: int, salt: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """The round functions of ``feistel_index``: tables of sizes b, a, b, a, ... with values mod a, b, a, ..."""
    stream = _stream(seed, salt)
    tables = []
    for h in range(_FEISTEL_HALF_ROUNDS):
        size, modulus = (b, a) if h % 2 == 0 else (a, b)
        hashes = hash32(_mix32(stream ^ ((h + 1) * _GOLDEN)), 0, size, device)
        tables.append(hashes.remainder_(modulus).to(torch.int32))
    return tables


def feistel_index(a: int, b: int, tables: Sequence[torch.Tensor]) -> torch.Tensor:
    """A pseudo-random permutation of ``range(a * b)`` (int32): entry ``i = l * b + r`` goes through
    alternating rounds ``l = (l + F[r]) % a`` and ``r = (r + G[l]) % b``; each round is invertible, so the
    result is a permutation for any a, b. Integer ops only: bit-identical on every device.

    >>> index = feistel_index(32, 40, feistel_tables(32, 40, seed=0, salt=1))
    >>> torch.equal(index.sort().values, torch.arange(32 * 40, dtype=torch.int32))
    True
    """
    device = tables[0].device
    dtype = torch.int32 if a * b < 2**31 else torch.int64
    rows = torch.arange(a, dtype=dtype, device=device)
    cols = torch.arange(b, dtype=dtype, device=device)
    left = (rows[:, None] + tables[0].to(dtype)[None, :]).remainder_(a)  # round 1: r is still the column
    right = cols.expand(a, b)
    for h, table in enumerate(tables[1:], start=1):
        if h % 2:
            right = table.index_select(0, left.reshape(-1)).view(a, b).to(dtype).add_(right).remainder_(b)
        else:
            left = table.index_select(0, right.reshape(-1)).view(a, b).to(dtype).add_(left).remainder_(a)
    return left.mul_(b).add_(right).view(-1)


def _normal_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Knots of a piecewise-linear inverse normal CDF, rescaled to mean 0 and variance 1 exactly, and their
    differences (float32, computed in Python floats so every device gets the same bits)."""
    n = _NORMAL_KNOTS
    knots = [NormalDist().inv_cdf(min(max(j / n, 0.5 / n), 1 - 0.5 / n)) for j in range(n + 1)]
    second_moment = math.fsum((x * x + x * y + y * y) / 3 for x, y in itertools.pairwise(knots)) / n
    table = torch.tensor(knots, dtype=torch.float64).div_(math.sqrt(second_moment)).float()
    return table[:-1].contiguous(), table.diff()


# Built at import, not lazily (it is cheap: docs/benchmarks.md): torch.compile cannot trace NormalDist and would
# break its graph.
_NORMAL_TABLE = _normal_table()


def default_stream(seed: int, salt: int) -> int:
    """The hash stream the regenerated (``"seed"``) defaults of a tensor with this seed and salt come from."""
    return _mix32(_stream(seed, salt) ^ _DEFAULTS_STREAM)


def _normal_from_hashes(hashes: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> standard-normal float32 values through the inverse-CDF table (in place on ``hashes``)."""
    knot = hashes.bitwise_right_shift(32 - _NORMAL_BITS)
    fraction = hashes.bitwise_and_((1 << (32 - _NORMAL_BITS)) - 1).float().mul_(2.0 ** (_NORMAL_BITS - 32))
    table, steps = (t.to(hashes.device) for t in _NORMAL_TABLE)
    return fraction.mul_(steps.index_select(0, knot)).add_(table.index_select(0, knot))


def normal_values(seed: int, salt: int, start: int, end: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard-normal float32 values for the counters ``start..end-1``: integer hashes mapped through a
    4096-knot inverse CDF (tails cut at 3.7 sigma; mean 0, variance 1), bit-identical on every device.

    >>> z = normal_values(seed=0, salt=1, start=0, end=100_000)
    >>> round(float(z.mean()), 2), round(float(z.std()), 2), torch.equal(z[10:20], normal_values(0, 1, 10, 20))
    (0.0, 1.0, True)
    """
    return _normal_from_hashes(hash32(default_stream(seed, salt), start, end, device))


def normal_segments(streams: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """Many ``normal_values`` ranges in one pass: segment i holds the values of counters ``starts[i] ..
    starts[i] + sizes[i] - 1`` in stream ``streams[i]`` (int64 tensors on one device; ``total`` = sum of
    ``sizes``). The same bits as one call per segment, in a constant number of operations.

    >>> streams = torch.tensor([default_stream(0, 1), default_stream(0, 2)])
    >>> z = normal_segments(streams, torch.tensor([5, 0]), torch.tensor([3, 2]), 5)
    >>> torch.equal(z, torch.cat([normal_values(0, 1, 5, 8), normal_values(0, 2, 0, 2)]))
    True
    """
    begins = torch.cumsum(sizes, 0) - sizes
    stream = torch.repeat_interleave(streams, sizes, output_size=total)
    counter = torch.arange(total, dtype=torch.int64, device=streams.device)
    counter.add_(torch.repeat_interleave(starts - begins, sizes, output_size=total))
    return _normal_from_hashes(_hashed_(counter, stream))


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
