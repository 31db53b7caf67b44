"""Which hyperparameter-step estimator learns the rotation of rotdigits reliably: each change on its own.

Every run is the `partition-fx train` job (resnet10t, rotdigits, C=3, 0.8/0.1/0.1, batch 64, 4 augmentation
samples, Adam 1e-3 cosine) built by the command's own functions, with one variant's ``fit`` options on top
(``hyper_chunks``, ``hyper_samples``, the hyper learning rate and its schedule, ``finetune_steps``), and two
references trained without partitioning (C=1): no augmentation, and the full rotation fixed by hand (the
oracle). ``all_s16_b16_every2_ft25`` is the command's defaults (:data:`COMMAND`), ``paper`` the paper's
step without fine-tuning. Each run reports the learned ranges after every evaluation, the test accuracy of the exported
final model (the test split is used only for that) and its wall time. Runs go in parallel processes (one
thread each), so variants share the machine alike. Prints a table and writes
``research/results/hyper_estimators.json``.

    python -m research.hyper_estimators [--variants paper,all,...] [--seeds 0,1,2,3,4] [--steps 400]
        [--workers 2] [--device cpu] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import header, results, write_results
from partition_fx.datasets import named_dataset
from research import RESULTS, tables

PAPER: dict[str, Any] = {
    "data": "rotdigits",
    "hyper_chunks": "one",
    "hyper_samples": None,
    "hyper_batch_size": None,
    "hyper_every": 1,
    "finetune": 0.0,
}
"""What every variant changes: the paper's hyperparameter step (appendix I.1), no fine-tuning, rotdigits."""

COMMAND: dict[str, Any] = {
    "hyper_chunks": "all", "hyper_samples": 16, "hyper_batch_size": 16, "hyper_every": 2, "finetune": 0.25
}  # fmt: skip
"""`partition-fx train`'s defaults: every chunk, 16 samples of 16 examples per chunk every 2nd iteration (the
paper's 64 x 4 images per iteration), the last quarter fine-tuning."""

VARIANTS: dict[str, dict[str, Any]] = {
    # The paper's estimator (appendix I.1): one chunk k ~ Cat(u_2..C) per hyper step, S=4, Adam 0.05.
    "paper": {},
    # Each change alone, then together.
    "all": {"hyper_chunks": "all"},
    "s16": {"hyper_samples": 16},
    "all_s16": {"hyper_chunks": "all", "hyper_samples": 16},
    "all_s16_lr02": {"hyper_chunks": "all", "hyper_samples": 16, "hyper_lr": 0.02},
    "all_s16_cos": {"hyper_chunks": "all", "hyper_samples": 16, "hyper_cosine": True},
    "all_s16_every2": {"hyper_chunks": "all", "hyper_samples": 16, "hyper_every": 2},
    # The same images per iteration in hyper steps as the paper's (64 x 4): 2 chunks x 16 x 16 every 2nd,
    # or 2 x 32 x 16 every 4th iteration.
    "all_s16_b16_every2": {"hyper_chunks": "all", "hyper_samples": 16, "hyper_batch_size": 16, "hyper_every": 2},
    "all_s16_b32_every4": {"hyper_chunks": "all", "hyper_samples": 16, "hyper_batch_size": 32, "hyper_every": 4},
    "all_s16_b16_every2_ft25": COMMAND,
    "all_s16_b32_every4_ft25": {**COMMAND, "hyper_batch_size": 32, "hyper_every": 4},
    "all_s16_b16_every2_lr1_ft25": {**COMMAND, "hyper_lr": 0.1},
    "digits_all_s16_b16_every2_ft25": {**COMMAND, "data": "digits"},
    "digits_all_s16_b16_every2_lr1_ft25": {**COMMAND, "hyper_lr": 0.1, "data": "digits"},
    # Fine-tuning the final model for the last quarter / half of the iterations.
    "all_s16_ft25": {"hyper_chunks": "all", "hyper_samples": 16, "finetune": 0.25},
    "all_s16_ft50": {"hyper_chunks": "all", "hyper_samples": 16, "finetune": 0.5},
    "paper_ft25": {"finetune": 0.25},
    # References without partitioning (C=1): no augmentation, and full rotation fixed by hand.
    "plain_none": {"plain": None},
    "plain_oracle": {"plain": dict(named_dataset("rotdigits").true_ranges or {})},  # the truth, every angle
}


def run_one(variant: str, seed: int, steps: int, device: str, quick: bool, stand_in: bool = False) -> dict[str, Any]:
    """One run of ``variant``: the learned hyperparameters at every evaluation, test accuracy, seconds, and the
    images it put through the network. ``stand_in``: a tiny model on 8 px images instead, with the same
    iterations, batches, samples and evaluations, so the same image counts in seconds (the numbers of images
    do not depend on the model)."""
    from benchmarks.methods import PassCounter
    from partition_fx import export_subnetwork
    from partition_fx.cli.train import train_job
    from partition_fx.training import evaluate_classifier, fit
    from partition_fx.transforms import AffineAugmentation

    spec = {**PAPER, **VARIANTS[variant]}
    plain = "plain" in spec
    argv = ["--steps", str(steps), "--seed", str(seed), "--device", device, "--data", spec["data"], "--quiet"]
    if quick:
        argv += ["--image-size", "12", "--batch-size", "8", "--samples", "2", "--model", "fixup_resnet8"]
    elif stand_in:
        argv += ["--image-size", "8", "--model", "fixup_resnet8"]
    if "hyper_lr" in spec:
        argv += ["--hyper-lr", str(spec["hyper_lr"])]
    if plain:
        argv += ["--partitions", "1", "--augment", "none"]
    job = train_job(argv)
    estimator = {key: spec[key] for key in ("hyper_chunks", "hyper_samples", "hyper_batch_size", "hyper_every")}
    if plain:
        estimator["hyper_samples"] = None
    config = job.config.replace(**estimator, finetune_steps=round(steps * spec["finetune"]))
    extra: dict[str, Any] = {}
    hyper = job.hyper
    if plain and spec["plain"] is not None:
        hyper = AffineAugmentation(num_samples=job.spec.samples, init=spec["plain"])
        hyper.ranges.requires_grad_(False)  # fixed by hand: nothing to learn
    if spec.get("hyper_cosine"):
        extra["hyper_scheduler"] = partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps)
    counter = PassCounter(job.pmodel)
    started = time.perf_counter()
    result = fit(
        job.pmodel,
        job.data.train,
        config,
        hyper=hyper,
        **extra,
        seed=seed,
        device=job.device,
        progress=False,
    )
    seconds = time.perf_counter() - started
    passes = counter.as_dict()
    model = export_subnetwork(job.pmodel).cpu()
    x, y = job.data.test.tensors
    accuracy, log_likelihood = evaluate_classifier(model, x, y)
    return {
        "variant": variant,
        "seed": seed,
        "steps": steps,
        "data": spec["data"],
        "finetune_steps": config.finetune_steps,
        "test_accuracy": accuracy,
        "test_log_likelihood": log_likelihood,
        "hyperparameters": result.hyperparameters,
        "trajectory": [(r["step"], r["hyperparameters"].get("rotation")) for r in result.history],
        "lml": result.lml,
        "seconds": seconds,
        "images": passes["forward_images"] + passes["backward_images"],
    }


def _worker(argv: list[str]) -> None:
    variant, seed, steps, device, quick, out = argv
    row = run_one(variant, int(seed), int(steps), device, quick == "1")
    Path(out).write_text(json.dumps(row))


def _launch(job: tuple[str, int, int], device: str, quick: bool, scratch: Path) -> dict[str, Any] | None:
    variant, seed, steps = job
    out = scratch / f"{variant}_s{seed}_{steps}.json"
    if out.is_file():
        return json.loads(out.read_text())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "research.hyper_estimators", "--worker"]
    command += [variant, str(seed), str(steps), device, "1" if quick else "0", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{variant} seed {seed} steps {steps} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(out.read_text())


def summarise(rows: list[dict[str, Any]], images: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    """One line per (variant, steps): rotation min/median/max, accuracy min/mean/max, median seconds, and
    ``images`` (forward + backward, counted on the stand-in model) per run."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["variant"], row["steps"]), []).append(row)
    lines = []
    for (variant, steps), group in groups.items():
        rotation = [r["hyperparameters"].get("rotation") for r in group if "rotation" in r["hyperparameters"]]
        accuracy = [r["test_accuracy"] for r in group]
        lines.append(
            {
                "variant": variant,
                "steps": steps,
                "seeds": len(group),
                "rotation": [min(rotation), statistics.median(rotation), max(rotation)] if rotation else None,
                "rotation_per_seed": [round(v, 3) for v in rotation],
                "accuracy": [min(accuracy), statistics.mean(accuracy), max(accuracy)],
                "seconds": statistics.median(r["seconds"] for r in group),
                "images": images.get((variant, steps)),
            }
        )
    return lines


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1:])
        return {}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", default="400", help="comma-separated iteration counts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scratch", type=Path, default=Path("runs/hyper_estimators"))
    parser.add_argument("--out", type=Path, default=RESULTS / "hyper_estimators.json")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(v, s, int(n)) for n in args.steps.split(",") for v in variants for s in seeds]
    args.scratch.mkdir(parents=True, exist_ok=True)
    # Longest first, so the pool does not end on one long run.
    jobs.sort(key=lambda job: -job[2])
    with ThreadPoolExecutor(args.workers) as pool:
        found = list(pool.map(lambda job: _launch(job, args.device, args.quick, args.scratch), jobs))
    rows = [row for row in found if row is not None]
    # Exact costs in images, the same for every seed: one stand-in run per (variant, steps).
    pairs = dict.fromkeys((variant, steps) for variant, _, steps in jobs)
    images = {(v, n): run_one(v, 0, n, "cpu", args.quick, stand_in=True)["images"] for v, n in pairs}
    lines = summarise(rows, images)
    config = {"variants": {v: VARIANTS[v] for v in variants}, "seeds": seeds, "steps": args.steps}
    payload = results(header("hyper_estimators", quick=args.quick, device=args.device), config, rows, summary=lines)
    print(tables.hyper_estimators(payload))
    if not args.quick:
        write_results(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
