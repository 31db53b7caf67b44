"""The input pipeline of the training steps: minibatches read by worker processes ahead of the steps that use
them, in the order the partitioned sampler will draw them.

A run's draws (which partition, which examples, the hyperparameter batches) are a function of the sampler's
generator and the step count alone, so the iterations to come can be replayed on a copy of the sampler
(:func:`planned_batches`, with :class:`PlannedSteps` standing in for the steps) before they run. Those index
batches drive a ``torch.utils.data.DataLoader`` (persistent workers, prefetching, pinned memory for CUDA), and
:class:`StepInputs` hands each step the batch it asks for. A batch read ahead is used only when its indices are
the ones asked for; any other request (the switch to fine-tuning, a resumed state, a step taken by hand) is read
directly and the read-ahead restarts from the sampler as it then is. A batch is ``dataset[i]`` for its indices
whoever decodes it, so a run is bit-identical whatever the number of workers, and a resumed run continues the
same stream.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from .chunks import Examples
from .estimators import HyperBatches
from .sampler import PartitionedSampler

Shard = Callable[..., tuple[torch.Tensor, ...]]
"""This process's share of a global minibatch (``TrainingSteps.local``)."""


class PlannedSteps:
    """Stands in for :class:`~partition_fx.training.steps.TrainingSteps` while iterations are replayed ahead of
    time: each step records the index batches the real one would read, in the order it would read them.

    >>> planned = PlannedSteps(step=3)
    >>> planned.parameter_step(2, torch.tensor([4, 5]))
    >>> planned.hyper_step([(1.0, 2, torch.tensor([6]))], "chunk D_2")
    >>> planned.advance(); planned.step, [i.tolist() for i in planned.take()]
    (4, [[4, 5], [6]])
    """

    def __init__(self, step: int, local: Shard | None = None) -> None:
        self.step = step
        self.local: Shard = local if local is not None else (lambda *tensors: tensors)
        self._reads: list[torch.Tensor] = []

    def take(self) -> list[torch.Tensor]:
        """The batches recorded since the last ``take``."""
        reads, self._reads = self._reads, []
        return reads

    def advance(self) -> None:
        self.step += 1

    def parameter_step(self, k: int, indices: torch.Tensor) -> None:
        self._reads.append(self.local(indices)[0])

    def finetune_step(self, indices: torch.Tensor) -> None:
        self._reads.append(self.local(indices)[0])

    def hyper_step(self, batches: HyperBatches, description: str) -> None:
        self._reads.extend(self.local(indices)[0] for _, _, indices in batches)

    def every_partition_step(self, ks: torch.Tensor, indices: torch.Tensor) -> None:
        self._reads.append(self.local(ks, indices)[1])

    def fused_step(self, ks: torch.Tensor, indices: torch.Tensor, hyper_batches: HyperBatches) -> None:
        self.every_partition_step(ks, indices)
        self.hyper_step(hyper_batches, "")


Iterate = Callable[[PartitionedSampler, Any], None]
"""One iteration of a run, given the sampler to draw from and the steps to take: a ``TrainingSteps``, or the
:class:`PlannedSteps` the iterations to come are replayed with (``schemes.Iterations.phase`` makes one)."""


def planned_batches(
    iterate: Iterate, sampler: PartitionedSampler, step: int, local: Shard | None = None
) -> Iterator[torch.Tensor]:
    """The index batches the iterations from ``step`` on will read, in order, endlessly: ``iterate`` replayed on
    a copy of ``sampler`` with :class:`PlannedSteps` (``sampler`` itself draws nothing).

    An iteration scheme that uses steps :class:`PlannedSteps` does not know ends the plan with one warning; the
    batches are then read as the steps ask for them, as without workers.

    >>> from partition_fx.training.chunks import split_into_chunks
    >>> sampler = PartitionedSampler(split_into_chunks(20, (0.5, 0.5)), batch_size=2, seed=0)
    >>> def iterate(sampler, steps):
    ...     steps.parameter_step(*sampler.parameter_batch())
    ...     steps.advance()
    >>> plan = planned_batches(iterate, sampler, step=0)
    >>> first = next(plan)
    >>> torch.equal(first, sampler.parameter_batch()[1])  # what the sampler then draws
    True
    """
    sampler = sampler.copy()
    steps = PlannedSteps(step, local)
    while True:
        try:
            iterate(sampler, steps)
        except AttributeError as error:  # a step PlannedSteps does not record
            warnings.warn(
                f"the input pipeline cannot read ahead for this iteration scheme ({error}); batches are read as the "
                "steps ask for them",
                stacklevel=2,
            )
            return
        yield from steps.take()


class _PlannedIndices:
    """The ``DataLoader``'s batch sampler: the batches of the current plan, each noted as it is handed out."""

    def __init__(self, inputs: StepInputs) -> None:
        self.inputs = inputs

    def __iter__(self) -> Iterator[list[int]]:
        assert self.inputs.plan is not None
        for indices in self.inputs.plan():
            self.inputs.pending.append(indices)
            yield indices.tolist()


class StepInputs:
    """The minibatches of the training steps: read ahead by ``examples.workers`` worker processes when the data
    is a map-style dataset (decoded from disk), else read when asked (tensors: one gather, as fast as ever).

    :meth:`start` begins reading ahead the batches of a plan (:func:`planned_batches`); :meth:`batch` returns
    the batch of the indices asked for, from the read-ahead when it holds them next, else read directly, the
    read-ahead then stopped (the next :meth:`start` replans); :meth:`close` ends the worker processes.

    >>> inputs = StepInputs(Examples((torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 0]))))
    >>> inputs.batch(torch.tensor([2, 0]))[1], inputs.reads_ahead
    (tensor([0, 0]), False)
    """

    def __init__(self, examples: Examples, device: torch.device | None = None) -> None:
        self.examples = examples
        self.device = device
        self.plan: Callable[[], Iterator[torch.Tensor]] | None = None
        self.pending: deque[torch.Tensor] = deque()
        """Index batches the loader has taken from the plan and not yet returned, oldest first."""
        self._loader: DataLoader | None = None
        self._iterator: Iterator[Any] | None = None
        self.read_ahead_batches = 0
        """Batches served from the read-ahead (the rest were read when asked)."""

    @property
    def reads_ahead(self) -> bool:
        """Whether batches are read ahead by worker processes (map-style data and ``workers`` > 0)."""
        return self.examples.tensors is None and self.examples.workers > 0

    def __len__(self) -> int:
        """The examples' count (``TrainingState`` fingerprints the data the steps read by it)."""
        return len(self.examples)

    def start(self, plan: Callable[[], Iterator[torch.Tensor]]) -> None:
        """Read ahead the batches ``plan()`` yields, unless reading ahead already (or there are no workers)."""
        if not self.reads_ahead or self._iterator is not None:
            return
        self.plan = plan
        self.pending.clear()
        if self._loader is None:
            self._loader = self.examples.loader(_PlannedIndices(self), self.device, persistent=True)
        self._iterator = iter(self._loader)  # persistent workers: the same processes, the plan read anew

    def stop(self) -> None:
        """Drop what was read ahead: the sampler or the phase has changed (resumed state, fine-tuning)."""
        self._iterator = None
        self.pending.clear()

    def close(self) -> None:
        """Stop and end the worker processes (a later :meth:`start` starts new ones)."""
        self.stop()
        self._loader = None

    def batch(self, indices: torch.Tensor, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of the examples ``indices`` on ``device``: the next batch read ahead when it is
        these examples, else read now."""
        if self._iterator is not None and self.pending and torch.equal(self.pending[0], indices):
            self.pending.popleft()
            x, y = next(self._iterator)
            self.read_ahead_batches += 1
            return self.examples.to_device(x, y, device)
        if self._iterator is not None:
            self.stop()
        return self.examples.batch(indices, device)
