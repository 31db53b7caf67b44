"""Learn rotation invariance from the data alone: ``partition-fx train``'s default, in code.

timm's ResNet-10-T learns the ranges of an affine augmentation (translation, rotation, scale, shear) by
the partitioned marginal likelihood, with no validation set. On ``rotdigits`` (every digit rotated by a
random angle) the learned rotation range grows toward pi; on upright ``digits`` it stays small. A plain
run without augmentation on ``rotdigits`` shows what the learned augmentation buys.

    python examples/rotation_invariance.py          # three runs, about 4 minutes each on 2 CPU cores
    python examples/rotation_invariance.py --quick  # a smoke run
"""

from __future__ import annotations

import argparse
from functools import partial

import timm
import torch

from partition_fx import export_subnetwork, partitionify
from partition_fx.datasets import load_dataset
from partition_fx.training import fit
from partition_fx.transforms import AffineAugmentation


def run(dataset: str, steps: int, augment: bool, seed: int = 0, image_size: int = 28) -> dict:
    data = load_dataset(dataset, size=image_size)
    torch.manual_seed(seed)
    model = timm.create_model("resnet10t", num_classes=10, in_chans=1)
    pmodel = partitionify(model, num_partitions=3, proportions=(0.8, 0.1, 0.1), seed=seed)
    augmentation = AffineAugmentation(num_samples=4) if augment else None
    # the command's hyperparameter step (every chunk, 6 samples of 16 examples each, every 2nd iteration)
    hyper_step = {"hyper_chunks": "all", "hyper_samples": 6, "hyper_batch_size": 16, "hyper_every": 2}
    result = fit(
        pmodel,
        data.train,
        hyper=augmentation,
        steps=steps,
        finetune_steps=steps // 4,  # the last quarter fine-tunes the final model with the ranges frozen
        batch_size=64,
        optimizer=partial(torch.optim.Adam, lr=1e-3),
        hyper_optimizer=partial(torch.optim.Adam, lr=0.05),
        scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps, eta_min=1e-5),
        seed=seed,
        **(hyper_step if augment else {}),
    )
    final = export_subnetwork(pmodel).eval()  # a plain timm ResNet
    x, y = data.test.tensors
    with torch.no_grad():
        accuracy = float((final(x).argmax(1) == y).float().mean())
    rotation = result.hyperparameters.get("rotation", 0.0)
    trajectory = [round(h["hyperparameters"].get("rotation", 0.0), 2) for h in result.history]
    print(f"{dataset:>9} augment={augment!s:<5}  test accuracy {accuracy:.3f}  LML {result.lml:8.1f}  "
          f"rotation range {rotation:.2f} rad  (trajectory {trajectory})")  # fmt: skip
    return {"dataset": dataset, "augment": augment, "test_accuracy": accuracy, "lml": result.lml, "rotation": rotation}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few steps, small images)")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.quick else 400)
    size = 16 if args.quick else 28
    return [
        run("rotdigits", steps, augment=True, image_size=size),
        run("rotdigits", steps, augment=False, image_size=size),
        run("digits", steps, augment=True, image_size=size),
    ]


if __name__ == "__main__":
    main()
