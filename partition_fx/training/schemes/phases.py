"""What each iteration of a run does: the scheme's iteration, with a hyperparameter step when one is due, or a
fine-tuning step once partitioned training has ended (paper, Table 2)."""

from __future__ import annotations

from typing import Any

from ..estimators import HyperEstimator
from ..pipeline import Iterate
from ..sampler import PartitionedSampler
from .base import IterationScheme


class Iterations:
    """The iterations of a run: ``scheme``'s in partitioned training, with a hyperparameter step by ``estimator``
    on every ``hyper_every``-th iteration after ``warmup_steps`` (never when ``estimator`` is None: nothing to
    learn); one fine-tuning step each once fine-tuning has begun.

    An iteration is a function of the sampler and the steps it is given, so the input pipeline can replay the
    same iterations on a copy of the sampler (``training.pipeline.planned_batches``).

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> from partition_fx.training.estimators import OneChunk
        >>> from partition_fx.training.schemes import Alternating
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> iterations = Iterations(Alternating(), OneChunk(), hyper_every=2, warmup_steps=0)
        >>> [iterations.hyper_due(step) for step in (1, 2, 3, 4)]
        [False, True, False, True]
        >>> iterations.phase(finetuning=False)(trainer.sampler, trainer.steps)
        >>> trainer.step
        1
    """

    def __init__(
        self,
        scheme: IterationScheme,
        estimator: HyperEstimator | None,
        *,
        hyper_every: int = 1,
        warmup_steps: int = 0,
    ) -> None:
        self.scheme = scheme
        self.estimator = estimator
        self.hyper_every = hyper_every
        self.warmup_steps = warmup_steps

    def hyper_due(self, step: int) -> bool:
        """Whether the iteration that completes ``step`` takes a hyperparameter step."""
        return self.estimator is not None and step > self.warmup_steps and step % self.hyper_every == 0

    def estimator_for(self, step: int) -> HyperEstimator | None:
        """The estimator of the iteration that completes ``step``, or None when no hyperparameter step is due."""
        return self.estimator if self.hyper_due(step) else None

    def phase(self, finetuning: bool) -> Iterate:
        """One iteration of the phase ``finetuning`` says."""

        def iterate(sampler: PartitionedSampler, steps: Any) -> None:
            if finetuning:
                steps.finetune_step(sampler.finetune_batch())
                steps.advance()
            else:
                self.scheme.iteration(sampler, steps, self.estimator_for(steps.step + 1))

        return iterate


__all__ = ["Iterations"]
