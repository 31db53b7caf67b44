"""A run's records: what a trained model's record holds (the format ``report.json``, ``export.json`` and the ONNX
file's metadata share, and the names of the ONNX file's input and output), and a run directory read back: its report,
the job its configuration reads back as, the ranges it learned, its checkpoint, its exported model.

A run directory's report holds its ``config``, its :class:`~partition_fx.job.spec.JobSpec`'s ``to_dict()``, from
which ``export`` rebuilds the model and ``--resume`` continues the run with the same options: :func:`read_spec` is
the spec a recorded configuration reads back as.

No torch here: ``predict`` checks a record, and the command line reads a run, before torch loads.

>>> MODEL_RECORD, ONNX_INPUT, ONNX_OUTPUTS[True]
(('classes', 'preprocessing', 'architecture', 'onnx_names'), 'images', 'log_probs')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..choices import RunStatus
from ..errors import PartitionError, earlier_version
from .settings import MissingSettings, SettingError, SettingTypeError
from .spec import JobSpec
from .train_config import RUN_FILE

if TYPE_CHECKING:
    from ..datasets import DatasetSplits

MODEL_RECORD = ("classes", "preprocessing", "architecture", "onnx_names")
"""What using an exported model needs beyond its weights, recorded with it (``job.build.model_record``) in
``report.json``, ``export.json`` and the ONNX file's metadata, and read by ``predict``."""
CHECKS_RECORD = ("input_statistics",)
"""What a model record may hold beyond :data:`MODEL_RECORD` (earlier versions did not write it): the training
images' statistics ``predict`` compares new images with."""
ONNX_INPUT = "images"
"""The input of every ONNX file ``train`` and ``export`` write: a float32 NCHW batch, as ``preprocessing`` says."""
ONNX_OUTPUTS = {False: "logits", True: "log_probs"}
"""Their output: the plain model's logits, or the test-time-averaged model's log-probabilities (by ``averaged``)."""


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

    >>> from partition_fx.job.spec import JobSpec
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
    """The record (:data:`MODEL_RECORD`, from ``export.json`` or ``report.json``) and the plain exported model
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
