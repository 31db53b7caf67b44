"""The trainer's evaluation: the LML of the current model and hyperparameters, estimated without changing the
training path, and the score the best state is chosen by."""

from __future__ import annotations

import torch
from torch import nn

from ..partitioned_model import PartitionedModel
from .chunks import DataChunks, Examples
from .likelihoods import Likelihood
from .lml import LMLEstimate, estimate_lml
from .stepping import Precision


class LMLEvaluator:
    """Estimates the LML of ``pmodel`` with ``hyper`` and ``likelihood`` on the data ``chunks`` of ``examples``
    (see :func:`~partition_fx.training.estimate_lml`: ``batch_size`` examples per forward, chunks larger than
    ``max_examples_per_chunk`` subsampled), under ``precision``.

    Its random draws (augmentation and dropout noise, subsampling) come from its own ``generator``, seeded with
    ``seed``: torch's global generator is forked around an estimate, so how often the LML is estimated
    (``eval_every``) does not change the training path.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical, split_into_chunks
        >>> examples, chunks = Examples((torch.randn(30, 2), torch.zeros(30).long())), split_into_chunks(30, (0.5, 0.5))
        >>> evaluator = LMLEvaluator(partitionify(nn.Linear(2, 2), 2), examples, chunks, Categorical())
        >>> before = torch.get_rng_state()
        >>> estimate = evaluator.estimate()
        >>> len(estimate.per_chunk), torch.equal(torch.get_rng_state(), before)
        (2, True)
        >>> evaluator.selection_score(LMLEstimate(-30.0, [-20.0, -6.0, -4.0], -1.0))
        -10.0
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        examples: Examples,
        chunks: DataChunks,
        likelihood: Likelihood,
        hyper: nn.Module | None = None,
        *,
        batch_size: int = 256,
        max_examples_per_chunk: int | None = None,
        seed: int = 1,
        device: torch.device | None = None,
        precision: Precision | None = None,
    ) -> None:
        self.pmodel = pmodel
        self.examples = examples
        self.chunks = chunks
        self.likelihood = likelihood
        self.hyper = hyper
        self.batch_size = batch_size
        self.max_examples_per_chunk = max_examples_per_chunk
        self.device = device
        self.precision = precision if precision is not None else Precision("fp32", device)
        self.generator = torch.Generator().manual_seed(seed)

    def estimate(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters, its noise from :attr:`generator`."""
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
            torch.manual_seed(seed)
            with self.precision.autocast():
                return estimate_lml(
                    self.pmodel,
                    self.examples,
                    self.chunks,
                    self.likelihood,
                    self.hyper,
                    batch_size=self.batch_size,
                    max_examples_per_chunk=self.max_examples_per_chunk,
                    generator=self.generator,
                    device=self.device,
                )

    def selection_score(self, estimate: LMLEstimate) -> float:
        """The evidence the best state is chosen by: the conditional LML (chunks 2..C), or the full LML when
        C = 1. The full one adds chunk 1 scored by the untrained subnetwork 0, which dominates it (-2743 of
        -2772 nats on the main job) whatever was learned."""
        return estimate.conditional if self.pmodel.num_partitions > 1 else estimate.total
