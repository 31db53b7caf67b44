"""Seed-regenerated layout indices and defaults: the same values as stored ones, bit-identical on every
run and device, and none of their memory."""

from __future__ import annotations

import hashlib
import math

import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.fx.assign import (
    assignment_from_index,
    feistel_factors,
    feistel_index,
    feistel_tables,
    layout_index,
    normal_values,
    partition_sizes,
)
from partition_fx.fx.params import RandomPartitionedTensor
from partition_fx.fx.regenerated import FeistelSegments
from partition_fx.testing import assert_subnetworks_match_exports, max_relative_difference, perturb_partitions


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


@settings(max_examples=60, deadline=None)
@given(a=st.integers(32, 120), b=st.integers(32, 120), seed=st.integers(0, 2**40), salt=st.integers(0, 2**32 - 1))
def test_feistel_index_is_a_permutation_and_deterministic(a, b, seed, salt) -> None:
    index = feistel_index(a, b, feistel_tables(a, b, seed, salt))
    assert index.dtype == torch.int32 and index.shape == (a * b,)
    assert torch.equal(index.sort().values, torch.arange(a * b, dtype=torch.int32))
    assert torch.equal(index, feistel_index(a, b, feistel_tables(a, b, seed, salt)))


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(32, 90), st.integers(32, 90)), min_size=1, max_size=5),
    proportions=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    seed=st.integers(0, 2**40),
)
def test_feistel_segments_equal_one_permutation_per_tensor(shapes, proportions, seed) -> None:
    """The batched pass a flat group regenerates its layout with: the same bits as per tensor, any sizes."""
    factors = [(min(s), max(s)) for s in shapes]
    shares = [p / sum(proportions) for p in proportions]
    tables = [feistel_tables(a, b, seed, salt) for salt, (a, b) in enumerate(factors)]
    sizes = [partition_sizes(a * b, shares) for a, b in factors]
    segments = FeistelSegments(factors, tables, sizes)
    per_tensor = [feistel_index(a, b, t) for (a, b), t in zip(factors, tables)]
    assert torch.equal(segments.permutation(), torch.cat(per_tensor))
    membership = segments.membership()
    assert membership.dtype == torch.uint8
    assert torch.equal(membership, torch.cat([assignment_from_index(i, s) for i, s in zip(per_tensor, sizes)]))


@settings(max_examples=200, deadline=None)
@given(numel=st.integers(0, 20_000))
def test_feistel_factors_are_the_most_balanced_divisor_pair(numel) -> None:
    factors = feistel_factors(numel)
    divisors = [d for d in range(32, math.isqrt(numel) + 1) if numel % d == 0]
    if not divisors:
        assert factors is None
    else:
        assert factors == (divisors[-1], numel // divisors[-1])


def test_feistel_membership_looks_random() -> None:
    """A 10% partition of a 512x4608 tensor: row and column shares spread like random sampling, and
    neighbouring entries are uncorrelated."""
    a, b = 512, 4608
    member = (feistel_index(a, b, feistel_tables(a, b, seed=0, salt=1)) < a * b // 10).view(a, b).double()
    assert abs(float(member.mean(1).std()) - math.sqrt(0.09 / b)) < 0.15 * math.sqrt(0.09 / b)
    assert abs(float(member.mean(0).std()) - math.sqrt(0.09 / a)) < 0.15 * math.sqrt(0.09 / a)
    for x, y in ((member[:, :-1], member[:, 1:]), (member[:-1], member[1:])):
        assert abs(float(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1])) < 0.01


def test_regenerated_values_are_pinned() -> None:
    """Checkpoints regenerate from these: they must never change across versions."""
    assert _digest(feistel_index(40, 50, feistel_tables(40, 50, seed=0, salt=7))) == "b2d871b481e53e73"
    assert _digest(normal_values(seed=0, salt=7, start=0, end=1000)) == "3e6720c7ea2f66fa"


def test_normal_values_are_standard_normal_and_sliceable() -> None:
    z = normal_values(seed=3, salt=5, start=0, end=200_000).double()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float((z.abs() < 1).double().mean()) - 0.6827) < 0.005
    assert abs(float((z.abs() < 2).double().mean()) - 0.9545) < 0.003
    assert torch.equal(z[1234:5678].float(), normal_values(seed=3, salt=5, start=1234, end=5678))
    assert not torch.equal(z[:100].float(), normal_values(seed=4, salt=5, start=0, end=100))


@pytest.mark.parametrize("numel", [63, 1024, 40 * 50, 97 * 89])
def test_layout_index_gives_exact_sizes(numel) -> None:
    index, sizes = layout_index(numel, (0.7, 0.2, 0.1), seed=1, salt=2)
    assert sizes == partition_sizes(numel, (0.7, 0.2, 0.1))
    assert sorted(index.tolist()) == list(range(numel))


@pytest.mark.parametrize("default", ["init", "zero", "seed"])
def test_regenerated_index_equals_stored_index_in_values_and_gradients(default) -> None:
    value = torch.randn(48, 40, requires_grad=True)
    kwargs = dict(seed=5, salt=9, default=default)
    stored = RandomPartitionedTensor(value, (0.6, 0.3, 0.1), **kwargs)
    regenerated = RandomPartitionedTensor(value, (0.6, 0.3, 0.1), regenerate=True, **kwargs)
    assert regenerated.regenerated and not hasattr(regenerated, "index") and hasattr(stored, "index")
    weights = torch.randn(48, 40)
    for k in range(4):
        a, b = stored(k), regenerated(k)
        assert torch.equal(a, b), k
        if k:
            (a * weights).sum().backward()
            (b * weights).sum().backward()
            for p, q in zip(stored.parts(), regenerated.parts()):
                assert (p.grad is None) == (q.grad is None)
                if p.grad is not None:
                    assert torch.equal(p.grad, q.grad)
    assert torch.equal(stored.assignment(), regenerated.assignment())


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 40),
    )  # fmt: skip


@pytest.mark.parametrize("scheme", ["random", "node"])
@pytest.mark.parametrize("assignments", ["stored", "regenerated"])
def test_seed_defaults_reinitialise_with_the_same_moments_and_match_exports(scheme, assignments) -> None:
    model = _net().eval()
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), scheme=scheme, default="seed", assignments=assignments).eval()
    x = torch.randn(4, 3, 8, 8)
    reinitialised = export_subnetwork(pmodel).eval()
    with torch.no_grad():
        for k in range(4):  # every subnetwork is the re-initialised model at conversion
            assert max_relative_difference(pmodel(x, subnetwork=k), reinitialised(x)) <= 1e-6, k
    old_params = {name: p.detach() for name, p in model.named_parameters()}
    for name, new in reinitialised.named_parameters():
        new, old = new.detach(), old_params[name]
        if old.ndim == 1 and name.startswith("1."):
            assert torch.equal(new, old), name  # BatchNorm scales keep their values
            continue
        assert not torch.equal(new, old), name
        assert abs(float(new.mean() - old.mean())) < 0.25 * float(old.std()) + 1e-6, name
        assert abs(float(new.std()) / float(old.std()) - 1) < 0.25, name
    perturb_partitions(pmodel, seed=0)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=1e-5)


def test_zero_initialised_tensors_stay_zero_under_seed_defaults() -> None:
    model = nn.Linear(64, 32)
    nn.init.zeros_(model.weight)
    pmodel = partitionify(model, 3, default="seed")
    assert not export_subnetwork(pmodel, 0).weight.any()


@pytest.mark.parametrize("default", ["init", "seed"])
@pytest.mark.parametrize("assignments", ["stored", "regenerated"])
def test_state_dict_carries_the_seed(default, assignments) -> None:
    """A checkpoint loaded into a model converted with another seed regenerates the checkpoint's values."""
    pmodel = partitionify(_net(), 3, seed=0, default=default, assignments=assignments).eval()
    perturb_partitions(pmodel, seed=1)
    other = partitionify(_net(), 3, seed=123, default=default, assignments=assignments).eval()
    other.load_state_dict(pmodel.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for k in range(4):
            assert torch.equal(pmodel(x, subnetwork=k), other(x, subnetwork=k)), k


def test_seed_defaults_and_regenerated_assignments_cost_under_two_percent_of_parameter_memory() -> None:
    model = timm.create_model("resnet18", num_classes=10)
    original = sum(p.numel() * p.element_size() for p in model.parameters())
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), default="seed", assignments="regenerated")
    overhead = sum(t.numel() * t.element_size() for t in pmodel.parameters()) - original
    overhead += sum(b.numel() * b.element_size() for name, b in pmodel.named_buffers() if "running" not in name)
    overhead -= sum(b.numel() * b.element_size() for name, b in model.named_buffers() if "running" not in name)
    assert overhead <= 0.02 * original, overhead / original


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_regenerated_values_are_bit_identical_on_cuda() -> None:
    tables = feistel_tables(300, 700, seed=2, salt=3, device="cuda")
    assert torch.equal(feistel_index(300, 700, tables).cpu(), feistel_index(300, 700, feistel_tables(300, 700, 2, 3)))
    assert torch.equal(normal_values(2, 3, 0, 300_000, "cuda").cpu(), normal_values(2, 3, 0, 300_000))
    value = torch.randn(256, 288)
    cpu = RandomPartitionedTensor(value, (0.8, 0.1, 0.1), seed=1, salt=2, default="seed", regenerate=True)
    gpu = RandomPartitionedTensor(value.cuda(), (0.8, 0.1, 0.1), seed=1, salt=2, default="seed", regenerate=True)
    for k in range(4):
        assert torch.equal(cpu(k), gpu(k).cpu()), k
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64))
    cpu_model = partitionify(model, 3, default="seed", assignments="regenerated")
    gpu_model = partitionify(model, 3, default="seed", assignments="regenerated").cuda()
    [(_, cpu_group)], [(_, gpu_group)] = (
        [g for g in m.flat_groups() if g[1].regenerated] for m in (cpu_model, gpu_model)
    )
    for k in range(4):
        for a, b in zip(cpu_group(k), gpu_group(k)):
            assert torch.equal(a, b.cpu()), k
