"""Partitioned training of a torchvision detector, learning how far to zoom its images (and boxes) by the
partitioned marginal likelihood, with no validation set.

torchvision's detection models branch on their inputs in Python (``if self.training: ...``, checks of the
targets), which torch.fx cannot trace: ``partitionify`` runs them untraced, their own ``forward`` fed each
subnetwork's tensors. Such a model scores its targets itself (in training mode it returns its losses), so the
likelihood is ``ModelLoss`` and the augmentation ``BoxZoom``, which zooms every image about its centre and moves
its boxes with it. The data are generated: squares and discs (two classes) of sizes 6 to 24 pixels on 64 x 64
noise, so a zoom keeps what the data already vary. The loop is your own (``docs/loops.md``): a
``PartitionedBatchSampler`` draws each iteration's examples, ``TrainingSteps.take`` runs its steps (a parameter
step of one partition, a hyperparameter step every 2nd iteration, the last 0.4 fine-tuning the final model).
At the end the final model is exported as a plain ``FasterRCNN`` and scored on held-out images: recall at
IoU 0.5 of its detections scoring 0.5 or more.

    python examples/detection_zoom.py          # 300 iterations of 8 images
    python examples/detection_zoom.py --quick  # a smoke run (a few iterations)
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision
from torch.utils.data import DataLoader

from partition_fx import export_subnetwork, partitionify
from partition_fx.training import ModelLoss, PartitionedBatchSampler, TrainConfig, TrainingSteps, split_into_chunks
from partition_fx.transforms import BoxZoom

SIZE = 64


def generated_images(count: int, seed: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """``count`` (image, target) pairs: 1 to 3 objects each, a square (label 1) or a disc (label 2), 6 to 24
    pixels across, bright on dim noise."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(SIZE, dtype=torch.float32).view(-1, 1)
    cols = torch.arange(SIZE, dtype=torch.float32).view(1, -1)
    out = []
    for _ in range(count):
        image = 0.2 * torch.rand(3, SIZE, SIZE, generator=g)
        boxes, labels = [], []
        for _ in range(int(torch.randint(1, 4, (), generator=g))):
            side = float(torch.randint(6, 25, (), generator=g))
            x0, y0 = (torch.rand(2, generator=g) * (SIZE - side)).tolist()
            label = int(torch.randint(1, 3, (), generator=g))
            if label == 1:
                inside = (cols >= x0) & (cols < x0 + side) & (rows >= y0) & (rows < y0 + side)
            else:
                r = side / 2
                inside = (cols - x0 - r) ** 2 + (rows - y0 - r) ** 2 <= r * r
            colour = 0.6 + 0.4 * torch.rand(3, 1, 1, generator=g)
            image = torch.where(inside, colour.expand(3, SIZE, SIZE), image)
            boxes.append([x0, y0, x0 + side, y0 + side])
            labels.append(label)
        out.append((image, {"boxes": torch.tensor(boxes), "labels": torch.tensor(labels)}))
    return out


def detector() -> torch.nn.Module:
    """A small Faster R-CNN at the images' own size, nothing downloaded."""
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, min_size=SIZE, max_size=SIZE
    )


def collate(batch: list) -> tuple[list, list]:
    """A list of images and a list of targets (a detection model takes them so, not stacked)."""
    images, targets = zip(*batch)
    return list(images), list(targets)


def recall(model: torch.nn.Module, data: list, threshold: float = 0.5) -> float:
    """The share of the objects that a detection of their label scoring >= ``threshold`` overlaps at IoU >= 0.5."""
    model.eval()
    found = total = 0
    with torch.no_grad():
        for start in range(0, len(data), 16):
            images, targets = collate(data[start : start + 16])
            for prediction, target in zip(model(images), targets):
                keep = prediction["scores"] >= threshold
                boxes, labels = prediction["boxes"][keep], prediction["labels"][keep]
                iou = torchvision.ops.box_iou(target["boxes"], boxes)
                same = target["labels"].view(-1, 1) == labels.view(1, -1)
                found += int(((iou >= 0.5) & same).any(1).sum())
                total += len(target["labels"])
    return found / total


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few iterations)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps, count = (6, 48) if args.quick else (300, 400)
    started = time.perf_counter()

    train, test = generated_images(count, args.seed), generated_images(count // 4, args.seed + 1000)
    torch.manual_seed(args.seed)
    pmodel = partitionify(detector(), num_partitions=2, proportions=(0.8, 0.2), seed=args.seed)
    zoom = BoxZoom(init=0.2)
    config = TrainConfig.recommended(steps=steps, batch_size=8, hyper_batch_size=8, lr=1e-3, seed=args.seed)
    chunks = split_into_chunks(len(train), pmodel.proportions, seed=args.seed)
    steps_ = TrainingSteps.create(pmodel, chunks, hyper=zoom, likelihood=ModelLoss(), config=config)
    batches = PartitionedBatchSampler(chunks, config)
    loader = DataLoader(train, batch_sampler=batches, collate_fn=collate)
    for draw, (images, targets) in zip(batches.draws(), loader, strict=True):
        steps_.take(draw, images, targets)
        if steps_.step % 50 == 0 or steps_.step == steps:
            loss = float(steps_.stepper.losses[-1]) if steps_.stepper.losses else float("nan")
            print(f"step {steps_.step}: loss {loss:.3f}, zoom range {zoom.hyperparameters()['zoom']:.3f}", flush=True)

    final = export_subnetwork(pmodel)  # a plain FasterRCNN, the final subnetwork's weights
    result = {
        "untraced": pmodel.untraced is not None,
        "exported": type(final).__name__,
        "zoom": zoom.hyperparameters()["zoom"],
        "recall": recall(final, test),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"{result['exported']} (partitioned untraced: {result['untraced']}): learned zoom range "
        f"{result['zoom']:.3f} (log-scale), recall@0.5 on {len(test)} held-out images {result['recall']:.3f}, "
        f"{result['seconds']} s"
    )
    return result


if __name__ == "__main__":
    main()
