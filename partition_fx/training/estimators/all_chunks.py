"""Every chunk in each hyperparameter step: the paper's expected gradient without the variance of drawing k."""

from __future__ import annotations

from ..sampler import PartitionedSampler
from .base import HyperBatches, HyperEstimator


class AllChunks(HyperEstimator):
    """A minibatch of EVERY chunk D_k, k in 2..C (``sampler.hyper_batches``), each through its own subnetwork
    k-1 and weighted by the probability :class:`OneChunk` draws k with: the expected gradient of a one-chunk
    step without the variance of the draw of k, at C-1 forwards per step.

    Example::

        >>> from partition_fx.training.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
        >>> [(round(w, 2), k, len(i)) for w, k, i in AllChunks().draw(sampler)]
        [(0.5, 2, 4), (0.5, 3, 4)]
    """

    name = "all"

    def draw(self, sampler: PartitionedSampler) -> HyperBatches:
        return sampler.hyper_batches()

    def describe(self, batches: HyperBatches) -> str:
        return "chunks D_2..D_C through subnetworks 1..C-1"
