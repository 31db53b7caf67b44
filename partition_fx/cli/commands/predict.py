"""``partition-fx predict``, declared: classify image files (or the images of a folder) by name with a model
``train`` or ``export`` wrote; nothing is written. It runs as ``cli.predict.run_predict``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import PartitionError
from ...job.records import exported_model
from ..argparsing import Parser, int_at_least, path, path_text
from . import Command


@dataclass(frozen=True)
class PredictRequest:
    """What ``predict`` was asked, checked: the ``images`` (the files named and, for a folder named, its image
    files: :func:`image_files`; each is read when predicting, so a missing or unreadable one fails alone), the model
    file (``model``: a run's ``model.safetensors`` with its ``record``, or an ONNX file, whose metadata holds it:
    ``record`` None), the option that named it (``source``), the ``top`` classes to print and whether as ``json``;
    ``skipped``: a line per folder that held files other than images, saying how many were left out."""

    images: tuple[str, ...]
    model: Path
    record: dict[str, Any] | None
    source: str
    top: int
    json: bool
    skipped: tuple[str, ...] = ()


def image_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """The image files of ``folder`` and its subfolders (class folders, say), sorted by path, as training from a
    folder finds them: by suffix, :func:`datasets.folder.image_extensions` (imported now, with torch: only a
    folder given needs it), hidden files left out; and the other files, which are skipped.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for name in ("cats/b.png", "cats/a.JPG", "dogs/c.webp", "notes.txt", ".hidden.png"):
    ...         (Path(tmp) / name).parent.mkdir(exist_ok=True)
    ...         _ = (Path(tmp) / name).write_bytes(b"")
    ...     images, others = image_files(Path(tmp))
    ...     [str(p.relative_to(tmp)) for p in images], [p.name for p in others]
    (['cats/a.JPG', 'cats/b.png', 'dogs/c.webp'], ['notes.txt'])
    """
    from ...datasets.folder import image_extensions

    suffixes = image_extensions()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [p for p in files if p.suffix.lower() in suffixes], [p for p in files if p.suffix.lower() not in suffixes]


def _expanded(images: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The images to predict, in order: each path named, a folder replaced by its image files; and a line per
    folder holding other files, saying how many it skipped and their suffixes. A folder without an image is
    refused naming it and the suffixes looked for; a path that does not exist is kept (it fails alone)."""
    found: list[str] = []
    skipped = []
    for image in images:
        if not Path(image).is_dir():
            found.append(image)
            continue
        files, others = image_files(Path(image))
        from ...datasets.folder import describe_skipped, image_extensions

        if not files:
            held = f"; it holds {describe_skipped(others)}" if others else ""
            raise PartitionError(
                f"folder {image} has no images in it or its subfolders (looked for {', '.join(image_extensions())})"
                f"{held}; pass a folder that holds images, or the image files"
            )
        found.extend(map(str, files))
        if others:
            skipped.append(f"skipped {describe_skipped(others)} in {image}")
    return tuple(found), tuple(skipped)


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
    predict.add_argument(
        "images",
        nargs="+",
        type=path_text,
        metavar="IMAGE",
        help="image files PIL can read, or folders: their image files, in subfolders too, sorted by path (the "
        "suffixes training from a folder reads: .jpg, .png, .bmp, .tif, .webp, ...; other files are skipped and "
        "counted on stderr). An image that cannot be read gets an error line, the others their answers, and the "
        "exit status is 2",
    )
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
    """The images (a folder replaced by its image files: :func:`image_files`) and the model: ``--run``'s exported
    model and the record of its classes and preprocessing (``runs.exported_model``), or ``--model``, a file (its
    metadata is read with it). A missing image is not refused here: it fails alone, the others answered.

    >>> from partition_fx.cli.parser import build_parser
    >>> _options(build_parser().parse_args(["predict", "--model", "no/such.onnx", "a.png"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --model 'no/such.onnx' is not a file; pass the model.onnx that ...
    """
    images, skipped = _expanded(args.images)
    if args.model is None:
        record, model = exported_model(args.run, "--run")
        return PredictRequest(images, model, record, f"--run {str(args.run)!r}", args.top, args.json, skipped)
    if not args.model.is_file():
        raise PartitionError(
            f"--model {str(args.model)!r} is not a file; pass the model.onnx that `partition-fx train` or `export` "
            "wrote, or a run directory with --run"
        )
    return PredictRequest(images, args.model, None, f"--model {str(args.model)!r}", args.top, args.json, skipped)


def _show(result: tuple[str, list[dict[str, Any]]], request: PredictRequest) -> int:
    """Which predictor answers, what a folder skipped, and per image in order a warning if it is unlike the
    training images (never a change of the answer) or an error line if it could not be read, on stderr; the
    predictions on stdout, one line per image answered, or as JSON (a failed image with its ``error``). The exit
    status: 2 when an image failed (the others answered, as grep and ls do), else 0."""
    predictor, predictions = result
    print(f"partition-fx: predicting with {predictor}", file=sys.stderr)
    for line in request.skipped:
        print(f"partition-fx: {line}", file=sys.stderr)
    for p in predictions:
        if "error" in p:
            print(f"partition-fx: error: {p['error']}", file=sys.stderr)
        else:
            for line in unlike_lines([p]):
                print(f"partition-fx: warning: {line}", file=sys.stderr)
    lines = prediction_lines(predictions)
    if request.json:
        print(json.dumps(predictions, indent=2))
    elif lines:
        print("\n".join(lines))
    return 2 if any("error" in p for p in predictions) else 0


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
    """One line per image answered (one that failed, with an ``error``, has none): its path, then each class with
    its probability, most probable first.

    >>> prediction_lines([{"image": "a.png", "top": [{"class": "cat", "index": 0, "probability": 0.91234}]},
    ...                   {"image": "b.png", "error": "cannot read image b.png: ..."}])
    ['a.png: cat 0.9123']
    """
    return [
        f"{p['image']}: " + ", ".join(f"{c['class']} {c['probability']:.4f}" for c in p["top"])
        for p in predictions
        if "top" in p
    ]


COMMAND = Command(
    name="predict",
    summary="classify images by name with a model train or export wrote",
    description="Read each image (a folder: its image files) as the model's training data were read (the "
    "preprocessing its run recorded) and print its most probable class by name with its probability: with a run's "
    "exported model (--run), or with an ONNX file alone (--model), whose metadata holds the class names and the "
    "preprocessing. An image that cannot be read gets an error line on stderr and the others are answered; the "
    "exit status is then 2. Nothing is written.",
    order=5,
    add_options=_add_options,
    options=_options,
    run="partition_fx.cli.predict:run_predict",
    show=_show,
    out_of_memory="predict on a machine with more memory",
)
