"""``PartitionedTrainer``: partitioned training with hyperparameters learned by the LML, one step at a time,
and the run that strings the steps together (``run``; ``fit`` is the one-call front).

One iteration (appendix I.1): a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
subnetwork k, then (every ``hyper_every`` iterations after ``warmup_steps``) a hyperparameter step on a
minibatch of D_k, k ~ Cat(u_2..u_C), through subnetwork k-1. The model optimiser holds the partitions,
the hyperparameter optimiser holds psi: the parameters of ``hyper`` (an input transform such as
``AffineAugmentation``), of ``HyperparameterModule`` s inside the model (``ConcreteDropout``), and of the
likelihood (a Gaussian's noise scale).

The trainer builds its collaborators from its configuration, each from explicit values and usable alone: what is
trained (``training.objective``), the data and sampler (``training.data``), the iteration scheme, estimator and
steps (``training.iteration``), the stepper (``training.stepping``) and the LML evaluator (``training.lml``). It
keeps its own state (the step's evaluations, the best one, the fine-tuning phase) and the run; a run reads the
configuration again for what may be changed for it (``run(..., eval_every=...)``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import link_file
from .._validation import check_callable, check_device, check_directory, check_flag, check_given_partition
from ..errors import PartitionArgumentError, PartitionCheckpointError, PartitionTypeError
from ..partitioned_model import PartitionedModel
from ..train_config import TrainConfig
from .checkpoint import differences, save_training_state
from .data import (
    DataChunks,
    Examples,
    HyperBatches,
    PartitionedSampler,
    StepInputs,
    default_workers,
    planned_batches,
    resolve_chunks,
)
from .iteration import (
    AllChunks,
    Iterations,
    OneChunk,
    TrainingSteps,
    check_learnable,
    configured_step_keywords,
    scheme_for,
)
from .likelihoods import Likelihood, resolve_likelihood
from .lml import (
    HyperBatch,
    LMLEstimate,
    LMLEvaluator,
    evidence,
    lml_fields,
    recalibrate_norm_statistics,
    recalibrated_states,
)
from .objective import ModuleStates, Objective, takes_num_samples, widens
from .optim import (
    OptimizerFactory,
    SchedulerFactory,
    build_optimizers,
    check_finetune_schedule,
    configured_factories,
    finetuning_scheduler,
)
from .progress import ProgressLines, progress_outputs
from .stepping import LAZY_CHECK_EVERY, DataParallel, Precision, Stepper, warn_about_shared_parameters


@dataclass
class FitResult:
    """What ``fit`` returns; ``to_dict()`` is plain JSON."""

    lml: float
    """The final LML estimate (nats, summed over the training set), of the returned model."""
    history: list[dict[str, Any]]
    """Per evaluation: ``step``, ``phase`` (``partitioned`` or ``finetune``; no LML in the latter), ``lml``,
    ``lml_per_chunk``, ``lml_per_example``, ``conditional_lml`` (the sum over chunks 2..C, see
    ``LMLEstimate.conditional``), ``conditional_lml_per_example`` (over the examples of chunks 2..C),
    ``train_loss`` (mean
    parameter-step loss since the last evaluation), ``hyper_loss``, ``hyperparameters``, ``seconds``."""
    conditional_lml: float | None
    """The final estimate of log p(D_2:C | D_1, psi): the LML without its chunk-1 term (None when C = 1)."""
    hyperparameters: dict[str, Any]
    """Name -> value (plain floats/lists), e.g. ``{"rotation": 2.9, ...}`` (radians)."""
    steps: int
    best_step: int
    """The iteration of the best evaluation: the highest conditional LML (the full LML when C = 1; see
    ``training.lml.evidence``)."""
    best_lml: float
    """The full LML of the best evaluation."""
    stopped_early: bool
    chunk_sizes: list[int]
    seconds: float
    skipped_steps: int = 0
    recalibrated_norms: int = 0
    """BatchNorm modules whose running statistics were recomputed for the final subnetwork at the end."""
    best_conditional_lml: float | None = None
    """The conditional LML of the best evaluation, which chose it."""
    finetune_start: int | None = None
    """The iteration fine-tuning began at (``fit(..., finetune_steps=...)``), or None: no fine-tuning. The
    ``lml``s are then those of partitioned training (its last or, with ``restore_best``, best evaluation)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- what a run is given besides its configuration -------------------------------------------------------------------


def check_takes_num_samples(hyper: nn.Module | None) -> None:
    """Refuse ``hyper_samples`` given for an input transform that cannot be asked for a number of samples."""
    if hyper is None:
        raise PartitionArgumentError(
            "hyper_samples sets the input transform's samples in hyperparameter steps, but there is no input "
            "transform: pass hyper=AffineAugmentation(...) or leave hyper_samples out"
        )
    if not takes_num_samples(hyper):
        raise PartitionArgumentError(
            f"hyper_samples needs an input transform whose forward takes num_samples= (as AffineAugmentation's "
            f"does); {type(hyper).__name__}.forward does not: leave hyper_samples out or add the argument"
        )


def check_widens(hyper: nn.Module | None, factor: float) -> None:
    """Refuse ``train_range_factor`` other than 1 given for an input transform that cannot widen its ranges."""
    if factor != 1.0 and not widens(hyper):
        what = "there is no input transform" if hyper is None else f"{type(hyper).__name__} has no widened()"
        raise PartitionArgumentError(
            f"train_range_factor={factor} scales the input transform's ranges in parameter steps, but {what}; "
            "pass an AffineAugmentation or leave train_range_factor out"
        )


@dataclass(frozen=True)
class Components:
    """What a :class:`~partition_fx.training.PartitionedTrainer` is given besides its configuration (see
    :func:`~partition_fx.training.fit` for each). Checked on construction; ``likelihood``, ``checkpoint_dir``
    and ``device`` are stored resolved (a ``Likelihood`` module, a ``Path``, a ``torch.device``).

    Example::

        >>> components = Components(likelihood="regression")
        >>> type(components.likelihood).__name__, components.hooks
        ('Gaussian', ())
        >>> Components(optimizer="adam")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionTypeError: optimizer must be a callable ...
    """

    hyper: nn.Module | None = None
    likelihood: str | Likelihood | Callable[..., torch.Tensor] = "classification"
    optimizer: OptimizerFactory | None = None
    hyper_optimizer: OptimizerFactory | None = None
    scheduler: SchedulerFactory | None = None
    hyper_scheduler: SchedulerFactory | None = None
    chunks: DataChunks | torch.Tensor | Sequence[int] | None = None
    checkpoint_dir: str | Path | None = None
    device: torch.device | str | None = None
    hooks: Sequence[TrainingHook] = ()
    data_parallel: bool | None = None

    def __post_init__(self) -> None:
        if self.hyper is not None and not isinstance(self.hyper, nn.Module):
            raise PartitionTypeError(
                f"hyper must be an nn.Module (e.g. AffineAugmentation()), got {type(self.hyper).__name__}"
            )
        check_callable("optimizer", self.optimizer, "functools.partial(torch.optim.Adam, lr=1e-3)")
        check_callable("hyper_optimizer", self.hyper_optimizer, "functools.partial(torch.optim.Adam, lr=0.05)")
        schedule = "functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)"
        check_callable("scheduler", self.scheduler, schedule)
        check_callable("hyper_scheduler", self.hyper_scheduler, schedule)
        if self.data_parallel is not None:
            check_flag("data_parallel", self.data_parallel)
        self._set("hooks", check_sequence_of("hooks", self.hooks, TrainingHook, "TrainingHook s", "a TrainingHook"))
        self._set("likelihood", resolve_likelihood(self.likelihood))
        self._set("checkpoint_dir", check_directory("checkpoint_dir", self.checkpoint_dir))
        self._set("device", check_device(self.device))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # a frozen dataclass stores its own normalised values


def resolve(where: str, config: TrainConfig | None, keywords: dict[str, Any]) -> tuple[TrainConfig, Components]:
    """The configuration (``config``, default the recommended one, changed by the configuration's keywords in
    ``keywords``) and the components (the other keywords) a run is built from; an unknown keyword is refused
    naming ``where`` and every keyword it takes.

    >>> config, components = resolve("fit", None, {"batch_size": 32, "likelihood": "regression"})
    >>> config.optimization.batch_size, type(components.likelihood).__name__
    (32, 'Gaussian')
    """
    if config is not None and not isinstance(config, TrainConfig):
        raise PartitionTypeError(f"{where}'s config must be a TrainConfig, got {type(config).__name__}")
    settings = TrainConfig.keywords()
    objects = {f.name for f in fields(Components)}
    unknown = sorted(set(keywords) - set(settings) - objects)
    if unknown:
        raise PartitionTypeError(
            f"{where} got unknown argument(s) {', '.join(unknown)}; it takes {', '.join(sorted({*settings, *objects}))}"
        )
    changes = {k: v for k, v in keywords.items() if k in settings}
    if config is None and keywords.get("scheduler") is not None:
        # A scheduler factory of the user's replaces the recommended lr_schedule, which is what a restart
        # restarts: unless a restart is asked for by name (and refused), the factory spans both phases.
        changes.setdefault("finetune_schedule", "continue")
    config = (config if config is not None else TrainConfig.recommended()).replace(**changes)
    components = Components(**{k: v for k, v in keywords.items() if k in objects})
    if changes.get("hyper_samples") is not None:  # asked for by name: a transform must be able to take it
        check_takes_num_samples(components.hyper)
    if "train_range_factor" in changes:  # likewise: a transform must be able to scale its ranges
        check_widens(components.hyper, config.hyper.train_range_factor)
    return config, components


def check_run_arguments(callbacks: Any, progress: Any) -> tuple[Callback, ...]:
    """``callbacks`` as a tuple if it is a list of callables ``cb(trainer, record)``, and ``progress`` None or a
    bool: what a run of the loop takes besides its configuration."""
    if progress is not None:
        check_flag("progress", progress)
    return check_sequence_of(
        "callbacks", callbacks, callable, "callables cb(trainer, record)", "a callable cb(trainer, record)"
    )


def check_sequence_of(
    name: str, values: Any, kind: type | Callable[[Any], bool], many: str, one: str
) -> tuple[Any, ...]:
    """``values`` as a tuple if it is a list of ``kind`` (a class, or a predicate such as ``callable``);
    ``many``/``one`` name what it holds in the refusal."""
    if callable(values) or isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise PartitionTypeError(f"{name} must be a list of {many}, got {values!r}")
    values = tuple(values)
    for i, value in enumerate(values):
        if not (isinstance(value, kind) if isinstance(kind, type) else kind(value)):
            raise PartitionTypeError(f"{name}[{i}] must be {one}, got {value!r}")
    return values


# --- hooks -----------------------------------------------------------------------------------------------------------


Callback = Callable[["PartitionedTrainer", dict[str, Any]], "bool | None"]
"""``cb(trainer, record)`` after each evaluation (``trainer``: the ``PartitionedTrainer``); True stops training."""


class TrainingHook:
    """Override any method; the trainer calls them in the order the hooks were added to ``trainer.hooks``.

    A hook that holds state a resumed run needs keeps it itself: :meth:`state_dict` goes into the run's resume
    directory with the trainer's own state, under the hook's :attr:`state_key`, and :meth:`load_state_dict`
    gets it back when the run resumes, before :meth:`before_run`.

    Example::

        >>> class Count(TrainingHook):
        ...     def __init__(self):
        ...         self.evaluations = 0
        ...     def after_evaluation(self, trainer, record, improved):
        ...         self.evaluations += 1
        ...     def state_dict(self):
        ...         return {"evaluations": self.evaluations}
        ...     def load_state_dict(self, state):
        ...         self.evaluations = state["evaluations"]
        >>> Count().before_run(None); Count().after_run(None, None)  # the other methods do nothing
        >>> Count().should_stop(None, {}), Count().state_key
        (False, 'Count')
    """

    @property
    def state_key(self) -> str:
        """The name the hook's state is saved under: its class's name (override it to give two hooks of one
        class that both hold state their own)."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this hook, as JSON-ready values; ``{}`` (the default): nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, when a run resumes from a state saved with it."""

    def before_run(self, trainer: PartitionedTrainer) -> None:
        """When the training loop starts, after a resumed run's state was loaded: from here on the run is under
        way (what failed before it, such as a refused resume, changed nothing)."""

    def after_evaluation(self, trainer: PartitionedTrainer, record: dict[str, Any], improved: bool) -> None:
        """After an evaluation's ``record`` joined ``trainer.history``; ``improved``: a new best LML."""

    def should_stop(self, trainer: PartitionedTrainer, record: dict[str, Any]) -> bool:
        """Asked by the training loop after each evaluation (after every hook's ``after_evaluation`` and the
        progress output), in order until one says True: whether to end the run now."""
        return False

    def before_finetuning(self, trainer: PartitionedTrainer) -> None:
        """When partitioned training ends and fine-tuning begins (``trainer.history[-1]`` is the last
        partitioned evaluation); on a resumed run it may run again for the same state."""

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        """After a run ended (``result``: its ``FitResult``), with the model in the state the run returns:
        the best state restored if asked, BatchNorm statistics recalibrated."""


class CallbackHook(TrainingHook):
    """A run's ``callbacks=`` as a hook: after each evaluation each ``cb(trainer, record)`` is called in order,
    and the first one to return True ends the run (the later ones are not called for that evaluation). The
    training loop asks it last, after the trainer's own hooks.

    Example::

        >>> calls = []
        >>> hook = CallbackHook([lambda trainer, record: calls.append(record["step"]), lambda t, r: r["step"] >= 4])
        >>> hook.should_stop(None, {"step": 2}), hook.should_stop(None, {"step": 4}), calls
        (False, True, [2, 4])
    """

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = tuple(callbacks)

    def should_stop(self, trainer: PartitionedTrainer, record: dict[str, Any]) -> bool:
        return any(bool(cb(trainer, record)) for cb in self.callbacks)


class CheckpointWriter(TrainingHook):
    """Keeps a run recoverable and exportable under ``directory`` (``trainer.hooks``; ``fit`` adds one for
    ``checkpoint_dir``).

    After each evaluation: ``last.safetensors``; ``best.safetensors`` when the LML improved (a hard link to
    ``last``, so no second copy on disk); the resume directory ``resume/``; ``trainer.stepper.last_checkpoint_step``.
    Their BatchNorm statistics are training's (``norm_statistics: "training"``).

    At the end of a run: ``last.safetensors`` again, with the state the run returns (BatchNorm statistics
    recalibrated for the final subnetwork, the best state if restored), so an export of it reproduces the
    run's reported test accuracy; and, when the run recalibrated its statistics, ``best.safetensors`` again
    with the best evaluation's state recalibrated the same way (``norm_statistics: "final"``): a hard link to
    ``last`` when that is the same state, else one more recalibration pass, on a copy of the model.

    Example::

        >>> import tempfile, torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (x, y), batch_size=8)
        >>> trainer.hooks.append(CheckpointWriter(tempfile.mkdtemp()))
        >>> _ = trainer.run(2, progress=False)
        >>> trainer.stepper.last_checkpoint_step
        2
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def after_evaluation(self, trainer: PartitionedTrainer, record: dict[str, Any], improved: bool) -> None:
        last = self.directory / "last.safetensors"
        trainer.save_checkpoint(last)
        if improved:
            link_file(last, self.directory / "best.safetensors")
        save_training_state(trainer, self.directory / "resume")
        trainer.stepper.last_checkpoint_step = trainer.step  # a non-finite error says it is kept

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        last, best = self.directory / "last.safetensors", self.directory / "best.safetensors"
        calibrated = bool(result.recalibrated_norms)
        trainer.save_checkpoint(last, final=True, norm_statistics="final" if calibrated else None)
        if not calibrated or trainer.best is None:
            return  # no statistics to calibrate (or not asked to): the evaluation's best file is the best state
        score, step, states = trainer.best
        if not trainer.objective.is_current(states):
            recalibrated = recalibrated_states(
                trainer.pmodel, states, trainer.examples, trainer.eval_batch_size, trainer.device
            )
            trainer.save_checkpoint(best, best=(score, step, recalibrated), norm_statistics="final")
        elif step == trainer.step:
            link_file(last, best)  # the same state: no second copy on disk
        else:  # the run restored the best state and recalibrated it: last's tensors with the best's step and LML
            trainer.save_checkpoint(
                best, final=True, norm_statistics="final", best=(score, step, trainer.objective.states())
            )


# --- the trainer -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """One run of the loop: iterate until step ``end``, switch to fine-tuning at step ``switch`` (None: never),
    evaluate, stop and finish as ``config`` says, call ``callbacks`` after each evaluation, show ``progress``."""

    end: int
    switch: int | None
    config: TrainConfig
    callbacks: Sequence[Callback] = ()
    progress: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "callbacks", check_run_arguments(self.callbacks, self.progress))


class PartitionedTrainer:
    """Partitioned training of ``pmodel`` on ``dataset`` with hyperparameters learned by the LML.

    Built from a :class:`~partition_fx.train_config.TrainConfig` (default the recommended one) and keywords, as
    :func:`~partition_fx.training.fit` is (or from ``components`` already resolved); exposes the single steps
    (``parameter_step``, ``hyper_step``, ``evaluate``) for custom loops and tests, and
    ``state_dict()``/``load_state_dict()`` for everything a resumed run needs: the iterations done, the evaluations
    (``history``), the best one so far (``best``: score, step and kept module states), the step fine-tuning began
    at (``finetune_start``), the modules, the optimisers, schedulers and pending losses, and every random
    generator (torch's, the sampler's and the LML estimate's).

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (x, y), batch_size=16)
        >>> k, loss = trainer.parameter_step()  # loss: a 0-dim tensor, still on the device
        >>> k in (1, 2) and float(loss) > 0
        True
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        dataset: Any,
        config: TrainConfig | None = None,
        *,
        components: Components | None = None,
        **keywords: Any,
    ) -> None:
        if components is None:
            config, components = resolve("PartitionedTrainer", config, keywords)
        elif keywords or config is None:
            raise PartitionTypeError("pass a TrainConfig with components=, or keywords without them, not both")
        if not isinstance(pmodel, PartitionedModel):
            raise PartitionTypeError(
                f"fit needs a PartitionedModel (from partitionify(model)), got {type(pmodel).__name__}"
            )
        self.config: TrainConfig = config  # type: ignore[assignment]
        self.components = components
        optimization, hyper_step, evaluation, runtime = (
            config.optimization, config.hyper, config.evaluation, config.runtime
        )  # fmt: skip
        self.pmodel = pmodel
        self.hyper = components.hyper
        self.likelihood = components.likelihood
        self.objective = Objective(
            pmodel, self.hyper, self.likelihood, checkpoint_defaults=config.checkpointing.defaults
        )
        """What is trained: the model, its input transform and its likelihood."""
        self.fused = runtime.fused
        self.every_partition = runtime.every_partition
        self.seed = runtime.seed
        self.eval_batch_size = evaluation.batch_size
        self.checkpoint_dir: Path | None = components.checkpoint_dir  # type: ignore[assignment]
        self.examples = Examples(dataset, workers=default_workers(runtime.workers, dataset), prefetch=runtime.prefetch)
        self.chunks = resolve_chunks(components.chunks, len(self.examples), pmodel.proportions, self.seed)
        self.sampler = PartitionedSampler(self.chunks, optimization.batch_size, hyper_step.batch_size, self.seed)
        self.device = self.objective.place(components.device)  # type: ignore[arg-type]
        self.inputs = StepInputs(self.examples, self.device)
        """The steps' minibatches, read ahead by the workers in the order the sampler will draw them."""
        self.data_parallel = DataParallel.from_environment(components.data_parallel)
        """The process group gradients are averaged over (``training.stepping.DataParallel``), or None."""
        if self.data_parallel is not None:
            self.data_parallel.check_batch_size("batch_size", optimization.batch_size)
            self.data_parallel.check_batch_size("hyper_batch_size", self.sampler.hyper_batch_size)
            self.data_parallel.broadcast(list(self.objective.modules().values()))
        if runtime.compile is not None:
            pmodel.compile(mode=runtime.compile)
        self.precision = Precision(runtime.precision, self.device)
        warn_about_shared_parameters(pmodel)
        self.hyperparameters_list = self.objective.hyperparameters()
        check_learnable(pmodel, self.hyperparameters_list)
        scheme = scheme_for(self.fused, self.every_partition)
        scheme.check(pmodel)
        check_finetune_schedule(config, components.scheduler)
        optimizer, hyper_optimizer, scheduler = configured_factories(config)  # unless a factory was given
        self.optimizer, self.hyper_optimizer, self.scheduler, self.hyper_scheduler = build_optimizers(
            pmodel,
            self.chunks.sizes,
            self.hyperparameters_list,
            optimizer=components.optimizer or optimizer,
            hyper_optimizer=components.hyper_optimizer or hyper_optimizer,
            scheduler=components.scheduler or scheduler,
            hyper_scheduler=components.hyper_scheduler,
            weight_decay_scaling=optimization.weight_decay_scaling,
        )
        learns = self.hyper_optimizer is not None
        self.iterations = Iterations.configured(config, learns)
        """What each iteration does: the scheme's, with a hyperparameter step when due, or a fine-tuning step."""
        on_cpu = self.device is None or self.device.type == "cpu"
        self.stepper = Stepper(
            self.optimizer,
            self.hyper_optimizer,
            objective=self.objective,
            scheduler=self.scheduler,
            hyper_scheduler=self.hyper_scheduler,
            precision=self.precision,
            data_parallel=self.data_parallel,
            # A read of the device costs nothing on the CPU: check every step there, lazily on an accelerator.
            check_every=runtime.check_every or (1 if on_cpu else LAZY_CHECK_EVERY),
            on_nonfinite=runtime.on_nonfinite,
            checkpoint_dir=self.checkpoint_dir,
        )
        self.steps = TrainingSteps(
            self.objective,
            self.inputs,
            self.stepper,
            device=self.device,
            data_parallel=self.data_parallel,
            **configured_step_keywords(config, self.hyper, learns),
        )
        self.evaluator = LMLEvaluator(
            self.objective,
            self.examples,
            self.chunks,
            batch_size=evaluation.batch_size,
            max_examples_per_chunk=evaluation.examples_per_chunk,
            seed=self.seed + 1,  # not the sampler's stream
            device=self.device,
            precision=self.precision,
        )
        self.configuration = config.flat(fingerprint=True)
        """The options that change the iteration: a saved state must match them to resume this trainer."""
        self.history: list[dict[str, Any]] = []
        """Every evaluation's record, in order."""
        self.best: tuple[float, int, ModuleStates] | None = None
        """(score, step, state of the modules) of the best evaluation so far, by its evidence
        (``training.lml.evidence``)."""
        self.finetune_start: int | None = None
        """The step the fine-tuning phase began at (None while partitioned training goes on)."""
        self.hooks: list[TrainingHook] = list(components.hooks)
        """Run after each evaluation, when fine-tuning begins and at the end of a run, in this order
        (``hooks``, then the ``CheckpointWriter`` of ``checkpoint_dir``)."""
        if self.checkpoint_dir is not None and (self.data_parallel is None or self.data_parallel.is_writer):
            self.hooks.append(CheckpointWriter(self.checkpoint_dir))

    @property
    def step(self) -> int:
        """Iterations done (counted by the steps, which record each of their losses at it)."""
        return self.steps.step

    @step.setter
    def step(self, value: int) -> None:
        self.steps.step = value

    @property
    def hyper_samples(self) -> int | None:
        """Augmentation samples per example in hyperparameter steps (None: the input transform's own)."""
        return self.steps.hyper_samples

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite loss or gradient (``on_nonfinite="skip"``)."""
        return self.stepper.skipped_steps

    def hyperparameter_values(self) -> dict[str, Any]:
        """Current hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
        return self.objective.hyperparameter_values()

    # --- steps -------------------------------------------------------------------------------------

    def parameter_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Train partition k on ``indices`` (default: drawn by the sampler, a minibatch of D_1:k); returns (k, loss)."""
        if indices is None:
            k, indices = self.sampler.parameter_batch(k)
        k = check_given_partition("parameter_step", k)
        return k, self.steps.parameter_step(k, *self.steps.read(indices))

    def hyper_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Step psi on ``indices`` of chunk D_k through subnetwork k-1, k in 2..C (default: drawn by the sampler, as
        the :class:`OneChunk` estimator draws them); returns (k, loss)."""
        self._check_hyperparameters()
        if indices is None:
            k, indices = self.sampler.hyper_batch(k)
        k = check_given_partition("hyper_step", k)
        batches = [(1.0, k, indices)]
        return k, self.steps.hyper_step(self._read_hyper(batches), OneChunk().describe(batches))

    def hyper_step_all_chunks(self) -> torch.Tensor:
        """Step psi on a minibatch of EVERY chunk D_k (k in 2..C) through its subnetwork k-1, weighted by the
        probabilities ``hyper_step`` draws them with (:class:`AllChunks`, ``hyper_chunks="all"``); returns the loss."""
        self._check_hyperparameters()
        batches = AllChunks().draw(self.sampler)
        return self.steps.hyper_step(self._read_hyper(batches), AllChunks().describe(batches))

    def _read_hyper(self, batches: HyperBatches) -> list[HyperBatch]:
        return [(weight, k, *self.steps.read(indices)) for weight, k, indices in batches]

    def _check_hyperparameters(self) -> None:
        if self.hyper_optimizer is None:
            raise PartitionArgumentError("there are no hyperparameters to step (pass hyper=... or use ConcreteDropout)")

    def iteration(self) -> None:
        """One iteration of the configured scheme (the paper's parameter step then hyperparameter step when due,
        or both in one forward and one backward with ``fused=True``), the hyperparameter step by the configured
        estimator; in the fine-tuning phase, a ``finetune_step`` (``self.iterations``)."""
        iterations, finetuning = self.iterations, self.finetuning
        steps = self.steps
        upcoming = lambda sampler, step: [steps.local_indices(iterations.draw(sampler, step, finetuning))]  # noqa: E731
        self.inputs.start(lambda: planned_batches(upcoming, self.sampler, self.step))
        steps.take(iterations.draw(self.sampler, self.step + 1, finetuning))

    def fused_iteration(self) -> None:
        """One iteration of the fused scheme (every-partition with ``every_partition``), whatever the configured
        one: the parameter step and (when due) the hyperparameter step in ONE forward and ONE backward."""
        fused = scheme_for(fused=True, every_partition=self.every_partition)
        self.steps.take(fused.draw(self.sampler, self.iterations.estimator_for(self.step + 1)))

    # --- the fine-tuning phase ---------------------------------------------------------------------

    @property
    def finetuning(self) -> bool:
        """Whether partitioned training has ended and the final subnetwork is being fine-tuned."""
        return self.finetune_start is not None

    def begin_finetuning(self, restore_best: bool = False, *, steps: int | None = None) -> None:
        """End partitioned training (paper, Table 2): from here psi is frozen and every weight of the final
        subnetwork (all partitions together, as ``export_subnetwork`` merges them) trains on ALL the data.

        The optimiser carries on with unscaled weight decay; the LR schedule carries on or restarts over ``steps``
        iterations (default: to the configuration's ``steps``; ``optim.finetuning_scheduler``). With
        ``restore_best`` the state with the best LML is restored first. Then each hook's ``before_finetuning``
        runs. Draws no random number, so a resumed run that repeats it stays exact."""
        if self.finetuning:
            return
        self.stepper.check_nonfinite(self.step)
        if restore_best and self.best is not None and self.best[1] != self.step:
            self.objective.restore(self.best[2])
        self.finetune_start = self.step
        self.inputs.stop()  # what was read ahead is of partitioned iterations
        remaining = steps if steps is not None else self.config.optimization.steps - self.step
        scheduler = finetuning_scheduler(self.config, self.optimizer, self.scheduler, remaining)
        self.scheduler = self.stepper.scheduler = scheduler
        for hook in self.hooks:
            hook.before_finetuning(self)

    def finetune_step(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Train every weight of the final subnetwork C on a minibatch of all the data (default: drawn by the
        sampler), with the input transform's psi fixed; returns the loss."""
        indices = indices if indices is not None else self.sampler.finetune_batch()
        return self.steps.finetune_step(*self.steps.read(indices))

    # --- evaluation ------------------------------------------------------------------------------

    def estimate_lml(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters (:meth:`LMLEvaluator.estimate`: its noise from its
        own generator, so how often it is estimated does not change the training path)."""
        return self.evaluator.estimate()

    def evaluate(self, started: float) -> dict[str, Any]:
        """Estimate the LML (not in the fine-tuning phase), append a history record, keep the best state (by its
        evidence), run the evaluation hooks (with ``checkpoint_dir``: write the checkpoints and the resume
        directory)."""
        self.stepper.check_nonfinite(self.step)  # before anything is recorded or written from these weights
        self.steps.same_running_statistics()
        mean = lambda xs: float(sum(xs) / len(xs)) if xs else None  # noqa: E731
        losses, hyper_losses = self.stepper.pending_losses()
        # Once fine-tuning has trained every weight on every chunk, no subnetwork k-1 is unseen by chunk k:
        # there is no partitioned LML to estimate.
        estimate = None if self.finetuning else self.estimate_lml()
        record = {
            "step": self.step,
            "phase": "finetune" if self.finetuning else "partitioned",
            **lml_fields(estimate, scored=sum(self.chunks.sizes[1:])),
            "train_loss": mean(losses),
            "hyper_loss": mean(hyper_losses),
            "hyperparameters": self.hyperparameter_values(),
            "seconds": round(time.perf_counter() - started, 3),
        }
        self.stepper.clear_losses()
        improved = self.record_evaluation(record)
        for hook in self.hooks:
            hook.after_evaluation(self, record, improved)
        return record

    def record_evaluation(self, record: dict[str, Any]) -> bool:
        """Append an evaluation's ``record`` to :attr:`history`; keep a copy of the modules' states as
        :attr:`best` when its evidence (``training.lml.evidence``; None in fine-tuning: not scored) beats the
        best so far. Returns whether it did."""
        self.history.append(record)
        score = evidence(record)
        improved = score is not None and (self.best is None or score > self.best[0])
        if improved:
            self.best = (score, record["step"], self.objective.states(copy_values=True))
        return improved

    # --- the run -----------------------------------------------------------------------------------

    def run(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        progress: bool | None = None,
        **overrides: Any,
    ) -> FitResult:
        """Train to the configuration's ``steps`` (a resumed trainer: from its step), evaluating, fine-tuning
        and stopping as the configuration says; ``overrides`` (``eval_every``, ``finetune_steps``, ``patience``,
        ... by their keywords) change it for this run. ``steps``: run that many iterations from the current step
        instead, as if the configuration's ``steps`` ended there (its evaluation interval and fine-tuning share
        are then of those); the LR schedule built with the trainer is not changed."""
        if steps is not None:
            overrides = {**overrides, "steps": self.step + steps}
        config = self.config.replace(**overrides) if overrides else self.config
        end = config.optimization.steps
        switch = end - config.finetune_steps if config.finetune_steps else None
        try:
            result = self._loop(RunPlan(end, switch, config, callbacks, progress))
        finally:
            self.inputs.close()  # the workers end with the run; another run starts new ones
        for hook in self.hooks:
            hook.after_run(self, result)
        return result

    def _loop(self, plan: RunPlan) -> FitResult:
        """Iterate from the current step to ``plan.end``: evaluate every ``eval_every`` iterations and at the end;
        after each evaluation ask the hooks, then the run's callbacks (a ``CallbackHook``), whether to stop; stop
        early on ``patience``, restore the best state (``restore_best``) and recalibrate BatchNorm statistics for
        the final subnetwork (``recalibrate_norms``), as ``plan.config`` says.

        Progress (``plan.progress``): None shows a tqdm bar when stderr is a terminal and otherwise writes one line
        per evaluation to stderr; True forces the bar, False shows nothing."""
        from tqdm.auto import tqdm

        show, write_lines = progress_outputs(plan.progress)
        evaluation = plan.config.evaluation
        eval_every = plan.config.eval_every  # of the whole run (TrainConfig.eval_every), also when resumed
        started = time.perf_counter()
        stopped_early = False
        end, switch = plan.end, plan.switch  # patience may move the switch to fine-tuning earlier
        lines = ProgressLines(self.step, end, started) if write_lines else None
        callbacks = CallbackHook(plan.callbacks)
        total = end - self.step
        for hook in self.hooks:
            hook.before_run(self)
        bar = tqdm(total=total, disable=not show, desc="partitioned training", unit="it", dynamic_ncols=True)
        try:
            while self.step < end:
                if switch is not None and self.step >= switch and not self.finetuning:
                    self.begin_finetuning(evaluation.restore_best, steps=end - self.step)
                    bar.set_description("fine-tuning")
                self.iteration()
                bar.update(1)
                if self.step % eval_every == 0 or self.step in (end, switch):  # type: ignore[operator]
                    record = self.evaluate(started)
                    score = evidence(record)
                    loss = f"{record['train_loss'] or float('nan'):.3f}"
                    if score is not None:
                        bar.set_postfix(lml=f"{score:.1f}", loss=loss)
                    else:
                        bar.set_postfix(loss=loss)
                    if lines is not None:
                        lines(record)
                    if any(hook.should_stop(self, record) for hook in (*self.hooks, callbacks)):
                        stopped_early = True
                        break
                    if (
                        evaluation.patience is not None
                        and not self.finetuning
                        and len(self.history) - 1 - self._best_index() >= evaluation.patience
                    ):
                        stopped_early = True
                        if switch is None:
                            break
                        switch = self.step  # end partitioned training now; fine-tune until the end
        finally:
            bar.close()
        assert self.best is not None
        _, best_step, best_state = self.best
        partitioned = [r for r in self.history if r["lml"] is not None]  # fine-tuning estimates no LML
        final = partitioned[-1]
        best = next(r for r in partitioned if r["step"] == best_step)
        if evaluation.restore_best:
            final = best
            if best_step != self.step and not self.finetuning:  # begin_finetuning restored it already
                self.objective.restore(best_state)
        recalibrated = 0
        if evaluation.recalibrate_norms:
            recalibrated = recalibrate_norm_statistics(
                self.pmodel, self.examples, batch_size=self.eval_batch_size, device=self.device
            )
        return FitResult(
            lml=final["lml"],
            conditional_lml=final["conditional_lml"],
            history=self.history,
            hyperparameters=self.hyperparameter_values(),
            steps=self.step,
            best_step=best_step,
            best_lml=best["lml"],
            best_conditional_lml=best["conditional_lml"],
            stopped_early=stopped_early,
            chunk_sizes=self.chunks.sizes,
            seconds=round(time.perf_counter() - started, 3),
            skipped_steps=self.skipped_steps,
            recalibrated_norms=recalibrated,
            finetune_start=self.finetune_start,
        )

    def _best_index(self) -> int:
        """The position in :attr:`history` of the best evaluation."""
        assert self.best is not None
        return next(i for i, r in enumerate(self.history) if r["step"] == self.best[1])

    # --- saving and restoring ----------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to resume this trainer: the partitioning, the data chunks and batch
        sizes, the options that change the iteration, and the names and shapes of everything trained."""
        return {
            **self.objective.identity(),
            **self.objective.omitted(),
            "default": self.pmodel.default,
            "chunk_sizes": self.sampler.chunks.sizes,
            "num_examples": len(self.inputs),
            **self.configuration,
            "parameters": {name: list(p.shape) for name, p in self.pmodel.named_parameters()},
            "hyperparameters": [list(p.shape) for p in self.stepper.hyperparameters],
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (see ``training.checkpoint.save_training_state``
        for its form on disk), after the non-finite check: never a state a non-finite step has updated."""
        self.stepper.check_nonfinite(self.step)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        return {
            "step": self.step,
            "history": self.history,
            "best": None if self.best is None else {"score": self.best[0], "step": self.best[1]},
            "best_modules": None if self.best is None else self.best[2],
            **self.stepper.state_dict(),  # skipped steps, pending losses, loss scale, optimisers, schedulers
            "modules": self.objective.states(),
            "finetune_start": self.finetune_start,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if cuda else [],
                "sampler": self.sampler.state_dict(),
                "lml": self.evaluator.generator.get_state(),
            },
            "fingerprint": self.fingerprint(),
            "hooks": self._hook_states(),
        }

    def _hook_states(self) -> dict[str, dict[str, Any]]:
        """The states of the hooks that hold one, by :attr:`TrainingHook.state_key`."""
        states: dict[str, dict[str, Any]] = {}
        for hook in self.hooks:
            state = hook.state_dict()
            if not state:
                continue
            if hook.state_key in states:
                raise PartitionArgumentError(
                    f"two hooks hold state under the state_key {hook.state_key!r}; give each its own (override "
                    "TrainingHook.state_key)"
                )
            states[hook.state_key] = state
        return states

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; a state from another configuration is refused, naming
        ``source`` and every field that differs, before anything changes."""
        differ = differences(state["fingerprint"], self.fingerprint())
        if differ:
            raise PartitionCheckpointError(f"{source} is from a different configuration ({differ})")
        self.objective.restore(state["modules"], source)
        self.stepper.load_state_dict(state)
        self.finetune_start = state["finetune_start"]
        self.step = state["step"]
        self.history = state["history"]
        if state["best"] is not None:
            self.best = (state["best"]["score"], state["best"]["step"], state["best_modules"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.sampler.load_state_dict(state["rng"]["sampler"])
        self.evaluator.generator.set_state(state["rng"]["lml"])
        saved = state.get("hooks", {})  # a state saved while no hook held any has none
        for hook in self.hooks:
            if hook.state_key in saved:
                hook.load_state_dict(saved[hook.state_key])
        self.inputs.stop()  # the sampler and step are the loaded ones: read ahead from there

    def save_checkpoint(
        self,
        path: str | Path,
        *,
        final: bool = False,
        norm_statistics: str | None = None,
        best: tuple[float, int, ModuleStates] | None = None,
    ) -> None:
        """Model, hyperparameter modules and likelihood in one safetensors file, with the step, its evaluation's
        LMLs, ``final`` (the state a finished run returned) and ``norm_statistics`` (see ``Objective.save``);
        ``best``: a ``(score, step, module states)`` to write instead of the current state (as kept in
        :attr:`best`)."""
        if best is not None:
            _, step, states = best
            record = next((r for r in self.history if r["step"] == step), {})
        else:
            step, states = self.step, self.objective.states()
            record = self.history[-1] if self.history else {}
        self.objective.save(path, step, states, record, final=final, norm_statistics=norm_statistics)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Load the model, input transform and likelihood tensors :meth:`save_checkpoint` wrote (as
        ``training.load_checkpoint`` does); returns its metadata."""
        return self.objective.load(path)
