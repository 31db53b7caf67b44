"""The conditional LML of fixed augmentation draws (``training.conditional_lml_of_draws``) against its definition:
chunk k's examples under each fixed draw through subnetwork k-1, the draws' predictive averaged, summed over k = 2..C;
deterministic, without side effects, and differentiable in the ranges through ``log_likelihood_of_draws``."""

from __future__ import annotations

import math

import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.training import conditional_lml_of_draws, log_likelihood_of_draws, split_into_chunks
from partition_fx.transforms import AffineAugmentation, averaging_coefficients


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.rand(40, 1, 8, 8, generator=generator), torch.randint(0, 3, (40,), generator=generator)


def test_it_is_the_definition_written_out():
    pmodel = partitionify(_model(), 3, (0.5, 0.25, 0.25), seed=0)
    x, y = _data()
    chunks = split_into_chunks(len(x), pmodel.proportions, seed=0)
    rotation = AffineAugmentation.fixed({"rotation": 1.2}, generators=["rotation"])
    draws = averaging_coefficients(4, 1)
    expected = 0.0
    with torch.no_grad():
        for k in (2, 3):
            rows = chunks.chunk(k)
            eps = draws.view(4, 1, 1).expand(4, len(rows), 1)
            logits = pmodel(rotation.transform(x[rows], eps), subnetwork=k - 1).view(4, len(rows), -1)
            picked = torch.log_softmax(logits, -1).gather(-1, y[rows].view(1, -1, 1).expand(4, -1, 1)).squeeze(-1)
            expected += float((torch.logsumexp(picked, 0) - math.log(4)).sum())
    pmodel.eval()  # the score runs in training mode whatever the model's, and puts it back
    buffers = {name: b.clone() for name, b in pmodel.named_buffers()}
    found = conditional_lml_of_draws(pmodel, rotation, draws, x, y, chunks)
    assert math.isclose(found, expected, rel_tol=1e-6)
    assert not pmodel.training
    assert all(torch.equal(b, buffers[name]) for name, b in pmodel.named_buffers())
    assert conditional_lml_of_draws(pmodel, rotation, draws, x, y, chunks) == found  # no noise


def test_its_terms_are_differentiable_in_the_ranges():
    pmodel = partitionify(_model(), 2, seed=0)
    x, y = _data()
    rotation = AffineAugmentation(num_samples=4, generators=["rotation"], init={"rotation": 0.7})
    terms = log_likelihood_of_draws(pmodel, rotation, averaging_coefficients(4, 1), x, y, subnetwork=1)
    (gradient,) = torch.autograd.grad(terms.sum(), rotation.ranges)
    assert terms.shape == (40,) and torch.isfinite(gradient).all() and gradient.abs().sum() > 0
