"""Node partitioning (appendix C, figure 4b): output units of conv/linear layers, whole rows."""

from __future__ import annotations

import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_for_tests import ConvBN, mlp
from torch import nn

from partition_fx import export_onnx, export_subnetwork, partitionify
from partition_fx.fx.assign import node_assignment, partition_sizes
from partition_fx.fx.params import RandomPartitionedTensor
from partition_fx.testing import assert_subnetworks_match_exports, perturb_partitions


@st.composite
def proportions(draw, max_partitions: int = 5) -> tuple[float, ...]:
    weights = draw(st.lists(st.integers(0, 20), min_size=1, max_size=max_partitions).filter(lambda w: sum(w) > 0))
    return tuple(w / sum(weights) for w in weights)


@settings(max_examples=60, deadline=None)
@given(
    units=st.integers(1, 40),
    rest=st.lists(st.integers(1, 4), max_size=3),
    props=proportions(),
    seed=st.integers(0, 2**31),
)
def test_node_assignment_gives_whole_rows_in_exact_proportions(units, rest, props, seed):
    shape = (units, *rest)
    assignment = node_assignment(shape, props, seed=seed, salt=3).view(units, -1)
    assert torch.equal(assignment, assignment[:, :1].expand_as(assignment))  # a unit's row is one partition
    counts = torch.bincount(assignment[:, 0].long(), minlength=len(props)).tolist()
    assert counts == partition_sizes(units, props)
    assert torch.equal(assignment, node_assignment(shape, props, seed=seed, salt=3).view(units, -1))


def test_weight_rows_and_bias_entries_of_a_layer_share_their_partition():
    pmodel = partitionify(
        nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Conv1d(1, 6, 3)), 3, (0.5, 0.3, 0.2), scheme="node"
    )
    tensors = dict(pmodel.partitioned_tensors())
    for layer in ("0", "2"):
        weight, bias = tensors[f"{layer}.weight"], tensors[f"{layer}.bias"]
        assert isinstance(weight, RandomPartitionedTensor) and weight.kind == "node"
        rows = weight.assignment().flatten(1)
        assert torch.equal(rows[:, 0], bias.assignment())
        assert torch.equal(rows, rows[:, :1].expand_as(rows))
    assert "node" in pmodel.describe() and "output units of Linear" in pmodel.describe()


def test_node_scheme_leaves_other_tensors_to_their_own_schemes():
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.ConvTranspose1d(4, 2, 3))
    pmodel = partitionify(model, 2, scheme="node")
    kinds = {name: t.kind for name, t in pmodel.partitioned_tensors()}
    assert kinds == {
        "0.weight": "random",  # an embedding's rows are inputs, not output units
        "1.weight": "product",
        "1.bias": "sum",
        "2.weight": "random",  # transposed conv: dim 0 is the input channel
        "2.bias": "random",
    }


@pytest.mark.parametrize(
    ("make", "input_shape"),
    [
        (lambda: mlp([6, 16, 8, 3]), (6,)),
        (lambda: ConvBN(), (3, 8, 8)),
        (lambda: timm.create_model("resnet10t", num_classes=10), (3, 32, 32)),
        (lambda: timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8), (3, 32, 32)),
    ],
    ids=["mlp", "conv-bn", "resnet10t", "vit_tiny"],
)
@pytest.mark.parametrize("default", ["init", "zero"])
def test_node_subnetworks_equal_their_exports(make, input_shape, default):
    torch.manual_seed(0)
    model = make().eval()
    pmodel = partitionify(model, 3, (0.6, 0.25, 0.15), scheme="node", default=default).eval()
    x = torch.randn(3, *input_shape)
    if default == "init":  # every subnetwork is the original right after conversion
        with torch.no_grad():
            for k in range(4):
                torch.testing.assert_close(pmodel(x, subnetwork=k), model(x), rtol=0, atol=0)
    perturb_partitions(pmodel)
    assert max(assert_subnetworks_match_exports(pmodel, (x,)).values()) <= 1e-5
    exported = export_subnetwork(pmodel, 2)
    assert type(exported) is type(model) and exported.state_dict().keys() == model.state_dict().keys()


def test_node_partitioned_model_exports_to_onnx(tmp_path):
    torch.manual_seed(0)
    pmodel = partitionify(timm.create_model("resnet10t", num_classes=10), 3, scheme="node").eval()
    perturb_partitions(pmodel)
    assert export_onnx(pmodel, tmp_path / "node.onnx", (torch.randn(2, 3, 32, 32),), subnetwork=2).is_file()
