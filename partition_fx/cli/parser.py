"""The whole ``partition-fx`` argument tree: every command's options and defaults, in one place, and the
``type=`` parsers that turn option text into values (refusals are one line, like every other refusal)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

from .._validation import MAX_SEED

DESCRIPTION = "The ``partition-fx`` command."
TRAIN_DEFAULT_STEPS = 400
TRAIN_DEFAULT_LR = 1e-3
TRAIN_DEFAULT_HYPER_LR = 0.05
DEVICES = ("auto", "cpu", "cuda")
"""``--device`` of ``train``: ``auto`` is CUDA when it is available here, else the CPU."""


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


def build_parser() -> argparse.ArgumentParser:
    """The ``partition-fx`` parser with its four commands: ``train``, ``convert``, ``describe`` and ``export``.

    >>> args = build_parser().parse_args(["describe", "--model", "fixup_resnet8"])
    >>> args.command, args.partitions, args.proportions
    ('describe', 3, (0.8, 0.1, 0.1))
    """
    parser = _Parser(prog="partition-fx", description=DESCRIPTION)
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
    train.add_argument("--device", default="auto", choices=DEVICES, help="auto: CUDA when available, else CPU")
    train.add_argument("--out", type=_path, default=Path("runs/train"))
    train.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument(
        "--resume", type=_path, default=None, metavar="RUN", help="continue an interrupted run (its --out directory)"
    )


def parse_train(argv: list[str]) -> argparse.Namespace:
    """``partition-fx train`` arguments (``argv`` without the word ``train``) with the command's defaults.

    >>> args = parse_train(["--steps", "4"])
    >>> args.steps, args.model, args.device
    (4, 'resnet10t', 'auto')
    """
    return build_parser().parse_args(["train", *argv])


def train_defaults() -> dict[str, Any]:
    """Every ``partition-fx train`` option's default, by destination name (``batch_size``, ...).

    >>> train_defaults()["lr"] == TRAIN_DEFAULT_LR
    True
    """
    return vars(parse_train([]))
