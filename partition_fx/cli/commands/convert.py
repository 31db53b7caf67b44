"""``partition-fx convert``, declared: convert a model, check every subnetwork against it on digits, export it. It
runs as ``cli.convert.run_convert``; ``describe`` shares its model and partitioning options
(:class:`ConversionOptions`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...job.checks import check_checkpoint, checked_proportions
from ..argparsing import Parser, int_at_least
from ..parser import add_model_options, add_output_options, add_partition_options
from ..runs import check_out
from . import Command


@dataclass(frozen=True)
class ConversionOptions:
    """A model and how it is partitioned, as ``convert`` and ``describe`` take them: ``model`` (with weights from
    ``checkpoint``) of ``num_classes`` outputs, into ``partitions`` of ``proportions`` (None: the defaults'),
    ``scheme``, ``default`` values and ``assignments``, its layout seeded by ``seed``."""

    model: str
    checkpoint: str | None
    num_classes: int
    partitions: int
    proportions: tuple[float, ...] | None
    scheme: str
    default: str
    assignments: str
    seed: int

    @classmethod
    def parsed(cls, args: argparse.Namespace) -> ConversionOptions:
        """From the parsed options, ``--partitions``/``--proportions`` checked together."""
        check_checkpoint(args.checkpoint)
        checked_proportions(args.partitions, args.proportions)
        return cls(args.model, args.checkpoint, args.num_classes, args.partitions, args.proportions, args.scheme,
                   args.default, args.assignments, args.seed)  # fmt: skip


@dataclass(frozen=True)
class ConvertOptions:
    """``convert``'s: the ``conversion``, the side of the digits it is checked on (``input_size``) and where it
    writes (``out``, replacing an earlier run there with ``overwrite``)."""

    conversion: ConversionOptions
    input_size: int
    out: Path
    overwrite: bool


def add_conversion_options(parser: Parser) -> None:
    """The model's and the partitioning's options, as ``convert`` and ``describe`` declare them."""
    add_model_options(parser, classes=True)
    add_partition_options(parser)


def _add_options(convert: Parser) -> None:
    add_conversion_options(convert)
    convert.add_argument_group("check").add_argument(
        "--input-size",
        type=int_at_least(1),
        default=32,
        metavar="PIXELS",
        help="side of the digit images the subnetworks are checked on (default: %(default)s)",
    )
    add_output_options(convert, "directory to write (default: %(default)s)", Path("runs/convert"))


def _options(args: argparse.Namespace) -> ConvertOptions:
    check_out(args.out, args.overwrite, {"--checkpoint": args.checkpoint})
    return ConvertOptions(ConversionOptions.parsed(args), args.input_size, args.out, args.overwrite)


def _show(report: dict[str, Any], options: ConvertOptions) -> None:
    diffs = report["max_relative_difference_to_original"]
    print(
        f"converted {report['model']} ({report['original_parameters']:,} parameters) into "
        f"{report['num_partitions']} partitions {report['trainable_entries_per_partition']} "
        f"in {report['conversion_seconds']:.2f}s"
    )
    print(
        f"subnetworks 0..{report['num_partitions']} vs original on digits: max relative difference "
        f"{max(diffs.values()):.1e}"
    )
    print(f"wrote {options.out}/: model.safetensors, model.onnx (checked in onnxruntime), describe.txt, report.json")


COMMAND = Command(
    name="convert",
    summary="convert a model, check every subnetwork against it, and export it",
    description="Convert a timm or torchvision model into C partitions, check that every subnetwork reproduces the "
    "original on digits, and write the exported model (safetensors), ONNX, describe.txt and report.json to --out.",
    order=1,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.convert:run_convert",
    show=_show,
    files={"report.json": None, "model.safetensors": None, "model.onnx": None, "describe.txt": None},
    out_of_memory="lower --input-size or --num-classes, or choose a smaller --model",
)
