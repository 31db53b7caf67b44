"""The commands' run directories: the ``--out`` checks, what a command owns there, and writing it whole.

A run directory is what a command writes to ``--out``: its ``report.json`` (``export.json`` for ``export``)
names the ``command`` that wrote it, and ``--overwrite`` replaces nothing else. Reading a run back (its report,
its job, its ranges, its model) is the library's (``partition_fx.job.records``).

No torch here: the command line checks ``--out`` and ``--resume`` before it loads torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .._io import remove_path, staging_directory, swap_in
from ..choices import TRACKER_FILES, RunStatus
from ..errors import PartitionArgumentError, PartitionError, PartitionWarning, first_names

T = TypeVar("T")

REPORTS = ("report.json", "export.json")
"""The files a command's run directory is recognised by: each is a JSON object naming its ``command``."""


CHECKPOINT_STATES = {
    "last": "the run's final state: the fine-tuned model when the run fine-tuned, as model.safetensors holds it "
    "(checkpoint/last.safetensors, `partition-fx export --which last`)",
    "best": "the partitioned model at the evaluation with the highest conditional LML (checkpoint/best.safetensors, "
    "`partition-fx export --which best`): the state the evidence ranks first, chosen during partitioned training. "
    "It is not the fine-tuned model: fine-tuning trains every weight on every chunk, so no LML scores its states, "
    "and a run that fine-tuned ends with a later state, its final model",
}
"""What each of a training run's checkpoints holds (``export --which``), as its report and ``export.json`` say."""


def checkpoint_state(which: str, status: str | None, step: int | None, steps: int) -> str:
    """What checkpoint ``which`` of a run with this ``status`` (None: not recorded) and ``steps`` holds (its own
    ``step``): :data:`CHECKPOINT_STATES`', or, for ``last`` of a run that did not complete, the step it stopped at
    and how to finish it.

    >>> checkpoint_state("last", "interrupted", 20, 100).split(":")[0]
    'the last checkpoint of a run that did not finish (interrupted, step 20 of 100)'
    """
    if which != "last" or status is None or status == RunStatus.COMPLETED:
        return CHECKPOINT_STATES[which]
    return (
        f"the last checkpoint of a run that did not finish ({status}, step {step} of {steps}): not its final model; "
        "`partition-fx train --resume RUN` finishes it (checkpoint/last.safetensors)"
    )


LOGGED = {name.rstrip("/"): None for files in TRACKER_FILES.values() for name in files} | {"mlruns": None}
"""What ``--log`` writes in a run directory (and ``mlruns/``, the MLflow file store that earlier versions wrote)."""


def run_files(command: str) -> dict[str, Any]:
    """What ``command`` writes in its run directory (its declaration's ``files``: ``cli.commands``), by name: a
    file, or a whole directory (None), or a directory of which only the named entries are the run's (a dict of the
    same form). ``--overwrite`` replaces these alone.

    >>> sorted(run_files("export"))
    ['config.json', 'export.json', 'model.onnx', 'model.safetensors']
    """
    from .commands import commands

    found = commands().get(command)
    return found.files if found is not None else {}


def run_commands(path: Path) -> list[str]:
    """The commands whose run ``path`` holds: each ``report.json`` or ``export.json`` in it that is a JSON object
    naming one of the commands (``[]``: not a run directory).

    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> run_commands(run)
    []
    >>> _ = (run / "report.json").write_text('{"command": "train"}'); run_commands(run)
    ['train']
    >>> _ = (run / "report.json").write_text('{"command": ["train"]}'); run_commands(run)
    []
    """
    from .commands import commands

    found = []
    for name in REPORTS:
        try:
            report = json.loads((path / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        command = report.get("command") if isinstance(report, dict) else None
        if isinstance(command, str) and command in commands():
            found.append(command)
    return found


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` is a directory a partition-fx command wrote (:func:`run_commands` names one).

    >>> import tempfile
    >>> is_run_directory(Path(tempfile.mkdtemp()))
    False
    """
    return bool(run_commands(path))


def _owns(files: dict[str, Any], name: str) -> tuple[bool, Any]:
    """Whether an entry ``name`` of a directory whose run files are ``files`` is the run's, and its own files if it
    is a directory of which only some entries are. A run's own entry includes what the atomic writes leave beside
    it (``_io``: ``.NAME.*`` temporary files, staging and set-aside directories)."""
    if name in files:
        return True, files[name]
    hidden = name.startswith(".") and any(name.startswith(f".{owned}.") for owned in files)
    return hidden, None


def foreign_entries(directory: Path, files: dict[str, Any], prefix: str = "") -> list[str]:
    """The entries under ``directory`` that are not the run files ``files`` (as :func:`run_files` gives them),
    relative to it, a directory with a trailing ``/``.

    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> for name in ("report.json", "notes.txt", "checkpoint/last.safetensors", "checkpoint/mine.pt"):
    ...     (run / name).parent.mkdir(exist_ok=True); _ = (run / name).write_text("")
    >>> (run / "export").mkdir()
    >>> foreign_entries(run, run_files("train"))
    ['checkpoint/mine.pt', 'export/', 'notes.txt']
    """
    foreign = []
    for entry in sorted(directory.iterdir()):
        owned, inner = _owns(files, entry.name)
        is_directory = entry.is_dir() and not entry.is_symlink()
        if not owned:
            foreign.append(prefix + entry.name + ("/" if is_directory else ""))
        elif isinstance(inner, dict):
            if is_directory:
                foreign.extend(foreign_entries(entry, inner, f"{prefix}{entry.name}/"))
            else:
                foreign.append(prefix + entry.name)
    return foreign


DEFAULT_EXPORT = "export"
"""Where ``partition-fx export --run RUN`` writes unless given ``--out``: ``RUN/export/``."""


def _run_files(out: Path) -> dict[str, Any]:
    """The files the runs in ``out`` wrote, the union over its reports' commands; a training run's files include
    its export at the default place (:data:`DEFAULT_EXPORT`) when that is an ``export`` run directory holding
    nothing else: the tool wrote it from this run, and ``--overwrite`` replaces it with the run it came from.

    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "report.json").write_text('{"command": "train"}')
    >>> (run / "export").mkdir(); _ = (run / "export" / "export.json").write_text('{"command": "export"}')
    >>> "export" in _run_files(run)
    True
    >>> _ = (run / "export" / "notes.txt").write_text("mine"); "export" in _run_files(run)
    False
    """
    files: dict[str, Any] = {}
    for command in run_commands(out):
        files.update(run_files(command))
    export = out / DEFAULT_EXPORT
    if "report.json" in files and DEFAULT_EXPORT not in files and run_commands(export) == ["export"]:
        if export.is_dir() and not export.is_symlink() and not foreign_entries(export, run_files("export")):
            files[DEFAULT_EXPORT] = None
    return files


def _unfinished(out: Path) -> str | None:
    """How far the training run in ``out`` got when it stopped short with a resume state kept (None: it did not):
    what ``--overwrite`` discards along with it."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(report, dict) or report.get("status") == RunStatus.COMPLETED.value:
        return None
    if not (out / "checkpoint" / "resume").is_dir():
        return None
    steps: Any = report.get("config")
    for key in ("train", "optimization", "steps"):  # the run's planned steps, where its config says them
        steps = steps.get(key) if isinstance(steps, dict) else None
    step = report.get("last_checkpoint_step")
    at = "" if step is None else f", its last checkpoint at step {step}" + ("" if steps is None else f" of {steps}")
    return f"{report.get('status', 'unfinished')}{at}"


def check_out(out: Path, overwrite: bool, inputs: dict[str, Any]) -> bool:
    """Refuse an ``--out`` that is or holds the current directory or one of the ``inputs`` (option -> path or
    None), a file, a non-empty directory unless ``--overwrite`` is given and it is a run directory
    (:func:`is_run_directory`), and a run directory that holds anything its run did not write
    (:func:`foreign_entries`: ``--overwrite`` replaces the run's own files, and deletes nothing else); returns
    whether there is a run to replace. Nothing is touched (a new ``--out``'s nearest existing parent is probed with a
    directory made and removed at once).

    >>> import tempfile
    >>> check_out(Path(tempfile.mkdtemp()) / "new", overwrite=False, inputs={"--checkpoint": None})
    False
    >>> notes = Path(tempfile.mkdtemp()) / "notes.txt"; _ = notes.write_text("precious")
    >>> check_out(notes, overwrite=True, inputs={})
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --out '...notes.txt' is a file or a link, not a run directory; ...
    >>> _ = (notes.parent / "report.json").write_text('{"command": "convert"}')
    >>> check_out(notes.parent, overwrite=True, inputs={})
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --out '...' holds notes.txt, which its earlier convert run did not write; ...
    """
    outside = out.resolve()
    cwd = Path.cwd().resolve()
    if cwd == outside or outside in cwd.parents:
        raise PartitionArgumentError(
            f"--out {str(out)!r} is or holds the current directory; pass a directory below it, e.g. --out runs/new"
        )
    for option, path in inputs.items():
        inside = Path(path).resolve() if path is not None and Path(path).exists() else None
        if inside is not None and (inside == outside or outside in inside.parents):
            raise PartitionArgumentError(
                f"--out {str(out)!r} holds {option} {str(path)!r}, which --overwrite would delete; choose another --out"
            )
    if not out.exists() and not out.is_symlink():
        above = next(parent for parent in out.absolute().parents if parent.exists())
        if not above.is_dir():  # e.g. --out notes.txt/run: found now, not when the work is done
            raise PartitionError(
                f"--out {str(out)!r} cannot be created: {str(above)!r} is a file; choose another --out"
            )
        times = above.stat()
        try:  # e.g. --out /proc/run: a directory nothing can be made in, found now too (probed, removed at once)
            os.rmdir(tempfile.mkdtemp(prefix=".partition-fx-probe-", dir=above))
            os.utime(above, ns=(times.st_atime_ns, times.st_mtime_ns))  # and its times as they were
        except OSError as e:
            raise PartitionError(
                f"--out {str(out)!r} cannot be created in {str(above)!r}: {e.strerror or e}; choose another --out"
            ) from None
        return False
    if not out.is_dir() or out.is_symlink():
        raise PartitionError(
            f"--out {str(out)!r} is a file or a link, not a run directory; choose another --out "
            "(--overwrite replaces only a directory an earlier partition-fx run wrote)"
        )
    try:
        empty = not any(out.iterdir())
    except OSError as e:
        raise PartitionError(f"--out {str(out)!r} cannot be read: {e.strerror or e}; choose another --out") from None
    if empty:
        return False
    commands = run_commands(out)
    if not commands:
        raise PartitionError(
            f"--out {str(out)!r} is not empty and holds no partition-fx run (no report.json or export.json naming "
            "its command), so nothing will replace it, with or without --overwrite; choose another --out"
        )
    foreign = foreign_entries(out, _run_files(out))
    if foreign:
        shown = first_names(foreign, 5)
        raise PartitionError(
            f"--out {str(out)!r} holds {shown}, which its earlier {' and '.join(commands)} run did not write; "
            "--overwrite replaces only that run's own files and deletes nothing else: move them out of it or choose "
            "another --out"
        )
    if not overwrite:
        raise PartitionError(
            f"--out {str(out)!r} exists and is not empty (an earlier run); pass --overwrite to replace it or "
            "choose another directory"
        )
    return True


def prepare_out(out: Path, overwrite: bool, inputs: dict[str, Any]) -> None:
    """``--out`` as an empty directory to write a run into as it goes, after :func:`check_out`: an earlier run's
    own files removed with ``--overwrite`` (its report last, so that an interrupted removal leaves a run directory
    that ``--overwrite`` still replaces); nothing else is there to remove.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "run"
    >>> prepare_out(out, overwrite=False, inputs={}); out.is_dir()
    True
    """
    if check_out(out, overwrite, inputs):
        files = _run_files(out)
        unfinished = _unfinished(out)
        if unfinished is not None:  # the one thing --overwrite loses that --resume would have kept
            warnings.warn(
                f"--overwrite replaces {str(out)!r}, an unfinished run ({unfinished}), and deletes its resume "
                f"state; `partition-fx train --resume {out}` would have continued it",
                PartitionWarning,
                stacklevel=2,
            )
        for entry in sorted(out.iterdir(), key=lambda entry: entry.name in REPORTS):
            if _owns(files, entry.name)[0]:  # check_out found nothing else; anything put there since stays
                remove_path(entry)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PartitionError(f"--out {str(out)!r} cannot be created: {e.strerror or e}") from None


def write_run(out: Path, overwrite: bool, inputs: dict[str, Any], fill: Callable[[Path], T]) -> T:
    """A whole run directory at once: ``fill(staging)`` in a new directory beside ``out`` that then replaces it
    (``_io.swap_in``), so a command that fails or is interrupted leaves ``out`` as it was. ``out`` is checked
    again (:func:`check_out`) just before the swap, so nothing the user put there meanwhile is deleted.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "run"
    >>> write_run(out, False, {}, lambda staging: (staging / "export.json").write_text('{"command": "export"}'))
    21
    >>> write_run(out, True, {}, lambda staging: 1 / 0)
    Traceback (most recent call last):
    ...
    ZeroDivisionError: division by zero
    >>> json.loads((out / "export.json").read_text())
    {'command': 'export'}
    """
    try:
        staging = staging_directory(out)
    except OSError as e:
        raise PartitionError(f"--out {str(out)!r} cannot be created: {e.strerror or e}") from None
    try:
        result = fill(staging)
        check_out(out, overwrite, inputs)
        swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result
