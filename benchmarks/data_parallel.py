"""Data-parallel partitioned training (``training.step.stepping``): time per iteration with 1 and 2 processes
at the same global batch, and the equivalence of what they train.

Each configuration is the ``partition-fx train`` job (the main job's model and data; ``--batch-size``,
``--image-size`` as given) trained by a ``PartitionedTrainer`` for ``--steps`` iterations after 3 warm-up
iterations; the time per iteration is the median over iterations. Configurations:

* one process with ``--threads`` threads (the machine as one process uses it);
* two processes (``torch.multiprocessing``, gloo) with ``--threads / 2`` threads each, half of every
  global minibatch each, gradients averaged in one all-reduce per step.

Equivalence: the same two configurations with the input mask as psi instead of affine augmentation (whose
random samples differ when the batch is split) and the FixUp model (no batch statistics): the largest
difference between the trained parameters of 1 and 2 processes, relative to the largest parameter.

    python -m benchmarks.data_parallel [--steps 20] [--batch 64] [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import RESULTS, header, results, write_results
from partition_fx.job.build import build_job
from partition_fx.job.spec import JobSpec
from partition_fx.training import PartitionedTrainer
from partition_fx.transforms import InputMask

MODEL = "fixup_resnet8"  # no batch statistics: 1 and 2 processes train the same model


def _trainer(args: argparse.Namespace, mask: bool) -> PartitionedTrainer:
    job = build_job(JobSpec.from_keywords(model=MODEL, image_size=args.image_size, batch_size=args.batch, seed=0))
    hyper = InputMask(tuple(job.data.input_shape)) if mask else job.hyper
    return PartitionedTrainer(job.pmodel, job.data.train, hyper=hyper, batch_size=args.batch, seed=0)


def _iterations(trainer: PartitionedTrainer, steps: int) -> list[float]:
    for _ in range(3):
        trainer.iteration()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.iteration()
        times.append(time.perf_counter() - started)
    return times


def _measure(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """This process's seconds per iteration (affine augmentation) and its trained parameters (input mask)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    seconds = statistics.median(_iterations(_trainer(args, mask=False), args.steps))
    torch.manual_seed(0)
    masked = _trainer(args, mask=True)
    _iterations(masked, args.steps)
    state = {k: v.detach().clone() for k, v in masked.pmodel.state_dict().items() if v.is_floating_point()}
    return {"seconds_per_iteration": seconds, "state": state}


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        measured = _measure(args, max(1, args.threads // 2))
        if rank == 0:
            torch.save(measured, Path(out) / "two.pt")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=max(2, torch.get_num_threads()))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 iterations, batch 16, 16 px")
    parser.add_argument("--out", type=Path, default=RESULTS / "data_parallel.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.image_size = 4, 16, 16
    one = _measure(args, args.threads)
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(_worker, args=(port, args, tmp), nprocs=2, join=True)
        two = torch.load(Path(tmp) / "two.pt")
    scale = max(float(v.abs().max()) for v in one["state"].values() if v.numel())
    difference = max(float((one["state"][k] - v).abs().max()) for k, v in two["state"].items() if v.numel())
    rows = [
        {"processes": 1, "threads_each": args.threads, "seconds_per_iteration": round(one["seconds_per_iteration"], 4)},
        {
            "processes": 2,
            "threads_each": max(1, args.threads // 2),
            "seconds_per_iteration": round(two["seconds_per_iteration"], 4),
        },
    ]
    speedup = one["seconds_per_iteration"] / two["seconds_per_iteration"]
    summary = {"speedup": round(speedup, 3), "max_relative_parameter_difference": difference / scale}
    print("| processes | threads each | s / iteration |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['processes']} | {row['threads_each']} | {row['seconds_per_iteration']:.4f} |")
    largest = summary["max_relative_parameter_difference"]
    print(f"speed-up x{speedup:.2f}; trained parameters differ by at most {largest:.1e} (relative)")
    config = {"model": MODEL, "steps": args.steps, "batch": args.batch, "image_size": args.image_size}
    payload = results(header("data_parallel", quick=args.quick), config, rows, summary=summary)
    if not args.quick:  # a smoke run writes nothing, as every benchmark's
        write_results(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
