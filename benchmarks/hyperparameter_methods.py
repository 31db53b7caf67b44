"""Partitioned hyperparameter learning side by side with what users would do instead, on one budget.

For each (task, model) pair and seed, every method trains the same model from the same initial weights for
the same iterations, batch, augmentation samples and learning rates (``methods.Budget``):

1. ``plain``: no augmentation;
2. ``hand_chosen``: a FIXED augmentation picked by hand (rotdigits: full rotation, the oracle; digits:
   +-15 degrees and +-10% shifts, the usual MNIST choice; scattered: the ranges the data was generated with);
3. ``partitioned`` / ``partitioned_fused``: this project (C=3, 0.8/0.1/0.1; the paper's iteration scheme, and
   fused steps with every partition every iteration), learning the six affine ranges by the LML;
   ``partitioned_finetuned``: the paper scheme whose last iterations (`partition-fx train`'s default
   share, ``Budget.finetune_steps``) fine-tune the final model on all the data with the ranges frozen;
   ``partitioned_occam`` / ``partitioned_occam_finetuned``: the same two with the whole network's Occam term in
   the hyperparameter step (``occam_term="whole"``);
4. ``augerino`` / ``augerino_unsafe``: Benton et al. 2020 (``methods.augerino_loss``), safe and unsafe, with
   the authors' regulariser strength 0.01; ``augerino_unsafe_strong``: unsafe with strength 1.0;
5. ``validation``: the ranges stepped on the loss of a held-out last chunk (10%) through the model trained
   on the other 90%; ``validation_finetuned``: the same, its last iterations (as many as
   ``partitioned_finetuned``'s) training on all the data with the ranges frozen (the paper's Table 2);
   ``lila``: LILA (Immer, van der Ouderaa et al. 2022): plain training on all the data, the ranges stepped on the
   Laplace evidence of the invariant model at the weights as they are (``methods.lila_evidence``; the project's
   own Kronecker factors, as laplace-torch's cannot put the views in a convolution's weight-sharing dimension);
6. ``optuna``: TPE (seeded) over the six ranges, ``--trials`` full plain runs on the 90% split, each scored
   by its validation log-likelihood; reported: the best trial's model, the total cost and the best trial's;
7. ``retrain_partitioned`` / ``retrain_optuna``: plain runs from scratch on all training data with the ranges
   the partitioned run (same seed) or the best Optuna trial found (appendix G's retraining check).

Every run's final model is also scored averaged over ``--test-time-samples`` fixed transforms of its final
ranges (``averaged_test_accuracy``, as ``partition-fx train`` reports it), so methods compare like with like
with and without test-time averaging; with every range 0 (plain) the average is the model's own prediction.

Tasks: ``rotdigits`` and ``digits`` (16 px) and ``scattered``: digits at random sizes and positions on a
20 px canvas, written as an image folder (``partition_fx.datasets.write_scattered_digits``) and loaded back
with ``image_folder``. The test split is touched only to report; nothing is chosen on it. Every run is
cached as JSON under ``--runs``, so an interrupted benchmark resumes.

The per-run table gives each learned range (rotation; translation: the mean of x and y; zoom: the mean
of the two scales) as ``min / median / max`` over the seeds: the smallest, middle and largest value the
runs ended with, so one outlying seed shows as such instead of widening a standard deviation. Every method
that learns ranges (``partitioned*``, ``augerino*``, ``validation*``) also records their trajectory, about
ten points per run (``ranges_trajectory`` in each run's JSON, ``ranges_trajectories`` in the rows).

Figures: ``<out>_trajectories.png``, one row per task (its first model) and one column per learning method
(partitioned, its fine-tuned variant, validation, its fine-tuned variant, Augerino) among those run: the
task's main learned range (rotation on rotdigits and digits, the mean of the x and y translations on
scattered) against the iteration, one line per seed, the true value dashed (digits has no invariance: 0,
labelled "none"); and the paper's figure 9 for rotdigits (``<out>_rotation.png``): test accuracy of
fixed-rotation plain runs against the rotation range, with the partitioned runs' trajectories on top.
Prints the tables and writes ``benchmarks/results/hyperparameter_methods.{json,md}`` and the figures beside
them.

    python -m benchmarks.hyperparameter_methods [--jobs 2] [--seeds 0,1,2,3,4] [--trials 20] [--steps 400]
        [--pairs rotdigits:test_resnet,...] [--methods plain,partitioned,...] [--init zero] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

import torch

from benchmarks import methods, tables
from benchmarks.common import RESULTS, header, summary, write_results, write_text
from benchmarks.common import results as results_object
from benchmarks.tables import STRONG_AUGERINO

DEFAULT_PAIRS = ",".join(
    [
        "rotdigits:test_resnet",
        "rotdigits:fixup_resnet8",
        "digits:test_resnet",
        "digits:fixup_resnet8",
        "scattered:test_resnet",
    ]
)
LEARNING = [
    "plain", "hand_chosen", "partitioned", "partitioned_finetuned", "partitioned_fused", "partitioned_occam",
    "partitioned_occam_finetuned", "augerino", "augerino_unsafe", "augerino_unsafe_strong", "validation",
    "validation_finetuned", "lila",
]  # fmt: skip
RETRAINED = ["retrain_partitioned", "retrain_optuna"]
ALL_METHODS = [*LEARNING, "optuna", *RETRAINED]
# the columns of the trajectories figure, when run
TRAJECTORY_METHODS = ["partitioned", "partitioned_finetuned", "validation", "validation_finetuned", "augerino"]
SWEEP = [math.pi / 8, math.pi / 4, math.pi / 2, 3 * math.pi / 4]  # plus 0 (plain) and pi (hand-chosen)
QUICK = {"steps": 4, "batch_size": 8, "samples": 2}
AVERAGED = ("averaged_test_accuracy", "averaged_test_log_likelihood")


@cache
def load_task(name: str, image_size: int, folder: str) -> methods.Task:
    from partition_fx.datasets import image_folder, load_dataset, named_dataset

    if name == "scattered":
        truth = json.loads((Path(folder) / "invariances.json").read_text())
        ranges = {"translation_x": truth["translation_x"], "translation_y": truth["translation_y"]}
        ranges |= {"scale_x": truth["scale"], "scale_y": truth["scale"]}
        return methods.Task(name, image_folder(folder, channels=1), ranges, ranges | {"rotation": 0.0})
    data = load_dataset(name, size=image_size)
    truth = dict(named_dataset(name).true_ranges or {})  # rotdigits: every angle; digits: none
    if name == "rotdigits":  # the hand-chosen augmentation is the truth (the oracle)
        return methods.Task(name, data, dict(truth), truth)
    return methods.Task(name, data, {"rotation": math.radians(15), "translation_x": 0.1, "translation_y": 0.1}, truth)


def _scattered_folder(runs: Path, quick: bool) -> str:
    from partition_fx.datasets import write_scattered_digits

    folder = runs / "scattered_digits"
    if not (folder / "invariances.json").is_file():
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        kwargs = {"size": 10, "side_range": (4, 6), "max_shift": 2} if quick else {}
        write_scattered_digits(folder, **kwargs)
    return str(folder)


def learns_ranges(method: str) -> bool:
    """Whether ``method`` learns the ranges while it trains (so its runs record their trajectory)."""
    return method.startswith(("partitioned", "augerino", "validation", "lila"))


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One cached run: ``job`` names the method, task, model, seed and budget; returns JSON."""
    path = Path(job["path"])
    if path.is_file():
        cached = json.loads(path.read_text())
        # runs cached before trajectories were recorded are trained again
        complete = not learns_ranges(job["method"]) or "ranges_trajectory" in cached
        if cached.get("job") == {k: v for k, v in job.items() if k != "path"} and complete:
            return cached
    torch.set_num_threads(1)
    task = load_task(job["task"], job["image_size"], job["folder"])
    budget = methods.Budget(**job["budget"])
    method, seed, model = job["method"], job["seed"], job["model"]
    record: dict[str, Any] = {}
    if method == "optuna":
        result = _optuna(task, model, seed, budget, job["trials"], record)
    elif method.startswith("partitioned"):
        trajectory: list[dict[str, Any]] = []

        def on_evaluation(final: torch.nn.Module, evaluation: dict[str, Any]) -> None:
            accuracy, _ = methods.evaluate(final, task.data)
            trajectory.append({"step": evaluation["step"], "test_accuracy": accuracy, **evaluation["hyperparameters"]})

        result = methods.train_partitioned(
            task,
            model,
            seed,
            budget,
            fused=method == "partitioned_fused",
            on_evaluation=on_evaluation,
            finetune_steps=budget.finetune_steps() if method.endswith("_finetuned") else 0,
            occam="occam" in method,
        )
        record.update(lml=result["lml"], history=result["history"], trajectory=trajectory)
    else:
        base = {"augerino_unsafe_strong": "augerino_unsafe", "validation_finetuned": "validation"}.get(method, method)
        learn = base if base in ("augerino", "augerino_unsafe", "validation", "lila") else None
        strength = job.get("augerino_strength", methods.AUGERINO_STRENGTH)
        result = methods.train_plain(
            task,
            model,
            seed,
            budget,
            augmentation=job.get("augmentation"),
            learn=learn,
            augerino_strength=strength,
            finetune_steps=budget.finetune_steps() if method == "validation_finetuned" else 0,
            trajectory_every=max(1, budget.steps // 10) if learn is not None else None,
        )
        record["diverged_at"] = result["diverged_at"]
    if learns_ranges(method):
        # the learned ranges along training ("trajectory" of partitioned runs holds their test accuracy)
        record["ranges_trajectory"] = result["trajectory"]
    accuracy, loglik = methods.evaluate(result["model"], task.data)
    averaged_accuracy, averaged_loglik = methods.evaluate_averaged(
        result["model"], task.data, result["hyperparameters"], job["test_time_samples"]
    )
    record.update(
        job={k: v for k, v in job.items() if k != "path"},
        test_accuracy=accuracy,
        test_log_likelihood=loglik,
        averaged_test_accuracy=averaged_accuracy,
        averaged_test_log_likelihood=averaged_loglik,
        hyperparameters=result["hyperparameters"],
        passes=result["passes"],
        seconds=round(result["seconds"], 2),
        steps=result["steps"],
    )
    write_text(path, json.dumps(record, indent=1) + "\n")
    return record


def _optuna(task: methods.Task, model: str, seed: int, budget: methods.Budget, trials: int, record: dict) -> dict:
    """A TPE study over the six ranges; each trial a plain run on the 90% split scored on the validation
    chunk. Returns the best trial's run (its model is the one reported) with the study's total cost."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x_all, y_all = task.data.train.tensors
    train, validation = methods.validation_split(len(x_all), seed)
    best: dict[str, Any] = {}
    history = []

    def objective(trial: optuna.Trial) -> float:
        bounds = {name: methods.DEFAULT_MAX_RANGE[name] for name in methods.GENERATORS}
        ranges = {name: trial.suggest_float(name, 0.0, bound) for name, bound in bounds.items()}
        run = methods.train_plain(task, model, seed, budget, augmentation=ranges, train_indices=train)
        accuracy, loglik = methods.evaluate(run["model"], task.data, x_all[validation], y_all[validation])
        history.append(
            {"ranges": ranges, "validation_accuracy": accuracy, "validation_log_likelihood": loglik}
            | {"seconds": round(run["seconds"], 2), "passes": run["passes"]}
        )
        if not best or loglik > best["validation_log_likelihood"]:
            best.update(run, validation_log_likelihood=loglik, validation_accuracy=accuracy, trial=trial.number)
        return loglik

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=trials)
    totals = {key: sum(t["passes"][key] for t in history) for key in history[0]["passes"]}
    record.update(
        trials=history,
        best_trial=best["trial"],
        best_trial_seconds=round(best["seconds"], 2),
        best_trial_passes=best["passes"],
        validation_log_likelihood=best["validation_log_likelihood"],
        validation_accuracy=best["validation_accuracy"],
    )
    return best | {"seconds": sum(t["seconds"] for t in history), "passes": totals}


def _budget(args: argparse.Namespace) -> dict[str, Any]:
    """The ``methods.Budget`` fields the options set (``init`` only where not the default, so runs cached before it
    existed are still found)."""
    budget = QUICK if args.quick else {"steps": args.steps, "batch_size": args.batch_size, "samples": args.samples}
    return budget | ({"init": args.init} if args.init != methods.Budget.init else {})


def _jobs(args: argparse.Namespace, folder: str, results: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """Every run of the first phase (``results is None``) or the retraining phase (needs the first's)."""
    budget = _budget(args)
    jobs = []

    def job(method: str, task: str, model: str, seed: int, name: str | None = None, **extra: Any) -> None:
        size = _image_size(args, task)
        path = args.runs / task / model / f"{name or method}_s{seed}.json"
        # the whole recipe the run trains with is part of the cache key: a run of another default is not reused
        planned = methods.Budget(**budget)
        recipe = planned.recipe(planned.finetune_steps() if method.endswith("_finetuned") else 0,
                                occam_term="whole" if "occam" in method else "none")  # fmt: skip
        extra["recipe"] = json.loads(json.dumps(recipe.to_dict()))
        if method == "lila":  # its evidence step's settings
            extra["lila"] = {"burn_in": methods.LILA_BURN_IN, "every": methods.LILA_EVERY,
                             "examples": methods.LILA_EXAMPLES, "samples": methods.LILA_SAMPLES}  # fmt: skip
        jobs.append(
            {"method": method, "task": task, "model": model, "seed": seed, "image_size": size, "folder": folder}
            | {"budget": budget, "test_time_samples": args.test_time_samples, "path": str(path), **extra}
        )

    for task, model in args.pairs:
        hand = load_task(task, _image_size(args, task), folder).hand_chosen
        if results is None:
            for seed in args.seeds:
                for method in (m for m in LEARNING if m in args.methods):
                    extra = {"augerino_strength": STRONG_AUGERINO} if method == "augerino_unsafe_strong" else {}
                    job(method, task, model, seed, augmentation=hand if method == "hand_chosen" else None, **extra)
            if "optuna" in args.methods:
                job("optuna", task, model, args.seeds[0], trials=args.trials)
            continue
        for seed in args.seeds:
            if "retrain_partitioned" in args.methods:
                found = results[_key("partitioned", task, model, seed)]["hyperparameters"]
                job("retrain", task, model, seed, name="retrain_partitioned", augmentation=found)
            if "retrain_optuna" in args.methods:
                best = results[_key("optuna", task, model, args.seeds[0])]["hyperparameters"]
                job("retrain", task, model, seed, name="retrain_optuna", augmentation=best)
    if results is None and args.figure:
        task, model = args.pairs[0]
        for value in SWEEP[:1] if args.quick else SWEEP:
            for seed in args.seeds:
                job("fixed", task, model, seed, name=f"rotation_{value:.3f}", augmentation={"rotation": value})
    return jobs


def _image_size(args: argparse.Namespace, task: str) -> int | None:
    """``--image-size`` for the embedded digits; the scattered folder keeps its own size."""
    return None if task == "scattered" else args.image_size


def _key(method: str, task: str, model: str, seed: int) -> str:
    return f"{task}/{model}/{method}_s{seed}"


def _run_all(jobs: list[dict[str, Any]], workers: int) -> dict[str, dict]:
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            records = list(pool.map(run_job, jobs))
    else:
        records = [run_job(job) for job in jobs]
    return {str(Path(job["path"]).relative_to(job["runs"])).removesuffix(".json"): r for job, r in zip(jobs, records)}


def _rows(args: argparse.Namespace, results: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    for task, model in args.pairs:
        for method in args.methods:
            seeds = args.seeds[:1] if method == "optuna" else args.seeds
            runs = [results[_key(method, task, model, seed)] for seed in seeds]
            row: dict[str, Any] = {"task": task, "model": model, "method": method, "seeds": seeds}
            for field in ("test_accuracy", "test_log_likelihood", *AVERAGED, "seconds"):
                row[field] = [r[field] for r in runs]
            row["hyperparameters"] = [r["hyperparameters"] for r in runs]
            row["passes"] = [r["passes"] for r in runs]
            if method.startswith("augerino_unsafe"):
                row["diverged_at"] = [r["diverged_at"] for r in runs]
            if learns_ranges(method):
                row["ranges_trajectories"] = [r["ranges_trajectory"] for r in runs]
            if method == "optuna":
                row |= {k: runs[0][k] for k in ("best_trial", "best_trial_seconds", "best_trial_passes", "trials")}
            rows.append(row)
    return rows


def _plot(args: argparse.Namespace, results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task, model = args.pairs[0]
    fixed = [("plain", 0.0), *((f"rotation_{v:.3f}", v) for v in (SWEEP[:1] if args.quick else SWEEP))]
    fixed.append(("hand_chosen", math.pi))
    xs, means, stds = [], [], []
    for name, value in fixed:
        accuracies = [results[_key(name, task, model, seed)]["test_accuracy"] for seed in args.seeds]
        mean, std = summary(accuracies)
        xs.append(value)
        means.append(mean)
        stds.append(std)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.errorbar(xs, means, yerr=stds, fmt="o-", color="0.4", capsize=3, label="plain, fixed rotation range")
    for i, seed in enumerate(args.seeds):
        trajectory = results[_key("partitioned", task, model, seed)]["trajectory"]
        rotation = [t["rotation"] for t in trajectory]
        accuracy = [t["test_accuracy"] for t in trajectory]
        ax.plot(
            rotation,
            accuracy,
            "-",
            color="tab:blue",
            alpha=0.6,
            label="partitioned, during training" if i == 0 else None,
        )
        ax.plot(
            rotation[-1:],
            accuracy[-1:],
            "*",
            color="tab:blue",
            markersize=12,
            label="partitioned, final" if i == 0 else None,
        )
    if "retrain_partitioned" in args.methods:
        retrained = [results[_key("retrain_partitioned", task, model, seed)] for seed in args.seeds]
        ax.plot(
            [r["hyperparameters"]["rotation"] for r in retrained],
            [r["test_accuracy"] for r in retrained],
            "D",
            color="tab:orange",
            label="plain, retrained with the learned ranges",
        )
    ax.set_xlabel("rotation range (radians)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{task}, {model}: fixed rotation ranges vs the learned one", fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main_quantity(task: str) -> tuple[str, Callable[[dict[str, float]], float]]:
    """The range a task is about, as (axis label, value of a ranges dict): rotation on the digit tasks,
    the mean of the x and y translation ranges on scattered (in ``AffineAugmentation`` units)."""
    if task == "scattered":
        label = "translation range\n(mean of x, y; 1 = half the image)"
        return label, lambda ranges: (ranges.get("translation_x", 0.0) + ranges.get("translation_y", 0.0)) / 2
    return "rotation range (rad)", lambda ranges: ranges.get("rotation", 0.0)


def _plot_trajectories(
    args: argparse.Namespace,
    results: dict[str, dict],
    truths: dict[str, dict[str, float]],
    budget: methods.Budget,
    path: Path,
) -> None:
    """One row per task (its first model), one column per learning method run: the task's main learned
    range against the iteration, one line per seed, the true value dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = [method for method in TRAJECTORY_METHODS if method in args.methods]
    first_models: dict[str, str] = {}
    for task, model in args.pairs:
        first_models.setdefault(task, model)
    tasks = list(first_models)
    fig, axes = plt.subplots(
        len(tasks),
        len(columns),
        figsize=(0.6 + 2.9 * len(columns), 0.8 + 2.5 * len(tasks)),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    colours = plt.get_cmap("tab10").colors
    finetune_from = budget.steps - budget.finetune_steps()
    for i, task in enumerate(tasks):
        model = first_models[task]
        label, pick = _main_quantity(task)
        truth = truths[task]
        true_value = pick(truth) if truth else 0.0
        true_text = "none (no invariance), 0" if not truth else f"{true_value:.2f}"
        true_text += " = π" if math.isclose(true_value, math.pi) else ""
        highest = true_value
        for j, method in enumerate(columns):
            ax = axes[i, j]
            for k, seed in enumerate(args.seeds):
                trajectory = results[_key(method, task, model, seed)]["ranges_trajectory"]
                values = [pick(t) for t in trajectory]
                highest = max([highest, *values])
                ax.plot(
                    [t["step"] for t in trajectory],
                    values,
                    "o-",
                    markersize=2.5,
                    linewidth=1.2,
                    color=colours[k % len(colours)],
                    alpha=0.85,
                    label=f"seed {seed}",
                )
            ax.axhline(true_value, linestyle="--", color="0.3", linewidth=1.0, label="true value")
            ax.text(
                0.03,
                0.96,
                f"true (dashed): {true_text}",
                transform=ax.transAxes,
                va="top",
                fontsize=7,
                color="0.25",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
            )
            if method.endswith("_finetuned"):
                ax.axvline(finetune_from, linestyle=":", color="0.6", linewidth=1.0, label="fine-tuning starts")
            ax.set_title(f"{task} / {model}\n{tables.METHOD_LABELS[method]}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == len(tasks) - 1:
                ax.set_xlabel("iteration", fontsize=8)
        axes[i, 0].set_ylim(0.0, 1.2 * highest if highest > 0 else 0.1)  # room for the truth's label
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("Learned ranges during training (the task's main range; dashed: the data's true value)", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help="task:model,... (first: the figure's pair)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--trials", type=int, default=20, help="Optuna trials per study")
    parser.add_argument("--steps", type=int, default=methods.Budget.steps)
    parser.add_argument("--batch-size", type=int, default=methods.Budget.batch_size)
    parser.add_argument("--samples", type=int, default=methods.Budget.samples)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument(
        "--init", choices=("wide", "zero"), default=methods.Budget.init,
        help="where every learning method's ranges start (zero: partitioned training's parameter steps then train on "
        "the ranges themselves)",
    )  # fmt: skip
    parser.add_argument(
        "--test-time-samples",
        type=int,
        default=8,
        help="fixed transforms of each run's final ranges the averaged test accuracy uses (as partition-fx train's)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes of 1 thread)")
    parser.add_argument("--runs", type=Path, default=Path("runs/hyperparameter_methods"))
    parser.add_argument("--out", type=Path, default=RESULTS / "hyperparameter_methods.json")
    parser.add_argument("--methods", default=",".join(ALL_METHODS), help="a subset, e.g. plain,partitioned")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    wanted = set(args.methods.split(","))
    if wanted - set(ALL_METHODS):
        parser.error(f"--methods: unknown {sorted(wanted - set(ALL_METHODS))}; choose from {','.join(ALL_METHODS)}")
    needs = {"retrain_partitioned": "partitioned", "retrain_optuna": "optuna"}
    if any(method in wanted and needs[method] not in wanted for method in needs):
        parser.error("--methods: retrain_partitioned needs partitioned, retrain_optuna needs optuna")
    args.methods = [m for m in ALL_METHODS if m in wanted]  # in the table's order
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.pairs = [tuple(pair.split(":")) for pair in args.pairs.split(",")]
    if args.quick:
        args.trials, args.image_size = min(args.trials, 2), 8
    # figure 9 needs the fixed-rotation sweep around plain (0) and hand-chosen (pi), and the partitioned runs
    args.figure = args.pairs[0][0] == "rotdigits" and {"plain", "hand_chosen", "partitioned"} <= wanted
    started = time.perf_counter()
    folder = _scattered_folder(args.runs, args.quick)
    first = _jobs(args, folder)
    for job in first:
        job["runs"] = str(args.runs)
    results = _run_all(first, args.jobs)
    second = _jobs(args, folder, results)
    for job in second:
        job["runs"] = str(args.runs)
    results |= _run_all(second, args.jobs)
    written = [Path(job["path"]).stat().st_mtime for job in [*first, *second]]
    rows = _rows(args, results)
    truths = {task: load_task(task, _image_size(args, task), folder).truth for task in dict(args.pairs)}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, runs on 1 thread each, {args.jobs} at a time"
    meta = header("hyperparameter_methods", quick=args.quick, machine=machine)
    # runs are cached: when they were actually trained (their files' first and last write)
    meta["runs_written"] = [
        datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds") for t in (min(written), max(written))
    ]
    config = {
        "budget": _budget(args),
        "image_size": args.image_size,
        "trials": args.trials,
        "test_time_samples": args.test_time_samples,
        "methods": args.methods,
        "true_invariances": truths,
    }
    result = results_object(
        meta,
        config,
        rows,
        summary={
            # cached runs are reused, so this call's wall time says little; the runs' own training time does
            "wall_seconds_this_call": round(time.perf_counter() - started, 1),
            "training_seconds_all_runs": round(sum(r["seconds"] for r in results.values()), 1),
        },
    )
    print(tables.hyperparameter_methods(result) + "\n\n" + tables.hyperparameter_methods_runs(result))
    out = args.out if not args.quick else args.runs / "hyperparameter_methods.json"
    write_results(out, result)
    write_text(
        out.with_suffix(".md"),
        tables.results_markdown(result, tables.hyperparameter_methods, tables.hyperparameter_methods_runs),
    )
    if args.figure:
        _plot(args, results, out.with_name(out.stem + "_rotation.png"))
    if any(method in args.methods for method in TRAJECTORY_METHODS):
        budget = methods.Budget(**config["budget"])
        _plot_trajectories(args, results, truths, budget, out.with_name(out.stem + "_trajectories.png"))
    return result


if __name__ == "__main__":
    main()
