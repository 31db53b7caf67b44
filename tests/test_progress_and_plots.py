"""What a run shows while it trains (a bar on a terminal, one line per evaluation otherwise) and the plots it
writes at the end (one panel per quantity, units, bounds, iteration 0, legends that cover no line)."""

from __future__ import annotations

import contextlib
import io
import math
import re

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.cli.plots import (
    figure_curves,
    figure_hyperparameters,
    plot_curves,
    plot_hyperparameters,
)
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import fit
from partition_fx.transforms import AffineAugmentation, InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

LINE = re.compile(
    r"^partition-fx: step (\d+)/20 \| conditional LML -?\d+\.\d \(-?\d+\.\d{3}/example\) \| train loss \S+ \| "
    r"mask mean \S+ of 4 \| \d+:\d\d elapsed, ~(\d+):(\d\d) left$"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def tiny_fit(stderr: io.StringIO, **kwargs):
    torch.manual_seed(0)
    x = torch.randn(120, 4)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    pmodel = partitionify(model, 2, (0.7, 0.3))
    with contextlib.redirect_stderr(stderr):
        result = fit(pmodel, (x, y), PAPER, hyper=InputMask(4), steps=20, eval_every=5, batch_size=16, **kwargs)
    return pmodel, result


def test_without_a_terminal_each_evaluation_is_one_line_with_step_lml_and_remaining_time():
    err = io.StringIO()
    tiny_fit(err)
    lines = err.getvalue().splitlines()
    assert len(lines) == 4, err.getvalue()
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [5, 10, 15, 20]
    assert matches[-1].group(2, 3) == ("0", "00")  # nothing left at the last evaluation


def test_progress_false_prints_nothing_and_true_forces_the_bar():
    quiet = io.StringIO()
    tiny_fit(quiet, progress=False)
    assert quiet.getvalue() == ""
    forced = io.StringIO()
    tiny_fit(forced, progress=True)
    assert "partitioned training" in forced.getvalue() and "partition-fx: step" not in forced.getvalue()


def test_a_terminal_gets_the_bar_and_no_lines():
    err = Terminal()
    tiny_fit(err)
    assert "partitioned training" in err.getvalue() and "partition-fx: step" not in err.getvalue()


def test_progress_lines_do_not_change_the_run():
    pmodel_lines, with_lines = tiny_fit(io.StringIO())
    pmodel_quiet, quiet = tiny_fit(io.StringIO(), progress=False)
    assert [r["lml"] for r in with_lines.history] == [r["lml"] for r in quiet.history]
    assert with_lines.hyperparameters == quiet.hyperparameters
    for (name, a), (_, b) in zip(pmodel_lines.state_dict().items(), pmodel_quiet.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_run_quiet_for_a_while_says_its_pace_and_time_left_before_its_first_evaluation(monkeypatch):
    """Nothing was written for ~40 s before the main job's first evaluation when stderr is not a terminal; now,
    after QUIET_SECONDS of silence, one line (here set to 0: as soon as there is a pace, measured from the end of
    the first step, whose one-time costs say nothing of the rest), then the evaluations."""
    monkeypatch.setattr("partition_fx.training.loop.progress.QUIET_SECONDS", 0.0)
    err = io.StringIO()
    tiny_fit(err)
    first, *evaluations = err.getvalue().splitlines()
    assert re.match(r"^partition-fx: step 2/20 \| \S+ s per step \| \d+:\d\d elapsed, ~\d+:\d\d left$", first), first
    assert len(evaluations) == 4 and all(LINE.match(line) for line in evaluations)


def test_a_compiling_run_says_so_before_its_first_step(monkeypatch):
    """``--compile`` on a CPU gave no sign of life for minutes: the first step compiles. A line says so (the bar
    says it on a terminal); the pace is measured after that step. (Compilation itself is ``test_compile``'s.)"""
    from partition_fx import PartitionedModel

    monkeypatch.setattr(PartitionedModel, "compile", lambda self, *args, **kwargs: None)
    err = io.StringIO()
    tiny_fit(err, compile="default")
    lines = err.getvalue().splitlines()
    assert lines[0] == "partition-fx: torch.compile compiles the model in the first step: minutes on a CPU"
    assert len(lines) == 5 and all(LINE.match(line) for line in lines[1:])
    terminal = Terminal()
    tiny_fit(terminal, compile="default")
    assert "compiling (torch.compile, the first step)" in terminal.getvalue()


TINY = ["--model", "fixup_resnet8", "--image-size", "16", "--steps", "4", "--batch-size", "8", "--samples", "2"]
TINY += ["--eval-every", "2"]


def test_train_prints_a_line_per_evaluation_unless_quiet_and_writes_the_plots(tmp_path, capsys):
    assert main(["train", *TINY, "--out", str(tmp_path / "loud")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(
        "partition-fx: train fixup_resnet8 on rotdigits (1438 training images, 359 test) for 4 steps: 3 partitioned, "
        "then 1 fine-tuning; evaluated every 2 steps\n"
    )
    assert [line.split(" | ")[0] for line in err.splitlines() if line.startswith("partition-fx: step")] == [
        "partition-fx: step 2/4",
        "partition-fx: step 3/4",  # the last partitioned evaluation: fine-tuning begins (int(0.4 x 4) = 1 step)
        "partition-fx: step 4/4",
    ]
    assert main(["train", *TINY, "--quiet", "--out", str(tmp_path / "quiet")]) == 0
    assert "partition-fx: step" not in capsys.readouterr().err
    for name in ("lml.png", "hyperparameters.png"):
        assert (tmp_path / "quiet" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def affine_history(steps=(10, 20, 30)):
    aug = AffineAugmentation(init=0.0)  # the small ranges near 0 that the axes must not exaggerate
    history = []
    for i, step in enumerate(steps, 1):
        values = {name: 0.01 * i for name in aug.generators}
        values["rotation"] = 0.5 * i
        history.append(
            {"step": step, "lml_per_example": -2.0 + 0.1 * i, "train_loss": 1.0 / i, "hyperparameters": values}
        )
    return aug, history


def panels(fig):
    """{left title: axes} of a figure's panels."""
    return {ax.get_title(loc="left").split(" (")[0]: ax for ax in fig.axes}


def draw(fig):
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def test_hyperparameters_have_a_panel_per_quantity_with_units_bounds_and_iteration_zero():
    aug, history = affine_history()
    fig = figure_hyperparameters(history, aug.hyperparameters(), aug.max_range)
    found = panels(fig)
    assert list(found) == ["rotation", "translation", "scale", "shear"]
    assert found["rotation"].get_ylabel() == "rotation range (radians)"
    assert "half the image" in found["translation"].get_ylabel()
    assert "log-factor" in found["scale"].get_ylabel() and "log-factor" in found["shear"].get_ylabel()
    # rotation's bound pi is drawn; the small ranges name their bound (a log-factor's as log 2) and are drawn on
    # a quarter of it at least, so that ranges of 0.01-0.03 near 0 do not look like large swings
    assert any(list(line.get_ydata()) == [math.pi, math.pi] for line in found["rotation"].lines)
    assert found["translation"].get_ylim() == (0.0, 0.25 * aug.max_range["translation_x"])
    assert "bound 0.693 = log 2" in found["scale"].get_title(loc="left")
    # every curve starts at iteration 0 with the initial value (0), and so does every axis
    for ax in found.values():
        assert ax.get_xlim()[0] == 0
        for line in ax.lines:
            if len(line.get_xdata()) > 2:
                assert line.get_xdata()[0] == 0 and line.get_ydata()[0] == 0
    assert [line.get_label() for line in found["translation"].lines] == ["x", "y"]


def test_legends_cover_no_line_and_no_title():
    aug, history = affine_history()
    for fig in (figure_hyperparameters(history, aug.hyperparameters(), aug.max_range), figure_curves(history)):
        renderer = draw(fig)
        legends = [ax for ax in fig.axes if ax.get_legend() is not None]
        assert legends
        for ax in legends:
            box = ax.get_legend().get_window_extent(renderer)
            assert box.y0 >= ax.get_window_extent(renderer).y1 - 1  # above the axes: no line is under it
            (title,) = [t for t in ax.findobj(Text) if t.get_text() == ax.get_title(loc="left")]
            assert not box.overlaps(title.get_window_extent(renderer))


def test_curves_start_at_zero_and_say_where_the_lml_starts():
    _, history = affine_history()
    for r in history:  # C >= 2: the conditional LML is the curve
        r["conditional_lml_per_example"] = r["lml_per_example"] / 10
    fig = figure_curves(history)
    top, bottom = fig.axes
    assert top.get_xlim()[0] == 0 and "first estimate at iteration 10" in top.get_title(loc="left")
    assert "LML per example" in top.get_ylabel() and bottom.get_xlabel() == "iteration"
    assert {line.get_label() for line in bottom.lines} == {"parameter steps (train loss)"}


def test_a_plain_retrain_draws_its_losses_alone_titled_plain_training(tmp_path):
    """A plain retrain (``train --partitions 1 --fix-from RUN``: one partition, the ranges fixed, no
    hyperparameter steps) estimates no conditional LML: its LML scores chunk 1 by the untrained defaults, no
    evidence (issue 41 stopped drawing it as one). lml.png then drew an empty LML panel saying so under the title
    "partitioned training"; it now draws the losses alone, titled as what the run was."""
    _, history = affine_history((2, 3, 4))  # as such a run's report.json has it: its fine-tuning, too
    for r in history:
        r.update(phase="partitioned", lml=-3311.1, conditional_lml_per_example=None, hyper_loss=None)
    history[-1].update(phase="finetune", lml=None, lml_per_example=None)
    fig = figure_curves(history)
    assert fig.get_suptitle() == "plain training (one partition: no LML evidence)"
    [losses] = fig.axes  # no LML panel, empty or saying why
    assert losses.get_title(loc="left") == "step losses (negative log-likelihood)" and not losses.texts
    assert [line.get_label() for line in losses.lines if not line.get_label().startswith("_")] == [
        "parameter steps (train loss)"
    ]
    assert losses.get_xlim()[0] == 0 and "shaded: fine-tuning" in losses.get_xlabel()
    assert plot_curves(history, tmp_path / "lml.png").read_bytes()[:4] == b"\x89PNG"
    for r in history:  # psi learned from one partition: still no evidence, and not called plain
        r["hyper_loss"] = 0.5
    assert (
        figure_curves(history).get_suptitle() == "training of one partition, hyperparameters learned (no LML evidence)"
    )
    for r in history[:-1]:  # partitions 2..C: the conditional LML on top, and partitioned training
        r["conditional_lml_per_example"] = -0.2
    partitioned = figure_curves(history)
    assert partitioned.get_suptitle() == "partitioned training" and len(partitioned.axes) == 2
    assert "conditional LML per example" in partitioned.axes[0].get_ylabel()


def test_other_hyperparameters_and_none(tmp_path):
    history = [
        {"step": s, "hyperparameters": {"mask": [0.9, 0.5 + s / 100], "head.drop.p": 0.1 * s / 10}} for s in (10, 20)
    ]
    fig = figure_hyperparameters(history, bounds={"head.drop.p": 0.95})
    found = panels(fig)
    assert set(found) == {"input mask", "dropout rate"}
    assert "first evaluation, iteration 10" in fig.get_suptitle()
    assert [line.get_label() for line in found["input mask"].lines] == ["[0]", "[1]"]
    empty = figure_hyperparameters([{"step": 4, "hyperparameters": {}}])
    assert "no hyperparameters" in [t.get_text() for t in empty.axes[0].texts]
    assert plot_hyperparameters(history, tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_curves([{**r, "lml_per_example": -1.0} for r in history], tmp_path / "c.png").stat().st_size > 1000


@pytest.mark.parametrize("initial_at_zero", [True, False])
def test_a_history_that_has_iteration_zero_is_not_given_it_twice(initial_at_zero):
    history = [{"step": 0, "hyperparameters": {"rotation": 0.0}}, {"step": 5, "hyperparameters": {"rotation": 1.0}}]
    fig = figure_hyperparameters(history, {"rotation": 0.0} if initial_at_zero else None, {"rotation": math.pi})
    assert list(panels(fig)["rotation"].lines[0].get_xdata()) == [0, 5]


def test_the_finetuning_phase_is_shaded_and_named_in_the_axis_label_not_written_on_a_curve():
    """The words "fine-tuning" were drawn inside the axes at the top of the line where it began: on lml.png over
    the last LML point (the highest, at that line), on hyperparameters.png into a narrow panel's axis label."""
    aug, history = affine_history((10, 20, 30, 40))
    history[-1]["phase"] = "finetune"
    history[-1]["lml_per_example"] = None
    for r in history[:-1]:
        r["conditional_lml_per_example"] = r["lml_per_example"] / 10
    for fig in (figure_curves(history), figure_hyperparameters(history, aug.hyperparameters(), aug.max_range)):
        assert not [t for ax in fig.axes for t in ax.texts if "fine-tuning" in t.get_text()]
        assert "shaded: fine-tuning" in " ".join([fig.get_suptitle(), *(ax.get_xlabel() for ax in fig.axes)])
        for ax in fig.axes:
            spans = [p for p in ax.patches if p.get_x() == 30]  # the phase, shaded from where it began
            assert len(spans) == 1 and spans[0].get_zorder() < 1  # behind the curves (zorder 2)
    top = figure_curves(history).axes[0]
    assert "conditional LML per example" in top.get_ylabel()
    assert list(top.lines[0].get_ydata()) == [r["conditional_lml_per_example"] for r in history[:-1]]
