"""``partition-fx train``, declared: the main job's options (those of ``JobSpec`` and ``TrainConfig``, generated from
their fields, and those that say how to run and where to write), their checks, the files a run writes and its
summary. It runs as ``cli.train.run_train``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...choices import RunStatus
from ...errors import PartitionArgumentError, PartitionError, PartitionTypeError
from ...job.checks import check_job
from ...job.records import read_run
from ...job.settings import SettingError, SettingTypeError
from ...job.spec import JobSpec
from ...job.train_config import TrainConfig
from ..argparsing import Parser, add_settings, path
from ..config_files import config_defaults
from ..parser import (
    FIXED_RANGES,
    JOB_GROUPS,
    add_configuration_options,
    add_job_option,
    add_log_option,
    add_model_options,
    add_output_options,
    add_partition_options,
    train_defaults,
)
from ..recipes import RECIPES
from ..runs import LOGGED, check_out
from . import Command


@dataclass(frozen=True)
class RunOptions:
    """How ``train`` runs its job and where it writes (the options of :data:`RUN_CONTROL`, which no report
    records): ``out`` (the run directory, ``--resume``'s when it resumes), whether to ``overwrite`` it, ``quiet``
    (no progress bar), ``keep_resume`` (keep ``checkpoint/resume/`` once the run completes), ``resume`` (continue
    the run in ``out``) and the trackers to ``log`` to (``training.tracking``)."""

    out: Path
    overwrite: bool
    quiet: bool
    keep_resume: bool
    resume: bool
    log: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainRequest:
    """What ``train`` was asked: the job (``spec``), how to run it (``run``), or only to print the job
    (``print_config``)."""

    spec: JobSpec
    run: RunOptions
    print_config: bool = False


RUN_CONTROL = ("command", "out", "overwrite", "quiet", "keep_resume", "resume", "config", "print_config", "log")
"""``train``'s options that say how to run and where to write, not what is trained: no report records them."""


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job ``train``'s options ask for (``args``, parsed): every option but :data:`RUN_CONTROL` is a field of
    the spec or of its training configuration. A value the spec refuses is named by its option.

    >>> from partition_fx.cli.parser import parse_train
    >>> job_spec(parse_train(["--hyper-samples", "4"])).train.hyper.samples
    4
    >>> job_spec(parse_train(["--finetune-steps", "9", "--steps", "9"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --finetune-steps must be less than --steps 9 (they are its last ...
    """
    keywords = {f.keyword: getattr(args, f.keyword) for f in JobSpec.fields() if f.option.command_line}
    try:
        return JobSpec.from_keywords(**keywords)
    except (SettingError, SettingTypeError) as e:
        kind = PartitionTypeError if isinstance(e, SettingTypeError) else PartitionArgumentError
        raise kind(f"{e.field.flag} {e.problem}") from None


def resumed_spec(args: argparse.Namespace) -> tuple[JobSpec, bool, tuple[str, ...]]:
    """``--resume RUN``: the run's own job (from its report), refusing options that contradict it, whether
    to keep its resume state once it completes (``--keep-resume`` now, or when the run started), and the trackers
    it logs to (those ``--log`` named when it started, and any named now).

    Options left at their defaults take the run's values (``--device`` included: the run's as asked).

    >>> import tempfile
    >>> from partition_fx.cli.parser import parse_train
    >>> resumed_spec(parse_train(["--resume", tempfile.mkdtemp()]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --resume '...': no report.json there; pass the --out directory of ...
    """
    run: Path = args.resume
    if not (run / "report.json").is_file():
        raise PartitionError(
            f"--resume {str(run)!r}: no report.json there; pass the --out directory of an earlier `partition-fx train`"
        )
    try:
        report, spec = read_run(run, "--resume")
    except PartitionError as e:
        kept = run / "checkpoint" / "resume"
        if "report.json cannot be read" not in str(e) or not kept.is_dir():
            raise
        raise PartitionError(
            f"{e}; the run's resume state, {kept}, is intact: put back its report.json (the job the state "
            "continues), or train anew"
        ) from None
    if report.get("status") == RunStatus.COMPLETED:
        raise PartitionError(f"--resume {str(run)!r}: that run completed; nothing to resume (export it, or train anew)")
    defaults = train_defaults()
    configured = [key for key in defaults if key not in RUN_CONTROL]
    given = {key: getattr(args, key) for key in configured if getattr(args, key) != defaults[key]}
    saved = {key: spec.value(key) for key in given}
    if args.out != defaults["out"] and args.out != run:
        given["out"], saved["out"] = args.out, run
    conflicts = [key for key, value in given.items() if value != saved[key]]
    if conflicts:
        options = ", ".join(
            f"--{key.replace('_', '-')} {_as_given(given[key])} (the run has {_as_given(saved[key])})"
            for key in conflicts
        )
        raise PartitionArgumentError(f"--resume continues {str(run)!r} with its own configuration; drop {options}")
    recorded = report.get("log") or []
    trackers = tuple(dict.fromkeys([*recorded, *(args.log or ())]))  # as when the run started, and any added now
    return spec, args.keep_resume or bool(report.get("keep_resume")), trackers  # asked for then, or now


def _as_given(value: Any) -> str:
    """An option's value as the command line spells it: ``NAME=VALUE`` pairs for a mapping, ``unset`` for None.

    >>> _as_given({"rotation": 1.0, "shear": 0.5}), _as_given(None), _as_given(3)
    ('rotation=1.0,shear=0.5', 'unset', '3')
    """
    if value is None:
        return "unset"
    if isinstance(value, Mapping):
        return ",".join(f"{name}={number}" for name, number in value.items())
    return str(value)


def _add_options(train: Parser) -> None:
    train.defaults_from = config_defaults
    add_model_options(train, classes=False)
    data = train.add_argument_group("data")
    for keyword in JOB_GROUPS["data"]:
        add_job_option(data, keyword)
    add_partition_options(train, with_seed=False)
    recipe = JobSpec.keywords()["recipe"].option
    add_job_option(
        train.add_argument_group("recipe"),
        "recipe",
        choices=list(RECIPES),
        metavar="NAME",
        help=f"{recipe.help}: {', '.join(RECIPES)} (the files partition_fx/recipes/NAME.yaml; `--recipe NAME "
        f"--print-config` shows the whole job one runs) (default: {recipe.default_text})",
    )
    add_configuration_options(train, "job")
    hyper = train.add_argument_group("learned hyperparameters")
    fixed = None
    for keyword in JOB_GROUPS["learned hyperparameters"]:
        if keyword in FIXED_RANGES and fixed is None:
            fixed = hyper.add_mutually_exclusive_group()
        add_job_option(fixed if keyword in FIXED_RANGES else hyper, keyword)
    groups = {"learned hyperparameters": hyper, "training": train.add_argument_group("training")}
    groups["output"] = add_output_options(
        train, "directory to write the run to (default: %(default)s)", Path("runs/train")
    )
    add_log_option(
        groups["output"], "every evaluation (LMLs, losses, learning rates, hyperparameters) and the test accuracy"
    )
    run = groups["running"] = train.add_argument_group("running")
    for keyword in JOB_GROUPS["running"]:
        add_job_option(run, keyword)
    run.add_argument(
        "--quiet", action="store_true", help="no progress bar (default: off: a bar is shown when stderr is a terminal)"
    )
    run.add_argument(
        "--keep-resume",
        action="store_true",
        help="keep checkpoint/resume/ (the optimiser state, about 3x the model) once the run completes; an "
        "unfinished run always keeps it (default: off: a completed run removes it)",
    )
    run.add_argument(
        "--resume",
        type=path,
        default=None,
        metavar="RUN",
        help="continue an interrupted or failed run (its --out directory) with its own options "
        "(default: none, a new run)",
    )
    add_settings(train, TrainConfig, groups)


def _options(args: argparse.Namespace) -> TrainRequest:
    """The job and how to run it, checked without torch: a new run's ``--out`` (unless only printing), or the run
    ``--resume`` continues, with its own job and trackers."""
    if args.resume is not None:
        if args.config is not None:
            raise PartitionArgumentError(
                f"--resume continues {str(args.resume)!r} with its own configuration; drop --config "
                f"{str(args.config)!r}"
            )
        spec, keep_resume, log = resumed_spec(args)
        check_job(spec)
        run = RunOptions(args.resume, overwrite=False, quiet=args.quiet, keep_resume=keep_resume, resume=True, log=log)
        return TrainRequest(spec, run, args.print_config)
    spec = job_spec(args)
    check_job(spec, printing=args.print_config)
    if not args.print_config:  # it writes nothing
        check_out(args.out, args.overwrite, {"--data": args.data, "--checkpoint": args.checkpoint})
    run = RunOptions(args.out, args.overwrite, args.quiet, args.keep_resume, resume=False, log=args.log or ())
    return TrainRequest(spec, run, args.print_config)


def _show(result: Any, request: TrainRequest) -> None:
    """The job as YAML (``--print-config``), or the run's summary (under torchrun, rank 0 speaks for the launch)."""
    if request.print_config:
        print(result, end="")
        return
    if os.environ.get("RANK", "0") != "0":
        return
    from ..summaries import accuracy_text, evidence_text

    hyper = result["hyperparameters"]
    learned = ", ".join(f"{k}={v:.3f}" for k, v in hyper.items() if isinstance(v, float)) or "none"
    print(
        f"trained {result['config']['model']} on {result['data']['name']} ({result['data']['train']} training "
        f"images, {result['data']['test']} test) for {result['steps']} iterations in "
        f"{result['seconds']:.0f}s: {accuracy_text(result, result['config'])}"
    )
    print(evidence_text(result))
    how = "fixed" if result["config"]["fix"] is not None else "learned"  # --fix, --fix-from: nothing learned
    print(f"{how} hyperparameters (ranges; rotation in radians): {learned}")
    logged = ", ".join(result["files"].get("trackers", []))  # what --log wrote under the run
    print(
        f"wrote {request.run.out}/: report.json, lml.png, hyperparameters.png, model.safetensors, model.onnx, "
        "checkpoint/" + (f", {logged}" if logged else "")
    )


def _interrupted(request: TrainRequest) -> str:
    """What the report of an interrupted run says can be done next: resume from its last evaluation, export a run
    whose training had finished, or run again when nothing was saved.

    >>> import tempfile
    >>> run = RunOptions(Path(tempfile.mkdtemp()), False, True, False, False)
    >>> _interrupted(TrainRequest(JobSpec(), run))
    '; it stopped before anything was saved: run it again'
    """
    run = request.run.out
    try:
        report = json.loads((run / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        report = None
    if not isinstance(report, dict) or report.get("status") != RunStatus.INTERRUPTED:  # not this run's report
        return "; it stopped before anything was saved: run it again"
    try:  # the run's iterations, as its configuration records them (a JobSpec's to_dict)
        steps = report["config"]["train"]["optimization"]["steps"]
    except (KeyError, TypeError):
        steps = None
    step = report.get("last_checkpoint_step")
    if step is None:
        return "; it stopped before its first evaluation, so there is nothing to resume: run it again (--overwrite)"
    if step == steps:
        return f"; its training had finished: `partition-fx export --run {run}` writes its model"
    return f"; the last checkpoint and report.json are kept: continue with `partition-fx train --resume {run}`"


COMMAND = Command(
    name="train",
    summary="train a model with learned hyperparameters and export it (the main job)",
    description="Convert a timm or torchvision model into C partitions, train it while learning its augmentation by "
    "the partitioned marginal likelihood (no validation set), and write the exported model, ONNX, plots, "
    "checkpoints and report.json to --out. With no options: resnet10t on rotdigits with learned affine "
    "augmentation.",
    order=0,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.train:run_train",
    show=_show,
    files={
        "report.json": None,
        "lml.png": None,
        "hyperparameters.png": None,
        "model.safetensors": None,
        "model.onnx": None,
        "checkpoint": {"last.safetensors": None, "best.safetensors": None, "resume": None},
        **LOGGED,
    },
    out_of_memory="lower --image-size, --batch-size or --samples, or choose a smaller --model",
    interrupted=_interrupted,
)

__all__ = ["COMMAND", "RunOptions", "TrainRequest"]
