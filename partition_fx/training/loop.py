"""The training loop: iterations, evaluations, hooks that stop a run, early stopping, and the end of a run."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..train_config import TrainConfig
from .hooks import CallbackHook
from .lml import recalibrate_norm_statistics
from .options import Callback, check_run_arguments
from .progress import ProgressLines, progress_outputs
from .result import FitResult


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


def run_loop(trainer: Any, plan: RunPlan) -> FitResult:
    """Run ``trainer`` (a ``PartitionedTrainer``) from its current step to ``plan.end``: evaluate every
    ``eval_every`` iterations and at the end; after each evaluation ask the trainer's hooks, then the run's
    callbacks (a ``CallbackHook``), whether to stop; stop early on ``patience``, restore the best state
    (``restore_best``) and recalibrate BatchNorm statistics for the final subnetwork (``recalibrate_norms``),
    as ``plan.config`` says.

    Progress (``plan.progress``): None shows a tqdm bar when stderr is a terminal and otherwise writes one line
    per evaluation to stderr; True forces the bar, False shows nothing."""
    from tqdm.auto import tqdm

    show, write_lines = progress_outputs(plan.progress)
    evaluation = plan.config.evaluation
    eval_every = plan.config.eval_every  # a tenth of the whole run's steps by default, also when resumed
    started = time.perf_counter()
    stopped_early = False
    end, switch = plan.end, plan.switch  # patience may move the switch to fine-tuning earlier
    lines = ProgressLines(trainer.step, end, started) if write_lines else None
    callbacks = CallbackHook(plan.callbacks)
    total = end - trainer.step
    for hook in trainer.hooks:
        hook.before_run(trainer)
    bar = tqdm(total=total, disable=not show, desc="partitioned training", unit="it", dynamic_ncols=True)
    try:
        while trainer.step < end:
            if switch is not None and trainer.step >= switch and not trainer.finetuning:
                trainer.begin_finetuning(evaluation.restore_best, steps=end - trainer.step)
                bar.set_description("fine-tuning")
            trainer.iteration()
            bar.update(1)
            if trainer.step % eval_every == 0 or trainer.step in (end, switch):  # type: ignore[operator]
                record = trainer.evaluate(started)
                score = record["conditional_lml"] if record["conditional_lml"] is not None else record["lml"]
                if score is not None:  # the evidence, as the progress lines show it
                    bar.set_postfix(lml=f"{score:.1f}", loss=f"{record['train_loss'] or float('nan'):.3f}")
                else:
                    bar.set_postfix(loss=f"{record['train_loss'] or float('nan'):.3f}")
                if lines is not None:
                    lines(record)
                if any(hook.should_stop(trainer, record) for hook in (*trainer.hooks, callbacks)):
                    stopped_early = True
                    break
                if (
                    evaluation.patience is not None
                    and not trainer.finetuning
                    and len(trainer.history) - 1 - _best_index(trainer) >= evaluation.patience
                ):
                    stopped_early = True
                    if switch is None:
                        break
                    switch = trainer.step  # end partitioned training now; fine-tune until the end
    finally:
        bar.close()
    assert trainer.best is not None
    _, best_step, best_state = trainer.best
    partitioned = [r for r in trainer.history if r["lml"] is not None]  # fine-tuning estimates no LML
    final = partitioned[-1]
    best = next(r for r in partitioned if r["step"] == best_step)
    if evaluation.restore_best:
        final = best
        if best_step != trainer.step and not trainer.finetuning:  # begin_finetuning restored it already
            trainer.restore_modules(best_state)
    recalibrated = 0
    if evaluation.recalibrate_norms:
        recalibrated = recalibrate_norm_statistics(
            trainer.pmodel, trainer.examples, batch_size=trainer.eval_batch_size, device=trainer.device
        )
    return FitResult(
        lml=final["lml"],
        conditional_lml=final["conditional_lml"],
        history=trainer.history,
        hyperparameters=trainer.hyperparameter_values(),
        steps=trainer.step,
        best_step=best_step,
        best_lml=best["lml"],
        best_conditional_lml=best["conditional_lml"],
        stopped_early=stopped_early,
        chunk_sizes=trainer.chunks.sizes,
        seconds=round(time.perf_counter() - started, 3),
        skipped_steps=trainer.skipped_steps,
        recalibrated_norms=recalibrated,
        finetune_start=trainer.finetune_start,
    )


def _best_index(trainer: Any) -> int:
    """The position in ``trainer.history`` of the best evaluation."""
    assert trainer.best is not None
    return next(i for i, r in enumerate(trainer.history) if r["step"] == trainer.best[1])
