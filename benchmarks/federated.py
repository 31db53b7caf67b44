"""Federated partitioned training (appendix J) against its FedAdam baseline, on Flower's simulation engine.

For each dataset (``rotdigits``: client skew over 10 rotation bins; ``digits``: label skew) and seed, the
``partition-fx federated`` job: the MNIST CNN of table 9 with learned concrete dropout and affine
augmentation, ``--clients`` clients with Dirichlet ``--alpha`` skew, chunks 0.7/0.2/0.1; the partitioned run
and the baseline (unpartitioned, hyperparameters fixed at their initial values) for the same rounds. Records
the test accuracy of both, the learned rotation range and dropout rates, and the partitioned run's upload and
total traffic as shares of the baseline's (counted from the messages that crossed Flower).

    python -m benchmarks.federated [--rounds 30] [--clients 100] [--seeds 0,1,2] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS, header, results, write_results
from partition_fx.cli.parser import build_parser


def run(data: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from partition_fx.cli.federated import run_federated_command

    out = args.scratch / f"{data}-{seed}"
    argv = ["federated", "--data", data, "--seed", str(seed), "--clients", str(args.clients), "--rounds",
            str(args.rounds), "--image-size", str(args.image_size), "--server-lr", str(args.server_lr),
            "--evaluate-every", str(max(1, args.rounds // 5)), "--quiet", "--overwrite", "--out", str(out)]  # fmt: skip
    started = time.perf_counter()
    report = run_federated_command(build_parser().parse_args(argv))
    hyper = report["hyperparameters"]
    dropout = [v for k, v in hyper.items() if k.endswith(".p")]
    return {
        "data": data,
        "seed": seed,
        "test_accuracy": report["test_accuracy"],
        "baseline_test_accuracy": report["baseline"]["test_accuracy"],
        "rotation": hyper.get("rotation"),
        "dropout": dropout,
        "upload_share": report["upload_share"],
        "traffic_share": report["traffic_share"],
        "bytes_up": report["bytes_up"],
        "baseline_bytes_up": report["baseline"]["bytes_up"],
        "curves": report["curves"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--server-lr", type=float, default=1e-2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--data", default="rotdigits,digits")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 clients, 2 rounds, 1 seed, 8 px")
    parser.add_argument("--scratch", type=Path, default=Path("runs/benchmark-federated"))
    parser.add_argument("--out", type=Path, default=RESULTS / "federated.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.clients, args.seeds, args.image_size = 2, 10, "0", 8
    runs = [run(data, int(seed), args) for data in args.data.split(",") for seed in args.seeds.split(",")]
    rows = []
    for data in args.data.split(","):
        mine = [r for r in runs if r["data"] == data]
        row = {"data": data, "seeds": len(mine)}
        for key in ("test_accuracy", "baseline_test_accuracy", "upload_share", "traffic_share"):
            row[key] = statistics.fmean(r[key] for r in mine)
            row[f"{key}_min"], row[f"{key}_max"] = min(r[key] for r in mine), max(r[key] for r in mine)
        row["rotation"] = [r["rotation"] for r in mine]
        row["dropout"] = [r["dropout"] for r in mine]
        rows.append(row)
        print(
            f"{data}: accuracy {row['test_accuracy']:.3f} (baseline {row['baseline_test_accuracy']:.3f}), upload "
            f"{100 * row['upload_share']:.1f}% and traffic {100 * row['traffic_share']:.1f}% of the baseline's, "
            f"rotation {row['rotation']}"
        )
    config = {k: v for k, v in vars(args).items() if k not in ("out", "scratch", "quick")}
    write_results(args.out, results(header("federated", quick=args.quick), config, rows, runs=runs))
    return rows


if __name__ == "__main__":
    main()
