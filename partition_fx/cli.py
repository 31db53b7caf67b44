"""The ``partition-fx`` command.

``partition-fx train`` (the main job; see ``train_command``) trains a model with learned hyperparameters.
With no other arguments it learns affine augmentation for timm's ResNet-10-T on ``rotdigits`` (scikit-learn's
digits, each rotated by a fixed random angle) in a few minutes on 2 CPU cores.

``partition-fx export --run DIR`` exports a trained run's checkpoint to safetensors and ONNX.

``partition-fx convert`` (defaults: FixUp ResNet-14, C=3, proportions 0.8/0.1/0.1) builds a timm model
(optionally with weights from a local file), converts it, checks every subnetwork against the original
on scikit-learn's bundled digits, and writes to ``--out``: the exported final model (safetensors),
``model.onnx`` verified in onnxruntime, ``describe.txt`` and ``report.json``. The output directory is
assembled aside and moved into place at the end, so a failed run leaves nothing half-written.

``partition-fx describe --model NAME`` prints how a model would be partitioned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import torch

from ._validation import MAX_SEED
from .errors import PartitionError, first_line
from .train_command import (
    check_fits_in_memory,
    check_out,
    is_out_of_memory,
    partitionify_from_args,
    run_export,
    run_train,
)

TRAIN_DEFAULT_STEPS = 400
TRAIN_DEFAULT_LR = 1e-3
TRAIN_DEFAULT_HYPER_LR = 0.05
OUT_OF_MEMORY_HINTS = {
    "train": "lower --image-size, --batch-size or --samples, or choose a smaller --model",
    "convert": "lower --input-size or --num-classes, or choose a smaller --model",
    "describe": "lower --num-classes or choose a smaller --model",
    "export": "export on a machine with more memory",
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line, like every other refusal of the command."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        for arg in sys.argv[1:] if args is None else args:
            option, equals, value = arg.partition("=")
            if arg.startswith("-") and equals and value == "--":  # argparse would drop it and store []
                self.error(f"argument {option}: expected one argument, not '--'")
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):  # argparse reads "-1e-3" or "-0.5,1.5" as an option
            message += " (for a value that starts with '-', write --option=VALUE)"
        self.exit(2, f"partition-fx: error: {message}; see `{self.prog} --help`\n")


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seed(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be at most 2**63-1 = {MAX_SEED}, got {value}")
    return value


def _path(text: str) -> Path:
    if not text:  # Path("") is the current directory, which --overwrite would delete
        raise argparse.ArgumentTypeError("must not be empty (write . for the current directory)")
    return Path(text)


def _proportions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"proportions must be comma-separated numbers, got {text!r}") from None


def _build_model(name: str, num_classes: int, checkpoint: str | None) -> torch.nn.Module:
    from .train_command import build_model

    return build_model(name, num_classes, checkpoint)


def digits_images(count: int, size: int, channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` of scikit-learn's 8x8 digits, resized to ``size`` and repeated to ``channels``."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images[:count], dtype=torch.float32).unsqueeze(1) / 16.0
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    return x.expand(-1, channels, -1, -1).contiguous(), torch.tensor(data.target[:count])


def _converted(args: argparse.Namespace) -> tuple[torch.nn.Module, Any, float]:
    """The model, its conversion and the seconds that took: everything that can fail on bad input, before
    ``--out`` is touched."""
    check_fits_in_memory(f"--num-classes {args.num_classes}", "the classifier's biases", args.num_classes * 4)
    check_fits_in_memory(f"--input-size {args.input_size}", "16 images to verify", 16 * args.input_size**2 * 4)
    torch.manual_seed(args.seed)
    model = _build_model(args.model, args.num_classes, args.checkpoint).eval()
    start = time.perf_counter()
    pmodel = partitionify_from_args(model, args).eval()
    return model, pmodel, time.perf_counter() - start


def _convert(
    args: argparse.Namespace, model: torch.nn.Module, pmodel: Any, seconds: float, out: Path
) -> dict[str, Any]:
    from safetensors.torch import save_model

    from .export import export_onnx, export_subnetwork
    from .testing import max_relative_difference

    channels = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0]
    x, _ = digits_images(16, args.input_size, channels)
    with torch.no_grad():
        reference = model(x)
        diffs = {k: max_relative_difference(pmodel(x, subnetwork=k), reference) for k in range(args.partitions + 1)}
    exported = export_subnetwork(pmodel)
    save_model(exported, str(out / "model.safetensors"))
    onnx_path = export_onnx(pmodel, out / "model.onnx", (x[:4],))
    (out / "describe.txt").write_text(pmodel.describe() + "\n")
    sizes = [sum(p.numel() for p in pmodel.partition_parameters(k)) for k in range(1, args.partitions + 1)]
    return {
        "model": args.model,
        "checkpoint": args.checkpoint,
        "num_partitions": args.partitions,
        "proportions": list(pmodel.proportions),
        "scheme": args.scheme,
        "default": args.default,
        "assignments": args.assignments,
        "seed": args.seed,
        "original_parameters": sum(p.numel() for p in model.parameters()),
        "trainable_entries_per_partition": sizes,
        "conversion_seconds": round(seconds, 3),
        "max_relative_difference_to_original": {str(k): v for k, v in diffs.items()},
        "files": {"model": "model.safetensors", "onnx": onnx_path.name, "describe": "describe.txt"},
        "torch": torch.__version__,
    }


def _write_atomically(out: Path, fill: Any) -> dict[str, Any]:
    """``fill(staging)`` in a directory beside ``out`` that then replaces it (``check_out`` first)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise PartitionError(f"--out {str(out)!r} cannot be created: {e.strerror or e}") from None
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        report = fill(staging)
        (staging / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="partition-fx", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default="fixup_resnet14", help="timm model name (default: %(default)s)")
    common.add_argument("--checkpoint", default=None, help="local weights file (safetensors or torch) to load")
    common.add_argument("--num-classes", type=_int_at_least(1), default=10)
    common.add_argument("--partitions", type=int, default=3)
    common.add_argument("--proportions", type=_proportions, default=(0.8, 0.1, 0.1), help="e.g. 0.8,0.1,0.1")
    common.add_argument("--scheme", default="random", choices=["random", "node"])
    common.add_argument("--default", default="init", choices=["init", "zero", "seed"])
    common.add_argument(
        "--assignments",
        default="stored",
        choices=["stored", "regenerated"],
        help="store each tensor's partition layout index or regenerate it from the seed (default: %(default)s)",
    )
    common.add_argument("--seed", type=_seed, default=0)
    _add_train_parser(sub)
    convert = sub.add_parser("convert", parents=[common], help="convert, verify and export a model")
    convert.add_argument(
        "--input-size", type=_int_at_least(1), default=32, help="image size of the digits used to verify"
    )
    convert.add_argument("--out", type=_path, default=Path("runs/convert"))
    convert.add_argument("--overwrite", action="store_true")
    sub.add_parser("describe", parents=[common], help="print how a model is partitioned")
    export = sub.add_parser("export", help="export a trained run (partition-fx train --out DIR) to safetensors/ONNX")
    export.add_argument("--run", type=_path, required=True, help="the --out directory of a training run")
    export.add_argument("--which", choices=["last", "best"], default="last", help="checkpoint (default: last)")
    export.add_argument("--subnetwork", type=int, default=None, help="0..C (default: C, the final model)")
    export.add_argument("--out", type=_path, default=None, help="default: RUN/export")
    export.add_argument("--overwrite", action="store_true")
    return parser


def _add_train_parser(sub: Any) -> None:
    train = sub.add_parser(
        "train",
        help="train with learned hyperparameters (the main job)",
        description="Convert a timm model, train it with hyperparameters learned by the partitioned marginal "
        "likelihood, and export it. Defaults: timm's resnet10t on rotdigits with learned affine augmentation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    train.add_argument("--model", default="resnet10t", help="timm model name (shipped FixUp/WRN included)")
    train.add_argument("--checkpoint", default=None, help="local weights file to start from (e.g. pretrained)")
    train.add_argument("--data", default="rotdigits", help="rotdigits, digits, or an image folder path")
    train.add_argument("--image-size", type=int, default=28, help="images are resized to this (square)")
    train.add_argument("--channels", type=int, default=None, help="image channels (default: the data's own)")
    train.add_argument("--augment", choices=["affine", "none"], default="affine", help="learned augmentation")
    train.add_argument("--samples", type=int, default=4, help="augmentation samples per example")
    train.add_argument("--partitions", type=int, default=3)
    train.add_argument("--proportions", type=_proportions, default=(0.8, 0.1, 0.1), help="e.g. 0.8,0.1,0.1")
    train.add_argument("--scheme", default="random", choices=["random", "node"])
    train.add_argument(
        "--default", default="init", choices=["init", "zero", "seed"], help="untrained partitions' values"
    )
    train.add_argument("--assignments", default="stored", choices=["stored", "regenerated"], help="layout index")
    train.add_argument("--steps", type=int, default=TRAIN_DEFAULT_STEPS, help="iterations")
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--lr", type=float, default=TRAIN_DEFAULT_LR, help="Adam, cosine-annealed to lr/100")
    train.add_argument("--hyper-lr", type=float, default=TRAIN_DEFAULT_HYPER_LR, help="Adam on hyperparameters")
    train.add_argument("--weight-decay", type=float, default=0.0, help="scaled per partition by N/|D_1:k|")
    train.add_argument("--hyper-every", type=int, default=1, help="a hyperparameter step every N iterations")
    train.add_argument("--warmup-steps", type=int, default=0, help="iterations before the first hyper step")
    train.add_argument("--eval-every", type=int, default=None, help="LML evaluation interval (default steps/10)")
    train.add_argument("--fused", action="store_true", help="parameter and hyper step in one forward/backward")
    train.add_argument("--every-partition", action="store_true", help="each example trains its own partition")
    train.add_argument("--seed", type=_seed, default=0)
    train.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    train.add_argument("--out", type=_path, default=Path("runs/train"))
    train.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument(
        "--resume", type=_path, default=None, metavar="RUN", help="continue an interrupted run (its --out directory)"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "describe":
            model = _build_model(args.model, args.num_classes, args.checkpoint)
            print(partitionify_from_args(model, args).describe())
            return 0
        if args.command == "train":
            report = run_train(args)
            return _print_train(report, args.resume if args.resume is not None else args.out)
        if args.command == "export":
            summary = run_export(args)
            print(
                f"exported subnetwork {summary['subnetwork']} of {summary['run']} (step {summary['checkpoint_step']}): "
                f"test accuracy {summary['test_accuracy']:.4f}; wrote model.safetensors, model.onnx, export.json"
            )
            return 0
        check_out(args.out, args.overwrite, {"--checkpoint": args.checkpoint})
        converted = _converted(args)
        report = _write_atomically(args.out, lambda staging: _convert(args, *converted, staging))
    except KeyboardInterrupt:
        print("partition-fx: interrupted; the last checkpoint and report.json are kept", file=sys.stderr)
        return 130
    except (PartitionError, NotImplementedError) as e:
        print(f"partition-fx: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        print(
            f"partition-fx: error: out of memory ({first_line(e)}); {OUT_OF_MEMORY_HINTS[args.command]}",
            file=sys.stderr,
        )
        return 2
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
    print(f"wrote {args.out}/: model.safetensors, model.onnx (checked in onnxruntime), describe.txt, report.json")
    return 0


def _print_train(report: dict[str, Any], out: Path) -> int:
    hyper = report["hyperparameters"]
    learned = ", ".join(f"{k}={v:.3f}" for k, v in hyper.items() if isinstance(v, float)) or "none"
    print(
        f"trained {report['config']['model']} on {report['data']['name']} for {report['steps']} iterations in "
        f"{report['seconds']:.0f}s: test accuracy {report['test_accuracy']:.4f}, LML {report['lml']:.1f} nats "
        f"({report['lml_per_example']:.3f}/example)"
    )
    print(f"learned hyperparameters (ranges; rotation in radians): {learned}")
    print(f"wrote {out}/: report.json, lml.png, hyperparameters.png, model.safetensors, model.onnx, checkpoint/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
