"""``PartitionedTrainer``: partitioned training with hyperparameters learned by the LML, one step at a time.

One iteration (appendix I.1): a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
subnetwork k, then (every ``hyper_every`` iterations after ``warmup_steps``) a hyperparameter step on a
minibatch of D_k, k ~ Cat(u_2..u_C), through subnetwork k-1. The model optimiser holds the partitions,
the hyperparameter optimiser holds psi: the parameters of ``hyper`` (an input transform such as
``AffineAugmentation``), of ``HyperparameterModule`` s inside the model (``ConcreteDropout``), and of the
likelihood (a Gaussian's noise scale). ``fit`` (``partition_fx.training.fit``) is the one-call front.

The trainer reads its configuration in ``__init__`` only, and holds the collaborators that do the work, each built
from explicit values and usable alone: the iteration scheme (``training.schemes``) and hyperparameter-gradient
estimator (``training.estimators``) the configuration chooses, the steps and the stepper they hand losses to
(``training.steps``, ``training.stepping``), the LML evaluator (``training.evaluation``) and the state
(``training.state``). What remains here is the sequence of a run and its phases.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._validation import check_given_partition
from ..errors import PartitionArgumentError, PartitionTypeError
from ..partitioned_model import PartitionedModel
from ..train_config import TrainConfig
from ..transforms.base import HyperparameterModule
from .checkpoint_writer import CheckpointWriter
from .chunks import Examples, default_workers, resolve_chunks
from .data_parallel import DataParallel
from .estimators import AllChunks, OneChunk, hyper_estimator
from .evaluation import LMLEvaluator
from .faults import warn_about_shared_parameters
from .hooks import TrainingHook
from .hyperparameters import collect_hyperparameters, hyperparameter_modules, hyperparameter_values
from .lml import LMLEstimate, lml_fields
from .loop import RunPlan, run_loop
from .optimizers import build_optimizers, check_finetune_schedule, configured_factories, finetuning_scheduler
from .options import Callback, Components, resolve, takes_num_samples, widens
from .pipeline import StepInputs, planned_batches
from .result import FitResult
from .sampler import PartitionedSampler
from .schemes import Iterations, iteration_scheme, scheme_name
from .state import ModuleStates, TrainedModules, TrainingState
from .stepping import LAZY_CHECK_EVERY, Precision, Stepper
from .steps import TrainingSteps


class PartitionedTrainer:
    """Partitioned training of ``pmodel`` on ``dataset`` with hyperparameters learned by the LML.

    Built from a :class:`~partition_fx.train_config.TrainConfig` (default the recommended one) and keywords, as
    :func:`~partition_fx.training.fit` is (or from ``components`` already resolved); exposes the single steps
    (``parameter_step``, ``hyper_step``, ``evaluate``) for custom loops and tests, and
    ``state_dict()``/``load_state_dict()`` for everything a resumed run needs.

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
        # The one place the configuration is read: everything below gets explicit values.
        self.config: TrainConfig = config  # type: ignore[assignment]
        self.components = components
        optimization, step, evaluation, runtime = config.optimization, config.hyper, config.evaluation, config.runtime
        self.pmodel = pmodel
        self.hyper = components.hyper
        self.likelihood = components.likelihood
        self.fused = runtime.fused
        self.every_partition = runtime.every_partition
        self.seed = runtime.seed
        self.hyper_samples = step.samples if takes_num_samples(self.hyper) else None
        """Augmentation samples per example in hyperparameter steps (None: the input transform's own)."""
        self.eval_batch_size = evaluation.batch_size
        self.checkpoint_dir: Path | None = components.checkpoint_dir  # type: ignore[assignment]
        self.examples = Examples(dataset, workers=default_workers(runtime.workers, dataset), prefetch=runtime.prefetch)
        self.chunks = resolve_chunks(components.chunks, len(self.examples), pmodel.proportions, self.seed)
        self.sampler = PartitionedSampler(self.chunks, optimization.batch_size, step.batch_size, self.seed)
        defaults = config.checkpointing.defaults
        trained = TrainedModules(pmodel, self.hyper, self.likelihood, checkpoint_defaults=defaults)
        self.device = trained.place(components.device)  # type: ignore[arg-type]
        self.inputs = StepInputs(self.examples, self.device)
        """The steps' minibatches, read ahead by the workers in the order the sampler will draw them."""
        self.data_parallel = DataParallel.from_environment(components.data_parallel)
        """The process group gradients are averaged over (``training.data_parallel``), or None."""
        if self.data_parallel is not None:
            self.data_parallel.check_batch_size("batch_size", optimization.batch_size)
            self.data_parallel.check_batch_size("hyper_batch_size", self.sampler.hyper_batch_size)
            self.data_parallel.broadcast([pmodel, self.hyper, self.likelihood])
        if runtime.compile is not None:
            pmodel.compile(mode=runtime.compile)
        self.precision = Precision(runtime.precision, self.device)
        warn_about_shared_parameters(pmodel)
        self.hyperparameters_list = collect_hyperparameters(pmodel, self.hyper, self.likelihood)
        if self.hyperparameters_list and pmodel.num_partitions < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs num_partitions >= 2 (chunk k is scored by subnetwork k-1); "
                "partitionify the model with 2 or more partitions"
            )
        scheme = iteration_scheme(scheme_name(self.fused, self.every_partition))
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
        estimator = hyper_estimator(step.chunks) if self.hyper_optimizer is not None else None
        self.iterations = Iterations(scheme, estimator, hyper_every=step.every, warmup_steps=step.warmup_steps)
        """What each iteration does: the scheme's, with a hyperparameter step when due, or a fine-tuning step."""
        on_cpu = self.device is None or self.device.type == "cpu"
        self.stepper = Stepper(
            self.optimizer,
            self.hyper_optimizer,
            modules=(pmodel, self.hyper, self.likelihood),
            hyperparameters=self.hyperparameters_list,
            hyperparameter_modules=[m for _, m in self.hyperparameter_modules()],
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
            pmodel,
            self.likelihood,
            self.inputs,
            self.stepper,
            hyper=self.hyper,
            device=self.device,
            data_parallel=self.data_parallel,
            hyper_samples=self.hyper_samples,
            train_range_factor=step.train_range_factor if widens(self.hyper) else 1.0,
        )
        self.evaluator = LMLEvaluator(
            pmodel,
            self.examples,
            self.chunks,
            self.likelihood,
            self.hyper,
            batch_size=evaluation.batch_size,
            max_examples_per_chunk=evaluation.examples_per_chunk,
            seed=self.seed + 1,  # not the sampler's stream
            device=self.device,
            precision=self.precision,
        )
        self.state = TrainingState(
            trained,
            self.steps,
            self.stepper,
            self.sampler,
            self.evaluator.generator,
            # The fields that change the iteration: a saved state must match them to resume this trainer.
            configuration=config.flat(fingerprint=True),
        )
        self.hooks: list[TrainingHook] = list(components.hooks)
        """Run after each evaluation, when fine-tuning begins and at the end of a run, in this order
        (``hooks``, then the ``CheckpointWriter`` of ``checkpoint_dir``)."""
        if self.checkpoint_dir is not None and (self.data_parallel is None or self.data_parallel.is_writer):
            self.hooks.append(CheckpointWriter(self.checkpoint_dir))

    # --- the run's state, kept by the collaborators ----------------------------------------------------

    @property
    def step(self) -> int:
        """Iterations done."""
        return self.steps.step

    @step.setter
    def step(self, value: int) -> None:
        self.steps.step = value

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every evaluation's record, in order."""
        return self.state.history

    @property
    def best(self) -> tuple[float, int, ModuleStates] | None:
        """(score, step, state of the modules) of the best evaluation so far, by :meth:`selection_score`."""
        return self.state.best

    @property
    def finetune_start(self) -> int | None:
        """The step the fine-tuning phase began at (None while partitioned training goes on)."""
        return self.state.finetune_start

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for a non-finite loss or gradient (``on_nonfinite="skip"``)."""
        return self.stepper.skipped_steps

    @property
    def last_checkpoint_step(self) -> int | None:
        """The step of the last checkpoint written (``CheckpointWriter`` sets it)."""
        return self.stepper.last_checkpoint_step

    @last_checkpoint_step.setter
    def last_checkpoint_step(self, value: int | None) -> None:
        self.stepper.last_checkpoint_step = value

    # --- what is trained -------------------------------------------------------------------------

    def hyperparameter_modules(self) -> list[tuple[str, HyperparameterModule]]:
        """Every hyperparameter module with the prefix its values are reported under."""
        return hyperparameter_modules(self.pmodel, self.hyper, self.likelihood)

    def hyperparameter_values(self) -> dict[str, Any]:
        """Current hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
        return hyperparameter_values(self.hyperparameter_modules())

    # --- steps -------------------------------------------------------------------------------------

    def parameter_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Train partition k on ``indices`` (default: drawn by the sampler, a minibatch of D_1:k); returns (k, loss)."""
        if indices is None:
            k, indices = self.sampler.parameter_batch(k)
        k = check_given_partition("parameter_step", k)
        return k, self.steps.parameter_step(k, indices)

    def hyper_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Step psi on ``indices`` of chunk D_k through subnetwork k-1, k in 2..C (default: drawn by the sampler, as
        the :class:`OneChunk` estimator draws them); returns (k, loss)."""
        self._check_hyperparameters()
        if indices is None:
            k, indices = self.sampler.hyper_batch(k)
        k = check_given_partition("hyper_step", k)
        batches = [(1.0, k, indices)]
        return k, self.steps.hyper_step(batches, OneChunk().describe(batches))

    def hyper_step_all_chunks(self) -> torch.Tensor:
        """Step psi on a minibatch of EVERY chunk D_k (k in 2..C) through its subnetwork k-1, weighted by the
        probabilities ``hyper_step`` draws them with (:class:`AllChunks`, ``hyper_chunks="all"``); returns the loss."""
        self._check_hyperparameters()
        batches = AllChunks().draw(self.sampler)
        return self.steps.hyper_step(batches, AllChunks().describe(batches))

    def _check_hyperparameters(self) -> None:
        if self.hyper_optimizer is None:
            raise PartitionArgumentError("there are no hyperparameters to step (pass hyper=... or use ConcreteDropout)")

    def iteration(self) -> None:
        """One iteration of the configured scheme (the paper's parameter step then hyperparameter step when due,
        or both in one forward and one backward with ``fused=True``), the hyperparameter step by the configured
        estimator; in the fine-tuning phase, a ``finetune_step`` (``self.iterations``)."""
        iterate = self.iterations.phase(self.finetuning)
        self.inputs.start(lambda: planned_batches(iterate, self.sampler, self.step, self.steps.local))
        iterate(self.sampler, self.steps)

    def fused_iteration(self) -> None:
        """One iteration of the fused scheme (every-partition with ``every_partition``), whatever the configured
        one: the parameter step and (when due) the hyperparameter step in ONE forward and ONE backward."""
        fused = iteration_scheme(scheme_name(fused=True, every_partition=self.every_partition))
        fused.iteration(self.sampler, self.steps, self.iterations.estimator_for(self.step + 1))

    # --- the fine-tuning phase ---------------------------------------------------------------------

    @property
    def finetuning(self) -> bool:
        """Whether partitioned training has ended and the final subnetwork is being fine-tuned."""
        return self.finetune_start is not None

    def begin_finetuning(self, restore_best: bool = False, *, steps: int | None = None) -> None:
        """End partitioned training (paper, Table 2): from here psi is frozen and every weight of the final
        subnetwork (all partitions together, as ``export_subnetwork`` merges them) trains on ALL the data.

        The optimiser carries on with unscaled weight decay; the LR schedule carries on or restarts over ``steps``
        iterations (default: to the configuration's ``steps``; ``optimizers.finetuning_scheduler``). With
        ``restore_best`` the state with the best LML is restored first. Then each hook's ``before_finetuning``
        runs. Draws no random number, so a resumed run that repeats it stays exact."""
        if self.finetuning:
            return
        self.check_nonfinite()
        if restore_best and self.best is not None and self.best[1] != self.step:
            self.restore_modules(self.best[2])
        self.state.finetune_start = self.step
        self.inputs.stop()  # what was read ahead is of partitioned iterations
        remaining = steps if steps is not None else self.config.optimization.steps - self.step
        scheduler = finetuning_scheduler(self.config, self.optimizer, self.scheduler, remaining)
        self.scheduler = self.stepper.scheduler = scheduler
        for hook in self.hooks:
            hook.before_finetuning(self)

    def finetune_step(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Train every weight of the final subnetwork C on a minibatch of all the data (default: drawn by the
        sampler), with the input transform's psi fixed; returns the loss."""
        return self.steps.finetune_step(indices if indices is not None else self.sampler.finetune_batch())

    # --- evaluation ------------------------------------------------------------------------------

    def estimate_lml(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters (:meth:`LMLEvaluator.estimate`: its noise from its
        own generator, so how often it is estimated does not change the training path)."""
        return self.evaluator.estimate()

    def selection_score(self, estimate: LMLEstimate) -> float:
        """The evidence the best state is chosen by: the conditional LML (``LMLEvaluator.selection_score``)."""
        return self.evaluator.selection_score(estimate)

    def evaluate(self, started: float) -> dict[str, Any]:
        """Estimate the LML (not in the fine-tuning phase), append a history record, keep the best state, run
        the evaluation hooks (with ``checkpoint_dir``: write the checkpoints and the resume directory)."""
        self.check_nonfinite()  # before anything is recorded or written from these weights
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
        improved = self.state.add_evaluation(record, None if estimate is None else self.selection_score(estimate))
        for hook in self.hooks:
            hook.after_evaluation(self, record, improved)
        return record

    def check_nonfinite(self) -> None:
        """Raise ``PartitionTrainingError`` naming the first step since the last check with a non-finite loss or
        gradient (``Stepper.check_nonfinite``): run every ``check_every`` steps, at every evaluation and before
        saving state, so no checkpoint holds weights a non-finite step updated."""
        self.stepper.check_nonfinite(self.step)

    # --- the loop ----------------------------------------------------------------------------------

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
            result = run_loop(self, RunPlan(end, switch, config, callbacks, progress))
        finally:
            self.inputs.close()  # the workers end with the run; another run starts new ones
        for hook in self.hooks:
            hook.after_run(self, result)
        return result

    # --- saving and restoring ----------------------------------------------------------------------

    def module_states(self, copy_values: bool = False) -> ModuleStates:
        """The modules' state (``model``, ``hyper``, ``likelihood``) without the buffers checkpoints leave out
        (they never change); detached, and copied with ``copy_values``."""
        return self.state.modules.states(copy_values)

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to resume this trainer: the partitioning, the data chunks, the
        options that change the iteration, and the names and shapes of everything trained."""
        return self.state.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (``TrainingState.state_dict``)."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; a state from another configuration is refused, naming
        ``source`` and every field that differs, before anything changes."""
        self.state.load_state_dict(state, source=source)
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
        LMLs, ``final`` (the state a finished run returned) and ``norm_statistics`` (see
        ``TrainedModules.save``); ``best``: a ``(score, step, module states)`` to write instead of the current
        state (as kept in ``self.best``)."""
        self.state.save_checkpoint(path, final=final, norm_statistics=norm_statistics, best=best)

    def best_is_current(self) -> bool:
        """Whether the best evaluation's state is the current one, BatchNorm running statistics aside."""
        assert self.best is not None
        return self.state.modules.is_current(self.best[2])

    def recalibrated_best(self) -> ModuleStates:
        """The best evaluation's module states with the model's BatchNorm running statistics recalibrated for
        the final subnetwork over the training data with the evaluation batch size, as the end of a run does,
        on a copy of the model (``TrainedModules.recalibrated``)."""
        assert self.best is not None
        return self.state.modules.recalibrated(self.best[2], self.examples, self.eval_batch_size, self.device)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Load the model/hyper/likelihood tensors written by ``save_checkpoint``; returns its metadata."""
        return self.state.modules.load(path)

    def restore_modules(self, states: ModuleStates, source: str = "the best state") -> None:
        """Load module states as kept in ``best``; one that does not fit is refused naming ``source``."""
        self.state.modules.restore(states, source)


__all__ = ["PartitionedTrainer"]
