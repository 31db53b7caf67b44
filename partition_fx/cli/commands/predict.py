"""``partition-fx predict``, declared: classify image files by name with a model ``train`` or ``export`` wrote;
nothing is written. It runs as ``cli.predict.run_predict``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import PartitionError
from ..argparsing import Parser, int_at_least, path, path_text
from ..runs import exported_model
from . import Command


@dataclass(frozen=True)
class PredictRequest:
    """What ``predict`` was asked, checked: the ``images`` (each an existing file), the model file (``model``: a
    run's ``model.safetensors`` with its ``record``, or an ONNX file, whose metadata holds it: ``record`` None), the
    option that named it (``source``), the ``top`` classes to print and whether as ``json``."""

    images: tuple[str, ...]
    model: Path
    record: dict[str, Any] | None
    source: str
    top: int
    json: bool


def _add_options(predict: Parser) -> None:
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


def _options(args: argparse.Namespace) -> PredictRequest:
    """The images (each an existing file) and the model: ``--run``'s exported model and the record of its classes
    and preprocessing (``runs.exported_model``), or ``--model``, a file (its metadata is read with it).

    >>> from partition_fx.cli.parser import build_parser
    >>> _options(build_parser().parse_args(["predict", "--model", "no/such.onnx", "a.png"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: image a.png does not exist
    """
    for image in args.images:
        if not Path(image).is_file():
            raise PartitionError(f"image {image} {'is not a file' if Path(image).exists() else 'does not exist'}")
    if args.model is None:
        record, model = exported_model(args.run, "--run")
        return PredictRequest(tuple(args.images), model, record, f"--run {str(args.run)!r}", args.top, args.json)
    if not args.model.is_file():
        raise PartitionError(
            f"--model {str(args.model)!r} is not a file; pass the model.onnx that `partition-fx train` or `export` "
            "wrote, or a run directory with --run"
        )
    return PredictRequest(tuple(args.images), args.model, None, f"--model {str(args.model)!r}", args.top, args.json)


def _show(result: tuple[str, list[dict[str, Any]]], request: PredictRequest) -> None:
    """Which predictor answers and each image unlike the training images (a warning, never a change of the
    answer) on stderr; the predictions on stdout, one line per image or as JSON."""
    predictor, predictions = result
    print(f"partition-fx: predicting with {predictor}", file=sys.stderr)
    for line in unlike_lines(predictions):
        print(f"partition-fx: warning: {line}", file=sys.stderr)
    print(json.dumps(predictions, indent=2) if request.json else "\n".join(prediction_lines(predictions)))


def unlike_lines(predictions: list[dict[str, Any]]) -> list[str]:
    """A warning for each image unlike the training images: its prediction may be wrong, however confident.

    >>> unlike_lines([{"image": "a.png", "unlike_training_images": "its brightness 0.89 is outside 0.08..0.17"}])
    ['a.png looks unlike the training images (its brightness 0.89 is outside 0.08..0.17): its prediction may be wrong']
    """
    return [
        f"{p['image']} looks unlike the training images ({p['unlike_training_images']}): its prediction may be wrong"
        for p in predictions
        if p.get("unlike_training_images")
    ]


def prediction_lines(predictions: list[dict[str, Any]]) -> list[str]:
    """One line per image: its path, then each class with its probability, most probable first.

    >>> prediction_lines([{"image": "a.png", "top": [{"class": "cat", "index": 0, "probability": 0.91234}]}])
    ['a.png: cat 0.9123']
    """
    return [
        f"{p['image']}: " + ", ".join(f"{c['class']} {c['probability']:.4f}" for c in p["top"]) for p in predictions
    ]


COMMAND = Command(
    name="predict",
    summary="classify images by name with a model train or export wrote",
    description="Read each image as the model's training data were read (the preprocessing its run recorded) and "
    "print its most probable class by name with its probability: with a run's exported model (--run), or with an "
    "ONNX file alone (--model), whose metadata holds the class names and the preprocessing. Nothing is written.",
    order=5,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.predict:run_predict",
    show=_show,
    out_of_memory="predict on a machine with more memory",
)
