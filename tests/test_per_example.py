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
from partition_fx.train_config import TrainConfig

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


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


def _trainer(fused: bool = False, every_partition: bool = False, scheme: str = "random", hyper_chunks: str = "one"):
    from functools import partial

    from partition_fx.training import PartitionedTrainer
    from partition_fx.transforms import InputMask

    torch.manual_seed(0)
    pmodel = partitionify(mlp([5, 16, 3]), 3, (0.5, 0.3, 0.2), scheme=scheme)
    perturb_partitions(pmodel)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(120, 5, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    sgd = partial(torch.optim.SGD, lr=1.0)  # new = old - grad: the update is the gradient
    return PartitionedTrainer(
        pmodel,
        (x, y),
        PAPER,
        hyper=InputMask(5),
        batch_size=16,
        optimizer=sgd,
        hyper_optimizer=sgd,
        fused=fused,
        every_partition=every_partition,
        hyper_chunks=hyper_chunks,
        seed=3,
    )


def _snapshot(trainer):
    return [p.detach().clone() for p in _parts(trainer.pmodel)] + [trainer.hyper.logits.detach().clone()]


@pytest.mark.parametrize(
    ("scheme", "every_partition", "hyper_chunks"),
    [
        ("random", False, "one"),
        ("random", True, "one"),
        ("node", False, "one"),  # node: the fused forward runs in one pass
        ("node", True, "one"),
        ("random", True, "all"),
        ("node", False, "all"),
    ],
)
def test_fused_iteration_gives_the_gradients_of_the_two_separate_steps(every_partition, scheme, hyper_chunks):
    """Definition: the parameter loss's gradient w.r.t. the drawn partition(s) and the hyper loss's gradient
    w.r.t. psi, both at the same weights (one routed example at a time for every_partition); with
    hyper_chunks="all", the hyper loss is every chunk's, weighted by its probability of being drawn."""
    fused = _trainer(fused=True, every_partition=every_partition, scheme=scheme, hyper_chunks=hyper_chunks)
    reference = _trainer(scheme=scheme)
    before = _snapshot(fused)
    fused.iteration()
    got = [b - a for a, b in zip(_snapshot(fused), before)]  # SGD with lr 1: the applied gradients

    sampler, pmodel, mask = reference.sampler, reference.pmodel, reference.hyper
    x, y = reference.examples.tensors
    if every_partition:
        ks, idx = sampler.parameter_examples()
    else:
        k, idx = sampler.parameter_batch()
        ks = torch.full((16,), k)
    hyper_batches = sampler.hyper_batches() if hyper_chunks == "all" else [(1.0, *sampler.hyper_batch())]
    # The reference reads the sampler's draws, so check them against the definition here: without this, a
    # sampler giving partition k examples from D_1:k+1 passed every fused and every-partition test.
    chunks = reference.chunks
    assert all(bool(torch.isin(idx[i], chunks.prefix(int(ks[i])))) for i in range(16)), "example outside D_1:k"
    assert all(bool(torch.isin(hidx, chunks.chunk(kh)).all()) for _, kh, hidx in hyper_batches), "outside D_k"
    params = _parts(pmodel)
    want = [torch.zeros_like(p) for p in params] + [torch.zeros_like(mask.logits)]
    for i in range(16):  # the parameter loss: mean over examples, each through its own subnetwork
        k = int(ks[i])
        with torch.no_grad():
            xi = mask(x[idx[i : i + 1]])
        loss = nn.functional.cross_entropy(pmodel(xi, subnetwork=k), y[idx[i : i + 1]]) / 16
        own = pmodel.partition_parameters(k)
        for p, g in zip(own, torch.autograd.grad(loss, own)):
            want[next(j for j, q in enumerate(params) if q is p)] += g
    for weight, kh, hidx in hyper_batches:
        hyper_loss = weight * nn.functional.cross_entropy(pmodel(mask(x[hidx]), subnetwork=kh - 1), y[hidx])
        want[-1] += torch.autograd.grad(hyper_loss, mask.logits)[0]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert fused.step == 1


def test_fused_training_runs_and_refuses_in_model_hyperparameters():
    from partition_fx.training import fit
    from partition_fx.transforms import ConcreteDropout

    trainer = _trainer(fused=True, every_partition=True)
    result = trainer.run(6, eval_every=3, progress=False)
    assert result.steps == 6 and len(result.history) == 2 and result.history[-1]["hyper_loss"] is not None
    model = nn.Sequential(nn.Linear(5, 8), ConcreteDropout(), nn.Linear(8, 3))
    with pytest.raises(PartitionArgumentError, match="fused=True does not support hyperparameter modules inside"):
        fit(partitionify(model, 2), (torch.randn(20, 5), torch.zeros(20, dtype=torch.long)), PAPER, steps=1, fused=True)


def test_fused_iteration_keeps_the_parameter_loss_away_from_the_noise_scale():
    """With a Gaussian likelihood the noise scale is a hyperparameter: in a fused iteration only the
    hyperparameter examples may move it (the parameter examples' loss uses it detached)."""
    from functools import partial

    from partition_fx.training import Gaussian, PartitionedTrainer

    def trainer(fused: bool) -> PartitionedTrainer:
        torch.manual_seed(0)
        pmodel = partitionify(mlp([5, 16, 1]), 3, (0.5, 0.3, 0.2))
        perturb_partitions(pmodel)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(120, 5, generator=g)
        y = x[:, :1] * 2 + 0.1 * torch.randn(120, 1, generator=g)
        sgd = partial(torch.optim.SGD, lr=0.01)  # small: Gaussian.constrain_ clamps log_scale to [-9.2, 9.2]
        return PartitionedTrainer(
            pmodel, (x, y), PAPER, likelihood=Gaussian(0.5), batch_size=16, optimizer=sgd, hyper_optimizer=sgd,
            fused=fused, seed=3,
        )  # fmt: skip

    fused = trainer(True)
    before = fused.likelihood.log_scale.item()
    fused.iteration()
    applied = (before - fused.likelihood.log_scale.item()) / 0.01
    reference = trainer(False)
    reference.sampler.parameter_batch()  # the fused iteration draws the parameter batch first
    kh, hidx = reference.sampler.hyper_batch()
    x, y = reference.examples.tensors
    out = reference.pmodel(x[hidx], subnetwork=kh - 1)
    hyper_loss = -reference.likelihood(out, y[hidx]).mean()
    (want,) = torch.autograd.grad(hyper_loss, reference.likelihood.log_scale)
    assert applied == pytest.approx(want.item(), rel=1e-4)
