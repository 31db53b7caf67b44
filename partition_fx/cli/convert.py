"""``partition-fx convert`` and ``partition-fx describe``: a model's conversion, verified and exported, or
only described.

``convert`` (defaults: timm's resnet10t, C=3, proportions 0.8/0.1/0.1) builds a timm model (optionally with
weights from a local file), converts it, checks every subnetwork against the original on scikit-learn's
bundled digits, and writes to ``--out``: the exported final model (safetensors), ``model.onnx`` verified in
onnxruntime, ``describe.txt`` and ``report.json``. The output directory is assembled aside and moved into
place at the end, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_model

from .. import __version__
from .._io import write_json
from .._validation import check_fits_in_memory
from ..datasets import normalized_digits
from ..export import export_onnx, export_subnetwork
from ..fx.partitioned_model import PartitionedModel
from ..job.build import partitionify_with
from ..models import build_model
from ..testing import max_relative_difference
from .commands.convert import ConversionOptions, ConvertOptions
from .runs import check_out, write_run

VERIFY_IMAGES = 16  # digits each subnetwork is compared with the original on


def run_describe(conversion: ConversionOptions) -> str:
    """The ``describe`` command: how the model would be partitioned.

    >>> from partition_fx.cli.parser import build_parser
    >>> args = build_parser().parse_args(["describe", "--model", "fixup_resnet8", "--partitions", "2",
    ...                                   "--proportions", "0.5,0.5"])
    >>> run_describe(ConversionOptions.parsed(args)).splitlines()[0].startswith("PartitionedModel of FixupResNet: C=2")
    True
    """
    model = build_model(conversion.model, conversion.num_classes, conversion.checkpoint)
    return partitionify_with(model, conversion, conversion.seed).describe()


def run_convert(options: ConvertOptions) -> dict[str, Any]:
    """The ``convert`` command; returns the report it also writes to ``--out/report.json``.

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> from partition_fx.cli.commands import commands
    >>> out = Path(tempfile.mkdtemp()) / "converted"
    >>> args = build_parser().parse_args(["convert", "--model", "fixup_resnet8", "--out", str(out)])
    >>> report = run_convert(commands()["convert"].options(args))
    >>> report["num_partitions"], max(report["max_relative_difference_to_original"].values())
    (3, 0.0)
    """
    conversion = options.conversion
    inputs = {"--checkpoint": conversion.checkpoint}
    check_out(options.out, options.overwrite, inputs)
    model, pmodel, seconds = _converted(options)
    fill = lambda staging: _convert(options, model, pmodel, seconds, staging)  # noqa: E731
    return write_run(options.out, options.overwrite, inputs, fill)


def _converted(options: ConvertOptions) -> tuple[torch.nn.Module, PartitionedModel, float]:
    """The model, its conversion and the seconds that took: everything that can fail on bad input, before
    ``--out`` is touched."""
    conversion = options.conversion
    classes, size = conversion.num_classes, options.input_size
    check_fits_in_memory(f"--num-classes {classes}", "the classifier's biases", classes * 4)
    check_fits_in_memory(f"--input-size {size}", f"{VERIFY_IMAGES} images to verify", VERIFY_IMAGES * size**2 * 4)
    torch.manual_seed(conversion.seed)
    model = build_model(conversion.model, classes, conversion.checkpoint).eval()
    start = time.perf_counter()
    pmodel = partitionify_with(model, conversion, conversion.seed).eval()
    return model, pmodel, time.perf_counter() - start


def _convert(
    options: ConvertOptions, model: torch.nn.Module, pmodel: PartitionedModel, seconds: float, out: Path
) -> dict[str, Any]:
    conversion = options.conversion
    channels = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0]
    x, _ = normalized_digits(VERIFY_IMAGES, options.input_size, channels)
    with torch.no_grad():
        reference = model(x)
        subnetworks = range(conversion.partitions + 1)
        diffs = {k: max_relative_difference(pmodel(x, subnetwork=k), reference) for k in subnetworks}
    exported = export_subnetwork(pmodel)
    save_model(exported, str(out / "model.safetensors"))
    onnx_path = export_onnx(pmodel, out / "model.onnx", (x[:4],))
    (out / "describe.txt").write_text(pmodel.describe() + "\n")
    sizes = [sum(p.numel() for p in pmodel.partition_parameters(k)) for k in range(1, conversion.partitions + 1)]
    report = {
        "command": "convert",
        "version": __version__,
        "model": conversion.model,
        "checkpoint": conversion.checkpoint,
        "num_partitions": conversion.partitions,
        "proportions": list(pmodel.proportions),
        "scheme": conversion.scheme,
        "default": conversion.default,
        "assignments": conversion.assignments,
        "seed": conversion.seed,
        "original_parameters": sum(p.numel() for p in model.parameters()),
        "trainable_entries_per_partition": sizes,
        "conversion_seconds": round(seconds, 3),
        "max_relative_difference_to_original": {str(k): v for k, v in diffs.items()},
        "files": {"model": "model.safetensors", "onnx": onnx_path.name, "describe": "describe.txt"},
        "torch": torch.__version__,
    }
    write_json(out / "report.json", report)  # in the staged directory that replaces --out whole
    return report
