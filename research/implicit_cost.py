"""What the hyper-gradient through training costs: a hyperparameter step with ``hyper_gradient="implicit"`` against
the fixed-weight one and against a parameter step, on the default job's model and data.

The default job (``partition-fx train``: resnet10t on rotdigits, C = 3, batch 64, every chunk scored with 6
augmentation samples of 16 examples) is built by ``partition_fx.cli.train.train_job``; each step is timed in turn in
one process (round robin), medians over repeats, and reported in parameter steps (one forward and one backward of a
batch of 64 through subnetwork k): the hyperparameter step at fixed weights and through training for each K, and the
iteration of the default recipe (a parameter step, a hyperparameter step every 2nd iteration), which gives the run's
partitioned phase's cost relative to the fixed-weight run's.

    python -m research.implicit_cost            # K in 0, 1, 5, 20; 7 repeats
    python -m research.implicit_cost --quick    # a smoke run; writes nothing
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.common import header, results, write_results
from partition_fx.cli.train import train_job
from partition_fx.job.build import TrainJob
from partition_fx.training import PartitionedSampler, TrainingSteps, split_into_chunks
from research import RESULTS, tables


def _steps(job: TrainJob, gradient: str, terms: int) -> tuple[TrainingSteps, PartitionedSampler]:
    config = job.config.replace(hyper_gradient=gradient, implicit_terms=terms)
    chunks = split_into_chunks(len(job.data.train), job.pmodel.proportions, 0)
    steps = TrainingSteps.create(job.pmodel, chunks, hyper=job.hyper, config=config)
    return steps, PartitionedSampler(chunks, config.optimization.batch_size, config.hyper.batch_size, seed=0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", nargs="+", type=int, default=[0, 1, 5, 20])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="K = 0, 1; 2 repeats at 8 px; writes nothing")
    parser.add_argument("--out", default=str(RESULTS / "implicit_cost.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    argv_job = ["--quiet", "--device", "cpu"] + (["--image-size", "8", "--batch-size", "8"] if args.quick else [])
    job = train_job(argv_job)
    terms, repeats = ([0, 1], 2) if args.quick else (args.terms, args.repeats)
    x, y = job.data.train.tensors
    fixed, sampler = _steps(job, "fixed", 0)
    arms: dict[str, Any] = {"parameter step": None, "hyper step, fixed weights": fixed}
    arms.update({f"hyper step, through training K={k}": _steps(job, "implicit", k)[0] for k in terms})
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats + 1):  # the first round warms up
        for name, steps in arms.items():
            k, indices = sampler.parameter_batch()
            scored = sampler.hyper_batches()
            batches = [(w, kk, x[i], y[i]) for w, kk, i in scored]
            drawn = [(p, sampler.parameter_batch(k=p)[1]) for p in (1, 2)]
            inner = [(p, x[rows], y[rows]) for p, rows in drawn]
            started = time.perf_counter()
            if steps is None:
                fixed.parameter_step(k, x[indices], y[indices])
            elif steps is fixed:
                steps.hyper_step(batches, "timed")
            else:
                steps.hyper_step(batches, "timed", inner)
            times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    unit = medians["parameter step"]
    every = job.config.hyper.every
    fixed_iteration = unit + medians["hyper step, fixed weights"] / every
    rows = [
        {
            "step": name,
            "seconds": round(seconds, 4),
            "parameter_steps": round(seconds / unit, 2),
            "iteration_vs_fixed": round((unit + seconds / every) / fixed_iteration, 2) if "hyper" in name else None,
        }
        for name, seconds in medians.items()
    ]
    result = results(header("implicit_cost", quick=args.quick), {**vars(args), "hyper_every": every}, rows)
    print(tables.implicit_cost(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
