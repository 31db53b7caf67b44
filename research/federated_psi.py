"""Can psi's learning rate alone carry the federated rotation range to the truth on every seed?

``partition-fx federated``'s defaults learn rotdigits' rotation to 1.8-2.0 rad of pi: after the warm-up (rounds
1-40) and before the fine-tuning rounds (121-200), psi takes 80 Adam steps at 0.03 from pi/2. This runs the
defaults and the defaults with psi's rate doubled to 0.06 (20x the server's, the cap of ``scaled_hyper_lr``), on
rotdigits (target: at least 2.5 rad) and digits (at most 0.3), over the same seeds and clients as
``benchmarks/federated.py``'s partitioned arm (each client keeps 15% aside, the runs' validation accuracy), and
records each run's final rotation, its final model's accuracy and psi's trajectory.

    python -m research.federated_psi                 # seeds 0, 1, 2: 12 runs of about 5 minutes on one thread
    python -m research.federated_psi --quick         # a smoke run; writes nothing

Runs are cached in ``--scratch`` as the benchmark's (give it the benchmark's to reuse its runs of the defaults).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import header, results, write_results
from benchmarks.federated import cached_run, final_accuracy
from partition_fx.federated import FederatedConfig
from research import RESULTS

RATES: dict[str, float | None] = {"default (0.03)": None, "0.06": 0.06}
"""psi's server learning rate: the default's (``scaled_hyper_lr`` of 200 rounds) and twice it."""
TARGETS = {"rotdigits": (">=", 2.5), "digits": ("<=", 0.3)}
"""The learned rotation's targets (radians): the truth is pi on rotated digits, 0 on upright ones."""


def _meets(data: str, rotation: float) -> bool:
    sense, bound = TARGETS[data]
    return rotation >= bound if sense == ">=" else rotation <= bound


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--validation", type=float, default=0.15, help="each client's validation share")
    parser.add_argument("--quick", action="store_true", help="6 clients, 4 rounds, seed 0; writes nothing")
    parser.add_argument("--scratch", type=Path, default=Path("runs/benchmark-federated"))
    parser.add_argument("--out", type=Path, default=RESULTS / "federated_psi.json")
    args = parser.parse_args(argv)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    budget = {"clients": 6, "rounds": 4, "evaluate_every": 2} if args.quick else {}
    runs = []
    for data in TARGETS:
        for rate_name, rate in RATES.items():
            for seed in seeds:
                config = FederatedConfig(data=data, seed=seed, validation=args.validation, hyper_lr=rate, **budget)
                history = cached_run(config, args.scratch)
                rotation = float(history["hyperparameters"]["rotation"])
                runs.append({"data": data, "rate": rate_name, "hyper_lr": config.hyper_lr_value, "seed": seed,
                             "rotation": rotation, "meets": _meets(data, rotation),
                             "test": final_accuracy(history, "test"),
                             "validation": final_accuracy(history, "validation"),
                             "rotation_curve": [[p["round"], p["hyperparameters"]["rotation"]]
                                                for p in history["curve"]]})  # fmt: skip
    rows = []
    for data in TARGETS:
        for rate_name in RATES:
            group = [r for r in runs if r["data"] == data and r["rate"] == rate_name]
            rows.append({"data": data, "rate": rate_name, "rotations": [r["rotation"] for r in group],
                         "meets": sum(r["meets"] for r in group), "runs": len(group),
                         "test": statistics.fmean(r["test"] for r in group)})  # fmt: skip
    for row in rows:
        print(f"{row['data']} psi lr {row['rate']}: rotation {', '.join(f'{v:.2f}' for v in row['rotations'])} "
              f"({row['meets']} of {row['runs']} meet it), test {row['test']:.3f}")  # fmt: skip
    if not args.quick:
        config = {"seeds": seeds, "validation": args.validation, "defaults": FederatedConfig().run_config()}
        write_results(args.out, results(header("federated_psi"), config, rows, runs=runs))
    return rows


if __name__ == "__main__":
    main()
