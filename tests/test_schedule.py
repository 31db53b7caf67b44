"""The run's timeline (``training.sampling.schedule.Schedule``) against its definition, and every runner asking it:
``fit``'s trainer evaluates and switches phase exactly where the schedule says, the batch sampler of your own loop draws
the phases and hyperparameter steps it says, and an early end of partitioned training moves both the switch and
the evaluations.

The definition (``docs/training.md``): a run of ``steps`` iterations fine-tunes its last ``finetune_steps``;
it evaluates every ``eval_every`` iterations, after the last partitioned one and at the end; iteration ``s``
takes a hyperparameter step when ``s > warmup_steps`` and ``s % hyper_every == 0``.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_for_tests import small_images, small_partitioned_cnn

from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedBatchSampler, Schedule, fit, split_into_chunks


@st.composite
def timelines(draw):
    steps = draw(st.integers(1, 60))
    return {
        "steps": steps,
        "finetune_steps": draw(st.integers(0, steps - 1)),
        "eval_every": draw(st.integers(1, 25)),
        "hyper_every": draw(st.integers(1, 5)),
        "warmup_steps": draw(st.integers(0, 10)),
    }


@settings(max_examples=200, deadline=None)
@given(timelines())
def test_the_schedule_is_its_definition(options):
    schedule = Schedule.configured(TrainConfig.recommended(**options))
    steps, finetune, every = options["steps"], options["finetune_steps"], options["eval_every"]
    for step in range(1, steps + 1):
        assert schedule.finetunes(step) == (finetune > 0 and step > steps - finetune)
        assert schedule.evaluates_at(step) == (step % every == 0 or step == steps or step == steps - finetune)
        assert schedule.hyper_due(step) == (step > options["warmup_steps"] and step % options["hyper_every"] == 0)
    assert not Schedule.configured(TrainConfig.recommended(**options), learns=False).hyper_due(steps)


@settings(max_examples=100, deadline=None)
@given(timelines(), st.data())
def test_ending_partitioned_training_moves_the_switch_or_the_end_and_a_run_carries_it(options, data):
    config = TrainConfig.recommended(**options)
    steps, finetune = options["steps"], options["finetune_steps"]
    partitioned = steps - finetune
    ended_at = data.draw(st.integers(1, partitioned))
    schedule = Schedule.configured(config)
    schedule.end_partitioned_training(ended_at)
    assert schedule.ended_early
    if finetune:
        assert [schedule.finetunes(s) for s in range(1, steps + 1)] == [s > ended_at for s in range(1, steps + 1)]
        assert schedule.end == steps
    else:
        assert schedule.end == ended_at and not any(schedule.finetunes(s) for s in range(1, steps + 1))
    carried = Schedule.configured(config).for_run(config)  # a resumed run's: nothing carried yet
    carried.load_state_dict(schedule.state_dict())
    assert (carried.end, carried.finetune_from) == (schedule.end, schedule.finetune_from)


@settings(max_examples=60, deadline=None)
@given(timelines(), st.integers(0, 3))
def test_the_batch_sampler_draws_the_phases_and_hyperparameter_steps_of_the_schedule(options, start):
    config = TrainConfig.recommended(**options, batch_size=2, hyper_batch_size=1, seed=0)
    start = min(start, options["steps"])
    batches = PartitionedBatchSampler(split_into_chunks(30, (0.5, 0.3, 0.2)), config, start=start)
    schedule = Schedule.configured(config)
    for step, draw in enumerate(batches.draws(), start=start + 1):
        assert (draw.partitions is None) == schedule.finetunes(step)
        assert bool(draw.hyper) == (not schedule.finetunes(step) and schedule.hyper_due(step))


def _fit(steps, **options):
    return fit(
        small_partitioned_cnn(),
        small_images(60),
        TrainConfig.paper(),
        steps=steps,
        batch_size=8,
        seed=0,
        progress=False,
        **options,
    )


def test_fit_evaluates_and_begins_finetuning_where_the_schedule_says():
    config = TrainConfig.paper(steps=13, finetune_steps=5, eval_every=3)
    schedule = Schedule.configured(config)
    result = _fit(13, finetune_steps=5, eval_every=3)
    assert [r["step"] for r in result.history] == [s for s in range(1, 14) if schedule.evaluates_at(s)]
    assert [r["phase"] for r in result.history] == ["partitioned"] * 3 + ["finetune"] * 3  # 3, 6, 8 | 9, 12, 13
    assert result.finetune_start == schedule.finetune_from == 8


def test_patience_ends_partitioned_training_through_the_schedule_and_stops_a_run_that_plans_no_finetuning():
    torch.manual_seed(0)
    ended = _fit(40, finetune_steps=0, eval_every=1, patience=1)
    assert ended.stopped_early and ended.steps == ended.history[-1]["step"] < 40
    assert ended.finetune_start is None
