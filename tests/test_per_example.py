"""Many subnetworks in one batch (``subnetwork=ks``) and per-example gradient routing, checked against
running each example through its own subnetwork (DESIGN.md invariant 4)."""

from __future__ import annotations

import pytest
import timm
import torch
from models_for_tests import ConvBN, mlp
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError, PartitionTypeError
from partition_fx.testing import perturb_partitions


def _parts(pmodel) -> list[nn.Parameter]:
    return [p for k in range(1, pmodel.num_partitions + 1) for p in pmodel.partition_parameters(k)]


@pytest.mark.parametrize("scheme", ["random", "node"])
@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: mlp([5, 16, 3]), (5,)),
        (lambda: ConvBN(), (3, 6, 6)),
        (lambda: timm.create_model("resnet10t"), (3, 32, 32)),
    ],
    ids=["mlp", "conv-bn", "resnet10t"],
)
def test_per_example_subnetworks_equal_one_at_a_time(make, shape, scheme):
    torch.manual_seed(0)
    pmodel = partitionify(make(), 3, (0.5, 0.3, 0.2), scheme=scheme).eval()
    perturb_partitions(pmodel)
    x = torch.randn(7, *shape)
    ks = torch.tensor([3, 0, 1, 3, 2, 1, 0])
    with torch.no_grad():
        together = pmodel(x, subnetwork=ks)
        for i in range(7):
            torch.testing.assert_close(together[i : i + 1], pmodel(x[i : i + 1], subnetwork=int(ks[i])))


@pytest.mark.parametrize("scheme", ["random", "node"])  # grouped / one pass
def test_each_example_trains_only_its_partition_in_one_backward(scheme):
    """One forward/backward with per-example (subnetwork, grad_partition) gives every partition the gradient
    of the definition: partition j gets d/dw_j of the loss of the examples assigned to it, through their
    subnetwork, and nothing from the others."""
    torch.manual_seed(0)
    pmodel = partitionify(mlp([5, 16, 3]), 3, (0.5, 0.3, 0.2), scheme=scheme)
    assert pmodel.supports_one_pass() == (scheme == "node")
    perturb_partitions(pmodel)
    x, y = torch.randn(9, 5), torch.randint(0, 3, (9,))
    ks = torch.tensor([1, 2, 3, 3, 1, 2, 2, 1, 3])
    gs = torch.tensor([1, 2, 3, 0, 1, 0, 2, 1, 3])  # 0: the example is scored but trains nothing
    loss = nn.functional.cross_entropy(pmodel(x, subnetwork=ks, grad_partition=gs), y, reduction="sum")
    loss.backward()
    fused = {id(p): p.grad.clone() if p.grad is not None else None for p in _parts(pmodel)}
    pmodel.zero_grad(set_to_none=True)
    for j in (1, 2, 3):
        params = pmodel.partition_parameters(j)
        rows = (gs == j).nonzero().flatten()
        reference = nn.functional.cross_entropy(pmodel(x[rows], subnetwork=j), y[rows], reduction="sum")
        grads = torch.autograd.grad(reference, params)
        for p, g in zip(params, grads):
            torch.testing.assert_close(fused[id(p)], g)


def test_grad_partition_zero_lets_gradients_reach_only_the_inputs():
    pmodel = partitionify(mlp([4, 8, 2]), 2)
    x = torch.randn(3, 4, requires_grad=True)
    pmodel(x, subnetwork=torch.tensor([1, 2, 0]), grad_partition=0).sum().backward()
    assert x.grad is not None and all(p.grad is None for p in _parts(pmodel))


def test_per_example_arguments_are_checked():
    pmodel = partitionify(mlp([4, 8, 2]), 2)
    x = torch.randn(3, 4)
    with pytest.raises(PartitionArgumentError, match=r"must have shape \(3,\)"):
        pmodel(x, subnetwork=torch.tensor([1, 2]))
    with pytest.raises(PartitionArgumentError, match=r"values must be in 0\.\.2"):
        pmodel(x, subnetwork=torch.tensor([1, 2, 3]))
    with pytest.raises(PartitionTypeError, match="integer tensor"):
        pmodel(x, subnetwork=torch.tensor([1.0, 2.0, 0.0]))
    with pytest.raises(PartitionArgumentError, match="example 0 would train partition 2 through subnetwork 1"):
        pmodel(x, subnetwork=torch.tensor([1, 2, 2]), grad_partition=torch.tensor([2, 2, 0]))


class LayerNormNet(nn.Module):
    """Conv, GroupNorm, LayerNorm and Linear with and without bias: no batch statistics, exact in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 12, 3, padding=1, bias=False)
        self.gn = nn.GroupNorm(3, 12)
        self.fc1 = nn.Linear(12, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.gn(self.conv(x))).mean((2, 3))
        return self.fc2(torch.relu(self.ln(self.fc1(h))))


def _grouped_convs() -> nn.Module:
    """A grouped and a depthwise conv: a unit's inputs depend on its index (found by the random-architecture
    tests: the default output was computed on a subset of rows, which shifted units between groups)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.BatchNorm2d(8),
        nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8), nn.Flatten(), nn.LazyLinear(3),
    )  # fmt: skip


@pytest.mark.parametrize("default", ["init", "zero", "seed"])
@pytest.mark.parametrize("model", ["conv-bn", "norms", "resnet10t", "grouped-convs"])
def test_one_pass_equals_grouped_in_outputs_and_gradients(model, default):
    """Node partitioning runs per-example subnetworks in one pass; the grouped forward is the reference."""
    torch.manual_seed(0)
    make, shape, train = {
        "conv-bn": (ConvBN, (3, 6, 6), False),
        "norms": (LayerNormNet, (3, 6, 6), True),
        "resnet10t": (lambda: timm.create_model("resnet10t", num_classes=5), (3, 32, 32), False),
        "grouped-convs": (_grouped_convs, (3, 6, 6), False),
    }[model]
    module = make()
    if model == "grouped-convs":
        module(torch.zeros(1, *shape))  # materialise the lazy head
    pmodel = partitionify(module, 3, (0.5, 0.3, 0.2), scheme="node", default=default).train(train)
    assert pmodel.supports_one_pass()
    perturb_partitions(pmodel)
    x = torch.randn(10, *shape, requires_grad=True)
    ks = torch.tensor([3, 0, 1, 3, 2, 1, 0, 2, 3, 1])
    gs = torch.tensor([3, 0, 1, 1, 2, 0, 0, 1, 2, 1])
    results = []
    for mode in ("grouped", "one_pass"):
        pmodel.per_example = mode
        pmodel.zero_grad(set_to_none=True)
        x.grad = None
        out = pmodel(x, subnetwork=ks, grad_partition=gs)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in _parts(pmodel)]
        results.append((out.detach(), x.grad.clone(), grads))
    (out_g, dx_g, grads_g), (out_o, dx_o, grads_o) = results
    torch.testing.assert_close(out_o, out_g)
    torch.testing.assert_close(dx_o, dx_g)
    for a, b in zip(grads_o, grads_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_one_pass_is_refused_where_it_does_not_apply():
    random = partitionify(ConvBN(), 3)
    fixup = partitionify(timm.create_model("fixup_resnet8"), 3, scheme="node")  # scalar biases: get_attr
    assert not random.supports_one_pass() and not fixup.supports_one_pass()
    fixup.per_example = "one_pass"
    with pytest.raises(PartitionArgumentError, match="per_example='one_pass' needs node partitioning"):
        fixup(torch.randn(2, 3, 32, 32), subnetwork=torch.tensor([1, 2]))
    fixup.per_example = "auto"  # falls back to grouping
    assert fixup(torch.randn(2, 3, 32, 32), subnetwork=torch.tensor([1, 2])).shape[0] == 2
