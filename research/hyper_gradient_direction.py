"""Where does the hyper-gradient point once it sees through training?

The partitioned model of the default job is trained with the rotation range FIXED at ``r`` (parameter steps only),
and at those weights the derivative of the conditional LML (chunk k scored by subnetwork k-1, k = 2..C) with
respect to the range is taken two ways:

* ``fixed``: at fixed weights, what the hyperparameter step follows today;
* ``implicit K``: plus the implicit term through partition k-1's weights, the ones the range trains on chunks
  1..k-1: - v^T [alpha sum_{j<=K} (I - alpha H)^j] d2L/dw dr, with v = dLML/dw, H and L the partition's training
  loss and its Hessian (Lorraine, Vicol & Duvenaud 2020; K = 0 is the one-step unroll).

Everything uses common random numbers: a midpoint rule over the rotation coefficient, the same for every term
(``research.probes``).
A range the data holds (rotdigits: every angle) should get a positive derivative below the truth; one it does not
(digits: none) a negative one.

    python -m research.hyper_gradient_direction            # rotdigits and digits, r in 0.5, 1.5, pi; 2 seeds
    python -m research.hyper_gradient_direction --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

from benchmarks.common import header, results, write_results
from partition_fx.cli.train import train_job
from partition_fx.training import fit, split_into_chunks
from partition_fx.transforms import AffineAugmentation
from research import RESULTS
from research.probes import SAMPLES, derivatives


def run(data: str, r: float, seed: int, steps: int, size: int, alpha: float, ks: list[int]) -> dict[str, Any]:
    argv = ["--data", data, "--seed", str(seed), "--steps", str(steps), "--finetune-steps", "0", "--device", "cpu",
            "--quiet", "--image-size", str(size), "--fix", f"rotation={r}"]  # fmt: skip
    job = train_job(argv)
    started = time.perf_counter()
    fit(job.pmodel, job.data.train, job.config, hyper=job.hyper, device="cpu", progress=False, eval_every=steps,
        eval_examples_per_chunk=32)  # fmt: skip
    trained = time.perf_counter() - started
    x, y = job.data.train.tensors
    chunks = split_into_chunks(len(x), job.pmodel.proportions, seed)
    aug = AffineAugmentation(num_samples=SAMPLES, generators=["rotation"], init={"rotation": r},
                             max_range={"rotation": 4.0})  # fmt: skip
    aug.train()
    started = time.perf_counter()
    found = derivatives(job.pmodel, aug, x, y, chunks, alpha, ks, inner_size=256, seed=seed)
    return {"data": data, "r": r, "seed": seed, **found, "train_seconds": round(trained, 1),
            "derivative_seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--data", nargs="+", default=["rotdigits", "digits"])
    parser.add_argument("--ranges", nargs="+", type=float, default=[0.5, 1.5, math.pi])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=0.01, help="the Neumann series' step (default: 0.01)")
    parser.add_argument("--neumann", nargs="+", type=int, default=[0, 1, 5, 20])
    parser.add_argument("--out", default=str(RESULTS / "hyper_gradient_direction.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.data, args.ranges, args.seeds, args.steps, args.image_size, args.neumann = (
            ["rotdigits"],
            [0.5],
            [0],
            4,
            8,
            [0, 1],
        )
    rows = []
    for data in args.data:
        for r in args.ranges:
            for seed in args.seeds:
                row = run(data, r, seed, args.steps, args.image_size, args.alpha, args.neumann)
                rows.append(row)
                shown = ", ".join(f"{k} {v:+.3f}" for k, v in row.items() if k.startswith(("fixed", "implicit")))
                print(f"{data} r={r:.2f} seed {seed}: {shown}", flush=True)
    result = results(header("hyper_gradient_direction", quick=args.quick), vars(args), rows)
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
