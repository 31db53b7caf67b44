"""The steps of partitioned training, on examples given as tensors: a parameter step of one partition, a
hyperparameter step, the every-partition and fused steps, a fine-tuning step, and an evaluation; and the one
assembly of a run (:meth:`TrainingSteps.create`), which ``fit``'s trainer, your own loop and the Lightning module
each build theirs with.

Each step turns examples through the right subnetworks into losses (``training.objective.lml``'s) that the
:class:`~partition_fx.training.step.stepping.Stepper` turns into updates. Which steps an iteration takes is its
scheme's (``training.sampling.schemes``), which batches a hyperparameter step scores its estimator's
(``training.objective.estimators``), and which iterations fine-tune, take a hyperparameter step or evaluate the run's
:class:`~partition_fx.training.sampling.schedule.Schedule`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ...errors import PartitionArgumentError
from ...fx.partitioned_model import PartitionedModel
from ...job.train_config import HyperStep, TrainConfig
from ..objective.implicit import InnerBatch, through_training
from ..objective.likelihoods import Categorical, Likelihood, ModelLoss
from ..objective.lml import (
    EvaluationRecord,
    LMLEstimate,
    LMLEvaluator,
    ScoredBatch,
    buffers_restored,
    evaluation_record,
    forward_log_likelihood,
    hyper_loss,
    hyper_step_norms,
    routed_losses,
)
from ..objective.objective import Objective, parameter_step_spread, running_norms, takes_num_samples, widens
from ..objective.occam import OccamTerm, factored_layers
from ..sampling.chunks import BatchReader, DataChunks, Examples, StepInputs
from ..sampling.schedule import Schedule
from ..sampling.schemes import Draw, IterationBatch, scheme_for
from .optim import (
    OptimizerFactory,
    SchedulerFactory,
    build_optimizers,
    check_finetune_schedule,
    configured_factories,
    finetuning_scheduler,
)
from .stepping import LAZY_CHECK_EVERY, DataParallel, Precision, Stepper, warn_about_shared_parameters


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
        train_range_factor: float | Mapping[str, float] = 1.0,
        hyper_norms: str = "batch",
        config: TrainConfig | None = None,
        evaluator: LMLEvaluator | None = None,
        schedule: Schedule | None = None,
        occam: OccamTerm | None = None,
    ) -> None:
        self.objective = objective
        self.pmodel = objective.pmodel
        self.likelihood: Likelihood = objective.required_likelihood
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
        """Parameter steps draw the augmentation from its ranges times this, one factor or each generator's own
        (fine-tuning steps do not)."""
        self.hyper_norms = hyper_norms
        """What BatchNorm normalises hyperparameter steps' batches with (``lml.hyper_step_norms``)."""
        self.step = 0
        """Iterations done (``advance`` counts them); each step is recorded at it."""
        self.config = config
        """The recipe of the run (``create``'s): with it, :meth:`take` begins fine-tuning by itself."""
        self.evaluator = evaluator
        """The LML estimate of :attr:`objective` on the examples ``create`` was given to score (None: not asked)."""
        self.schedule = schedule
        """The run's timeline (``create``'s: the configuration's), which :meth:`begin_finetuning` records the
        phase in; None: the steps are taken one by one and know no run."""
        self.occam = occam
        """The whole network's Occam term the hyperparameter steps add (``training.objective.occam``; None: none)."""
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
                "a model that scores its targets itself (ModelLoss) trains in your own loop, not in fit or the LML "
                "estimate, which score the model's outputs with a likelihood: a classifier that returns logits (a "
                "Hugging Face model's output has a 'logits' field) trains in fit with likelihood='classification'; "
                "otherwise take each iteration's batch from a DataLoader on a PartitionedBatchSampler with "
                "steps.take(draw, inputs, targets) (docs/loops.md)"
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
        occam = None
        if learns and config.hyper.occam_term != "none":
            OccamTerm.check(objective.required_likelihood)
            factored_layers(pmodel)  # a convolution it cannot factor is refused now, not at the first refresh
            occam = OccamTerm(
                sum(chunks.sizes),
                config.hyper.samples if takes_num_samples(hyper) else None,
                config.hyper.norm_statistics,
                given=chunks.sizes[0] if config.hyper.occam_term == "conditional" else 0,
            )
        return cls(
            objective,
            StepInputs(read_ahead, device) if read_ahead is not None else None,
            stepper,
            device=device,
            data_parallel=data_parallel,
            # Fixed ranges are the augmentation chosen for the model: trained on as they are.
            hyper_samples=config.hyper.samples if takes_num_samples(hyper) else None,
            train_range_factor=(
                parameter_step_spread(hyper, config.hyper.train_range_factor, config.hyper.train_range_factors)
                if learns and widens(hyper)
                else 1.0
            ),
            hyper_norms=config.hyper.norm_statistics,
            config=config,
            evaluator=evaluator,
            schedule=Schedule.configured(config, learns),
            occam=occam,
        )

    def begin_finetuning(self, steps: int | None = None) -> None:
        """End partitioned training, the one switch of the phase (the trainer's run also restores the best state
        and stops its read-ahead first): the weight decay returns to the unscaled one and the LR schedule carries
        on or restarts over the next ``steps`` iterations (default: the rest of the :attr:`schedule`'s;
        ``optim.finetuning_scheduler``); the schedule records the step it began at. :meth:`take` calls it at the
        first fine-tuning iteration."""
        if self.config is None or self.schedule is None:
            raise PartitionArgumentError(
                "begin_finetuning needs the steps' config: build them with TrainingSteps.create"
            )
        remaining = steps if steps is not None else self.schedule.end - self.step
        stepper = self.stepper
        stepper.scheduler = finetuning_scheduler(self.config, stepper.optimizer, stepper.scheduler, remaining)
        self.schedule.began_finetuning(self.step)

    @property
    def finetuning(self) -> bool:
        """Whether the run is in its fine-tuning phase (:meth:`begin_finetuning`; the :attr:`schedule`'s)."""
        return self.schedule is not None and self.schedule.finetuning

    def evaluation(self, seconds: float, estimate_lml: Callable[[], LMLEstimate] | None = None) -> EvaluationRecord:
        """The evaluation of the run at :attr:`step`, the one ``fit``'s trainer and the Lightning module record:
        after the non-finite check (nothing is recorded from weights a non-finite step updated), the LML
        estimate (none in fine-tuning, where every subnetwork has seen every chunk; ``estimate_lml``, default the
        :attr:`evaluator`'s, as the trainer's ``estimate_lml`` gives it), the losses since the last evaluation
        (then cleared), the hyperparameters and ``seconds`` (the run's time so far)."""
        stepper = self.stepper
        stepper.check_nonfinite(self.step)  # before anything is recorded or written from these weights
        self.same_running_statistics()
        losses = stepper.pending_losses()
        # Once fine-tuning has trained every weight on every chunk, no subnetwork k-1 is unseen by chunk k:
        # there is no partitioned LML to estimate.
        estimate, scored = None, 0
        if not self.finetuning:
            if self.evaluator is None:
                raise PartitionArgumentError(
                    "these steps estimate no LML: build them with TrainingSteps.create(..., scored=examples)"
                )
            estimate = (estimate_lml or self.evaluator.estimate)()
            scored = sum(self.evaluator.chunks.sizes[1:])
        values = self.objective.hyperparameter_values()
        record = evaluation_record(self.step, estimate, scored, losses, values, seconds)
        stepper.clear_losses()
        return record

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
        (local,) = self.local(indices)
        return self._reader().batch(local, self.device)

    @property
    def read_ahead(self) -> StepInputs:
        """:attr:`examples` as the read-ahead ``create`` builds from its ``read_ahead`` examples (the trainer's
        steps), which the trainer starts, stops and closes; refused for steps that read none ahead."""
        if not isinstance(self.examples, StepInputs):
            raise PartitionArgumentError(
                "these training steps read no examples ahead: build them with TrainingSteps.create(..., "
                "read_ahead=examples)"
            )
        return self.examples

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
        inner_end = scored + len(draw.inner)
        hyper = [(weight, k, xh, yh) for (weight, k, _), xh, yh in zip(draw.hyper, xs[1:scored], ys[1:scored])]
        inner = [(p, xi, yi) for (p, _), xi, yi in zip(draw.inner, xs[scored:inner_end], ys[scored:inner_end])]
        occam = (xs[inner_end], ys[inner_end]) if draw.occam is not None else None
        return IterationBatch(partitions, (xs[0], ys[0]), hyper, inner, occam)

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
        self,
        batches: Sequence[ScoredBatch],
        description: str,
        inner: Sequence[InnerBatch] = (),
        *,
        occam: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Step psi on the ``(weight, k, x, y)`` batches (chunk k through subnetwork k-1); ``description``
        says what they score (``HyperEstimator.describe``). With ``inner`` ``(p, x, y)`` batches of D_1:p, the
        gradient also sees through partition p's training on them (``training.objective.implicit``: the configuration's
        ``implicit_terms`` and ``implicit_lr``, the parameter steps' range factor). With an Occam term
        (:attr:`occam`), its derivative is added, refreshed first on the examples ``occam`` = ``(x, y)`` when
        given. Returns the loss."""
        self.train_mode()
        occam_term = self.occam_term(occam)  # first: its forward moves running statistics the loss's backward reads
        with self.stepper.precision.autocast(), hyper_step_norms(self.pmodel, self.hyper_norms):
            loss = hyper_loss(self.pmodel, self.likelihood, self.hyper, batches, self.hyper_samples)
        if occam_term is not None:
            loss = loss + occam_term
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

    def occam_term(self, examples: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor | None:
        """What the hyperparameter step's loss adds for the Occam term (:attr:`occam`): a zero whose derivative
        in psi is the term's, refreshed first on ``examples`` when given; None without the term (nothing added, so
        a run without one is bit for bit what it was)."""
        if self.occam is None:
            if examples is not None:
                raise PartitionArgumentError(
                    "this draw refreshes an Occam term, but these steps have none: build them with a config whose "
                    "occam_term is 'whole' or 'conditional' (the draws of another config's PartitionedBatchSampler?)"
                )
            return None
        hyperparameters = self.stepper.hyperparameters
        if examples is not None:
            self.occam.refresh(self.pmodel, self.hyper, hyperparameters, *examples)
        return self.occam.term(hyperparameters)

    def every_partition_step(
        self, ks: torch.Tensor, x: torch.Tensor, y: torch.Tensor, drawn: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A parameter step in which example ``x[i]`` trains partition ``ks[i]`` through subnetwork ``ks[i]``:
        one forward and one backward, every partition drawn updated. ``drawn``: the partitions of the whole
        (global) minibatch, whose parameters every process steps alike (default: ``ks``). Returns the loss."""
        loss, _ = self._routed_losses(ks, (x, y), [])
        params, partitions = self.parameters_of(ks if drawn is None else drawn)
        return self.stepper.step(loss, None, params, f"parameter step of partitions {partitions}", self.step)

    def fused_step(
        self,
        ks: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        hyper_batches: Sequence[ScoredBatch],
        drawn: torch.Tensor | None = None,
        *,
        occam: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The parameter examples (as :meth:`every_partition_step`, ``drawn`` as there) and the hyperparameter
        batches (as :meth:`hyper_step`, ``occam`` as there; none: a parameter step only) in ONE forward and ONE
        backward. Returns the summed loss."""
        occam_term = self.occam_term(occam) if hyper_batches else None  # before the forward, as in hyper_step
        loss, hyper_loss = self._routed_losses(ks, (x, y), hyper_batches)
        if hyper_loss is not None and occam_term is not None:
            hyper_loss = hyper_loss + occam_term
        params, partitions = self.parameters_of(ks if drawn is None else drawn)
        return self.stepper.step(loss, hyper_loss, params, f"fused iteration (partitions {partitions})", self.step)

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


def _rows(batch: torch.Tensor | Sequence[Any], sizes: list[int]) -> Sequence[Any]:
    """A batch split into consecutive parts of ``sizes`` rows: a tensor's views, or a list's slices (the images and
    targets of a detection model)."""
    if isinstance(batch, torch.Tensor):
        views: tuple[torch.Tensor, ...] = batch.split(sizes)  # Tensor.split is unannotated in torch
        return views
    ends = list(itertools.accumulate(sizes))
    return [list(batch[end - size : end]) for end, size in zip(ends, sizes)]


def _placed(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``: a tensor, or every tensor of a list of tensors or of dicts of them."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), batch)
