"""The Markdown tables of every benchmark, rendered from its results object (:mod:`benchmarks.common`).

The scripts print these tables and ``python -m benchmarks.report`` puts them into docs/benchmarks.md (and
``python -m research.report`` those of the benchmarks' earlier runs into docs/research.md and docs/history.md), so a
table always shows what its results file holds. Pure Python: rendering needs neither torch nor the package.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks.common import markdown_table, mean_sd, mean_se, provenance

Results = dict[str, Any]

CONVERGENCE_LABELS = {
    "paper": "(a) paper: one partition per iteration",
    "every_partition": "(b) every partition every iteration",
    "fused_every_partition": "(b') (b) + fused",
    "plain": "(c) plain, learned augmentation fixed",
}
STRONG_AUGERINO = 1.0  # hyperparameter_methods' strong regulariser, named in its label
METHOD_LABELS = {
    "plain": "1 plain, no augmentation",
    "hand_chosen": "2 plain, hand-chosen augmentation",
    "partitioned": "3 partitioned (paper scheme)",
    "partitioned_finetuned": "3'' partitioned + fine-tuning",
    "partitioned_fused": "3' partitioned (fused, every partition)",
    "partitioned_occam": "3o partitioned + whole-network Occam term",
    "partitioned_occam_finetuned": "3o'' partitioned + Occam term + fine-tuning",
    "augerino": "4 Augerino (safe)",
    "augerino_unsafe": "4' Augerino (unsafe)",
    "augerino_unsafe_strong": f"4'' Augerino (unsafe, strength {STRONG_AUGERINO})",
    "validation": "5 validation split",
    "validation_finetuned": "5' validation split + fine-tuning",
    "lila": "5L LILA (Laplace evidence, plain training)",
    "optuna": "6 Optuna TPE, best trial",
    "retrain_partitioned": "7 plain, retrained with partitioned's ranges",
    "retrain_optuna": "7' plain, retrained with Optuna's best ranges",
}


ARM_LABELS = {
    "affine": "learned affine",
    "none": "none",
    "oracle": "oracle: rotation fixed at pi, C=1",
    "oracle_restart": "oracle, fine-tuning restarted",
}


def _averaged_accuracy(row: dict[str, Any]) -> str | None:
    """Mean ± sd of a row's test-time-averaged accuracy over seeds; None where any seed lacks it (results
    written before averaging was measured, or runs that had nothing to average)."""
    averaged = row.get("averaged_test_accuracy")
    return mean_sd(averaged, ".3f") if averaged and None not in averaged else None


def learned_augmentation(result: Results) -> str:
    header = ["data", "augmentation", "test accuracy", "averaged over 8", "rotation range (rad)", "largest other range"]
    body = [
        [
            r["data"],
            ARM_LABELS.get(r["augment"], r["augment"]),
            mean_sd(r["test_accuracy"], ".3f"),
            _averaged_accuracy(r) or "-",
            mean_sd(r["rotation"], ".2f") if r["rotation"] else "-",
            mean_sd(r["other_ranges_max"], ".3f") if r["other_ranges_max"] else "-",
            f"{r['training_images'][0]:,d}" if r.get("training_images") else "-",
            mean_sd(r["seconds"], ".0f"),
        ]
        for r in result["rows"]
    ]
    return markdown_table([*header, "training images", "time (s)"], body)


def learned_augmentation_seeds(result: Results) -> str:
    """One line per run: each target of issue 43 is a per-seed target, so the values behind each mean."""
    header = ["data", "augmentation", "seed", "test accuracy", "averaged over 8", "rotation (rad)", "other ranges"]
    body = []
    for r in result["rows"]:
        for i, seed in enumerate(r["seeds"]):
            others = {k: v for k, v in r["ranges"][i].items() if k != "rotation"} if r["rotation"] else {}
            body.append(
                [
                    r["data"],
                    ARM_LABELS.get(r["augment"], r["augment"]),
                    str(seed),
                    f"{r['test_accuracy'][i]:.4f}",
                    f"{r['averaged_test_accuracy'][i]:.4f}" if r.get("averaged_test_accuracy") else "-",
                    f"{r['rotation'][i]:.2f}" if r["rotation"] else "-",
                    ", ".join(f"{k} {v:.2f}" for k, v in others.items()) or "-",
                ]
            )
    return markdown_table(header, body)


ROTATION_DATA = ("rotdigits", "digits")
"""The data whose learned-range target is the rotation (every angle held, or none); elsewhere the translations and
the zoom."""


def zoom(ranges: Mapping[str, float]) -> float:
    """The learned zoom: Augerino's isotropic ``scale``, or the larger of the ``xy`` generators' ``scale_x`` and
    ``scale_y``; 0 where nothing zooms.

    >>> zoom({"scale_x": 0.1, "scale_y": 0.3}), zoom({"scale": 0.2}), zoom({"rotation": 1.0})
    (0.3, 0.2, 0.0)
    """
    return max(ranges.get(name, 0.0) for name in ("scale", "scale_x", "scale_y"))


def learned_ranges_per_seed(result: Results) -> str:
    """One line per arm, each seed's value in a cell: the learned ranges issue 43 sets targets for (the rotation on
    rotdigits and digits; elsewhere translation x / y / the larger zoom), the plain and the averaged accuracy."""
    header = ["data", "augmentation", "rotation, or translation x/y/zoom", "test accuracy", "averaged over 8"]
    body = []
    for r in result["rows"]:
        if not r["rotation"]:  # nothing learned (C=1, or --augment none)
            ranges = "-"
        elif r["data"] in ROTATION_DATA:
            ranges = ", ".join(f"{value:.2f}" for value in r["rotation"])
        else:
            ranges = ", ".join(
                f"{h.get('translation_x', 0):.2f}/{h.get('translation_y', 0):.2f}/{zoom(h):.2f}" for h in r["ranges"]
            )
        body.append(
            [
                r["data"],
                ARM_LABELS.get(r["augment"], r["augment"]),
                ranges,
                ", ".join(f"{a:.3f}" for a in r["test_accuracy"]),
                ", ".join(f"{a:.3f}" if a is not None else "-" for a in r["averaged_test_accuracy"]),
            ]
        )
    return markdown_table(header, body)


def conversion(result: Results) -> str:
    body = [
        [
            r["model"],
            f"{r['parameters']:,d}",
            f"{r['conversion_seconds_median']:.2f}",
            f"x{r['step_subnetwork_1']:.2f}",
            f"x{r['step_subnetwork_3']:.2f}",
        ]
        for r in result["rows"]
    ]
    return markdown_table(["model", "parameters", "conversion (s)", "step, subnetwork 1", "step, subnetwork 3"], body)


def step_time(result: Results) -> str:
    header = ["model", "scheme", "default", "plain step (s)", "parameter step", "hyper step", "paper iteration"]
    body = []
    for r in result["rows"]:
        fused = f"x{r['fused_iteration_vs_plain_double_batch']:.2f}" + (" (one pass)" if r["fused_one_pass"] else "")
        grouped = r["fused_grouped_vs_plain_double_batch"]
        body.append(
            [
                r["model"],
                r["scheme"],
                r["default"],
                f"{r['plain_step_seconds']:.4f}",
                f"x{r['parameter_step']:.2f}",
                f"x{r['hyper_step']:.2f}",
                f"x{r['paper_iteration_vs_two_plain']:.2f}",
                fused,
                "-" if grouped is None else f"x{grouped:.2f}",
            ]
        )
    return markdown_table([*header, "fused iteration", "fused, grouped forward"], body)


def operator_counts(result: Results) -> str:
    header = [
        "model", "scheme", "default", "tensors", "plain step", "parameter step", "hyper step",
        "fused iteration (vs plain, double batch)", "excess per tensor",
    ]  # fmt: skip
    body = [
        [
            r["model"],
            r["scheme"],
            r["default"],
            r["partitioned_tensors"],
            r["operators"]["plain"],
            f"{r['operators']['parameter_step']} (x{r['parameter_step']:.2f})",
            f"{r['operators']['hyper_step']} (x{r['hyper_step']:.2f})",
            f"{r['operators']['fused_iteration']} (x{r['fused_iteration_vs_plain_double_batch']:.2f})",
            f"{r['parameter_step_excess_per_tensor']:+.1f}",
        ]
        for r in result["rows"]
    ]
    return markdown_table(header, body)


def data_parallel(result: Results) -> str:
    body = [[r["processes"], r["threads_each"], f"{r['seconds_per_iteration']:.4f}"] for r in result["rows"]]
    summary = result["summary"]
    table = markdown_table(["processes", "threads each", "s / iteration (median)"], body)
    return (
        f"{table}\n\nSpeed-up x{summary['speedup']:.2f}; the parameters trained by 1 and 2 processes differ by at "
        f"most {summary['max_relative_parameter_difference']:.1e} of the largest parameter."
    )


FEDERATED_ARMS = {
    "partitioned": "partitioned (learned psi)",
    "fedadam": "FedAdam, no augmentation",
    "oracle": "FedAdam, rotation pi",
    "fedex-equal": "FedEx-style, equal rounds",
    "fedex": "FedEx-style, 4x rounds",
}


def federated(result: Results) -> str:
    """Per data set: each arm's test accuracy (mean ± SE over the seeds) and the partitioned run's paired
    difference to it (points), at equal rounds and, against FedAdam, at equal bytes; traffic and rounds."""
    header = ["data", "seeds", *FEDERATED_ARMS.values(), "FedAdam at the partitioned run's bytes",
              "partitioned traffic, % of FedAdam's"]  # fmt: skip
    body = []
    for row in result["rows"]:
        cells = [row["data"], len(row["seeds"])]
        for arm in FEDERATED_ARMS:
            mean, se = row[arm]
            paired = "" if arm == "partitioned" else " ({:+.1f} ± {:.1f})".format(*row[f"partitioned-minus-{arm}"])
            cells.append(f"{mean:.3f} ± {se:.3f}{paired}")
        cells.append("({:+.1f} ± {:.1f})".format(*row["partitioned-minus-fedadam-at-bytes"]))
        cells.append(f"{100 * row['traffic_share']:.0f}%")
        body.append(cells)
    return markdown_table(header, body)


def federated_budgets(result: Results) -> str:
    """The budget sweep per data set and rounds: the partitioned run, the model the command hands back and FedAdam
    tuned at the same rounds (mean ± SE), the paired differences to FedAdam (points; the worst seed's), the runs at
    chance, the runs whose psi learned nothing, FedAdam's chosen rates and the learned rotations."""
    header = ["data", "rounds", "seeds", "partitioned run", "handed back", "FedAdam (tuned)",
              "handed back - FedAdam (worst seed)", "partitioned run - FedAdam", "at chance (run / handed back)",
              "psi learned nothing", "FedAdam server lr", "learned rotation (rad)"]  # fmt: skip
    body = [
        [
            row["data"],
            row["rounds"],
            len(row["seeds"]),
            "{:.3f} ± {:.3f}".format(*row["partitioned"]),
            "{:.3f} ± {:.3f}".format(*row["handed_back"]),
            "{:.3f} ± {:.3f}".format(*row["fedadam"]),
            "{:+.1f} ± {:.1f} ({:+.1f})".format(*row["difference"], row["worst"]),
            "{:+.1f} ± {:.1f}".format(*row["partitioned_difference"]),
            f"{row['partitioned_at_chance']} / {row['at_chance']}",
            f"{row['learned_nothing']} of {len(row['seeds'])}",
            ", ".join(f"{lr:g}" for lr in row["server_lrs"]),
            ", ".join(f"{r:.2f}" for r in row["rotation"]),
        ]
        for row in result["rows"]
    ]
    return markdown_table(header, body)


def federated_seeds(result: Results) -> str:
    """Per seed: what each tuned arm chose (FedAdam's rate; the augmented arms' rate, the oracle's choice, where the
    row records one: earlier rows ran them at FedAdam's), the learned rotation, each arm's test accuracy, its rounds
    and seconds per round."""
    header = ["data", "seed", "server lr, FedAdam / augmented arms", "FedEx rotation (equal / 4x)",
              "learned rotation (rad)", *FEDERATED_ARMS.values(), "s/round, partitioned / FedAdam"]  # fmt: skip
    body = [
        [
            run["data"],
            run["seed"],
            f"{run['server_lr']:g} / {run.get('augmented_server_lr', run['server_lr']):g}",
            f"{run['fedex_equal_rotation']:.2f} / {run['fedex_rotation']:.2f}",
            f"{run['hyperparameters'].get('rotation', 0.0):.2f}",
            *(f"{run[arm]['test']:.3f}" for arm in FEDERATED_ARMS),
            f"{run['partitioned']['seconds_per_round']:.2f} / {run['fedadam']['seconds_per_round']:.2f}",
        ]
        for run in result["runs"]
    ]
    return markdown_table(header, body)


def federated_lessons(result: Results) -> str:
    """The partitioned run with each lesson undone or each alternative tried: test and validation accuracy, its
    difference to the defaults' run of the same seed (points), the learned rotation; then, for a lesson run on
    several seeds, the mean ± SE of its paired differences."""
    header = ["data", "seed", "run", "test accuracy", "vs the defaults (points)", "validation accuracy",
              "rotation (rad)"]  # fmt: skip
    body, paired = [], {}
    for lesson in result.get("summary", {}).get("lessons", []):
        defaults = lesson["runs"]["defaults"]["test"]
        for name, run in lesson["runs"].items():
            difference = 100 * (run["test"] - defaults)
            if name != "defaults":
                paired.setdefault((lesson["data"], name), []).append(difference)
            body.append([lesson["data"], lesson["seed"], name, f"{run['test']:.3f}",
                         "" if name == "defaults" else f"{difference:+.1f}", f"{run['validation']:.3f}",
                         f"{run['rotation']:.2f}"])  # fmt: skip
    for (data, name), differences in paired.items():
        if len(differences) > 1:
            body.append([data, f"{len(differences)} seeds", name, "", "{:+.1f} ± {:.1f}".format(*mean_se(differences)),
                         "", ""])  # fmt: skip
    return markdown_table(header, body)


def federated_variants(result: Results) -> str:
    """Other data and federations at the command's defaults: each arm's test accuracy, the difference (points),
    what psi learned, the traffic."""
    header = ["variant", "data", "seed", "partitioned", "FedAdam", "difference (points)", "learned ranges",
              "partitioned traffic, % of FedAdam's"]  # fmt: skip
    body = [
        [
            variant["variant"],
            variant["data"],
            variant["seed"],
            f"{variant['partitioned']['test']:.3f}",
            f"{variant['fedadam']['test']:.3f}",
            f"{100 * (variant['partitioned']['test'] - variant['fedadam']['test']):+.1f}",
            ", ".join(f"{k} {v:.2f}" for k, v in variant["partitioned"]["hyperparameters"].items()),
            f"{100 * variant['partitioned']['bytes'] / variant['fedadam']['bytes']:.0f}%",
        ]
        for variant in result.get("summary", {}).get("variants", [])
    ]
    return markdown_table(header, body)


def federated_paper_cost(result: Results) -> str:
    """Appendix J's settings timed over a few rounds: seconds and traffic per round, hours for the whole run."""
    cost = result.get("summary", {}).get("paper_cost")
    if not cost:
        return markdown_table(["arm", "s/round"], [])
    header = ["arm", f"s/round (over {cost['timed_rounds']} rounds)", f"hours for {cost['rounds']} rounds",
              "MB per round, up + down"]  # fmt: skip
    body = [
        [
            arm,
            f"{cost[arm]['seconds_per_round']:.2f}",
            f"{cost[arm]['hours']:.1f}",
            f"{cost[arm]['bytes_per_round'] / 1e6:.1f}",
        ]
        for arm in ("partitioned", "fedadam")
    ]
    return markdown_table(header, body)


def convergence(result: Results) -> str:
    rows = result["rows"]

    def listed(values: list, spec: str) -> str:
        return ", ".join("not reached" if v is None else format(v, spec) for v in values)

    seeds = ",".join(str(s) for s in rows[0]["seeds"]) if rows else ""
    header = [
        "variant",
        f"iterations to test accuracy >= {result['config']['target']:g} (seeds {seeds})",
        "median",
        "vs (c), median",
        "final test accuracy",
        "s/iteration",
    ]
    body = []
    for r in rows:
        median, ratio = r["median_iterations_to_target"], r.get("median_ratio_to_plain")
        body.append(
            [
                CONVERGENCE_LABELS[r["variant"]],
                listed(r["iterations_to_target"], "d"),
                "-" if median is None else format(median, "g"),
                "-" if ratio is None else f"x{ratio:.2f}",
                listed(r["final_test_accuracy"], ".3f"),
                f"{statistics.median(r['seconds_per_iteration']):.2f}",
            ]
        )
    return markdown_table(header, body)


def memory(result: Results) -> str:
    header = ["model", "scheme", "default", "assignments", "parts", "defaults", "indices, seeds", "total overhead"]
    body = []
    for r in result["rows"]:
        o = r["overhead_of_parameter_memory"]
        body.append(
            [
                r["model"],
                r["scheme"],
                r["default"],
                r["assignments"],
                f"+{100 * o['trained_parts']:.2f}%",
                f"+{100 * o['defaults']:.1f}%",
                f"+{100 * o['indices_and_seeds']:.2f}%",
                f"**+{100 * o['total']:.2f}%**",
                f"x{r['state_vs_plain']:.3f}",
                f"x{r['peak_vs_plain']:.3f}",
            ]
        )
    return markdown_table([*header, "params+Adam+buffers vs plain", "step peak vs plain"], body)


def _images(row: dict[str, Any]) -> float:
    return statistics.mean(p["forward_images"] + p["backward_images"] for p in row["passes"])


def _cost(rows: list[dict[str, Any]], method: str) -> str:
    """Images through the network relative to plain training: the median over (task, model) pairs."""
    by = {(r["task"], r["model"], r["method"]): r for r in rows}
    pairs = list(dict.fromkeys((r["task"], r["model"]) for r in rows))
    ratios = [_images(by[t, m, method]) / _images(by[t, m, "plain"]) for t, m in pairs if (t, m, "plain") in by]
    return f"x{statistics.median(ratios):.1f}" if ratios else "-"


def _accuracy(row: dict[str, Any]) -> str:
    """Mean ± sd test accuracy over seeds, then the test-time-averaged one in parentheses where the row has
    it (:func:`_averaged_accuracy`)."""
    averaged = _averaged_accuracy(row)
    return mean_sd(row["test_accuracy"], ".3f") + (f" ({averaged})" if averaged else "")


def hyperparameter_methods(result: Results, *, leave_out: Callable[[str], bool] = lambda method: False) -> str:
    """Methods by (task, model): test accuracy (averaged over fixed transforms of the final ranges in
    parentheses, where measured), and the cost in images through the network relative to plain training (the
    median over pairs; Optuna: its whole study). Methods for which ``leave_out`` is true get no row."""
    rows = result["rows"]
    pairs = list(dict.fromkeys((r["task"], r["model"]) for r in rows))
    by = {(r["task"], r["model"], r["method"]): r for r in rows}
    body = [
        [METHOD_LABELS[method], *(_accuracy(by[task, model, method]) for task, model in pairs), _cost(rows, method)]
        for method in dict.fromkeys(r["method"] for r in rows)
        if not leave_out(method)
    ]
    return markdown_table(["method", *(f"{task} / {model}" for task, model in pairs), "cost vs plain"], body)


RECIPE_DEPENDENT_METHODS = ("partitioned", "retrain_partitioned", "validation_finetuned")
"""Methods whose runs change with partitioned training's recipe: the partitioned arms, the plain run retrained
with their ranges, and the validation split's fine-tuning, which takes as many iterations as partitioned
training fine-tunes (``benchmarks.methods.Budget.finetune_steps``)."""


def hyperparameter_methods_others(result: Results) -> str:
    """:func:`hyperparameter_methods` without the methods of :data:`RECIPE_DEPENDENT_METHODS` (``partitioned``
    also covers its fused and fine-tuned variants): the rows a change of partitioned training's default leaves as
    they were, shown beside the re-run partitioned arms."""
    return hyperparameter_methods(
        result, leave_out=lambda method: method.startswith("partitioned") or method in RECIPE_DEPENDENT_METHODS
    )


def _zoom_range(hyperparameters: dict[str, float]) -> float:
    """One number for the learned zoom: the mean of the scale_x and scale_y ranges."""
    return (hyperparameters.get("scale_x", 0.0) + hyperparameters.get("scale_y", 0.0)) / 2


def _ranges(hyper: list[dict[str, float]], pick: Callable[[dict[str, float]], float]) -> str:
    """The spread of one learned range over seeds: 'min / median / max' (just the value for one seed; '-'
    for a method without ranges)."""
    if not any(hyper):
        return "-"
    values = [pick(h) for h in hyper]
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return " / ".join(f"{v:.2f}" for v in (min(values), statistics.median(values), max(values)))


def hyperparameter_methods_runs(result: Results) -> str:
    """Every (task, model, method): test accuracy and log-likelihood (mean ± sd over seeds), the learned
    ranges (rotation, translation: the mean of x and y, zoom: the mean of the two scales; each as min /
    median / max over seeds: the smallest, middle and largest value the runs ended with), passes and
    seconds; then the data's true invariances in the same units."""
    body = []
    for row in result["rows"]:
        hyper = row["hyperparameters"]
        images = [(p["forward_images"] + p["backward_images"]) / 1000 for p in row["passes"]]
        cost = mean_sd(images, ".0f")
        seconds = mean_sd(row["seconds"], ".0f")
        label = METHOD_LABELS[row["method"]]
        if row["method"] == "optuna":
            best = row["best_trial_passes"]
            cost += f" (best trial {(best['forward_images'] + best['backward_images']) / 1000:.0f})"
            seconds += f" (best trial {row['best_trial_seconds']:.0f})"
            label += f" ({len(row['trials'])} trials, 1 study)"
        if row["method"].startswith("augerino_unsafe"):
            diverged = [d for d in row["diverged_at"] if d is not None]
            label += f" (diverged {len(diverged)}/{len(row['diverged_at'])}" + (
                f", at step {', '.join(map(str, diverged))})" if diverged else ")"
            )
        body.append(
            [
                f"{row['task']} / {row['model']}",
                label,
                _accuracy(row),
                mean_sd(row["test_log_likelihood"], ".3f"),
                _ranges(hyper, lambda h: h.get("rotation", 0.0)),
                _ranges(hyper, lambda h: (h.get("translation_x", 0.0) + h.get("translation_y", 0.0)) / 2),
                _ranges(hyper, _zoom_range),
                cost,
                seconds,
            ]
        )
    averaged = any(_averaged_accuracy(row) for row in result["rows"])
    accuracy = "test accuracy (averaged)" if averaged else "test accuracy"
    header = ["task / model", "method", accuracy, "test log-lik.", "rotation", "translation", "zoom"]
    lines = [markdown_table([*header, "images fwd+bwd (k)", "seconds"], body)]
    truths = result["config"]["true_invariances"]
    lines += [
        "",
        "Learned ranges (rotation, translation, zoom): min / median / max over the seeds.",
        "",
        "True invariances (same units):",
        *(
            f"- {task}: " + (", ".join(f"{k} {v:.2f}" for k, v in truth.items()) if truth else "no known invariance")
            for task, truth in truths.items()
        ),
    ]
    return "\n".join(lines)


def hyperparameter_methods_long(result: Results) -> str:
    """One (task, model) pair: test accuracy (mean ± sd), the learned rotation range (min / median / max over
    seeds) and the cost, per method."""
    rows = result["rows"]
    steps = result["config"]["budget"]["steps"]
    body = [
        [
            METHOD_LABELS[r["method"]],
            mean_sd(r["test_accuracy"], ".3f"),
            _ranges(r["hyperparameters"], lambda h: h.get("rotation", 0.0)),
            _cost(rows, r["method"]),
        ]
        for r in rows
    ]
    header = [f"method ({steps} iterations)", "test accuracy", "rotation (rad), min / median / max", "cost vs plain"]
    return markdown_table(header, body)


def model_selection(result: Results) -> str:
    """How often each method picks the true subset (one row per number of inputs), and the cost."""
    runs = result["rows"]
    body = []
    for inputs, informative in sorted({(r["inputs"], r["informative"]) for r in runs}):
        group = [r for r in runs if (r["inputs"], r["informative"]) == (inputs, informative)]
        truth, n = list(range(informative)), len(group)
        every = [c for r in group for c in r["candidates"]]
        body.append(
            [
                f"{inputs} ({informative})",
                f"{sum(r['partitioned_choice'] == truth for r in group)}/{n}",
                f"{sum(r['laplace_choice'] == truth for r in group)}/{n}",
                f"{sum(r['best_test_rmse_choice'] == truth for r in group)}/{n}",
                f"{sum(r['mask_selected'] == truth for r in group)}/{n}",
                mean_sd([c["partitioned_seconds"] for c in every], ".1f"),
                mean_sd([c["laplace_seconds"] for c in every], ".1f"),
            ]
        )
    header = [
        "inputs (informative)",
        "partitioned picks the true subset",
        "Laplace picks it",
        "lowest test RMSE at it",
        "InputMask selects exactly it",
        "partitioned s / candidate",
        "plain + Laplace s / candidate",
    ]
    return markdown_table(header, body)


def model_selection_candidates(result: Results) -> str:
    """Every candidate subset: both scores, test RMSEs and seconds (mean ± sd over seeds)."""
    runs = result["rows"]
    body = []
    for inputs, informative in sorted({(r["inputs"], r["informative"]) for r in runs}):
        group = [r for r in runs if (r["inputs"], r["informative"]) == (inputs, informative)]
        for i in range(inputs):
            cs = [r["candidates"][i] for r in group]
            body.append(
                [
                    f"{inputs} ({informative})",
                    f"x0..x{i}{' (true)' if i + 1 == informative else ''}",
                    mean_sd([c["partitioned_conditional_lml"] for c in cs], ".0f"),
                    mean_sd([c["laplace_lml"] for c in cs], ".0f"),
                    mean_sd([c["plain_test_rmse"] for c in cs], ".3f"),
                    mean_sd([c["partitioned_test_rmse"] for c in cs], ".3f"),
                    mean_sd([c["partitioned_seconds"] for c in cs], ".1f"),
                    mean_sd([c["laplace_seconds"] for c in cs], ".1f"),
                ]
            )
    header = ["inputs (informative)", "candidate", "partitioned cond. LML", "Laplace LML", "test RMSE plain"]
    return markdown_table([*header, "test RMSE partitioned", "seconds partitioned", "seconds plain + Laplace"], body)


def search_by_lml(result: Results) -> str:
    """Per arm: each seed's pick, and the test accuracy and log-likelihood of the pick retrained on all the data
    (mean ± sd over seeds), with the search's wall time."""
    rows = result["rows"]
    body = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        group = [r for r in rows if r["arm"] == arm]
        picks = "; ".join(
            f"lr {r['pick']['lr']:.2g}, wd {r['pick']['weight_decay']:.1g}, width {r['pick']['width']}" for r in group
        )
        body.append(
            [
                arm,
                mean_sd([r["test_accuracy"] for r in group], ".3f"),
                mean_sd([r["test_log_likelihood"] for r in group], ".3f"),
                mean_sd([r["search_seconds"] for r in group], ".0f"),
                picks,
            ]
        )
    header = ["search scored by", "test accuracy (retrained pick)", "test log-likelihood", "search s", "picks per seed"]
    return markdown_table(header, body) + "\n\n" + _search_agreement(rows)


def _search_agreement(rows: list[dict[str, Any]]) -> str:
    """How alike the two scores rank the configurations: over the trials both studies ran with the same
    parameters (TPE's seeded start, and on while its picks agree), Spearman's rank correlation of the LML and the
    validation log-likelihood, and whether the two studies picked the same configuration."""
    from scipy.stats import spearmanr

    lines = []
    for seed in sorted({r["seed"] for r in rows}):
        by_arm = {r["arm"]: r for r in rows if r["seed"] == seed}
        if "lml" not in by_arm or "validation" not in by_arm:
            continue
        lml, validation = by_arm["lml"]["trials"], by_arm["validation"]["trials"]
        shared = next((i for i, (a, b) in enumerate(zip(lml, validation)) if a["params"] != b["params"]), len(lml))
        rho = spearmanr([t["score"] for t in lml[:shared]], [t["score"] for t in validation[:shared]])[0]
        same = by_arm["lml"]["pick"] == by_arm["validation"]["pick"]
        lines.append(
            f"seed {seed}: {shared} shared trials, rank correlation {rho:.2f}, {'same' if same else 'other'} pick"
        )
    return "Agreement of the two scores: " + "; ".join(lines) + "."


def results_markdown(result: Results, *tables: Callable[[Results], str]) -> str:
    """A results file's Markdown companion (``NAME.md`` beside ``NAME.json``): provenance, then the tables."""
    return "\n\n".join([provenance(result["meta"]), *(table(result) for table in tables)]) + "\n"


def model_coverage(result: Results) -> str:
    """Per torchvision family: models tried, passed, and the path each took (traced by fx, or untraced)."""
    body = [
        [line["family"].replace("_", " "), line["tried"], line["passed"], line["traced"], line["untraced"]]
        for line in result["summary"]["families"]
    ]
    return markdown_table(["family", "tried", "passed", "traced", "untraced"], body)


def input_pipeline(result: Results) -> str:
    """Images per second the streaming pipeline delivers with 0/1/2 workers, against what a step reads."""
    body = []
    for r in result["rows"]:
        if r["arm"] == "pipeline":
            streamed = r.get("streamed_training_images_per_second")
            body.append(
                [
                    r["workers"],
                    f"{r['images_per_second']:,.0f}",
                    f"x{r['ratio_to_step']:,.1f}",
                    "yes" if r["input_bound"] else "no",
                    "—" if streamed is None else f"{streamed:,.1f} (x{r['streamed_training_vs_in_memory']:.2f})",
                ]
            )
        else:
            body.append(
                [
                    "step (in memory)",
                    f"{r['images_per_second']:,.1f} read ({r['parameter_batch_images_per_second']:,.1f} in "
                    f"parameter batches; {r['reads_per_iteration']:g} reads/iteration)",
                    "x1.0",
                    "—",
                    "—",
                ]
            )
    columns = [
        "workers",
        "images/s delivered",
        "ratio to the step's consumption",
        "input-bound?",
        "streamed training, images/s read (vs in memory)",
    ]
    return markdown_table(columns, body)


TABLES: dict[str, Callable[[Results], str]] = {
    "model_coverage": model_coverage,
    "learned_augmentation": learned_augmentation,
    "learned_augmentation_seeds": learned_augmentation_seeds,
    "learned_ranges_per_seed": learned_ranges_per_seed,
    "conversion": conversion,
    "step_time": step_time,
    "operator_counts": operator_counts,
    "data_parallel": data_parallel,
    "federated": federated,
    "federated_seeds": federated_seeds,
    "federated_budgets": federated_budgets,
    "federated_lessons": federated_lessons,
    "federated_variants": federated_variants,
    "federated_paper_cost": federated_paper_cost,
    "convergence": convergence,
    "memory": memory,
    "input_pipeline": input_pipeline,
    "hyperparameter_methods": hyperparameter_methods,
    "hyperparameter_methods_others": hyperparameter_methods_others,
    "hyperparameter_methods_runs": hyperparameter_methods_runs,
    "hyperparameter_methods_long": hyperparameter_methods_long,
    "model_selection": model_selection,
    "model_selection_candidates": model_selection_candidates,
    "search_by_lml": search_by_lml,
}
