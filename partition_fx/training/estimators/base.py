"""The interface of a hyperparameter-gradient estimator: which chunks one hyperparameter step scores."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..sampler import PartitionedSampler

HyperBatches = list[tuple[float, int, torch.Tensor]]
"""``[(weight, k, indices)]``: examples of chunk k, scored by subnetwork k-1, their mean loss weighted by
``weight``; a hyperparameter step's loss is the weighted sum (``lml.hyper_loss``)."""


class HyperEstimator(ABC):
    """How a hyperparameter step estimates the gradient of the LML's chunks 2..C: the ``(weight, k, indices)``
    batches it scores, drawn from the sampler. Every estimator has the gradient of the paper's one-chunk step
    as its expected value; they differ in variance and cost. Registered by ``name`` in
    ``partition_fx.training.estimators.ESTIMATORS``, which the configuration's ``hyper_chunks`` picks from.

    Example (a subclass needs ``name``, ``draw`` and ``describe``)::

        >>> from partition_fx.training.chunks import split_into_chunks
        >>> class LastChunk(HyperEstimator):  # biased: for illustration only
        ...     name = "last"
        ...     def draw(self, sampler):
        ...         return [(1.0, sampler.chunks.num_chunks, sampler.chunks.chunk(sampler.chunks.num_chunks)[:2])]
        ...     def describe(self, batches):
        ...         return "the last chunk"
        >>> sampler = PartitionedSampler(split_into_chunks(20, (0.5, 0.25, 0.25)), batch_size=4)
        >>> [(w, k, len(i)) for w, k, i in LastChunk().draw(sampler)]
        [(1.0, 3, 2)]
    """

    name: ClassVar[str]
    """The name the configuration picks the estimator by (``hyper_chunks=...``)."""

    @abstractmethod
    def draw(self, sampler: PartitionedSampler) -> HyperBatches:
        """The batches of one hyperparameter step, drawn from ``sampler``'s generator."""

    @abstractmethod
    def describe(self, batches: HyperBatches) -> str:
        """What a step on ``batches`` scores, for messages (``"chunk D_2 through subnetwork 1"``)."""
