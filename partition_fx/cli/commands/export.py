"""``partition-fx export``, declared: a trained run's checkpoint as a plain model, ONNX and ``export.json``. It runs
as ``cli.export.run_export``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import PartitionArgumentError
from ...job.records import training_run
from ...job.spec import JobSpec
from ..argparsing import Parser, int_at_least, path
from ..parser import add_output_options
from ..runs import DEFAULT_EXPORT, check_out
from ..summaries import accuracy_text
from . import Command


@dataclass(frozen=True)
class ExportRequest:
    """What ``export`` was asked, checked: the training ``run`` and the job its configuration reads back as
    (``spec``), its ``which`` checkpoint (the file: ``checkpoint``), the ``subnetwork`` (None: C), the samples of the
    test-time-averaged ONNX model (``test_time_samples``; 0: the plain model), and ``out`` (``--out``, else
    ``RUN/export``), replacing an earlier export there with ``overwrite``."""

    run: Path
    spec: JobSpec
    which: str
    checkpoint: Path
    subnetwork: int | None
    test_time_samples: int
    out: Path
    overwrite: bool


def _add_options(export: Parser) -> None:
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
    add_output_options(export, "directory to write (default: RUN/export)", None)


def _options(args: argparse.Namespace) -> ExportRequest:
    """``--run`` (a training run with the chosen checkpoint: ``runs.training_run``), ``--subnetwork`` and ``--out``.

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> _options(build_parser().parse_args(["export", "--run", tempfile.mkdtemp(), "--which", "best"]))
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
    out = args.out if args.out is not None else run / DEFAULT_EXPORT
    check_out(out, args.overwrite, {"--run": run})
    return ExportRequest(
        run, spec, args.which, checkpoint, args.subnetwork, args.test_time_samples, out, args.overwrite
    )


def _show(summary: dict[str, Any], request: ExportRequest) -> None:
    print(
        f"exported subnetwork {summary['subnetwork']} of {summary['run']} (step {summary['checkpoint_step']}): "
        f"{accuracy_text(summary, summary)}"
    )
    if summary["state"].startswith("the last checkpoint of a run that did not finish"):
        print(f"partition-fx: {summary['state']}")
    averaged = " (averaged)" if summary["averaged_test_accuracy"] is not None else ""
    config = ", config.json" if "config" in summary["files"] else ""  # a save_pretrained folder (--model hf:DIR)
    print(f"wrote {request.out}/: model.safetensors{config}, model.onnx{averaged}, export.json")


COMMAND = Command(
    name="export",
    summary="export a trained run's checkpoint to safetensors and ONNX",
    description="Rebuild a training run's model from its report.json, load a checkpoint, and write one subnetwork as "
    "a plain model (safetensors), ONNX and export.json (with its test accuracy) to --out.",
    order=3,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.export:run_export",
    show=_show,
    files={"export.json": None, "model.safetensors": None, "model.onnx": None, "config.json": None},
    out_of_memory="export on a machine with more memory",
)
