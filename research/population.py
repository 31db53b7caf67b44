"""Population-based training with the conditional LML as its fitness: does comparing runs make the learned range
independent of its start?

The branch check (``research/branch_check.py``) found the conditional LML right over a whole run (it rewards the
wider rotation on rotdigits, the narrower on digits) but flat over the iterations a hyperparameter step sees ahead of
it. Population-based training (Jaderberg et al. 2017; PBA, Ho et al. 2019, for augmentation) compares runs instead
of following a gradient: ``--members`` copies of the default job's partitioned run train side by side, each still
learning its ranges by the configured hyper-gradient; every ``--interval`` iterations each is scored by its
conditional LML (the trainer's own evaluation: no validation set) and the worst ``--exploit`` share copies the
whole training state of the best (weights, ranges, optimisers, samplers and random generators) and then moves each
of its ranges by a factor e^(+-delta) (explore; a range below ``--floor`` of its bound moves from there). The
members start from the job's ranges, all but the first explored once. When partitioned training ends (the job's
fine-tuning step) the best member fine-tunes as the job does, and its final model is scored on the test split.

The population is the package's (``fit(..., population=N)``, ``partition_fx.training.loop.population``); this runs
it on the benchmark arms and scores its final model on the test split.

    python -m research.population --configs rotdigits:zero digits:zero --seeds 0 1 2
    python -m research.population --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.arms import ARMS, data_arm_seeds, training_images
from benchmarks.common import header, results, write_json, write_results
from partition_fx import export_subnetwork, fit
from partition_fx.cli.train import train_job
from research import RESULTS

QUICK_JOB = ["--steps", "10", "--batch-size", "8", "--samples", "2", "--image-size", "8", "--eval-every", "5",
             "--hyper-batch-size", "8"]  # fmt: skip
"""The job of ``--quick``: 6 partitioned iterations, 4 fine-tuning, 8-pixel images."""


def run(data: str, arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One population of the default job (``fit(..., population=N)``, the package's own), its final model scored on
    the test split."""
    argv = ["--data", data, *ARMS[arm], "--seed", str(seed), "--device", "cpu", "--quiet", *args.job]
    job = train_job(argv)
    config = job.config.replace(
        population=args.members, population_interval=args.interval, population_exploit=args.exploit,
        population_delta=args.delta, population_floor=args.floor,
    )  # fmt: skip
    started = time.perf_counter()
    result = fit(job.pmodel, job.data.train, config, hyper=job.hyper, device="cpu", progress=False)
    population = result.population
    assert population is not None  # population >= 2
    rounds = population["rounds"]
    for entry in rounds:
        shown = " ".join(f"{s:.1f}@{r.get(args.report, float('nan')):.2f}"
                         for s, r in zip(entry["fitness"], entry["ranges"]))  # fmt: skip
        print(f"{data}:{arm} seed {seed} step {entry['step']}: {shown}", flush=True)
    exported = export_subnetwork(job.pmodel.cpu()).eval()  # the fittest member's state, fine-tuned
    accuracy, _ = job.test_scores(exported)
    averaged, _ = job.averaged_test_scores(exported, job.spec.test_time_samples)
    end = config.optimization.steps
    partitioned_end = end - config.finetune_steps
    spec = job.spec.to_dict()
    train, samples = spec["train"], spec["samples"]
    per_iteration = train["optimization"]["batch_size"] * samples
    partitioned_phase = {**train, "optimization": {**train["optimization"], "steps": partitioned_end}}
    images = args.members * training_images(partitioned_phase, spec["partitions"], samples, None)
    images += (end - partitioned_end) * per_iteration  # the fittest member's fine-tuning
    return {
        "data": data, "arm": arm, "seed": seed, "members": args.members,
        "initial": population["initial"], "rounds": rounds,
        "learned": result.hyperparameters, "ancestry": population["ancestry"],
        "conditional_lml": max(rounds[-1]["fitness"]),
        "final_conditional_lml": result.conditional_lml,
        "test_accuracy": accuracy, "averaged_test_accuracy": averaged,
        "training_images": images, "plain_training_images": end * per_iteration,
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument(
        "--configs", nargs="+", default=["rotdigits:zero", "digits:zero"],
        help="DATA:ARM (DATA:ARM:S1+S2: with its own seeds), ARM one of learned_augmentation's",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--members", type=int, default=4, help="runs in the population (default: 4; quick: 3)")
    parser.add_argument("--interval", type=int, default=20, help="iterations between exploits (default: 20)")
    parser.add_argument("--exploit", type=float, default=0.5, help="the worst share copies the best (at most 0.5)")
    parser.add_argument("--delta", type=float, default=0.5, help="explore: ranges times e^+-delta (default: 0.5)")
    parser.add_argument("--floor", type=float, default=0.05, help="explore from at least this share of a bound")
    parser.add_argument("--report", default="rotation", help="the range the progress lines show")
    parser.add_argument("--job", nargs=argparse.REMAINDER, default=[], help="more options of the job (last)")
    parser.add_argument(
        "--runs", type=Path, default=Path("runs/population"), help="rows kept here, reused with the same settings"
    )
    parser.add_argument("--out", default=str(RESULTS / "population.json"))
    args = parser.parse_args(argv)
    if args.members < 2:
        parser.error("--members must be 2 or more (one member is the job's own run: learned_augmentation runs it)")
    torch.set_num_threads(1)
    if args.quick:
        args.configs, args.seeds, args.interval = ["rotdigits:zero"], [0], 2
        args.members = 3 if "--members" not in (argv or []) else args.members
        args.job = QUICK_JOB
    settings = {key: getattr(args, key) for key in ("members", "interval", "exploit", "delta", "floor", "job")}
    rows = []
    for entry in args.configs:
        data, arm, seeds = data_arm_seeds(entry, args.seeds)
        for seed in seeds:
            done = None if args.quick else args.runs / f"{data}_{arm}_s{seed}.json"
            kept = json.loads(done.read_text()) if done is not None and done.is_file() else {}
            if kept.get("settings") == settings:
                row = kept["row"]
            else:
                row = run(data, arm, seed, args)
                if done is not None:
                    write_json(done, {"settings": settings, "row": row})
            rows.append(row)
            print(
                f"{data}:{arm} seed {seed}: {args.report} {row['learned'].get(args.report, float('nan')):.3f}, "
                f"test {row['test_accuracy']:.4f} (averaged {row['averaged_test_accuracy']:.4f}), "
                f"{row['training_images'] / row['plain_training_images']:.2f}x the plain run's images",
                flush=True,
            )
    result = results(header("population", quick=args.quick), {**vars(args), "runs": str(args.runs)}, rows)
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
