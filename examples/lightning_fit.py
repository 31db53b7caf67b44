"""Partitioned training under a stock ``lightning.Trainer``: your model, your dataset, Lightning's loggers and
checkpoints.

``PartitionedLightningModule`` learns an affine augmentation's ranges on ``rotdigits`` (digits rotated by random
angles) by the partitioned marginal likelihood, with no validation set. Lightning's ``CSVLogger`` records the LML
and every learned range at each evaluation, and ``ModelCheckpoint`` keeps the last state. The final model is
exported as a plain timm ResNet and scored on the test split. It trains what ``fit`` trains with the same
``TrainConfig`` and ``restore_best=False`` (``docs/loops.md``). Install the extra first:
``pip install -e '.[lightning]'``.

    python examples/lightning_fit.py          # 1500 iterations of 64 digits at 16 px
    python examples/lightning_fit.py --quick  # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import timm
import torch

from partition_fx import partitionify
from partition_fx.datasets import load_dataset
from partition_fx.training import TrainConfig
from partition_fx.transforms import AffineAugmentation

try:  # the lightning extra: one line naming its install, not a traceback
    from partition_fx.integrations.lightning import PartitionedLightningModule
except ImportError as missing:
    raise SystemExit(f"lightning_fit.py: {missing}") from None

import lightning


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few iterations)")
    parser.add_argument(
        "--out", type=Path, default=None, help="where Lightning writes (default: a temporary dir, removed at the end)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:  # without --out, Lightning's checkpoints (~190 MB) go when the run ends
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        return _train(out, args.quick, args.seed, keep=args.out is not None)


def _train(out: Path, quick: bool, seed: int, keep: bool) -> dict:
    steps = 20 if quick else 1500

    data = load_dataset("rotdigits", size=16)
    torch.manual_seed(seed)
    model = timm.create_model("resnet10t", num_classes=10, in_chans=1)
    pmodel = partitionify(model, num_partitions=3, proportions=(0.8, 0.1, 0.1), seed=seed)
    config = TrainConfig.recommended(steps=steps, batch_size=64, seed=seed)  # fit's recipe
    module = PartitionedLightningModule(pmodel, data.train, hyper=AffineAugmentation(), config=config)

    logger = lightning.pytorch.loggers.CSVLogger(out, name="rotdigits")
    checkpoint = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_last=True)
    trainer = lightning.Trainer(
        max_epochs=1,  # one epoch is the whole run: config's steps
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=[checkpoint],
        enable_progress_bar=not quick,
    )
    trainer.fit(module)

    final = module.export().eval()  # a plain timm ResNet, BatchNorm recalibrated for it
    x, y = data.test.tensors
    with torch.no_grad():
        accuracy = float((final(x).argmax(1) == y).float().mean())
    ranges = module.steps.objective.hyperparameter_values()
    metrics = Path(logger.log_dir) / "metrics.csv"
    where = f"; metrics in {metrics}" if keep else " (pass --out DIR to keep Lightning's metrics and checkpoints)"
    print(f"{type(final).__name__} after {trainer.global_step} iterations: test accuracy {accuracy:.3f}, "
          f"rotation range {ranges['rotation']:.2f} rad{where}")  # fmt: skip
    return {"test_accuracy": accuracy, "hyperparameters": ranges, "metrics": metrics if keep else None}


if __name__ == "__main__":
    main()
