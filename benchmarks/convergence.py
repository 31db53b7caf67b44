"""Convergence: iterations to a target test accuracy on rotdigits, partitioned training against plain training.

Every variant is the `partition-fx train` default job (resnet10t on rotdigits at 28 px, batch 64, Adam
1e-3 cosine-annealed to 1e-5 over ``--steps``, hyperparameter Adam 0.05, 4 affine augmentation samples, the
same initial weights, data chunks and sampler seed), built with the command's own parser and helpers, with
the paper's hyperparameter step and no fine-tuning (``common.paper_scheme``):

* (a) ``paper``: ``fit(...)``, the paper's scheme: one partition per parameter step, C=3, 0.8/0.1/0.1;
* (b) ``every_partition``: ``fit(..., every_partition=True)``: each example of a parameter batch trains
  its own partition, so every partition is updated every iteration;
* (b') ``fused_every_partition``: ``fit(..., fused=True, every_partition=True)`` (not run by default: pass
  ``--variants`` with it);
* (c) ``plain``: plain training with the augmentation fixed. The model is partitioned with C=1, which is
  exactly plain training (one partition holding every weight, trained on all the data: after a few
  ``fit`` steps its export is bit-identical to the unpartitioned model trained by a hand-written loop on the
  same batches and augmentation draws). Its input transform is an ``AffineAugmentation`` with the same 4
  samples, initialised at the ranges that (a) learned for the same seed and frozen
  (``requires_grad=False``), so ``fit`` learns no hyperparameters and takes no hyperparameter steps; the
  likelihood averages the 4 samples' predictive as in the partitioned runs.

Every ``--eval-every`` iterations a callback measures the test accuracy of the final model (the exported
subnetwork C; for (c) the whole model) on the 359 held-out images, as `partition-fx train` does at the end:
BatchNorm statistics recomputed over the (unaugmented) training images on a copy, then eval mode; training
is not disturbed. The iterations to the target are those of the first evaluation at or above
``--target`` (null if never). Seconds are training time: the callback's evaluations are excluded; fit's LML
estimates (on 16 examples per chunk) are included. Prints a table and writes
``benchmarks/results/convergence.json``.

    python -m benchmarks.convergence [--seeds 0,1] [--steps 400] [--eval-every 25] [--target 0.9]
        [--variants paper,every_partition,fused_every_partition,plain] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import tables
from benchmarks.common import RESULTS, header, paper_scheme, results, write_results
from partition_fx import export_subnetwork
from partition_fx.cli.train import train_job
from partition_fx.training import evaluate_classifier, fit
from partition_fx.transforms import AffineAugmentation
from partition_fx.transforms.affine import DEFAULT_MAX_RANGE

VARIANTS = {
    "paper": {"fused": False, "every_partition": False},
    "every_partition": {"fused": False, "every_partition": True},
    "fused_every_partition": {"fused": True, "every_partition": True},
    "plain": {},
}
DEFAULT_VARIANTS = "paper,every_partition,plain"  # about 48 min on 1 CPU thread; (b') adds about 20 min
QUICK = ["--batch-size", "8", "--samples", "2", "--image-size", "8"]


@torch.no_grad()
def test_accuracy(model: torch.nn.Module, data: Any, batch_size: int = 256) -> float:
    """Accuracy of a plain model copy with BatchNorm statistics recomputed over the training images."""
    x_train, _ = data.train.tensors
    torch.optim.swa_utils.update_bn(x_train.split(batch_size), model)
    x_test, y_test = data.test.tensors
    return evaluate_classifier(model, x_test, y_test)[0]


def run(variant: str, seed: int, args: argparse.Namespace, learned: dict[str, float] | None) -> dict[str, Any]:
    """One training run of ``variant``; ``learned``: the ranges (a) learned, for (c)."""
    plain = variant == "plain"
    argv = ["--seed", str(seed), "--steps", str(args.steps), *(QUICK if args.quick else [])]
    argv += paper_scheme(*((2, 8) if args.quick else (4, 64)))  # what this benchmark measures: the paper's
    if plain:
        argv += ["--partitions", "1", "--proportions", "1", "--augment", "none"]
    prepared = train_job(argv)  # the `partition-fx train` defaults, data and partitioned model
    job, data, pmodel, hyper = prepared.spec, prepared.data, prepared.pmodel, prepared.hyper
    if plain:
        assert learned is not None
        init = {name: min(abs(value), DEFAULT_MAX_RANGE[name]) for name, value in learned.items()}
        hyper = AffineAugmentation(num_samples=job.samples, init=init)
        hyper.ranges.requires_grad_(False)
    curve: list[tuple[int, float]] = []
    evaluating = [0.0]

    def on_evaluation(trainer: Any, record: dict[str, Any]) -> None:
        start = time.perf_counter()
        curve.append((record["step"], test_accuracy(export_subnetwork(trainer.pmodel), data)))
        evaluating[0] += time.perf_counter() - start

    started = time.perf_counter()
    result = fit(
        pmodel,
        data.train,
        prepared.config,
        hyper=hyper,
        seed=seed,
        eval_every=args.eval_every,
        eval_examples_per_chunk=16,
        callbacks=[on_evaluation],
        progress=False,
        **VARIANTS[variant],
    )
    seconds = time.perf_counter() - started - evaluating[0]
    reached = next((step for step, accuracy in curve if accuracy >= args.target), None)
    return {
        "variant": variant,
        "seed": seed,
        "iterations_to_target": reached,
        "final_test_accuracy": curve[-1][1],
        "seconds": round(seconds, 1),
        "seconds_per_iteration": round(seconds / result.steps, 4),
        "hyperparameters": hyper.hyperparameters() if hyper is not None else {},
        "curve": [{"step": step, "test_accuracy": accuracy} for step, accuracy in curve],
    }


def _median(values: list[float | None]) -> float | None:
    return statistics.median(values) if values and all(v is not None for v in values) else None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=400, help="iterations per run (the cosine schedule's length)")
    parser.add_argument("--eval-every", type=int, default=25, help="test-accuracy interval (iterations)")
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy to reach")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"a subset of {','.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=RESULTS / "convergence.json")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.eval_every = 4, 2
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if "plain" in variants and "paper" not in variants:
        parser.error("the plain variant uses the augmentation learned by 'paper'; include both")
    variants = [v for v in VARIANTS if v in variants]  # paper before plain
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:
        for variant in variants:
            learned = runs[("paper", seed)]["hyperparameters"] if variant == "plain" else None
            r = runs[variant, seed] = run(variant, seed, args, learned)
            print(
                f"{variant}, seed {seed}: {r['iterations_to_target']} iterations to the target, final test accuracy "
                f"{r['final_test_accuracy']:.3f}, {r['seconds']:.0f} s",
                flush=True,
            )

    rows = []
    for variant in variants:
        per_seed = [runs[variant, seed] for seed in seeds]
        iterations = [r["iterations_to_target"] for r in per_seed]
        row = {
            "variant": variant,
            "seeds": seeds,
            "iterations_to_target": iterations,
            "final_test_accuracy": [r["final_test_accuracy"] for r in per_seed],
            "seconds": [r["seconds"] for r in per_seed],
            "seconds_per_iteration": [r["seconds_per_iteration"] for r in per_seed],
            "median_iterations_to_target": _median(iterations),
        }
        if "plain" in variants:
            plain = [runs["plain", seed]["iterations_to_target"] for seed in seeds]
            ratios = [a / b if a is not None and b is not None else None for a, b in zip(iterations, plain)]
            row["ratio_to_plain"] = ratios
            row["median_ratio_to_plain"] = _median(ratios)
        rows.append(row)

    config = {"steps": args.steps, "eval_every": args.eval_every, "target": args.target}
    result = results(header("convergence", quick=args.quick), config, rows, runs=list(runs.values()))
    print(tables.convergence(result))
    by = {r["variant"]: r for r in rows}
    target_met = None
    if "every_partition" in by and "plain" in by:
        ratio = by["every_partition"].get("median_ratio_to_plain")
        target_met = None if ratio is None else ratio <= 1.3
        verdict = "not measured (a run missed the target)" if ratio is None else "met" if target_met else "NOT met"
        print(f"(b) <= 1.3 x (c) iterations to the target: {verdict}")
    result["summary"] = {"every_partition_within_1_3x_plain": target_met}
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
