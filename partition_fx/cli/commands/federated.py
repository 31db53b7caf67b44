"""``partition-fx federated``, declared: federated partitioned training (appendix J) and its FedAdam baseline on
Flower's simulation engine. Its options are ``FederatedConfig``'s fields (generated from their declarations) and
their checks the config's own; it runs as ``cli.federated.run_federated_command``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._validation import check_proportions
from ...datasets.registry import dataset_names
from ...errors import PartitionArgumentError
from ...federated.config import FederatedConfig
from ...job.checks import checked_proportions
from ...job.settings import Field, SettingError, SettingTypeError
from ...job.spec import default_shares_text, partitions_help
from ..argparsing import Parser, add_setting, path, proportions
from ..config_files import federated_defaults
from ..parser import add_configuration_options, add_log_option
from ..runs import LOGGED, check_out
from . import Command

DEFAULT_FEDERATED_PROPORTIONS: tuple[float, ...] = FederatedConfig.keywords()["proportions"].default
"""``--proportions`` when it is not given and ``--partitions`` is 3 (the default): the paper's chunk shares of
appendix J; other counts get equal shares."""
DATA_OPTIONS = ("data", "image_size", "clients", "alpha", "fraction_train", "fraction_evaluate")
"""The fields whose options are in the group "data and clients"; the others' are in "model, partitions and
training" (each group in the fields' order)."""


@dataclass(frozen=True)
class FederatedRequest:
    """What ``federated`` was asked: the run (``config``), where its files go (``out``, replacing an earlier run
    there with ``overwrite``), whether progress is shown (not ``quiet``), the trackers to ``log`` to, or only to
    print the run (``print_config``)."""

    config: FederatedConfig
    out: Path
    overwrite: bool
    quiet: bool
    log: tuple[str, ...] = ()
    print_config: bool = False


def _add_options(parser: Parser) -> None:
    """The options of ``partition-fx federated``, from ``FederatedConfig``'s fields.

    >>> parser = Parser()
    >>> _add_options(parser)
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
        help="no progress (default: off: a line per evaluated round of each run on stderr)",
    )
    add_log_option(output, "every evaluated round of both runs (test accuracy, NLL, traffic, hyperparameters)")
    add_configuration_options(parser, "run")
    parser.defaults_from = federated_defaults


def _add_proportions(group: Any, field: Field) -> None:
    """``--partitions`` and ``--proportions`` (``field``'s help; None when not given: the paper's chunk shares with 3
    partitions, equal shares with any other, as ``train``'s)."""
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


def federated_config(args: argparse.Namespace) -> FederatedConfig:
    """The run's ``FederatedConfig`` from the options: each field from the option of its name, the proportions
    from ``--partitions``/``--proportions``; every check the config's own, its refusal naming the option (the
    command's ``--out`` is its report's, not the server app's ``out``).

    >>> from partition_fx.cli.parser import build_parser
    >>> federated_config(build_parser().parse_args(["federated", "--rounds", "100"])).hyper_lr_value
    0.06
    >>> federated_config(build_parser().parse_args(["federated", "--partitions", "2"])).proportions
    (0.5, 0.5)
    >>> federated_config(build_parser().parse_args(["federated", "--fraction-train", "0"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --fraction-train must be in (0, 1], got 0.0
    """
    partitions, shares = checked_proportions(args.partitions, args.proportions, DEFAULT_FEDERATED_PROPORTIONS)
    options = {f.keyword: getattr(args, f.keyword) for f in FederatedConfig.fields() if f.option.command_line}
    try:
        return FederatedConfig(proportions=check_proportions(shares, partitions), **options)
    except (SettingError, SettingTypeError) as e:  # named by its option: --fraction-train
        raise PartitionArgumentError(f"{e.field.flag} {e.problem}") from None


def _options(args: argparse.Namespace) -> FederatedRequest:
    config = federated_config(args)
    if not args.print_config:  # it writes nothing
        check_out(args.out, args.overwrite, {})
    return FederatedRequest(config, args.out, args.overwrite, args.quiet, args.log or (), args.print_config)


def _show(report: Any, request: FederatedRequest) -> None:
    if request.print_config:
        print(report, end="")
        return
    base, last = report["baseline"], report["last_evaluations"]
    print(
        f"federated, {report['rounds']} rounds: test accuracy {report['test_accuracy_averaged']:.4f} averaged over "
        f"{report['config']['test-samples']} augmentations, {report['test_accuracy']:.4f} without (FedAdam baseline "
        f"{base['test_accuracy']:.4f}); mean of the last {last} evaluations "
        f"{report['mean_last_accuracy_averaged']:.4f} (baseline {base['mean_last_accuracy_averaged']:.4f})"
    )
    print(
        f"upload {report['bytes_up'] / 1e6:.1f} MB = {100 * report['upload_share']:.0f}% of the baseline's, traffic "
        f"{100 * report['traffic_share']:.0f}%; {report['seconds_per_round']:.2f} s per round"
    )
    learned = ", ".join(f"{k}={v:.3f}" for k, v in report["hyperparameters"].items() if isinstance(v, float)) or "none"
    print(f"learned hyperparameters (augmentation ranges, rotation in radians; dropout rates): {learned}")
    if report["note"]:
        print(f"{report['note']}; model.safetensors is the FedAdam baseline's (test accuracy "
              f"{base['test_accuracy']:.4f} against the partitioned run's {report['test_accuracy']:.4f})")  # fmt: skip
    print(f"wrote {request.out}/: report.json, history.json, curves.png, model.safetensors")


COMMAND = Command(
    name="federated",
    summary="federated partitioned training of appendix J on Flower's simulation engine",
    description="Train the paper's MNIST CNN federated on Flower over non-i.i.d. clients (chunk k uploads "
    "partitions k..C) and its FedAdam baseline with the Flower apps of partition_fx.federated.app (flwr run "
    "examples/flower_app runs them through Flower's own command); write report.json, history.json, curves.png "
    "and model.safetensors to --out.",
    order=4,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.federated:run_federated_command",
    show=_show,
    files={"report.json": None, "history.json": None, "curves.png": None, "model.safetensors": None, **LOGGED},
    out_of_memory="lower --image-size or --clients",
)
