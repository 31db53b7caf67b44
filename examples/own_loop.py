"""Partitioned training in your own loop: your CNN, your dataset, your ``DataLoader``, your ``for`` loop.

The loop learns an affine augmentation's ranges on ``rotdigits`` (every digit rotated by a random angle) by the
partitioned marginal likelihood, with no validation set: a ``PartitionedBatchSampler`` gives the loader each
iteration's examples, ``TrainingSteps.take`` runs the iteration's steps on them (a parameter step of one
partition, a hyperparameter step every 2nd iteration, the last 0.4 fine-tuning the final model), and the loop
estimates the LML, recalibrates BatchNorm and exports the final model as a plain instance of the CNN's class.
It trains exactly what ``fit`` trains with that configuration and ``restore_best=False`` (``docs/loops.md``).

    python examples/own_loop.py          # 1500 iterations of 64 digits at 16 px
    python examples/own_loop.py --quick  # a smoke run
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from partition_fx import export_subnetwork, partitionify
from partition_fx.datasets import load_dataset
from partition_fx.training import (
    Examples,
    PartitionedBatchSampler,
    TrainConfig,
    TrainingSteps,
    estimate_lml,
    recalibrate_norm_statistics,
    split_into_chunks,
)
from partition_fx.transforms import AffineAugmentation


class SmallCNN(nn.Module):
    """Your model: any ``nn.Module`` that ``torch.fx`` traces."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few iterations)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps = 20 if args.quick else 1500

    data = load_dataset("rotdigits", size=16)
    torch.manual_seed(args.seed)
    pmodel = partitionify(SmallCNN(), num_partitions=3, proportions=(0.8, 0.1, 0.1), seed=args.seed)
    augment = AffineAugmentation()
    config = TrainConfig.recommended(steps=steps, batch_size=64, seed=args.seed)  # fit's recipe

    # 1. the data, split into the model's chunks; the sampler draws each iteration's examples from them
    chunks = split_into_chunks(len(data.train), pmodel.proportions, seed=config.runtime.seed)
    batches = PartitionedBatchSampler(chunks, config)
    # the loader's own generator seeds its workers: torch's global one draws the augmentation
    loader = DataLoader(data.train, batch_sampler=batches, num_workers=0, generator=torch.Generator())
    # 2. the steps: the weights' and the hyperparameters' optimisers and schedules, as fit builds them
    steps = TrainingSteps.create(pmodel, chunks, hyper=augment, config=config)
    torch.manual_seed(config.runtime.seed)

    # 3. the loop
    for draw, (x, y) in zip(batches.draws(), loader):
        steps.take(draw, x, y)  # a parameter step of draw.partitions, a hyperparameter step when due
        if steps.schedule.evaluates_at(steps.step) and not steps.finetuning:
            with torch.random.fork_rng():  # the estimate draws augmentation; the run's draws stay as they were
                lml = estimate_lml(pmodel, Examples(data.train), chunks, steps.likelihood, augment)
            rotation = augment.hyperparameters()["rotation"]
            print(f"step {steps.step:5d}  LML {lml.total:9.1f}  conditional {lml.conditional:9.1f}  "
                  f"rotation range {rotation:.2f} rad")  # fmt: skip

    # 4. the final model: BatchNorm statistics for subnetwork C, exported as a plain SmallCNN
    recalibrate_norm_statistics(pmodel, Examples(data.train))
    final = export_subnetwork(pmodel).eval()
    x, y = data.test.tensors
    with torch.no_grad():
        accuracy = float((final(x).argmax(1) == y).float().mean())
    hyperparameters = steps.objective.hyperparameter_values()
    print(f"final {type(final).__name__}: test accuracy {accuracy:.3f}, learned ranges {hyperparameters}")
    return {"test_accuracy": accuracy, "hyperparameters": hyperparameters, "model": final}


if __name__ == "__main__":
    main()
