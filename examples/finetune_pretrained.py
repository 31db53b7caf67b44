"""Fine-tune a "pretrained" timm model with learned augmentation, then export it to ONNX.

Pretrained weights come from a local file (no downloads): pass ``--weights FILE`` for a real timm
checkpoint of ``--model`` (an ImageNet one: its classifier is re-initialised for the 10 digits), or let the
script make one by training the model briefly on upright digits.
The model is converted with ``default="init"``, so the pretrained weights are every partition's default
(subnetwork 0 *is* the pretrained model), fine-tuned on ``rotdigits`` while learning the augmentation
ranges, and its final subnetwork is exported to ONNX and checked in onnxruntime.

    python examples/finetune_pretrained.py                 # about 3 minutes on 2 CPU cores
    python examples/finetune_pretrained.py --quick         # a smoke run
    python examples/finetune_pretrained.py --weights resnet10t.safetensors
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file

from partition_fx import export_onnx, export_subnetwork, partitionify
from partition_fx.datasets import load_dataset
from partition_fx.models import load_checkpoint_into
from partition_fx.training import fit
from partition_fx.transforms import AffineAugmentation


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model.eval()(x).argmax(1) == y).float().mean())


def make_pretrained_weights(model_name: str, path: Path, steps: int, size: int) -> Path:
    """Stand-in for a downloaded checkpoint: plain training on upright digits, saved as safetensors."""
    x, y = load_dataset("digits", size=size, channels=3).train.tensors
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(len(x), (64,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet10t")
    parser.add_argument("--weights", type=Path, default=None, help="a local timm checkpoint of --model")
    parser.add_argument("--out", type=Path, default=Path("runs/finetune"))
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few steps, small images)")
    args = parser.parse_args(argv)
    size, steps = (16, 4) if args.quick else (28, 200)
    weights = args.weights or make_pretrained_weights(args.model, args.out / "pretrained.safetensors", steps, size)

    model = timm.create_model(args.model, num_classes=10)
    load_checkpoint_into(model, weights)  # an ImageNet checkpoint's classifier is re-initialised (one warning line)
    data = load_dataset("rotdigits", size=size, channels=3)
    x_test, y_test = data.test.tensors
    before = accuracy(model, x_test, y_test)

    pmodel = partitionify(model, num_partitions=3, proportions=(0.8, 0.1, 0.1), default="init")
    augmentation = AffineAugmentation(num_samples=4)
    result = fit(
        pmodel,
        data.train,
        hyper=augmentation,
        steps=steps,
        batch_size=64,
        optimizer=partial(torch.optim.Adam, lr=5e-4),
        hyper_optimizer=partial(torch.optim.Adam, lr=0.05),
    )
    after = accuracy(export_subnetwork(pmodel), x_test, y_test)
    onnx_path = export_onnx(pmodel, args.out / "finetuned.onnx", (x_test[:4],))  # checked in onnxruntime
    print(f"{args.model} from {weights}: rotdigits test accuracy {before:.3f} before, {after:.3f} after fine-tuning")
    print(f"learned rotation range {result.hyperparameters['rotation']:.2f} rad; LML {result.lml:.1f} nats")
    print(f"wrote {onnx_path} (verified in onnxruntime)")
    return {"before": before, "after": after, "rotation": result.hyperparameters["rotation"], "onnx": str(onnx_path)}


if __name__ == "__main__":
    main()
