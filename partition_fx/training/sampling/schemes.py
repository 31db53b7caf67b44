"""The iteration schemes of partitioned training (``fused=``, ``every_partition=``): what one iteration draws
from the sampler (a :class:`Draw`, plain data) and which steps it takes with the draws.

The paper's (appendix I.1), a parameter step then a hyperparameter step (:class:`Alternating`); its variant in
which each example trains its own partition (:class:`EveryPartition`); and both with the two steps in ONE forward
and ONE backward (:class:`Fused`, :class:`FusedEveryPartition`; the paper leaves this as future work). Running
examples of several subnetworks in one pass (``per_example="one_pass"``) is not a scheme: it is how the model
runs the routed forward of the every-partition and fused schemes. The steps a scheme takes are
``training.step.steps``' (``TrainingSteps``); which iterations take a hyperparameter step, and which fine-tune, is the
run's ``training.sampling.schedule``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

from ...errors import PartitionArgumentError
from ...fx.partitioned_model import PartitionedModel
from ..objective.estimators import HyperEstimator
from ..objective.implicit import InnerBatch
from ..objective.lml import ScoredBatch
from .chunks import InnerIndices, PartitionedSampler, ScoredIndices

if TYPE_CHECKING:  # a scheme takes the steps it is given; the steps run a scheme's draw (TrainingSteps.take)
    from ..step.steps import TrainingSteps


@dataclass(frozen=True)
class IterationBatch:
    """One iteration's examples as tensors, this process's share: the parameter (or fine-tuning) examples
    ``parameter`` = ``(x, y)`` and the ``partitions`` they train (as :attr:`Draw.partitions`, an int, one per
    example of this share, or None), the hyperparameter step's batches ``hyper`` = ``[(weight, k, x, y)]`` and
    the training examples its gradient through training differentiates, ``inner`` = ``[(p, x, y)]``, and the
    examples a refresh of the Occam term factors the curvature on, ``occam`` = ``(x, y)`` (None: no refresh)."""

    partitions: int | torch.Tensor | None
    parameter: tuple[torch.Tensor, torch.Tensor]
    hyper: list[ScoredBatch] = field(default_factory=list)
    inner: list[InnerBatch] = field(default_factory=list)
    occam: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class Draw:
    """What one iteration draws from the sampler, as plain data, before any of its steps runs: the parameter
    (or fine-tuning) examples ``indices``; ``partitions``, the partition they train (an int, the paper's k; a
    tensor: one per example; None: a fine-tuning step, every partition); and the hyperparameter step's
    ``hyper`` batches (empty when none is due), which ``hyper_what`` describes in messages; the ``scheme``
    that drew it, whose steps take it (``TrainingSteps.take``; None for a fine-tuning step's); and the examples
    of all the data a refresh of the Occam term reads, ``occam`` (None: no refresh in this iteration).

    The draws come from the sampler's own generator and nothing else, so drawing an iteration whole before
    taking its steps is drawing it as the steps go, and replaying draws on a copy of the sampler says what the
    iterations to come will read (:meth:`reads`; ``training.sampling.chunks.planned_batches``).

    >>> draw = Draw(torch.tensor([4, 5]), 2, [(1.0, 2, torch.tensor([6]))], "chunk D_2 through subnetwork 1")
    >>> [i.tolist() for i in draw.reads()]
    [[4, 5], [6]]
    """

    indices: torch.Tensor
    partitions: int | torch.Tensor | None
    hyper: ScoredIndices = field(default_factory=list)
    hyper_what: str = ""
    inner: InnerIndices = field(default_factory=list)
    scheme: IterationScheme | None = field(default=None, compare=False, repr=False)
    occam: torch.Tensor | None = None

    def reads(self) -> list[torch.Tensor]:
        """The index batches the iteration's steps read, in the order they read them."""
        occam = [] if self.occam is None else [self.occam]
        return [self.indices, *(i for _, _, i in self.hyper), *(i for _, i in self.inner), *occam]


class IterationScheme(ABC):
    """One iteration of partitioned training: what it draws from the sampler (:meth:`draw`, a :class:`Draw`) and
    which steps it takes with the draws (:meth:`take`). The configuration's ``fused`` and ``every_partition``
    pick one (:func:`scheme_for`).

    ``draw`` gets the ``sampler`` (every draw, in the order that makes a run reproducible) and the
    hyperparameter estimator, or None when no hyperparameter step is due in this iteration; it draws nothing
    else, and names itself as the draw's ``scheme``. ``take`` gets the ``steps`` (losses through the right
    subnetworks and the optimiser steps; ``steps.step`` is the number of iterations done) and the ``batch`` of
    tensors read for the draw (an :class:`IterationBatch`), and calls ``steps.advance()`` exactly once, when the
    iteration's parameter update is done: a hyperparameter step taken after that is recorded (and reported, if
    it fails) as the next step's.

    Example (a subclass needs ``name``, ``draw`` and ``take``)::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> class FirstPartitionOnly(IterationScheme):
        ...     name = "first-only"
        ...     def draw(self, sampler, hyper):
        ...         return Draw(sampler.parameter_batch(k=1)[1], 1, scheme=self)
        ...     def take(self, steps, draw, batch):
        ...         steps.parameter_step(1, *batch.parameter)
        ...         steps.advance()
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> trainer.steps.take(FirstPartitionOnly().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name: ClassVar[str]
    """What the scheme is called in benchmarks and messages."""

    def check(self, pmodel: PartitionedModel) -> None:  # noqa: B027 (optional: most schemes train any model)
        """Refuse, with a ``PartitionArgumentError`` naming the fix, a model this scheme cannot train."""

    @abstractmethod
    def draw(self, sampler: PartitionedSampler, hyper: HyperEstimator | None) -> Draw:
        """One iteration's draws: the parameter examples, and a hyperparameter step's batches by ``hyper``
        unless it is None."""

    @abstractmethod
    def take(self, steps: TrainingSteps, draw: Draw, batch: IterationBatch) -> None:
        """One iteration's steps on ``draw``, whose examples are ``batch``."""


def _hyper_draw(sampler: PartitionedSampler, hyper: HyperEstimator | None) -> tuple[ScoredIndices, str, InnerIndices]:
    """A hyperparameter step's batches drawn by ``hyper``, their description and the training examples its
    gradient differentiates (none when ``hyper`` is None)."""
    if hyper is None:
        return [], "", []
    batches = hyper.draw(sampler)
    return batches, hyper.describe(batches), hyper.inner(sampler, batches)


class Alternating(IterationScheme):
    """The paper's iteration: a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
    subnetwork k, then (when due) a hyperparameter step, which sees partition k already updated.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> trainer.steps.take(Alternating().draw(trainer.sampler, None))
        >>> trainer.step, len(trainer.steps.stepper.pending_losses()[0])
        (1, 1)
    """

    name = "alternating"

    def draw(self, sampler: PartitionedSampler, hyper: HyperEstimator | None) -> Draw:
        partitions, indices = self.parameter_examples(sampler)
        return Draw(indices, partitions, *_hyper_draw(sampler, hyper), scheme=self)

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[int | torch.Tensor, torch.Tensor]:
        """The parameter examples and the partition they train: one k for the minibatch."""
        return sampler.parameter_batch()

    def take(self, steps: TrainingSteps, draw: Draw, batch: IterationBatch) -> None:
        if isinstance(batch.partitions, torch.Tensor):
            steps.every_partition_step(batch.partitions, *batch.parameter, drawn=draw.partitions)  # type: ignore[arg-type]  # a tensor, as batch.partitions (its share) is
        else:
            steps.parameter_step(batch.partitions, *batch.parameter)  # type: ignore[arg-type]  # this scheme draws an int k
        steps.advance()
        if batch.hyper:
            steps.hyper_step(batch.hyper, draw.hyper_what, batch.inner, occam=batch.occam)


class EveryPartition(Alternating):
    """As :class:`Alternating`, but in the parameter step each example draws its own partition k_i ~ Cat(u) and
    an example of D_1:k_i (``sampler.parameter_examples``), all in one forward and one backward: every partition
    drawn at least once is updated in each iteration.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> trainer.steps.take(EveryPartition().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name = "every-partition"

    def check(self, pmodel: PartitionedModel) -> None:
        pmodel.check_traced("every_partition=True (each example through its own subnetwork)")

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[int | torch.Tensor, torch.Tensor]:
        return sampler.parameter_examples()


class Fused(IterationScheme):
    """The paper's draws (partition k ~ Cat(u), a minibatch of D_1:k, then the hyperparameter batches when due)
    routed through their subnetworks in one forward and one backward. Both gradients are taken at the same
    weights: the gradients of the two steps of appendix I.1, except that the paper's hyperparameter step sees
    partition k already updated.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> trainer.steps.take(Fused().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name = "fused"

    def check(self, pmodel: PartitionedModel) -> None:
        pmodel.check_traced("fused=True (both steps' examples in one forward, each through its subnetwork)")
        # The parameter examples' loss runs through the model's hyperparameter modules with gradients (only the
        # input transform and the likelihood can be detached for them), so it would step psi too.
        if any(any(True for _ in m.parameters()) for _, m in pmodel.hyperparameter_modules()):
            raise PartitionArgumentError(
                "fused=True does not support hyperparameter modules inside the model (e.g. ConcreteDropout) yet: "
                "the parameter examples' loss would reach them; use fused=False"
            )

    def draw(self, sampler: PartitionedSampler, hyper: HyperEstimator | None) -> Draw:
        ks, indices = self.parameter_examples(sampler)
        return Draw(indices, ks, *_hyper_draw(sampler, hyper), scheme=self)

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ks, indices)``: the parameter examples and the partition each trains (here all the same k)."""
        k, indices = sampler.parameter_batch()
        return torch.full((indices.numel(),), k), indices

    def take(self, steps: TrainingSteps, draw: Draw, batch: IterationBatch) -> None:
        steps.fused_step(batch.partitions, *batch.parameter, batch.hyper, drawn=draw.partitions, occam=batch.occam)  # type: ignore[arg-type]  # tensors: one k per example
        steps.advance()


class FusedEveryPartition(Fused):
    """As :class:`Fused`, with every parameter example drawing its own partition (as :class:`EveryPartition`).

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> trainer.steps.take(FusedEveryPartition().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name = "fused-every-partition"

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        return sampler.parameter_examples()


def scheme_for(fused: bool, every_partition: bool) -> IterationScheme:
    """The scheme the two options name; they compose.

    >>> type(scheme_for(fused=True, every_partition=True)).__name__
    'FusedEveryPartition'
    """
    if fused:
        return FusedEveryPartition() if every_partition else Fused()
    return EveryPartition() if every_partition else Alternating()
