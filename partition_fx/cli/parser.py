"""The ``partition-fx`` argument tree, built from the commands (``cli.commands``: each declares its own options),
and the option groups several commands share: the model's, the partitioning's, the output's, the configuration
file's and ``--log``. The options that set a field of ``JobSpec``/``TrainConfig`` (``train``) or
``FederatedConfig`` (``federated``) are generated from the field's declaration (``cli.argparsing``, which also
holds the ``type=`` parsers that turn option text into values; refusals are one line, like every other refusal).

This module imports neither torch nor the package's torch modules, so ``partition-fx --help`` answers at once;
the commands import what they need when they run.

Every option's help ends with its default, written once: ``%(default)s`` where the value speaks for itself, and
what it means where it is None or depends on other options (``--proportions``, ``--eval-every``).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from .. import __version__
from ..job.spec import JobSpec, schemes
from .argparsing import (
    Parser,
    add_setting,
    int_at_least,
    path,
    path_text,
    proportions,
    range_start,
    range_values,
    seed,
    trackers,
)

DESCRIPTION = (
    "Learn hyperparameters (augmentation ranges, dropout rates, input masks) in one training run, without a "
    "validation set, by partitioning a network (Mlodozeniec, Reisser & Louizos, ICLR 2023)."
)
EPILOG = (
    "`partition-fx train` alone runs the main job: timm's resnet10t learns affine augmentation on rotdigits "
    "(a few minutes on 2 CPU cores). `partition-fx COMMAND --help` lists a command's options and defaults."
)


def build_parser() -> argparse.ArgumentParser:
    """The ``partition-fx`` parser with its commands (``cli.commands``), each with the options it declares.

    ``--proportions`` is None when not given: :func:`partition_fx.job.build.partitionify_with` reads that
    as 0.8,0.1,0.1 with 3 partitions and equal shares with any other number.

    >>> args = build_parser().parse_args(["describe", "--model", "fixup_resnet8"])
    >>> args.command, args.model, args.partitions, args.proportions
    ('describe', 'fixup_resnet8', 3, None)
    >>> build_parser().parse_args(["convert", "--proportions", "0.5,0.5"]).proportions
    (0.5, 0.5)
    """
    from .commands import commands

    parser = Parser(prog="partition-fx", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"partition-fx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for command in commands().values():
        options = parser.add_command(sub, command.name, help=command.summary, description=command.description)
        command.add_options(options)
    return parser


JOB_GROUPS = {
    "model": ("model", "checkpoint"),
    "data": ("data", "image_size", "channels"),
    "partitioning": ("partitions", "proportions", "scheme", "default", "assignments"),
    "recipe": ("recipe",),
    "learned hyperparameters": (
        "augment",
        "generators",
        "draws",
        "samples",
        "test_time_samples",
        "fix",
        "init",
        "max_range",
        "fix_from",
    ),
    "running": ("device",),
}
"""The option group of each field of ``JobSpec`` in ``train``'s help (each group in the fields' order)."""
FIXED_RANGES = ("fix", "init", "fix_from")
"""``JobSpec`` fields whose options exclude each other: the ranges are fixed, started, or read from a run."""
JOB_OPTION_TYPES: dict[str, Any] = {
    "proportions": proportions,
    "test_time_samples": int_at_least(0),
    "fix": range_values,
    "init": range_start,
    "max_range": range_values,
    "fix_from": path_text,
}
"""How the options of ``JobSpec`` fields that are not plain ints or strings read their text (``argparsing``)."""


def add_job_option(group: Any, keyword: str, **overrides: Any) -> None:
    """The option of the ``JobSpec`` field ``keyword``, generated from its declaration (``add_setting``)."""
    field = JobSpec.keywords()[keyword]
    if keyword in JOB_OPTION_TYPES:
        overrides = {"type": JOB_OPTION_TYPES[keyword], **overrides}
    add_setting(group, field, **overrides)


def add_model_options(parser: argparse.ArgumentParser, *, classes: bool) -> None:
    group = parser.add_argument_group("model")
    for keyword in JOB_GROUPS["model"]:
        add_job_option(group, keyword)
    if classes:
        group.add_argument(
            "--num-classes", type=int_at_least(1), default=10, metavar="N", help="classifier outputs (default: 10)"
        )


def add_partition_options(parser: argparse.ArgumentParser, *, with_seed: bool = True) -> None:
    """The conversion's options; ``train`` takes ``--seed`` from its training configuration instead (it seeds
    the layout and the run)."""
    group = parser.add_argument_group("partitioning")
    for keyword in JOB_GROUPS["partitioning"]:
        if keyword == "scheme":  # the schemes registered now (partition_fx.fx.kinds), a plugin's included
            described = "; ".join(f"{name}: {description}" for name, description in schemes().items())
            add_job_option(group, keyword, choices=list(schemes()), help=f"{described} (default: %(default)s)")
        else:
            add_job_option(group, keyword)
    if with_seed:
        group.add_argument(
            "--seed", type=seed, default=0, metavar="N", help="seeds the partition layout (default: %(default)s)"
        )


def add_output_options(parser: argparse.ArgumentParser, out: str, default: Path | None) -> Any:
    group = parser.add_argument_group("output")
    group.add_argument("--out", type=path, default=default, metavar="DIR", help=out)
    group.add_argument(
        "--overwrite", action="store_true", help="replace --out if it exists and is not empty (default: off)"
    )
    return group


def add_configuration_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--config FILE`` and ``--print-config``, of the command's ``what`` ("job", "run")."""
    configuration = parser.add_argument_group("configuration file")
    configuration.add_argument(
        "--config",
        type=path,
        default=None,
        metavar="FILE",
        help=f"read the {what} from this YAML file (as --print-config writes it, or any part of it); every option "
        "given on the command line overrides the file (default: none)",
    )
    configuration.add_argument(
        "--print-config",
        action="store_true",
        help=f"print the whole {what} these options resolve to, as YAML for --config, and exit without training "
        "(default: off)",
    )


def add_log_option(group: Any, logged: str) -> None:
    """``--log TRACKERS``: the configuration and what is ``logged``, to the experiment trackers named."""
    group.add_argument(
        "--log",
        type=trackers,
        default=None,
        metavar="TRACKERS",
        help=f"also log the configuration and {logged} to tensorboard (--out/tensorboard/), mlflow "
        "($MLFLOW_TRACKING_URI, else --out/mlflow.db) and/or csv (--out/metrics.csv), comma-separated (default: none)",
    )


def parse_train(argv: list[str]) -> argparse.Namespace:
    """``partition-fx train`` arguments (``argv`` without the word ``train``) with the command's defaults.

    >>> args = parse_train(["--steps", "4"])
    >>> args.steps, args.model, args.device
    (4, 'resnet10t', 'auto')
    """
    return build_parser().parse_args(["train", *argv])


def train_defaults() -> dict[str, Any]:
    """Every ``partition-fx train`` option's default, by destination name (``batch_size``, ...): the training
    configuration's defaults for its options.

    >>> from partition_fx.job.train_config import TrainConfig
    >>> train_defaults()["lr"] == TrainConfig().optimization.lr
    True
    """
    return dict(_train_defaults())  # a copy: callers may change theirs


@functools.cache
def _train_defaults() -> dict[str, Any]:
    """The defaults, parsed once (reading a report back asks for them several times)."""
    return vars(parse_train([]))
