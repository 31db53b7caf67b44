"""The iteration schemes (``training.sampling.schemes``) against their definitions: each iteration's updates are the
gradients of appendix I.1's steps, taken one example and one chunk at a time (DESIGN.md invariant 4); each
combination of the options names its scheme."""

from __future__ import annotations

import pytest
import torch
from models_for_tests import mlp
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.testing import perturb_partitions
from partition_fx.training.sampling.schemes import (
    Alternating,
    Draw,
    EveryPartition,
    Fused,
    FusedEveryPartition,
    IterationScheme,
    scheme_for,
)

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _parts(pmodel) -> list[nn.Parameter]:
    return [p for k in range(1, pmodel.num_partitions + 1) for p in pmodel.partition_parameters(k)]


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
    return [p.detach().clone() for p in _parts(trainer.pmodel)] + [trainer.steps.hyper.logits.detach().clone()]


def _drawn_parameter_examples(sampler, every_partition: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The next parameter batch the sampler draws, as (partition of each example, example indices)."""
    if every_partition:
        return sampler.parameter_examples()
    k, indices = sampler.parameter_batch()
    return torch.full((indices.numel(),), k), indices


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

    sampler, pmodel, mask = reference.sampler, reference.pmodel, reference.steps.hyper
    x, y = reference.examples.tensors
    ks, idx = _drawn_parameter_examples(sampler, every_partition)
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
    before = fused.steps.likelihood.log_scale.item()
    fused.iteration()
    applied = (before - fused.steps.likelihood.log_scale.item()) / 0.01
    reference = trainer(False)
    reference.sampler.parameter_batch()  # the fused iteration draws the parameter batch first
    kh, hidx = reference.sampler.hyper_batch()
    x, y = reference.examples.tensors
    out = reference.pmodel(x[hidx], subnetwork=kh - 1)
    hyper_loss = -reference.steps.likelihood(out, y[hidx]).mean()
    (want,) = torch.autograd.grad(hyper_loss, reference.steps.likelihood.log_scale)
    assert applied == pytest.approx(want.item(), rel=1e-4)


def _parameter_gradients(reference, ks: torch.Tensor, idx: torch.Tensor) -> list[torch.Tensor]:
    """The parameter step's definition: the mean over examples of each example's loss through its own
    subnetwork ks[i], differentiated w.r.t. that subnetwork's partition only."""
    pmodel, mask = reference.pmodel, reference.steps.hyper
    x, y = reference.examples.tensors
    params = _parts(pmodel)
    want = [torch.zeros_like(p) for p in params]
    for i in range(len(idx)):
        k = int(ks[i])
        with torch.no_grad():
            xi = mask(x[idx[i : i + 1]])
        loss = nn.functional.cross_entropy(pmodel(xi, subnetwork=k), y[idx[i : i + 1]]) / len(idx)
        own = pmodel.partition_parameters(k)
        for p, g in zip(own, torch.autograd.grad(loss, own)):
            want[next(j for j, q in enumerate(params) if q is p)] += g
    return want


@pytest.mark.parametrize(
    ("every_partition", "hyper_chunks"), [(False, "one"), (True, "one"), (False, "all"), (True, "all")]
)
def test_an_alternating_iteration_gives_the_gradients_of_the_papers_two_steps(every_partition, hyper_chunks):
    """Definition (appendix I.1): the parameter step's gradient w.r.t. the drawn partition (each example's own,
    with every_partition) at the current weights; THEN psi's gradient at the updated weights, from the hyper
    batch of D_k through subnetwork k-1 (every chunk's, weighted by its probability, with hyper_chunks="all")."""
    trainer = _trainer(every_partition=every_partition, hyper_chunks=hyper_chunks)
    assert type(trainer.scheme) is (EveryPartition if every_partition else Alternating)
    reference = _trainer()
    before = _snapshot(trainer)
    trainer.iteration()
    got = [b - a for a, b in zip(_snapshot(trainer), before)]  # SGD with lr 1: the applied gradients

    sampler, pmodel, mask = reference.sampler, reference.pmodel, reference.steps.hyper
    x, y = reference.examples.tensors
    ks, idx = _drawn_parameter_examples(sampler, every_partition)
    want = _parameter_gradients(reference, ks, idx)
    with torch.no_grad():  # the hyperparameter step sees the partitions already updated
        for p, g in zip(_parts(pmodel), want):
            p.sub_(g)
    hyper_batches = sampler.hyper_batches() if hyper_chunks == "all" else [(1.0, *sampler.hyper_batch())]
    psi = torch.zeros_like(mask.logits)
    for weight, kh, hidx in hyper_batches:
        hyper_loss = weight * nn.functional.cross_entropy(pmodel(mask(x[hidx]), subnetwork=kh - 1), y[hidx])
        psi += torch.autograd.grad(hyper_loss, mask.logits)[0]
    for g, w in zip(got, [*want, psi]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert psi.abs().sum() > 0 and trainer.step == 1


def test_each_combination_of_the_options_names_its_scheme():
    chosen = {
        (fused, every): type(_trainer(fused=fused, every_partition=every).scheme)
        for fused in (False, True)
        for every in (False, True)
    }
    assert chosen == {
        (False, False): Alternating,
        (False, True): EveryPartition,
        (True, False): Fused,
        (True, True): FusedEveryPartition,
    }
    assert all(type(scheme_for(*flags)) is cls for flags, cls in chosen.items())


def test_a_new_scheme_is_one_class_behind_the_interface():
    """A scheme sees only the sampler, the steps and the estimator (None when no hyperparameter step is due),
    and the trainer counts its iterations, evaluates and saves as for any other."""

    class HyperOnly(IterationScheme):  # psi only: the partitions stay as converted
        name = "hyper-only"

        def draw(self, sampler, hyper):
            batches = hyper.draw(sampler) if hyper is not None else []
            what = hyper.describe(batches) if batches else ""
            return Draw(torch.tensor([], dtype=torch.long), 1, batches, what, scheme=self)

        def take(self, steps, draw, batch):
            steps.advance()
            if batch.hyper:
                steps.hyper_step(batch.hyper, draw.hyper_what)

    trainer = _trainer(hyper_chunks="all")
    trainer.scheme = HyperOnly()
    parts = [p.detach().clone() for p in _parts(trainer.pmodel)]
    result = trainer.run(4, eval_every=2, progress=False)
    assert result.steps == 4 and [r["train_loss"] for r in result.history] == [None, None]
    assert all(r["hyper_loss"] is not None for r in result.history)
    assert all(torch.equal(a, b) for a, b in zip(parts, _parts(trainer.pmodel)))
