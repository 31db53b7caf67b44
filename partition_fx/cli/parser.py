"""The whole ``partition-fx`` argument tree: every command's options, help and defaults, in one place. The
options that set a field of ``TrainConfig`` (``train``) or ``FederatedConfig`` (``federated``) are generated from
the field's declaration (``cli.argparsing``, which also holds the ``type=`` parsers that turn option text into
values; refusals are one line, like every other refusal).

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
from ..datasets.registry import dataset_names
from ..federated.config import FederatedConfig
from ..job_spec import JobSpec, default_shares_text, partitions_help, schemes
from ..settings import Field
from ..train_config import TrainConfig
from .argparsing import (
    Parser,
    add_setting,
    add_settings,
    int_at_least,
    path,
    path_text,
    proportions,
    range_start,
    range_values,
    seed,
    trackers,
)
from .config_files import config_defaults, federated_defaults
from .recipes import RECIPES

DESCRIPTION = (
    "Learn hyperparameters (augmentation ranges, dropout rates, input masks) in one training run, without a "
    "validation set, by partitioning a network (Mlodozeniec, Reisser & Louizos, ICLR 2023)."
)
EPILOG = (
    "`partition-fx train` alone runs the main job: timm's resnet10t learns affine augmentation on rotdigits "
    "(a few minutes on 2 CPU cores). `partition-fx COMMAND --help` lists a command's options and defaults."
)
COMMANDS = {
    "train": (
        "train a model with learned hyperparameters and export it (the main job)",
        "Convert a timm or torchvision model into C partitions, train it while learning its augmentation by the "
        "partitioned marginal likelihood (no validation set), and write the exported model, ONNX, plots, "
        "checkpoints and report.json to --out. With no options: resnet10t on rotdigits with learned affine "
        "augmentation.",
    ),
    "convert": (
        "convert a model, check every subnetwork against it, and export it",
        "Convert a timm or torchvision model into C partitions, check that every subnetwork reproduces the "
        "original on digits, and write the exported model (safetensors), ONNX, describe.txt and report.json to --out.",
    ),
    "describe": (
        "print how each tensor of a model would be partitioned",
        "Print, for each parameter tensor of a timm or torchvision model, how it would be partitioned "
        "(treatment, entries per partition, why). Nothing is written.",
    ),
    "federated": (
        "federated partitioned training of appendix J on Flower's simulation engine",
        "Train the paper's MNIST CNN federated on Flower over non-i.i.d. clients (chunk k uploads partitions "
        "k..C) and its FedAdam baseline with the Flower apps of partition_fx.federated.app (flwr run "
        "examples/flower_app runs them through Flower's own command); write report.json, history.json, curves.png "
        "and model.safetensors to --out.",
    ),
    "export": (
        "export a trained run's checkpoint to safetensors and ONNX",
        "Rebuild a training run's model from its report.json, load a checkpoint, and write one subnetwork as a "
        "plain model (safetensors), ONNX and export.json (with its test accuracy) to --out.",
    ),
    "predict": (
        "classify images by name with a model train or export wrote",
        "Read each image as the model's training data were read (the preprocessing its run recorded) and print its "
        "most probable class by name with its probability: with a run's exported model (--run), or with an ONNX "
        "file alone (--model), whose metadata holds the class names and the preprocessing. Nothing is written.",
    ),
}
"""Each command's one-line help (in ``partition-fx --help``) and its description (in its own ``--help``)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``partition-fx`` parser with its commands: ``train``, ``convert``, ``describe``, ``export``,
    ``federated`` and ``predict``.

    ``--proportions`` is None when not given: :func:`partition_fx.cli.job.partitionify_with` reads that
    as 0.8,0.1,0.1 with 3 partitions and equal shares with any other number.

    >>> args = build_parser().parse_args(["describe", "--model", "fixup_resnet8"])
    >>> args.command, args.model, args.partitions, args.proportions
    ('describe', 'fixup_resnet8', 3, None)
    >>> build_parser().parse_args(["convert", "--proportions", "0.5,0.5"]).proportions
    (0.5, 0.5)
    """
    parser = Parser(prog="partition-fx", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"partition-fx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    adders = {
        "train": _add_train, "convert": _add_convert, "describe": _add_describe, "export": _add_export,
        "federated": _add_federated, "predict": _add_predict,
    }  # fmt: skip
    for name, add in adders.items():
        summary, description = COMMANDS[name]
        add(parser.add_command(sub, name, help=summary, description=description))
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
    "fix_from": path_text,
}
"""How the options of ``JobSpec`` fields that are not plain ints or strings read their text (``argparsing``)."""


def _add_job_option(group: Any, keyword: str, **overrides: Any) -> None:
    """The option of the ``JobSpec`` field ``keyword``, generated from its declaration (``add_setting``)."""
    field = JobSpec.keywords()[keyword]
    if keyword in JOB_OPTION_TYPES:
        overrides = {"type": JOB_OPTION_TYPES[keyword], **overrides}
    add_setting(group, field, **overrides)


def _add_model_options(parser: argparse.ArgumentParser, *, classes: bool) -> None:
    group = parser.add_argument_group("model")
    for keyword in JOB_GROUPS["model"]:
        _add_job_option(group, keyword)
    if classes:
        group.add_argument(
            "--num-classes", type=int_at_least(1), default=10, metavar="N", help="classifier outputs (default: 10)"
        )


def _add_partition_options(parser: argparse.ArgumentParser, *, with_seed: bool = True) -> None:
    """The conversion's options; ``train`` takes ``--seed`` from its training configuration instead (it seeds
    the layout and the run)."""
    group = parser.add_argument_group("partitioning")
    for keyword in JOB_GROUPS["partitioning"]:
        if keyword == "scheme":  # the schemes registered now (partition_fx.kinds), a plugin's included
            described = "; ".join(f"{name}: {description}" for name, description in schemes().items())
            _add_job_option(group, keyword, choices=list(schemes()), help=f"{described} (default: %(default)s)")
        else:
            _add_job_option(group, keyword)
    if with_seed:
        group.add_argument(
            "--seed", type=seed, default=0, metavar="N", help="seeds the partition layout (default: %(default)s)"
        )


def _add_output_options(parser: argparse.ArgumentParser, out: str, default: Path | None) -> Any:
    group = parser.add_argument_group("output")
    group.add_argument("--out", type=path, default=default, metavar="DIR", help=out)
    group.add_argument(
        "--overwrite", action="store_true", help="replace --out if it exists and is not empty (default: off)"
    )
    return group


def _add_configuration_options(parser: argparse.ArgumentParser, what: str) -> None:
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


def _add_log_option(group: Any, logged: str) -> None:
    """``--log TRACKERS``: the configuration and what is ``logged``, to the experiment trackers named."""
    group.add_argument(
        "--log",
        type=trackers,
        default=None,
        metavar="TRACKERS",
        help=f"also log the configuration and {logged} to tensorboard (--out/tensorboard/), mlflow "
        "($MLFLOW_TRACKING_URI, else --out/mlruns) and/or csv (--out/metrics.csv), comma-separated (default: none)",
    )


def _add_convert(convert: argparse.ArgumentParser) -> None:
    _add_model_options(convert, classes=True)
    _add_partition_options(convert)
    convert.add_argument_group("check").add_argument(
        "--input-size",
        type=int_at_least(1),
        default=32,
        metavar="PIXELS",
        help="side of the digit images the subnetworks are checked on (default: %(default)s)",
    )
    _add_output_options(convert, "directory to write (default: %(default)s)", Path("runs/convert"))


def _add_describe(describe: argparse.ArgumentParser) -> None:
    _add_model_options(describe, classes=True)
    _add_partition_options(describe)


def _add_export(export: argparse.ArgumentParser) -> None:
    export.add_argument(
        "--run", type=path, required=True, metavar="DIR", help="the --out directory of a training run (required)"
    )
    export.add_argument(
        "--which",
        choices=["last", "best"],
        default="last",
        help="which checkpoint of the run: last, its final state (the fine-tuned model when it fine-tuned), or best, "
        "the partitioned state with the highest conditional LML, before any fine-tuning (default: %(default)s)",
    )
    export.add_argument(
        "--subnetwork",
        type=int,
        default=None,
        metavar="K",
        help="the subnetwork to export, 0..C (default: C, the final model)",
    )
    export.add_argument(
        "--test-time-samples",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="write model.onnx as the model averaged over K fixed transforms of the run's learned augmentation "
        "(test-time averaging) and report its test scores too; model.safetensors stays the plain model; 0: the "
        "plain model (default: %(default)s)",
    )
    _add_output_options(export, "directory to write (default: RUN/export)", None)


def _add_predict(predict: argparse.ArgumentParser) -> None:
    model = predict.add_argument_group("model").add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--run",
        type=path,
        default=None,
        metavar="DIR",
        help="a `partition-fx train` run or `export` directory: predict with its plain exported model "
        "(model.safetensors, rebuilt as its report.json or export.json records) (required: --run or --model)",
    )
    model.add_argument(
        "--model",
        type=path,
        default=None,
        metavar="FILE",
        help="an ONNX file that `partition-fx train` or `export` wrote: predict with it in onnxruntime, the class "
        "names and preprocessing read from its metadata (required: --run or --model)",
    )
    predict.add_argument("images", nargs="+", type=path_text, metavar="IMAGE", help="image files PIL can read")
    output = predict.add_argument_group("output")
    output.add_argument(
        "--top",
        type=int_at_least(1),
        default=1,
        metavar="K",
        help="print each image's K most probable classes (default: %(default)s)",
    )
    output.add_argument(
        "--json",
        action="store_true",
        help="print the predictions as JSON: per image its path and the classes with index and probability "
        "(default: off: one line per image)",
    )


def _add_train(train: Parser) -> None:
    """``train``'s options: those of ``JobSpec`` and ``TrainConfig``, generated from their fields, and those that
    say how to run and where to write (no report records them: ``cli.runs.RUN_CONTROL``)."""
    train.defaults_from = config_defaults
    _add_model_options(train, classes=False)
    data = train.add_argument_group("data")
    for keyword in JOB_GROUPS["data"]:
        _add_job_option(data, keyword)
    _add_partition_options(train, with_seed=False)
    recipe = JobSpec.keywords()["recipe"].option
    _add_job_option(
        train.add_argument_group("recipe"),
        "recipe",
        choices=list(RECIPES),
        metavar="NAME",
        help=f"{recipe.help}: {', '.join(RECIPES)} (the files partition_fx/recipes/NAME.yaml; `--recipe NAME "
        f"--print-config` shows the whole job one runs) (default: {recipe.default_text})",
    )
    _add_configuration_options(train, "job")
    hyper = train.add_argument_group("learned hyperparameters")
    fixed = None
    for keyword in JOB_GROUPS["learned hyperparameters"]:
        if keyword in FIXED_RANGES and fixed is None:
            fixed = hyper.add_mutually_exclusive_group()
        _add_job_option(fixed if keyword in FIXED_RANGES else hyper, keyword)
    groups = {"learned hyperparameters": hyper, "training": train.add_argument_group("training")}
    groups["output"] = _add_output_options(
        train, "directory to write the run to (default: %(default)s)", Path("runs/train")
    )
    _add_log_option(
        groups["output"], "every evaluation (LMLs, losses, learning rates, hyperparameters) and the test accuracy"
    )
    run = groups["running"] = train.add_argument_group("running")
    for keyword in JOB_GROUPS["running"]:
        _add_job_option(run, keyword)
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

    >>> train_defaults()["lr"] == TrainConfig().optimization.lr
    True
    """
    return dict(_train_defaults())  # a copy: callers may change theirs


@functools.cache
def _train_defaults() -> dict[str, Any]:
    """The defaults, parsed once (reading a report back asks for them several times)."""
    return vars(parse_train([]))


DEFAULT_FEDERATED_PROPORTIONS: tuple[float, ...] = FederatedConfig.keywords()["proportions"].default
"""``--proportions`` when it is not given and ``--partitions`` is 3 (the default): the paper's chunk shares of
appendix J; other counts get equal shares."""
DATA_OPTIONS = ("data", "image_size", "clients", "alpha", "fraction_train", "fraction_evaluate")
"""The fields whose options are in the group "data and clients"; the others' are in "model, partitions and
training" (each group in the fields' order)."""


def _add_federated(parser: argparse.ArgumentParser) -> None:
    """The options of ``partition-fx federated``.

    >>> parser = argparse.ArgumentParser()
    >>> _add_federated(parser)
    >>> args = parser.parse_args(["--proportions", "0.5,0.5", "--partitions", "2"])
    >>> args.proportions, args.alpha, args.data
    ((0.5, 0.5), 0.1, 'rotdigits')
    """
    data = parser.add_argument_group("data and clients (appendix J.2)")
    model = parser.add_argument_group("model, partitions and training (appendix J.1)")
    fields = list(FederatedConfig.fields())
    for group, members in ((data, [f for f in fields if f.keyword in DATA_OPTIONS]),
                           (model, [f for f in fields if f.keyword not in DATA_OPTIONS])):  # fmt: skip
        for field in members:
            if field.keyword == "proportions":
                _add_proportions(group, field)
            elif field.keyword == "data":
                add_setting(group, field, choices=dataset_names(task="images", on_disk=False))
            elif field.option.command_line:
                add_setting(group, field)
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        type=path,
        default=Path("runs/federated"),
        metavar="DIR",
        help="report.json, history.json, curves.png, model.safetensors (default: %(default)s)",
    )
    output.add_argument("--overwrite", action="store_true", help="replace --out if it is not empty (default: off)")
    output.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (default: off: Flower's log of every round on stderr)",
    )
    _add_log_option(output, "every evaluated round of both runs (test accuracy, NLL, traffic, hyperparameters)")
    _add_configuration_options(parser, "run")
    if isinstance(parser, Parser):
        parser.defaults_from = federated_defaults


def _add_proportions(group: Any, field: Field) -> None:
    """``federated``'s ``--partitions`` and ``--proportions`` (``field``'s help; None when not given: the paper's
    chunk shares with 3 partitions, equal shares with any other, as ``train``'s)."""
    counted, shares, default = "partitions and chunks", field.option.help, DEFAULT_FEDERATED_PROPORTIONS
    group.add_argument(
        "--partitions",
        type=int,
        default=len(default),
        metavar="C",
        help=f"{partitions_help(counted, default)} (default: %(default)s)",
    )
    group.add_argument(
        "--proportions",
        type=proportions,
        default=None,
        metavar="P1,P2,...",
        help=f"{shares} (default: {default_shares_text(default)})",
    )
