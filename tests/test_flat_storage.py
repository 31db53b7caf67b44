"""Flat storage (``partition_fx.fx.flat``) against its definition: every member's own per-tensor ``value(k)``.

A group computes all its members' effective tensors at once from flat parameters; each member still
computes its own the per-tensor way from views of them. Both must agree bit for bit for every subnetwork,
and route gradients to the same partitions with the same values, under every ``gradient_only_to``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from partition_fx import partitionify
from partition_fx.fx.flat import FlatGroup, flat_groups
from partition_fx.fx.params import RandomPartitionedTensor, ScalePartitionedTensor, gradient_only_to
from partition_fx.job.train_config import TrainConfig
from partition_fx.testing import assert_subnetworks_match_exports, perturb_partitions
from tests.test_random_architectures import Case, build, cases

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _grads(values: list[torch.Tensor], weights: list[torch.Tensor], storage: list[torch.Tensor]) -> list:
    loss = sum((v * w).sum() for v, w in zip(values, weights) if v.requires_grad)
    if not isinstance(loss, torch.Tensor):
        return [None] * len(storage)
    return list(torch.autograd.grad(loss, storage, allow_unused=True))


@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_a_group_computes_what_its_members_define_values_and_gradients(case: Case) -> None:
    pmodel = case.convert(build(case.spec, case.init_seed))
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    _assert_groups_match_members(pmodel, case.num_partitions, case.init_seed % 1000)


@pytest.mark.parametrize("default", ["init", "zero", "seed"])
def test_a_regenerated_group_computes_what_its_members_define(default: str) -> None:
    """Random architectures rarely draw tensors with a Feistel pair; these weights are four shapes of them
    (48x48, 80x128, 40x40, 32x35 entries); their biases are too small and store their layouts."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(16, 16, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 40),
        torch.nn.Linear(40, 40),
        torch.nn.Linear(40, 28),
    )
    pmodel = partitionify(model, 3, (0.6, 0.3, 0.1), default=default, assignments="regenerated")
    [group] = [g for _, g in pmodel.flat_groups() if g.regenerated]
    assert len(group.members) == 4 and len({m.shape for m in group.members}) == 4
    perturb_partitions(pmodel, seed=3)
    _assert_groups_match_members(pmodel, 3, seed=3)
    assert_subnetworks_match_exports(pmodel, (torch.randn(2, 16, 6, 6),))


def _assert_groups_match_members(pmodel, c: int, seed: int) -> None:
    for _, group in pmodel.flat_groups():
        storage = [group.storage(k) for k in range(1, c + 1)]
        generator = torch.Generator().manual_seed(seed)
        for k in range(c + 1):
            for only in (None, *range(k + 1)):
                with gradient_only_to(only):
                    grouped = list(group(k))
                    defined = [member.value(k) for member in group.members]
                for member, a, b in zip(group.members, grouped, defined):
                    assert a.shape == b.shape and a.dtype == b.dtype, (k, member)
                    assert torch.equal(a, b), (k, only, member)
                    assert a.requires_grad == b.requires_grad, (k, only, member)
                weights = [torch.randn(v.shape, generator=generator, dtype=v.dtype) for v in grouped]
                for a, b in zip(_grads(grouped, weights, storage), _grads(defined, weights, storage)):
                    assert (a is None) == (b is None), (k, only)
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_groups_follow_kind_default_dtype_and_trainability() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8).double(), torch.nn.Linear(8, 2)
    )
    model[3].weight.requires_grad_(False)
    from partition_fx.fx.config import PartitionConfig

    config = PartitionConfig().set_name("3.weight", partition=True)
    pmodel = partitionify(model, 3, config=config)
    kinds = sorted((g.kind, str(g.part1.dtype), g.part1.requires_grad, len(g.members)) for _, g in pmodel.flat_groups())
    assert kinds == [
        ("product", "torch.float32", True, 1),
        ("random", "torch.float32", False, 1),  # 3.weight: frozen, partitioned on request
        ("random", "torch.float32", True, 3),  # 0.weight, 0.bias, 3.bias
        ("random", "torch.float64", True, 2),
        ("sum", "torch.float32", True, 1),
    ]
    tensors = dict(pmodel.partitioned_tensors())
    assert all(pt.is_flat for pt in tensors.values())
    assert tensors["0.bias"].storage(2) is tensors["3.bias"].storage(2)
    assert not any(isinstance(m, FlatGroup) for m in tensors["0.weight"].modules())


def test_groups_split_by_layout_and_row_length() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.BatchNorm1d(40), torch.nn.Linear(40, 40))
    pmodel = partitionify(model, 2, scheme="node")
    node = dict(pmodel.partitioned_tensors())
    assert all(pt.is_flat for pt in node.values())
    assert node["0.weight"].storage(1) is node["2.weight"].storage(1)  # node: grouped by row length
    assert node["0.weight"].storage(1) is not node["0.bias"].storage(1)
    assert sorted(g.row for _, g in pmodel.flat_groups() if g.kind == "node") == [1, 40]
    seeded = partitionify(model, 2, scheme="node", default="seed")  # stored layouts, regenerated defaults
    seed_node = dict(seeded.partitioned_tensors())
    assert seed_node["0.weight"].storage(1) is seed_node["2.weight"].storage(1)
    assert all(g.default is None and g.seeded for _, g in seeded.flat_groups() if g.kind == "node")  # never stored
    regenerated = partitionify(model, 2, default="seed", assignments="regenerated")
    seed = dict(regenerated.partitioned_tensors())
    # 40x40 weights have a Feistel pair (regenerated, grouped together); biases of 40 do not (stored layouts)
    assert seed["0.weight"].regenerated and seed["0.weight"].storage(1) is seed["2.weight"].storage(1)
    assert not seed["0.bias"].regenerated and seed["0.bias"].storage(1) is not seed["0.weight"].storage(1)
    [group] = [g for _, g in regenerated.flat_groups() if g.regenerated]
    assert group.index is None and group.default is None and "index" not in dict(group.named_buffers())
    assert isinstance(seed["0.weight"], RandomPartitionedTensor) and isinstance(seed["1.bias"], ScalePartitionedTensor)


def test_flat_groups_skips_tensors_already_grouped() -> None:
    scales = [ScalePartitionedTensor(torch.ones(2), 2, kind="sum", default="init") for _ in range(2)]
    assert len(flat_groups(scales)) == 1 and flat_groups(scales) == []


def _mlp(layers: int, width: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    body = [
        m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Tanh())
    ]
    return torch.nn.Sequential(torch.nn.Linear(16, width), *body, torch.nn.Linear(width, 3))


def _step_operators(layers: int, **convert: str) -> tuple[int, int]:
    """Aten operators of one plain Adam step and one partitioned parameter step (subnetwork 3)."""
    from functools import partial

    from benchmarks.step_time import count_operators
    from partition_fx import export_subnetwork
    from partition_fx.training import PartitionedTrainer

    pmodel = partitionify(_mlp(layers, width=32), 3, **convert)  # 32x32 weights: regenerable (a Feistel pair)
    if convert.get("assignments") == "regenerated":
        assert sum(getattr(pt, "regenerated", False) for _, pt in pmodel.partitioned_tensors()) == layers
    x, y = torch.randn(32, 16), torch.randint(0, 3, (32,))
    trainer = PartitionedTrainer(pmodel, (x, y), PAPER, batch_size=8, optimizer=partial(torch.optim.Adam, lr=1e-3))
    plain = export_subnetwork(pmodel)
    optimizer = torch.optim.Adam(plain.parameters(), lr=1e-3)

    def plain_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(plain(x[:8]), y[:8]).backward()
        optimizer.step()

    batch = torch.arange(8)
    partitioned = count_operators(lambda: trainer.parameter_step(3, batch))
    return sum(count_operators(plain_step).values()), sum(partitioned.values())


@pytest.mark.parametrize(
    "convert",
    [{}, {"scheme": "node", "default": "seed"}, {"default": "seed", "assignments": "regenerated"}],
    ids=["random-init", "node-seed", "regenerated-seed"],
)
def test_operators_per_step_do_not_grow_with_the_number_of_grouped_tensors(convert: dict) -> None:
    """Counted, not timed (deterministic): going from 2 to 8 hidden layers (24 more tensors, all grouped),
    the partitioned step's operators beyond the plain step's do not grow; per tensor it paid ~16 before
    (stored layouts) and ~80 (regenerated: a Feistel permutation per tensor in forward and backward)."""
    plain_2, partitioned_2 = _step_operators(2, **convert)
    plain_8, partitioned_8 = _step_operators(8, **convert)
    assert partitioned_8 - plain_8 <= partitioned_2 - plain_2


def test_a_kind_is_split_into_groups_of_bounded_size(monkeypatch) -> None:
    """Groups close at GROUP_ENTRIES (cache-friendly gathers on CPU); the subnetworks do not change."""
    import partition_fx.fx.flat as flat
    from partition_fx.testing import assert_subnetworks_match_exports

    model = _mlp(4)
    whole = partitionify(model, 3)
    monkeypatch.setattr(flat, "GROUP_ENTRIES", 100)
    split = partitionify(model, 3)
    count = lambda pm: sum(g.kind == "random" for _, g in pm.flat_groups())  # noqa: E731
    assert count(whole) == 1 and count(split) > 2
    assert all(sum(m.part(1).numel() for m in g.members) <= 100 or len(g.members) == 1 for _, g in split.flat_groups())
    perturb_partitions(split)
    assert_subnetworks_match_exports(split, (torch.randn(5, 16),))
