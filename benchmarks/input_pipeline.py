"""Input throughput of the streaming pipeline against what a training step consumes.

An image folder of JPEG files (10 classes, 64x64 RGB: smooth random colour fields plus noise) is written to a
temporary directory and read back by ``image_folder(..., size=32)``: each file decoded and resized to 32x32, the
recommended CIFAR-like resolution, where the training step is cheapest and the pipeline most likely to lag.
The folder is read through the page cache (it was just written), so this measures decoding, not the disk.
Arms, measured in turn (round robin) in one process, each the median over repeats:

* pipeline, W workers (0, 1, 2): ``StepInputs(Examples(folder, workers=W, prefetch=2))`` started on a plan of
  parameter batches (64 random indices each) from a copy of a ``PartitionedTrainer``'s sampler, and asked for the
  same batches in the same order from a second copy, as training asks: images/s delivered, after a warm-up
  that drains what the workers had read ahead while the other arms ran. The pipeline alone, nothing else running.
* step: ``trainer.iteration()`` of ``TrainConfig.recommended`` (batch 64, hyperparameter steps included) on the
  same images decoded into memory, with a partitioned resnet10t and ``AffineAugmentation``: images/s the steps
  read. A hyperparameter step every ``hyper_every`` iterations reads ``hyper_batch_size`` examples of each chunk
  2..C on top of the parameter batch, so the step reads more than ``batch_size`` per iteration: the ratio is
  to those reads (every image the pipeline must deliver).
* streamed training, W workers: the same iterations on the folder read from disk by W workers (the pipeline
  and the step competing for the cores): the end-to-end check of the verdict.

Input-bound means the pipeline alone delivers fewer images per second than the step reads. Prints a table and
writes ``benchmarks/results/input_pipeline.json`` (``--quick`` writes nothing).

    python -m benchmarks.input_pipeline [--images 2000] [--workers 0,1,2] [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import partition_fx  # noqa: F401  (registers the shipped models)
from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results
from partition_fx import partitionify
from partition_fx.datasets import image_folder
from partition_fx.models import build_model
from partition_fx.training import Examples, PartitionedSampler, PartitionedTrainer, TrainConfig
from partition_fx.training.sampling.chunks import StepInputs
from partition_fx.transforms import AffineAugmentation

CLASSES = 10
LARGE = 10**6  # the configured run's length: no fine-tuning phase is reached
PREFETCH = 2


def write_folder(root: Path, images: int, side: int, seed: int = 0) -> None:
    """``root/c<k>/<i>.jpg``: ``images`` JPEG files (quality 90) of ``side`` x ``side`` RGB over ``CLASSES``
    classes, each an 8x8 random colour field upsampled (bilinear) plus pixel noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = root / f"c{i % CLASSES}"
        folder.mkdir(exist_ok=True)
        field = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize(
            (side, side), Image.Resampling.BILINEAR
        )
        pixels = np.asarray(field, dtype=np.int16) + rng.integers(-20, 21, (side, side, 3))
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.jpg", quality=90)


def _trainer(data: Any, config: TrainConfig, model: str, workers: int) -> PartitionedTrainer:
    torch.manual_seed(0)  # every trainer starts from the same weights
    pmodel = partitionify(build_model(model, num_classes=CLASSES), 3)
    return PartitionedTrainer(pmodel, data, config.replace(workers=workers), hyper=AffineAugmentation(num_samples=4))


def _count_reads(trainer: PartitionedTrainer) -> list[int]:
    """Count the examples the trainer's steps read: ``[images]``, reset by the caller."""
    count = [0]
    read = trainer.steps.examples.batch

    def counted(indices: torch.Tensor, device: torch.device | None = None):
        count[0] += indices.numel()
        return read(indices, device)

    trainer.steps.examples.batch = counted  # type: ignore[method-assign]  # the steps read through trainer.steps.examples
    return count


class PipelineArm:
    """``StepInputs`` with ``workers`` processes reading ahead the parameter batches of ``sampler``'s copy, asked
    for them in order from another copy."""

    def __init__(self, dataset: Any, sampler: PartitionedSampler, workers: int) -> None:
        self.workers = workers
        self.inputs = StepInputs(Examples(dataset, workers=workers, prefetch=PREFETCH))
        self.ask = sampler.copy()
        self.asked = 0
        plan_from = sampler.copy()

        def plan() -> Iterator[torch.Tensor]:
            planned = plan_from.copy()
            while True:
                yield planned.parameter_batch()[1]

        self.inputs.start(plan)

    def window(self, batches: int) -> float:
        """Images/s over ``batches`` batches, after a warm-up that empties the read-ahead queue (its batches were
        decoded while the other arms ran)."""
        for _ in range(2 * PREFETCH * self.workers + 2):
            self._next()
        start = time.perf_counter()
        images = sum(self._next() for _ in range(batches))
        return images / (time.perf_counter() - start)

    def _next(self) -> int:
        x, _ = self.inputs.batch(self.ask.parameter_batch()[1])
        self.asked += 1
        return int(x.shape[0])

    def close(self) -> None:
        self.inputs.close()


class StepArm:
    """A trainer's iterations: images/s its steps read (and in parameter batches alone)."""

    def __init__(self, trainer: PartitionedTrainer, warmup: int = 2) -> None:
        self.trainer = trainer
        self.reads = _count_reads(trainer)
        for _ in range(warmup):  # optimiser state, worker start-up
            trainer.iteration()

    def window(self, iterations: int) -> tuple[int, float]:
        """(images read, seconds) of ``iterations`` (even: as many hyperparameter steps whatever the phase)
        after one warm-up iteration."""
        self.trainer.iteration()
        self.reads[0] = 0
        start = time.perf_counter()
        for _ in range(iterations):
            self.trainer.iteration()
        return self.reads[0], time.perf_counter() - start

    def close(self) -> None:
        self.trainer.steps.examples.close()


def measure(args: argparse.Namespace, root: Path, config: TrainConfig) -> dict[str, Any]:
    streamed = image_folder(root, size=args.image_size, in_memory=False)
    in_memory = image_folder(root, size=args.image_size, in_memory=True)
    workers = [int(w) for w in args.workers.split(",")]
    arms: list[Any] = []
    try:
        step = StepArm(_trainer(in_memory.train, config, args.model, 0))
        arms.append(step)
        streams: dict[int, StepArm] = {}
        pipes: dict[int, PipelineArm] = {}
        for w in workers:
            trainer = _trainer(streamed.train, config, args.model, w)
            sampler = trainer.sampler.copy()  # before it draws: the batches training would read first
            pipes[w] = PipelineArm(streamed.train, sampler, w)
            arms.append(pipes[w])
            if not args.no_streamed:
                streams[w] = StepArm(trainer)
                arms.append(streams[w])
            else:
                trainer.steps.examples.close()
        pipe_rates: dict[int, list[float]] = {w: [] for w in workers}
        stream_rates: dict[int, list[float]] = {w: [] for w in streams}
        step_rates: list[float] = []
        step_seconds: list[float] = []
        reads_per_iteration: list[float] = []
        for repeat in range(args.repeats):
            for w in workers:
                pipe_rates[w].append(pipes[w].window(args.batches))
            reads, seconds = step.window(args.iterations)
            step_rates.append(reads / seconds)
            step_seconds.append(seconds / args.iterations)
            reads_per_iteration.append(reads / args.iterations)
            for w, arm in streams.items():
                reads, seconds = arm.window(args.iterations)
                stream_rates[w].append(reads / seconds)
            print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
        step_rate = statistics.median(step_rates)
        seconds_per_iteration = statistics.median(step_seconds)
        rows: list[dict[str, Any]] = []
        for w in workers:
            rate = statistics.median(pipe_rates[w])
            row: dict[str, Any] = {
                "arm": "pipeline",
                "workers": w,
                "images_per_second": rate,
                "images_per_second_repeats": pipe_rates[w],
                "ratio_to_step": rate / step_rate,
                "input_bound": rate < step_rate,
                "batches_asked": pipes[w].asked,
                "read_ahead_batches": pipes[w].inputs.read_ahead_batches,
            }
            if w in streams:
                trained = statistics.median(stream_rates[w])
                row.update(
                    streamed_training_images_per_second=trained,
                    streamed_training_images_per_second_repeats=stream_rates[w],
                    streamed_training_vs_in_memory=trained / step_rate,
                    streamed_training_read_ahead_batches=streams[w].trainer.steps.examples.read_ahead_batches,
                )
            rows.append(row)
        rows.append(
            {
                "arm": "step",
                "workers": None,
                "images_per_second": step_rate,
                "images_per_second_repeats": step_rates,
                "parameter_batch_images_per_second": args.batch / seconds_per_iteration,
                "reads_per_iteration": statistics.median(reads_per_iteration),
                "seconds_per_iteration": seconds_per_iteration,
                "seconds_per_iteration_repeats": step_seconds,
            }
        )
        return {
            "rows": rows,
            "train_images": len(streamed.train),
            "hyper_samples": step.trainer.steps.hyper_samples,
            "hyper_batch_size": step.trainer.sampler.hyper_batch_size,
        }
    finally:
        for arm in arms:
            arm.close()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000, help="JPEG files written (a fifth go to test)")
    parser.add_argument("--source-size", type=int, default=64, help="side of the JPEG files")
    parser.add_argument("--image-size", type=int, default=32, help="side they are decoded (resized) to")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--batches", type=int, default=50, help="pipeline batches timed per repeat")
    parser.add_argument("--iterations", type=int, default=6, help="training iterations timed per repeat (even)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="resnet10t")
    parser.add_argument("--no-streamed", action="store_true", help="skip training on the streamed folder")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 images, batch 16, 2 repeats")
    parser.add_argument("--out", type=Path, default=RESULTS / "input_pipeline.json")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.quick:  # every arm at a tiny budget; the numbers mean nothing
        args.images, args.source_size, args.batch, args.batches, args.iterations, args.repeats = 200, 32, 16, 5, 2, 2
        overrides = {"hyper_samples": 2, "hyper_batch_size": 4}
    if args.iterations % 2:
        parser.error("--iterations must be even (as many hyperparameter steps in every window)")
    config = TrainConfig.recommended(batch_size=args.batch, steps=LARGE, **overrides)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_folder(Path(tmp), args.images, args.source_size)
        written = time.perf_counter() - start
        measured = measure(args, Path(tmp), config)
    settings = {
        "images": args.images,
        "train_images": measured["train_images"],
        "classes": CLASSES,
        "format": "JPEG (quality 90), RGB",
        "source_size": args.source_size,
        "image_size": args.image_size,
        "batch": args.batch,
        "prefetch": PREFETCH,
        "workers": [int(w) for w in args.workers.split(",")],
        "batches_per_repeat": args.batches,
        "iterations_per_repeat": args.iterations,
        "repeats": args.repeats,
        "model": f"partitionify({args.model}, 3)",
        "hyper": "AffineAugmentation(num_samples=4)",
        "hyper_samples": measured["hyper_samples"],
        "hyper_batch_size": measured["hyper_batch_size"],
        "hyper_every": config.hyper.every,
        "hyper_chunks": config.hyper.chunks,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "start_method": multiprocessing.get_start_method(),
        "folder_write_seconds": written,
    }
    result = results(header("input_pipeline", quick=args.quick), settings, measured["rows"])
    print(tables.input_pipeline(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
