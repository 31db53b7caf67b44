"""Exceptions raised by partition-fx.

Every error the package raises on purpose is a :class:`PartitionError`, so callers can catch one type.
Bad arguments are also ``ValueError``/``TypeError`` so the usual ``except ValueError`` keeps working.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

_ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def without_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours such as ``\\x1b[96m``, which torch puts in its errors):
    what quoting another library's message in one of this package's messages leaves of it.

    >>> without_ansi("step \\x1b[96m1/3\\x1b[0m of exporting")
    'step 1/3 of exporting'
    """
    return _ANSI_ESCAPE.sub("", text)


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, without terminal escape sequences, or its type's name when it has
    none (for one-line reports).

    >>> first_line(RuntimeError("\\x1b[31mfailed\\x1b[0m here\\nmore")), first_line(KeyError())
    ('failed here', 'KeyError')
    """
    text = without_ansi(str(error)).strip()
    return text.splitlines()[0] if text else type(error).__name__


def shortened(text: str, limit: int = 120) -> str:
    """``text`` on one line (each run of whitespace one space), cut to ``limit`` characters ending in "...": a
    message or a value quoted inside one of this package's one-line errors.

    >>> shortened("no such    file"), shortened("x" * 20, limit=10)
    ('no such file', 'xxxxxxx...')
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_names(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, comma-separated, then how many more: what a one-line error lists.

    >>> first_names(["a", "b"]), first_names(list("abcde"))
    ('a, b', 'a, b, c and 2 more')
    """
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def is_out_of_memory(error: BaseException) -> bool:
    """A failed allocation: ``MemoryError``, ``torch.OutOfMemoryError``, or torch's CPU allocator refusing.

    >>> is_out_of_memory(MemoryError()), is_out_of_memory(RuntimeError("can't allocate memory: 8 GiB"))
    (True, True)
    >>> is_out_of_memory(ValueError("bad"))
    False
    """
    if isinstance(error, MemoryError):
        return True
    # a torch error exists only once torch is imported: this module stays free of torch
    out_of_memory = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if out_of_memory is not None and isinstance(error, out_of_memory):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def earlier_version(source: str, lacking: str) -> str:
    """The one message for a state, checkpoint or report from one of this project's unreleased development
    formats, which this version does not read (``lacking``: what it lacks or holds instead).

    >>> earlier_version("report.json", "config.precision")
    'report.json was written by an earlier development version of partition-fx (it lacks config.precision); ...'
    """
    return (
        f"{source} was written by an earlier development version of partition-fx (it lacks {lacking}); "
        "this version does not read it: train again"
    )


class PartitionError(RuntimeError):
    """A model could not be partitioned, run or exported; the message names the part and the fix."""


class PartitionArgumentError(PartitionError, ValueError):
    """An argument to a partition-fx function is invalid; the message says which and what is allowed."""


class PartitionTypeError(PartitionError, TypeError):
    """An argument to a partition-fx function has the wrong type."""


class RangeError(PartitionArgumentError):
    """A learned range's bound that is not > 0 (:func:`partition_fx.ranges.learning_bounds`), or a start outside
    its bound (:func:`partition_fx.ranges.learning_start`). The message names ``AffineAugmentation``'s keywords
    (``max_range``, ``init``); ``keyword`` (which of them), ``generator`` (the range's name), ``value`` (the bound
    or the start refused) and ``bound`` (the bound a start lies outside; None for a refused bound) let a caller say
    it in its own words, as the command line names its options ``--max-range`` and ``--init`` (the way it names a
    :class:`~partition_fx.job.settings.SettingError`'s field by its flag).

    >>> from partition_fx.ranges import learning_start
    >>> try:
    ...     learning_start({"rotation": 4.0})
    ... except RangeError as e:
    ...     refused = e
    >>> refused.keyword, refused.generator, refused.value, round(refused.bound, 4)
    ('init', 'rotation', 4.0, 3.1416)
    """

    def __init__(self, message: str, keyword: str, generator: str, value: float, bound: float | None = None) -> None:
        super().__init__(message)
        self.keyword = keyword
        self.generator = generator
        self.value = value
        self.bound = bound

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (a worker's error), not as its message alone
        return type(self), (str(self), self.keyword, self.generator, self.value, self.bound)


class PartitionTrainingError(PartitionError):
    """Partitioned training stopped: a non-finite loss or gradient, or data that cannot be chunked.

    The message names the step, the partition or hyperparameter involved, and what was kept on disk.
    """


class PartitionCheckpointError(PartitionError):
    """A checkpoint or resume directory is missing, incomplete, corrupted, or from a different configuration."""


class PartitionNotImplementedError(PartitionError, NotImplementedError):
    """A subclass did not implement a method its base class requires (``PartitionedTensor.value``,
    ``HyperparameterModule.hyperparameters``); also a ``NotImplementedError``."""


class PartitionDependencyError(PartitionError, ModuleNotFoundError):
    """A feature needs an optional extra that is not installed; the message names the ``pip install``. Also a
    ``ModuleNotFoundError``, what a failed import is."""


class PartitionWarning(UserWarning):
    """Something partition-fx did differently from what was asked, said in one line: e.g. a pretrained
    checkpoint's classifier not loaded because the model has another number of classes."""
