"""The data of partitioned training: the chunks D_1..D_C, the sampler that draws each iteration's partition and
examples (appendix I.1), and the input pipeline that reads their minibatches.

Chunk k (1-based, like subnetwork k) holds the examples partition k is the last to train on; the partitioned
marginal likelihood scores chunk k with subnetwork k-1, which never saw it.

A run's draws (which partition, which examples, the hyperparameter batches) are a function of the sampler's
generator and the step count alone, so the iterations to come can be replayed on a copy of the sampler
(:func:`planned_batches`) before they run. Those index batches drive a ``torch.utils.data.DataLoader``
(persistent workers, prefetching, pinned memory for CUDA), and :class:`StepInputs` hands each step the batch it
asks for. A batch read ahead is used only when its indices are the ones asked for; any other request (the switch
to fine-tuning, a resumed state, a step taken by hand) is read directly and the read-ahead restarts from the
sampler as it then is. A batch is ``dataset[i]`` for its indices whoever decodes it, so a run is bit-identical
whatever the number of workers, and a resumed run continues the same stream.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from ..._validation import check_partition, check_proportions
from ...errors import PartitionArgumentError, PartitionTypeError
from ...fx.assign import partition_sizes

# --- chunks and examples ---------------------------------------------------------------------------------------------

ScoredIndices = list[tuple[float, int, torch.Tensor]]
"""``[(weight, k, indices)]``: examples of chunk k, scored by subnetwork k-1, their mean loss weighted by
``weight``; a hyperparameter step's loss is the weighted sum (``lml.hyper_loss``)."""
InnerIndices = list[tuple[int, torch.Tensor]]
"""``[(p, indices)]``: examples of D_1:p on which partition p's training loss is differentiated, for a
hyper-gradient through training (``training.objective.implicit``)."""


@dataclass(frozen=True)
class DataChunks:
    """The example indices of each chunk D_1..D_C (each sorted ascending).

    >>> chunks = split_into_chunks(10, (0.8, 0.1, 0.1), seed=0)
    >>> chunks.sizes
    [8, 1, 1]
    >>> len(chunks.prefix(2))  # D_1:2, the data partition 2 trains on
    9
    """

    indices: tuple[torch.Tensor, ...]
    _prefixes: list[torch.Tensor] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for k, idx in enumerate(self.indices, start=1):
            if idx.numel() == 0:
                raise PartitionArgumentError(
                    f"data chunk {k} of {len(self.indices)} is empty ({self.sizes}); every chunk needs examples: "
                    "use more data, fewer partitions, or larger proportions for the small chunks"
                )
        running: list[torch.Tensor] = []
        for idx in self.indices:
            running.append(idx)
            self._prefixes.append(torch.cat(running))

    @property
    def num_chunks(self) -> int:
        return len(self.indices)

    @property
    def sizes(self) -> list[int]:
        return [int(idx.numel()) for idx in self.indices]

    def chunk(self, k: int) -> torch.Tensor:
        """The indices of D_k (k in 1..C)."""
        return self.indices[k - 1]

    def prefix(self, k: int) -> torch.Tensor:
        """The indices of D_1:k = D_1 u ... u D_k (k in 1..C)."""
        return self._prefixes[k - 1]


def split_into_chunks(num_examples: int, proportions: Sequence[float], seed: int = 0) -> DataChunks:
    """Split ``range(num_examples)`` into chunks with ``proportions`` (largest-remainder sizes), at random
    but reproducibly: the permutation comes from a CPU generator seeded with ``seed``.

    >>> split_into_chunks(5, (0.6, 0.4), seed=1).sizes
    [3, 2]
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise PartitionArgumentError(f"the dataset must hold at least one example, got {num_examples!r}")
    props = check_proportions(proportions, len(proportions))
    sizes = partition_sizes(num_examples, props)
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed))
    return DataChunks(tuple(part.sort().values for part in torch.split(order, sizes)))


def chunks_from_assignment(assignment: torch.Tensor | Sequence[int], num_chunks: int) -> DataChunks:
    """Chunks from a user's assignment of examples to chunks (values 1..C; e.g. by client id).

    >>> chunks_from_assignment([1, 2, 1, 1], 2).sizes
    [3, 1]
    """
    a = torch.as_tensor(assignment)
    if a.dim() != 1 or a.is_floating_point() or a.dtype == torch.bool:
        raise PartitionTypeError(
            f"chunk assignment must be a 1-D integer tensor, got {a.dtype} of shape {tuple(a.shape)}"
        )
    if a.numel() and (int(a.min()) < 1 or int(a.max()) > num_chunks):
        raise PartitionArgumentError(
            f"chunk assignment values must be in 1..{num_chunks} (chunk k is D_k), got {int(a.min())}..{int(a.max())}"
        )
    return DataChunks(tuple(torch.nonzero(a == k).flatten() for k in range(1, num_chunks + 1)))


def resolve_chunks(
    chunks: DataChunks | torch.Tensor | Sequence[int] | None,
    num_examples: int,
    proportions: Sequence[float],
    seed: int,
) -> DataChunks:
    """The data chunks of a run: ``chunks`` as given (``DataChunks``, or one chunk id 1..C per example), or a
    random split of ``num_examples`` with ``proportions`` from ``seed``; checked against the data and C.

    >>> resolve_chunks(None, 10, (0.8, 0.2), seed=0).sizes
    [8, 2]
    >>> resolve_chunks([1, 2, 2], 3, (0.5, 0.5), seed=0).sizes
    [1, 2]
    """
    c, n = len(proportions), num_examples
    if chunks is None:
        resolved = split_into_chunks(n, proportions, seed)
    elif isinstance(chunks, DataChunks):
        resolved = chunks
    else:
        try:
            assignment = torch.as_tensor(chunks)
        except (TypeError, ValueError, RuntimeError) as e:
            raise PartitionTypeError(
                f"chunks must be DataChunks or one chunk id 1..{c} per example (a tensor or a sequence of ints), "
                f"got {type(chunks).__name__} ({e})"
            ) from None
        if assignment.dim() == 1 and assignment.numel() != n:
            raise PartitionArgumentError(
                f"chunks assigns {assignment.numel()} examples but the dataset has {n}: one chunk id per example"
            )
        try:
            resolved = chunks_from_assignment(assignment, c)
        except (PartitionArgumentError, PartitionTypeError) as e:
            raise type(e)(f"chunks: {e}") from None
    if resolved.num_chunks != c:
        raise PartitionArgumentError(f"{resolved.num_chunks} data chunks for a model with {c} partitions")
    if max(int(idx.max()) for idx in resolved.indices) >= n:
        raise PartitionArgumentError(f"the chunks index examples beyond the dataset's {n}")
    return resolved


class BatchReader(Protocol):
    """What the steps read minibatches from: :class:`Examples`, or the input pipeline's ``StepInputs``."""

    def batch(self, indices: torch.Tensor, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of the examples ``indices`` on ``device``."""
        ...


def default_workers(workers: int | None, dataset: Any) -> int:
    """The input pipeline's worker processes: ``workers`` if given; else min(4, CPUs - 1) for images this package
    reads from disk (``datasets.images.DecodedImages``: deterministic, safe to decode in any process), and 0 for
    any other dataset, whose ``__getitem__`` may draw random numbers or hold what a worker cannot.

    >>> default_workers(2, None), default_workers(None, (torch.zeros(2), torch.zeros(2)))
    (2, 0)
    """
    if workers is not None:
        return workers
    from ...datasets.images import DecodedImages

    if not isinstance(dataset, DecodedImages):
        return 0
    return max(0, min(4, (os.cpu_count() or 1) - 1))


class Examples:
    """Batches of ``(inputs, targets)`` from a dataset by index: a fast path for tensors (one gather),
    ``dataset[i]`` + ``default_collate`` for any other map-style dataset of pairs, which ``workers`` processes
    decode ahead when read through :meth:`batches` or the input pipeline (``training.sampling.chunks``), ``prefetch``
    batches each, into pinned memory when the device is CUDA.

    >>> ex = Examples((torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 0])))
    >>> ex.batch(torch.tensor([2, 0]))
    (tensor([[4., 5.],
            [0., 1.]]), tensor([0, 0]))
    >>> [y.tolist() for _, y in ex.batches([torch.tensor([0]), torch.tensor([1, 2])])]
    [[0], [1, 0]]
    """

    def __init__(self, dataset: Any, *, workers: int = 0, prefetch: int = 2) -> None:
        self.tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        self.workers = workers
        self.prefetch = prefetch
        if isinstance(dataset, TensorDataset):
            dataset = dataset.tensors
        if isinstance(dataset, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in dataset):
            if len(dataset) != 2:
                raise PartitionArgumentError(f"a tensor dataset needs (inputs, targets), got {len(dataset)} tensors")
            x, y = dataset
            if x.shape[0] != y.shape[0]:
                raise PartitionArgumentError(
                    f"inputs and targets differ in length: {x.shape[0]} inputs, {y.shape[0]} targets"
                )
            self.tensors = (x, y)
            self.dataset: Any = None
        elif isinstance(dataset, Dataset) and hasattr(dataset, "__len__"):
            self.dataset = dataset
        else:
            raise PartitionTypeError(
                "dataset must be a map-style torch Dataset of (input, target) pairs, a TensorDataset, or a tuple "
                f"(inputs, targets) of tensors; got {type(dataset).__name__}"
            )
        if len(self) == 0:
            raise PartitionArgumentError("the dataset is empty")

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0]) if self.tensors is not None else len(self.dataset)

    def batch(self, indices: torch.Tensor, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples ``indices``, read now, on ``device``."""
        if self.tensors is not None:
            x, y = (t[indices.to(t.device)] for t in self.tensors)
        else:
            x, y = default_collate([self.dataset[i] for i in indices.tolist()])
        return self.to_device(x, y, device)

    def batches(
        self, index_batches: Sequence[torch.Tensor], device: torch.device | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batch of each of ``index_batches`` in turn, read ahead by the workers when there are any."""
        if self.tensors is not None or self.workers == 0:
            for indices in index_batches:
                yield self.batch(indices, device)
            return
        for x, y in self.loader([indices.tolist() for indices in index_batches], device):
            yield self.to_device(x, y, device)

    def loader(
        self, batch_sampler: Iterable[list[int]], device: torch.device | None, persistent: bool = False
    ) -> DataLoader[Any]:
        """A ``DataLoader`` of the dataset's batches ``batch_sampler`` yields, with the workers: ``persistent``
        keeps them between passes (the input pipeline restarts its plan on the same processes)."""
        return DataLoader(
            self.dataset,
            batch_sampler=batch_sampler,
            num_workers=self.workers,
            prefetch_factor=self.prefetch,
            pin_memory=device is not None and device.type == "cuda",
            persistent_workers=persistent,
            # its own generator for the workers' base seed: torch's global one, which draws the run's augmentation
            # and dropout noise, is left alone, so the workers change nothing
            generator=torch.Generator().manual_seed(0),
        )

    @staticmethod
    def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and ``y`` on ``device`` (copied without blocking the host; from pinned memory that overlaps)."""
        if device is not None:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return x, y


# --- the sampler -----------------------------------------------------------------------------------------------------


def hyper_step_batch_size(batch_size: int, hyper_batch_size: int | None) -> int:
    """The examples a hyperparameter step draws from each chunk it scores: ``hyper_batch_size``, or the parameter
    steps' ``batch_size`` where it is None (``TrainConfig.hyper.batch_size`` left unset). The one place this rule
    is written: the sampler draws by it, and ``job.build.build_job`` checks a job's batches against its chunks by it.

    >>> hyper_step_batch_size(64, None), hyper_step_batch_size(64, 16)
    (64, 16)
    """
    return batch_size if hyper_batch_size is None else hyper_batch_size


class PartitionedSampler:
    """Draws the partition and minibatch of each parameter step and hyperparameter step.

    * parameter step: k ~ Cat(u), then ``batch_size`` examples uniformly, with replacement, from D_1:k;
      every example of D_1:k is thus equally likely to train partition k, and one example of chunk j is
      drawn with probability sum over k >= j of u_k / |D_1:k| per draw: not proportional to
      u_j + ... + u_C, since each term is divided by the size of the data partition k draws from.
    * hyperparameter step: k ~ Cat(u_2..u_C renormalised), then ``hyper_batch_size`` examples from D_k
      alone; the step scores them with subnetwork k-1 (an unbiased gradient of the LML, D_1 excluded).
      ``hyper_batches`` draws a minibatch from EVERY chunk 2..C instead, to be weighted by those same
      probabilities: the same expected gradient without the variance of drawing k.

    u are the chunk sizes over the dataset size (the configured proportions, up to rounding). All draws
    come from one CPU generator seeded with ``seed``, so the sequence is the same on every run and device.

    >>> from partition_fx.training.sampling.chunks import split_into_chunks
    >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
    >>> k, indices = sampler.parameter_batch()
    >>> 1 <= k <= 3 and indices.shape == (4,)
    True
    >>> sampler.hyper_batch()[0] in (2, 3)
    True
    >>> k, indices = sampler.parameter_batch(k=1)  # a given partition: its examples, D_1, alone
    >>> set(indices.tolist()) <= set(sampler.chunks.chunk(1).tolist())
    True
    >>> [(round(w, 2), k, len(i)) for w, k, i in sampler.hyper_batches()]
    [(0.5, 2, 4), (0.5, 3, 4)]
    """

    def __init__(self, chunks: DataChunks, batch_size: int, hyper_batch_size: int | None = None, seed: int = 0) -> None:
        for name, value in (("batch_size", batch_size), ("hyper_batch_size", hyper_batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise PartitionArgumentError(f"{name} must be a positive int, got {value!r}")
        self.chunks = chunks
        self.batch_size = batch_size
        self.hyper_batch_size = hyper_step_batch_size(batch_size, hyper_batch_size)
        sizes = torch.tensor(chunks.sizes, dtype=torch.float64)
        self.partition_probabilities = sizes / sizes.sum()
        later = sizes[1:]
        self.hyper_chunk_probabilities = later / later.sum() if later.numel() else later
        self.generator = torch.Generator().manual_seed(seed)

    def _draw(self, pool: torch.Tensor, count: int) -> torch.Tensor:
        return pool[torch.randint(pool.numel(), (count,), generator=self.generator)]

    def parameter_batch(self, k: int | None = None) -> tuple[int, torch.Tensor]:
        """``(k, indices)``: partition k to step (default: drawn from Cat(u)) and a minibatch from D_1:k."""
        if k is None:
            k = int(torch.multinomial(self.partition_probabilities, 1, generator=self.generator)) + 1
        else:
            k = check_partition(k, self.chunks.num_chunks)
        return k, self._draw(self.chunks.prefix(k), self.batch_size)

    def parameter_examples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ks, indices)``: the parameter step vectorised per example. Each of ``batch_size`` examples
        draws its own partition k_i ~ Cat(u) and then an example uniformly from D_1:k_i, so every
        partition is trained in (almost) every iteration, with the per-example distribution of the
        one-partition-per-iteration scheme."""
        ks = (
            torch.multinomial(self.partition_probabilities, self.batch_size, replacement=True, generator=self.generator)
            + 1
        )
        indices = torch.empty(self.batch_size, dtype=torch.long)
        for k in range(1, self.chunks.num_chunks + 1):
            rows = torch.nonzero(ks == k).flatten()
            if rows.numel():
                indices[rows] = self._draw(self.chunks.prefix(k), rows.numel())
        return ks, indices

    def finetune_batch(self) -> torch.Tensor:
        """``batch_size`` examples uniformly from all the data, D_1:C (the fine-tuning phase)."""
        return self._draw(self.chunks.prefix(self.chunks.num_chunks), self.batch_size)

    def examples(self, count: int) -> torch.Tensor:
        """``count`` distinct examples uniformly from all the data, D_1:C (all of it when it holds fewer): what a
        refresh of the Occam term factors the curvature on."""
        pool = self.chunks.prefix(self.chunks.num_chunks)
        return pool[torch.randperm(pool.numel(), generator=self.generator)[:count]]

    def hyper_batch(self, k: int | None = None) -> tuple[int, torch.Tensor]:
        """``(k, indices)``: chunk k in 2..C (default: drawn) and a minibatch from D_k (scored by subnetwork k-1)."""
        if self.chunks.num_chunks < 2:
            raise PartitionArgumentError("hyperparameter steps need at least 2 chunks (num_partitions >= 2)")
        if k is None:
            k = int(torch.multinomial(self.hyper_chunk_probabilities, 1, generator=self.generator)) + 2
        elif check_partition(k, self.chunks.num_chunks) < 2:
            raise PartitionArgumentError(
                f"a hyperparameter step scores chunk k in 2..C through subnetwork k-1, got {k}"
            )
        return k, self._draw(self.chunks.chunk(k), self.hyper_batch_size)

    def hyper_batches(self) -> list[tuple[float, int, torch.Tensor]]:
        """``[(weight, k, indices)]`` for every chunk k in 2..C: the probability ``hyper_batch`` would have
        drawn k with, and a minibatch from D_k. The weighted sum of the per-chunk mean losses has the
        expected value of one ``hyper_batch``'s loss, and a lower variance."""
        if self.chunks.num_chunks < 2:
            raise PartitionArgumentError("hyperparameter steps need at least 2 chunks (num_partitions >= 2)")
        return [
            (float(self.hyper_chunk_probabilities[k - 2]), k, self._draw(self.chunks.chunk(k), self.hyper_batch_size))
            for k in range(2, self.chunks.num_chunks + 1)
        ]

    def copy(self) -> PartitionedSampler:
        """A sampler that draws what this one would draw next, without changing this one (the same chunks, a
        generator of its own in this one's state): what the input pipeline plans ahead with.

        >>> from partition_fx.training.sampling.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(10, (0.5, 0.5)), batch_size=3)
        >>> torch.equal(sampler.copy().finetune_batch(), sampler.finetune_batch())
        True
        """
        twin = copy.copy(self)
        twin.generator = torch.Generator().manual_seed(0)
        twin.generator.set_state(self.generator.get_state())
        return twin

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


# --- the input pipeline ----------------------------------------------------------------------------------------------


Shard = Callable[..., tuple[torch.Tensor, ...]]
"""This process's share of a global minibatch (``TrainingSteps.local``)."""


def planned_batches(
    reads: Callable[[PartitionedSampler, int], Sequence[torch.Tensor]],
    sampler: PartitionedSampler,
    step: int,
    local: Shard | None = None,
) -> Iterator[torch.Tensor]:
    """The index batches the iterations after ``step`` will read, in order, endlessly: ``reads(sampler, s)``, the
    batches of the iteration that completes step s, for s = step + 1, step + 2, ..., drawn from a copy of
    ``sampler`` (which itself draws nothing), each as this process's share (``local``).

    >>> sampler = PartitionedSampler(split_into_chunks(20, (0.5, 0.5)), batch_size=2, seed=0)
    >>> plan = planned_batches(lambda sampler, step: [sampler.parameter_batch()[1]], sampler, step=0)
    >>> first = next(plan)
    >>> torch.equal(first, sampler.parameter_batch()[1])  # what the sampler then draws
    True
    """
    sampler = sampler.copy()
    for upcoming in itertools.count(step + 1):
        for indices in reads(sampler, upcoming):
            yield indices if local is None else local(indices)[0]


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
        self._loader: DataLoader[Any] | None = None
        self._iterator: Iterator[Any] | None = None
        self.read_ahead_batches = 0
        """Batches served from the read-ahead (the rest were read when asked)."""

    @property
    def reads_ahead(self) -> bool:
        """Whether batches are read ahead by worker processes (map-style data and ``workers`` > 0)."""
        return self.examples.tensors is None and self.examples.workers > 0

    def __len__(self) -> int:
        """The examples' count (``PartitionedTrainer.fingerprint`` records the data the steps read by it)."""
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
