"""The checks of a training job's options that need no torch and that more than one command or caller runs: a
``JobSpec``'s options together (:func:`check_job`), the fixed ranges, and ``--partitions`` with ``--proportions``.
A command's own checks are its declaration's (``cli.commands``).

The commands run the same checks again where Python callers reach them without the command line
(``job.build.build_job``, which Python scripts, the benchmarks and the command line's ``train_job`` call): nothing
here is only a fast path.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .._validation import check_num_partitions, check_proportions
from ..choices import GENERATOR_SETS
from ..datasets.registry import split_data_spec
from ..errors import PartitionArgumentError, PartitionError, PartitionTypeError, RangeError
from ..hf_folders import check_hf_folder
from ..ranges import learning_bounds, learning_start
from .records import learned_ranges
from .spec import DATASETS, DEFAULT_PROPORTIONS, DISK_DATASETS, JobSpec


def check_job(spec: JobSpec, printing: bool = False) -> None:
    """What a job's fields do not check alone: its options together (``--partitions`` with ``--proportions``,
    the augmentation with ``--fix``/``--init``/``--partitions``) and ``--data``'s name, refusals naming the options.
    ``printing`` (``--print-config``): a dataset read from disk may lack its folder (a recipe's job, printed to be
    filled in).

    >>> from partition_fx.job.spec import JobSpec
    >>> check_job(JobSpec(partitions=1))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --augment affine learns its ranges, which needs --partitions 2 ...
    """
    check_hf_folder(spec.model)
    check_checkpoint(spec.checkpoint)
    checked_proportions(spec.partitions, spec.proportions)
    fixed = fixed_ranges(spec)
    if fixed is not None and spec.augment != "affine":
        option = "--fix" if spec.fix is not None else "--fix-from"
        raise PartitionArgumentError(f"{option} fixes the ranges of --augment affine; drop --augment {spec.augment}")
    if spec.max_range is not None:
        _check_max_range(spec, fixed)
    factors = spec.train.hyper.train_range_factors
    if factors and spec.augment != "affine":
        raise PartitionArgumentError(
            f"--train-range-factors scales the ranges of --augment affine; drop --augment {spec.augment} or "
            "--train-range-factors"
        )
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
    members = spec.train.population.members
    if members > 1 and (spec.augment != "affine" or fixed is not None):
        fixing = "--fix" if spec.fix is not None else "--fix-from"
        given = f"--augment {spec.augment}" if spec.augment != "affine" else fixing
        raise PartitionArgumentError(
            f"--population {members} compares runs and moves their learned ranges, and {given} leaves none to learn: "
            "learn the ranges (--augment affine without --fix) or drop --population"
        )
    data = spec.data
    if data == "input_selection":
        raise PartitionArgumentError(
            "--data 'input_selection' is a regression task; `partition-fx train` classifies images "
            "(see examples/input_selection.py for input selection)"
        )
    if not data:
        raise PartitionArgumentError(f"--data must be {', '.join(DATASETS)} or an image folder's path, got ''")
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


def check_checkpoint(checkpoint: str | None) -> None:
    """Refuse a ``--checkpoint`` that is not a file.

    >>> check_checkpoint("no/such.safetensors")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --checkpoint 'no/such.safetensors' is not a file
    """
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise PartitionError(f"--checkpoint {checkpoint!r} is not a file")


def _check_range_names(spec: JobSpec, fixed: dict[str, float] | None) -> None:
    """``--fix``/``--fix-from``/``--init``/``--max-range``/``--train-range-factors``: only ranges the augmentation's
    ``--generators`` has."""
    has = GENERATOR_SETS[spec.generators]
    started = dict(spec.init) if spec.init is not None and not isinstance(spec.init, str) else {}
    bounded = dict(spec.max_range or {})
    for option, ranges in (
        ("--fix" if spec.fix is not None else "--fix-from", fixed or {}),
        ("--init", started),
        ("--max-range", bounded),
        ("--train-range-factors", dict(spec.train.hyper.train_range_factors or {})),
    ):
        others = [name for name in ranges if name not in has]
        if others:
            fits = next((name for name, names in GENERATOR_SETS.items() if set(ranges) <= set(names)), None)
            raise PartitionArgumentError(
                f"{option} names {', '.join(others)}, which --generators {spec.generators} does not have (it has "
                f"{', '.join(has)}); " + (f"pass --generators {fits}" if fits else f"name only {', '.join(has)}")
            )


def _check_max_range(spec: JobSpec, fixed: dict[str, float] | None) -> None:
    """``--max-range``: bounds for the ranges ``--augment affine`` learns, so neither with nothing learned."""
    if spec.augment != "affine":
        raise PartitionArgumentError(
            f"--max-range bounds the ranges --augment affine learns; drop --augment {spec.augment}"
        )
    if fixed is not None:
        option = "--fix" if spec.fix is not None else "--fix-from"
        raise PartitionArgumentError(
            f"--max-range bounds the ranges that are learned, and {option} fixes them (a fixed range may exceed its "
            f"bound); drop --max-range"
        )


def _check_init(spec: JobSpec) -> None:
    """``--init``: for the ranges ``--augment affine`` learns, each within the bound it is learned in (its
    ``--max-range``, else its default), as the transform rules (``ranges.learning_start``), its refusal said with
    the options."""
    if spec.augment != "affine":
        raise PartitionArgumentError(f"--init starts the ranges of --augment affine; drop --augment {spec.augment}")
    if spec.init is None:  # the transform's own start
        return
    bounds = learning_bounds(spec.max_range, spec.generators)
    try:
        learning_start(spec.init, bounds)
    except RangeError as e:
        name, bound = e.generator, e.bound
        raise PartitionArgumentError(
            f"--init {name}={e.value} is outside the range it is learned in, [0, {bound:.6g}]; "
            f"pass {name}={bound:.6g} or less, or raise its bound with --max-range {name}=VALUE"
        ) from None


def fixed_ranges(spec: JobSpec) -> dict[str, float] | None:
    """The augmentation ranges the job fixes: ``--fix``'s values, or those the ``--fix-from`` run learned; None
    when the ranges are learned.

    >>> from partition_fx.job.spec import JobSpec
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

    >>> from partition_fx.job.spec import JobSpec
    >>> with_fixed_ranges(JobSpec(fix={"rotation": 1.5})).fix
    {'rotation': 1.5}
    """
    return spec if spec.fix is not None or spec.fix_from is None else spec.replace(fix=fixed_ranges(spec))


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
