"""The hyperparameter-gradient estimators (``training.objective.estimators``) against their definitions.

* ``OneChunk`` (``hyper_chunks="one"``, the paper's): one chunk k ~ Cat(u_2..u_C renormalised), weight 1;
* ``AllChunks`` (``hyper_chunks="all"``): the hyper-gradient is the sum over chunks k=2..C of
  u_k / (u_2 + ... + u_C) times the gradient of chunk k's mean loss through subnetwork k-1, the expected
  value of ``OneChunk``'s;
* the registry holds exactly the names the options accept.
"""

from __future__ import annotations

import math

import pytest
import torch
from models_for_tests import gradient_step_trainer

from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import HYPER_CHUNKS
from partition_fx.training import PartitionedSampler, split_into_chunks
from partition_fx.training.objective.estimators import AllChunks, HyperEstimator, OneChunk, estimator_for
from partition_fx.training.objective.lml import forward_log_likelihood

_trainer = gradient_step_trainer


def _sampler(seed: int = 0) -> PartitionedSampler:
    return PartitionedSampler(split_into_chunks(100, (0.6, 0.1, 0.2, 0.1), seed=seed), batch_size=4, seed=seed)


def test_the_all_chunks_hyper_gradient_is_the_weighted_sum_of_the_per_chunk_gradients():
    trainer = _trainer(hyper_chunks="all", hyper_samples=3)
    reference = _trainer()
    before = trainer.steps.hyper.ranges.detach().clone()
    state, rng = trainer.sampler.generator.get_state(), torch.get_rng_state()
    trainer.hyper_step_all_chunks()
    got = before - trainer.steps.hyper.ranges.detach()

    reference.sampler.generator.set_state(state)
    torch.set_rng_state(rng)
    batches = reference.sampler.hyper_batches()
    sizes = reference.chunks.sizes
    later = sizes[1] + sizes[2]
    assert [(k, w) for w, k, _ in batches] == [(2, sizes[1] / later), (3, sizes[2] / later)]
    assert all(set(i.tolist()) <= set(reference.chunks.chunk(k).tolist()) for _, k, i in batches)
    want = torch.zeros_like(before)
    x, y = reference.examples.tensors
    for weight, k, indices in batches:
        loss = -forward_log_likelihood(
            reference.pmodel,
            reference.steps.likelihood,
            x[indices],
            y[indices],
            k - 1,
            reference.steps.hyper,
            samples=3,
        ).mean()
        want += weight * torch.autograd.grad(loss, reference.steps.hyper.ranges)[0]
    torch.testing.assert_close(got, want)
    assert got.abs().sum() > 0


def test_one_chunk_is_one_draw_of_the_hyper_chunk_weight_one():
    """The paper's step: the sampler's ``hyper_batch`` (k in 2..C, a minibatch of D_k), with weight 1."""
    sampler, reference = _sampler(), _sampler()
    for _ in range(20):
        ((weight, k, indices),) = OneChunk().draw(sampler)
        want_k, want = reference.hyper_batch()
        assert (weight, k) == (1.0, want_k) and torch.equal(indices, want)
        assert set(indices.tolist()) <= set(sampler.chunks.chunk(k).tolist())
    assert OneChunk().describe([(1.0, 3, indices)]) == "chunk D_3 through subnetwork 2"


def test_all_chunks_weights_every_chunk_by_the_probability_one_chunk_draws_it():
    """``AllChunks``' weights are u_k / (u_2 + ... + u_C), k = 2..C, and ``OneChunk`` draws chunk k with exactly
    those frequencies (binomial, 5 standard deviations over 20000 draws): the expected one-chunk step is the
    all-chunks step."""
    sampler = _sampler()
    batches = AllChunks().draw(sampler)
    sizes = sampler.chunks.sizes
    assert [(k, w) for w, k, _ in batches] == [(k, sizes[k - 1] / sum(sizes[1:])) for k in range(2, len(sizes) + 1)]
    assert all(set(i.tolist()) <= set(sampler.chunks.chunk(k).tolist()) and len(i) == 4 for _, k, i in batches)
    drawn = torch.tensor([OneChunk().draw(sampler)[0][1] for _ in range(20000)])
    for weight, k, _ in batches:
        count = int((drawn == k).sum())
        assert abs(count - 20000 * weight) <= 5 * math.sqrt(20000 * weight * (1 - weight)), (k, count)


def test_each_name_the_options_accept_picks_its_estimator():
    assert [type(estimator_for(name)) for name in HYPER_CHUNKS] == [OneChunk, AllChunks]
    assert all(isinstance(estimator_for(name), HyperEstimator) for name in HYPER_CHUNKS)
    assert type(_trainer(hyper_chunks="all").estimator) is AllChunks and type(_trainer().estimator) is OneChunk
    with pytest.raises(PartitionArgumentError, match="hyper_chunks"):  # the configuration knows the names
        _trainer(hyper_chunks="both")
