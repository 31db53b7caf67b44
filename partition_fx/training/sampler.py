"""The sampler of appendix I.1: which partition to train and which examples to use, each iteration."""

from __future__ import annotations

import copy
from typing import Any

import torch

from .._validation import check_partition
from ..errors import PartitionArgumentError
from .chunks import DataChunks


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

    >>> from partition_fx.training.chunks import split_into_chunks
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
        self.hyper_batch_size = hyper_batch_size or batch_size
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

        >>> from partition_fx.training.chunks import split_into_chunks
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
