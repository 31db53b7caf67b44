"""Federated partitioned training (appendix J) against the baselines a federated user has, each at its own good
settings chosen on a validation share of the clients' training data, never on the test split.

For each dataset (``rotdigits``: client skew over 10 rotation bins; ``digits``: label skew) and seed, over the same
clients (each keeps ``--validation`` of its training examples aside; every run trains on the rest):

* ``fedadam``: FedAdam without augmentation, its server learning rate picked from ``--server-lrs`` by the final
  model's validation accuracy;
* ``oracle``: FedAdam with the rotation range fixed at pi (the truth of rotated digits), at the picked rate;
* ``fedex``: a FedEx-style search (Khodak et al. 2021): FedAdam with each rotation of ``--rotations`` fixed, the
  one with the best validation accuracy kept, at the picked rate. Two budgets: ``fedex-equal`` splits the run's
  rounds over the candidates (its total rounds and bytes those of one run), ``fedex`` gives each candidate the
  run's rounds (4 times the rounds and bytes);
* ``partitioned``: ``partition-fx federated``'s defaults (``FederatedConfig``), which choose nothing on validation.

Each arm's accuracy is its final model's (averaged over the test-time augmentations where it has any, and over
the evaluations of the last quarter of the rounds), the test split's read once the settings are chosen.
Differences are paired by seed (same clients, same chunks). Also recorded: the curves against rounds and bytes,
psi's trajectory, seconds per round; ``--lessons`` (on the first seed, and those named by ``--repeat-lessons`` on
every seed): the partitioned run with each of its departures from the paper's federated recipe undone, and with
each alternative to its settings; ``--variants`` (on the first seed): the partitioned run and FedAdam at the
command's defaults on other data and federations (``scaledigits``, Dirichlet 1.0, appendix J's 100 clients of whom
a fifth train each round); ``--paper-cost``: seconds per round at ``examples/federated_paper.yaml``'s settings,
and what its 2000 rounds cost.

    python -m benchmarks.federated [--seeds 0,1,2] [--lessons [--repeat-lessons NAMES]] [--variants] [--paper-cost]

Runs are cached in ``--scratch`` by their config, so an interrupted benchmark resumes, and the seeds can be
split over processes (``--seeds 0`` and ``--seeds 1`` with ``--no-write``, then all seeds to write). What the
results file already holds at the same settings (a seed's arms, a lesson's run, a variant) is kept, with the
commit that measured it, not run again: a further seed adds to the recorded ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import RESULTS, ROOT, git_commit, header, mean_se, results, write_results, write_text
from partition_fx.federated import FederatedConfig, simulate

ROTATIONS = (0.0, math.pi / 4, math.pi / 2, math.pi)
"""The FedEx-style search's candidates (the issue's grid): none, an eighth, a quarter and every angle."""
LESSONS: dict[str, dict[str, Any]] = {
    "no fine-tuning": {"finetune_fraction": 0.0},
    "no psi warm-up": {"warmup_fraction": 0.0},
    "psi lr 3x the server's (9e-3)": {"hyper_lr": 9e-3},
    "psi lr 20x the server's (0.06)": {"hyper_lr": 0.06},
    "wide start (pi)": {"rotation_init": math.pi},
    "psi's gradient from 12 of 20 clients": {"proportions": (0.4, 0.3, 0.3)},
}
"""The partitioned run with one of its defaults changed: the first two set back to the earlier federated recipe's;
then psi's learning rate at the paper's ratio to the server's and at twice the default's 10x (the earlier default's
rate, now after the warm-up), the central path's wide start, and more clients sending psi's gradient (the
default's chunks 2 and 3 are 6 of 20 clients)."""
VARIANTS: dict[str, dict[str, Any]] = {
    "scaledigits": {"data": "scaledigits"},
    "Dirichlet 1.0": {"alpha": 1.0},
    "100 clients, a fifth per round": {"clients": 100, "fraction_train": 0.2},
}
"""Other data and federations, reported at the command's defaults (nothing chosen for them)."""
CHANCE_CEILING = 0.15
"""A final model at or below this test accuracy is counted at chance (ten classes)."""
PAPER = ROOT / "examples" / "federated_paper.yaml"
PAPER_ROUNDS_TIMED = 5
"""Rounds of appendix J's settings timed to cost its whole run."""
MAX_WIDENINGS = 3
"""How many times FedAdam's learning-rate grid may grow past an edge that wins."""
BUDGETS_OUT = RESULTS / "federated_budgets.json"
SETTINGS_KEYS = ("rounds", "clients", "evaluate_every", "validation", "server_lrs", "defaults")
"""What a recorded seed's arms depend on: a results file that agrees on them holds runs this call would repeat."""


def cached_run(config: FederatedConfig, scratch: Path) -> dict[str, Any]:
    """The run's history (client metrics dropped), from the cache when its config matches."""
    key = hashlib.sha256(json.dumps(config.run_config(), sort_keys=True).encode()).hexdigest()[:16]
    path = scratch / f"{config.data}-{config.seed}-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    started = time.perf_counter()
    history = simulate(config).history()
    history.pop("client_train_metrics")
    history["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_text(path, json.dumps(history))  # whole or not at all: an interrupted run is not a cached one
    last = history["curve"][-1]
    psi = "psi learned" if config.learn_hyperparameters else f"rotation {config.rotation_init:.2f}"
    split = "validation" if config.validation else "test"
    print(f"{config.data} seed {config.seed} {psi} lr {config.server_lr} {config.rounds} rounds: {split} "
          f"{last[f'{split}-accuracy-averaged']:.3f} ({history['wall_seconds']} s)", flush=True)  # fmt: skip
    return history


def _defaults(data: str, seed: int, args: argparse.Namespace) -> FederatedConfig:
    """The partitioned run of ``data`` and ``seed``: the command's defaults at the benchmark's budget, with every
    client keeping its validation share."""
    return FederatedConfig(data=data, seed=seed, clients=args.clients, rounds=args.rounds,
                           validation=args.validation, evaluate_every=args.evaluate_every)  # fmt: skip


def final_accuracy(history: dict[str, Any], split: str) -> float:
    """The final model's accuracy on ``split`` (averaged over the test-time augmentations where it has any): the
    mean of the evaluations in the last quarter of the rounds (200 rounds: 160 to 200), which a 220-example
    validation share needs (one evaluation moves by 1/220 per example)."""
    last = [p for p in history["curve"] if p["round"] > 0.75 * history["rounds"]]
    return statistics.fmean(p[f"{split}-accuracy-averaged"] for p in last)


def _at_bytes(history: dict[str, Any], budget: int) -> float:
    """The test accuracy of the last evaluation made within ``budget`` bytes of traffic (NaN: none was)."""
    within = [p for p in history["curve"] if p["bytes"] <= budget]
    return float(within[-1]["test-accuracy-averaged"]) if within else float("nan")


def _recorded(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """What ``--out`` holds that was measured at ``config``'s settings: its seeds' rows by (data, seed), its
    lessons' runs by (data, seed, name), its variants by name (empty where the file is absent or its settings
    differ)."""
    recorded = json.loads(args.out.read_text()) if args.out.is_file() else None
    if recorded is None or any(recorded["config"].get(key) != config[key] for key in SETTINGS_KEYS):
        return {"runs": {}, "lessons": {}, "variants": {}}
    commit = recorded["meta"]["commit"]
    summary = recorded.get("summary", {})
    return {
        "runs": {(r["data"], r["seed"]): {"commit": commit, **r} for r in recorded["runs"]},
        "lessons": {
            (lesson["data"], lesson["seed"], name): {"commit": commit, **run}
            for lesson in summary.get("lessons", [])
            for name, run in lesson["runs"].items()
        },
        "variants": {v["variant"]: {"commit": commit, **v} for v in summary.get("variants", [])},
    }


def tuned_fedadam(
    default: FederatedConfig, args: argparse.Namespace, rotation: float = 0.0
) -> tuple[float, dict[float, dict[str, Any]]]:
    """FedAdam's server learning rate chosen on the clients' validation shares from ``--server-lrs``, the grid
    widened by its own outer ratio past whichever edge wins (at most ``MAX_WIDENINGS`` times) until the chosen
    rate is interior; the rate and every run of the grid. ``rotation``: the rate of FedAdam trained with the
    rotation range fixed there (pi: the oracle's), each arm at its own good rate."""
    baseline = default.baseline(rotation=rotation)
    rates = sorted(args.server_lrs)
    grid = {lr: cached_run(baseline.replace(server_lr=lr), args.scratch) for lr in rates}
    for _ in range(MAX_WIDENINGS):
        lr = max(grid, key=lambda rate: final_accuracy(grid[rate], "validation"))
        edges = sorted(grid)
        if lr not in (edges[0], edges[-1]) or len(edges) < 2:
            break
        step = edges[-1] / edges[-2] if lr == edges[-1] else edges[1] / edges[0]
        wider = float(f"{lr * step:.3g}") if lr == edges[-1] else float(f"{lr / step:.3g}")
        grid[wider] = cached_run(baseline.replace(server_lr=wider), args.scratch)
    lr = max(grid, key=lambda rate: final_accuracy(grid[rate], "validation"))
    return lr, dict(sorted(grid.items()))


def _seed_runs(data: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every arm of one dataset and seed: the runs, what each chose, its test accuracy and cost."""
    default = _defaults(data, seed, args)
    lr, grid = tuned_fedadam(default, args)
    # The augmented arms at the rate tuned for augmented training (the oracle's grid): FedAdam's own can sit at the
    # edge where an augmented model diverges (digits seed 1: 1e-2, at which every rotation ended at chance).
    augmented_lr, oracle_grid = tuned_fedadam(default, args, rotation=math.pi)
    chosen = default.baseline().replace(server_lr=augmented_lr)
    fixed = {r: cached_run(chosen.replace(rotation_init=r), args.scratch) for r in ROTATIONS}
    short = chosen.replace(rounds=args.rounds // len(ROTATIONS))
    fixed_short = {r: cached_run(short.replace(rotation_init=r), args.scratch) for r in ROTATIONS}
    fedex = max(ROTATIONS, key=lambda r: final_accuracy(fixed[r], "validation"))
    fedex_equal = max(ROTATIONS, key=lambda r: final_accuracy(fixed_short[r], "validation"))
    ours = cached_run(default, args.scratch)
    arms = {
        "partitioned": (ours, [ours]),
        "fedadam": (grid[lr], list(grid.values())),
        "oracle": (fixed[math.pi], [fixed[math.pi]]),
        "fedex-equal": (fixed_short[fedex_equal], list(fixed_short.values())),
        "fedex": (fixed[fedex], list(fixed.values())),
    }
    budget = ours["curve"][-1]["bytes"]
    row: dict[str, Any] = {"data": data, "seed": seed, "commit": git_commit(), "server_lr": lr,
                           "augmented_server_lr": augmented_lr, "fedex_rotation": fedex,
                           "fedex_equal_rotation": fedex_equal}  # fmt: skip
    for arm, (history, spent) in arms.items():
        row[arm] = {
            "test": final_accuracy(history, "test"),
            "test_plain_final": float(history["curve"][-1]["test-accuracy"]),
            "validation": final_accuracy(history, "validation"),
            "rounds": sum(h["rounds"] for h in spent),
            "bytes": sum(h["bytes_up"] + h["bytes_down"] for h in spent),
            "run_bytes": history["bytes_up"] + history["bytes_down"],
            "seconds_per_round": history["seconds_per_round"],
            "test_at_partitioned_bytes": _at_bytes(history, budget),
        }
    row["hyperparameters"] = ours["hyperparameters"]
    row["curves"] = {
        arm: [[p["round"], p["bytes"], p["test-accuracy-averaged"]] for p in history["curve"]]
        for arm, (history, _) in arms.items()
    }
    row["rotation_curve"] = [[p["round"], p["hyperparameters"].get("rotation")] for p in ours["curve"]]
    row["server_lr_grid"] = {str(rate): final_accuracy(h, "validation") for rate, h in grid.items()}
    row["oracle_server_lr_grid"] = {str(rate): final_accuracy(h, "validation") for rate, h in oracle_grid.items()}
    return row


def _outcome(history: dict[str, Any]) -> dict[str, Any]:
    """A run's final model on test and validation, its learned rotation and its cost."""
    return {"commit": git_commit(), "test": final_accuracy(history, "test"),
            "validation": final_accuracy(history, "validation"),
            "rotation": history["hyperparameters"].get("rotation"), "hyperparameters": history["hyperparameters"],
            "bytes": history["bytes_up"] + history["bytes_down"],
            "seconds_per_round": history["seconds_per_round"]}  # fmt: skip


def _lessons(
    data: str, seed: int, names: list[str], args: argparse.Namespace, recorded: dict[Any, Any]
) -> dict[str, Any]:
    """The partitioned run with each lesson of ``names`` undone, and the defaults' run it pairs with: test and
    validation accuracy, final rotation."""
    default = _defaults(data, seed, args)
    rows = {}
    for name, change in {"defaults": {}, **{name: LESSONS[name] for name in names}}.items():
        kept = recorded.get((data, seed, name))
        rows[name] = kept or _outcome(cached_run(default.replace(**change), args.scratch))
    return {"data": data, "seed": seed, "runs": rows}


def _variant(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The partitioned run and FedAdam at the command's defaults (server lr 3e-3, the grid's choice on both data
    sets' every seed), on other data or another federation."""
    partitioned = _defaults("rotdigits", seed, args).replace(**VARIANTS[name])
    runs = {"partitioned": partitioned, "fedadam": partitioned.baseline()}
    return {"variant": name, "seed": seed, "data": partitioned.data,
            **{arm: _outcome(cached_run(config, args.scratch)) for arm, config in runs.items()}}  # fmt: skip


def budget_row(data: str, seed: int, rounds: int, args: argparse.Namespace) -> dict[str, Any]:
    """The command's defaults at ``rounds`` against FedAdam tuned at the same rounds (its rate widened until
    interior): the partitioned run, the model the command hands back (the baseline's at the command's server rate
    when psi learned nothing), FedAdam's; each one's test and validation accuracy, the handed-back model's paired
    difference, psi's warm-up (the round psi began, or the note of a run whose psi learned nothing) and the
    learned ranges."""
    default = _defaults(data, seed, args).replace(rounds=rounds, evaluate_every=max(1, rounds // 20))
    lr, grid = tuned_fedadam(default, args)
    ours = cached_run(default, args.scratch)
    warmup = {key: ours.get("warmup", {}).get(key) for key in ("started_at", "partitioned_ended_at", "note")}
    handed_back = cached_run(default.baseline(), args.scratch) if warmup["note"] else ours
    return {
        "data": data, "seed": seed, "rounds": rounds, "commit": git_commit(), "server_lr": lr,
        "server_lr_grid": {f"{rate:g}": final_accuracy(h, "validation") for rate, h in grid.items()},
        "partitioned": _outcome(ours), "handed_back": _outcome(handed_back), "fedadam": _outcome(grid[lr]),
        "difference": 100 * (final_accuracy(handed_back, "test") - final_accuracy(grid[lr], "test")),
        "partitioned_difference": 100 * (final_accuracy(ours, "test") - final_accuracy(grid[lr], "test")),
        "warmup": warmup,
        "rotation_curve": [[p["round"], p["hyperparameters"].get("rotation")] for p in ours["curve"]],
    }  # fmt: skip


def budget_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per data set and rounds: each arm's mean ± SE, the paired differences to FedAdam (points) of the handed-back
    model and of the partitioned run, the handed-back model's worst seed's, how many partitioned runs ended at
    chance (at most 0.15) and how many learned nothing (psi never began)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["data"], row["rounds"]), []).append(row)
    return [
        {"data": data, "rounds": rounds, "seeds": [r["seed"] for r in group],
         "partitioned": mean_se([r["partitioned"]["test"] for r in group]),
         "handed_back": mean_se([r["handed_back"]["test"] for r in group]),
         "fedadam": mean_se([r["fedadam"]["test"] for r in group]),
         "partitioned_difference": mean_se([r["partitioned_difference"] for r in group]),
         "difference": mean_se([r["difference"] for r in group]), "worst": min(r["difference"] for r in group),
         "at_chance": sum(r["handed_back"]["test"] <= CHANCE_CEILING for r in group),
         "partitioned_at_chance": sum(r["partitioned"]["test"] <= CHANCE_CEILING for r in group),
         "learned_nothing": sum(r["warmup"]["started_at"] is None for r in group),
         "rotation": [r["partitioned"]["rotation"] for r in group],
         "server_lrs": [r["server_lr"] for r in group]}
        for (data, rounds), group in sorted(groups.items())
    ]  # fmt: skip


def _paper_cost(scratch: Path) -> dict[str, Any]:
    """Seconds per round of appendix J's settings (``examples/federated_paper.yaml``) timed over a few rounds,
    and what its full run costs at that pace, both arms."""
    paper = FederatedConfig().replace(**yaml.safe_load(PAPER.read_text()))  # an unknown key is refused by name
    timed = paper.replace(rounds=PAPER_ROUNDS_TIMED, evaluate_every=PAPER_ROUNDS_TIMED)
    cost: dict[str, Any] = {"rounds": paper.rounds, "timed_rounds": PAPER_ROUNDS_TIMED, "commit": git_commit()}
    for arm, config in {"partitioned": timed, "fedadam": timed.baseline()}.items():
        history = cached_run(config, scratch)
        cost[arm] = {"seconds_per_round": history["seconds_per_round"],
                     "hours": history["seconds_per_round"] * paper.rounds / 3600,
                     "bytes_per_round": (history["bytes_up"] + history["bytes_down"]) / PAPER_ROUNDS_TIMED}  # fmt: skip
    return cost


def _summary(data: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: mean ± SE of test accuracy; the partitioned run's paired differences (points) to each arm."""
    summary: dict[str, Any] = {"data": data, "seeds": [r["seed"] for r in rows]}
    for arm in ("partitioned", "fedadam", "oracle", "fedex-equal", "fedex"):
        summary[arm] = mean_se([r[arm]["test"] for r in rows])
        if arm != "partitioned":
            summary[f"partitioned-minus-{arm}"] = mean_se([100 * (r["partitioned"]["test"] - r[arm]["test"])
                                                            for r in rows])  # fmt: skip
    summary["partitioned-minus-fedadam-at-bytes"] = mean_se(
        [100 * (r["partitioned"]["test"] - r["fedadam"]["test_at_partitioned_bytes"]) for r in rows]
    )
    summary["rotation"] = [r["hyperparameters"].get("rotation") for r in rows]
    summary["traffic_share"] = statistics.fmean(r["partitioned"]["run_bytes"] / r["fedadam"]["run_bytes"]
                                                for r in rows)  # fmt: skip
    return summary


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({r["data"] for r in rows}, reverse=True)
    figure, axes = plt.subplots(len(datasets), 3, figsize=(14, 3.6 * len(datasets)), squeeze=False)
    colours = {"partitioned": "C0", "fedadam": "C1", "oracle": "C2"}
    for axis_row, data in zip(axes, datasets):
        for row in (r for r in rows if r["data"] == data):
            for arm, colour in colours.items():
                curve = row["curves"][arm]
                axis_row[0].plot([p[0] for p in curve], [p[2] for p in curve], color=colour, alpha=0.6)
                axis_row[1].plot([p[1] / 1e6 for p in curve], [p[2] for p in curve], color=colour, alpha=0.6)
            axis_row[2].plot(*zip(*row["rotation_curve"]), color="C0", alpha=0.6)
        axis_row[0].set(title=f"{data}: test accuracy", xlabel="round")
        axis_row[0].legend(handles=[plt.Line2D([], [], color=c, label=a) for a, c in colours.items()])
        axis_row[1].set(title=f"{data}: test accuracy against traffic", xlabel="MB up + down")
        axis_row[2].set(title=f"{data}: learned rotation range (rad)", xlabel="round")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = FederatedConfig()
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--evaluate-every", type=int, default=defaults.evaluate_every)
    parser.add_argument("--validation", type=float, default=0.15, help="each client's validation share")
    parser.add_argument("--server-lrs", default="0.001,0.003,0.01", help="the baseline's server learning rates")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--data", default="rotdigits,digits")
    parser.add_argument("--lessons", action="store_true", help="each lesson undone, on the first seed")
    parser.add_argument("--repeat-lessons", default="", help="lessons (names, comma-separated) run on every seed")
    parser.add_argument("--variants", action="store_true", help="other data and federations, on the first seed")
    parser.add_argument("--paper-cost", action="store_true", help="appendix J's settings timed")
    parser.add_argument(
        "--budgets",
        default="",
        help="rounds (comma-separated): the budget sweep alone, the "
        "partitioned run against FedAdam tuned at each, written to federated_budgets.json",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 6 clients, 4 rounds, seed 0")
    parser.add_argument("--no-write", action="store_true", help="only fill the cache (for split seeds)")
    parser.add_argument(
        "--keep-summary",
        action="store_true",
        help="keep the results file's lessons, variants and paper cost (each names the commit that measured it) "
        "where this call does not measure them",
    )
    parser.add_argument("--scratch", type=Path, default=Path("runs/benchmark-federated"))
    parser.add_argument("--out", type=Path, default=RESULTS / "federated.json")
    args = parser.parse_args(argv)
    repeated = [name for name in args.repeat_lessons.split(",") if name]
    unknown = sorted(set(repeated) - set(LESSONS))
    if unknown:
        parser.error(f"--repeat-lessons: unknown {unknown}; the lessons are {list(LESSONS)}")
    if args.quick:
        args.rounds, args.clients, args.seeds, args.evaluate_every = 4, 6, "0", 2
    args.server_lrs = [float(lr) for lr in args.server_lrs.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    config = {k: v for k, v in vars(args).items() if k not in ("out", "scratch", "quick", "no_write")}
    config["defaults"] = FederatedConfig().run_config()
    if args.budgets:
        return _budgets(args, config, seeds)
    recorded = _recorded(args, config)
    rows = [recorded["runs"].get((data, seed)) or _seed_runs(data, seed, args)
            for data in args.data.split(",") for seed in seeds]  # fmt: skip
    lessons = [
        _lessons(data, seed, list(LESSONS) if seed == seeds[0] else repeated, args, recorded["lessons"])
        for data in args.data.split(",")
        for seed in seeds
        if args.lessons and (seed == seeds[0] or repeated)
    ]
    variants = (
        [recorded["variants"].get(name) or _variant(name, seeds[0], args) for name in VARIANTS] if args.variants else []
    )
    paper_cost = _paper_cost(args.scratch) if args.paper_cost else None
    if args.no_write:
        return rows
    summaries = [_summary(d, [r for r in rows if r["data"] == d]) for d in args.data.split(",")]
    for s in summaries:
        print(f"{s['data']}: partitioned {s['partitioned'][0]:.3f} ± {s['partitioned'][1]:.3f}, fedadam "
              f"{s['fedadam'][0]:.3f}, oracle {s['oracle'][0]:.3f}, fedex {s['fedex'][0]:.3f}; rotation "
              f"{s['rotation']}")  # fmt: skip
    _plot(rows, args.out.with_suffix(".png"))
    summary = {"lessons": lessons, "variants": variants, "paper_cost": paper_cost}
    if args.keep_summary and args.out.is_file():
        kept = json.loads(args.out.read_text()).get("summary", {})
        summary = {key: value or kept.get(key) for key, value in summary.items()}
    write_results(args.out, results(header("federated", quick=args.quick), config, summaries, runs=rows,
                                    summary=summary))  # fmt: skip
    return summaries


def _budgets(args: argparse.Namespace, config: dict[str, Any], seeds: list[int]) -> list[dict[str, Any]]:
    """The budget sweep: every data set, seed and rounds of ``--budgets``; its rows and summary. The results file's
    rows at the same settings for other data, seeds or rounds are kept (each with the commit that measured it), so
    budgets and seeds can be added by later calls."""
    budgets = [int(r) for r in args.budgets.split(",")]
    rows = [budget_row(data, seed, rounds, args) for rounds in budgets for data in args.data.split(",")
            for seed in seeds]  # fmt: skip
    if args.no_write:
        return rows
    out = BUDGETS_OUT if args.out == RESULTS / "federated.json" else args.out
    recorded = json.loads(out.read_text()) if out.is_file() else None
    settings = ("clients", "validation", "server_lrs", "defaults")
    if recorded is not None and all(recorded["config"].get(key) == config[key] for key in settings):
        measured = {(r["data"], r["seed"], r["rounds"]) for r in rows}
        rows = [r for r in recorded["runs"] if (r["data"], r["seed"], r["rounds"]) not in measured] + rows
    rows.sort(key=lambda r: (r["rounds"], r["data"], r["seed"]))
    summaries = budget_summary(rows)
    for s in summaries:
        print(f"{s['data']} {s['rounds']} rounds: partitioned {s['partitioned'][0]:.3f}, fedadam "
              f"{s['fedadam'][0]:.3f}, difference {s['difference'][0]:+.1f} ± {s['difference'][1]:.1f} (worst "
              f"{s['worst']:+.1f}), at chance {s['at_chance']}, learned nothing {s['learned_nothing']}")  # fmt: skip
    config = {**config, "budgets": sorted({r["rounds"] for r in rows}), "seeds": "per row"}
    write_results(out, results(header("federated_budgets", quick=args.quick), config, summaries, runs=rows))
    return summaries


if __name__ == "__main__":
    main()
