"""Progress of a training run: a tqdm bar on a terminal, one plain line per evaluation otherwise.

The lines are for output that is not a terminal (``nohup``, CI logs, ``2> file``), where a bar shows nothing
useful. They are written straight to ``sys.stderr`` (looked up when written, so redirection works) and flushed,
like the bar, rather than through ``logging``: they are output the caller asked for with ``progress``, not
diagnostics, and an application's logging configuration (``basicConfig()`` keeps only WARNING and above) would
silently drop them again. To route them elsewhere, pass ``progress=False`` and a callback that logs
:func:`progress_line` of each record.

Everything shown is already in the evaluation's record or is wall-clock time: no tensor is read, no random number
drawn, so progress output cannot change a run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ..objective.lml import EvaluationRecord, evidence

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


def _evidence_text(record: EvaluationRecord) -> str | None:
    """An evaluation's evidence (``training.objective.lml.evidence``, the conditional LML) as the progress shows it;
    with one partition, which has none, its full LML, said to be no evidence; None in fine-tuning.

    >>> _evidence_text({"lml": -9.0, "lml_per_example": -0.9, "conditional_lml": None})
    'LML -9.0 (-0.900/example; one partition: no evidence)'
    """
    score = evidence(record)
    if score is not None:
        return f"conditional LML {score:.1f} ({record['conditional_lml_per_example']:.3f}/example)"
    if record.get("lml") is None:
        return None
    return f"LML {record['lml']:.1f} ({record['lml_per_example']:.3f}/example; one partition: no evidence)"


def progress_line(record: EvaluationRecord, total: int, elapsed: float, remaining: float | None) -> str:
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


QUIET_SECONDS = 10.0
"""How long a run's lines may say nothing before the first evaluation: then one line gives the pace so far and
the time left (the first evaluation of the main job on a 2-core CPU comes after about 40 s)."""


class ProgressLines:
    """Writes :func:`progress_line` of each evaluation of a run that started at step ``first`` and ends at
    ``total``, and before the first, once :data:`QUIET_SECONDS` have passed, the pace so far
    (:meth:`after_iteration`); the remaining time assumes the rest goes at this run's average pace so far (since
    :meth:`restart_pace`: the trainer measures it from the end of the first step, whose one-time costs, starting
    workers or compiling, say nothing of the rest).

    >>> import contextlib
    >>> lines = ProgressLines(0, 400, started=time.perf_counter() - 12.0)  # 10 steps done in 12 s, none said
    >>> with contextlib.redirect_stderr(sys.stdout):
    ...     lines.after_iteration(10)
    partition-fx: step 10/400 | 1.2 s per step | 0:12 elapsed, ~7:48 left
    """

    def __init__(self, first: int, total: int, started: float | None = None) -> None:
        self.first, self.total = first, total
        self.started = time.perf_counter() if started is None else started  # a time.perf_counter() value
        self.pace = (self.first, self.started)  # the step and the time the pace is measured from
        self.said = False

    def __call__(self, record: EvaluationRecord) -> None:
        elapsed = time.perf_counter() - self.started
        self.write(progress_line(record, self.total, elapsed, self._remaining(record["step"])))

    def after_iteration(self, step: int) -> None:
        """After the iteration that brought the run to ``step``: the first line, if none was written and
        :data:`QUIET_SECONDS` have passed, with the seconds per step so far and the time left at that pace."""
        elapsed = time.perf_counter() - self.started
        remaining = self._remaining(step)
        if self.said or elapsed < QUIET_SECONDS or remaining is None:
            return
        per_step = (time.perf_counter() - self.pace[1]) / (step - self.pace[0])
        self.write(_line(f"step {step}/{self.total}", [f"{per_step:.2g} s per step"], elapsed, remaining))

    def restart_pace(self, step: int) -> None:
        """Measure the pace from ``step`` on: the steps before it (a compiling one) say nothing of the rest."""
        self.pace = (step, time.perf_counter())

    def _remaining(self, step: int) -> float | None:
        done = step - self.pace[0]
        return (time.perf_counter() - self.pace[1]) / done * (self.total - step) if done > 0 else None

    def write(self, line: str, *, first: bool = True) -> None:
        """``line`` on stderr as it is now (redirection works), flushed; ``first``: it is progress, and the quiet
        before the first evaluation is over."""
        self.said = self.said or first
        stream = sys.stderr
        if stream is not None:
            stream.write(line + "\n")
            stream.flush()
