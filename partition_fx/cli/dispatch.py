"""``partition-fx``'s entry point: parse, check the command's options (``cli.commands``: no torch yet), run it,
print its summary, and report every refusal as one line on stderr; a ``PartitionWarning`` (a checkpoint's
classifier not loaded, say) is one ``partition-fx: warning:`` line on stderr.

Exit statuses: 0 done; 2 refused (or, for ``predict``, some images could not be read: the others were answered);
130 interrupted (Ctrl-C); 143 stopped by SIGTERM; 141 the reader of stdout went away (``partition-fx predict ...
| head``), ended quietly, as a shell reports a command killed by SIGPIPE.

The commands (and with them torch) are imported only once the arguments are parsed and checked: ``--help`` and
argument errors answer without them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import PartitionError, PartitionWarning, first_line, is_out_of_memory
from .commands import commands
from .parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``partition-fx ARGV`` (default: ``sys.argv[1:]``); returns the exit status.

    >>> main(["convert", "--model", "no_such_net", "--out", "never"])
    2
    """
    try:
        try:
            status = _run(argv)
        except SystemExit:  # --help, or an argument argparse refused: what it printed reaches its reader first
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a reader gone is found here, not in the interpreter's last flush
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE
    return status


BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)
"""The exit status when the reader of stdout went away (``| head``): 141, what a shell reports for a command
killed by SIGPIPE (Python ignores that signal and raises ``BrokenPipeError`` instead)."""


def _run(argv: Sequence[str] | None) -> int:
    """:func:`main` but for a reader of stdout gone: the command's own status (a command's ``show`` may return one,
    as ``predict`` does when some images failed after printing the others' answers)."""
    args = build_parser().parse_args(None if argv is None else list(argv))
    command = commands()[args.command]
    options = None
    try:
        options = command.options(args)  # checked before torch is imported: a refused value answers at once
        with warnings.catch_warnings(), _terminate_as_interrupt():
            warnings.showwarning = _show_warning(warnings.showwarning)
            shown = command.show(command.execute(options), options)
    except KeyboardInterrupt as e:
        how = " by SIGTERM" if isinstance(e, Terminated) else ""
        way_on = command.interrupted(options) if options is not None else ""
        print(f"partition-fx: interrupted{how}{way_on}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
    except (PartitionError, NotImplementedError) as e:
        print(f"partition-fx: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        print(f"partition-fx: error: out of memory ({first_line(e)}); {command.out_of_memory}", file=sys.stderr)
        return 2
    return shown if isinstance(shown, int) and not isinstance(shown, bool) else 0


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at ``os.devnull``, so that the interpreter's last flush of what stdout still
    buffers finds no closed pipe (which would print "Exception ignored ... BrokenPipeError" and exit 120): the
    pattern of Python's ``signal`` documentation. A stdout without a descriptor (a test's capture) is left."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``kill``, ``timeout``, Slurm and Kubernetes send to stop a job), raised where the command is, so
    that it ends as an interrupt does: the last checkpoint kept, the report ``interrupted``, the way to continue
    printed."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in this process while the command runs (a worker process forked
    meanwhile ends as SIGTERM asks); the previous handler comes back after. Only the main thread can set one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    command = os.getpid()

    def terminate(signum: int, frame: Any) -> None:
        if os.getpid() != command:  # a forked worker inherited the handler: end it the default way
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _show_warning(show: Any) -> Any:
    """``warnings.showwarning`` printing a :class:`PartitionWarning` as one line; other warnings as ``show`` does."""

    def show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None):
        if issubclass(category, PartitionWarning):
            print(f"partition-fx: warning: {message}", file=sys.stderr if file is None else file)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning
