"""The timeline of a run, in one object every runner asks: :class:`Schedule` says which phase an iteration is in
(partitioned training or fine-tuning), whether it takes a hyperparameter step, whether the run evaluates after
it, where partitioned training ends, and it applies the one decision that moves the timeline, "end partitioned
training now" (a run's patience); a resumed run finds that decision in its state.

Asked by ``fit``'s trainer, by :meth:`TrainingSteps.take <partition_fx.training.TrainingSteps.take>` (your own
loop's steps), by :class:`PartitionedBatchSampler` (which draws your ``DataLoader``'s batches) and by the
Lightning module, so that all of them run the same iterations; Lightning's fit loop and timm's scheduler-driven
loop keep their timelines in one object the same way.

Steps count iterations done: iteration ``step`` is the one that completes ``step`` (1 to :attr:`Schedule.end`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TypedDict

import torch
from torch.utils.data import Sampler

from ...errors import PartitionArgumentError
from ...job.train_config import TrainConfig
from ..objective.estimators import HyperEstimator, estimator_for
from .chunks import DataChunks, PartitionedSampler
from .schemes import Draw, IterationScheme, scheme_for


class ScheduleState(TypedDict):
    """What a resumed run needs of a schedule: when fine-tuning began and when partitioned training was ended
    early (None: not yet, or as planned)."""

    finetune_start: int | None
    partitioned_ended_at: int | None


class Schedule:
    """The timeline of a run of ``end`` iterations: partitioned training, then the last ``finetune_steps``
    fine-tuning the final subnetwork; an evaluation every ``eval_every`` iterations, after the last partitioned
    one and at the end; a hyperparameter step in every ``hyper_every``-th iteration after ``warmup_steps``, when
    the run ``learns`` hyperparameters.

    It also holds where the run is on it: :attr:`finetune_start` (set by ``TrainingSteps.begin_finetuning``, the
    one switch of the phase) and :attr:`partitioned_ended_at` (set by :meth:`end_partitioned_training`).

    Example::

        >>> schedule = Schedule.configured(TrainConfig.recommended(steps=20))  # fine-tunes the last 8
        >>> [step for step in range(1, 21) if schedule.evaluates_at(step)], schedule.finetunes(13)
        ([12, 20], True)
        >>> schedule.end_partitioned_training(10)  # patience: fine-tune from here
        >>> schedule.finetunes(11), schedule.ended_early
        (True, True)
    """

    def __init__(
        self,
        end: int,
        *,
        eval_every: int,
        finetune_steps: int = 0,
        hyper_every: int = 1,
        warmup_steps: int = 0,
        learns: bool = True,
        occam_every: int = 0,
        occam_examples: int = 0,
    ) -> None:
        self.end = end
        """The iterations of the run (moved to where partitioned training ended when it ended early with no
        fine-tuning to follow)."""
        self.finetune_from: int | None = end - finetune_steps if finetune_steps else None
        """The last partitioned iteration: the ones after it fine-tune (None: none does)."""
        self.eval_every = eval_every
        self.hyper_every = hyper_every
        self.warmup_steps = warmup_steps
        self.learns = learns
        self.occam_every = occam_every
        """Every this many hyperparameter steps, the first included, refreshes the Occam term (0: there is none)."""
        self.occam_examples = occam_examples
        """The examples a refresh of the Occam term draws from all the data."""
        self.finetune_start: int | None = None
        """The step fine-tuning began at (None: it has not)."""
        self.partitioned_ended_at: int | None = None
        """The step partitioned training was ended at before its planned end (None: it was not)."""

    @classmethod
    def configured(cls, config: TrainConfig, learns: bool = True) -> Schedule:
        """The timeline ``config`` describes (its ``steps``, ``finetune_steps``, ``eval_every``, ``hyper_every``
        and ``warmup_steps``), with hyperparameter steps only if the run ``learns`` some.

        >>> Schedule.configured(TrainConfig.recommended(steps=400)).finetune_from
        240
        """
        return cls(
            config.optimization.steps,
            eval_every=config.eval_every,
            finetune_steps=config.finetune_steps,
            hyper_every=config.hyper.every,
            warmup_steps=config.hyper.warmup_steps,
            learns=learns,
            occam_every=config.hyper.occam_every if config.hyper.occam_term != "none" else 0,
            occam_examples=config.hyper.occam_examples,
        )

    def for_run(self, config: TrainConfig) -> Schedule:
        """The timeline of a run of ``config`` (a run's changed ``steps``, ``eval_every``, ...) from where this
        one is: its phase and an early end of partitioned training carried over.

        >>> schedule = Schedule.configured(TrainConfig.recommended(steps=20))
        >>> schedule.end_partitioned_training(4)
        >>> schedule.for_run(TrainConfig.recommended(steps=40)).finetune_from  # planned 24, ended at 4
        4
        """
        run = Schedule.configured(config, self.learns)
        run.load_state_dict(self.state_dict())
        return run

    # --- what each iteration is ------------------------------------------------------------------------------

    def finetunes(self, step: int) -> bool:
        """Whether iteration ``step`` fine-tunes (it comes after the last partitioned one)."""
        return self.finetune_from is not None and step > self.finetune_from

    def hyper_due(self, step: int) -> bool:
        """Whether iteration ``step``, if partitioned, takes a hyperparameter step.

        >>> schedule = Schedule(8, eval_every=4, hyper_every=2, warmup_steps=2)
        >>> [step for step in range(1, 9) if schedule.hyper_due(step)]
        [4, 6, 8]
        """
        return self.learns and step > self.warmup_steps and step % self.hyper_every == 0

    def occam_due(self, step: int) -> bool:
        """Whether iteration ``step``'s hyperparameter step refreshes the Occam term: the first hyperparameter
        step and every :attr:`occam_every`-th after it.

        >>> schedule = Schedule(20, eval_every=10, hyper_every=2, warmup_steps=2, occam_every=3)
        >>> [step for step in range(1, 21) if schedule.occam_due(step)]
        [4, 10, 16]
        """
        if not self.occam_every or not self.hyper_due(step):
            return False
        taken = step // self.hyper_every - self.warmup_steps // self.hyper_every - 1  # hyperparameter steps before
        return taken % self.occam_every == 0

    def evaluates_at(self, step: int) -> bool:
        """Whether the run estimates the LML (and a run with ``checkpoint_dir`` saves itself) once ``step``
        iterations are done: every :attr:`eval_every`, after the last partitioned iteration and at the end."""
        return step % self.eval_every == 0 or step == self.end or step == self.finetune_from

    def begins_finetuning(self, step: int) -> bool:
        """Whether fine-tuning begins once ``step`` iterations are done: the next iteration fine-tunes and the
        phase has not switched yet."""
        return self.finetune_start is None and self.finetunes(step + 1)

    @property
    def finetuning(self) -> bool:
        """Whether fine-tuning has begun (``TrainingSteps.begin_finetuning``)."""
        return self.finetune_start is not None

    @property
    def ended_early(self) -> bool:
        """Whether partitioned training was ended before its planned end (:meth:`end_partitioned_training`)."""
        return self.partitioned_ended_at is not None

    # --- what moves it ---------------------------------------------------------------------------------------

    def end_partitioned_training(self, step: int) -> None:
        """End partitioned training once ``step`` iterations are done: the fine-tuning the run plans begins
        after iteration ``step`` and runs to the end; a run that plans none ends at ``step``."""
        self.partitioned_ended_at = step
        if self.finetune_from is None:
            self.end = min(self.end, step)
        else:
            self.finetune_from = min(self.finetune_from, step)

    def began_finetuning(self, step: int) -> None:
        """Record that fine-tuning began once ``step`` iterations were done (``TrainingSteps.begin_finetuning``
        calls it when it switches the steps' phase)."""
        self.finetune_start = step

    # --- saving and restoring --------------------------------------------------------------------------------

    def state_dict(self) -> ScheduleState:
        """Where the run is on its timeline, as JSON-ready values."""
        return {"finetune_start": self.finetune_start, "partitioned_ended_at": self.partitioned_ended_at}

    def load_state_dict(self, state: ScheduleState) -> None:
        """Restore what :meth:`state_dict` returned; an early end of partitioned training is applied again."""
        self.finetune_start = state["finetune_start"]
        if state["partitioned_ended_at"] is not None:
            self.end_partitioned_training(state["partitioned_ended_at"])


def draw_iteration(
    scheme: IterationScheme,
    estimator: HyperEstimator | None,
    schedule: Schedule,
    sampler: PartitionedSampler,
    step: int,
    finetuning: bool,
) -> Draw:
    """The draws of iteration ``step`` in the phase ``finetuning`` says: a fine-tuning step's batch, or
    ``scheme``'s draws with a hyperparameter step by ``estimator`` when the ``schedule`` says one is due.

    An iteration's draws are a function of the sampler and the step alone, so the input pipeline can replay the
    iterations to come on a copy of the sampler (``training.sampling.chunks.planned_batches``).

    >>> from partition_fx.training import split_into_chunks
    >>> from partition_fx.training.sampling.schemes import Alternating
    >>> from partition_fx.training.objective.estimators import OneChunk
    >>> sampler = PartitionedSampler(split_into_chunks(20, (0.5, 0.5)), batch_size=3, seed=0)
    >>> schedule = Schedule(4, eval_every=2, hyper_every=2)
    >>> [len(draw_iteration(Alternating(), OneChunk(), schedule, sampler, s, False).hyper) for s in (1, 2)]
    [0, 1]
    """
    if finetuning:
        return Draw(sampler.finetune_batch(), None)
    draw = scheme.draw(sampler, estimator if schedule.hyper_due(step) else None)
    if estimator is not None and schedule.occam_due(step):
        return dataclasses.replace(draw, occam=sampler.examples(schedule.occam_examples))
    return draw


def configured_iterations(config: TrainConfig, learns: bool) -> tuple[IterationScheme, HyperEstimator | None]:
    """The scheme and hyperparameter estimator ``config`` names (none when the run ``learns`` no
    hyperparameters).

    >>> scheme, estimator = configured_iterations(TrainConfig(), learns=True)
    >>> scheme.name, estimator.name
    ('alternating', 'all')
    """
    runtime, hyper = config.runtime, config.hyper
    estimator = estimator_for(hyper.chunks, hyper.gradient) if learns else None
    return scheme_for(runtime.fused, runtime.every_partition), estimator


class PartitionedBatchSampler(Sampler[list[int]]):
    """The examples of a partitioned training run for your own ``DataLoader``: ``DataLoader(dataset,
    batch_sampler=PartitionedBatchSampler(chunks, config))`` yields one batch per iteration, the rows of
    :meth:`Draw.reads` one after another (the parameter step's, then each hyperparameter batch's), and
    :meth:`draws` yields the :class:`Draw` of each, so that ``steps.take(draw, x, y)`` (``TrainingSteps``)
    knows which rows train which partition and which score psi.

    The iterations are ``config``'s (``TrainConfig``, default ``TrainConfig()``, what ``fit`` trains with): its
    ``steps``, ``batch_size``, hyperparameter step (``hyper_every``, ``hyper_chunks``, ``hyper_batch_size``,
    ``warmup_steps``; none with ``hyperparameters=False``), scheme (``fused``, ``every_partition``), the last
    ``finetune_steps`` fine-tuning on all the data (its :attr:`schedule`), and ``seed``: the draws of ``fit`` with
    that configuration, iteration for iteration. Every pass over the sampler draws the same run again, from
    iteration ``start`` + 1 (a resumed loop's). ``chunks`` are the examples' split into the model's C chunks
    (``split_into_chunks``).

    >>> from partition_fx.training import split_into_chunks
    >>> config = TrainConfig.recommended(steps=4, batch_size=3, hyper_batch_size=2, hyper_every=2, seed=0)
    >>> batches = PartitionedBatchSampler(split_into_chunks(20, (0.5, 0.5)), config)
    >>> [len(indices) for indices in batches]  # 3 parameter examples, + 2 of chunk 2 every 2nd iteration
    [3, 5, 3, 3]
    >>> [draw.partitions for draw in batches.draws()][-1] is None  # the last 0.4: fine-tuning
    True
    """

    def __init__(
        self, chunks: DataChunks, config: TrainConfig | None = None, *, hyperparameters: bool = True, start: int = 0
    ) -> None:
        super().__init__()
        self.chunks = chunks
        self.config = config if config is not None else TrainConfig()
        if hyperparameters and chunks.num_chunks < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs at least 2 chunks (chunk k is scored by subnetwork k-1): split "
                "the data into the model's num_partitions >= 2 chunks, or pass hyperparameters=False"
            )
        self.scheme, self.estimator = configured_iterations(self.config, learns=hyperparameters)
        self.schedule = Schedule.configured(self.config, learns=hyperparameters)
        """The run's timeline, as ``fit``'s: which iterations fine-tune and which take a hyperparameter step."""
        steps = self.config.optimization.steps
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= steps:
            raise PartitionArgumentError(f"start must be the iterations done, an int in 0..{steps}; got {start!r}")
        self.start = start

    def __len__(self) -> int:
        return self.config.optimization.steps - self.start

    def __iter__(self) -> Iterator[list[int]]:
        for draw in self.draws():
            yield torch.cat(draw.reads()).tolist()

    def draws(self) -> Iterator[Draw]:
        """The :class:`Draw` of each iteration after ``start``, in order: what each batch of :meth:`__iter__` is."""
        optimization, schedule = self.config.optimization, self.schedule
        sampler = PartitionedSampler(
            self.chunks, optimization.batch_size, self.config.hyper.batch_size, self.config.runtime.seed
        )
        for step in range(1, optimization.steps + 1):
            draw = draw_iteration(self.scheme, self.estimator, schedule, sampler, step, schedule.finetunes(step))
            if step > self.start:
                yield draw
