"""The Markdown tables of the research diagnostics, rendered from their results objects (``benchmarks.common``'s
one format): the scripts print them, and ``python -m research.report`` puts them into docs/research.md and
docs/history.md with the benchmarks' own (:data:`TABLES` holds both). Pure Python: rendering needs neither torch nor
the package.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks import tables as benchmark_tables
from benchmarks.common import markdown_table

Results = dict[str, Any]


def hyper_estimators(result: Results) -> str:
    """Per (variant, iterations): the learned rotation range (min / median / max and per seed), the exported
    model's test accuracy (min / mean / max), the images one run puts through the network (forward plus
    backward) relative to the hand-chosen plain run of as many iterations, and the median wall time."""
    plain = {line["steps"]: line.get("images") for line in result["summary"] if line["variant"] == "plain_oracle"}
    body = []
    for line in result["summary"]:
        reference = plain.get(line["steps"])
        cost = f"x{line['images'] / reference:.2f}" if line.get("images") and reference else "-"
        rotation = "-" if line["rotation"] is None else " / ".join(f"{v:.2f}" for v in line["rotation"])
        body.append(
            [
                line["variant"],
                line["steps"],
                rotation,
                ", ".join(f"{v:.2f}" for v in line["rotation_per_seed"]) or "-",
                " / ".join(f"{v:.3f}" for v in line["accuracy"]),
                cost,
                f"{line['seconds']:.0f}",
            ]
        )
    header = ["variant", "iterations", "rotation (rad) min / median / max", "per seed", "test accuracy"]
    header += ["images vs plain", "s"]
    return markdown_table(header, body)


def hyper_gradient_variance(result: Results) -> str:
    """Per estimator: the mean and spread of one draw of the rotation range's hyper-gradient, their ratio
    (the signal-to-noise ratio of one draw), and the images one draw puts through the network."""
    body = [
        [r["estimator"], f"{r['mean']:+.3g}", f"{r['sd']:.3g}", f"{r['snr']:.2f}", r["images_per_draw"]]
        for r in result["rows"]
    ]
    return markdown_table(["estimator", "mean gradient", "sd of one draw", "|mean| / sd", "images per draw"], body)


def hyper_gradient_direction(result: Results) -> str:
    """Per data set and fixed range r: the derivative of the conditional LML with respect to the rotation range at
    the weights trained at r, at fixed weights (what the hyperparameter step follows) and with the implicit term
    through training for each number of Neumann terms K."""
    ks = [key for key in result["rows"][0] if key.startswith("implicit_")]
    body = [
        [r["data"], f"{r['r']:.2f}", r["seed"], f"{r['fixed']:+.2f}", *(f"{r[k]:+.2f}" for k in ks)]
        for r in result["rows"]
    ]
    header = ["data", "r (rad)", "seed", "fixed weights", *(f"through training, K = {k.split('_')[1]}" for k in ks)]
    return markdown_table(header, body)


def branch_check(result: Results) -> str:
    """Per data set and range r: the secants of the conditional LML measured by training branches (their total,
    and its parts through training and at fixed weights) and the derivatives the estimators follow at the middle
    branch's weights, each as mean ± standard error over seeds and repeats, with how many of them are positive."""
    lines = result["summary"]["derivatives"]
    keys = [k for k in lines[0] if k in ("total", "through", "direct", "fixed") or k.startswith("implicit_")]
    names = {
        "total": "branches: total",
        "through": "branches: through training",
        "direct": "branches: at fixed weights",
        "fixed": "estimator: fixed weights",
    }
    header = [
        "data",
        "r (rad)",
        "n",
        *(names[k] if k in names else f"estimator: through training, K = {k.removeprefix('implicit_')}" for k in keys),
    ]
    body = [
        [line["data"] + ("" if line.get("generator", "rotation") == "rotation" else f" ({line['generator']})"),
         f"{line['r']:.2f}", line["n"],
         *(f"{line[k]['mean']:+.2f} ± {line[k]['se']:.2f} ({line[k]['positive']}/{line['n']} > 0)" for k in keys)]
        for line in lines
    ]  # fmt: skip
    return markdown_table(header, body)


def implicit_cost(result: Results) -> str:
    """Per step: its median seconds, in parameter steps, and the partitioned iteration it makes against the
    fixed-weight one (a parameter step and a hyperparameter step every ``hyper_every`` iterations)."""
    body = [
        [r["step"], f"{r['seconds']:.3f}", f"{r['parameter_steps']:.2f}",
         "—" if r["iteration_vs_fixed"] is None else f"x{r['iteration_vs_fixed']:.2f}"]
        for r in result["rows"]
    ]  # fmt: skip
    return markdown_table(["step", "seconds (median)", "in parameter steps", "partitioned iteration vs fixed"], body)


def federated_psi(result: Results) -> str:
    """Per data set and psi rate: each seed's final rotation, the runs meeting the target, the final models' mean
    test accuracy."""
    body = [
        [r["data"], r["rate"], ", ".join(f"{v:.2f}" for v in r["rotations"]), f"{r['meets']} of {r['runs']}",
         f"{r['test']:.3f}"]
        for r in result["rows"]
    ]  # fmt: skip
    return markdown_table(["data", "psi lr", "rotation per seed (rad)", "meet the target", "test accuracy"], body)


def population(result: Results) -> str:
    """One line per population: the ranges it learned (the rotation, the isotropic scale where the generators have
    one, and the largest other), its final model's test accuracy, the member its state descends from at each round
    (``partition_fx.training.loop.population.ancestry``), and the images it trained on against a plain run's."""
    header = ["data", "start", "seed", "rotation (rad)", "scale", "largest other range", "test accuracy",
              "averaged over 8", "ancestry", "images vs plain"]  # fmt: skip
    body = []
    for r in result["rows"]:
        learned = r["learned"]
        others = max(v for k, v in learned.items() if k not in ("rotation", "scale"))
        scale = f"{learned['scale']:.3f}" if "scale" in learned else "—"
        body.append(
            [r["data"], r["arm"], r["seed"], f"{learned['rotation']:.3f}", scale, f"{others:.3f}",
             f"{r['test_accuracy']:.4f}", f"{r['averaged_test_accuracy']:.4f}", "".join(map(str, r["ancestry"])),
             f"{r['training_images'] / r['plain_training_images']:.2f}x"]
        )  # fmt: skip
    return markdown_table(header, body)


def _se(se: float) -> str:
    """`` ± SE``, or nothing for one seed (no standard error)."""
    return "" if math.isnan(se) else f" ± {se:.1f}"


def occam(result: Results) -> str:
    """Per data set, range and r (the range the weights trained at): each score's secant at r at fixed weights
    (nats per unit of range, mean ± standard error over seeds, how many positive) and the ranges it is largest at
    (one per seed): the conditional LML, the last-layer Laplace evidence with its two parts and, where scored
    (``--network``), the whole network's Occam term and evidence."""
    names = {"conditional_lml": "conditional LML", "loglik": "Laplace: log-likelihood", "occam": "Laplace: Occam",
             "evidence": "Laplace: evidence", "network_occam": "whole network: Occam",
             "network_evidence": "whole network: evidence"}  # fmt: skip
    largest = {"conditional_lml": "conditional LML", "evidence": "Laplace evidence",
               "network_evidence": "whole-network evidence"}  # fmt: skip
    scored = result["summary"]["secants"][0]
    names = {k: name for k, name in names.items() if k in scored}
    largest = {k: name for k, name in largest.items() if k in scored}
    header = ["data", "range", "trained at", "n", *(f"{name}: secant" for name in names.values()),
              *(f"{name}: largest at" for name in largest.values())]  # fmt: skip
    body = []
    for line in result["summary"]["secants"]:
        secants = [f"{line[k]['secant']:+.1f}{_se(line[k]['se'])} ({line[k]['positive']}/{line['n']} > 0)"
                   for k in names]  # fmt: skip
        preferred = [", ".join(f"{v:.2f}" for v in line[k]["preferred"]) for k in largest]
        body.append([line["data"], line["generator"], f"{line['r']:.3f}", line["n"], *secants, *preferred])
    return markdown_table(header, body)


def occam_follow(result: Results) -> str:
    """One line per followed run: the score it maximised, the range after each decision (from its start) and the
    final range."""
    header = ["data", "range", "start", "seed", "maximised", "range after each decision", "final"]
    body = [
        [r["data"], r["generator"], f"{r['start']:.3f}", r["seed"], r["objective"].replace("_", " "),
         " ".join(f"{d['chosen']:.2f}" for d in r["decisions"]), f"{r['final']:.3f}"]
        for r in result["rows"]
    ]  # fmt: skip
    return markdown_table(header, body)


def zoom_profile(result: Results) -> str:
    """Per fixed zoom r: the conditional LML at weights trained at r, scored at r (the objective at
    ``train_range_factor`` 1) and at 2r (at 0.5, the default's), and the plain model's test accuracy, plain and
    averaged; each mean ± standard error (seeds), the largest mean in bold; a last line says at which zoom each
    seed's curve peaks."""
    summary = result["summary"]
    names = ("lml_at_r", "lml_at_2r", "test_accuracy", "averaged_test_accuracy")

    def cell(line: dict[str, Any], name: str) -> str:
        if line[name] is None:
            return "-"
        mean, se, n = line[name]
        text = f"{mean:.1f} ± {se:.1f} ({n})" if name.startswith("lml") else f"{100 * mean:.2f} ± {100 * se:.2f} ({n})"
        return f"**{text}**" if line["r"] == summary["peaks"].get(name) else text

    body = [[f"{line['r']:.2f}", f"{line['of_truth']:.2f}x", *(cell(line, name) for name in names)]
            for line in summary["zooms"]]  # fmt: skip
    body.append(["each seed's peak", "", *(", ".join(f"{r:.2f}" for r in summary["seed_peaks"][name].values())
                                          for name in names)])  # fmt: skip
    header = ["zoom r", "of the truth", "conditional LML at r (nats; seeds)", "conditional LML at 2r (nats; seeds)",
              "test accuracy (%; seeds)", "averaged test accuracy (%; seeds)"]  # fmt: skip
    return markdown_table(header, body)


def range_trajectories(result: Results) -> str:
    """Per run of ``learned_augmentation``'s results: the range its data has a target for (the rotation on rotdigits
    and digits, the zoom elsewhere) at each LML evaluation, columns headed by the iteration (every run's; the
    partitioned phase ends at 60% of the run): where it moves, and whether it was still moving when the ranges
    froze."""
    lines = []
    for r in result["rows"]:
        rotation = r["data"] in benchmark_tables.ROTATION_DATA
        for seed, trajectory in zip(r["seeds"], r["ranges_trajectories"] or []):
            values = {
                step: f"{ranges.get('rotation', 0.0) if rotation else benchmark_tables.zoom(ranges):.2f}"
                for step, ranges in trajectory
            }
            lines.append(
                (
                    [
                        r["data"],
                        _label(r["augment"], "learned_augmentation"),
                        "rotation" if rotation else "scale",
                        str(seed),
                    ],
                    values,
                )
            )
    steps = sorted({step for _, values in lines for step in values})
    header = ["data", "arm", "range", "seed", *map(str, steps)]
    return markdown_table(header, [line + [values.get(step, "") for step in steps] for line, values in lines])


def _label(arm: str, file: str) -> str:
    """How an arm of ``file`` is named: a method of ``hyperparameter_methods``' results by its method label, an arm of
    the default job by its arm label (the two share names: ``augerino`` is a method and an arm)."""
    labels = (
        benchmark_tables.METHOD_LABELS if file.startswith("hyperparameter_methods") else benchmark_tables.ARM_LABELS
    )
    return labels.get(arm, arm)


def target_ranges(result: Results) -> str:
    """The learned ranges' targets: each run's values (several ranges as x/y/zoom), their means ± standard errors
    over seeds, and how many runs meet the target."""
    body = [
        [
            r["target"],
            r["data"],
            r["start"],
            r["measured_on"],
            ", ".join("/".join(f"{v:.2f}" for v in values) for values in r["values"]),
            " / ".join(f"{m:.2f} ± {se:.2f}" for m, se in zip(r["mean"], r["standard_error"])),
            f"{r['met']} of {r['runs']}",
        ]
        for r in result["rows"]
        if r["kind"] == "ranges"
    ]
    return markdown_table(["target", "data", "start", "on", "each run", "mean ± SE", "runs that meet it"], body)


def target_models(result: Results) -> str:
    """The final model's targets: paired differences in points by seed, their mean ± standard error, both arms'
    means, and whether the target holds."""
    body = [
        [
            r["target"],
            r["data"],
            _label(r["arm"], r["file"]),
            _label(r["reference"], r["reference_file"]),
            "averaged over 8" if r["accuracy"] == "averaged_test_accuracy" else "plain",
            r["measured_on"],
            f"{r['arm_mean']:.3f} / {r['reference_mean']:.3f}",
            ", ".join(f"{v:+.2f}" for v in r["values"]),
            f"{r['mean']:+.2f} ± {r['standard_error']:.2f}",
            "yes" if r["met"] else "no",
        ]
        for r in result["rows"]
        if r["kind"] == "model"
    ]
    header = ["target", "data", "arm", "against", "accuracy", "on", "means", "difference per seed (points)"]
    return markdown_table([*header, "mean ± SE", "met"], body)


def targets(result: Results) -> str:
    return target_ranges(result) + "\n\n" + target_models(result)


TABLES: dict[str, Callable[[Results], str]] = {
    **benchmark_tables.TABLES,
    "hyper_estimators": hyper_estimators,
    "hyper_gradient_variance": hyper_gradient_variance,
    "hyper_gradient_direction": hyper_gradient_direction,
    "branch_check": branch_check,
    "implicit_cost": implicit_cost,
    "federated_psi": federated_psi,
    "population": population,
    "occam": occam,
    "occam_follow": occam_follow,
    "zoom_profile": zoom_profile,
    "range_trajectories": range_trajectories,
    "target_ranges": target_ranges,
    "target_models": target_models,
}
"""Every table the research pages use by name (``{{table NAME FILE}}``): the diagnostics' and the benchmarks'."""
