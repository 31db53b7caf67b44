"""Where does the evidence for ``scaledigits``' zoom peak, and where the test accuracy? The profile that decides
whether any optimiser of the partitioned objective can learn the zoom's truth (log 2, an isotropic log-scale range).

Earlier profiles of the zoom were measured at 16 pixels, on 8 views and with the weights trained at the scored
range (``research.occam``, ``research.branch_check --generator scale``), while the default job runs at 28 pixels,
scores 6 views and trains its parameter steps at half the scored range (``train_range_factor`` 0.5). This one
measures the objective the default job follows, at its resolution. For each zoom r of ``--zooms`` and each seed:

* ``lml_at_r``, ``lml_at_2r``: the default job's partitioned run with the zoom FIXED at r (every other range 0,
  Augerino's generators; ``research.fixed_range``), trained for its partitioned phase (``--steps`` of the job's
  ``--total`` iterations, the learning rate on the job's schedule), then scored by the conditional LML
  (``research.probes.conditional_lml``) on ``--views`` midpoint views of the range r and of 2r. At r it is the
  objective at ``train_range_factor`` 1 (the weights trained at the scored range); at 2r, the objective at 0.5, the
  default's (what a hyperparameter step at psi = 2r sees);
* ``test_accuracy``, ``averaged_test_accuracy``: plain training (C = 1) with the zoom fixed at r, the oracle's
  options (``benchmarks.arms``' ``oracle_scaledigits``) with r in place of the truth, its exported model scored on the
  test split, plain and averaged over the job's test-time views (appendix G's retraining at each range).

The summary gives each score's mean and standard error over seeds at each zoom, where the means peak, and per seed
where each curve peaks. Each (zoom, seed) is kept under ``--runs`` and reused with the same settings, so several
processes can share the work (``--seeds``, ``--zooms``, ``--parts``) and a last call assembles the results without
training; a score a seed did not measure is left out of its mean.

    python -m research.zoom_profile --seeds 0 1 2
    python -m research.zoom_profile --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.arms import ARMS, SCALEDIGITS_TRUTH
from benchmarks.common import header, mean_se, results, write_json, write_results
from partition_fx import export_subnetwork, fit
from partition_fx.cli.train import train_job
from partition_fx.transforms import AffineAugmentation
from research import RESULTS
from research.fixed_range import train_at_fixed_range
from research.probes import conditional_lml

TRUTH = math.log(2)
ZOOMS = [0.09, 0.17, 0.35, 0.52, 0.69, 1.04]
"""The default zooms: 0.13x to 1.5x the truth (0.69 is log 2 to two decimals)."""
SCORES = ("lml_at_r", "lml_at_2r", "test_accuracy", "averaged_test_accuracy")


def evidence(r: float, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """The conditional LML on ``args.views`` midpoint views at r and at 2r, at weights trained at r."""
    run = train_at_fixed_range("scaledigits", "scale", r, seed, steps=args.steps, image_size=args.image_size,
                               total=args.total)  # fmt: skip
    started = time.perf_counter()
    at = {f"lml_at_{name}": conditional_lml(run.pmodel, "scale", scored, run.x, run.y, run.chunks, args.views)
          for name, scored in (("r", r), ("2r", 2 * r))}  # fmt: skip
    return {**at, "train_seconds": round(run.seconds, 1), "score_seconds": round(time.perf_counter() - started, 1)}


def accuracy(r: float, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """Plain training (C = 1) with the zoom fixed at r: the oracle's job with r for the truth."""
    options = [f"scale={r}" if option == SCALEDIGITS_TRUTH else option for option in ARMS["oracle_scaledigits"]]
    job = train_job(["--data", "scaledigits", *options, "--seed", str(seed), "--device", "cpu", "--quiet",
                     "--image-size", str(args.image_size), *args.job])  # fmt: skip
    assert isinstance(job.hyper, AffineAugmentation)
    started = time.perf_counter()
    fit(job.pmodel, job.data.train, job.config, hyper=job.hyper, progress=False, record_run=False)
    exported = export_subnetwork(job.pmodel).eval()
    test, _ = job.test_scores(exported)
    averaged, _ = job.averaged_test_scores(exported, job.spec.test_time_samples)
    return {"test_accuracy": test, "averaged_test_accuracy": averaged,
            "plain_seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per zoom, each score's mean, standard error and count over the seeds that measured it; the zoom each score's
    mean peaks at; and, over the seeds that measured a score at every zoom, the zoom each seed's curve peaks at.

    >>> rows = [{"r": r, "seed": s, **{k: -(r - 0.5) ** 2 + s for k in SCORES}} for r in (0.2, 0.5) for s in (0, 1)]
    >>> s = summary(rows)
    >>> s["peaks"]["lml_at_r"], s["seed_peaks"]["lml_at_r"], s["zooms"][1]["lml_at_r"]
    (0.5, {'0': 0.5, '1': 0.5}, [0.5, 0.5, 2])
    """
    zooms = sorted({row["r"] for row in rows})
    seeds = sorted({row["seed"] for row in rows})
    at = {(row["r"], row["seed"]): row for row in rows}
    table = []
    for r in zooms:
        entry: dict[str, Any] = {"r": r, "of_truth": round(r / TRUTH, 2)}
        for score in SCORES:
            values = [at[r, s][score] for s in seeds if score in at.get((r, s), {})]
            entry[score] = [*mean_se(values), len(values)] if values else None
        table.append(entry)
    peaks = {score: max((e for e in table if e[score]), key=lambda e: e[score][0])["r"]
             for score in SCORES if any(e[score] for e in table)}  # fmt: skip
    seed_peaks = {
        score: {str(s): max(zooms, key=lambda r: at[r, s][score]) for s in seeds
                if all(score in at.get((r, s), {}) for r in zooms)}
        for score in SCORES
    }  # fmt: skip
    return {"zooms": table, "peaks": peaks, "seed_peaks": seed_peaks}


PARTS = {"evidence": (evidence, "lml_at_r"), "accuracy": (accuracy, "test_accuracy")}
"""What each cell measures, and the score that says it has."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--zooms", nargs="+", type=float, default=ZOOMS, help="the fixed zooms r")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=240, help="partitioned iterations trained (the default job's)")
    parser.add_argument("--total", type=int, default=400, help="the job's iterations (its learning rate's schedule)")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--views", type=int, default=32, help="midpoint views per scored range (default: 32)")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=sorted(PARTS),
        default=sorted(PARTS),
        help="what each (zoom, seed) measures: the evidence, the plain model's accuracy (both)",
    )
    parser.add_argument("--job", nargs=argparse.REMAINDER, default=[], help="more options of the plain job (last)")
    parser.add_argument("--runs", type=Path, default=Path("runs/zoom_profile"), help="rows kept here, reused")
    parser.add_argument("--out", default=str(RESULTS / "zoom_profile.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.zooms, args.seeds, args.steps, args.total, args.image_size, args.views = [0.2, 0.5], [0], 3, 5, 8, 4
        args.job = ["--steps", "4", "--batch-size", "8", "--samples", "2"]
    settings = {key: getattr(args, key) for key in ("steps", "total", "image_size", "views", "job")}
    rows = []
    for seed in args.seeds:
        for r in args.zooms:
            done = None if args.quick else args.runs / f"scale_{r}_s{seed}.json"
            kept = json.loads(done.read_text()) if done is not None and done.is_file() else {}
            row = kept["row"] if kept.get("settings") == settings else {"r": r, "seed": seed}
            missing = [part for part in PARTS if part in args.parts and PARTS[part][1] not in row]  # in PARTS' order
            for part in missing:
                row.update(PARTS[part][0](r, seed, args))
            if missing and done is not None:
                write_json(done, {"settings": settings, "row": row})
            rows.append(row)
            shown = [f"conditional LML {row['lml_at_r']:.1f} at r, {row['lml_at_2r']:.1f} at 2r" if "lml_at_r" in row
                     else "", f"test {row['test_accuracy']:.4f} (averaged {row['averaged_test_accuracy']:.4f})"
                     if "test_accuracy" in row else ""]  # fmt: skip
            print(f"zoom {r:.2f} seed {seed}: {'; '.join(filter(None, shown))}", flush=True)
    config = {**vars(args), "runs": str(args.runs), "truth": TRUTH}
    result = results(header("zoom_profile", quick=args.quick), config, rows, summary=summary(rows))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
