"""How a hyperparameter step estimates the gradient of the LML's chunks 2..C (``hyper_chunks=``,
``hyper_gradient=``): the batches it scores, drawn from the sampler. The paper's one chunk k ~ Cat(u_2..u_C)
through subnetwork k-1 (:class:`OneChunk`); every chunk in each step, its expected gradient without the variance
of drawing k (:class:`AllChunks`); and either through the training of the partitions it reads
(:class:`ThroughTraining`, ``training.objective.implicit``). The steps that take these batches are
``training.step.steps``'.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ..sampling.chunks import InnerIndices, PartitionedSampler, ScoredIndices


class HyperEstimator(ABC):
    """How a hyperparameter step estimates the gradient of the LML's chunks 2..C: the ``(weight, k, indices)``
    batches it scores, drawn from the sampler. Every estimator has the gradient of the paper's one-chunk step
    as its expected value; they differ in variance and cost. The configuration's ``hyper_chunks`` picks one by
    its ``name`` (:func:`estimator_for`).

    Example (a subclass needs ``name``, ``draw`` and ``describe``)::

        >>> from partition_fx.training.sampling.chunks import split_into_chunks
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
    def draw(self, sampler: PartitionedSampler) -> ScoredIndices:
        """The batches of one hyperparameter step, drawn from ``sampler``'s generator."""

    @abstractmethod
    def describe(self, batches: ScoredIndices) -> str:
        """What a step on ``batches`` scores, for messages (``"chunk D_2 through subnetwork 1"``)."""

    def inner(self, sampler: PartitionedSampler, batches: ScoredIndices) -> InnerIndices:
        """The ``(p, indices)`` minibatches of D_1:p whose training loss a hyper-gradient through training
        differentiates (``training.objective.implicit``), drawn after ``batches``; none for a gradient at fixed
        weights."""
        return []


class OneChunk(HyperEstimator):
    """One chunk k ~ Cat(u_2..u_C renormalised) and a minibatch of D_k (``sampler.hyper_batch``), weight 1:
    an unbiased estimate of the gradient of the LML's chunks 2..C, at the cost of one forward.

    Example::

        >>> from partition_fx.training.sampling.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
        >>> [(w, k, len(i)) for w, k, i in OneChunk().draw(sampler)]
        [(1.0, 3, 4)]
        >>> OneChunk().describe(OneChunk().draw(sampler))
        'chunk D_2 through subnetwork 1'
    """

    name = "one"

    def draw(self, sampler: PartitionedSampler) -> ScoredIndices:
        return [(1.0, *sampler.hyper_batch())]

    def describe(self, batches: ScoredIndices) -> str:
        ((_, k, _),) = batches
        return f"chunk D_{k} through subnetwork {k - 1}"


class AllChunks(HyperEstimator):
    """A minibatch of EVERY chunk D_k, k in 2..C (``sampler.hyper_batches``), each through its own subnetwork
    k-1 and weighted by the probability :class:`OneChunk` draws k with: the expected gradient of a one-chunk
    step without the variance of the draw of k, at C-1 forwards per step.

    Example::

        >>> from partition_fx.training.sampling.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
        >>> [(round(w, 2), k, len(i)) for w, k, i in AllChunks().draw(sampler)]
        [(0.5, 2, 4), (0.5, 3, 4)]
    """

    name = "all"

    def draw(self, sampler: PartitionedSampler) -> ScoredIndices:
        return sampler.hyper_batches()

    def describe(self, batches: ScoredIndices) -> str:
        return "chunks D_2..D_C through subnetworks 1..C-1"


class ThroughTraining(HyperEstimator):
    """The batches ``chunks`` scores, and for the hyper-gradient through training (``hyper_gradient="implicit"``,
    ``training.objective.implicit``) a parameter-step-sized minibatch of D_1:p for every partition p that the scored
    subnetworks read (1..k-1 for the largest scored k): the examples partition p's training loss is
    differentiated on.

    Example::

        >>> from partition_fx.training.sampling.chunks import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.6, 0.2, 0.2)), batch_size=4, seed=0)
        >>> estimator = ThroughTraining(AllChunks())
        >>> batches = estimator.draw(sampler)
        >>> [(p, len(i)) for p, i in estimator.inner(sampler, batches)]
        [(1, 4), (2, 4)]
        >>> estimator.describe(batches)
        'chunks D_2..D_C through subnetworks 1..C-1, through the training of partitions 1..2'
    """

    def __init__(self, chunks: HyperEstimator) -> None:
        self.chunks = chunks
        self.name = chunks.name  # type: ignore[misc]  # picked by hyper_chunks, as the estimator it extends

    def draw(self, sampler: PartitionedSampler) -> ScoredIndices:
        return self.chunks.draw(sampler)

    def describe(self, batches: ScoredIndices) -> str:
        return f"{self.chunks.describe(batches)}, through the training of partitions 1..{_last_read(batches)}"

    def inner(self, sampler: PartitionedSampler, batches: ScoredIndices) -> InnerIndices:
        return [(p, sampler.parameter_batch(k=p)[1]) for p in range(1, _last_read(batches) + 1)]


def _last_read(batches: ScoredIndices) -> int:
    """The last partition the subnetworks scoring ``batches`` read: k-1 for the largest k."""
    return max(k for _, k, _ in batches) - 1


def estimator_for(chunks: str, gradient: str = "fixed") -> HyperEstimator:
    """The estimator ``hyper_chunks`` names: ``"one"`` chunk per step (the paper's) or ``"all"`` of them; through
    training (:class:`ThroughTraining`) with ``hyper_gradient="implicit"``.

    >>> type(estimator_for("all")).__name__, type(estimator_for("one", "implicit")).__name__
    ('AllChunks', 'ThroughTraining')
    """
    estimator = AllChunks() if chunks == "all" else OneChunk()
    return ThroughTraining(estimator) if gradient == "implicit" else estimator
