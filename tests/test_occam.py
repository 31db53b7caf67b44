"""The Occam term of the hyperparameter step (``training.objective.occam``) against its definitions: a linear model's
exact Laplace log-determinant and its derivative in a range, a small network's dense generalised Gauss-Newton blocks,
the fitted prior precision's optimum; and the term inside training: the refreshes the schedule draws, your own
loop equal to ``fit``, a resumed run equal to the uninterrupted one, the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, jacrev

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import Gaussian, fit, split_into_chunks
from partition_fx.training.objective.occam import (
    KroneckerFactors,
    OccamTerm,
    fitted_precision,
    input_moment,
    kronecker_factors,
    laplace_occam,
)
from partition_fx.training.sampling.schedule import PartitionedBatchSampler, Schedule
from partition_fx.transforms import AffineAugmentation


def _invariant_logits(model: nn.Module, params: dict[str, torch.Tensor], views: torch.Tensor, batch: int):
    return functional_call(model, params, (views,)).reshape(-1, batch, 3).mean(0)


def _dense_ggn(model: nn.Module, views: torch.Tensor, batch: int) -> tuple[torch.Tensor, list[str]]:
    """The invariant model's GGN, sum_n J_n^T (diag p_n - p_n p_n^T) J_n over every parameter, densely, with each
    layer's weight and bias as one [out, in (+1)] matrix, in the order of ``model``'s layers."""
    params = {name: p.detach().double() for name, p in model.named_parameters()}
    model = model.double()
    logits = _invariant_logits(model, params, views.double(), batch)
    jacobians = jacrev(lambda ps: _invariant_logits(model, ps, views.double(), batch))(params)
    blocks, names = [], []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            weight = jacobians[f"{name}.weight"].flatten(2)  # [batch, classes, out, in]
            weight = weight.reshape(batch, 3, module.weight.shape[0], -1)
            if module.bias is not None:
                weight = torch.cat([weight, jacobians[f"{name}.bias"][..., None]], -1)
            blocks.append(weight.flatten(2))
            names.append(name)
    jacobian = torch.cat(blocks, -1)  # [batch, classes, P]
    p = torch.softmax(logits, -1)
    hessian = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndq->pq", jacobian, hessian, jacobian), names


def _kron(layer: KroneckerFactors) -> torch.Tensor:
    (a,), (b,) = layer.a, layer.b
    return torch.kron(b, a)


@pytest.mark.parametrize("given", [0.0, 0.8])
def test_a_linear_model_s_term_and_its_derivative_in_a_range_are_the_exact_laplace_ones(given):
    """With zero weights every example's softmax Hessian is the same, so the Kronecker factors of a linear model
    over its views' mean are exact: the term equals log N(theta) - 1/2 log det(delta + GGN) computed densely (given
    a share f of the data: -1/2 log det(delta + GGN) + 1/2 log det(delta + f GGN)), and so does its derivative in
    the rotation range."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight.zero_()
    x, y = torch.rand(5, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1])
    delta = 0.7

    def exact(aug: AffineAugmentation) -> torch.Tensor:
        torch.manual_seed(1)
        views = aug(x, num_samples=3)
        mean = views.reshape(3, 5, -1).mean(0).double()  # the views' inputs
        phi = torch.cat([mean, torch.ones(5, 1, dtype=torch.float64)], 1)
        p = torch.softmax(model[1].bias.detach().double(), -1)
        hessian = torch.diag(p) - p[:, None] * p[None, :]
        ggn = torch.kron(hessian, phi.T @ phi)
        theta = torch.cat([model[1].weight, model[1].bias[:, None]], 1).detach().double()
        size = theta.numel()
        eye = torch.eye(size, dtype=torch.float64)
        if given:
            return -0.5 * torch.logdet(delta * eye + ggn) + 0.5 * torch.logdet(delta * eye + given * ggn)
        return 0.5 * size * math.log(delta) - 0.5 * delta * theta.pow(2).sum() - 0.5 * torch.logdet(delta * eye + ggn)

    def factored(aug: AffineAugmentation) -> torch.Tensor:
        torch.manual_seed(1)
        _, factors = kronecker_factors(model, x, y, hyper=aug, samples=3)
        return laplace_occam(factors, precision=delta, given=given)

    values = []
    for build in (exact, factored):
        aug = AffineAugmentation(generators=["rotation"], init=0.8)
        value = build(aug)
        (gradient,) = torch.autograd.grad(value, list(aug.parameters()))
        values.append((value, gradient))
    (exact_value, exact_gradient), (value, gradient) = values
    torch.testing.assert_close(value, exact_value)
    torch.testing.assert_close(gradient.double(), exact_gradient.double(), rtol=1e-4, atol=1e-6)
    assert exact_gradient.abs().max() > 1e-3  # the range moves the term: the comparison is not of zeros


def test_one_example_s_factors_are_the_dense_ggn_blocks_of_every_layer():
    """One example, one view, a convolution with one position: each layer's B (x) A is its diagonal block of the
    dense GGN exactly (KFAC's approximations are the dropped cross-layer blocks, and sums over examples,
    positions and views, none of which this has)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 5), nn.Tanh(), nn.Flatten(), nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    x, y = torch.rand(1, 1, 5, 5), torch.tensor([2])
    _, factors = kronecker_factors(model, x, y, full=True)
    ggn, names = _dense_ggn(model, x, 1)
    start = 0
    for name in names:
        block = _kron(factors[name])
        end = start + len(block)
        torch.testing.assert_close(block, ggn[start:end, start:end])
        start = end
    assert start == len(ggn)


def test_the_classifier_s_factors_are_exact_over_views():
    """The views share the classifier: its block of the invariant model's GGN is B (x) A exactly, whatever the
    number of views (the views' features averaged, their output gradients summed)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(8, 3))
    x, y = torch.rand(1, 1, 4, 4), torch.tensor([1])
    aug = AffineAugmentation(generators=["rotation"], init=1.0)
    torch.manual_seed(2)
    _, factors = kronecker_factors(model, x, y, hyper=aug, samples=4, full=True)
    torch.manual_seed(2)
    ggn, _ = _dense_ggn(model, aug(x, num_samples=4).detach(), 1)
    classifier = _kron(factors["3"])
    torch.testing.assert_close(classifier, ggn[-len(classifier) :, -len(classifier) :])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.0, 1e3), min_size=1, max_size=30).filter(lambda v: max(v) > 1e-3),
    st.floats(1e-3, 1e3),
)
def test_the_fitted_precision_is_the_term_s_maximum(eigenvalues, norm):
    """Its derivative in the precision vanishes there: the term is no larger a little above or below."""
    products = torch.tensor(eigenvalues, dtype=torch.float64)
    delta = fitted_precision(products, norm)

    def term(d: float) -> float:
        return 0.5 * len(products) * math.log(d) - 0.5 * d * norm - 0.5 * float(torch.log(d + products).sum())

    if 1e-7 < delta < 1e7:  # an interior optimum (at the bounds the term keeps rising past them)
        assert term(delta) >= max(term(delta * 1.001), term(delta / 1.001)) - 1e-9 * abs(term(delta))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(0, 7), st.integers(1, 4))
def test_the_term_is_refreshed_at_the_first_hyperparameter_step_and_every_nth_after(hyper_every, warmup, every):
    schedule = Schedule(60, eval_every=60, hyper_every=hyper_every, warmup_steps=warmup, occam_every=every)
    hyper_steps = [step for step in range(1, 61) if schedule.hyper_due(step)]
    refreshed = [step for step in range(1, 61) if schedule.occam_due(step)]
    assert refreshed == hyper_steps[::every]


def test_a_refresh_draws_its_examples_from_all_the_data_and_the_loader_reads_them():
    chunks = split_into_chunks(40, (0.5, 0.5), seed=0)
    config = TrainConfig.recommended(steps=8, batch_size=3, hyper_batch_size=2, hyper_every=2, occam_term="whole",
                                     occam_every=2, occam_examples=5, finetune_steps=0)  # fmt: skip
    batches = PartitionedBatchSampler(chunks, config)
    draws = list(batches.draws())
    assert [draw.occam is not None for draw in draws] == [False, True, False, False, False, True, False, False]
    assert [len(indices) for indices in batches] == [3, 10, 3, 5, 3, 10, 3, 5]
    assert len(set(draws[1].occam.tolist())) == 5


def _images(n: int = 48):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _pmodel():
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)]
    return partitionify(nn.Sequential(*layers), 2, seed=0)


OCCAM = dict(steps=12, batch_size=8, hyper_batch_size=4, hyper_samples=2, hyper_every=1, finetune_steps=2,
             occam_term="whole", occam_every=3, occam_examples=8, eval_every=4, seed=3)  # fmt: skip


def test_the_term_moves_the_ranges_and_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    config = TrainConfig.recommended(**OCCAM)
    plain = fit(_pmodel(), _images(), TrainConfig.recommended(**{**OCCAM, "occam_term": "none"}),
                hyper=AffineAugmentation(num_samples=2), progress=False, record_run=False)  # fmt: skip
    expected = fit(_pmodel(), _images(), config, hyper=AffineAugmentation(num_samples=2), progress=False,
                   record_run=False)  # fmt: skip
    assert expected.hyperparameters != plain.hyperparameters
    stop = lambda trainer, record: record["step"] == 4  # noqa: E731  (between two refreshes: steps 1, 4, 7, 10)
    fit(_pmodel(), _images(), config, hyper=AffineAugmentation(num_samples=2), progress=False, record_run=False,
        checkpoint_dir=tmp_path, callbacks=[stop])  # fmt: skip
    resumed = fit(_pmodel(), _images(), config, hyper=AffineAugmentation(num_samples=2), progress=False,
                  record_run=False, resume=tmp_path / "resume")  # fmt: skip
    assert resumed.hyperparameters == expected.hyperparameters


def test_the_conditional_term_divides_by_the_chunks_it_is_of():
    occam = OccamTerm(num_examples=50, given=40)
    aug = AffineAugmentation(generators=["rotation"], init=0.4)
    psi = list(aug.parameters())
    occam.gradient = [torch.full_like(p, 5.0) for p in psi]
    (gradient,) = torch.autograd.grad(occam.term(psi), psi)
    assert occam.scored == 10
    torch.testing.assert_close(gradient, torch.full_like(psi[0], -0.5))
    with pytest.raises(PartitionArgumentError, match=r"given examples must be in 0\.\.49"):
        OccamTerm(num_examples=50, given=50)


def test_the_term_is_zero_valued_with_minus_its_derivative_over_the_data():
    aug = AffineAugmentation(generators=["rotation", "scale"], init=0.4)
    occam = OccamTerm(num_examples=50)
    psi = list(aug.parameters())
    assert float(occam.term(psi)) == 0.0 and not occam.term(psi).requires_grad  # no refresh yet: nothing
    occam.gradient = [torch.full_like(p, 5.0) for p in psi]
    term = occam.term(psi)
    (gradient,) = torch.autograd.grad(term, psi)
    assert float(term.detach()) == 0.0
    torch.testing.assert_close(gradient, torch.full_like(psi[0], -0.1))


def test_what_the_term_cannot_factor_is_refused_naming_the_fix():
    x, y = torch.rand(8, 1, 8, 8), torch.randint(0, 3, (8,))
    with pytest.raises(PartitionArgumentError, match=r"likelihood is Gaussian.*occam_term='none'"):
        fit(_pmodel(), (x, y.float()), TrainConfig.recommended(**OCCAM), hyper=AffineAugmentation(),
            likelihood=Gaussian(), progress=False, record_run=False)  # fmt: skip
    circular = partitionify(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="circular"), nn.Flatten(),
                                          nn.Linear(128, 3)), 2)  # fmt: skip
    with pytest.raises(PartitionArgumentError, match=r"0 pads with 'circular'.*occam_term='none'"):
        fit(circular, (x, y), TrainConfig.recommended(**OCCAM), hyper=AffineAugmentation(), progress=False,
            record_run=False)  # fmt: skip


def test_a_factor_lapack_fails_on_is_decomposed_nudged(monkeypatch):
    """LAPACK can fail to converge on a degenerate factor (many equal eigenvalues) when the derivative needs its
    eigenvectors: the nudged decomposition gives the same eigenvalues and derivative."""
    from partition_fx.training.objective import occam

    matrix = torch.diag(torch.tensor([0.0, 0.0, 0.0, 2.0, 5.0], dtype=torch.float64)).requires_grad_()
    real = torch.linalg.eigvalsh
    calls = []

    def failing_once(m):
        calls.append(m)
        if len(calls) == 1:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return real(m)

    monkeypatch.setattr(occam.torch.linalg, "eigvalsh", failing_once)
    values = occam._eigenvalues(matrix)
    torch.testing.assert_close(values.detach(), torch.tensor([0.0, 0.0, 0.0, 2.0, 5.0], dtype=torch.float64))
    (gradient,) = torch.autograd.grad(values[-1], matrix)
    assert len(calls) == 2 and gradient[4, 4] == pytest.approx(1.0)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 2), st.integers(1, 9))
def test_the_gram_form_of_a_has_its_nonzero_eigenvalues_and_the_term_is_the_same(examples, positions, groups, inputs):
    g = torch.Generator().manual_seed(examples * 100 + positions * 10 + inputs)
    patches = torch.randn(examples, positions, groups, inputs, generator=g, dtype=torch.float64)
    full = KroneckerFactors(
        a=torch.einsum("npgi,npgj->gij", patches, patches) / (examples * positions),
        b=torch.eye(2, dtype=torch.float64).expand(groups, 2, 2) * 3.0,
        theta=torch.ones(groups, 2, inputs, dtype=torch.float64),
    )
    compact = KroneckerFactors(a=input_moment(patches), b=full.b, theta=full.theta)
    assert compact.a.shape[-1] == min(examples * positions, inputs)
    torch.testing.assert_close(laplace_occam({"": compact}), laplace_occam({"": full}))
