"""``partition-fx predict``: classify image files by name with a model that ``train`` or ``export`` wrote.

``--run DIR`` (a completed ``partition-fx train`` run, or an ``export`` directory) predicts with its plain
exported model: ``model.safetensors`` rebuilt into its class from the ``architecture`` its ``report.json`` or
``export.json`` records (``models.build_model``, then every tensor loaded strictly). That is the model whose
``test_accuracy`` the run reports, in both kinds of directory: an export's ``model.onnx`` is the test-time-averaged
predictor when it was written with ``--test-time-samples`` (pass it with ``--model`` to predict with that), and
rebuilding the module from the record checks that the record suffices. ``--model FILE.onnx`` needs the file alone:
its metadata holds the class names and the preprocessing, and onnxruntime runs it.

Each image is read as the model's training data were (``datasets.images.ImagePreprocessing``, the datasets' own
decoding) and gets its ``--top`` classes with their probabilities: the softmax of the logits, or the exponential of
the averaged model's log-probabilities. A folder named stands for its image files (``cli.commands.predict``). An
image that is missing or cannot be read fails alone: it gets its error, every other one (in its batch too) its
answer, and the command exits with status 2 once all are printed. Nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..datasets.images import ImagePreprocessing, InputStatistics, unreadable_image
from ..errors import PartitionError, first_line
from ..job.records import CHECKS_RECORD, MODEL_RECORD
from .commands.predict import PredictRequest

BATCH_SIZE = 64
"""Images decoded and classified at a time."""


def run_predict(request: PredictRequest) -> tuple[str, list[dict[str, Any]]]:
    """The ``predict`` command (its ``request``, checked: ``cli.commands.predict``): which predictor it used (the
    file, and whether it is the plain model or the test-time-averaged one), and per image (in order) its path, its
    ``top`` classes, most probable first, each ``{"class": name, "index": i, "probability": p}``, and
    ``unlike_training_images``: why the image is unlike every image the model trained on
    (``datasets.images.InputStatistics``), or None; an image that could not be read has its path and ``error``
    (what :func:`read_image` refused) instead, and the others are answered as if it were not there.

    >>> from partition_fx.cli.parser import build_parser
    >>> from partition_fx.cli.commands import commands
    >>> commands()["predict"].options(build_parser().parse_args(["predict", "--model", "no/such.onnx", "a.png"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --model 'no/such.onnx' is not a file; pass the model.onnx that ...
    """
    record, model_file, source = request.record, request.model, request.source
    session = None
    if record is None:
        session = onnx_session(model_file, source)
        record = onnx_record(session.get_modelmeta().custom_metadata_map, source)
    preprocessing = checked_record(record, source)
    statistics = record.get("input_statistics")
    statistics = InputStatistics.from_dict(statistics, source) if statistics is not None else None
    averaged = record["onnx_names"]["output"] == "log_probs"
    if session is not None:
        classify = onnx_classifier(session, record["onnx_names"], source)
        predictor = f"{model_file} in onnxruntime, " + (
            "the model averaged over transforms of its learned augmentation" if averaged else "the plain model"
        )
    else:
        classify = torch_classifier(record["architecture"], model_file, source)
        predictor = f"{model_file}, the plain exported model"
    classes = record["classes"]
    top = min(request.top, len(classes))
    predictions: list[dict[str, Any]] = []
    for start in range(0, len(request.images), BATCH_SIZE):
        batch: list[dict[str, Any]] = []
        inputs = []
        for path in request.images[start : start + BATCH_SIZE]:
            try:
                inputs.append(read_image(path, preprocessing))
                batch.append({"image": str(path)})
            except PartitionError as error:  # this image alone fails: the batch goes on without it
                batch.append({"image": str(path), "error": str(error)})
        answered = [p for p in batch if "error" not in p]
        if answered:
            x = torch.stack(inputs)
            best = classify(x).topk(top, dim=1)
            for p, image, values, indices in zip(answered, x, best.values.tolist(), best.indices.tolist()):
                p["top"] = [{"class": classes[i], "index": i, "probability": v} for v, i in zip(values, indices)]
                p["unlike_training_images"] = statistics.unlike(image) if statistics is not None else None
        predictions.extend(batch)
    return predictor, predictions


def read_image(path: str | Path, preprocessing: ImagePreprocessing) -> torch.Tensor:
    """The image file at ``path`` as one model input (C, H, W), decoded by ``preprocessing`` as the model's data
    were; a missing file, or one PIL cannot read, is refused naming it.

    >>> read_image("no/such.png", ImagePreprocessing("L", 1, 8, 8))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: image no/such.png does not exist
    """
    from PIL import Image

    try:
        with Image.open(path) as image:
            return preprocessing(image)
    except FileNotFoundError:
        raise PartitionError(f"image {path} does not exist") from None
    except OSError as error:  # includes PIL.UnidentifiedImageError
        raise unreadable_image(path, error) from None


def checked_record(record: dict[str, Any], source: str) -> ImagePreprocessing:
    """The preprocessing of a model ``record`` (``job.build.model_record``, from ``source``) whose class names fit
    its architecture; a record this version did not write is refused naming ``source``."""
    classes, architecture = record["classes"], record["architecture"]
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) or not classes:
        raise PartitionError(f"{source}: its classes are not a list of names: {str(classes)[:80]}")
    if not isinstance(architecture, dict) or architecture.get("num_classes") != len(classes):
        raise PartitionError(f"{source}: its architecture {architecture} does not have {len(classes)} classes")
    names = record["onnx_names"]
    if not isinstance(names, dict) or names.get("output") not in ("logits", "log_probs") or "input" not in names:
        raise PartitionError(f"{source}: its onnx_names {names} are not this version's")
    return ImagePreprocessing.from_dict(record["preprocessing"], source)


def torch_classifier(
    architecture: dict[str, Any], weights: Path, source: str
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Class probabilities (the softmax of the logits) from the plain model ``weights`` (``model.safetensors``)
    rebuilt into the class ``architecture`` names: ``models.build_model(model, num_classes, in_chans=...,
    img_size=...)``, then every tensor loaded strictly. A model of ``hf:DIR`` whose ``weights`` lie in a
    ``save_pretrained`` folder (an export of its run: ``config.json`` beside them, the tensors in ``transformers``'
    own layout) is that folder's, loaded by ``from_pretrained`` with every tensor (``models.hf_models``), so DIR
    need not be there any more."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    from ..hf_folders import HF_PREFIX
    from ..models import build_model
    from ..training.objective.likelihoods import model_logits

    try:
        name = architecture["model"]
        exported_folder = name.startswith(HF_PREFIX) and (weights.parent / "config.json").is_file()
        model = build_model(
            f"{HF_PREFIX}{weights.parent}" if exported_folder else name,
            architecture["num_classes"],
            in_chans=architecture["in_chans"],
            img_size=architecture["img_size"],
        )
        if not exported_folder:  # from_pretrained loaded the folder's every tensor
            load_model(model, str(weights))  # strict: every tensor, nothing else
    except (KeyError, TypeError, RuntimeError, OSError, SafetensorError) as e:
        raise PartitionError(
            f"{source}: {weights.name} does not rebuild as the architecture recorded ({architecture}): {first_line(e)}"
        ) from None
    model.eval()

    def classify(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(model_logits(model(x), "predict").float(), dim=1)

    return classify


def onnx_session(path: Path, source: str) -> Any:
    """An onnxruntime session of the file at ``path`` (on the CPU); a file that is not ONNX is refused."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own types for a file that is not ONNX
        raise PartitionError(f"{source}: onnxruntime cannot load it ({first_line(e)}); pass an ONNX file") from None


def onnx_classifier(session: Any, names: dict[str, str], source: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Class probabilities from an ONNX ``session`` whose input and output ``names`` are the record's: the softmax
    of its ``logits``, or the exponential of its ``log_probs``."""
    if [i.name for i in session.get_inputs()] != [names["input"]] or names["output"] not in {
        o.name for o in session.get_outputs()
    }:
        raise PartitionError(f"{source}: its graph's inputs and outputs are not the {names} its metadata records")

    def classify(x: torch.Tensor) -> torch.Tensor:
        (scores,) = session.run([names["output"]], {names["input"]: x.numpy()})
        scores = torch.from_numpy(np.asarray(scores, dtype=np.float32))
        return scores.exp() if names["output"] == "log_probs" else torch.softmax(scores, dim=1)

    return classify


def onnx_record(metadata: dict[str, str], source: str) -> dict[str, Any]:
    """The model record (``classes``, ``preprocessing``, ...) of an ONNX file's ``metadata_props``, each entry JSON;
    a file without them (an earlier version's, or another tool's) is refused naming ``source``.

    >>> onnx_record({"classes": '["a"]'}, "--model 'm.onnx'")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --model 'm.onnx' has no preprocessing, architecture, onnx_names in its ...
    """
    lacking = [key for key in MODEL_RECORD if key not in metadata]
    if lacking:
        raise PartitionError(
            f"{source} has no {', '.join(lacking)} in its metadata (written by an earlier version of partition-fx, "
            "or by another tool), so its classes and preprocessing are unknown; export the run again "
            "(`partition-fx export --run RUN`) and pass its model.onnx"
        )
    try:
        return {key: json.loads(metadata[key]) for key in (*MODEL_RECORD, *CHECKS_RECORD) if key in metadata}
    except json.JSONDecodeError as e:
        raise PartitionError(f"{source}: its metadata is not this version's JSON ({e})") from None
