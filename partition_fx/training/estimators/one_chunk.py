"""The paper's hyperparameter step (appendix I.1): one chunk k ~ Cat(u_2..u_C), through subnetwork k-1."""

from __future__ import annotations

from ..sampler import PartitionedSampler
from .base import HyperBatches, HyperEstimator


class OneChunk(HyperEstimator):
    """One chunk k ~ Cat(u_2..u_C renormalised) and a minibatch of D_k (``sampler.hyper_batch``), weight 1:
    an unbiased estimate of the gradient of the LML's chunks 2..C, at the cost of one forward.

    Example::

        >>> from partition_fx.training.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
        >>> [(w, k, len(i)) for w, k, i in OneChunk().draw(sampler)]
        [(1.0, 3, 4)]
        >>> OneChunk().describe(OneChunk().draw(sampler))
        'chunk D_2 through subnetwork 1'
    """

    name = "one"

    def draw(self, sampler: PartitionedSampler) -> HyperBatches:
        return [(1.0, *sampler.hyper_batch())]

    def describe(self, batches: HyperBatches) -> str:
        ((_, k, _),) = batches
        return f"chunk D_{k} through subnetwork {k - 1}"
