"""Partitioned training checked against its definitions (appendix I.1, DESIGN.md invariant 4)."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.errors import PartitionArgumentError, PartitionTrainingError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import (
    Categorical,
    DataChunks,
    Examples,
    Gaussian,
    LMLEstimate,
    PartitionedSampler,
    PartitionedTrainer,
    chunks_from_assignment,
    estimate_lml,
    fit,
    split_into_chunks,
    weight_decay_scales,
)
from partition_fx.transforms import ConcreteDropout, InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

PROPORTIONS = (0.5, 0.25, 0.25)


def _pmodel(seed: int = 0, dropout: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16), nn.Tanh()]
    if dropout:
        layers.append(ConcreteDropout(p=0.2))
    layers.append(nn.Linear(16, 3))
    return partitionify(nn.Sequential(*layers), 3, PROPORTIONS, seed=1)


def _data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()


def _parts(pmodel) -> list[torch.Tensor]:
    return [p.detach().clone() for k in range(1, pmodel.num_partitions + 1) for p in pmodel.partition_parameters(k)]


# --- chunks and sampler ------------------------------------------------------------------------------


def test_chunks_are_a_reproducible_partition_of_the_dataset():
    """The sizes are checked exactly: an earlier ``sizes == [82, 11, 10] or sum(sizes) == 103`` held whatever
    the split did (the sum is always 103, and [82, 11, 10] was not even the right split), so
    ``split_into_chunks`` with the proportions reversed ([10, 10, 83]) passed it."""
    a, b = split_into_chunks(103, (0.8, 0.1, 0.1), seed=3), split_into_chunks(103, (0.8, 0.1, 0.1), seed=3)
    # largest remainder by hand: quotas 82.4, 10.3, 10.3 -> 82, 10, 10 and the one left over to the 0.4
    assert a.sizes == [83, 10, 10]
    assert split_into_chunks(10, (0.2, 0.3, 0.5), seed=0).sizes == [2, 3, 5]  # in the proportions' order
    assert all(torch.equal(x, y) for x, y in zip(a.indices, b.indices))
    assert torch.equal(torch.cat(a.indices).sort().values, torch.arange(103))
    assert not torch.equal(a.indices[1], split_into_chunks(103, (0.8, 0.1, 0.1), seed=4).indices[1])
    assert torch.equal(a.prefix(2), torch.cat(a.indices[:2]))


def test_empty_chunk_and_bad_assignment_are_refused():
    with pytest.raises(PartitionArgumentError, match="chunk 3 of 3 is empty"):
        split_into_chunks(5, (0.8, 0.2, 0.0))
    with pytest.raises(PartitionArgumentError, match=r"values must be in 1\.\.2"):
        chunks_from_assignment([0, 1, 2], 2)
    assert chunks_from_assignment(torch.tensor([2, 1, 2, 1]), 2).chunk(2).tolist() == [0, 2]


def test_sampler_frequencies_match_appendix_i1():
    """k ~ Cat(u); examples uniform over D_1:k, so chunk j is drawn with probability sum_{i>=j} u_i |D_j| / |D_1:i|."""
    chunks = split_into_chunks(1000, (0.6, 0.3, 0.1), seed=0)
    sampler = PartitionedSampler(chunks, batch_size=1, seed=0)
    draws = 20000
    chunk_of = torch.empty(1000, dtype=torch.long)
    for j, idx in enumerate(chunks.indices):
        chunk_of[idx] = j
    ks, examples = zip(*(sampler.parameter_batch() for _ in range(draws)))
    ks_t = torch.tensor(ks)
    u = torch.tensor(chunks.sizes, dtype=torch.float64) / 1000
    sizes = torch.tensor(chunks.sizes, dtype=torch.float64)
    for k in range(1, 4):
        # partition frequency: binomial, within 5 standard deviations
        p = float(u[k - 1])
        assert abs(float((ks_t == k).double().mean()) - p) < 5 * math.sqrt(p * (1 - p) / draws)
        picked = chunk_of[torch.cat(examples)[ks_t == k]]
        assert int(picked.max()) <= k - 1  # partition k only sees D_1:k
    expected = [sum(float(u[i] * sizes[j] / sizes[: i + 1].sum()) for i in range(j, 3)) for j in range(3)]
    observed = torch.bincount(chunk_of[torch.cat(examples)], minlength=3).double() / draws
    for e, o in zip(expected, observed.tolist()):
        assert abs(o - e) < 5 * math.sqrt(e * (1 - e) / draws)
    hyper = [sampler.hyper_batch() for _ in range(4000)]
    hk = torch.tensor([k for k, _ in hyper])
    assert set(hk.tolist()) == {2, 3}
    assert abs(float((hk == 2).double().mean()) - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 4000)
    assert all(int(chunk_of[idx].item()) == k - 1 for k, idx in hyper)


def _within(count: int, trials: int, p: float) -> bool:
    """Whether ``count`` successes in ``trials`` fit Binomial(trials, p): within 5 standard deviations (and
    exactly right where p is 0 or 1)."""
    return abs(count - trials * p) <= 5 * math.sqrt(trials * p * (1 - p)) + 1e-9


@settings(max_examples=30, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_every_partition_sampler_follows_its_definition(sizes: list[int], seed: int):
    """``parameter_examples`` against its definition (appendix I.1, per example): each example draws its
    partition k ~ Cat(u), u = the chunk sizes over the data, and then an example uniformly from D_1:k.
    Checked exactly: every example of partition k lies in D_1..D_k; statistically (binomial, 5 standard
    deviations, 20480 draws): the frequency of each k, and each chunk j's share of partition k's examples,
    |D_j| / |D_1:k|. The fused and every-partition tests build their references from the sampler's own output,
    so a sampler drawing partition k's examples from D_1:k+1 passed all 16 of them."""
    n = sum(sizes)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))  # chunks need not be contiguous
    chunks = DataChunks(tuple(part.sort().values for part in torch.split(order, sizes)))
    chunk_of = torch.empty(n, dtype=torch.long)
    for j, idx in enumerate(chunks.indices, start=1):
        chunk_of[idx] = j
    sampler = PartitionedSampler(chunks, batch_size=256, seed=seed)
    ks, examples = (torch.cat(t) for t in zip(*(sampler.parameter_examples() for _ in range(80))))
    draws = ks.numel()
    assert draws == 20480 and examples.shape == ks.shape
    drawn_chunk = chunk_of[examples]
    assert bool((drawn_chunk <= ks).all()), "an example of partition k from a chunk after D_k"
    assert int(ks.min()) >= 1 and int(ks.max()) <= len(sizes)
    for k in range(1, len(sizes) + 1):
        mine = ks == k
        count = int(mine.sum())
        assert _within(count, draws, sizes[k - 1] / n), f"partition {k} drawn {count} times of {draws}"
        for j in range(1, k + 1):
            share = sizes[j - 1] / sum(sizes[:k])
            got = int((drawn_chunk[mine] == j).sum())
            assert _within(got, count, share), f"chunk {j}: {got} of partition {k}'s {count} examples"


# --- per-partition optimiser state --------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory",
    [
        partial(torch.optim.Adam, lr=0.05),
        partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1),
        partial(torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    ],
    ids=["adam", "adamw", "sgd-momentum"],
)
@pytest.mark.parametrize("scaling", ["reciprocal", "sqrt"])
@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
def test_partition_updates_equal_a_fresh_optimiser_per_partition(factory, scaling):
    """Through the trainer, partition k's trajectory is bit-identical to optimising w_k alone with its
    own fresh optimiser (moments and step counts advance only when k is stepped; the scheduler follows
    the total iteration count)."""
    x, y = _data()
    schedule = partial(torch.optim.lr_scheduler.StepLR, step_size=4, gamma=0.5)
    trainer = PartitionedTrainer(
        _pmodel(), (x, y), PAPER, optimizer=factory, scheduler=schedule, weight_decay_scaling=scaling, batch_size=8
    )
    reference = _pmodel()
    scales = weight_decay_scales(trainer.chunks.sizes, scaling)
    optimizers, schedulers = {}, []
    for k in range(1, 4):
        opt = factory(reference.partition_parameters(k))
        opt.param_groups[0]["weight_decay"] *= scales[k - 1]
        optimizers[k] = opt
        schedulers.append(schedule(opt))
    sequence = [trainer.sampler.parameter_batch() for _ in range(15)] + [(3, trainer.chunks.prefix(3)[:8])] * 3
    assert {k for k, _ in sequence} == {1, 2, 3}
    for k, idx in sequence:
        trainer.parameter_step(k, idx)
        loss = F.cross_entropy(reference(x[idx], subnetwork=k), y[idx])
        loss.backward()
        optimizers[k].step()
        reference.zero_grad(set_to_none=True)
        for s in schedulers:
            s.step()
    for got, want in zip(_parts(trainer.pmodel), _parts(reference)):
        assert torch.equal(got, want)
    state_steps = {k: len([1 for kk, _ in sequence if kk == k]) for k in range(1, 4)}
    if "Adam" in factory.func.__name__:
        for group in trainer.optimizer.param_groups:
            for p in group["params"]:
                assert int(trainer.optimizer.state[p]["step"]) == state_steps[group["partition"]]


# --- gradient routing (invariant 4) ------------------------------------------------------------------


def test_partition_k_depends_only_on_chunks_1_to_k():
    """Changing chunk j leaves partitions 1..j-1 bit-identical and moves partition j, for every j. Perturbing
    chunk 3 alone never checked that chunk 2 stays out of partition 1: a sampler giving partition 1 batches
    from D_1:2 passed that version."""
    x, y = _data(96)

    def trained(perturbed_chunk: int | None) -> nn.Module:
        trainer = PartitionedTrainer(_pmodel(), (x.clone(), y.clone()), PAPER, batch_size=8, seed=5)
        if perturbed_chunk is not None:  # change every example of D_j beyond recognition
            idx = trainer.chunks.chunk(perturbed_chunk)
            trainer.examples.tensors[0][idx] = torch.randn(len(idx), 6) * 10
            trainer.examples.tensors[1][idx] = (trainer.examples.tensors[1][idx] + 1) % 3
        for _ in range(30):
            trainer.iteration()
        return trainer.pmodel

    def same(a: nn.Module, b: nn.Module, k: int) -> bool:
        return all(torch.equal(p, q) for p, q in zip(a.partition_parameters(k), b.partition_parameters(k)))

    clean = trained(None)
    for j in (1, 2, 3):
        perturbed = trained(j)
        assert all(same(clean, perturbed, k) for k in range(1, j)), f"chunk {j} reached a partition before {j}"
        assert not same(clean, perturbed, j), f"chunk {j} did not reach partition {j}"


def test_hyper_step_depends_only_on_chunk_k_through_subnetwork_k_minus_1():
    x, y = _data(96)

    def one_step(perturb: str | None) -> torch.Tensor:
        torch.manual_seed(0)
        mask = InputMask(6)
        trainer = PartitionedTrainer(_pmodel(), (x.clone(), y.clone()), PAPER, hyper=mask, batch_size=8, seed=2)
        k = 3
        idx = trainer.chunks.chunk(k)[:8]
        tx = trainer.examples.tensors[0]
        with torch.no_grad():
            if perturb == "other chunks":
                others = torch.cat([trainer.chunks.chunk(1), trainer.chunks.chunk(2)])
                tx[others] = torch.randn(len(others), 6)
            elif perturb == "partition k":
                for p in trainer.pmodel.partition_parameters(k):
                    p.add_(torch.randn_like(p))
            elif perturb == "partition k-1":
                for p in trainer.pmodel.partition_parameters(k - 1):
                    p.add_(torch.randn_like(p))
            elif perturb == "chunk k":
                tx[idx] += 1.0
        trainer.hyper_step(k, idx)
        return mask.logits.detach().clone()

    base = one_step(None)
    assert torch.equal(base, one_step("other chunks"))
    assert torch.equal(base, one_step("partition k"))
    assert not torch.equal(base, one_step("partition k-1"))
    assert not torch.equal(base, one_step("chunk k"))


def test_a_step_given_its_partition_alone_draws_that_partitions_data():
    """parameter_step(k) trains on D_1:k and hyper_step(k) scores D_k, whatever partition the sampler would have
    drawn: the version that drew (k', indices) and kept only the indices fed partition 1 examples of D_3."""
    x, y = _data(96)
    trainer = PartitionedTrainer(_pmodel(), (x, y), PAPER, hyper=InputMask(6), batch_size=8, seed=3)
    read: list[torch.Tensor] = []
    reader = trainer.steps.read  # every example a step trains or scores on is read by its index here
    trainer.steps.read = lambda indices: read.append(indices) or reader(indices)
    for k in (1, 2, 3):
        read.clear()
        for _ in range(20):
            assert trainer.parameter_step(k)[0] == k
        assert set(torch.cat(read).tolist()) <= set(trainer.chunks.prefix(k).tolist()), k
    for k in (2, 3):
        read.clear()
        for _ in range(20):
            assert trainer.hyper_step(k)[0] == k
        assert set(torch.cat(read).tolist()) <= set(trainer.chunks.chunk(k).tolist()), k
    with pytest.raises(PartitionArgumentError, match=r"parameter_step\(indices=...\) needs the partition k"):
        trainer.parameter_step(indices=torch.arange(4))
    with pytest.raises(PartitionArgumentError, match=re.escape("chunk k in 2..C through subnetwork k-1, got 1")):
        trainer.hyper_step(1)
    with pytest.raises(PartitionArgumentError, match=re.escape("partition must be an int in 1..3, got 4")):
        trainer.parameter_step(4)


# --- LML ----------------------------------------------------------------------------------------------


def test_lml_equals_a_hand_computation_with_the_exported_subnetworks():
    torch.manual_seed(0)
    pmodel = partitionify(nn.Linear(2, 3), 2, (0.6, 0.4), default="zero")
    with torch.no_grad():
        for p in pmodel.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(10, 2)
    y = torch.randint(0, 3, (10,))
    chunks = split_into_chunks(10, (0.6, 0.4), seed=0)
    estimate = estimate_lml(pmodel, Examples((x, y)), chunks, Categorical(), batch_size=3)
    by_hand = []
    for k in (1, 2):
        net = export_subnetwork(pmodel, k - 1)
        idx = chunks.chunk(k)
        by_hand.append(sum(math.log(F.softmax(net(x[i]), -1)[y[i]].item()) for i in idx.tolist()))
    assert estimate.per_chunk == pytest.approx(by_hand, rel=1e-5)
    # subnetwork 0 with zero defaults predicts uniformly: the first term is |D_1| log(1/3)
    assert estimate.per_chunk[0] == pytest.approx(6 * math.log(1 / 3), rel=1e-6)
    assert estimate.total == pytest.approx(sum(by_hand), rel=1e-5)
    assert estimate.conditional == pytest.approx(by_hand[1], rel=1e-5)  # chunks 2..C only


def test_sample_averaged_likelihood_averages_probabilities():
    logits = torch.randn(2 * 4, 5)  # S=2 samples of B=4 examples, sample major
    y = torch.randint(0, 5, (4,))
    got = Categorical()(logits, y, num_samples=2)
    p = F.softmax(logits, -1).view(2, 4, 5)
    want = torch.log(p.mean(0)[torch.arange(4), y])
    torch.testing.assert_close(got, want)


def test_gaussian_noise_scale_is_learned():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 3, generator=g)
    y = x[:, 0] * 2 + 0.3 * torch.randn(400, generator=g)
    torch.manual_seed(0)
    pmodel = partitionify(nn.Linear(3, 1), 2, (0.7, 0.3))
    result = fit(
        pmodel,
        (x, y),
        PAPER,
        likelihood=Gaussian(scale=2.0),
        steps=600,
        batch_size=64,
        optimizer=partial(torch.optim.Adam, lr=0.05),
        hyper_optimizer=partial(torch.optim.Adam, lr=0.02),
        progress=False,
    )
    assert 0.2 < result.hyperparameters["noise_scale"] < 0.6  # true noise 0.3, started at 2.0


# --- fit -------------------------------------------------------------------------------------------------


def test_concrete_dropout_in_the_model_is_a_hyperparameter():
    x, y = _data()
    pmodel = _pmodel(dropout=True)
    assert "hyper" in pmodel.describe()
    logit = dict(pmodel.named_parameters())["module.2.logit_p"]
    assert all(p is not logit for k in range(1, 4) for p in pmodel.partition_parameters(k))
    before = logit.item()
    result = fit(
        pmodel,
        (x, y),
        PAPER,
        steps=20,
        batch_size=16,
        hyper_optimizer=partial(torch.optim.Adam, lr=0.1),
        progress=False,
    )
    assert logit.item() != before
    assert set(result.hyperparameters) == {"2.p"}
    pmodel.eval()
    torch.testing.assert_close(pmodel(x, subnetwork=2), export_subnetwork(pmodel, 2).eval()(x))


def test_fit_history_checkpoint_and_callbacks(tmp_path):
    x, y = _data()
    seen = []
    result = fit(
        _pmodel(),
        (x, y),
        PAPER,
        hyper=InputMask(6),
        steps=12,
        batch_size=8,
        eval_every=4,
        checkpoint_dir=tmp_path,
        callbacks=[lambda trainer, record: seen.append(record["step"])],
        progress=False,
    )
    assert seen == [4, 8, 12] and [r["step"] for r in result.history] == [4, 8, 12]
    assert result.lml == result.history[-1]["lml"] and len(result.history[-1]["lml_per_chunk"]) == 3
    assert isinstance(result.hyperparameters["mask"], list) and len(result.hyperparameters["mask"]) == 6
    assert (tmp_path / "last.safetensors").is_file() and (tmp_path / "best.safetensors").is_file()
    reloaded = PartitionedTrainer(_pmodel(seed=9), (x, y), PAPER, hyper=InputMask(6))
    assert reloaded.load_checkpoint(tmp_path / "last.safetensors")["step"] == 12
    assert reloaded.estimate_lml().total == pytest.approx(result.lml, rel=1e-6)


def test_callback_stop_patience_and_restore_best():
    x, y = _data()
    result = fit(
        _pmodel(), (x, y), PAPER, steps=50, eval_every=5, callbacks=[lambda t, r: r["step"] >= 10], progress=False
    )
    assert result.stopped_early and result.steps == 10
    frozen = partial(torch.optim.SGD, lr=0.0)
    result = fit(_pmodel(), (x, y), PAPER, steps=50, eval_every=5, optimizer=frozen, patience=2, progress=False)
    assert result.stopped_early and result.steps == 15 and result.best_step == 5

    def wreck(trainer, record):
        if record["step"] == 10:
            with torch.no_grad():
                for p in trainer.pmodel.parameters():
                    p.mul_(-50)

    trainer = PartitionedTrainer(_pmodel(), (x, y), PAPER, batch_size=16)
    result = trainer.run(20, eval_every=5, restore_best=True, callbacks=[wreck], progress=False)
    assert result.best_step == 10 and result.lml == result.best_lml
    assert trainer.estimate_lml().total == pytest.approx(result.best_lml, rel=1e-9)


def test_nonfinite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    x, y = _data()
    poison = {"on": False}

    def loglik(outputs, targets):
        value = -F.cross_entropy(outputs, targets, reduction="none")
        return value * float("nan") if poison["on"] else value

    def arm(trainer, record):
        poison["on"] = True

    with pytest.raises(PartitionTrainingError, match=r"step 4: non-finite loss nan in the parameter step of partition"):
        fit(
            _pmodel(),
            (x, y),
            PAPER,
            likelihood=loglik,
            steps=20,
            eval_every=4,
            callbacks=[arm],
            checkpoint_dir=tmp_path,
        )
    assert (tmp_path / "last.safetensors").is_file()
    assert PartitionedTrainer(_pmodel(), (x, y), PAPER).load_checkpoint(tmp_path / "last.safetensors")["step"] == 4
    poison["on"] = False
    trainer = PartitionedTrainer(_pmodel(), (x, y), PAPER, likelihood=loglik, on_nonfinite="skip")
    poison["on"] = True
    before = _parts(trainer.pmodel)
    trainer.parameter_step()
    assert trainer.steps.stepper.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _parts(trainer.pmodel)))


def test_fit_refuses_bad_input():
    x, y = _data()
    with pytest.raises(TypeError, match="needs a PartitionedModel"):
        fit(nn.Linear(6, 3), (x, y), PAPER, steps=1)
    with pytest.raises(PartitionArgumentError, match="steps must be an int >= 1"):
        fit(_pmodel(), (x, y), PAPER, steps=0)
    with pytest.raises(PartitionArgumentError, match="chunk 3 of 3 is empty"):
        fit(_pmodel(), (x[:2], y[:2]), PAPER, steps=1)
    with pytest.raises(PartitionArgumentError, match="differ in length"):
        fit(_pmodel(), (x, y[:10]), PAPER, steps=1)
    with pytest.raises(PartitionArgumentError, match="likelihood must be"):
        fit(_pmodel(), (x, y), PAPER, steps=1, likelihood="poisson")
    with pytest.raises(PartitionArgumentError, match="num_partitions >= 2"):
        fit(partitionify(nn.Linear(6, 3), 1), (x, y), PAPER, hyper=InputMask(6), steps=1)
    with pytest.raises(TypeError, match="fused must be True or False, got 'no'"):
        fit(_pmodel(), (x, y), PAPER, steps=1, fused="no")
    with pytest.raises(TypeError, match=r"seed must be an int in 0..2\*\*63-1, got None"):
        fit(_pmodel(), (x, y), PAPER, steps=1, seed=None)
    with pytest.raises(PartitionArgumentError, match="optimizer could not be built: Invalid learning rate"):
        fit(_pmodel(), (x, y), PAPER, steps=1, optimizer=partial(torch.optim.Adam, lr=-1.0))


def test_batchnorm_statistics_are_recalibrated_for_the_final_subnetwork():
    torch.manual_seed(0)
    pmodel = partitionify(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), 3, PROPORTIONS)
    with torch.no_grad():
        for p in pmodel.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(50, 3)
    from partition_fx.training import recalibrate_norm_statistics

    assert recalibrate_norm_statistics(pmodel, Examples((x, torch.zeros(50))), batch_size=64) == 1
    features = export_subnetwork(pmodel, 3)[0](x)
    bn = next(m for m in pmodel.modules() if isinstance(m, nn.BatchNorm1d))
    torch.testing.assert_close(bn.running_mean, features.mean(0).detach())
    torch.testing.assert_close(bn.running_var, features.var(0).detach())
    assert bn.momentum == 0.1  # restored


def test_unpartitioned_trainable_parameters_are_warned_about():
    from partition_fx import PartitionConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    pmodel = partitionify(model, 3, PROPORTIONS, config=PartitionConfig().set_name("2", partition=False))
    with pytest.warns(UserWarning, match=r"2 parameter\(s\) left unpartitioned by the config \(2.weight, 2.bias\)"):
        PartitionedTrainer(pmodel, _data(), PAPER)


def test_the_best_state_is_chosen_by_the_conditional_lml():
    """The full LML adds chunk 1 scored by the untrained subnetwork 0 and ranked states by it; the best state
    (and patience, and restore_best) now follow the conditional LML. Scripted estimates where the two disagree:
    the old rule picks step 5 (total -10 > -22), the conditional one step 10 (-2 > -9)."""
    scripted = iter([LMLEstimate(-10.0, [-1.0, -4.0, -5.0], -0.1), LMLEstimate(-22.0, [-20.0, -1.0, -1.0], -0.2)])
    trainer = PartitionedTrainer(_pmodel(), _data(), PAPER, batch_size=16)
    trainer.estimate_lml = lambda: next(scripted)
    result = trainer.run(10, eval_every=5, progress=False)
    assert trainer.best.step == result.best_step == 10
    assert (result.best_lml, result.best_conditional_lml) == (-22.0, -2.0)
    assert trainer.history[-1]["conditional_lml_per_example"] == -2.0 / sum(trainer.chunks.sizes[1:])
