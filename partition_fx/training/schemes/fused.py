"""Fused iterations: the parameter and hyperparameter steps of one iteration in ONE forward and ONE backward
(the paper leaves this as future work; node partitioning runs it in one pass, ``per_example.one_pass``)."""

from __future__ import annotations

import torch

from ...errors import PartitionArgumentError
from ...partitioned_model import PartitionedModel
from ..estimators import HyperEstimator
from ..sampler import PartitionedSampler
from ..steps import TrainingSteps
from .base import IterationScheme


class Fused(IterationScheme):
    """The paper's draws (partition k ~ Cat(u), a minibatch of D_1:k, then the hyperparameter batches when due)
    routed through their subnetworks in one forward and one backward. Both gradients are taken at the same
    weights: the gradients of the two steps of appendix I.1, except that the paper's hyperparameter step sees
    partition k already updated.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> Fused().iteration(trainer.sampler, trainer.steps, None)
        >>> trainer.step
        1
    """

    name = "fused"

    def check(self, pmodel: PartitionedModel) -> None:
        # The parameter examples' loss runs through the model's hyperparameter modules with gradients (only the
        # input transform and the likelihood can be detached for them), so it would step psi too.
        if any(any(True for _ in m.parameters()) for _, m in pmodel.hyperparameter_modules()):
            raise PartitionArgumentError(
                "fused=True does not support hyperparameter modules inside the model (e.g. ConcreteDropout) yet: "
                "the parameter examples' loss would reach them; use fused=False"
            )

    def iteration(self, sampler: PartitionedSampler, steps: TrainingSteps, hyper: HyperEstimator | None) -> None:
        ks, indices = self.parameter_examples(sampler)
        steps.fused_step(ks, indices, hyper.draw(sampler) if hyper is not None else [])
        steps.advance()

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ks, indices)``: the parameter examples and the partition each trains (here all the same k)."""
        k, indices = sampler.parameter_batch()
        return torch.full((indices.numel(),), k), indices


class FusedEveryPartition(Fused):
    """As :class:`Fused`, with every parameter example drawing its own partition (as :class:`EveryPartition`).

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> FusedEveryPartition().iteration(trainer.sampler, trainer.steps, None)
        >>> trainer.step
        1
    """

    name = "fused-every-partition"

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        return sampler.parameter_examples()
