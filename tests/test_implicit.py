"""The hyper-gradient through training (``hyper_gradient="implicit"``, ``training.objective.implicit``) against its
definitions: the exact best-response derivative of a quadratic inner problem; autograd through one explicit SGD
step (K = 0); a finite difference of train-then-score on a tiny CNN; and the runs that take it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import Categorical, PartitionedBatchSampler, TrainingSteps, split_into_chunks
from partition_fx.training.objective.implicit import neumann_inverse, through_training
from partition_fx.training.objective.likelihoods import Gaussian
from partition_fx.transforms import AffineAugmentation
from partition_fx.transforms.base import HyperparameterModule


class Shift(HyperparameterModule):
    """x + psi * direction: a deterministic input transform with one hyperparameter, so that every loss below is
    a function of psi alone (no augmentation draws to hold in common)."""

    def __init__(self, features: int, psi: float) -> None:
        super().__init__()
        self.psi = nn.Parameter(torch.tensor(psi, dtype=torch.float64))
        self.register_buffer("direction", torch.linspace(-1.0, 1.0, features, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1, -1] + [1] * (x.dim() - 2)
        return x + self.psi * self.direction.view(shape)

    def hyperparameters(self) -> dict[str, float | list[float]]:
        return {"psi": float(self.psi)}


def _outer(pmodel, likelihood, shift, x, y) -> torch.Tensor:
    """The hyperparameter step's loss: chunk 2 through subnetwork 1."""
    return -likelihood(pmodel(shift(x), subnetwork=1), y).mean()


def _inner(pmodel, likelihood, shift, x, y) -> torch.Tensor:
    """Partition 1's training loss: D_1 through subnetwork 1."""
    return -likelihood(pmodel(shift(x), subnetwork=1), y).mean()


def _estimate(pmodel, likelihood, shift, outer, inner, terms, lr) -> tuple[float, float]:
    """(the direct part, the implicit part) of d outer / d psi."""
    loss = _outer(pmodel, likelihood, shift, *outer)
    extra = through_training(pmodel, likelihood, shift, loss, [(1, *inner)], terms=terms, lr=lr)
    (direct,) = torch.autograd.grad(loss, [shift.psi], retain_graph=True)
    (implicit,) = torch.autograd.grad(extra, [shift.psi])
    return float(direct), float(implicit)


def _newton(pmodel, likelihood, shift, inner) -> None:
    """Partition 1's weights moved to the minimum of its training loss (a quadratic: one Newton step is exact)."""
    (w,) = pmodel.partition_parameters(1)
    for _ in range(2):
        (g,) = torch.autograd.grad(_inner(pmodel, likelihood, shift, *inner), [w], create_graph=True)
        rows = [torch.autograd.grad(g.flatten()[i], [w], retain_graph=True)[0].flatten() for i in range(w.numel())]
        step = torch.linalg.solve(torch.stack(rows), g.detach().flatten())
        with torch.no_grad():
            w -= step.view_as(w)


def test_neumann_series_converges_to_the_inverse_hessian_product() -> None:
    torch.manual_seed(0)
    a = torch.randn(5, 5, dtype=torch.float64)
    h = a @ a.T / 5 + 0.5 * torch.eye(5, dtype=torch.float64)
    w = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(0.5 * w @ h @ w, [w], create_graph=True)
    v = torch.randn(5, dtype=torch.float64)
    lr = 1.0 / float(torch.linalg.eigvalsh(h).max())
    (series,) = neumann_inverse([g], [w], [v], 2000, lr)
    torch.testing.assert_close(lr * series, torch.linalg.solve(h, v))
    (one,) = neumann_inverse([g], [w], [v], 0, lr)  # K = 0: the vector itself
    torch.testing.assert_close(one, v)


def test_a_quadratic_inner_problem_gets_the_exact_best_response_derivative() -> None:
    """Linear model, Gaussian likelihood: partition 1's training loss is quadratic in its weights, its best response
    w*(psi) has a closed form (Newton), and d/dpsi outer(w*(psi), psi) is taken by a central difference of it. At
    w*(psi), the implicit gradient with a converged Neumann series is that derivative."""
    torch.manual_seed(0)
    pmodel = partitionify(nn.Linear(6, 1, bias=False), 2, (0.5, 0.5)).double()
    likelihood = Gaussian(scale=0.7, learn_scale=False).double()
    x = torch.randn(80, 6, dtype=torch.float64)
    y = x @ torch.linspace(0.5, -0.5, 6, dtype=torch.float64).view(6, 1) + 0.1 * torch.randn(80, 1, dtype=torch.float64)
    inner, outer = (x[:50], y[:50]), (x[50:], y[50:])

    def best_response_outer(psi: float) -> float:
        shift = Shift(6, psi)
        _newton(pmodel, likelihood, shift, inner)
        with torch.no_grad():
            return float(_outer(pmodel, likelihood, shift, *outer))

    h = 1e-5
    exact = (best_response_outer(0.3 + h) - best_response_outer(0.3 - h)) / (2 * h)
    shift = Shift(6, 0.3)
    _newton(pmodel, likelihood, shift, inner)
    direct, implicit = _estimate(pmodel, likelihood, shift, outer, inner, terms=3000, lr=0.2)
    assert abs(implicit) > 0.1 * abs(direct)  # the part through training matters here
    assert direct + implicit == pytest.approx(exact, rel=1e-6)
    # the paper's step (fixed weights) misses it
    assert direct != pytest.approx(exact, rel=0.05)


def _tiny_cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3)).double()


def _cnn_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(40, 2, 5, 5, generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 3, (40,), generator=generator)


def _unrolled(pmodel, likelihood, shift, outer, inner, steps: int, lr: float, held: bool = False) -> torch.Tensor:
    """outer(w_T(psi), psi), w_T: ``steps`` steps of SGD of step ``lr`` on partition 1's training loss, as a
    differentiable function of psi (torch.func.functional_call, the model's own weights untouched); ``held``:
    w_T held constant, so that the gradient is the direct part at w_T."""
    (w,) = pmodel.partition_parameters(1)
    name = next(n for n, p in pmodel.named_parameters() if p is w)
    current = w
    for _ in range(steps):
        out = torch.func.functional_call(pmodel, {name: current}, (shift(inner[0]),), {"subnetwork": 1})
        (g,) = torch.autograd.grad(-likelihood(out, inner[1]).mean(), [current], create_graph=True)
        current = current - lr * g
    current = current.detach() if held else current
    out = torch.func.functional_call(pmodel, {name: current}, (shift(outer[0]),), {"subnetwork": 1})
    return -likelihood(out, outer[1]).mean()


def test_k0_is_autograd_through_one_explicit_sgd_step() -> None:
    """With K = 0 the implicit part is -alpha v^T d2L/dw dpsi: what autograd through one SGD step of step alpha
    gives, up to v's change over that step, O(alpha^2) against the part's O(alpha)."""
    pmodel, likelihood = partitionify(_tiny_cnn(), 2, (0.5, 0.5)), Categorical()
    x, y = _cnn_data()
    inner, outer = (x[:24], y[:24]), (x[24:], y[24:])
    shift = Shift(2, 0.4)
    errors = []
    for lr in (1e-6, 1e-7):
        _, implicit = _estimate(pmodel, likelihood, shift, outer, inner, terms=0, lr=lr)
        (unrolled,) = torch.autograd.grad(_unrolled(pmodel, likelihood, shift, outer, inner, 1, lr), [shift.psi])
        held = _unrolled(pmodel, likelihood, shift, outer, inner, 1, lr, held=True)
        through = float(unrolled - torch.autograd.grad(held, [shift.psi])[0])  # what the step's dependence on psi adds
        assert through != 0
        errors.append(abs(implicit / through - 1))
    assert errors[0] < 1e-3
    assert errors[1] < 0.2 * errors[0]  # the difference is v's change over the step: first order in alpha


def test_on_a_tiny_cnn_sign_and_size_agree_with_a_finite_difference_of_train_then_score() -> None:
    """From weights trained at psi, T more steps of training at psi +- h then scoring chunk 2 (the same examples,
    no draws: common random numbers): the part of that finite difference the weights carry against the implicit
    part with K = T - 1 terms of the same step."""
    pmodel, likelihood = partitionify(_tiny_cnn(), 2, (0.5, 0.5)), Categorical()
    x, y = _cnn_data()
    inner, outer = (x[:24], y[:24]), (x[24:], y[24:])
    shift = Shift(2, 0.4)
    (w,) = pmodel.partition_parameters(1)
    for _ in range(200):  # near partition 1's minimum, where the implicit function theorem speaks
        (g,) = torch.autograd.grad(_inner(pmodel, likelihood, shift, *inner), [w])
        with torch.no_grad():
            w -= 0.5 * g
    steps, lr, h = 20, 0.5, 1e-4

    def train_then_score(psi: float) -> float:
        with torch.no_grad():
            shift.psi.fill_(psi)
        return float(_unrolled(pmodel, likelihood, shift, outer, inner, steps, lr).detach())

    total = (train_then_score(0.4 + h) - train_then_score(0.4 - h)) / (2 * h)
    with torch.no_grad():
        shift.psi.fill_(0.4)
    held = _unrolled(pmodel, likelihood, shift, outer, inner, steps, lr, held=True)
    through = total - float(torch.autograd.grad(held, [shift.psi])[0])
    direct, implicit = _estimate(pmodel, likelihood, shift, outer, inner, terms=steps - 1, lr=lr)
    assert abs(through) > 0.05 * abs(direct)
    assert implicit * through > 0
    assert 0.5 < implicit / through < 2.0


def test_the_implicit_gradient_moves_psi_its_own_way_and_leaves_no_running_statistics() -> None:
    """(fit and your own loop take the same steps with it: tests/test_own_loop.py)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 3))
    x, y = torch.randn(60, 1, 4, 4), torch.randint(0, 3, (60,))
    found = {}
    for gradient in ("fixed", "implicit"):
        torch.manual_seed(1)  # the augmentation's draws
        aug = AffineAugmentation(generators=["rotation"], init=0.5)
        pmodel = partitionify(model, 3)
        config = TrainConfig.recommended(steps=6, batch_size=8, hyper_every=1, hyper_gradient=gradient, seed=0,
                                         finetune_steps=0)  # fmt: skip
        chunks = split_into_chunks(len(x), pmodel.proportions, 0)
        steps = TrainingSteps.create(pmodel, chunks, hyper=aug, config=config)
        batches = PartitionedBatchSampler(chunks, config)
        draws, rows = list(batches.draws()), list(batches)
        assert all(draw.inner for draw in draws) == (gradient == "implicit")
        steps.take(draws[0], x[rows[0]], y[rows[0]])
        buffers = [b.clone() for b in pmodel.buffers()]
        for draw, taken in zip(draws[1:], rows[1:]):
            steps.take(draw, x[taken], y[taken])
        found[gradient] = (buffers, aug.ranges.detach().clone())
    # the inner forwards are differentiated, never stepped: the buffers after the first iteration are the fixed one's
    for a, b in zip(found["fixed"][0], found["implicit"][0], strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(found["fixed"][1], found["implicit"][1])


@pytest.mark.parametrize(("keywords", "match"), [
    ({"fused": True}, "hyper_gradient must be 'fixed' with fused=True"),
    ({"precision": "fp16"}, "hyper_gradient must be 'fixed' with precision='fp16'"),
])  # fmt: skip
def test_what_the_implicit_gradient_cannot_run_with_is_refused(keywords, match) -> None:
    with pytest.raises(PartitionArgumentError, match=match):
        TrainConfig.recommended(hyper_gradient="implicit", **keywords)
