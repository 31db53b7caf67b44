"""Runs on disk: the ``--out`` checks, a training run's report and configuration, and ``--resume``.

A run directory is what a command writes to ``--out``: its ``report.json`` (``export.json`` for ``export``)
names the ``command`` that wrote it, and ``--overwrite`` replaces nothing else. A training run's report holds
its ``config``, its :class:`~partition_fx.job_spec.JobSpec`'s ``to_dict()``, from which ``export`` rebuilds the
model and ``--resume`` continues the run with the same options: :func:`job_spec` is the spec the command line
asks for, and :func:`read_spec` the spec a recorded configuration reads back as.

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
from typing import TYPE_CHECKING, Any, TypeVar

from .._io import remove_path, staging_directory, swap_in
from ..choices import TRACKER_FILES, RunStatus
from ..errors import PartitionArgumentError, PartitionError, PartitionWarning, earlier_version, first_names
from ..job_spec import JobSpec
from ..record_format import CHECKS_RECORD, MODEL_RECORD
from ..settings import MissingSettings, SettingError, SettingTypeError
from ..train_config import RUN_FILE

if TYPE_CHECKING:
    from ..datasets import DatasetSplits

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


def read_json(run: Path, name: str, option: str) -> Any:
    """The JSON file ``name`` of the run directory ``run`` that ``option`` names; one that cannot be read or
    parsed is refused, naming the option, the directory and the file.

    >>> import tempfile
    >>> read_json(Path(tempfile.mkdtemp()), "export.json", "--run")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...': export.json cannot be read (...)
    """
    try:
        return json.loads((run / name).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PartitionError(f"{option} {str(run)!r}: {name} cannot be read ({e})") from None


def read_run(run: Path, option: str) -> tuple[dict[str, Any], JobSpec]:
    """The report of the training run in ``run`` and the job its ``config`` reads back as (:func:`read_spec`),
    refusing a directory ``partition-fx train`` did not write and a configuration this version does not read.

    >>> import tempfile
    >>> read_run(Path(tempfile.mkdtemp()), "--run")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...': report.json cannot be read (...)
    """
    report = read_json(run, "report.json", option)
    config = report.get("config") if isinstance(report, dict) else None
    if not isinstance(config, dict):
        raise PartitionError(
            f"{option} {str(run)!r}: report.json holds no training configuration; pass the --out directory of "
            "`partition-fx train`"
        )
    return report, read_spec(config, f"{option} {str(run)!r}: report.json")


def learned_ranges(run: Path, option: str = "--fix-from") -> dict[str, float]:
    """The augmentation ranges the completed ``partition-fx train`` run in ``run`` learned (its report's
    ``hyperparameters``), by name; a run that is not completed, or learned no affine ranges, is refused.

    >>> import tempfile
    >>> learned_ranges(Path(tempfile.mkdtemp()))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --fix-from '...': report.json cannot be read (...)
    """
    from ..choices import RANGE_NAMES

    report, spec = read_run(run, option)
    if report.get("status") != RunStatus.COMPLETED:
        raise PartitionError(
            f"{option} {str(run)!r}: that run is {report.get('status', 'not completed')}, not completed; its ranges "
            "are not final (resume it with --resume first)"
        )
    ranges = report.get("hyperparameters")
    if spec.augment != "affine" or not isinstance(ranges, dict) or not set(ranges) <= set(RANGE_NAMES):
        raise PartitionError(f"{option} {str(run)!r}: that run learned no augmentation ranges (--augment none)")
    return {name: float(value) for name, value in ranges.items()}


def training_run(run: Path, option: str, which: str) -> tuple[JobSpec, Path]:
    """The job a training run's configuration reads back as, and its ``which`` checkpoint file:
    from a ``partition-fx train`` run (``report.json``, ``checkpoint/WHICH.safetensors``) or a Python run's
    ``checkpoint_dir`` (``run.json``, ``WHICH.safetensors``), refusing a Python run the command cannot rebuild
    with the reason.

    >>> import tempfile
    >>> training_run(Path(tempfile.mkdtemp()), "--run", "last")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...' is not a training run: it needs report.json and ...
    """
    if (run / "report.json").is_file() and (run / "checkpoint" / f"{which}.safetensors").is_file():
        return read_run(run, option)[1], run / "checkpoint" / f"{which}.safetensors"
    if (run / RUN_FILE).is_file() and (run / f"{which}.safetensors").is_file():
        record = read_json(run, RUN_FILE, option)
        config = record.get("config") if isinstance(record, dict) else None
        if not isinstance(config, dict):
            why = record.get("why_not") if isinstance(record, dict) else None
            raise PartitionError(
                f"{option} {str(run)!r}: the command cannot rebuild this Python run ({why or 'no configuration'}); "
                "export it from Python with export_subnetwork(pmodel) after training.load_checkpoint"
            )
        return read_spec(config, f"{option} {str(run)!r}: {RUN_FILE}"), run / f"{which}.safetensors"
    raise PartitionError(
        f"{option} {str(run)!r} is not a training run: it needs report.json and checkpoint/{which}.safetensors "
        f"(written by `partition-fx train`), or {RUN_FILE} and {which}.safetensors (by fit(..., checkpoint_dir=...))"
    )


def starting_report(
    spec: JobSpec, data: DatasetSplits, device: str, keep_resume: bool, log: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The report a run starts with (``"status": "running"``): the ``version`` of partition-fx that wrote it, its
    job, its data, where it runs (``device``: the device ``--device`` resolved to; ``torch``: the version) and the
    trackers it ``log`` s to.

    >>> from partition_fx.datasets import digits
    >>> report = starting_report(JobSpec.from_keywords(), digits(size=8), "cpu", False)
    >>> report["command"], report["status"], report["config"]["device"], report["device"], report["data"]["train"]
    ('train', 'running', 'auto', 'cpu', 1438)
    """
    import torch

    from .. import __version__

    return {
        "command": "train",
        "version": __version__,
        "status": RunStatus.RUNNING.value,
        "keep_resume": keep_resume,  # not configuration: a resumed run honours it without being asked again
        "log": list(log),  # nor are the trackers: a resumed run logs to them too
        "config": spec.to_dict(),
        "data": {"name": data.name, "train": len(data.train), "test": len(data.test), "classes": data.num_classes},
        "history": [],
        "torch": torch.__version__,
        "device": device,
    }


def read_spec(config: Any, source: str = "the run's config") -> JobSpec:
    """The job a recorded ``config`` (``JobSpec.to_dict()``) reads back as; a configuration without a key this
    version records, or with one it does not know, is refused naming ``source``.

    >>> from partition_fx.job_spec import JobSpec
    >>> spec = JobSpec.from_keywords(hyper_lr=0.1)
    >>> read_spec(spec.to_dict()) == spec
    True
    >>> read_spec({**spec.to_dict(), "colour": "red"})
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: the run's config has unknown key(s) colour; it takes model, checkpoint, ...
    >>> damaged = spec.to_dict(); damaged["train"]["optimization"]["steps"] = "many"
    >>> read_spec(damaged, "report.json")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: report.json: config.train.optimization.steps must be an int >= 1, got 'many' ...
    """
    known = [*JobSpec.job_fields(), "train"]
    if not isinstance(config, dict):
        raise PartitionError(earlier_version(source, "config"))
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise PartitionError(f"{source} has unknown key(s) {', '.join(unknown)}; it takes {', '.join(known)}")
    try:
        return JobSpec.from_dict(config, where=f"{source}: config")
    except MissingSettings as e:
        raise PartitionError(earlier_version(source, ", ".join(f"config.{m}" for m in e.missing))) from None
    except (SettingError, SettingTypeError) as e:  # a value, not a format: named, not blamed on the version
        field = JobSpec.keywords()[e.field.keyword]
        raise PartitionError(
            f"{source}: config.{'.'.join(field.path)} {e.problem}; the file was edited or damaged: correct that "
            "value, or train again"
        ) from None
    except PartitionError as e:
        raise PartitionError(earlier_version(source, f"a configuration this version reads: {e}")) from None


def exported_model(run: Path, option: str) -> tuple[dict[str, Any], Path]:
    """The record (``record_format.MODEL_RECORD``, from ``export.json`` or ``report.json``) and the plain exported model
    (``model.safetensors``) of a ``partition-fx export`` directory or a completed ``train`` run; anything else,
    or a record an earlier version wrote, is refused saying what to do.

    >>> import tempfile
    >>> exported_model(Path(tempfile.mkdtemp()), "--run")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...' is not a `partition-fx train` run or `export` directory ...
    """
    where = f"{option} {str(run)!r}"
    name = next((n for n in ("export.json", "report.json") if (run / n).is_file()), None)
    if name is None:
        raise PartitionError(
            f"{where} is not a `partition-fx train` run or `export` directory (no report.json or export.json "
            "there); pass one, or an ONNX file with --model"
        )
    report = read_json(run, name, option)
    command = report.get("command") if isinstance(report, dict) else None
    if command not in ("train", "export"):
        raise PartitionError(
            f"{where}: {name} was not written by `partition-fx train` or `export` (command: {command!r}), so no "
            "model trained on named classes is there; pass a train run or an export directory"
        )
    model = run / "model.safetensors"
    if not model.is_file() and command == "export":
        raise PartitionError(f"{where} has no model.safetensors (removed?); export the run again")
    if not model.is_file():
        raise PartitionError(
            f"{where} has no exported model (model.safetensors): the run is {report.get('status', 'not completed')}; "
            f"`partition-fx export --run {run}` exports its last checkpoint, then predict with --run {run / 'export'}"
        )
    lacking = [key for key in MODEL_RECORD if report.get(key) is None]
    if lacking:
        how = f"`partition-fx export --run {run}` exports it again" if command == "train" else "export the run again"
        raise PartitionError(
            f"{where}: {name} lacks {', '.join(lacking)} (written by an earlier version of partition-fx, or from "
            f"data without them); {how} with this version"
        )
    return {key: report[key] for key in (*MODEL_RECORD, *CHECKS_RECORD) if report.get(key) is not None}, model
