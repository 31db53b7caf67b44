"""Data chunks D_1..D_C and batches of examples.

Chunk k (1-based, like subnetwork k) holds the examples partition k is the last to train on; the
partitioned marginal likelihood scores chunk k with subnetwork k-1, which never saw it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

from .._validation import check_proportions
from ..assign import partition_sizes
from ..errors import PartitionArgumentError, PartitionTypeError


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
    from ..datasets.images import DecodedImages

    if not isinstance(dataset, DecodedImages):
        return 0
    return max(0, min(4, (os.cpu_count() or 1) - 1))


class Examples:
    """Batches of ``(inputs, targets)`` from a dataset by index: a fast path for tensors (one gather),
    ``dataset[i]`` + ``default_collate`` for any other map-style dataset of pairs, which ``workers`` processes
    decode ahead when read through :meth:`batches` or the input pipeline (``training.pipeline``), ``prefetch``
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
    ) -> DataLoader:
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
