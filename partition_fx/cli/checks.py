"""Every check of the command line's options that needs no torch, in one place, run by :func:`check_arguments`
before a command is imported: a refused value answers in a fraction of a second instead of after torch loads.

The commands run the same checks again where Python callers reach them without the command line
(``cli.job.build_job`` for ``train_job`` and the benchmarks): nothing here is only a fast path.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from .._validation import check_concentration, check_num_partitions, check_proportions
from ..choices import GENERATOR_SETS
from ..datasets.registry import split_data_spec
from ..errors import PartitionArgumentError, PartitionError, PartitionTypeError
from ..job_spec import DATASETS, DEFAULT_PROPORTIONS, DISK_DATASETS, JobSpec
from ..settings import SettingError
from .parser import DEFAULT_FEDERATED_PROPORTIONS
from .runs import check_out, job_spec, learned_ranges, read_json, resumed_spec, training_run


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse what can be refused in ``args`` (a parsed command line) without torch: option ranges and
    combinations, ``--out``, ``--run`` and ``--resume``; nothing is written.

    >>> from partition_fx.cli.parser import build_parser
    >>> check_arguments(build_parser().parse_args(["train", "--steps", "-5"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --steps must be >= 1, got -5
    """
    if getattr(args, "checkpoint", None) is not None and not Path(args.checkpoint).is_file():
        raise PartitionError(f"--checkpoint {args.checkpoint!r} is not a file")
    if args.command == "train":
        if args.resume is not None:
            if args.config is not None:
                raise PartitionArgumentError(
                    f"--resume continues {str(args.resume)!r} with its own configuration; drop --config "
                    f"{str(args.config)!r}"
                )
            check_job(resumed_spec(args)[0])
        else:
            check_job(job_spec(args), printing=args.print_config)
            if not args.print_config:  # it writes nothing
                check_out(args.out, args.overwrite, {"--data": args.data, "--checkpoint": args.checkpoint})
    elif args.command in ("convert", "describe"):
        checked_proportions(args.partitions, args.proportions)
        if args.command == "convert":
            check_out(args.out, args.overwrite, {"--checkpoint": args.checkpoint})
    elif args.command == "export":
        check_export(args)
    elif args.command == "federated":
        check_federated_options(args)
        if not args.print_config:  # it writes nothing
            check_out(args.out, args.overwrite, {})
    elif args.command == "predict":
        check_predict(args)


def check_job(spec: JobSpec, printing: bool = False) -> None:
    """What a job's fields do not check alone: its options together (``--partitions`` with ``--proportions``,
    the augmentation with ``--fix``/``--init``/``--partitions``) and ``--data``'s name, refusals naming the options.
    ``printing`` (``--print-config``): a dataset read from disk may lack its folder (a recipe's job, printed to be
    filled in).

    >>> from partition_fx.job_spec import JobSpec
    >>> check_job(JobSpec(partitions=1))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --augment affine learns its ranges, which needs --partitions 2 ...
    """
    checked_proportions(spec.partitions, spec.proportions)
    fixed = fixed_ranges(spec)
    if fixed is not None and spec.augment != "affine":
        option = "--fix" if spec.fix is not None else "--fix-from"
        raise PartitionArgumentError(f"{option} fixes the ranges of --augment affine; drop --augment {spec.augment}")
    if spec.augment == "affine":
        _check_range_names(spec, fixed)
    if spec.init is not None:
        _check_init(spec)
    if spec.augment == "affine" and fixed is None and spec.partitions < 2:
        raise PartitionArgumentError(
            f"--augment affine learns its ranges, which needs --partitions 2 or more (chunk k is scored by "
            f"subnetwork k-1), got --partitions {spec.partitions}; raise --partitions, fix the ranges with --fix "
            "NAME=VALUE (or --fix-from RUN), or pass --augment none"
        )
    data = spec.data
    if data == "input_selection":
        raise PartitionArgumentError(
            "--data 'input_selection' is a regression task; `partition-fx train` classifies images "
            "(see examples/input_selection.py for input selection)"
        )
    if not data:
        raise PartitionArgumentError("--data must be rotdigits, digits or an image folder's path, got ''")
    if data in DISK_DATASETS:
        if printing:
            return
        written = f"--recipe {spec.recipe} was written for --data {data}, which" if spec.recipe else f"--data {data}"
        raise PartitionArgumentError(
            f"{written} reads your copy of the dataset: pass its folder as --data {data}:DIR (nothing is downloaded)"
        )
    if data not in DATASETS and split_data_spec(data)[1] is None and not _is_folder(data):
        names = (*DATASETS, *DISK_DATASETS)
        close = difflib.get_close_matches(data.partition(":")[0], names, n=1)
        raise PartitionError(
            f"unknown dataset {data!r} for --data: not {' or '.join(DATASETS)}, not NAME:DIR with NAME one of "
            f"{', '.join(DISK_DATASETS)}, and not a folder"
            + (f" (did you mean {close[0]}?)" if close else "")
            + "; pass one of those or an image folder laid out as FOLDER/<class>/<image> "
            "or FOLDER/{train,test}/<class>/<image>"
        )


def _check_range_names(spec: JobSpec, fixed: dict[str, float] | None) -> None:
    """``--fix``/``--fix-from``/``--init``: only ranges the augmentation's ``--generators`` has."""
    has = GENERATOR_SETS[spec.generators]
    started = dict(spec.init) if spec.init is not None and not isinstance(spec.init, str) else {}
    for option, ranges in (("--fix" if spec.fix is not None else "--fix-from", fixed or {}), ("--init", started)):
        others = [name for name in ranges if name not in has]
        if others:
            fits = next((name for name, names in GENERATOR_SETS.items() if set(ranges) <= set(names)), None)
            raise PartitionArgumentError(
                f"{option} names {', '.join(others)}, which --generators {spec.generators} does not have (it has "
                f"{', '.join(has)}); " + (f"pass --generators {fits}" if fits else f"name only {', '.join(has)}")
            )


def _check_init(spec: JobSpec) -> None:
    """``--init``: for the ranges ``--augment affine`` learns, each within the bound it is learned in."""
    from ..transforms.affine import DEFAULT_MAX_RANGE  # imports torch: not when only parsing

    if spec.augment != "affine":
        raise PartitionArgumentError(f"--init starts the ranges of --augment affine; drop --augment {spec.augment}")
    if isinstance(spec.init, str):  # a named start, within the bounds by construction
        return
    for name, value in spec.init.items():  # type: ignore[union-attr]
        if value > DEFAULT_MAX_RANGE[name]:
            raise PartitionArgumentError(
                f"--init {name}={value} is outside the range it is learned in, [0, {DEFAULT_MAX_RANGE[name]:.6g}]; "
                f"pass {name}={DEFAULT_MAX_RANGE[name]:.6g} or less"
            )


def fixed_ranges(spec: JobSpec) -> dict[str, float] | None:
    """The augmentation ranges the job fixes: ``--fix``'s values, or those the ``--fix-from`` run learned; None
    when the ranges are learned.

    >>> from partition_fx.job_spec import JobSpec
    >>> fixed_ranges(JobSpec(fix={"rotation": 1.5})), fixed_ranges(JobSpec())
    ({'rotation': 1.5}, None)
    """
    if spec.fix is not None:
        return dict(spec.fix)
    if spec.fix_from is not None:
        return learned_ranges(Path(spec.fix_from))
    return None


def with_fixed_ranges(spec: JobSpec) -> JobSpec:
    """``spec`` with the ranges ``--fix-from RUN`` reads in ``fix`` (``fix_from`` kept, to say where they came
    from), so that a run's report records the values it trained with and is rebuilt without that other run.

    >>> from partition_fx.job_spec import JobSpec
    >>> with_fixed_ranges(JobSpec(fix={"rotation": 1.5})).fix
    {'rotation': 1.5}
    """
    return spec if spec.fix is not None or spec.fix_from is None else spec.replace(fix=fixed_ranges(spec))


def check_export(args: argparse.Namespace) -> tuple[JobSpec, Path]:
    """``export``'s ``--run`` (a training run with the chosen checkpoint: ``runs.training_run``), ``--subnetwork``
    and ``--out``; returns the job the run's configuration reads back as, and the checkpoint.

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> check_export(build_parser().parse_args(["export", "--run", tempfile.mkdtemp(), "--which", "best"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...' is not a training run: it needs report.json and checkpoint/best...
    """
    run: Path = args.run
    spec, checkpoint = training_run(run, "--run", args.which)
    partitions = spec.partitions
    if args.subnetwork is not None and not 0 <= args.subnetwork <= partitions:
        raise PartitionArgumentError(
            f"--subnetwork {args.subnetwork}: subnetwork must be in 0..{partitions} (0 = all defaults, "
            f"{partitions} = final model)"
        )
    check_out(args.out if args.out is not None else run / "export", args.overwrite, {"--run": run})
    return spec, checkpoint


MODEL_RECORD = ("classes", "preprocessing", "architecture", "onnx_names")
"""What using an exported model needs beyond its weights, written with it (``cli.job.model_record``)."""
CHECKS_RECORD = ("input_statistics",)
"""What a model record may hold beyond :data:`MODEL_RECORD` (earlier versions did not write it): the training
images' statistics ``predict`` compares new images with."""
"""What ``train`` and ``export`` record with a model (``cli.job.model_record``), in ``report.json``,
``export.json`` and the ONNX file's metadata, and ``predict`` reads."""


def check_predict(args: argparse.Namespace) -> tuple[dict[str, Any] | None, Path]:
    """``predict``'s images (each an existing file) and its model: ``--run``'s exported model and the record of its
    classes and preprocessing (:func:`exported_model`), or ``--model``, a file (its metadata is read with it);
    returns the record (None for ``--model``) and the model file.

    >>> from partition_fx.cli.parser import build_parser
    >>> check_predict(build_parser().parse_args(["predict", "--model", "no/such.onnx", "a.png"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: image a.png does not exist
    """
    for image in args.images:
        if not Path(image).is_file():
            raise PartitionError(f"image {image} {'is not a file' if Path(image).exists() else 'does not exist'}")
    if args.model is None:
        return exported_model(args.run, "--run")
    if not args.model.is_file():
        raise PartitionError(
            f"--model {str(args.model)!r} is not a file; pass the model.onnx that `partition-fx train` or `export` "
            "wrote, or a run directory with --run"
        )
    return None, args.model


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


def check_federated_options(args: argparse.Namespace) -> tuple[float, ...]:
    """``federated``'s option ranges; returns its proportions (``--proportions``, else the default shares with 3
    partitions and equal shares with any other, as ``train``'s).

    >>> from partition_fx.cli.parser import build_parser
    >>> check_federated_options(build_parser().parse_args(["federated"]))
    (0.7, 0.2, 0.1)
    >>> check_federated_options(build_parser().parse_args(["federated", "--partitions", "2"]))
    (0.5, 0.5)
    """
    if args.partitions < 1:
        raise PartitionArgumentError(f"--partitions must be >= 1, got {args.partitions}")
    if args.image_size < 8 or args.image_size % 4:
        raise PartitionArgumentError(
            f"--image-size must be a multiple of 4 and >= 8 (two 2x2 poolings), got {args.image_size}"
        )
    check_concentration(args.alpha, option="--alpha")
    shares = args.proportions
    # Every chunk needs clients: a share must be positive, where train accepts an empty partition.
    if shares is not None and (len(shares) != args.partitions or any(not p > 0 for p in shares)):
        raise PartitionArgumentError(
            f"--proportions {proportions_text(args.partitions, shares)}: give {args.partitions} positive shares "
            f"summing to 1 (--partitions {args.partitions})"
        )
    num_partitions, shares = checked_proportions(args.partitions, shares, DEFAULT_FEDERATED_PROPORTIONS)
    proportions = check_proportions(shares, num_partitions)
    federated_config(args, proportions)  # the rest (the fractions, ...) as FederatedConfig checks them
    return proportions


def federated_config(args: argparse.Namespace, proportions: tuple[float, ...]) -> Any:
    """The run's ``FederatedConfig`` from ``federated``'s options (each field from the option of its name; the
    command's ``--out`` is its report's, not the server app's ``out``), its refusals naming the option.

    >>> from partition_fx.cli.parser import build_parser
    >>> federated_config(build_parser().parse_args(["federated", "--rounds", "100"]), (0.7, 0.2, 0.1)).hyper_lr_value
    0.06
    >>> federated_config(build_parser().parse_args(["federated", "--fraction-train", "0"]), (0.7, 0.2, 0.1))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --fraction-train must be in (0, 1], got 0.0
    """
    from ..federated.config import FederatedConfig

    options = {f.keyword: getattr(args, f.keyword) for f in FederatedConfig.fields() if f.option.command_line}
    try:
        return FederatedConfig(proportions=proportions, **options)
    except SettingError as e:  # named by its option: --fraction-train
        raise PartitionArgumentError(f"{e.field.flag} {e.problem}") from None
    except PartitionArgumentError as e:  # alpha's and rotation-init's own checks name the field
        raise PartitionArgumentError(f"--{e}") from None


def checked_proportions(
    partitions: int, proportions: tuple[float, ...] | None, default: tuple[float, ...] = DEFAULT_PROPORTIONS
) -> tuple[int, tuple[float, ...] | None]:
    """``(C, proportions)`` from ``--partitions``/``--proportions`` (proportions None: equal shares; ``default``:
    the command's default shares), refusals naming those options.

    >>> checked_proportions(2, None)
    (2, None)
    >>> checked_proportions(3, (0.5, 0.5))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --partitions 3 --proportions 0.5,0.5: proportions has 2 entries ...
    """
    shares = command_line_proportions(partitions, proportions, default)
    try:
        num_partitions = check_num_partitions(partitions)
    except (PartitionArgumentError, PartitionTypeError) as e:
        raise PartitionArgumentError(f"--partitions {partitions}: {e}") from None
    given = proportions_text(partitions, proportions, default)
    if shares is not None and len(shares) != num_partitions:
        raise PartitionArgumentError(
            f"--partitions {num_partitions} --proportions {given}: proportions has {len(shares)} entries but "
            f"num_partitions={num_partitions}; give --proportions {num_partitions} comma-separated shares summing "
            f"to 1, or --partitions {len(shares)} to match them, or leave --proportions out "
            f"({_without_proportions(num_partitions, default)})"
        )
    try:
        check_proportions(shares, num_partitions)
    except (PartitionArgumentError, PartitionTypeError) as e:
        raise PartitionArgumentError(f"--partitions {num_partitions} --proportions {given}: {e}") from None
    return num_partitions, shares


def command_line_proportions(
    partitions: int, proportions: tuple[float, ...] | None, default: tuple[float, ...] = DEFAULT_PROPORTIONS
) -> tuple[float, ...] | None:
    """The proportions ``--partitions``/``--proportions`` ask for: ``--proportions`` when given, else ``default``
    (train's 0.8,0.1,0.1) with its number of partitions and None (equal shares) with any other number.

    >>> command_line_proportions(3, None), command_line_proportions(2, None)
    ((0.8, 0.1, 0.1), None)
    """
    if proportions is not None:
        return tuple(proportions)
    return default if partitions == len(default) else None


def proportions_text(
    partitions: int, proportions: tuple[float, ...] | None, default: tuple[float, ...] = DEFAULT_PROPORTIONS
) -> str:
    """``--proportions`` as the user wrote it (comma-separated), or what it is when not given, for messages.

    >>> proportions_text(3, (0.8, 0.1, 0.1)), proportions_text(4, None), proportions_text(3, None)
    ('0.8,0.1,0.1', 'not given: equal shares', 'not given: the default 0.8,0.1,0.1')
    """
    if proportions is None:
        return f"not given: {_without_proportions(partitions, default)}"
    return ",".join(str(p) for p in proportions)


def _without_proportions(num_partitions: int, default: tuple[float, ...]) -> str:
    if num_partitions == len(default):
        return "the default " + ",".join(str(p) for p in default)
    return "equal shares"


def _is_folder(text: str) -> bool:
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):  # a name too long for the file system, say
        return False
