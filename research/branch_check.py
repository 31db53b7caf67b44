"""Does the conditional LML reward a wider range once the weights have trained on it? A gradient-free check.

The hyper-gradient at fixed weights (the default) and the one through training (implicit differentiation) are
estimates of one derivative: of the conditional LML (chunk k scored by subnetwork k-1, k = 2..C) with respect to the
range, the weights being what training on that range produces. This check measures that derivative without a
gradient: the default job's partitioned model is trained with one range FIXED at r (``--generator``, the rotation by
default; every other range at 0) for ``--steps`` iterations, then the run's last ``--branch`` iterations are run
three times from that state, with the range at r e^-delta, r and r e^+delta, on the same examples and the same
augmentation draws (common random numbers), and each branch's weights are scored by the conditional LML (a midpoint
rule over the generator's coefficient, the same for every score: ``research.probes``). Its secant has two
parts, which add up to it to first order (the rest is the cross term: weights trained on a wider range lose less
when scored wider):

* ``total``: the weights trained at r e^+-delta, scored at r e^+-delta: the objective the hyperparameter follows;
* ``through``: the weights trained at r e^+-delta, scored at r: what the range does through training;
* ``direct``: the weights trained at r, scored at r e^+-delta: what the range does at fixed weights.

Beside them, at the middle branch's weights, the derivatives the estimators follow (``research.probes``):
at fixed weights and with the implicit term (a Neumann series of K terms). Each repeat continues the run on other
examples and other draws; the rows give each repeat, the summary their means with standard errors.

    python -m research.branch_check            # rotdigits at 0.5 and 1.5, digits at 0.5; seeds 0 and 1
    # branches of the whole run, from the initialisation (research/results/branch_check_whole_run.json):
    python -m research.branch_check --steps 0 --branch 360 --repeats 2 --seeds 0 --out FILE
    python -m research.branch_check --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from typing import Any

import torch

from benchmarks.common import header, results, write_results
from partition_fx import PartitionedModel
from partition_fx.training import PartitionedBatchSampler, TrainingSteps
from partition_fx.transforms import AffineAugmentation
from research import RESULTS
from research.fixed_range import train_at_fixed_range, train_draws
from research.probes import SAMPLES, conditional_lml, derivatives

SIGNS = (0, -1, 1)
"""The branches: the range at r e^(sign delta), the middle one first."""


def _state(pmodel: PartitionedModel, steps: TrainingSteps) -> dict[str, Any]:
    return copy.deepcopy({"model": pmodel.state_dict(), "stepper": steps.stepper.state_dict(), "step": steps.step})


def _restore(pmodel: PartitionedModel, steps: TrainingSteps, state: dict[str, Any]) -> None:
    state = copy.deepcopy(state)  # an optimiser loads its state's tensors as they are: the branch would step them
    pmodel.load_state_dict(state["model"])
    steps.stepper.load_state_dict(state["stepper"])
    steps.step = state["step"]


def run(data: str, r: float, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    generator = args.generator
    fixed = train_at_fixed_range(
        data, generator, r, seed, steps=args.steps, image_size=args.image_size, total=args.steps + args.branch
    )
    pmodel, config, aug, steps = fixed.pmodel, fixed.job.config, fixed.job.hyper, fixed.steps
    x, y, chunks, trained = fixed.x, fixed.y, fixed.chunks, fixed.seconds
    base = _state(pmodel, steps)
    # every repeat's continuation: the run's last iterations drawn with its own seed (other examples), and its own
    # augmentation draws; the same in the three branches of a repeat
    continuations = [
        list(
            PartitionedBatchSampler(
                chunks, config.replace(seed=1000 * seed + repeat + 1), hyperparameters=False, start=args.steps
            ).draws()
        )
        for repeat in range(args.repeats)
    ]
    ranges = {sign: r * math.exp(sign * args.delta) for sign in SIGNS}
    others = [value for name, value in aug.hyperparameters().items() if name != generator]
    assert not any(others), f"the branches change the {generator} alone; the job's other ranges are {others}"
    rows = []
    for repeat, continuation in enumerate(continuations):
        started = time.perf_counter()
        scores: dict[tuple[int, int], float] = {}  # (trained at, scored at) -> conditional LML
        for trained_at in SIGNS:
            _restore(pmodel, steps, base)
            fixed.set_range(ranges[trained_at])  # every other range stays at 0
            torch.manual_seed(1000 * seed + repeat)  # the same draws in every branch of this repeat
            train_draws(steps, continuation, x, y)
            for scored_at in SIGNS if trained_at == 0 else (0, trained_at):
                scores[trained_at, scored_at] = conditional_lml(pmodel, generator, ranges[scored_at], x, y, chunks)
            if trained_at == 0:  # what the estimators see at the middle branch's weights
                probe = AffineAugmentation(num_samples=SAMPLES, generators=[generator],
                                           init={generator: r}, max_range={generator: 4.0})  # fmt: skip
                probe.train()
                found = derivatives(pmodel, probe, x, y, chunks, args.alpha, args.neumann, inner_size=256, seed=seed)
        width = ranges[1] - ranges[-1]
        rows.append({
            "data": data, "generator": generator, "r": r, "seed": seed, "repeat": repeat,
            "total": (scores[1, 1] - scores[-1, -1]) / width,
            "through": (scores[1, 0] - scores[-1, 0]) / width,
            "direct": (scores[0, 1] - scores[0, -1]) / width,
            **found,
            "scores": {f"{a:+d}{b:+d}": value for (a, b), value in scores.items()},
            "train_seconds": round(trained, 1), "branch_seconds": round(time.perf_counter() - started, 1),
        })  # fmt: skip
    return rows


def _case(row: dict[str, Any]) -> tuple[str, str, float]:
    """What a row measures: its data, the range varied (rows written before ``--generator`` varied the rotation)
    and r."""
    return row["data"], row.get("generator", "rotation"), row["r"]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (data, generator, r): each derivative's mean over seeds and repeats, its standard error, and how many
    are > 0."""
    keys = [k for k in rows[0] if k in ("total", "through", "direct", "fixed") or k.startswith("implicit_")]
    out = []
    for case in dict.fromkeys(map(_case, rows)):
        group = [row for row in rows if _case(row) == case]
        entry: dict[str, Any] = {"data": case[0], "generator": case[1], "r": case[2], "n": len(group)}
        for key in keys:
            values = [row[key] for row in group]
            se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
            entry[key] = {"mean": statistics.fmean(values), "se": se, "positive": sum(v > 0 for v in values)}
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--configs", nargs="+", default=["rotdigits:0.5", "rotdigits:1.5", "digits:0.5"],
                        help="DATA:R, the data and the range r the branches start from")  # fmt: skip
    parser.add_argument(
        "--generator", default="rotation", help="the range the branches vary (default: rotation; scale: Augerino's set)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=240, help="iterations before the branches (default: 240)")
    parser.add_argument("--branch", type=int, default=120, help="iterations of each branch (default: 120)")
    parser.add_argument("--repeats", type=int, default=3, help="branch triples per run (default: 3)")
    parser.add_argument("--delta", type=float, default=0.4, help="the branches' log-range offset (default: 0.4)")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=0.01, help="the Neumann series' step (default: 0.01)")
    parser.add_argument("--neumann", nargs="+", type=int, default=[0, 5])
    parser.add_argument("--out", default=str(RESULTS / "branch_check.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.configs, args.seeds, args.steps, args.branch, args.repeats, args.image_size, args.neumann = (
            ["rotdigits:0.5"], [0], 3, 2, 2, 8, [0],
        )  # fmt: skip
    rows = []
    for entry in args.configs:
        data, r = entry.split(":")
        for seed in args.seeds:
            for row in run(data, float(r), seed, args):
                rows.append(row)
                shown = ", ".join(f"{k} {row[k]:+.2f}" for k in ("total", "through", "direct", "fixed"))
                print(
                    f"{data} {args.generator} r={float(r):.2f} seed {seed} repeat {row['repeat']}: {shown}", flush=True
                )
    result = results(header("branch_check", quick=args.quick), vars(args), rows)
    result["summary"] = {"derivatives": summary(rows)}
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
