"""The paper's iteration (appendix I.1), a parameter step then a hyperparameter step, and its variant in
which each example trains its own partition."""

from __future__ import annotations

from ..estimators import HyperEstimator
from ..sampler import PartitionedSampler
from ..steps import TrainingSteps
from .base import IterationScheme


class Alternating(IterationScheme):
    """The paper's iteration: a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
    subnetwork k, then (when due) a hyperparameter step, which sees partition k already updated.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> Alternating().iteration(trainer.sampler, trainer.steps, None)
        >>> trainer.step, len(trainer.stepper.pending_losses()[0])
        (1, 1)
    """

    name = "alternating"

    def iteration(self, sampler: PartitionedSampler, steps: TrainingSteps, hyper: HyperEstimator | None) -> None:
        self.parameter_step(sampler, steps)
        steps.advance()
        if hyper is not None:
            batches = hyper.draw(sampler)
            steps.hyper_step(batches, hyper.describe(batches))

    def parameter_step(self, sampler: PartitionedSampler, steps: TrainingSteps) -> None:
        """Draw and take the iteration's parameter step."""
        steps.parameter_step(*sampler.parameter_batch())


class EveryPartition(Alternating):
    """As :class:`Alternating`, but in the parameter step each example draws its own partition k_i ~ Cat(u) and
    an example of D_1:k_i (``sampler.parameter_examples``), all in one forward and one backward: every partition
    drawn at least once is updated in each iteration.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> EveryPartition().iteration(trainer.sampler, trainer.steps, None)
        >>> trainer.step
        1
    """

    name = "every-partition"

    def parameter_step(self, sampler: PartitionedSampler, steps: TrainingSteps) -> None:
        steps.every_partition_step(*sampler.parameter_examples())
