"""The steps of partitioned training: drawn examples through the right subnetworks into losses, which the
:class:`~partition_fx.training.stepping.Stepper` turns into optimiser updates. What is drawn, and which
steps make an iteration, is the iteration scheme's (``training.schemes``); the losses are ``training.lml``'s."""

from __future__ import annotations

import torch
from torch import nn

from ..partitioned_model import PartitionedModel
from .chunks import BatchReader
from .data_parallel import DataParallel, running_statistics_modules
from .estimators import HyperBatches
from .likelihoods import Likelihood
from .lml import forward_log_likelihood, hyper_loss, routed_losses
from .stepping import Stepper


class TrainingSteps:
    """Each kind of step of partitioned training, on examples already drawn, and the count of iterations done
    (``step``). Every step puts the model and input transform in training mode, takes this process's share of
    the minibatch (``data_parallel``), runs its forwards under the stepper's precision and hands the losses and
    the parameters they train to ``stepper``, recorded at ``step``.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical
        >>> pmodel = partitionify(nn.Linear(3, 2), 2)
        >>> from partition_fx.training.chunks import Examples
        >>> examples = Examples((torch.randn(10, 3), torch.zeros(10).long()))
        >>> stepper = Stepper(torch.optim.SGD(pmodel.parameters(), lr=0.1), modules=(pmodel, None, None))
        >>> steps = TrainingSteps(pmodel, Categorical(), examples, stepper)
        >>> loss = steps.parameter_step(2, torch.tensor([0, 1, 2]))
        >>> steps.advance(); steps.step, loss.shape
        (1, torch.Size([]))
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        likelihood: Likelihood,
        examples: BatchReader,
        stepper: Stepper,
        *,
        hyper: nn.Module | None = None,
        device: torch.device | None = None,
        data_parallel: DataParallel | None = None,
        hyper_samples: int | None = None,
        train_range_factor: float = 1.0,
    ) -> None:
        self.pmodel = pmodel
        self.likelihood = likelihood
        self.examples = examples
        self.stepper = stepper
        self.hyper = hyper
        self.device = device
        self.data_parallel = data_parallel
        self.hyper_samples = hyper_samples
        """Augmentation samples per example in hyperparameter steps (None: the input transform's own number)."""
        self.train_range_factor = train_range_factor
        """Parameter steps draw the augmentation from its ranges times this (fine-tuning steps do not)."""
        self.step = 0
        """Iterations done (``advance`` counts them); each step is recorded at it."""
        self._statistics_modules = running_statistics_modules(pmodel) if data_parallel is not None else []

    def advance(self) -> None:
        """Count an iteration as done."""
        self.step += 1

    def train_mode(self) -> None:
        self.pmodel.train()
        if self.hyper is not None:
            self.hyper.train()
        self.same_running_statistics()

    def same_running_statistics(self) -> None:
        """Data-parallel: rank 0's BatchNorm running statistics on every rank (as DDP's broadcast_buffers)."""
        if self.data_parallel is not None and self._statistics_modules:
            self.data_parallel.broadcast(self._statistics_modules, buffers_only=True)

    def local(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This process's share of a global minibatch (all of it without data parallelism)."""
        return tensors if self.data_parallel is None else self.data_parallel.shard(*tensors)

    def parameter_step(self, k: int, indices: torch.Tensor) -> torch.Tensor:
        """Train partition k on the examples ``indices`` (of D_1:k) through subnetwork k; returns the loss."""
        self.train_mode()
        x, y = self.examples.batch(*self.local(indices), self.device)
        with self.stepper.precision.autocast():
            loss = -forward_log_likelihood(
                self.pmodel, self.likelihood, x, y, k, self.hyper, transform_grad=False, widen=self.train_range_factor
            ).mean()
        what = f"parameter step of partition {k} (subnetwork {k}, data D_1:{k})"
        return self.stepper.step(loss, None, self.pmodel.partition_parameters(k), what, self.step)

    def hyper_step(self, batches: HyperBatches, description: str) -> torch.Tensor:
        """Step psi on the ``(weight, k, indices)`` batches (chunk k through subnetwork k-1); ``description``
        says what they score (``HyperEstimator.describe``). Returns the loss."""
        self.train_mode()
        local = [(weight, k, *self.local(indices)) for weight, k, indices in batches]
        with self.stepper.precision.autocast():
            loss = hyper_loss(
                self.pmodel, self.likelihood, self.hyper, self.examples, local, self.device, self.hyper_samples
            )
        return self.stepper.step(None, loss, [], f"hyperparameter step ({description})", self.step)

    def every_partition_step(self, ks: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """A parameter step in which example ``indices[i]`` trains partition ``ks[i]`` through subnetwork
        ``ks[i]``: one forward and one backward, every partition drawn updated. Returns the loss."""
        loss, _ = self._routed_losses(ks, indices, [])
        params, drawn = self.parameters_of(ks)
        return self.stepper.step(loss, None, params, f"parameter step of partitions {drawn}", self.step)

    def fused_step(self, ks: torch.Tensor, indices: torch.Tensor, hyper_batches: HyperBatches) -> torch.Tensor:
        """The parameter examples (as :meth:`every_partition_step`) and the hyperparameter batches (as
        :meth:`hyper_step`; none: a parameter step only) in ONE forward and ONE backward. Returns the summed loss."""
        loss, hyper_loss = self._routed_losses(ks, indices, hyper_batches)
        params, drawn = self.parameters_of(ks)
        return self.stepper.step(loss, hyper_loss, params, f"fused iteration (partitions {drawn})", self.step)

    def finetune_step(self, indices: torch.Tensor) -> torch.Tensor:
        """Train every weight of the final subnetwork C on the examples ``indices`` (any chunk), with the input
        transform's psi fixed; returns the loss."""
        self.train_mode()
        x, y = self.examples.batch(*self.local(indices), self.device)
        final = self.pmodel.num_partitions
        with self.stepper.precision.autocast():
            loss = -forward_log_likelihood(
                self.pmodel, self.likelihood, x, y, final, self.hyper, transform_grad=False
            ).mean()
        params, _ = self.parameters_of(torch.arange(1, final + 1))
        return self.stepper.step(loss, None, params, f"fine-tuning step (subnetwork {final}, all data)", self.step)

    def parameters_of(self, ks: torch.Tensor) -> tuple[list[nn.Parameter], list[int]]:
        """The parameters of the partitions drawn in ``ks``, and those partitions."""
        drawn = torch.unique(ks).tolist()
        return [p for k in drawn for p in self.pmodel.partition_parameters(int(k))], drawn

    def _routed_losses(
        self, ks: torch.Tensor, indices: torch.Tensor, hyper: HyperBatches
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The parameter loss and (if ``hyper`` lists batches) the hyperparameter loss in one forward."""
        self.train_mode()
        ks, indices = self.local(ks, indices)
        batch = self.examples.batch(indices, self.device)
        hyper_batches = [(w, k, *self.examples.batch(*self.local(i), self.device)) for w, k, i in hyper]
        with self.stepper.precision.autocast():
            return routed_losses(
                self.pmodel, self.likelihood, self.hyper, ks, batch, hyper_batches, self.hyper_samples,
                self.train_range_factor,
            )  # fmt: skip
