"""The hyperparameter-step options and the fine-tuning phase, against their definitions (the estimators
``hyper_chunks`` picks: ``tests/test_estimators.py``).

* ``hyper_samples``: hyper steps draw that many augmentation samples, parameter steps their own;
* fine-tuning: every weight trains on all chunks through subnetwork C, psi never moves, the LR schedule
  spans both phases, and a run resumed in either phase equals the uninterrupted one bit for bit.
"""

from __future__ import annotations

import copy
import json
import math
from functools import partial

import pytest
import torch
from models_for_tests import gradient_step_trainer, small_images, small_partitioned_cnn
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError, PartitionCheckpointError, PartitionTypeError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, TrainingHook, fit, recalibrate_norm_statistics
from partition_fx.training.loop.trainer import resolve
from partition_fx.transforms import AffineAugmentation, InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _images():
    return small_images(60)


_pmodel = small_partitioned_cnn
_trainer = gradient_step_trainer


def _weights(trainer):
    return [p.detach().clone() for k in (1, 2, 3) for p in trainer.pmodel.partition_parameters(k)]


# --- the hyper-step options ------------------------------------------------------------------------------


def test_hyper_samples_apply_to_hyperparameter_steps_only():
    trainer = _trainer(hyper_samples=5)
    seen = []
    trainer.steps.hyper.register_forward_hook(lambda m, args, out: seen.append(out.shape[0] // args[0].shape[0]))
    trainer.parameter_step()
    trainer.hyper_step()
    assert seen == [2, 5]


def test_hyper_samples_are_refused_without_a_transform_that_takes_them():
    with pytest.raises(PartitionArgumentError, match="there is no input transform"):
        _trainer(hyper=None, hyper_samples=4)
    with pytest.raises(PartitionArgumentError, match=r"InputMask\.forward does not"):
        PartitionedTrainer(_pmodel(), (torch.randn(60, 4), torch.zeros(60)), PAPER, hyper=InputMask(4), hyper_samples=4)
    with pytest.raises(PartitionArgumentError, match="hyper_chunks must be one of"):
        _trainer(hyper_chunks="both")


def _widening_trainer(init, factor, **options):
    return _trainer(hyper=AffineAugmentation(num_samples=2, init=init), train_range_factor=factor, **options)


@pytest.mark.parametrize("every_partition", [False, True])
def test_train_range_factor_widens_parameter_steps_only(every_partition):
    """With ``train_range_factor=2`` a parameter step trains exactly as with ranges twice as wide (eps * 2 * r is
    eps * (2 r) bit for bit), and hyperparameter and fine-tuning steps use the ranges themselves."""
    options = {"every_partition": every_partition, "warmup_steps": 10}  # parameter steps only in run(2)
    widened, doubled = _widening_trainer(0.2, 2.0, **options), _widening_trainer(0.4, 1.0, **options)
    for trainer in (widened, doubled):
        torch.manual_seed(0)  # the augmentation's draws
        trainer.run(2, finetune_steps=0, progress=False) if every_partition else trainer.parameter_step()
    assert all(torch.equal(a, b) for a, b in zip(_weights(widened), _weights(doubled)))
    plain = _widening_trainer(0.2, 1.0, **options)
    plain.pmodel.load_state_dict(widened.pmodel.state_dict())
    widened_rng = torch.get_rng_state()
    _, hyper_loss = widened.hyper_step(2, torch.arange(4))
    torch.set_rng_state(widened_rng)
    assert torch.equal(hyper_loss, plain.hyper_step(2, torch.arange(4))[1])
    widened.steps.begin_finetuning(), plain.steps.begin_finetuning()
    widened_rng = torch.get_rng_state()
    finetune_loss = widened.finetune_step(torch.arange(8))
    torch.set_rng_state(widened_rng)
    assert torch.equal(finetune_loss, plain.finetune_step(torch.arange(8)))


def test_train_range_factor_leaves_fixed_ranges_as_they_are():
    """Fixed ranges are the augmentation chosen for the model (the oracle, ``--fix``): parameter steps train on them
    whatever ``train_range_factor`` says, bit for bit; learned ranges are widened by it."""
    weights = []
    for factor in (0.5, 1.0):
        trainer = _trainer(hyper=AffineAugmentation.fixed({"rotation": 0.4}, num_samples=2), train_range_factor=factor)
        torch.manual_seed(0)
        trainer.parameter_step()
        weights.append(_weights(trainer))
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    learned = _trainer(hyper=AffineAugmentation(num_samples=2), train_range_factor=0.5)
    assert learned.steps.train_range_factor == 0.5  # learned ranges are widened


def test_train_range_factor_needs_a_transform_that_widens():
    with pytest.raises(PartitionArgumentError, match=r"train_range_factor=2.0 scales .* InputMask has no widened"):
        PartitionedTrainer(_pmodel(), (torch.randn(60, 4), torch.zeros(60)), PAPER, hyper=InputMask(4),
                           train_range_factor=2.0)  # fmt: skip
    with pytest.raises(PartitionArgumentError, match="train_range_factor must be"):
        _trainer(train_range_factor=0.0)
    aug = AffineAugmentation(num_samples=1, init=0.5)
    with aug.widened(3.0):
        with aug.widened(0.5):
            pass
        assert aug._spread == 3.0
    assert aug._spread == 1.0 and aug.hyperparameters()["rotation"] == 0.5


@pytest.mark.parametrize("every_partition", [False, True])
def test_train_range_factors_widen_each_named_range_by_its_own(every_partition):
    """``train_range_factors={"scale": 2.0}`` with ``train_range_factor=0.5``: a parameter step trains exactly as
    with the zoom twice as wide and the rotation half as wide (powers of 2 scale exactly), bit for bit, and the
    hyperparameter step scores the ranges themselves."""
    options = {"every_partition": every_partition, "warmup_steps": 10}

    def trainer(init, **factors):
        aug = AffineAugmentation(num_samples=2, generators=["rotation", "scale"], init=init)
        return _trainer(hyper=aug, **factors, **options)

    own = trainer({"rotation": 0.4, "scale": 0.2}, train_range_factor=0.5, train_range_factors={"scale": 2.0})
    alike = trainer({"rotation": 0.2, "scale": 0.4}, train_range_factor=1.0)
    assert own.steps.train_range_factor == {"rotation": 0.5, "scale": 2.0}
    for each in (own, alike):
        torch.manual_seed(0)
        each.run(2, finetune_steps=0, progress=False) if every_partition else each.parameter_step()
    assert all(torch.equal(a, b) for a, b in zip(_weights(own), _weights(alike)))
    plain = trainer({"rotation": 0.4, "scale": 0.2}, train_range_factor=1.0)
    plain.pmodel.load_state_dict(own.pmodel.state_dict())
    rng = torch.get_rng_state()
    _, hyper_loss = own.hyper_step(2, torch.arange(4))
    torch.set_rng_state(rng)
    assert torch.equal(hyper_loss, plain.hyper_step(2, torch.arange(4))[1])


def test_train_range_factors_name_ranges_of_the_transform():
    refusal = r"train_range_factors names scale, but AffineAugmentation's ranges are translation_x, .*shear; name its"
    with pytest.raises(PartitionArgumentError, match=refusal):
        _trainer(hyper=AffineAugmentation(num_samples=2), train_range_factors={"scale": 1.0})
    with pytest.raises(PartitionArgumentError, match=r"train_range_factors=\{'rotation': 1.0\} scales .* InputMask"):
        PartitionedTrainer(_pmodel(), (torch.randn(60, 4), torch.zeros(60)), PAPER, hyper=InputMask(4),
                           train_range_factors={"rotation": 1.0})  # fmt: skip
    with pytest.raises(PartitionArgumentError, match="train_range_factors rotation=0 must be a finite factor > 0"):
        _trainer(train_range_factors={"rotation": 0})
    with pytest.raises(PartitionArgumentError, match="train_range_factors has unknown range"):
        _trainer(train_range_factors={"zoom": 1.0})


def test_the_hyper_scheduler_follows_hyperparameter_steps():
    scheduler = partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    trainer = _trainer(hyper_scheduler=scheduler, hyper_every=2)
    for _ in range(4):
        trainer.iteration()
    assert trainer.steps.stepper.hyper_optimizer.param_groups[0]["lr"] == 0.25  # two hyper steps in four iterations
    assert trainer.optimizer.param_groups[0]["lr"] == 1.0


# --- the fine-tuning phase ----------------------------------------------------------------------------


def test_a_finetuning_step_trains_every_weight_on_all_data_through_the_final_subnetwork():
    trainer = _trainer()
    trainer.steps.begin_finetuning()
    ranges = trainer.steps.hyper.ranges.detach().clone()
    indices = torch.arange(60)[::3]  # examples of every chunk
    assert all(any(int(i) in set(trainer.chunks.chunk(k).tolist()) for i in indices) for k in (1, 2, 3))
    before = _weights(trainer)
    rng = torch.get_rng_state()
    trainer.finetune_step(indices)
    got = [a - b for a, b in zip(before, _weights(trainer))]

    reference = _trainer()
    torch.set_rng_state(rng)
    x, y = reference.examples.tensors
    params = [p for k in (1, 2, 3) for p in reference.pmodel.partition_parameters(k)]
    with torch.no_grad():
        xs = reference.steps.hyper(x[indices])
    loss = -reference.steps.likelihood(reference.pmodel(xs, subnetwork=3), y[indices], 2).mean()
    want = torch.autograd.grad(loss, params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert all(g.abs().sum() > 0 for g in got)  # every partition moved
    assert torch.equal(trainer.steps.hyper.ranges, ranges)  # psi did not


def test_finetuning_draws_from_every_chunk_and_never_steps_psi():
    trainer = _trainer(hyper_every=1)
    drawn = torch.cat([trainer.sampler.finetune_batch() for _ in range(40)])
    assert set(drawn.tolist()) == set(range(60))
    result = trainer.run(10, finetune_steps=4, eval_every=2, progress=False)
    ranges = [r["hyperparameters"]["rotation"] for r in result.history]
    phases = [r["phase"] for r in result.history]
    assert phases == ["partitioned"] * 3 + ["finetune"] * 2 and result.finetune_start == 6
    assert len(set(ranges[2:])) == 1 and len(set(ranges[:3])) > 1  # learned, then frozen
    assert [r["lml"] is None for r in result.history] == [False] * 3 + [True] * 2
    assert result.lml == result.history[2]["lml"]


def test_the_lr_schedule_spans_both_phases_and_weight_decay_is_no_longer_scaled():
    cosine = partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=12, eta_min=0.0)
    adamw = partial(torch.optim.AdamW, lr=0.1, weight_decay=0.01)
    trainer = _trainer(optimizer=adamw, scheduler=cosine)
    assert trainer.optimizer.param_groups[0]["weight_decay"] > 0.01  # partition 1: scaled by N / |D_1|
    lrs = []

    class Record(TrainingHook):
        def before_finetuning(self, trainer):
            lrs.append(trainer.optimizer.param_groups[0]["lr"])

    trainer.hooks.append(Record())
    trainer.run(12, finetune_steps=4, progress=False)
    assert lrs == [pytest.approx(0.1 * (1 + math.cos(math.pi * 8 / 12)) / 2)]
    assert trainer.steps.stepper.scheduler.last_epoch == 12
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} == {0.01}


@pytest.mark.parametrize("patience", [None, 1])  # the planned switch, and one patience moves earlier
def test_a_restarted_schedule_anneals_from_lr_over_the_finetuning_steps_alone(patience):
    """``finetune_schedule="restart"``: the partitioned phase follows the run's cosine (over all 12 steps), and
    after fine-tuning's step t of T the rate is eta_min + (lr - eta_min)(1 + cos(pi t / T)) / 2, eta_min = lr / 100."""
    adam = partial(torch.optim.Adam, lr=0.1)
    trainer = _trainer(optimizer=adam, lr_schedule="cosine", steps=12, finetune_schedule="restart")
    lrs = []
    trainer.hooks.append(_LearningRates(lrs))
    result = trainer.run(finetune_steps=4, eval_every=1, patience=patience, progress=False)
    switch, eta_min = result.finetune_start, 0.1 / 100
    cosine = lambda t, steps: eta_min + (0.1 - eta_min) * (1 + math.cos(math.pi * t / steps)) / 2  # noqa: E731
    assert lrs[:switch] == pytest.approx([cosine(t, 12) for t in range(1, switch + 1)])  # after iteration t
    assert lrs[switch:] == pytest.approx([cosine(t, 12 - switch) for t in range(1, 12 - switch + 1)])
    assert lrs[-1] == pytest.approx(eta_min) and (patience is None) == (switch == 8)


def test_a_restarted_constant_schedule_keeps_lr_and_a_users_scheduler_is_refused():
    trainer = _trainer(optimizer=partial(torch.optim.Adam, lr=0.1), steps=6, finetune_schedule="restart")
    lrs = []
    trainer.hooks.append(_LearningRates(lrs))
    trainer.run(finetune_steps=2, eval_every=1, progress=False)
    assert lrs == [0.1] * 6
    cosine = partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=12)
    with pytest.raises(PartitionArgumentError, match="finetune_schedule='restart' restarts the configured lr_sched"):
        _trainer(scheduler=cosine, finetune_schedule="restart")
    # restart is the recommended default: a user's scheduler spans both phases unless a configuration or the
    # keyword asks for the restart (which the trainer then refuses, as above)
    assert TrainConfig.recommended().finetuning.schedule == "restart"
    assert resolve("fit", None, {"scheduler": cosine})[0].finetuning.schedule == "continue"
    assert resolve("fit", TrainConfig.recommended(), {"scheduler": cosine})[0].finetuning.schedule == "restart"


class _LearningRates(TrainingHook):
    """Records the weights' learning rate after every iteration (``eval_every=1``)."""

    def __init__(self, lrs):
        self.lrs = lrs

    def after_evaluation(self, trainer, record, improved):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def test_patience_ends_partitioned_training_early_and_finetuning_runs_to_the_end():
    trainer = _trainer()
    calls = []

    class Record(TrainingHook):
        def before_finetuning(self, trainer):
            calls.append((trainer.step, trainer.history[-1]["phase"]))

    trainer.hooks.append(Record())
    result = trainer.run(30, finetune_steps=4, eval_every=1, patience=1, progress=False)
    assert result.steps == 30 and result.stopped_early
    assert calls == [(result.finetune_start, "partitioned")] and result.finetune_start < 26


def test_finetuning_arguments_are_checked():
    with pytest.raises(PartitionArgumentError, match="finetune_steps \\(4\\) must be less than steps \\(4\\)"):
        fit(_pmodel(), _images(), PAPER, steps=4, finetune_steps=4)
    with pytest.raises(PartitionArgumentError, match="finetune_steps must be an int >= 0"):
        fit(_pmodel(), _images(), PAPER, steps=4, finetune_steps=-1)
    with pytest.raises(PartitionTypeError, match=r"hooks\[0\] must be a TrainingHook"):
        fit(_pmodel(), _images(), PAPER, steps=4, hooks=[print])


def _fit(pmodel, **kwargs):
    options = {
        "steps": 12,
        "finetune_steps": 5,
        "hyper_chunks": "all",
        "hyper_samples": 3,
        "scheduler": partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=12, eta_min=1e-4),
        **kwargs,
    }
    return fit(
        pmodel,
        _images(),
        PAPER,
        hyper=AffineAugmentation(num_samples=2),
        batch_size=8,
        optimizer=partial(torch.optim.Adam, lr=1e-2, weight_decay=1e-3),
        hyper_optimizer=partial(torch.optim.Adam, lr=0.05),
        eval_every=3,
        seed=3,
        progress=False,
        **options,
    )


@pytest.mark.parametrize("stop_at", [6, 7, 9])  # partitioned; the switch (7 = 12 - 5); fine-tuning
@pytest.mark.parametrize("schedule", ["continue", "restart"])
def test_a_run_resumed_in_either_phase_equals_the_uninterrupted_one(tmp_path, stop_at, schedule):
    options = (
        {} if schedule == "continue" else {"scheduler": None, "lr_schedule": "cosine", "finetune_schedule": schedule}
    )
    reference = _pmodel()
    expected = _fit(reference, **options)
    assert expected.finetune_start == 7

    stop = [lambda trainer, record: record["step"] == stop_at]
    _fit(_pmodel(), checkpoint_dir=tmp_path, callbacks=stop, **options)
    assert json.loads((tmp_path / "resume" / "state.json").read_text())["step"] == stop_at
    resumed_model = _pmodel()
    resumed = _fit(resumed_model, resume=tmp_path / "resume", **options)

    strip = lambda history: [{k: v for k, v in r.items() if k != "seconds"} for r in history]  # noqa: E731
    assert resumed.finetune_start == 7 and strip(resumed.history) == strip(expected.history)
    assert resumed.hyperparameters == expected.hyperparameters
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_resume_directory_from_before_the_estimator_options_is_refused_with_one_message(tmp_path):
    """Issue 27: states of the project's unreleased earlier formats are no longer converted on load (this test
    used to check that one resumed); one message names what it lacks, and nothing is loaded."""
    _fit(_pmodel(), checkpoint_dir=tmp_path, hyper_chunks="one", hyper_samples=None, steps=4, finetune_steps=0)
    state_path = tmp_path / "resume" / "state.json"
    state = json.loads(state_path.read_text())
    for key in ("hyper_chunks", "hyper_samples"):
        del state["fingerprint"][key]
    for key in ("hyper_scheduler", "finetune_start"):
        del state[key]
    state_path.write_text(json.dumps(state))
    paper = {"hyper_chunks": "one", "hyper_samples": None, "finetune_steps": 0}
    pmodel = _pmodel()
    before = [p.detach().clone() for p in pmodel.parameters()]
    with pytest.raises(PartitionCheckpointError, match=r"earlier development version.*fingerprint\.hyper_chunks"):
        _fit(pmodel, resume=tmp_path / "resume", steps=6, **paper)
    assert all(torch.equal(a, p) for a, p in zip(before, pmodel.parameters()))


def test_recalibrating_a_copy_mid_run_changes_no_later_draw():
    """``partition-fx train`` recalibrates a copy of the model when fine-tuning begins (to report the partitioned
    accuracy); with dropout, that pass drew from torch's global generator and shifted every later dropout mask,
    so the command trained other bits than ``fit`` with the same seed."""

    class RecalibrateACopy(TrainingHook):
        def before_finetuning(self, trainer):
            recalibrate_norm_statistics(copy.deepcopy(trainer.pmodel), trainer.examples)

    def trained(hooks):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
        pmodel = partitionify(model, 2)
        x, y = torch.randn(64, 4, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 2
        fit(pmodel, (x, y), PAPER, steps=12, finetune_steps=6, batch_size=16, seed=3, progress=False, hooks=hooks)
        return [p.detach().clone() for p in pmodel.parameters()]

    for a, b in zip(trained([]), trained([RecalibrateACopy()])):
        assert torch.equal(a, b)


@pytest.mark.parametrize("finetune_steps", [8, 0])  # patience begins fine-tuning early; patience ends the run
def test_a_run_stopped_where_patience_ended_partitioned_training_resumes_to_the_uninterrupted_run(
    tmp_path, finetune_steps
):
    """The run's schedule applies patience's decision at the evaluation, before the checkpoint is written there, and
    the resume state carries it: a run interrupted right after that evaluation fine-tunes from there (or ends) as
    the uninterrupted run does, instead of training partitioned to the planned switch."""
    options = {"steps": 24, "finetune_steps": finetune_steps, "patience": 1}
    reference = _pmodel()
    expected = _fit(reference, **options)
    ended_at = expected.finetune_start if finetune_steps else expected.steps
    assert expected.stopped_early and ended_at < 24 - finetune_steps

    stop = [lambda trainer, record: record["step"] == ended_at]
    _fit(_pmodel(), checkpoint_dir=tmp_path, callbacks=stop, **options)
    state = json.loads((tmp_path / "resume" / "state.json").read_text())
    assert (state["step"], state["partitioned_ended_at"]) == (ended_at, ended_at)
    resumed_model = _pmodel()
    resumed = _fit(resumed_model, resume=tmp_path / "resume", **options)

    strip = lambda history: [{k: v for k, v in r.items() if k != "seconds"} for r in history]  # noqa: E731
    assert strip(resumed.history) == strip(expected.history) and resumed.stopped_early
    assert (resumed.steps, resumed.finetune_start) == (expected.steps, expected.finetune_start)
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), name
