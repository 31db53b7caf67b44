"""The interface of an iteration scheme: which steps one iteration of partitioned training takes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ...partitioned_model import PartitionedModel
from ..estimators import HyperEstimator
from ..sampler import PartitionedSampler
from ..steps import TrainingSteps


class IterationScheme(ABC):
    """One iteration of partitioned training: what it draws from the sampler and which steps it takes with
    the draws. Registered by ``name`` in ``partition_fx.training.schemes.SCHEMES``.

    ``iteration`` gets its collaborators explicitly: the ``sampler`` (every draw, in the order that makes a run
    reproducible), the ``steps`` (losses through the right subnetworks and the optimiser steps; ``steps.step``
    is the number of iterations done) and the hyperparameter estimator, or None when no hyperparameter step is
    due in this iteration. It calls ``steps.advance()`` exactly once, when the iteration's parameter update is
    done: a hyperparameter step taken after that is recorded (and reported, if it fails) as the next step's.

    Example (a subclass needs ``name`` and ``iteration``)::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> class FirstPartitionOnly(IterationScheme):
        ...     name = "first-only"
        ...     def iteration(self, sampler, steps, hyper):
        ...         _, indices = sampler.parameter_batch()
        ...         steps.parameter_step(1, indices)
        ...         steps.advance()
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> FirstPartitionOnly().iteration(trainer.sampler, trainer.steps, None)
        >>> trainer.step
        1
    """

    name: ClassVar[str]
    """The name the configuration picks the scheme by."""

    def check(self, pmodel: PartitionedModel) -> None:  # noqa: B027 (optional: most schemes train any model)
        """Refuse, with a ``PartitionArgumentError`` naming the fix, a model this scheme cannot train."""

    @abstractmethod
    def iteration(self, sampler: PartitionedSampler, steps: TrainingSteps, hyper: HyperEstimator | None) -> None:
        """One iteration: the parameter update, and a hyperparameter step by ``hyper`` unless it is None."""
