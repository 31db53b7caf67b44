"""What one iteration of partitioned training does: the steps (examples through the right subnetworks into
losses, which the :class:`~partition_fx.training.stepping.Stepper` turns into updates), the iteration schemes
that string them together (``fused=``, ``every_partition=``), the hyperparameter-gradient estimators that draw a
hyperparameter step's chunks (``hyper_chunks=``) and the phases of a run (partitioned training, fine-tuning).

The schemes: the paper's (appendix I.1), a parameter step then a hyperparameter step (:class:`Alternating`); its
variant in which each example trains its own partition (:class:`EveryPartition`); and both with the two steps
in ONE forward and ONE backward (:class:`Fused`, :class:`FusedEveryPartition`; the paper leaves this as future
work). Running examples of several subnetworks in one pass (``per_example="one_pass"``) is not a scheme: it is
how the model runs the routed forward of the every-partition and fused schemes. The estimators: the paper's
one chunk k ~ Cat(u_2..u_C) through subnetwork k-1 (:class:`OneChunk`), or every chunk in each step, its
expected gradient without the variance of drawing k (:class:`AllChunks`). The losses are ``training.lml``'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from ..errors import PartitionArgumentError
from ..partitioned_model import PartitionedModel
from .data import BatchReader, HyperBatches, PartitionedSampler
from .lml import forward_log_likelihood, hyper_loss, hyper_step_norms, routed_losses
from .objective import Objective, running_norms
from .stepping import DataParallel, Stepper

# --- hyperparameter-gradient estimators ------------------------------------------------------------------------------


class HyperEstimator(ABC):
    """How a hyperparameter step estimates the gradient of the LML's chunks 2..C: the ``(weight, k, indices)``
    batches it scores, drawn from the sampler. Every estimator has the gradient of the paper's one-chunk step
    as its expected value; they differ in variance and cost. The configuration's ``hyper_chunks`` picks one by
    its ``name`` (:func:`estimator_for`).

    Example (a subclass needs ``name``, ``draw`` and ``describe``)::

        >>> from partition_fx.training.data import split_into_chunks
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


class OneChunk(HyperEstimator):
    """One chunk k ~ Cat(u_2..u_C renormalised) and a minibatch of D_k (``sampler.hyper_batch``), weight 1:
    an unbiased estimate of the gradient of the LML's chunks 2..C, at the cost of one forward.

    Example::

        >>> from partition_fx.training.data import split_into_chunks
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


class AllChunks(HyperEstimator):
    """A minibatch of EVERY chunk D_k, k in 2..C (``sampler.hyper_batches``), each through its own subnetwork
    k-1 and weighted by the probability :class:`OneChunk` draws k with: the expected gradient of a one-chunk
    step without the variance of the draw of k, at C-1 forwards per step.

    Example::

        >>> from partition_fx.training.data import split_into_chunks
        >>> sampler = PartitionedSampler(split_into_chunks(100, (0.8, 0.1, 0.1)), batch_size=4, seed=0)
        >>> [(round(w, 2), k, len(i)) for w, k, i in AllChunks().draw(sampler)]
        [(0.5, 2, 4), (0.5, 3, 4)]
    """

    name = "all"

    def draw(self, sampler: PartitionedSampler) -> HyperBatches:
        return sampler.hyper_batches()

    def describe(self, batches: HyperBatches) -> str:
        return "chunks D_2..D_C through subnetworks 1..C-1"


def estimator_for(chunks: str) -> HyperEstimator:
    """The estimator ``hyper_chunks`` names: ``"one"`` chunk per step (the paper's) or ``"all"`` of them.

    >>> type(estimator_for("all")).__name__
    'AllChunks'
    """
    return AllChunks() if chunks == "all" else OneChunk()


# --- the steps -------------------------------------------------------------------------------------------------------


class TrainingSteps:
    """Each kind of step of partitioned training, on examples already drawn, and the count of iterations done
    (``step``), of ``objective`` (the model, input transform and likelihood). Every step puts the model and
    input transform in training mode, takes this process's share of the minibatch (``data_parallel``), runs
    its forwards under the stepper's precision and hands the losses and the parameters they train to
    ``stepper``, recorded at ``step``.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical
        >>> pmodel = partitionify(nn.Linear(3, 2), 2)
        >>> from partition_fx.training.data import Examples
        >>> from partition_fx.training.objective import Objective
        >>> objective = Objective(pmodel, None, Categorical())
        >>> examples = Examples((torch.randn(10, 3), torch.zeros(10).long()))
        >>> stepper = Stepper(torch.optim.SGD(pmodel.parameters(), lr=0.1), objective=objective)
        >>> steps = TrainingSteps(objective, examples, stepper)
        >>> loss = steps.parameter_step(2, torch.tensor([0, 1, 2]))
        >>> steps.advance(); steps.step, loss.shape
        (1, torch.Size([]))
    """

    def __init__(
        self,
        objective: Objective,
        examples: BatchReader,
        stepper: Stepper,
        *,
        device: torch.device | None = None,
        data_parallel: DataParallel | None = None,
        hyper_samples: int | None = None,
        train_range_factor: float = 1.0,
        hyper_norms: str = "batch",
    ) -> None:
        self.objective = objective
        self.pmodel = objective.pmodel
        self.likelihood = objective.likelihood
        self.hyper = objective.hyper
        self.examples = examples
        self.stepper = stepper
        self.device = device
        self.data_parallel = data_parallel
        self.hyper_samples = hyper_samples
        """Augmentation samples per example in hyperparameter steps (None: the input transform's own number)."""
        self.train_range_factor = train_range_factor
        """Parameter steps draw the augmentation from its ranges times this (fine-tuning steps do not)."""
        self.hyper_norms = hyper_norms
        """What BatchNorm normalises hyperparameter steps' batches with (``lml.hyper_step_norms``)."""
        self.step = 0
        """Iterations done (``advance`` counts them); each step is recorded at it."""
        self._statistics_modules = running_norms(self.pmodel) if data_parallel is not None else []

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
        with self.stepper.precision.autocast(), hyper_step_norms(self.pmodel, self.hyper_norms):
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


# --- iteration schemes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """What one iteration draws from the sampler, as plain data, before any of its steps runs: the parameter
    (or fine-tuning) examples ``indices``; ``partitions``, the partition they train (an int, the paper's k; a
    tensor: one per example; None: a fine-tuning step, every partition); and the hyperparameter step's
    ``hyper`` batches (empty when none is due), which ``hyper_what`` describes in messages.

    The draws come from the sampler's own generator and nothing else, so drawing an iteration whole before
    taking its steps is drawing it as the steps go, and replaying draws on a copy of the sampler says what the
    iterations to come will read (:meth:`reads`; ``training.data.planned_batches``).

    >>> draw = Draw(torch.tensor([4, 5]), 2, [(1.0, 2, torch.tensor([6]))], "chunk D_2 through subnetwork 1")
    >>> [i.tolist() for i in draw.reads()]
    [[4, 5], [6]]
    """

    indices: torch.Tensor
    partitions: int | torch.Tensor | None
    hyper: HyperBatches = field(default_factory=list)
    hyper_what: str = ""

    def reads(self) -> list[torch.Tensor]:
        """The index batches the iteration's steps read, in the order they read them."""
        return [self.indices, *(indices for _, _, indices in self.hyper)]


class IterationScheme(ABC):
    """One iteration of partitioned training: what it draws from the sampler (:meth:`draw`, a :class:`Draw`) and
    which steps it takes with the draws (:meth:`take`). The configuration's ``fused`` and ``every_partition``
    pick one (:func:`scheme_for`).

    ``draw`` gets the ``sampler`` (every draw, in the order that makes a run reproducible) and the
    hyperparameter estimator, or None when no hyperparameter step is due in this iteration; it draws nothing
    else. ``take`` gets the ``steps`` (losses through the right subnetworks and the optimiser steps;
    ``steps.step`` is the number of iterations done) and calls ``steps.advance()`` exactly once, when the
    iteration's parameter update is done: a hyperparameter step taken after that is recorded (and reported, if
    it fails) as the next step's.

    Example (a subclass needs ``name``, ``draw`` and ``take``)::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> class FirstPartitionOnly(IterationScheme):
        ...     name = "first-only"
        ...     def draw(self, sampler, hyper):
        ...         return Draw(sampler.parameter_batch()[1], 1)
        ...     def take(self, steps, draw):
        ...         steps.parameter_step(1, draw.indices)
        ...         steps.advance()
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> scheme = FirstPartitionOnly()
        >>> scheme.take(trainer.steps, scheme.draw(trainer.sampler, None))
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
    def take(self, steps: TrainingSteps, draw: Draw) -> None:
        """One iteration's steps on ``draw``."""


def _hyper_draw(sampler: PartitionedSampler, hyper: HyperEstimator | None) -> tuple[HyperBatches, str]:
    """A hyperparameter step's batches drawn by ``hyper`` and their description (none when ``hyper`` is None)."""
    if hyper is None:
        return [], ""
    batches = hyper.draw(sampler)
    return batches, hyper.describe(batches)


class Alternating(IterationScheme):
    """The paper's iteration: a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
    subnetwork k, then (when due) a hyperparameter step, which sees partition k already updated.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> Alternating().take(trainer.steps, Alternating().draw(trainer.sampler, None))
        >>> trainer.step, len(trainer.stepper.pending_losses()[0])
        (1, 1)
    """

    name = "alternating"

    def draw(self, sampler: PartitionedSampler, hyper: HyperEstimator | None) -> Draw:
        partitions, indices = self.parameter_examples(sampler)
        return Draw(indices, partitions, *_hyper_draw(sampler, hyper))

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[int | torch.Tensor, torch.Tensor]:
        """The parameter examples and the partition they train: one k for the minibatch."""
        return sampler.parameter_batch()

    def take(self, steps: TrainingSteps, draw: Draw) -> None:
        if isinstance(draw.partitions, torch.Tensor):
            steps.every_partition_step(draw.partitions, draw.indices)
        else:
            steps.parameter_step(draw.partitions, draw.indices)  # type: ignore[arg-type]
        steps.advance()
        if draw.hyper:
            steps.hyper_step(draw.hyper, draw.hyper_what)


class EveryPartition(Alternating):
    """As :class:`Alternating`, but in the parameter step each example draws its own partition k_i ~ Cat(u) and
    an example of D_1:k_i (``sampler.parameter_examples``), all in one forward and one backward: every partition
    drawn at least once is updated in each iteration.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> EveryPartition().take(trainer.steps, EveryPartition().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name = "every-partition"

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
        >>> Fused().take(trainer.steps, Fused().draw(trainer.sampler, None))
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

    def draw(self, sampler: PartitionedSampler, hyper: HyperEstimator | None) -> Draw:
        ks, indices = self.parameter_examples(sampler)
        return Draw(indices, ks, *_hyper_draw(sampler, hyper))

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ks, indices)``: the parameter examples and the partition each trains (here all the same k)."""
        k, indices = sampler.parameter_batch()
        return torch.full((indices.numel(),), k), indices

    def take(self, steps: TrainingSteps, draw: Draw) -> None:
        steps.fused_step(draw.partitions, draw.indices, draw.hyper)  # type: ignore[arg-type]
        steps.advance()


class FusedEveryPartition(Fused):
    """As :class:`Fused`, with every parameter example drawing its own partition (as :class:`EveryPartition`).

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 3), (torch.randn(60, 4), torch.zeros(60)))
        >>> FusedEveryPartition().take(trainer.steps, FusedEveryPartition().draw(trainer.sampler, None))
        >>> trainer.step
        1
    """

    name = "fused-every-partition"

    def parameter_examples(self, sampler: PartitionedSampler) -> tuple[torch.Tensor, torch.Tensor]:
        return sampler.parameter_examples()


# --- the phases of a run ---------------------------------------------------------------------------------------------


class Iterations:
    """The iterations of a run: ``scheme``'s in partitioned training, with a hyperparameter step by ``estimator``
    on every ``hyper_every``-th iteration after ``warmup_steps`` (never when ``estimator`` is None: nothing to
    learn); one fine-tuning step each once fine-tuning has begun.

    An iteration's draws are a function of the sampler and the step alone (:meth:`draw`), so the input pipeline
    can replay the iterations to come on a copy of the sampler (``training.data.planned_batches``).

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (torch.randn(32, 4), torch.zeros(32)))
        >>> iterations = Iterations(Alternating(), OneChunk(), hyper_every=2, warmup_steps=0)
        >>> [iterations.hyper_due(step) for step in (1, 2, 3, 4)]
        [False, True, False, True]
        >>> iterations.take(trainer.steps, iterations.draw(trainer.sampler, 1, finetuning=False))
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

    def draw(self, sampler: PartitionedSampler, step: int, finetuning: bool) -> Draw:
        """The draws of the iteration that completes ``step``, in the phase ``finetuning`` says."""
        if finetuning:
            return Draw(sampler.finetune_batch(), None)
        return self.scheme.draw(sampler, self.estimator_for(step))

    def take(self, steps: TrainingSteps, draw: Draw) -> None:
        """The steps of an iteration drawn by :meth:`draw`."""
        if draw.partitions is None:
            steps.finetune_step(draw.indices)
            steps.advance()
        else:
            self.scheme.take(steps, draw)


def scheme_for(fused: bool, every_partition: bool) -> IterationScheme:
    """The scheme the two options name; they compose.

    >>> type(scheme_for(fused=True, every_partition=True)).__name__
    'FusedEveryPartition'
    """
    if fused:
        return FusedEveryPartition() if every_partition else Fused()
    return EveryPartition() if every_partition else Alternating()
