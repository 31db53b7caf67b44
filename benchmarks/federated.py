"""Federated partitioned training (appendix J) against its FedAdam baseline, both at the paper's settings.

For each dataset (``rotdigits``: client skew over 10 rotation bins; ``digits``: label skew) and seed: the
partitioned run (the MNIST CNN of table 9 with learned concrete dropout and affine augmentation, chunks
0.7/0.2/0.1) and the baseline (unpartitioned, psi fixed: no augmentation, dropout 0.1), both with
``FederatedConfig``'s defaults (server Adam 1e-3, client SGD 0.05, 10 augmentation samples, psi's learning
rate by ``scaled_hyper_lr``) over the same clients. Both run by ``partition_fx.federated.simulate``, the
algorithm of the Flower apps in one process (``tests/test_federated.py`` holds the two equal); the server
evaluates every round, averaged over 10 augmentations where psi has any (the baseline has none). Records each
run's curve, the mean of its last 10 evaluations, the learned rotation and dropout, its bytes as Flower counts
them; and the seconds per round of both engines, Flower's measured over ``--flower-rounds`` rounds.

    python -m benchmarks.federated [--rounds 100] [--clients 50] [--seeds 0,1,2,3] [--quick]

Runs are cached in ``--scratch`` by their config, so an interrupted benchmark resumes, and the seeds can be
split over processes (``--seeds 0,1`` and ``--seeds 2,3`` with ``--no-write``, then all seeds to write).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, header, results, write_results
from partition_fx.federated.job import LAST_EVALUATIONS, mean_of_last

ARMS = ("partitioned", "baseline", "partitioned-fixed")
"""The partitioned run, the FedAdam baseline, and (an ablation) the partitioned model with psi fixed at the
baseline's values: what partitioning alone costs or gains, without learned hyperparameters."""


def _config(data: str, seed: int, args: argparse.Namespace, arm: str = "partitioned") -> Any:
    import dataclasses

    from partition_fx.federated import FederatedConfig

    config = FederatedConfig(data=data, seed=seed, clients=args.clients, rounds=args.rounds,
                             image_size=args.image_size, evaluate_every=1)  # fmt: skip
    if arm == "baseline":
        return config.baseline()
    return dataclasses.replace(config, learn_hyperparameters=False) if arm == "partitioned-fixed" else config


def _run(config: Any, arm: str, scratch: Path) -> dict[str, Any]:
    """The run's history (client metrics dropped), from the cache when its config matches."""
    from partition_fx.federated import simulate

    path = scratch / f"{config.data}-{config.seed}-{arm}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached["config"] == config.run_config():
            return cached
    started = time.perf_counter()
    run = simulate(config)
    history = run.history()
    history.pop("client_train_metrics")
    history["wall_seconds"] = round(time.perf_counter() - started, 1)
    scratch.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    print(f"{config.data} seed {config.seed} {arm}: {history['curve'][-1]['test-accuracy']:.3f}", flush=True)
    return history


def _at_bytes(curve: list[dict[str, Any]], budget: int, key: str) -> float:
    """The mean of the last 10 evaluations of ``curve`` made within ``budget`` bytes of traffic."""
    within = [p for p in curve if p["bytes"] <= budget]
    return mean_of_last(within, key) if within else float("nan")


def _seed_row(data: str, seed: int, ours: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    hyper = ours["hyperparameters"]
    budget = ours["curve"][-1]["bytes"]
    return {
        "data": data,
        "seed": seed,
        "rotation": hyper.get("rotation"),
        "dropout": [v for k, v in hyper.items() if k.endswith(".p")],
        "rotation_curve": [p["hyperparameters"].get("rotation") for p in ours["curve"]],
        "partitioned_last": mean_of_last(ours["curve"], "test-accuracy"),
        "partitioned_last_averaged": mean_of_last(ours["curve"], "test-accuracy-averaged"),
        "baseline_last": mean_of_last(base["curve"], "test-accuracy"),
        "baseline_last_at_bytes": _at_bytes(base["curve"], budget, "test-accuracy"),
        "partitioned_final": ours["curve"][-1]["test-accuracy"],
        "partitioned_final_averaged": ours["curve"][-1]["test-accuracy-averaged"],
        "baseline_final": base["curve"][-1]["test-accuracy"],
        "upload_share": ours["bytes_up"] / base["bytes_up"],
        "traffic_share": (ours["bytes_up"] + ours["bytes_down"]) / (base["bytes_up"] + base["bytes_down"]),
        "seconds_per_round": ours["seconds_per_round"],
        "baseline_seconds_per_round": base["seconds_per_round"],
        "curves": {
            "partitioned": [
                [p["round"], p["bytes"], p["test-accuracy"], p["test-accuracy-averaged"]] for p in ours["curve"]
            ],
            "baseline": [[p["round"], p["bytes"], p["test-accuracy"]] for p in base["curve"]],
        },
    }


def _flower_seconds(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per round of Flower's simulation engine (2 CPUs) and of ``simulate`` for the first dataset's
    seed 0, over ``--flower-rounds`` rounds, both arms; Flower's first round (Ray's start, the clients' models
    built) is left out."""
    import dataclasses

    from partition_fx.federated import run_flower, simulate

    timings = {}
    data = args.data.split(",")[0]
    for arm in ARMS[:2]:
        config = dataclasses.replace(_config(data, 0, args, arm), rounds=args.flower_rounds, evaluate_every=1)
        marks: list[float] = []
        run_flower(config, on_round=lambda r, point, marks=marks: marks.append(time.perf_counter()))
        timings[f"flower_{arm}"] = (marks[-1] - marks[1]) / (len(marks) - 2)
        timings[f"simulate_{arm}"] = simulate(config).seconds / config.rounds
    return timings


def _summary(data: str, seeds: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"data": data, "seeds": len(seeds)}
    for key in ("partitioned_last", "partitioned_last_averaged", "baseline_last", "baseline_last_at_bytes",
                "upload_share", "traffic_share", "seconds_per_round", "baseline_seconds_per_round"):  # fmt: skip
        values = [s[key] for s in seeds]
        row[key], row[f"{key}_min"], row[f"{key}_max"] = statistics.fmean(values), min(values), max(values)
    row["rotation"] = [s["rotation"] for s in seeds]
    return row


def _plot(per_seed: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({s["data"] for s in per_seed}, reverse=True)
    figure, axes = plt.subplots(len(datasets), 3, figsize=(14, 3.6 * len(datasets)), squeeze=False)
    for row, data in zip(axes, datasets):
        for s in (s for s in per_seed if s["data"] == data):
            ours, base = s["curves"]["partitioned"], s["curves"]["baseline"]
            row[0].plot([p[0] for p in ours], [p[3] for p in ours], color="C0", alpha=0.6)
            row[0].plot([p[0] for p in base], [p[2] for p in base], color="C1", alpha=0.6)
            row[1].plot([p[1] / 1e6 for p in ours], [p[3] for p in ours], color="C0", alpha=0.6)
            row[1].plot([p[1] / 1e6 for p in base], [p[2] for p in base], color="C1", alpha=0.6)
            row[2].plot([p[0] for p in ours], s["rotation_curve"], color="C0", alpha=0.6)
        row[0].set(title=f"{data}: test accuracy", xlabel="round")
        row[0].legend(handles=[plt.Line2D([], [], color="C0", label="partitioned (averaged over 10)"),
                               plt.Line2D([], [], color="C1", label="FedAdam baseline")])  # fmt: skip
        row[1].set(title=f"{data}: test accuracy against traffic", xlabel="MB up + down")
        row[2].set(title=f"{data}: learned rotation range (rad)", xlabel="round")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--image-size", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--data", default="rotdigits,digits")
    parser.add_argument("--ablation-seeds", default="0", help="seeds of the partitioned-fixed arm ('': none)")
    parser.add_argument("--flower-rounds", type=int, default=6, help="rounds of the Flower timing (0: none)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 6 clients, 2 rounds, seed 0")
    parser.add_argument("--no-write", action="store_true", help="only fill the cache (for split seeds)")
    parser.add_argument("--scratch", type=Path, default=Path("runs/benchmark-federated"))
    parser.add_argument("--out", type=Path, default=RESULTS / "federated.json")
    args = parser.parse_args(argv)
    if args.quick:  # every code path at a tiny budget: --flower-rounds 0 still skips the Flower timing
        args.rounds, args.clients, args.seeds = 2, 6, "0"
        args.flower_rounds = min(args.flower_rounds, 3)
    per_seed = []
    ablation = [int(s) for s in args.ablation_seeds.split(",") if s]
    for data in args.data.split(","):
        for seed in map(int, args.seeds.split(",")):
            ours = _run(_config(data, seed, args), "partitioned", args.scratch)
            base = _run(_config(data, seed, args, "baseline"), "baseline", args.scratch)
            row = _seed_row(data, seed, ours, base)
            if seed in ablation:
                fixed = _run(_config(data, seed, args, "partitioned-fixed"), "partitioned-fixed", args.scratch)
                row["partitioned_fixed_last"] = mean_of_last(fixed["curve"], "test-accuracy")
            per_seed.append(row)
    if args.no_write:
        return per_seed
    rows = [_summary(d, [s for s in per_seed if s["data"] == d]) for d in args.data.split(",")]
    for row in rows:
        print(
            f"{row['data']}: mean of the last {LAST_EVALUATIONS} evaluations, partitioned "
            f"{row['partitioned_last']:.3f} (averaged {row['partitioned_last_averaged']:.3f}), baseline "
            f"{row['baseline_last']:.3f} (at the partitioned run's bytes {row['baseline_last_at_bytes']:.3f}); "
            f"rotation {row['rotation']}"
        )
    timings = _flower_seconds(args) if args.flower_rounds > 2 else {}
    _plot(per_seed, args.out.with_suffix(".png"))
    config = {k: v for k, v in vars(args).items() if k not in ("out", "scratch", "quick", "no_write")}
    config["defaults"] = _config("rotdigits", 0, args).run_config()
    write_results(args.out, results(header("federated", quick=args.quick), {**config, "timings": timings}, rows,
                                    runs=per_seed))  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
