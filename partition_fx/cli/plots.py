"""Training curves from a ``FitResult`` history: LML and losses; hyperparameter trajectories."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """LML per example (left axis) and the mean parameter/hyperparameter step losses (right) by step."""
    plt = _pyplot()
    steps = [r["step"] for r in history]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    ax.plot(steps, [r["lml_per_example"] for r in history], "o-", color="tab:blue", label="LML / example")
    ax.set_xlabel("iteration")
    ax.set_ylabel("LML per example (nats)", color="tab:blue")
    loss_ax = ax.twinx()
    for key, color in (("train_loss", "tab:orange"), ("hyper_loss", "tab:green")):
        points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        if points:
            loss_ax.plot(*zip(*points), ".--", color=color, label=key.replace("_", " "))
    loss_ax.set_ylabel("mean loss since last evaluation")
    handles = ax.get_legend_handles_labels()[0] + loss_ax.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="center right")
    ax.set_title("partitioned training")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_hyperparameters(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """One line per scalar hyperparameter (list-valued ones, e.g. masks, one line per entry)."""
    plt = _pyplot()
    steps = [r["step"] for r in history]
    series: dict[str, list[float]] = {}
    for r in history:
        for name, value in r["hyperparameters"].items():
            values = value if isinstance(value, list) else [value]
            for i, v in enumerate(values):
                series.setdefault(name if len(values) == 1 else f"{name}[{i}]", []).append(v)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    for name, values in series.items():
        ax.plot(steps[-len(values) :], values, label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("value (rotation in radians)")
    ax.set_title("learned hyperparameters")
    if "rotation" in series:
        ax.axhline(math.pi, linestyle=":", color="gray", label="pi (full rotation)")
    if series:
        ax.legend(fontsize="small", ncol=2 if len(series) > 6 else 1)
    else:
        ax.text(0.5, 0.5, "no hyperparameters", ha="center", transform=ax.transAxes)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
