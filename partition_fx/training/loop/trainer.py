"""``PartitionedTrainer``: partitioned training with hyperparameters learned by the LML, one step at a time,
and the run that strings the steps together (``run``; ``fit`` is the one-call front).

One iteration (appendix I.1): a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
subnetwork k, then (every ``hyper_every`` iterations after ``warmup_steps``) a hyperparameter step on a
minibatch of D_k, k ~ Cat(u_2..u_C), through subnetwork k-1. The model optimiser holds the partitions,
the hyperparameter optimiser holds psi: the parameters of ``hyper`` (an input transform such as
``AffineAugmentation``), of ``HyperparameterModule`` s inside the model (``ConcreteDropout``), and of the
likelihood (a Gaussian's noise scale).

The trainer reads the data (``training.sampling.chunks``: the examples, their chunks, the sampler), and its steps are
built by the one assembly of a run, ``TrainingSteps.create`` (``training.step.steps``: what is trained, the optimisers
and their stepper, the LML evaluator, the run's timeline), as your own loop's and the Lightning module's are. It
keeps its own state (the evaluations, the best one) and the run, which follows its ``Schedule``
(``training.sampling.schedule``: the phases, the evaluations, an early end of partitioned training); a run reads the
configuration again for what may be changed for it (``run(..., eval_every=...)``). The hooks it calls are
``training.loop.hooks``'.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..._validation import check_given_partition
from ...errors import PartitionArgumentError, PartitionCheckpointError, PartitionTypeError
from ...fx.partitioned_model import PartitionedModel
from ...job.train_config import TrainConfig
from ..checkpoint import differences
from ..objective.estimators import AllChunks, OneChunk
from ..objective.lml import EvaluationRecord, LMLEstimate, ScoredBatch, evidence, recalibrate_norm_statistics
from ..objective.objective import ModuleStates
from ..sampling.chunks import (
    Examples,
    PartitionedSampler,
    ScoredIndices,
    default_workers,
    planned_batches,
    resolve_chunks,
)
from ..sampling.schedule import Schedule, configured_iterations, draw_iteration
from ..sampling.schemes import Draw, scheme_for
from ..step.stepping import DataParallel
from ..step.steps import TrainingSteps
from .components import Components, check_run_arguments, resolve
from .hooks import (
    BestState,
    Callback,
    CallbackHook,
    CheckpointWriter,
    Patience,
    TrainingHook,
    hook_states,
    load_hook_states,
)
from .progress import ProgressLines, progress_outputs


@dataclass
class FitResult:
    """What ``fit`` returns; ``to_dict()`` is plain JSON."""

    lml: float
    """The final LML estimate (nats, summed over the training set), of the returned model."""
    history: list[EvaluationRecord]
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
    """The iteration of the best evaluation: the highest conditional LML (the latest partitioned one when C = 1;
    see ``training.objective.lml.evidence``)."""
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
    population: dict[str, Any] | None = None
    """With ``population=N`` (``training.loop.population``): ``members``, each member's ``initial`` ranges, the
    ``rounds`` (per comparison: ``step``, every member's ``fitness`` (its conditional LML) and ``ranges``, the
    ``copies`` made, ``[source, target]``) and the ``ancestry`` of the final model (the member it descends from
    at each comparison); None for a single run."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunPlan:
    """One run of the loop: the run's ``config`` (its timeline is the steps' schedule for it), ``callbacks``
    called after each evaluation, ``progress`` shown."""

    config: TrainConfig
    callbacks: Sequence[Callback] = ()
    progress: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "callbacks", check_run_arguments(self.callbacks, self.progress))


class PartitionedTrainer:
    """Partitioned training of ``pmodel`` on ``dataset`` with hyperparameters learned by the LML.

    Built from a :class:`~partition_fx.job.train_config.TrainConfig` (default the recommended one) and keywords, as
    :func:`~partition_fx.training.fit` is (or from ``components`` already resolved); exposes the single steps
    (``parameter_step``, ``hyper_step``, ``evaluate``) for custom loops and tests, and
    ``state_dict()``/``load_state_dict()`` for everything a resumed run needs: the iterations done, the evaluations
    (``history``), the best one so far (``best``, a :class:`~partition_fx.training.loop.hooks.BestState`), where the run
    is on its timeline (:attr:`schedule`'s state: the step fine-tuning began at, an early end of partitioned
    training), the modules, the optimisers, schedulers and pending losses, and every random generator (torch's, the
    sampler's and the LML estimate's).

    What is trained, its optimisers and the LML evaluator are its :attr:`steps`' (``steps.objective``,
    ``steps.stepper``, ``steps.evaluator``).

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
        self.config: TrainConfig = config
        self.components = components
        self.pmodel = pmodel
        runtime = config.runtime
        self.examples = Examples(dataset, workers=default_workers(runtime.workers, dataset), prefetch=runtime.prefetch)
        """The training data, as the steps read it ahead and the LML scores it."""
        self.chunks = resolve_chunks(components.chunks, len(self.examples), pmodel.proportions, runtime.seed)
        self.sampler = PartitionedSampler(
            self.chunks, config.optimization.batch_size, config.hyper.batch_size, runtime.seed
        )
        self.data_parallel = DataParallel.from_environment(components.data_parallel)
        """The process group gradients are averaged over (``training.step.stepping.DataParallel``), or None."""
        if self.data_parallel is not None:
            self.data_parallel.check_batch_size("batch_size", config.optimization.batch_size)
            self.data_parallel.check_batch_size("hyper_batch_size", self.sampler.hyper_batch_size)
        self.steps = TrainingSteps.create(
            pmodel,
            self.chunks,
            hyper=components.hyper,
            likelihood=components.likelihood,  # type: ignore[arg-type]  # Components stores it resolved: a Likelihood
            config=config,
            optimizer=components.optimizer,
            hyper_optimizer=components.hyper_optimizer,
            scheduler=components.scheduler,
            hyper_scheduler=components.hyper_scheduler,
            device=components.device,  # type: ignore[arg-type]  # Components stores it resolved: a torch.device or None
            scored=self.examples,
            read_ahead=self.examples,
            data_parallel=self.data_parallel,
            checkpoint_dir=components.checkpoint_dir,  # type: ignore[arg-type]  # Components stores it resolved: a Path or None
        )
        """What is trained and how each step trains it (the one assembly: ``TrainingSteps.create``)."""
        self.scheme, self.estimator = configured_iterations(config, self.steps.stepper.hyper_optimizer is not None)
        """What each partitioned iteration draws and takes, and how its hyperparameter step (when the schedule says
        one is due) draws its batches."""
        self.configuration = config.flat(fingerprint=True)
        """The options that change the iteration: a saved state must match them to resume this trainer."""
        self.history: list[EvaluationRecord] = []
        """Every evaluation's record, in order."""
        self.best = BestState()
        """The best evaluation so far and its modules' states (by its evidence: ``training.objective.lml.evidence``)."""
        self.hooks: list[TrainingHook] = list(components.hooks)
        """Run after each evaluation, when fine-tuning begins and at the end of a run, in this order
        (``hooks``, then the ``CheckpointWriter`` of ``checkpoint_dir``)."""
        if components.checkpoint_dir is not None and (self.data_parallel is None or self.data_parallel.is_writer):
            self.hooks.append(CheckpointWriter(components.checkpoint_dir))

    # --- what the steps hold, read here often --------------------------------------------------------

    @property
    def step(self) -> int:
        """Iterations done (counted by the steps, which record each of their losses at it)."""
        return self.steps.step

    @step.setter
    def step(self, value: int) -> None:
        self.steps.step = value

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The weights' optimiser (``steps.stepper``'s)."""
        return self.steps.stepper.optimizer

    @property
    def schedule(self) -> Schedule:
        """The run's timeline (the steps': which phase an iteration is in, whether it evaluates, where
        partitioned training ends, and where the run is on it)."""
        return self.steps.schedule  # type: ignore[return-value]  # TrainingSteps.create always builds one

    @property
    def finetuning(self) -> bool:
        """Whether partitioned training has ended and the final subnetwork is being fine-tuned (the schedule's)."""
        return self.steps.finetuning

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
        return k, self.steps.hyper_step(self._read_scored(batches), OneChunk().describe(batches))

    def hyper_step_all_chunks(self) -> torch.Tensor:
        """Step psi on a minibatch of EVERY chunk D_k (k in 2..C) through its subnetwork k-1, weighted by the
        probabilities ``hyper_step`` draws them with (:class:`AllChunks`, ``hyper_chunks="all"``); returns the loss."""
        self._check_hyperparameters()
        batches = AllChunks().draw(self.sampler)
        return self.steps.hyper_step(self._read_scored(batches), AllChunks().describe(batches))

    def _read_scored(self, batches: ScoredIndices) -> list[ScoredBatch]:
        return [(weight, k, *self.steps.read(indices)) for weight, k, indices in batches]

    def _check_hyperparameters(self) -> None:
        if self.steps.stepper.hyper_optimizer is None:
            raise PartitionArgumentError("there are no hyperparameters to step (pass hyper=... or use ConcreteDropout)")

    def iteration(self) -> None:
        """One iteration of the configured scheme (the paper's parameter step then hyperparameter step when due,
        or both in one forward and one backward with ``fused=True``), the hyperparameter step by the configured
        estimator when the :attr:`schedule` says one is due); in the fine-tuning phase, a ``finetune_step``."""
        steps, schedule, finetuning = self.steps, self.schedule, self.finetuning

        def draw(sampler: PartitionedSampler, step: int) -> Draw:
            return draw_iteration(self.scheme, self.estimator, schedule, sampler, step, finetuning)

        def upcoming(sampler: PartitionedSampler, step: int) -> list[torch.Tensor]:
            return [steps.local_indices(draw(sampler, step))]

        steps.read_ahead.start(lambda: planned_batches(upcoming, self.sampler, self.step))
        steps.take(draw(self.sampler, self.step + 1))

    def fused_iteration(self) -> None:
        """One iteration of the fused scheme (every-partition with ``every_partition``), whatever the configured
        one: the parameter step and (when due) the hyperparameter step in ONE forward and ONE backward."""
        fused = scheme_for(fused=True, every_partition=self.config.runtime.every_partition)
        estimator = self.estimator if self.schedule.hyper_due(self.step + 1) else None
        self.steps.take(fused.draw(self.sampler, estimator))

    # --- the fine-tuning phase ---------------------------------------------------------------------

    def _begin_finetuning(self, restore_best: bool) -> None:
        """End partitioned training (paper, Table 2): from here psi is frozen and every weight of the final
        subnetwork (all partitions together, as ``export_subnetwork`` merges them) trains on ALL the data.

        With ``restore_best`` the state with the best LML is restored first. Then the steps switch phase
        (``TrainingSteps.begin_finetuning``, the one switch: unscaled weight decay, the LR schedule carried on or
        restarted over the rest of the run's schedule) and each hook's ``before_finetuning`` runs. Draws no random
        number, so a resumed run that repeats it stays exact."""
        self.steps.stepper.check_nonfinite(self.step)
        if restore_best and self.best.states is not None and self.best.step != self.step:
            self.steps.objective.restore(self.best.states)
        self.steps.read_ahead.stop()  # what was read ahead is of partitioned iterations
        self.steps.begin_finetuning()
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
        return self.steps.evaluator.estimate()  # type: ignore[union-attr]  # built: the trainer passes scored=

    def evaluate(self, started: float, patience: Patience | None = None) -> EvaluationRecord:
        """Evaluate (``TrainingSteps.evaluation``: the LML estimate, not in the fine-tuning phase), append the
        record to the history, keep the best state (by its evidence), apply ``patience``'s decision to the
        schedule (ending partitioned training now), then run the evaluation hooks (with ``checkpoint_dir``: write
        the checkpoints and the resume directory, which so hold the decision)."""
        record = self.steps.evaluation(time.perf_counter() - started, self.estimate_lml)
        improved = self.record_evaluation(record)
        if patience is not None and not self.finetuning and patience.exhausted(self.history, self.best.step):
            self.schedule.end_partitioned_training(self.step)
        for hook in self.hooks:
            hook.after_evaluation(self, record, improved)
        return record

    def record_evaluation(self, record: EvaluationRecord) -> bool:
        """Append an evaluation's ``record`` to :attr:`history` and ask :attr:`best` whether it is the best so
        far (keeping a copy of the modules' states if so). Returns whether it is."""
        self.history.append(record)
        return self.best.consider(record, lambda: self.steps.objective.states(copy_values=True))

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
        are then of those); the LR schedule built with the trainer is not changed. The run's timeline becomes the
        trainer's :attr:`schedule`, carrying where the trainer was on it (a resumed run's phase and any early end
        of partitioned training)."""
        if steps is not None:
            overrides = {**overrides, "steps": self.step + steps}
        config = self.config.replace(**overrides) if overrides else self.config
        self.steps.schedule = self.schedule.for_run(config)
        try:
            result = self._loop(RunPlan(config, callbacks, progress))
        finally:
            self.steps.read_ahead.close()  # the workers end with the run; another run starts new ones
        for hook in self.hooks:
            hook.after_run(self, result)
        return result

    def _loop(self, plan: RunPlan) -> FitResult:
        """Iterate from the current step to the end of the :attr:`schedule`, beginning fine-tuning and evaluating
        where it says; at each evaluation the run's patience (a :class:`Patience`) may end partitioned training
        (the schedule applies it), and then the hooks and the run's callbacks (a ``CallbackHook``) are asked
        whether to stop; at the end restore the best state (``restore_best``) and recalibrate BatchNorm
        statistics for the final subnetwork (``recalibrate_norms``), as ``plan.config`` says.

        Progress (``plan.progress``): None shows a tqdm bar when stderr is a terminal and otherwise writes one line
        per evaluation to stderr; True forces the bar, False shows nothing."""
        from tqdm.auto import tqdm

        show, write_lines = progress_outputs(plan.progress)
        evaluation, schedule = plan.config.evaluation, self.schedule
        # The run's clock goes on from its last record's: a resumed run's, a run continued by another run() call's
        # (a population's members train to each comparison so).
        started = time.perf_counter() - (float(self.history[-1]["seconds"]) if self.history else 0.0)
        stopped = False
        lines = ProgressLines(self.step, schedule.end, started) if write_lines else None
        if lines is not None:
            lines.restart_pace(self.step)  # the pace is this run's steps'; the elapsed time is the whole run's
        asked = (*self.hooks, CallbackHook(plan.callbacks))
        patience = Patience(evaluation.patience)
        total = schedule.end - self.step
        for hook in self.hooks:
            hook.before_run(self)
        bar = tqdm(total=total, disable=not show, desc="partitioned training", unit="it", dynamic_ncols=True)
        compiling = plan.config.runtime.compile is not None and self.step < schedule.end
        if compiling:  # the first iteration compiles: minutes on a CPU with nothing else to show
            bar.set_description("compiling (torch.compile, the first step)")
            if lines is not None:
                lines.write(
                    "partition-fx: torch.compile compiles the model in the first step: minutes on a CPU", first=False
                )
        try:
            while self.step < schedule.end:
                if schedule.begins_finetuning(self.step):
                    self._begin_finetuning(evaluation.restore_best)
                    bar.set_description("fine-tuning")
                self.iteration()
                bar.update(1)
                if compiling:
                    compiling = False
                    bar.set_description("fine-tuning" if self.finetuning else "partitioned training")
                if lines is not None:
                    if self.step == lines.first + 1:  # the first step's one-time costs (workers, compiling) say
                        lines.restart_pace(self.step)  # nothing of the pace of the rest
                    lines.after_iteration(self.step)
                if schedule.evaluates_at(self.step):
                    record = self.evaluate(started, patience)
                    score = evidence(record)
                    loss = f"{record['train_loss'] or float('nan'):.3f}"
                    if score is not None:
                        bar.set_postfix(lml=f"{score:.1f}", loss=loss)
                    else:
                        bar.set_postfix(loss=loss)
                    if lines is not None:
                        lines(record)
                    if any(hook.should_stop(self, record) for hook in asked):
                        stopped = True
                        break
        finally:
            bar.close()
        best_step, best_state = self.best.step, self.best.states
        assert best_step is not None and best_state is not None
        partitioned = [r for r in self.history if r["lml"] is not None]  # fine-tuning estimates no LML
        final = partitioned[-1]
        best = next(r for r in partitioned if r["step"] == best_step)
        if evaluation.restore_best:
            final = best
            if best_step != self.step and not self.finetuning:  # _begin_finetuning restored it already
                self.steps.objective.restore(best_state)
        recalibrated = 0
        if evaluation.recalibrate_norms:
            recalibrated = recalibrate_norm_statistics(
                self.pmodel, self.examples, batch_size=self.config.evaluation.batch_size, device=self.steps.device
            )
        return FitResult(
            lml=final["lml"],  # type: ignore[arg-type]  # a partitioned record: its lml is a float
            conditional_lml=final["conditional_lml"],
            history=self.history,
            hyperparameters=self.steps.objective.hyperparameter_values(),
            steps=self.step,
            best_step=best_step,
            best_lml=best["lml"],  # type: ignore[arg-type]  # a partitioned record: its lml is a float
            best_conditional_lml=best["conditional_lml"],
            stopped_early=stopped or schedule.ended_early,
            chunk_sizes=self.chunks.sizes,
            seconds=round(time.perf_counter() - started, 3),
            skipped_steps=self.steps.stepper.skipped_steps,
            recalibrated_norms=recalibrated,
            finetune_start=schedule.finetune_start,
        )

    # --- saving and restoring ----------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to resume this trainer: the partitioning, the data chunks and batch
        sizes, the options that change the iteration, and the names and shapes of everything trained."""
        objective = self.steps.objective
        return {
            **objective.identity(),
            **objective.omitted(),
            "default": self.pmodel.default,
            "chunk_sizes": self.sampler.chunks.sizes,
            "num_examples": len(self.steps.read_ahead),
            **self.configuration,
            "parameters": {name: list(p.shape) for name, p in self.pmodel.named_parameters()},
            "hyperparameters": [list(p.shape) for p in self.steps.stepper.hyperparameters],
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit (see ``training.checkpoint.save_training_state``
        for its form on disk), after the non-finite check: never a state a non-finite step has updated."""
        stepper = self.steps.stepper
        stepper.check_nonfinite(self.step)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        return {
            "step": self.step,
            "history": self.history,
            **self.best.state_dict(),  # best: score and step; best_modules
            **stepper.state_dict(),  # skipped steps, pending losses, loss scale, optimisers, schedulers
            "modules": self.steps.objective.states(),
            **self.schedule.state_dict(),  # finetune_start, partitioned_ended_at
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if cuda else [],
                "sampler": self.sampler.state_dict(),
                "lml": self.steps.evaluator.generator.get_state(),  # type: ignore[union-attr]  # built: the trainer passes scored=
            },
            "fingerprint": self.fingerprint(),
            "hooks": hook_states(self.hooks),
            "occam": self.steps.occam.state_dict() if self.steps.occam is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; a state from another configuration is refused, naming
        ``source`` and every field that differs, before anything changes."""
        differ = differences(state["fingerprint"], self.fingerprint())
        if differ:
            raise PartitionCheckpointError(f"{source} is from a different configuration ({differ})")
        steps = self.steps
        steps.objective.restore(state["modules"], source)
        steps.stepper.load_state_dict(state)
        # where the run is on its timeline (the LR schedule's state came with the stepper's)
        self.schedule.load_state_dict(
            {"finetune_start": state["finetune_start"], "partitioned_ended_at": state["partitioned_ended_at"]}
        )
        self.step = state["step"]
        self.history = state["history"]
        self.best.load_state_dict(state)
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.sampler.load_state_dict(state["rng"]["sampler"])
        steps.evaluator.generator.set_state(state["rng"]["lml"])  # type: ignore[union-attr]  # built: the trainer passes scored=
        load_hook_states(self.hooks, state.get("hooks", {}))  # a state saved while no hook held any has none
        if steps.occam is not None:  # the fingerprint's occam_term says the state has one
            steps.occam.load_state_dict(state.get("occam") or {}, steps.stepper.hyperparameters)
        steps.read_ahead.stop()  # the sampler and step are the loaded ones: read from there

    def save_checkpoint(
        self,
        path: str | Path,
        *,
        final: bool = False,
        norm_statistics: str | None = None,
        best: tuple[float | None, int | None, ModuleStates] | None = None,
    ) -> None:
        """Model, hyperparameter modules and likelihood in one safetensors file, with the step, its evaluation's
        LMLs, ``final`` (the state a finished run returned) and ``norm_statistics`` (see ``Objective.save``);
        ``best``: a ``(score, step, module states)`` to write instead of the current state (as :attr:`best`
        keeps them)."""
        if best is not None:
            _, best_step, states = best
            if best_step is None:
                raise PartitionArgumentError("save_checkpoint(best=...) needs the step of the state it holds")
            step = best_step
            record = next((r for r in self.history if r["step"] == step), None)
        else:
            step, states = self.step, self.steps.objective.states()
            record = self.history[-1] if self.history else None
        lml = {"lml": record["lml"], "conditional_lml": record["conditional_lml"]} if record is not None else {}
        self.steps.objective.save(path, step, states, **lml, final=final, norm_statistics=norm_statistics)

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Load the model, input transform and likelihood tensors :meth:`save_checkpoint` wrote (as
        ``training.load_checkpoint`` does); returns its metadata."""
        return self.steps.objective.load(path)
