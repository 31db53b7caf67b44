"""The trainer's collaborators, each built and checked on its own, without a ``PartitionedTrainer``: the
stepper (losses into optimiser updates), the steps (drawn examples into losses), the LML evaluator, the
trained modules' states and the training state, and the hooks that may end a run."""

from __future__ import annotations

import copy
import tempfile
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionCheckpointError, PartitionTrainingError
from partition_fx.job.train_config import TrainConfig
from partition_fx.testing import perturb_partitions
from partition_fx.training import (
    CallbackHook,
    Categorical,
    Examples,
    PartitionedTrainer,
    TrainingHook,
    estimate_lml,
    recalibrate_norm_statistics,
    split_into_chunks,
)
from partition_fx.training.objective.lml import LMLEvaluator, evidence, lml_fields, recalibrated_states
from partition_fx.training.objective.objective import Objective
from partition_fx.training.step.stepping import Stepper
from partition_fx.training.step.steps import TrainingSteps
from partition_fx.transforms import InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _pmodel(norm: bool = False):
    torch.manual_seed(0)
    layers = [nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)] if norm else [nn.Linear(3, 2)]
    pmodel = partitionify(nn.Sequential(*layers), 2, (0.5, 0.5), seed=0)
    perturb_partitions(pmodel)
    return pmodel


def _data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] > 0).long()


def _snapshot(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


def _stepper(pmodel, mask=None, **options) -> Stepper:
    sgd = torch.optim.SGD(pmodel.parameters(), lr=1.0)  # new = old - grad: the update is the gradient
    psi = torch.optim.SGD(mask.parameters(), lr=1.0) if mask is not None else None
    return Stepper(sgd, psi, objective=Objective(pmodel, mask), **options)  # psi: the mask's, from the objective


# --- Stepper --------------------------------------------------------------------------------------------


def test_the_stepper_updates_only_what_each_loss_trains():
    """A parameter loss moves the partitions it is given by their gradient and nothing else; a hyperparameter
    loss moves psi by its gradient and no partition; the losses are kept, on the device, for the evaluation."""
    pmodel, mask = _pmodel(), InputMask(3)
    stepper = _stepper(pmodel, mask)
    x, y = _data()
    one, two = pmodel.partition_parameters(1), pmodel.partition_parameters(2)
    loss = nn.functional.cross_entropy(pmodel(x, subnetwork=2), y)
    want = torch.autograd.grad(loss, two, retain_graph=True)
    before = _snapshot(*one, *two, mask.logits)
    total = stepper.step(loss, None, two, "parameter step", at=0)
    assert torch.equal(total, loss.detach())
    assert all(torch.equal(a, b) for a, b in zip(before[: len(one)], one))
    for old, new, g in zip(before[len(one) : -1], two, want):
        torch.testing.assert_close(old - new, g)
    assert torch.equal(before[-1], mask.logits)

    hyper_loss = nn.functional.cross_entropy(pmodel(mask(x), subnetwork=1), y)
    (psi,) = torch.autograd.grad(hyper_loss, mask.logits, retain_graph=True)
    weights = _snapshot(*one, *two)
    logits = mask.logits.detach().clone()
    stepper.step(None, hyper_loss, [], "hyperparameter step", at=1)
    torch.testing.assert_close(logits - mask.logits, psi)
    assert all(torch.equal(a, b) for a, b in zip(weights, [*one, *two]))
    assert stepper.pending_losses() == ([float(loss.detach())], [float(hyper_loss.detach())])
    stepper.clear_losses()
    assert stepper.pending_losses() == ([], [])


def test_the_stepper_checks_lazily_or_skips_and_round_trips_its_state():
    pmodel = _pmodel()
    x, y = _data()
    two = pmodel.partition_parameters(2)

    def loss(bad: bool = False) -> torch.Tensor:
        value = nn.functional.cross_entropy(pmodel(x, subnetwork=2), y)
        return value * float("nan") if bad else value

    lazy = _stepper(pmodel, check_every=3, checkpoint_dir=Path("runs/a"))
    lazy.last_checkpoint_step = 4
    lazy.step(loss(), None, two, "first", at=5)
    lazy.step(loss(bad=True), None, two, "second", at=6)  # recorded, not read
    with pytest.raises(PartitionTrainingError, match=r"^step 6: non-finite loss in the second \(found at step 8.*"):
        lazy.step(loss(), None, two, "third", at=8)  # the third recorded step reads the flags
    with pytest.raises(PartitionTrainingError) as error:
        lazy.step(loss(bad=True), None, two, "fourth", at=9)
        lazy.check_nonfinite(9)
    assert f"the last checkpoint (step 4) in {Path('runs/a')} is kept" in str(error.value)

    pmodel = _pmodel()  # the lazy stepper stepped the bad steps (the check came after them)
    two = pmodel.partition_parameters(2)
    skipping = _stepper(pmodel, on_nonfinite="skip")
    before = _snapshot(*two)
    skipping.step(loss(bad=True), None, two, "bad", at=0)
    assert skipping.skipped_steps == 1 and skipping.pending_losses() == ([], [])
    assert all(torch.equal(a, b) for a, b in zip(before, two))

    skipping.step(loss(), None, two, "good", at=1)
    saved = copy.deepcopy(skipping.state_dict())
    restored = _stepper(pmodel)
    restored.load_state_dict(saved)
    assert restored.skipped_steps == 1 and restored.pending_losses() == skipping.pending_losses()
    assert restored.optimizer.state_dict() == skipping.optimizer.state_dict()


# --- TrainingSteps ----------------------------------------------------------------------------------------


def test_the_steps_train_partition_k_through_subnetwork_k_and_record_at_their_count():
    pmodel = _pmodel()
    x, y = _data()
    stepper = _stepper(pmodel)
    steps = TrainingSteps(Objective(pmodel, None, Categorical()), Examples((x, y)), stepper)
    idx = torch.tensor([0, 3, 5, 7])
    two = pmodel.partition_parameters(2)
    want = torch.autograd.grad(nn.functional.cross_entropy(pmodel(x[idx], subnetwork=2), y[idx]), two)
    before = _snapshot(*two)
    steps.parameter_step(2, *steps.read(idx))
    for old, new, g in zip(before, two, want):
        torch.testing.assert_close(old - new, g)
    assert steps.step == 0
    steps.advance()
    steps.advance()
    x[idx] = float("nan")
    with pytest.raises(
        PartitionTrainingError, match=r"^step 2: non-finite loss nan in the parameter step of partition 1"
    ):
        steps.parameter_step(1, *steps.read(idx))


# --- LMLEvaluator -----------------------------------------------------------------------------------------


def test_the_evaluator_draws_from_its_own_generator_only():
    """Its estimate is ``estimate_lml`` with noise seeded from its generator (here: the subsampling of the
    chunks), and torch's global generator is left where it was."""
    pmodel = _pmodel()
    examples, chunks = Examples(_data()), split_into_chunks(40, (0.5, 0.5), seed=0)
    evaluator = LMLEvaluator(Objective(pmodel, None, Categorical()), examples, chunks, max_examples_per_chunk=6, seed=7)
    reference = torch.Generator().manual_seed(7)
    rng = torch.get_rng_state()
    for _ in range(3):
        got = evaluator.estimate()
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=reference)))
        want = estimate_lml(pmodel, examples, chunks, Categorical(), max_examples_per_chunk=6, generator=reference)
        assert got == want
        torch.set_rng_state(rng)
    assert torch.equal(torch.get_rng_state(), rng)
    assert evidence(lml_fields(got, scored=20)) == got.conditional


# --- Objective and the trainer's state -----------------------------------------------------------------------


def test_trained_modules_save_load_restore_and_recalibrate_on_a_copy():
    pmodel, mask = _pmodel(norm=True), InputMask(3)
    trained = Objective(pmodel, mask, checkpoint_defaults=False)
    states = trained.states(copy_values=True)
    assert set(states) == {"model", "hyper"}
    assert not set(states["model"]) & set(pmodel.rebuilt_buffers(defaults=True))
    assert trained.omitted()["omitted"] == "layouts+defaults"
    path = Path(tempfile.mkdtemp()) / "last.safetensors"
    trained.save(path, 7, states, lml=-3.0, conditional_lml=-1.0)
    with torch.no_grad():
        for p in [*pmodel.parameters(), mask.logits]:
            p.add_(1.0)
    assert not trained.is_current(states)
    meta = trained.load(path)
    assert (meta["step"], meta["lml"], meta["conditional_lml"]) == (7, -3.0, -1.0) and trained.is_current(states)
    with torch.no_grad():
        mask.logits.add_(1.0)
    trained.restore(states)
    assert trained.is_current(states)

    examples = Examples(_data())
    model_before = copy.deepcopy(pmodel.state_dict())
    recalibrated = recalibrated_states(pmodel, states, examples, batch_size=16, device=None)
    copied = copy.deepcopy(pmodel)
    recalibrate_norm_statistics(copied, examples, batch_size=16)
    assert all(torch.equal(v, copied.state_dict()[k]) for k, v in recalibrated["model"].items())
    assert all(torch.equal(v, pmodel.state_dict()[k]) for k, v in model_before.items())


def test_the_training_state_round_trips_and_refuses_another_configuration():
    pmodel = _pmodel()
    x, y = _data()
    sgd = partial(torch.optim.SGD, lr=1.0)
    trainer = PartitionedTrainer(pmodel, (x, y), PAPER, batch_size=4, seed=0, optimizer=sgd)
    steps, sampler, generator = trainer.steps, trainer.sampler, trainer.steps.evaluator.generator

    def train(n: int) -> None:
        for _ in range(n):
            k, indices = sampler.parameter_batch()
            steps.parameter_step(k, *steps.read(indices))
            steps.advance()
        torch.rand(1, generator=generator)

    train(3)
    assert trainer.record_evaluation({"step": 3, "lml": -2.0, "conditional_lml": -1.0})
    assert (trainer.best.score, trainer.best.step) == (-1.0, 3)
    assert not trainer.record_evaluation({"step": 3, "lml": -2.5, "conditional_lml": -1.5})
    saved = copy.deepcopy(trainer.state_dict())
    expected_next = (sampler.parameter_batch(), torch.rand(1, generator=generator))
    sampler.load_state_dict(saved["rng"]["sampler"])
    generator.set_state(saved["rng"]["lml"])
    weights = _snapshot(*pmodel.parameters())
    train(4)
    trainer.load_state_dict(saved)
    assert steps.step == 3 and len(trainer.history) == 2 and (trainer.best.score, trainer.best.step) == (-1.0, 3)
    assert all(torch.equal(a, b) for a, b in zip(weights, pmodel.parameters()))
    k, indices = sampler.parameter_batch()
    assert k == expected_next[0][0] and torch.equal(indices, expected_next[0][1])
    assert torch.equal(torch.rand(1, generator=generator), expected_next[1])

    other = PartitionedTrainer(pmodel, (x, y), PAPER, batch_size=4, seed=0, optimizer=sgd, fused=True)
    with pytest.raises(PartitionCheckpointError, match=r"the saved run is from a different configuration \(.*fused"):
        other.load_state_dict(saved, source="the saved run")
    assert other.step == 0 and steps.step == 3


# --- hooks that end a run ---------------------------------------------------------------------------------


def test_hooks_are_asked_whether_to_stop_before_the_callbacks_which_stop_at_the_first_true():
    asked = []

    class StopAt(TrainingHook):
        def should_stop(self, trainer, record):
            asked.append(("hook", record["step"]))
            return record["step"] >= 6

    def callback(name: str, stop: bool):
        return lambda trainer, record: asked.append((name, record["step"])) or stop

    trainer = PartitionedTrainer(_pmodel(), _data(), PAPER, batch_size=8)
    trainer.hooks.append(StopAt())
    result = trainer.run(20, eval_every=2, callbacks=[callback("a", False), callback("b", False)], progress=False)
    assert result.stopped_early and result.steps == 6
    assert asked == [(who, step) for step in (2, 4) for who in ("hook", "a", "b")] + [("hook", 6)]
    calls = []
    hook = CallbackHook([lambda t, r: calls.append(1) or True, lambda t, r: calls.append(2)])
    assert hook.should_stop(None, {}) and calls == [1]
