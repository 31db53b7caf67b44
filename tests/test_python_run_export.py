"""A run trained from Python (``fit(..., checkpoint_dir=DIR)``) is exported by ``partition-fx export --run DIR``
without the Python that trained it: the command rebuilds the model, data and augmentation from ``DIR/run.json``
and reproduces the run's own test accuracy; a run it cannot rebuild is refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from partition_fx import export_subnetwork, partitionify
from partition_fx.cli import main
from partition_fx.datasets import load_dataset
from partition_fx.models import build_model
from partition_fx.training import evaluate_classifier, fit
from partition_fx.transforms import AffineAugmentation, InputMask

SIZE = 12


def _python_run(directory, *, hyper=None, seed: int = 3):
    data = load_dataset("digits", size=SIZE)
    torch.manual_seed(0)
    model = build_model("fixup_resnet8", data.num_classes, in_chans=1, img_size=SIZE)
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), seed=seed)
    hyper = AffineAugmentation(num_samples=2) if hyper is None else hyper
    fit(pmodel, data.train, hyper=hyper, steps=6, batch_size=16, seed=3, checkpoint_dir=directory, progress=False)
    accuracy, _ = evaluate_classifier(export_subnetwork(pmodel.cpu()).eval(), *data.test.tensors)
    return accuracy


def test_the_command_exports_a_python_run_with_its_test_accuracy(tmp_path, capsys):
    accuracy = _python_run(tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["config"]["model"] == "fixup_resnet8" and record["config"]["train"]["runtime"]["seed"] == 3
    assert main(["export", "--run", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    exported = json.loads((tmp_path / "out" / "export.json").read_text())
    assert exported["test_accuracy"] == accuracy and exported["checkpoint_step"] == 6
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_a_python_run_the_command_cannot_rebuild_is_refused_with_the_reason(tmp_path, capsys):
    _python_run(tmp_path / "seeds", seed=4)
    assert main(["export", "--run", str(tmp_path / "seeds"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "partitionify's seed (4) is not fit's (3)" in err and "export_subnetwork" in err
    assert not (tmp_path / "out").exists()
    _python_run(tmp_path / "mask", hyper=InputMask((1, SIZE, SIZE)))
    record = json.loads((tmp_path / "mask" / "run.json").read_text())
    assert record["config"] is None and "InputMask" in record["why_not"]


@pytest.mark.parametrize("named", ["model", "data"])
def test_parts_not_built_by_name_are_named(named, tmp_path):
    from partition_fx.job.train_config import TrainConfig
    from partition_fx.training.loop.fit import run_record

    data = load_dataset("digits", size=SIZE)
    model = build_model("fixup_resnet8", 10, in_chans=1) if named == "model" else torch.nn.Linear(2, 2)
    train = data.train if named == "data" else torch.utils.data.TensorDataset(*data.train.tensors)
    record = run_record(partitionify(model, 2), train, None, TrainConfig())
    assert record["config"] is None
    assert ("build_model" if named == "data" else "load_dataset") in record["why_not"]
