"""Training curves from a ``FitResult`` history, drawn to be read at a glance.

* :func:`figure_curves`: the conditional LML per example (top; the evidence the run is judged by, see
  ``cli.train.LML_EXPLAINED``) and the mean step losses (bottom) by iteration; a run without a conditional LML
  (one partition: plain training) the losses alone, titled so.
* :func:`figure_hyperparameters`: one panel per quantity, each with its own unit. The main one (rotation when
  it is learned, else the one with the largest values) is on top with its bound drawn; the others (e.g.
  translation, scale, shear) share the row below, on their own scales.

Both start the iteration axis at 0 and shade the fine-tuning phase (named in the x-axis label, so no text sits
on a curve). The hyperparameters start there too when their values at initialisation
are given (``initial``): the caller reads them from its modules before training. The LML has no value at 0:
estimating one would draw from the trainer's generator and so change the run; its curve starts at the first
evaluation, and the panel says so.

``plot_curves`` / ``plot_hyperparameters`` write the figures to files. Figures are built without pyplot, so
nothing here changes matplotlib's global backend or needs a display.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..choices import Phase

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not when the command line starts
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# What a hyperparameter's name means: (quantity, axis label with its unit). Matched on the name's last dotted
# component, without a list index (``head.drop.p`` -> ``p``, ``mask[3]`` -> ``mask``).
QUANTITIES: dict[str, tuple[str, str]] = {
    "rotation": ("rotation", "rotation range (radians)"),
    "translation_x": ("translation", "translation range\n(1 = half the image)"),
    "translation_y": ("translation", "translation range\n(1 = half the image)"),
    "scale_x": ("scale", "scale range (log-factor:\n" r"zoom by up to $e^{\pm r}$)"),
    "scale_y": ("scale", "scale range (log-factor:\n" r"zoom by up to $e^{\pm r}$)"),
    "shear": ("shear", "shear range (log-factor:\n" r"diagonals by up to $e^{\pm r}$)"),
    "p": ("dropout rate", "dropout rate p"),
    "mask": ("input mask", "mask value (0 drops, 1 keeps)"),
    "noise_scale": ("noise scale", "Gaussian noise scale (output units)"),
}
# Second axes in the unit a person thinks in: (label, forward, inverse).
READINGS: dict[str, tuple[str, Any, Any]] = {
    "rotation": ("degrees", np.degrees, np.radians),
    "translation": ("% of the image", lambda r: r * 50.0, lambda p: p / 50.0),
}
LOG_FACTORS = ("scale", "shear")
"""Quantities whose ranges are log-factors: a bound r is written as log e^r (0.693 = log 2)."""
SMALLEST_SPAN = 0.25
"""A small panel's y axis spans at least this share of its bound, so that noise of 0.01 near 0 stays small."""
FINETUNING = "shaded: fine-tuning, ψ frozen, all data"
"""How the x-axis label names the shaded phase."""
MAX_LEGEND = 8
"""Lines in one panel beyond which they are not named one by one (a mask's entries)."""


def figure_curves(history: Sequence[Mapping[str, Any]]) -> Figure:
    """The conditional LML per example (top) and the mean parameter / hyperparameter step losses since the
    previous evaluation (bottom), by iteration from 0, titled with what the run was (:func:`curves_title`). A
    history without a conditional LML (one partition: no evidence, ``training.objective.lml.NO_EVIDENCE``; or
    fine-tuning alone) has no LML to draw: its figure is the losses alone, and its title says why."""
    from matplotlib.figure import Figure

    steps = [r["step"] for r in history]
    scored = [(r["step"], r["conditional_lml_per_example"]) for r in history
              if r.get("conditional_lml_per_example") is not None]  # fmt: skip
    if scored:
        fig = Figure(figsize=(7.0, 5.6), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True)
        top.plot(*zip(*scored), "o-", color="tab:blue", markersize=4)
        top.set_ylabel("conditional LML per example (nats)\nhigher is better")
        first = f"first estimate at iteration {steps[0]}, none at 0"
        top.set_title(f"conditional LML, chunks 2..C ({first})", loc="left", fontsize="medium")
        top.ticklabel_format(axis="y", useOffset=False)  # an offset's text would sit on the title
        axes = [top, bottom]
    else:
        fig = Figure(figsize=(7.0, 3.6), layout="constrained")
        bottom = fig.subplots()
        axes = [bottom]
    for key, color, label in (
        ("train_loss", "tab:orange", "parameter steps (train loss)"),
        ("hyper_loss", "tab:green", "hyperparameter steps"),
    ):
        points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        if points:
            bottom.plot(*zip(*points), ".-", color=color, label=label)
    bottom.set_ylabel("mean loss since the\nprevious evaluation (nats)")
    bottom.ticklabel_format(axis="y", useOffset=False)  # as the LML's: an offset's text would sit on the title
    bottom.set_xlabel(_iteration_label(history))
    bottom.set_title("step losses (negative log-likelihood)", loc="left", fontsize="medium", pad=_title_pad(2))
    if bottom.lines:
        _legend_above(bottom, len(bottom.lines))
    for ax in axes:
        ax.grid(alpha=0.3)
        _mark_finetuning(ax, history)
    _start_at_zero(axes[0], steps)
    fig.suptitle(curves_title(history), fontweight="bold")
    return fig


def curves_title(history: Sequence[Mapping[str, Any]]) -> str:
    """What the run of ``history`` was, as :func:`figure_curves` titles it: partitioned training when it estimated
    a conditional LML; else, with one partition, plain training (or training of one partition, when it took
    hyperparameter steps), which has no LML evidence; else fine-tuning alone (or no evaluation at all).

    >>> curves_title([{"step": 5, "phase": "partitioned", "conditional_lml_per_example": -0.1}])
    'partitioned training'
    >>> curves_title([{"step": 5, "phase": "partitioned", "conditional_lml_per_example": None, "hyper_loss": None}])
    'plain training (one partition: no LML evidence)'
    >>> curves_title([{"step": 5, "phase": "partitioned", "hyper_loss": 0.4}])
    'training of one partition, hyperparameters learned (no LML evidence)'
    >>> curves_title([{"step": 5, "phase": "finetune", "hyper_loss": None}])
    'fine-tuning (no LML estimated)'
    """
    if any(r.get("conditional_lml_per_example") is not None for r in history):
        return "partitioned training"
    if not history:
        return "no evaluation"
    if all(r.get("phase") == Phase.FINETUNE for r in history):
        return "fine-tuning (no LML estimated)"
    if any(r.get("hyper_loss") is not None for r in history):
        return "training of one partition, hyperparameters learned (no LML evidence)"
    return "plain training (one partition: no LML evidence)"


def figure_hyperparameters(
    history: Sequence[Mapping[str, Any]],
    initial: Mapping[str, Any] | None = None,
    bounds: Mapping[str, float] | None = None,
) -> Figure:
    """One panel per quantity (rotation, translation, scale, shear, dropout rate, ...), labelled with its unit.

    ``initial``: the hyperparameters at initialisation, by the history's names (e.g.
    ``AffineAugmentation().hyperparameters()`` read before training), drawn at iteration 0. ``bounds``: the
    largest value each may take (e.g. ``AffineAugmentation.max_range``); the main panel draws its bound, the
    others name theirs. List-valued hyperparameters (a mask) give one line per entry.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = _series(history, initial or {})
    groups: dict[str, list[str]] = {}
    for name in series:
        groups.setdefault(_quantity(name)[0], []).append(name)
    fig = Figure(figsize=(11.0, 7.0) if len(groups) > 1 else (7.0, 4.4), layout="constrained")
    steps = [r["step"] for r in history]
    start = "iteration 0: values at initialisation" if initial else f"from the first evaluation, {_first(steps)}"
    phase = f"; {FINETUNING}" if finetune_start(history) is not None else ""
    fig.suptitle(f"learned hyperparameters ({start}{phase})", fontweight="bold")
    if not groups:
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no hyperparameters", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    main = "rotation" if "rotation" in groups else max(groups, key=lambda g: _largest(series, groups[g]))
    others = [g for g in groups if g != main]
    columns = max(1, min(3, len(others)))
    rows = 1 + math.ceil(len(others) / columns)
    grid = fig.add_gridspec(rows, columns, height_ratios=[1.4] + [1.0] * (rows - 1) if others else None)
    main_ax = fig.add_subplot(grid[0, :])
    _panel(main_ax, main, groups[main], series, bounds or {}, True, _title_pad(len(groups[main])))
    pad = max((_title_pad(len(groups[g])) for g in others), default=0)  # the row's titles level
    small = []
    for i, group in enumerate(others):
        ax = fig.add_subplot(grid[1 + i // columns, i % columns])
        _panel(ax, group, groups[group], series, bounds or {}, False, pad)
        small.append(ax)
    for ax in fig.axes:
        if (spec := ax.get_subplotspec()) is not None and spec.is_last_row():
            ax.set_xlabel("iteration")
    _start_at_zero(main_ax, steps)
    for ax in (main_ax, *small):
        _mark_finetuning(ax, history)
    for ax in small:  # the main panel's iterations, with fewer ticks so that narrow panels stay legible
        ax.set_xlim(main_ax.get_xlim())
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    return fig


def finetune_start(history: Sequence[Mapping[str, Any]]) -> int | None:
    """The iteration fine-tuning began at: the last partitioned evaluation before a fine-tuning one, or None.

    >>> finetune_start([{"step": 10, "phase": "partitioned"}, {"step": 20, "phase": "finetune"}])
    10
    >>> finetune_start([{"step": 10}]) is None
    True
    """
    previous = None
    for r in history:
        if r.get("phase") == Phase.FINETUNE:
            return previous
        previous = r["step"]
    return None


def _mark_finetuning(ax: Any, history: Sequence[Mapping[str, Any]]) -> None:
    """The fine-tuning phase (psi frozen, all data) shaded from where it began, behind the curves; the x-axis
    label (or the figure's title) names it, so no words sit on a curve or an axis label."""
    start = finetune_start(history)
    if start is not None:
        end = 1.05 * history[-1]["step"] + 1  # past the axis's end (``_start_at_zero``): clipped there
        ax.axvspan(start, end, color="0.92", zorder=0, linewidth=0)
        ax.axvline(start, color="0.5", linestyle="--", linewidth=1, zorder=0)


def _iteration_label(history: Sequence[Mapping[str, Any]]) -> str:
    """``iteration``, naming the shaded fine-tuning phase when there is one.

    >>> _iteration_label([{"step": 3, "phase": "partitioned"}, {"step": 4, "phase": "finetune"}])
    'iteration (shaded: fine-tuning, ψ frozen, all data)'
    """
    return f"iteration ({FINETUNING})" if finetune_start(history) is not None else "iteration"


def plot_curves(history: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write :func:`figure_curves` to ``path`` (PNG, or any format matplotlib writes by its suffix)."""
    return _save(figure_curves(history), path)


def plot_hyperparameters(
    history: Sequence[Mapping[str, Any]],
    path: str | Path,
    initial: Mapping[str, Any] | None = None,
    bounds: Mapping[str, float] | None = None,
) -> Path:
    """Write :func:`figure_hyperparameters` to ``path``."""
    return _save(figure_hyperparameters(history, initial, bounds), path)


def _save(fig: Figure, path: str | Path) -> Path:
    fig.savefig(path, dpi=120)
    return Path(path)


def _series(history: Sequence[Mapping[str, Any]], initial: Mapping[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """{line name: [(iteration, value), ...]}; a list-valued hyperparameter ``mask`` gives ``mask[0]``, ...;
    the initial values at iteration 0 first, unless the history already has iteration 0."""
    series: dict[str, list[tuple[int, float]]] = {}

    def add(step: int, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            entries = value if isinstance(value, (list, tuple)) else [value]
            for i, v in enumerate(entries):
                series.setdefault(name if len(entries) == 1 else f"{name}[{i}]", []).append((step, float(v)))

    if initial and not (history and history[0]["step"] == 0):
        add(0, initial)
    for r in history:
        add(r["step"], r["hyperparameters"])
    return series


def _base(name: str) -> str:
    """``head.drop.p`` -> ``p``; ``mask[3]`` -> ``mask``."""
    return re.sub(r"\[\d+\]$", "", name).rsplit(".", 1)[-1]


def _quantity(name: str) -> tuple[str, str]:
    base = _base(name)
    return QUANTITIES.get(base, (base, base.replace("_", " ")))


def _line_label(name: str, group: str) -> str:
    """What tells a group's lines apart: ``translation_x`` -> ``x``, ``head.drop.p`` -> ``head.drop``,
    ``mask[3]`` -> ``[3]``."""
    core = re.sub(r"\[\d+\]$", "", name)
    index = name[len(core) :]
    prefix, _, base = core.rpartition(".")
    kind, _, suffix = base.partition("_")
    return " ".join(p for p in (prefix, suffix if kind == group else "", index) if p) or name


def _largest(series: Mapping[str, list[tuple[int, float]]], names: list[str]) -> float:
    return max(abs(v) for name in names for _, v in series[name])


def _panel(
    ax: Axes,
    group: str,
    names: list[str],
    series: Mapping[str, list[tuple[int, float]]],
    bounds: Mapping[str, float],
    draw_bound: bool,
    title_pad: float,
) -> None:
    """One quantity's lines, its unit on the y axis, its bound drawn (``draw_bound``) or named in the title."""
    many = len(names) > MAX_LEGEND
    for name in names:
        steps, values = zip(*series[name])
        style = {"linewidth": 0.8, "alpha": 0.7} if many else {"marker": "o", "markersize": 3}
        ax.plot(steps, values, label=_line_label(name, group), **style)
    ax.set_ylabel(_quantity(names[0])[1])
    title = group if not many else f"{group} ({len(names)} entries)"
    limits = sorted({float(bounds[n]) for n in names if n in bounds})
    if len(limits) == 1:
        bound = limits[0]
        if draw_bound:
            is_pi = group == "rotation" and math.isclose(bound, math.pi, rel_tol=1e-6)
            words = "π: every angle" if is_pi else f"bound {bound:.3g}"
            ax.axhline(bound, linestyle="--", color="gray", linewidth=1)
            ax.annotate(words, (0.01, bound), xycoords=("axes fraction", "data"), va="bottom", color="dimgray")
            ax.set_ylim(0, bound * 1.08)
        else:
            title += f" (bound {_bound_words(group, bound)})"
    ax.set_title(title, loc="left", fontsize="medium", pad=title_pad)
    if not (draw_bound and len(limits) == 1):
        top = max(v for name in names for _, v in series[name])
        bottom = min(0.0, *(v for name in names for _, v in series[name]))
        upper = top + 0.15 * (top - bottom) if top > bottom else None  # room for the words
        if len(limits) == 1:  # a range near 0 is drawn on its bound's scale, not magnified into swings
            upper = max(upper or 0.0, bottom + SMALLEST_SPAN * limits[0])
        ax.set_ylim(bottom, upper)
    if group in READINGS:
        label, forward, inverse = READINGS[group]
        ax.secondary_yaxis("right", functions=(forward, inverse)).set_ylabel(label)
    if draw_bound and len(names) <= 2:  # the main panel: its final values in words
        for name, line in zip(names, ax.lines):
            step, value = series[name][-1]
            words = f"{value:.2f} rad ({math.degrees(value):.0f}°)" if group == "rotation" else f"{value:.3g}"
            ax.annotate(
                words, (step, value), xytext=(-4, 6), textcoords="offset points", ha="right", color=line.get_color()
            )
    if 1 < len(names) <= MAX_LEGEND:
        _legend_above(ax, len(names))
    ax.grid(alpha=0.3)


def _bound_words(group: str, bound: float) -> str:
    """A bound as the title says it: a log-factor's with the factor it allows.

    >>> _bound_words("scale", math.log(2)), _bound_words("translation", 1.0)
    ('0.693 = log 2', '1')
    """
    return f"{bound:.3g} = log {math.exp(bound):.3g}" if group in LOG_FACTORS else f"{bound:.3g}"


def _legend_above(ax: Axes, entries: int) -> None:
    """A legend outside the axes, between them and their title (raised by ``_title_pad``): it covers no line."""
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=min(entries, 4), frameon=False, fontsize="small")


def _title_pad(lines: int) -> float:
    """Points between a panel and its title: room for ``_legend_above``'s rows when the lines get a legend."""
    rows = math.ceil(lines / 4) if 1 < lines <= MAX_LEGEND else 0
    return 6.0 + 18.0 * rows


def _start_at_zero(ax: Axes, steps: Sequence[int]) -> None:
    """Iterations from 0 (where training starts), with room for the last marker."""
    last = max(steps[-1] if steps else 1, 1)
    ax.set_xlim(0, last * 1.02)


def _first(steps: Sequence[int]) -> str:
    return f"iteration {steps[0]}" if steps else "none"
