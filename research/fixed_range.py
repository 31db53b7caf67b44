"""The default job's partitioned run with one augmentation range FIXED (every other at 0), trained on its planned
draws a few iterations at a time, so that a diagnostic can score the weights mid-run, change the range, or branch
the run (:func:`train_at_fixed_range`, :class:`FixedRangeRun`).

The job is ``partition-fx train``'s, built by ``partition_fx.cli.train.train_job``; its iterations are the ones
``PartitionedBatchSampler`` plans (parameter steps only: the range is fixed), taken by ``TrainingSteps.take``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from partition_fx import PartitionedModel
from partition_fx.cli.train import train_job
from partition_fx.job.build import TrainJob
from partition_fx.training import DataChunks, Draw, PartitionedBatchSampler, TrainingSteps, split_into_chunks


def train_draws(steps: TrainingSteps, draws: Sequence[Draw], x: torch.Tensor, y: torch.Tensor) -> None:
    """Take ``draws`` (the sampler's planned iterations) on the examples ``x``, ``y`` they index."""
    for draw in draws:
        rows = steps.local_indices(draw)
        steps.take(draw, x[rows], y[rows])


@dataclass
class FixedRangeRun:
    """The default job's partitioned run with ``generator``'s range fixed: its job, training steps, chunks, the
    training split, the run's draws, how many of them it has trained and in how many seconds."""

    job: TrainJob
    generator: str
    steps: TrainingSteps
    chunks: DataChunks
    x: torch.Tensor
    y: torch.Tensor
    draws: list[Draw]
    trained: int = 0
    seconds: float = 0.0

    @property
    def pmodel(self) -> PartitionedModel:
        return self.job.pmodel

    def train_to(self, step: int) -> None:
        """Train the run's draws up to iteration ``step``."""
        started = time.perf_counter()
        train_draws(self.steps, self.draws[self.trained : step], self.x, self.y)
        self.trained = max(self.trained, step)
        self.seconds += time.perf_counter() - started

    def set_range(self, value: float) -> None:
        """Fix the generator's range at ``value`` from the next iteration on."""
        hyper = self.job.hyper
        assert hyper is not None, "a fixed-range run's job has its augmentation"
        with torch.no_grad():
            hyper.ranges[hyper.generators.index(self.generator)] = value


def train_at_fixed_range(
    data: str, generator: str, r: float, seed: int, *, steps: int, image_size: int, total: int | None = None
) -> FixedRangeRun:
    """The default job (no fine-tuning, ``image_size`` pixels, ``total`` iterations planned, default ``steps``)
    with ``generator``'s range fixed at ``r`` (every other range 0; Augerino's set for scale and stretch, else the
    x/y set), trained for its first ``steps`` iterations from torch's seed ``seed``."""
    argv = ["--data", data, "--seed", str(seed), "--steps", str(total or steps), "--finetune-steps", "0",
            "--device", "cpu", "--quiet", "--image-size", str(image_size), "--fix", f"{generator}={r}",
            "--generators", "augerino" if generator in ("scale", "stretch") else "xy"]  # fmt: skip
    job = train_job(argv)
    x, y = job.data.train.tensors
    chunks = split_into_chunks(len(x), job.pmodel.proportions, seed)
    training = TrainingSteps.create(job.pmodel, chunks, hyper=job.hyper, config=job.config)
    draws = list(PartitionedBatchSampler(chunks, job.config, hyperparameters=False).draws())
    fixed = FixedRangeRun(job, generator, training, chunks, x, y, draws)
    torch.manual_seed(seed)
    fixed.train_to(steps)
    return fixed
