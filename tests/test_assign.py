"""Property tests of partition assignment: exact proportions, a partition per entry, determinism."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx.fx.assign import hash_keys, name_salt, partition_layout, partition_sizes, random_assignment

shapes = st.lists(st.integers(1, 9), min_size=0, max_size=4)


@st.composite
def proportions(draw: st.DrawFn) -> tuple[float, ...]:
    c = draw(st.integers(1, 8))
    weights = draw(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=c, max_size=c))
    total = sum(weights)
    if total == 0:
        return tuple(1.0 / c for _ in range(c))
    return tuple(w / total for w in weights)


def largest_remainder(numel: int, props: tuple[float, ...]) -> list[int]:
    """Independent definition: floor of each quota, the rest to the largest fractional parts."""
    quotas = [p * numel for p in props]
    sizes = [math.floor(q) for q in quotas]
    order = sorted(range(len(props)), key=lambda i: (sizes[i] - quotas[i], i))
    for i in order[: numel - sum(sizes)]:
        sizes[i] += 1
    return sizes


@settings(max_examples=200, deadline=None)
@given(shape=shapes, props=proportions(), seed=st.integers(0, 2**40), salt=st.integers(0, 2**32 - 1))
def test_assignment_has_exact_sizes_and_is_deterministic(shape, props, seed, salt) -> None:
    numel = math.prod(shape)
    a = random_assignment(numel, props, seed, salt)
    assert a.shape == (numel,) and a.dtype == torch.uint8
    assert numel == 0 or int(a.max()) < len(props)  # every entry in exactly one partition 0..C-1
    counts = torch.bincount(a.long(), minlength=len(props)).tolist()
    assert counts == largest_remainder(numel, props) == partition_sizes(numel, props)
    assert sum(counts) == numel
    assert torch.equal(a, random_assignment(numel, props, seed, salt))


@settings(max_examples=100, deadline=None)
@given(numel=st.integers(0, 3000), props=proportions(), seed=st.integers(0, 1000))
def test_partition_layout_rebuilds_the_tensor(numel, props, seed) -> None:
    a = random_assignment(numel, props, seed, salt=7)
    order, index, sizes = partition_layout(a, len(props))
    assert sorted(index.tolist()) == list(range(numel))  # a permutation
    assert torch.equal(order[index], torch.arange(numel))
    values = torch.arange(numel, dtype=torch.float64)
    parts = [values[a == k] for k in range(len(props))]  # each partition in flat order
    assert [p.numel() for p in parts] == sizes
    assert torch.equal(torch.cat(parts)[index], values)


def test_different_seeds_and_names_give_different_assignments() -> None:
    props = (0.5, 0.5)
    base = random_assignment(1000, props, seed=0, salt=name_salt("a.weight"))
    assert not torch.equal(base, random_assignment(1000, props, seed=1, salt=name_salt("a.weight")))
    assert not torch.equal(base, random_assignment(1000, props, seed=0, salt=name_salt("b.weight")))


def test_hash_keys_are_distinct_and_roughly_uniform() -> None:
    keys = hash_keys(seed=3, salt=5, numel=100_000)
    assert keys.unique().numel() == keys.numel()
    hashed = (keys >> 32).double() / 2**31
    assert abs(float(hashed.mean()) - 0.5) < 0.01
    first_half = (random_assignment(100_000, (0.5, 0.5), 3, 5)[:50_000] == 0).double().mean()
    assert abs(float(first_half) - 0.5) < 0.01  # no positional bias


def test_assignment_is_pinned() -> None:
    """Regenerated assignments must never change across versions: checkpoints rely on them."""
    a = random_assignment(16, (0.5, 0.25, 0.25), seed=0, salt=name_salt("fc.weight"))
    assert a.tolist() == [0, 0, 2, 0, 0, 1, 0, 2, 1, 2, 0, 1, 1, 0, 0, 2]
