"""Experiment tracking (``partition_fx.training.tracking``): what a run logs is read back with each backend's own
reader (TensorBoard's ``EventAccumulator``, MLflow's client, the csv module) and checked against the run's history."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.training import CSVTracker, fit
from partition_fx.training import tracking as tracking_module
from partition_fx.transforms import InputMask


def _run(hooks):
    torch.manual_seed(0)
    x = torch.randn(80, 4)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    pmodel = partitionify(model, 2, (0.7, 0.3))
    return fit(pmodel, (x, y), hyper=InputMask(4), steps=10, batch_size=16, eval_every=5, progress=False, hooks=hooks)


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
    with MLflowTracker("tests", run_name="mlp", default_store=tmp_path / "mlruns") as tracker:
        result = _run([tracker])
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
    with MLflowTracker("tests", default_store=tmp_path / "mlruns") as other:
        assert other.tracking_uri == elsewhere


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch, tmp_path):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else found(name, *a))
    with pytest.raises(PartitionArgumentError, match=r"^logging to mlflow needs the mlflow package: pip install"):
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
