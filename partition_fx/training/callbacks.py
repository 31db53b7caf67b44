"""Hooks: code the trainer runs when a run starts, after each evaluation, when fine-tuning begins and at the end
of a run, and that may end a run early: the one extension mechanism of the training loop (a run's
``callbacks=`` are a :class:`CallbackHook`). The package's own: :class:`CheckpointWriter` (checkpoint files and
the resume directory) and the progress output (:class:`ProgressLines`).

Progress is a tqdm bar on a terminal, one plain line per evaluation otherwise. The lines are for output that is
not a terminal (``nohup``, CI logs, ``2> file``), where a bar shows nothing useful. They are written straight to
``sys.stderr`` (looked up when written, so redirection works) and flushed, like the bar, rather than through
``logging``: they are output the caller asked for with ``progress``, not diagnostics, and an application's
logging configuration (``basicConfig()`` keeps only WARNING and above) would silently drop them again. To route
them elsewhere, pass ``progress=False`` and a callback that logs :func:`progress_line` of each record.
Everything shown is already in the evaluation's record or is wall-clock time: no tensor is read, no random
number drawn, so progress output cannot change a run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .._io import link_file
from .checkpoint import save_training_state
from .lml import evidence, recalibrated_states

if TYPE_CHECKING:
    from .trainer import FitResult, PartitionedTrainer

# --- hooks -----------------------------------------------------------------------------------------------------------

Callback = Callable[["PartitionedTrainer", dict[str, Any]], "bool | None"]
"""``cb(trainer, record)`` after each evaluation (``trainer``: the ``PartitionedTrainer``); True stops training."""


class TrainingHook:
    """Override any method; the trainer calls them in the order the hooks were added to ``trainer.hooks``.

    Example::

        >>> class Count(TrainingHook):
        ...     evaluations = 0
        ...     def after_evaluation(self, trainer, record, improved):
        ...         self.evaluations += 1
        >>> Count().before_run(None); Count().after_run(None, None)  # the other methods do nothing
        >>> Count().should_stop(None, {})
        False
    """

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


# --- progress --------------------------------------------------------------------------------------------------------


MAX_SHOWN = 6
"""Hyperparameters named in a line; the rest are counted (``+3 more``)."""


def is_terminal(stream: TextIO | None) -> bool:
    """Whether ``stream`` is an interactive terminal (False for None, closed or file-like objects)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def clock(seconds: float) -> str:
    """``seconds`` as ``m:ss`` or ``h:mm:ss``.

    >>> clock(7), clock(125.4), clock(3725)
    ('0:07', '2:05', '1:02:05')
    """
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def compact_hyperparameters(values: dict[str, Any]) -> str:
    """Hyperparameters in a few characters each: a list (a mask) as its mean and length; after
    ``MAX_SHOWN`` names, a count.

    >>> compact_hyperparameters({"rotation": 1.23456, "shear": 0.0012, "mask": [0.5, 1.0]})
    'rotation 1.23 shear 0.0012 mask mean 0.75 of 2'
    """
    parts = []
    for name, value in list(values.items())[:MAX_SHOWN]:
        if isinstance(value, list):
            mean = sum(value) / len(value) if value else float("nan")
            parts.append(f"{name} mean {mean:.3g} of {len(value)}")
        else:
            parts.append(f"{name} {value:.3g}")
    if len(values) > MAX_SHOWN:
        parts.append(f"+{len(values) - MAX_SHOWN} more")
    return " ".join(parts)


def progress_outputs(progress: bool | None) -> tuple[bool, bool]:
    """What a run's ``progress`` shows, as (a tqdm bar, one line per evaluation): None: the bar when stderr is
    a terminal and the lines otherwise; True: the bar; False: neither."""
    terminal = is_terminal(sys.stderr)
    return (terminal if progress is None else progress), (progress is None and not terminal)


def _line(position: str, fields: list[str], elapsed: float, remaining: float | None) -> str:
    left = f", ~{clock(remaining)} left" if remaining is not None else ""
    return " | ".join([f"partition-fx: {position}", *fields, f"{clock(elapsed)} elapsed{left}"])


def _evidence_text(record: dict[str, Any]) -> str | None:
    """An evaluation's evidence (``training.lml.evidence``) as the progress shows it, named: the conditional
    LML, or the full one with one partition; None in fine-tuning.

    >>> _evidence_text({"lml": -9.0, "lml_per_example": -0.9, "conditional_lml": None})
    'LML -9.0 (-0.900/example)'
    """
    score = evidence(record)
    if score is None:
        return None
    if record.get("conditional_lml") is not None:
        return f"conditional LML {score:.1f} ({record['conditional_lml_per_example']:.3f}/example)"
    return f"LML {score:.1f} ({record['lml_per_example']:.3f}/example)"


def progress_line(record: dict[str, Any], total: int, elapsed: float, remaining: float | None) -> str:
    """One evaluation as one line: step/total, the conditional LML (total and per example; the full LML when
    there is no conditional one, with one partition), train loss, hyperparameters, elapsed and estimated
    remaining time.

    >>> record = {"step": 40, "conditional_lml": -12.34, "conditional_lml_per_example": -0.0864, "lml": -123.45,
    ...           "lml_per_example": -0.8642, "train_loss": 0.4123, "hyperparameters": {"rotation": 1.2}}
    >>> print(progress_line(record, 400, 62.0, 558.0))
    partition-fx: step 40/400 | conditional LML -12.3 (-0.086/example) | train loss 0.412 | rotation 1.2 | 1:02 ...
    >>> print(progress_line({"step": 380, "lml": None, "train_loss": 0.05}, 400, 600.0, 30.0))
    partition-fx: step 380/400 | fine-tuning | train loss 0.05 | 10:00 elapsed, ~0:30 left
    """
    loss = record.get("train_loss")
    parts = [
        _evidence_text(record) or "fine-tuning",
        f"train loss {loss:.3g}" if loss is not None else "train loss -",
    ]
    if record.get("hyperparameters"):
        parts.append(compact_hyperparameters(record["hyperparameters"]))
    return _line(f"step {record['step']}/{total}", parts, elapsed, remaining)


class ProgressLines:
    """Writes :func:`progress_line` of each evaluation of a run that started at step ``first`` and ends at
    ``total``; the remaining time assumes the rest goes at this run's average pace so far."""

    def __init__(self, first: int, total: int, started: float | None = None) -> None:
        self.first, self.total = first, total
        self.started = time.perf_counter() if started is None else started  # a time.perf_counter() value

    def __call__(self, record: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - self.started
        done = record["step"] - self.first
        remaining = elapsed / done * (self.total - record["step"]) if done > 0 else None
        stream = sys.stderr
        if stream is not None:
            stream.write(progress_line(record, self.total, elapsed, remaining) + "\n")
            stream.flush()


# --- the checkpoint writer -------------------------------------------------------------------------------------------


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
        score, step, _ = trainer.best
        if not trainer.objective.is_current(trainer.best[2]):
            recalibrated = recalibrated_states(
                trainer.pmodel, trainer.best[2], trainer.examples, trainer.eval_batch_size, trainer.device
            )
            trainer.save_checkpoint(best, best=(score, step, recalibrated), norm_statistics="final")
        elif step == trainer.step:
            link_file(last, best)  # the same state: no second copy on disk
        else:  # the run restored the best state and recalibrated it: last's tensors with the best's step and LML
            trainer.save_checkpoint(
                best, final=True, norm_statistics="final", best=(score, step, trainer.objective.states())
            )
