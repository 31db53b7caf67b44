"""Train a Hugging Face ViT from a local ``save_pretrained`` folder with learned augmentation on the bundled rotated
digits, on the command line, and export it back to a folder that ``from_pretrained`` loads.

The folder comes from ``--folder DIR`` (a ViT image classifier that ``save_pretrained`` wrote: a downloaded one,
say) or is made here from a small config with random weights (nothing is downloaded). ``partition-fx train --model
hf:DIR`` gives it a new head for the 10 digits and sums its patch projection over the RGB channels for greyscale
(one warning line says so) and learns the augmentation ranges; ``partition-fx export`` writes ``config.json`` and
``model.safetensors``, which ``AutoModelForImageClassification.from_pretrained`` loads, and its predictions on the
test digits give the run's reported test accuracy.

    python examples/hf_vit_folder.py              # the command's default budget (400 steps)
    python examples/hf_vit_folder.py --quick      # a smoke run
    python examples/hf_vit_folder.py --folder my-vit --out runs/my-vit

Needs the ``hf`` extra: ``pip install -e ".[hf]"``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from partition_fx.cli import main as partition_fx
from partition_fx.datasets import load_dataset

IMAGE_SIZE = 32
"""The digits are resized to the ViT's image size (its config fixes one)."""


def make_vit_folder(folder: Path, quick: bool) -> Path:
    """Stand-in for a downloaded ViT: a small one with random weights, written by ``save_pretrained``."""
    import transformers

    width, layers = (16, 1) if quick else (64, 4)
    config = transformers.ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=4,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
        num_labels=1000,  # as an ImageNet checkpoint: the run gives it a new head for the 10 digits
    )
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=None, help="a ViT's save_pretrained folder (else one is made)")
    parser.add_argument("--out", type=Path, default=Path("runs/hf_vit"))
    parser.add_argument("--quick", action="store_true", help="a smoke run (a tiny ViT, a few steps)")
    args = parser.parse_args(argv)
    import transformers

    folder = args.folder or make_vit_folder(args.out / "vit", args.quick)
    run, export = args.out / "run", args.out / "run" / "export"
    steps = ["--steps", "4", "--batch-size", "8", "--samples", "2", "--eval-every", "2"] if args.quick else []
    train = ["train", "--model", f"hf:{folder}", "--data", "rotdigits", "--image-size", str(IMAGE_SIZE), *steps]
    if partition_fx([*train, "--quiet", "--out", str(run), "--overwrite"]) != 0:
        raise SystemExit(2)
    if partition_fx(["export", "--run", str(run), "--overwrite"]) != 0:
        raise SystemExit(2)

    model = transformers.AutoModelForImageClassification.from_pretrained(export).eval()
    x, y = load_dataset("rotdigits", size=IMAGE_SIZE, split="test").test.tensors
    with torch.no_grad():
        accuracy = float((model(x).logits.argmax(dim=1) == y).float().mean())
    reported = json.loads((run / "report.json").read_text())["test_accuracy"]
    print(f"from_pretrained({export}): test accuracy {accuracy:.4f} (the run reported {reported:.4f})")
    assert abs(accuracy - reported) < 0.5 / len(y), "the exported folder should predict as the run reported"
    return {"folder": str(export), "test_accuracy": accuracy, "reported": reported}


if __name__ == "__main__":
    main()
