"""Experiment tracking (``partition_fx.training.tracking``): what a run logs is read back with each backend's own
reader (TensorBoard's ``EventAccumulator``, MLflow's client, the csv module) and checked against the run's history."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.errors import PartitionArgumentError, PartitionDependencyError
from partition_fx.training import CSVTracker, PartitionedTrainer, TrainingHook, fit
from partition_fx.training import tracking as tracking_module
from partition_fx.transforms import InputMask


def _run(hooks, **keywords):
    torch.manual_seed(0)
    x = torch.randn(80, 4)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    pmodel = partitionify(model, 2, (0.7, 0.3))
    return fit(
        pmodel, (x, y), hyper=InputMask(4), steps=10, batch_size=16, eval_every=5, progress=False, hooks=hooks,
        **keywords,
    )  # fmt: skip


def _expected(result):
    """Each evaluation's step and conditional LML (None in fine-tuning) and the mask's first entry."""
    return [(r["step"], r["conditional_lml"], r["hyperparameters"]["mask"][0]) for r in result.history]


def test_csv_tracker_logs_every_evaluation(tmp_path):
    with CSVTracker(tmp_path, params={"job": {"model": "mlp"}}) as tracker:
        result = _run([tracker])
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    logged = {(int(r["step"]), r["name"]): float(r["value"]) for r in rows}
    for step, conditional, mask in _expected(result):
        assert logged[(step, "hyper/mask/0")] == mask
        assert logged.get((step, "conditional_lml")) == conditional
    assert logged[(10, "final/best_step")] == result.best_step
    with open(tmp_path / "params.csv", newline="") as f:
        params = dict(csv.reader(f))
    assert params["job.model"] == "mlp" and params["train.optimization.steps"] == "10"


def test_tensorboard_tracker_is_read_back_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'partition-fx[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from partition_fx.training import TensorBoardTracker

    with TensorBoardTracker(tmp_path / "tb") as tracker:
        result = _run([tracker])
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    masks = {e.step: e.value for e in events.Scalars("hyper/mask/0")}
    lmls = {e.step: e.value for e in events.Scalars("conditional_lml")}
    for step, conditional, mask in _expected(result):
        assert masks[step] == pytest.approx(mask)  # TensorBoard keeps float32
        assert lmls.get(step) == (None if conditional is None else pytest.approx(conditional))
    assert "lr" in events.Tags()["scalars"] and "config/text_summary" in events.Tags()["tensors"]


def test_mlflow_tracker_is_read_back_by_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'partition-fx[mlflow]'")
    from mlflow.tracking import MlflowClient

    from partition_fx.training import MLflowTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with MLflowTracker("tests", run_name="mlp", database=tmp_path / "mlflow.db") as tracker:
        result = _run([tracker])
    assert tracker.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow's recommended local store
    client = MlflowClient(tracker.tracking_uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "mlp"
    assert run.data.params["train.optimization.steps"] == "10"
    masks = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "hyper/mask/0")}
    lmls = {m.step: m.value for m in client.get_metric_history(tracker.run_id, "conditional_lml")}
    for step, conditional, mask in _expected(result):
        assert masks[step] == mask and lmls.get(step) == conditional
    # MLFLOW_TRACKING_URI, when set, is where runs go
    elsewhere = (tmp_path / "elsewhere").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    with MLflowTracker("tests", database=tmp_path / "mlflow.db") as other:
        assert other.tracking_uri == elsewhere


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(PartitionDependencyError, match=r"^logging to mlflow needs mlflow, which is not installed: pip"):
        tracking_module.trackers_for(["csv", "mlflow"], tmp_path)
    assert not (tmp_path / "metrics.csv").exists()
    with pytest.raises(PartitionArgumentError, match=r"not a tracker; one of tensorboard, mlflow, csv"):
        tracking_module.trackers_for(["wandb"], tmp_path)


def test_the_train_command_logs_to_each_tracker_it_names(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'partition-fx[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from partition_fx.cli import main

    out = tmp_path / "run"
    argv = ["train", "--model", "fixup_resnet8", "--image-size", "8", "--steps", "4", "--batch-size", "8"]
    assert main([*argv, "--eval-every", "2", "--quiet", "--log", "csv,tensorboard", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    with open(out / "metrics.csv", newline="") as f:
        logged = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)}
    assert logged[(4, "test_accuracy")] == report["test_accuracy"]
    for record in report["history"]:
        for name, value in record["hyperparameters"].items():
            assert logged[(record["step"], f"hyper/{name}")] == value
    with open(out / "params.csv", newline="") as f:
        params = dict(csv.reader(f))
    assert params["job.model"] == "fixup_resnet8" and params["train.optimization.steps"] == "4"
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("test_accuracy")] == [4]
    assert [e.step for e in events.Scalars("lr")] == [r["step"] for r in report["history"]]


class _StopAfterLogging(TrainingHook):
    """Ctrl-C at the evaluation of ``step``, after the trackers before it logged that evaluation and before the
    checkpoint of it was written: the resumed run trains and logs that evaluation again."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_evaluation(self, trainer, record, improved):
        if record["step"] == self.step:
            raise KeyboardInterrupt


def _trackers(directory: Path) -> list:
    from partition_fx.training import MLflowTracker, TensorBoardTracker

    return [
        CSVTracker(directory),
        TensorBoardTracker(directory / "tb"),
        MLflowTracker("tests", run_name="mlp", database=directory / "mlflow.db"),
    ]


def _logged(directory: Path) -> dict:
    """What each tracker in ``directory`` holds, by backend: (step, name) -> value, without the seconds."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(directory / "metrics.csv", newline="") as f:
        rows = [(int(r["step"]), r["name"], float(r["value"])) for r in csv.DictReader(f)]
    events = EventAccumulator(str(directory / "tb"), size_guidance={"scalars": 0}).Reload()
    client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = [m for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
    # MLflow cannot delete a logged value: an evaluation logged again after a resume has two, the later one counts
    latest = {(m.step, m.key): m.value for m in sorted(history, key=lambda m: m.timestamp)}
    history = [(step, key, value) for (step, key), value in latest.items()]
    scalars = [(e.step, tag, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]
    drop = lambda logged: sorted(r for r in logged if r[1] != "final/seconds")  # noqa: E731
    return {"csv": drop(rows), "tensorboard": drop(scalars), "mlflow": drop(history), "status": run.info.status}


def test_a_resumed_run_continues_what_its_trackers_logged_as_if_it_had_not_stopped(tmp_path, monkeypatch):
    """The definition: a run stopped after its trackers logged an evaluation whose checkpoint was never written,
    then resumed with new trackers, leaves each backend holding what an uninterrupted run's trackers hold (one
    MLflow run, KILLED while stopped, FINISHED at the end), nothing twice (MLflow keeps both values of the evaluation
    logged again: it cannot delete one)."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install 'partition-fx[tensorboard]'")
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'partition-fx[mlflow]'")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    trackers = _trackers(whole)
    _run([*trackers, CSVTracker(tmp_path / "unused")], checkpoint_dir=whole / "checkpoint")
    for tracker in trackers:
        tracker.close()
    trackers = _trackers(stopped)
    with pytest.raises(KeyboardInterrupt):
        _run([*trackers, _StopAfterLogging(10)], checkpoint_dir=stopped / "checkpoint")
    for tracker in trackers:
        tracker.close("interrupted")
    assert _logged(stopped)["status"] == "KILLED" and (10, "lr") in {r[:2] for r in _logged(stopped)["csv"]}
    trackers = _trackers(stopped)  # a new process: new trackers, the MLflow run's id from the resume state
    _run(trackers, checkpoint_dir=stopped / "checkpoint", resume=stopped / "checkpoint" / "resume")
    for tracker in trackers:
        tracker.close()
    expected, got = _logged(whole), _logged(stopped)
    assert got["status"] == expected["status"] == "FINISHED"
    for backend in ("csv", "tensorboard", "mlflow"):
        assert got[backend] == expected[backend], backend


def test_the_train_command_resumed_as_it_says_keeps_logging_to_its_trackers(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "fixup_resnet8", "--image-size", "8", "--steps", "4", "--batch-size", "8"]
    argv += ["--eval-every", "2", "--quiet", "--out", str(out), "--log", "csv"]
    iteration = PartitionedTrainer.iteration

    def interrupted(self):
        if self.step == 3:
            raise KeyboardInterrupt
        iteration(self)

    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupted)
        assert main(argv) == 130
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and report["log"] == ["csv"]
    assert f"continue with `partition-fx train --resume {out}`" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--quiet"]) == 0  # as the tool says: without --log
    assert f"wrote {out}/: report.json" in capsys.readouterr().out.splitlines()[-1]
    report = json.loads((out / "report.json").read_text())
    with open(out / "metrics.csv", newline="") as f:
        logged = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)}
    assert logged[(4, "test_accuracy")] == report["test_accuracy"] and (4, "final/best_step") in logged
    assert sorted({step for step, _ in logged}) == [r["step"] for r in report["history"]]
    assert report["files"]["trackers"] == ["metrics.csv", "params.csv"] and report["log"] == ["csv"]
    # a run that logged is replaced by --overwrite like any other (its tracker files are its own)
    assert main([*argv[:-2], "--log", "csv,tensorboard,mlflow", "--overwrite"]) == 0
    assert main([*argv[:-2], "--overwrite"]) == 0
    assert not (out / "metrics.csv").exists() and not (out / "mlflow.db").exists()


def test_a_tracking_store_mlflow_refuses_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'partition-fx[mlflow]'")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'store'}")  # MLflow 3 refuses a file store
    out = tmp_path / "run"
    argv = ["train", "--model", "fixup_resnet8", "--image-size", "8", "--steps", "2", "--batch-size", "8", "--quiet"]
    assert main([*argv, "--out", str(out), "--log", "csv,mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: --log mlflow: MLflow cannot use MLFLOW_TRACKING_URI 'file:") and (
        "\n" not in err
    )
    assert not out.exists()


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    """A real process, stopped as ``kill``, ``timeout``, Slurm and Kubernetes stop one."""
    out = tmp_path / "run"
    argv = ["train", "--model", "fixup_resnet8", "--image-size", "8", "--steps", "100000", "--batch-size", "8"]
    argv += ["--eval-every", "5", "--quiet", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "partition_fx.cli", *argv], stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until its first checkpoint is written
        try:
            if json.loads((out / "report.json").read_text()).get("last_checkpoint_step"):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert (
        f"interrupted by SIGTERM; the last checkpoint and report.json are kept: continue with `partition-fx train \
--resume {out}`"
        in err
    )
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and (out / "checkpoint" / "resume").is_dir()
