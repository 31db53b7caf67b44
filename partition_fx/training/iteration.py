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

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.data import Sampler

from ..errors import PartitionArgumentError
from ..partitioned_model import PartitionedModel
from ..train_config import HyperStep, TrainConfig
from .data import BatchReader, DataChunks, Examples, InnerIndices, PartitionedSampler, ScoredIndices, StepInputs
from .implicit import InnerBatch, through_training
from .likelihoods import Categorical, Likelihood, ModelLoss
from .lml import (
    LMLEvaluator,
    ScoredBatch,
    buffers_restored,
    forward_log_likelihood,
    hyper_loss,
    hyper_step_norms,
    routed_losses,
)
from .objective import Objective, running_norms, takes_num_samples, widens
from .optim import (
    OptimizerFactory,
    SchedulerFactory,
    build_optimizers,
    check_finetune_schedule,
    configured_factories,
    finetuning_scheduler,
)
from .stepping import LAZY_CHECK_EVERY, DataParallel, Precision, Stepper, warn_about_shared_parameters

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
    def draw(self, sampler: PartitionedSampler) -> ScoredIndices:
        """The batches of one hyperparameter step, drawn from ``sampler``'s generator."""

    @abstractmethod
    def describe(self, batches: ScoredIndices) -> str:
        """What a step on ``batches`` scores, for messages (``"chunk D_2 through subnetwork 1"``)."""

    def inner(self, sampler: PartitionedSampler, batches: ScoredIndices) -> InnerIndices:
        """The ``(p, indices)`` minibatches of D_1:p whose training loss a hyper-gradient through training
        differentiates (``training.implicit``), drawn after ``batches``; none for a gradient at fixed weights."""
        return []


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

        >>> from partition_fx.training.data import split_into_chunks
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
    ``training.implicit``) a parameter-step-sized minibatch of D_1:p for every partition p that the scored
    subnetworks read (1..k-1 for the largest scored k): the examples partition p's training loss is
    differentiated on.

    Example::

        >>> from partition_fx.training.data import split_into_chunks
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


# --- the steps -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IterationBatch:
    """One iteration's examples as tensors, this process's share: the parameter (or fine-tuning) examples
    ``parameter`` = ``(x, y)`` and the ``partitions`` they train (as :attr:`Draw.partitions`, an int, one per
    example of this share, or None), the hyperparameter step's batches ``hyper`` = ``[(weight, k, x, y)]`` and
    the training examples its gradient through training differentiates, ``inner`` = ``[(p, x, y)]``."""

    partitions: int | torch.Tensor | None
    parameter: tuple[torch.Tensor, torch.Tensor]
    hyper: list[ScoredBatch] = field(default_factory=list)
    inner: list[InnerBatch] = field(default_factory=list)


class TrainingSteps:
    """Each kind of step of partitioned training, on examples given as tensors, and the count of iterations done
    (``step``), of ``objective`` (the model, input transform and likelihood). Every step puts the model and
    input transform in training mode, runs its forwards under the stepper's precision and hands the losses and
    the parameters they train to ``stepper``, recorded at ``step``.

    :meth:`take` runs a whole iteration drawn by a scheme (a :class:`Draw`): on the rows of ``x, y`` a user's
    ``DataLoader`` read for it (``PartitionedBatchSampler``), or, without them, on the rows read from
    ``examples`` (this process's share of them, ``data_parallel``): the trainer's way.

    Example (your own loop; ``docs/loops.md`` has the whole of it)::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical
        >>> from partition_fx.training import split_into_chunks
        >>> pmodel = partitionify(nn.Linear(3, 2), 2)
        >>> steps = TrainingSteps.create(pmodel, split_into_chunks(100, pmodel.proportions))
        >>> loss = steps.parameter_step(2, torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
        >>> steps.advance(); steps.step, loss.shape
        (1, torch.Size([]))
    """

    def __init__(
        self,
        objective: Objective,
        examples: BatchReader | None,
        stepper: Stepper,
        *,
        device: torch.device | None = None,
        data_parallel: DataParallel | None = None,
        hyper_samples: int | None = None,
        train_range_factor: float = 1.0,
        hyper_norms: str = "batch",
        config: TrainConfig | None = None,
        evaluator: LMLEvaluator | None = None,
    ) -> None:
        self.objective = objective
        self.pmodel = objective.pmodel
        self.likelihood = objective.likelihood
        self.hyper = objective.hyper
        self.examples = examples
        """What :meth:`read` reads examples from by their indices (None: the steps get tensors only; the trainer's
        are a ``StepInputs`` that reads them ahead)."""
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
        self.config = config
        """The recipe of the run (``create``'s): with it, :meth:`take` begins fine-tuning by itself."""
        self.evaluator = evaluator
        """The LML estimate of :attr:`objective` on the examples ``create`` was given to score (None: not asked)."""
        self.finetuning = False
        """Whether the run is in its fine-tuning phase (:meth:`begin_finetuning`): the one flag of the phase, which
        the trainer reads too."""
        self._statistics_modules = running_norms(self.pmodel) if data_parallel is not None else []

    @classmethod
    def create(
        cls,
        pmodel: PartitionedModel,
        chunks: DataChunks,
        *,
        hyper: nn.Module | None = None,
        likelihood: Likelihood | None = None,
        config: TrainConfig | None = None,
        optimizer: OptimizerFactory | None = None,
        hyper_optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        hyper_scheduler: SchedulerFactory | None = None,
        device: torch.device | None = None,
        scored: Examples | None = None,
        read_ahead: Examples | None = None,
        data_parallel: DataParallel | None = None,
        checkpoint_dir: Path | None = None,
    ) -> TrainingSteps:
        """The steps of a run as ``config`` (default ``TrainConfig()``) says, the one place a run is assembled:
        ``fit``'s trainer, your own loop and the Lightning module each get theirs here.

        What is trained (``pmodel``, the input transform ``hyper``, ``likelihood``, default ``Categorical()``),
        placed on ``device`` (None: where the model is; the examples :meth:`take` gets go there too) and compiled
        as the configuration says; the weights' optimiser (Adam ``lr``, its weight decay scaled per partition by
        the sizes of the data ``chunks``; ``optimizer=`` a factory of your own, as ``fit`` takes) and LR schedule
        (``scheduler=``), psi (the input transform's and the model's hyperparameter modules') by Adam ``hyper_lr``
        (``hyper_optimizer=``, ``hyper_scheduler=``), stepped under the configured precision with its non-finite
        checks; and the hyperparameter step's samples, range factor and BatchNorm treatment. With ``scored``, the
        LML evaluator on those examples (:attr:`evaluator`, seeded apart from the sampler); with ``read_ahead``,
        the steps read their examples by index from it, ahead of time (the trainer's way); with ``data_parallel``,
        every process starts from rank 0's modules and averages the gradients; ``checkpoint_dir`` is named in a
        non-finite error. When :meth:`take` meets the first fine-tuning iteration it calls
        :meth:`begin_finetuning`.

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import split_into_chunks
        >>> pmodel = partitionify(nn.Linear(3, 2), 2)
        >>> steps = TrainingSteps.create(pmodel, split_into_chunks(10, pmodel.proportions))
        >>> type(steps.likelihood).__name__, type(steps.stepper.optimizer).__name__, steps.stepper.hyper_optimizer
        ('Categorical', 'Adam', None)
        """
        config = config if config is not None else TrainConfig()
        runtime = config.runtime
        objective = Objective(
            pmodel,
            hyper,
            likelihood if likelihood is not None else Categorical(),
            checkpoint_defaults=config.checkpointing.defaults,
        )
        if isinstance(likelihood, ModelLoss) and (read_ahead is not None or scored is not None):
            raise PartitionArgumentError(
                "a model that scores its targets itself (ModelLoss) trains in your own loop: fit and the LML "
                "estimate read examples as tensors, its images and target dicts are lists; take each iteration's "
                "batch from a DataLoader on a PartitionedBatchSampler with steps.take(draw, images, targets) "
                "(docs/loops.md)"
            )
        if chunks.num_chunks != pmodel.num_partitions:
            raise PartitionArgumentError(
                f"the data is split into {chunks.num_chunks} chunks but the model has {pmodel.num_partitions} "
                "partitions: split it with split_into_chunks(len(dataset), pmodel.proportions)"
            )
        device = objective.place(device)
        if data_parallel is not None:
            data_parallel.broadcast(list(objective.modules().values()))
        if runtime.compile is not None:
            pmodel.compile(mode=runtime.compile)
        precision = Precision(runtime.precision, device)
        warn_about_shared_parameters(pmodel)
        hyperparameters = objective.hyperparameters()
        if hyperparameters and pmodel.num_partitions < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs num_partitions >= 2 (chunk k is scored by subnetwork k-1); "
                "partitionify the model with 2 or more partitions"
            )
        scheme_for(runtime.fused, runtime.every_partition).check(pmodel)
        check_finetune_schedule(config, scheduler)
        configured = configured_factories(config)  # unless a factory was given
        built = build_optimizers(
            pmodel,
            chunks.sizes,
            hyperparameters,
            optimizer=optimizer or configured[0],
            hyper_optimizer=hyper_optimizer or configured[1],
            scheduler=scheduler or configured[2],
            hyper_scheduler=hyper_scheduler,
            weight_decay_scaling=config.optimization.weight_decay_scaling,
        )
        on_cpu = device is None or device.type == "cpu"
        stepper = Stepper(
            built.optimizer,
            built.hyper_optimizer,
            objective=objective,
            scheduler=built.scheduler,
            hyper_scheduler=built.hyper_scheduler,
            precision=precision,
            data_parallel=data_parallel,
            # A read of the device costs nothing on the CPU: check every step there, lazily on an accelerator.
            check_every=runtime.check_every or (1 if on_cpu else LAZY_CHECK_EVERY),
            on_nonfinite=runtime.on_nonfinite,
            checkpoint_dir=checkpoint_dir,
        )
        evaluator = None
        if scored is not None:
            evaluator = LMLEvaluator(
                objective,
                scored,
                chunks,
                batch_size=config.evaluation.batch_size,
                max_examples_per_chunk=config.evaluation.examples_per_chunk,
                seed=runtime.seed + 1,  # not the sampler's stream
                device=device,
                precision=precision,
            )
        learns = built.hyper_optimizer is not None
        return cls(
            objective,
            StepInputs(read_ahead, device) if read_ahead is not None else None,
            stepper,
            device=device,
            data_parallel=data_parallel,
            # Fixed ranges are the augmentation chosen for the model: trained on as they are.
            hyper_samples=config.hyper.samples if takes_num_samples(hyper) else None,
            train_range_factor=config.hyper.train_range_factor if learns and widens(hyper) else 1.0,
            hyper_norms=config.hyper.norm_statistics,
            config=config,
            evaluator=evaluator,
        )

    def begin_finetuning(self, steps: int | None = None) -> None:
        """End partitioned training, the one switch of the phase (the trainer's also restores the best state and
        stops its read-ahead first): the weight decay returns to the unscaled one and the LR schedule carries on
        or restarts over the next ``steps`` iterations (default: the rest of ``config``'s;
        ``optim.finetuning_scheduler``). :meth:`take` calls it at the first fine-tuning iteration."""
        if self.config is None:
            raise PartitionArgumentError(
                "begin_finetuning needs the steps' config: build them with TrainingSteps.create"
            )
        remaining = steps if steps is not None else self.config.optimization.steps - self.step
        stepper = self.stepper
        stepper.scheduler = finetuning_scheduler(self.config, stepper.optimizer, stepper.scheduler, remaining)
        self.finetuning = True

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

    def read(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: this process's share of the examples ``indices``, read from :attr:`examples`."""
        return self._reader().batch(*self.local(indices), self.device)

    def _reader(self) -> BatchReader:
        if self.examples is None:
            raise PartitionArgumentError(
                "these training steps were given no examples to read by index: pass the iteration's batch, "
                "steps.take(draw, x, y), or build them with examples="
            )
        return self.examples

    def local_indices(self, draw: Draw) -> torch.Tensor:
        """The indices of the rows this process reads for ``draw``: its share of each batch, in the order of
        :meth:`Draw.reads`, in one tensor (what :meth:`take` reads in one batch)."""
        return torch.cat([self.local(indices)[0] for indices in draw.reads()])

    def take(self, draw: Draw, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
        """The steps of the iteration ``draw``: a fine-tuning step when ``draw.partitions`` is None, else those
        of the scheme that drew it (``draw.scheme``). ``x, y`` are its rows, in the order of
        :meth:`Draw.reads` (what a ``DataLoader`` on a ``PartitionedBatchSampler`` yields for it): tensors, or
        lists (a detection model's images and target dicts, with ``ModelLoss``); without them they are read
        from :attr:`examples` (:meth:`local_indices`)."""
        if x is None or y is None:
            if x is not None or y is not None:
                raise PartitionArgumentError("pass both x and y of the iteration's batch, or neither")
            x, y = self._reader().batch(self.local_indices(draw), self.device)
        elif self.device is not None:
            x, y = _placed(x, self.device), _placed(y, self.device)
        batch = self._split(draw, x, y)
        if draw.partitions is None and self.config is not None and not self.finetuning:
            self.begin_finetuning()
        if draw.partitions is None:
            self.finetune_step(*batch.parameter)
            self.advance()
        elif draw.scheme is None:
            raise PartitionArgumentError(
                "this draw names no scheme to take it: a scheme's draw() builds it with scheme=self"
            )
        else:
            draw.scheme.take(self, draw, batch)

    def _split(self, draw: Draw, x: torch.Tensor, y: torch.Tensor) -> IterationBatch:
        sizes = [self.local(indices)[0].numel() for indices in draw.reads()]
        if len(x) != sum(sizes) or len(y) != sum(sizes):
            raise PartitionArgumentError(
                f"the iteration's batch has {len(x)} inputs and {len(y)} targets, but its draw reads "
                f"{sum(sizes)} examples ({' + '.join(map(str, sizes))}, in the order of draw.reads()): build the "
                "DataLoader with batch_sampler=PartitionedBatchSampler(...), and no drop_last or shuffling"
            )
        xs, ys = _rows(x, sizes), _rows(y, sizes)
        partitions = draw.partitions
        if isinstance(partitions, torch.Tensor):
            partitions = self.local(partitions)[0]
        scored = 1 + len(draw.hyper)
        hyper = [(weight, k, xh, yh) for (weight, k, _), xh, yh in zip(draw.hyper, xs[1:scored], ys[1:scored])]
        inner = [(p, xi, yi) for (p, _), xi, yi in zip(draw.inner, xs[scored:], ys[scored:])]
        return IterationBatch(partitions, (xs[0], ys[0]), hyper, inner)

    def parameter_step(self, k: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Train partition k on the examples ``x, y`` (of D_1:k) through subnetwork k; returns the loss."""
        self.train_mode()
        with self.stepper.precision.autocast():
            loss = -forward_log_likelihood(
                self.pmodel, self.likelihood, x, y, k, self.hyper, transform_grad=False, widen=self.train_range_factor
            ).mean()
        what = f"parameter step of partition {k} (subnetwork {k}, data D_1:{k})"
        return self.stepper.step(loss, None, self.pmodel.partition_parameters(k), what, self.step)

    def hyper_step(
        self, batches: Sequence[ScoredBatch], description: str, inner: Sequence[InnerBatch] = ()
    ) -> torch.Tensor:
        """Step psi on the ``(weight, k, x, y)`` batches (chunk k through subnetwork k-1); ``description``
        says what they score (``HyperEstimator.describe``). With ``inner`` ``(p, x, y)`` batches of D_1:p, the
        gradient also sees through partition p's training on them (``training.implicit``: the configuration's
        ``implicit_terms`` and ``implicit_lr``, the parameter steps' range factor). Returns the loss."""
        self.train_mode()
        with self.stepper.precision.autocast(), hyper_step_norms(self.pmodel, self.hyper_norms):
            loss = hyper_loss(self.pmodel, self.likelihood, self.hyper, batches, self.hyper_samples)
        what = f"hyperparameter step ({description})"
        if not inner:
            return self.stepper.step(None, loss, [], what, self.step)
        settings = self.config.hyper if self.config is not None else HyperStep()
        # Partition p's training loss is differentiated, not stepped: its forwards leave no running statistics.
        with buffers_restored(self.pmodel):
            with self.stepper.precision.autocast():
                loss = loss + through_training(
                    self.pmodel, self.likelihood, self.hyper, loss, inner, terms=settings.implicit_terms,
                    lr=settings.implicit_lr, widen=self.train_range_factor,
                )  # fmt: skip
            return self.stepper.step(None, loss, [], what, self.step)

    def every_partition_step(
        self, ks: torch.Tensor, x: torch.Tensor, y: torch.Tensor, drawn: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A parameter step in which example ``x[i]`` trains partition ``ks[i]`` through subnetwork ``ks[i]``:
        one forward and one backward, every partition drawn updated. ``drawn``: the partitions of the whole
        (global) minibatch, whose parameters every process steps alike (default: ``ks``). Returns the loss."""
        loss, _ = self._routed_losses(ks, (x, y), [])
        params, drawn = self.parameters_of(ks if drawn is None else drawn)
        return self.stepper.step(loss, None, params, f"parameter step of partitions {drawn}", self.step)

    def fused_step(
        self,
        ks: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        hyper_batches: Sequence[ScoredBatch],
        drawn: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The parameter examples (as :meth:`every_partition_step`, ``drawn`` as there) and the hyperparameter
        batches (as :meth:`hyper_step`; none: a parameter step only) in ONE forward and ONE backward. Returns
        the summed loss."""
        loss, hyper_loss = self._routed_losses(ks, (x, y), hyper_batches)
        params, drawn = self.parameters_of(ks if drawn is None else drawn)
        return self.stepper.step(loss, hyper_loss, params, f"fused iteration (partitions {drawn})", self.step)

    def finetune_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Train every weight of the final subnetwork C on the examples ``x, y`` (any chunk), with the input
        transform's psi fixed; returns the loss."""
        self.train_mode()
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
        self, ks: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor], hyper: Sequence[ScoredBatch]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The parameter loss and (if ``hyper`` lists batches) the hyperparameter loss in one forward."""
        self.train_mode()
        with self.stepper.precision.autocast():
            return routed_losses(
                self.pmodel, self.likelihood, self.hyper, ks, batch, hyper, self.hyper_samples,
                self.train_range_factor,
            )  # fmt: skip


def _rows(batch: torch.Tensor | Sequence, sizes: list[int]) -> Sequence:
    """A batch split into consecutive parts of ``sizes`` rows: a tensor's views, or a list's slices (the images and
    targets of a detection model)."""
    if isinstance(batch, torch.Tensor):
        return batch.split(sizes)
    ends = list(itertools.accumulate(sizes))
    return [list(batch[end - size : end]) for end, size in zip(ends, sizes)]


def _placed(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``: a tensor, or every tensor of a list of tensors or of dicts of them."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), batch)


# --- iteration schemes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """What one iteration draws from the sampler, as plain data, before any of its steps runs: the parameter
    (or fine-tuning) examples ``indices``; ``partitions``, the partition they train (an int, the paper's k; a
    tensor: one per example; None: a fine-tuning step, every partition); and the hyperparameter step's
    ``hyper`` batches (empty when none is due), which ``hyper_what`` describes in messages; and the ``scheme``
    that drew it, whose steps take it (``TrainingSteps.take``; None for a fine-tuning step's).

    The draws come from the sampler's own generator and nothing else, so drawing an iteration whole before
    taking its steps is drawing it as the steps go, and replaying draws on a copy of the sampler says what the
    iterations to come will read (:meth:`reads`; ``training.data.planned_batches``).

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

    def reads(self) -> list[torch.Tensor]:
        """The index batches the iteration's steps read, in the order they read them."""
        return [self.indices, *(indices for _, _, indices in self.hyper), *(indices for _, indices in self.inner)]


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
            steps.every_partition_step(batch.partitions, *batch.parameter, drawn=draw.partitions)  # type: ignore[arg-type]
        else:
            steps.parameter_step(batch.partitions, *batch.parameter)  # type: ignore[arg-type]
        steps.advance()
        if batch.hyper:
            steps.hyper_step(batch.hyper, draw.hyper_what, batch.inner)


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
        steps.fused_step(batch.partitions, *batch.parameter, batch.hyper, drawn=draw.partitions)  # type: ignore[arg-type]
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
        >>> trainer.steps.take(iterations.draw(trainer.sampler, 1, finetuning=False))
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

    @classmethod
    def configured(cls, config: TrainConfig, learns: bool) -> Iterations:
        """The iterations ``config`` describes (its scheme, hyperparameter estimator, ``hyper_every`` and
        ``warmup_steps``), with hyperparameter steps only if the run ``learns`` some.

        >>> Iterations.configured(TrainConfig(), learns=True).estimator.name
        'all'
        """
        hyper = config.hyper
        return cls(
            scheme_for(config.runtime.fused, config.runtime.every_partition),
            estimator_for(hyper.chunks, hyper.gradient) if learns else None,
            hyper_every=hyper.every,
            warmup_steps=hyper.warmup_steps,
        )


class PartitionedBatchSampler(Sampler[list[int]]):
    """The examples of a partitioned training run for your own ``DataLoader``: ``DataLoader(dataset,
    batch_sampler=PartitionedBatchSampler(chunks, config))`` yields one batch per iteration, the rows of
    :meth:`Draw.reads` one after another (the parameter step's, then each hyperparameter batch's), and
    :meth:`draws` yields the :class:`Draw` of each, so that ``steps.take(draw, x, y)`` (``TrainingSteps``)
    knows which rows train which partition and which score psi.

    The iterations are ``config``'s (``TrainConfig``, default ``TrainConfig()``, what ``fit`` trains with): its
    ``steps``, ``batch_size``, hyperparameter step (``hyper_every``, ``hyper_chunks``, ``hyper_batch_size``,
    ``warmup_steps``; none with ``hyperparameters=False``), scheme (``fused``, ``every_partition``), the last
    ``finetune_steps`` fine-tuning on all the data, and ``seed``: the draws of ``fit`` with that configuration,
    iteration for iteration. Every pass over the sampler draws the same run again, from iteration ``start`` + 1
    (a resumed loop's). ``chunks`` are the examples' split into the model's C chunks (``split_into_chunks``).

    >>> from partition_fx.training import split_into_chunks
    >>> config = TrainConfig.recommended(steps=4, batch_size=3, hyper_batch_size=2, hyper_every=2, seed=0)
    >>> batches = PartitionedBatchSampler(split_into_chunks(20, (0.5, 0.5)), config)
    >>> [len(indices) for indices in batches]  # 3 parameter examples, + 2 of chunk 2 every 2nd iteration
    [3, 5, 3, 3]
    >>> [draw.partitions for draw in batches.draws()][-1] is None  # the last 0.4: fine-tuning
    True
    """

    def __init__(
        self, chunks: DataChunks, config: TrainConfig | None = None, *, hyperparameters: bool = True, start: int = 0
    ) -> None:
        super().__init__()
        self.chunks = chunks
        self.config = config if config is not None else TrainConfig()
        if hyperparameters and chunks.num_chunks < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs at least 2 chunks (chunk k is scored by subnetwork k-1): split "
                "the data into the model's num_partitions >= 2 chunks, or pass hyperparameters=False"
            )
        self.iterations = Iterations.configured(self.config, learns=hyperparameters)
        steps = self.config.optimization.steps
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= steps:
            raise PartitionArgumentError(f"start must be the iterations done, an int in 0..{steps}; got {start!r}")
        self.start = start
        self.finetune_from = steps - self.config.finetune_steps
        """Iterations after this one fine-tune."""

    def __len__(self) -> int:
        return self.config.optimization.steps - self.start

    def __iter__(self) -> Iterator[list[int]]:
        for draw in self.draws():
            yield torch.cat(draw.reads()).tolist()

    def draws(self) -> Iterator[Draw]:
        """The :class:`Draw` of each iteration after ``start``, in order: what each batch of :meth:`__iter__` is."""
        optimization = self.config.optimization
        sampler = PartitionedSampler(
            self.chunks, optimization.batch_size, self.config.hyper.batch_size, self.config.runtime.seed
        )
        for step in range(1, optimization.steps + 1):
            draw = self.iterations.draw(sampler, step, finetuning=step > self.finetune_from)
            if step > self.start:
                yield draw


def scheme_for(fused: bool, every_partition: bool) -> IterationScheme:
    """The scheme the two options name; they compose.

    >>> type(scheme_for(fused=True, every_partition=True)).__name__
    'FusedEveryPartition'
    """
    if fused:
        return FusedEveryPartition() if every_partition else Fused()
    return EveryPartition() if every_partition else Alternating()
