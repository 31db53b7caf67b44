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


def test_each_example_trains_only_its_partition_in_one_backward():
    """One forward/backward with per-example (subnetwork, grad_partition) gives every partition the gradient
    of the definition: partition j gets d/dw_j of the loss of the examples assigned to it, through their
    subnetwork, and nothing from the others."""
    torch.manual_seed(0)
    pmodel = partitionify(mlp([5, 16, 3]), 3, (0.5, 0.3, 0.2))
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
