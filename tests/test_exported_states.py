"""Every exported state reproduces the accuracy the run reported for it (issue 25): ``export --which best``
the test accuracy of the report's ``highest_lml_state``, ``--which last`` its ``test_accuracy``, with fine-tuning
and without, on a model with BatchNorm, without building a trainer (issue 27); an interrupted run's checkpoints,
whose BatchNorm statistics are training's, export as the state recalibrated for the final subnetwork; and the end
of a run writes ``best.safetensors`` recalibrated on a copy, leaving the returned model and torch's random
generator as they are."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.export import export_subnetwork
from partition_fx.job.build import build_job
from partition_fx.job.records import read_spec
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, evaluate_classifier, fit, recalibrate_norm_statistics
from partition_fx.training.checkpoint import read_checkpoint

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

# resnet10t has BatchNorm; 6 steps, evaluations at 2, 4 and 6 (and 5, where fine-tuning begins)
TINY = ["--model", "resnet10t", "--image-size", "16", "--steps", "6", "--eval-every", "2", "--batch-size", "16"]
TINY += ["--data", "digits", "--quiet"]


def _falling_lml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negate every LML estimate (training is unchanged): the LML falls, so the first evaluation is the best."""
    original = PartitionedTrainer.estimate_lml

    def negated(self):
        estimate = original(self)
        negated_chunks = [-term for term in estimate.per_chunk]  # the conditional LML, which picks the best, too
        return dataclasses.replace(
            estimate, total=-estimate.total, per_chunk=negated_chunks, per_example=-estimate.per_example
        )

    monkeypatch.setattr(PartitionedTrainer, "estimate_lml", negated)


def _rising_lml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Add 1000 nats per iteration done to every chunk's LML estimate (training is unchanged): the LML rises, so
    the last partitioned evaluation is the best."""
    original = PartitionedTrainer.estimate_lml

    def rising(self):
        estimate = original(self)
        chunks = [term + 1000.0 * self.step for term in estimate.per_chunk]
        examples = estimate.total / estimate.per_example
        return dataclasses.replace(estimate, total=sum(chunks), per_chunk=chunks, per_example=sum(chunks) / examples)

    monkeypatch.setattr(PartitionedTrainer, "estimate_lml", rising)


def _exported(run: Path, which: str, *argv: str) -> dict:
    out = run.parent / f"{run.name}-{which}{''.join(argv)}"
    assert main(["export", "--run", str(run), "--which", which, *argv, "--out", str(out)]) == 0
    return json.loads((out / "export.json").read_text())


def _recalibrated_accuracy(run: Path, which: str, subnetwork: int | None = None) -> float:
    """The definition: the checkpoint's state, its BatchNorm statistics recalibrated for ``subnetwork`` (default
    the final one) over the training data (on a copy, as the end of a run does), exported."""
    job = build_job(read_spec(json.loads((run / "report.json").read_text())["config"]))
    trainer = PartitionedTrainer(job.pmodel, job.data.train, job.config, hyper=job.hyper)
    trainer.load_checkpoint(run / "checkpoint" / f"{which}.safetensors")
    pmodel = copy.deepcopy(job.pmodel)
    batch_size = trainer.config.evaluation.batch_size
    assert recalibrate_norm_statistics(pmodel, trainer.examples, subnetwork, batch_size=batch_size) > 0
    return evaluate_classifier(export_subnetwork(pmodel, subnetwork).eval(), *job.data.test.tensors)[0]


def _no_trainer(self, *args, **kwargs):
    raise AssertionError("export built a PartitionedTrainer")


def _record_splits(monkeypatch: pytest.MonkeyPatch) -> list:
    """The ``split`` of every dataset the command line loads from now on (None: both), in order."""
    import partition_fx.job.build as job_module

    loaded: list = []
    original = job_module.load_dataset

    def recording(*args, split=None, **kwargs):
        loaded.append(split)
        return original(*args, split=split, **kwargs)

    monkeypatch.setattr(job_module, "load_dataset", recording)
    return loaded


@pytest.mark.parametrize("finetune", [True, False])
def test_export_of_best_and_last_reproduces_the_reported_accuracies(tmp_path, monkeypatch, finetune):
    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        if not finetune:
            _falling_lml(patched)  # the best state (step 2) is neither the last nor the one fine-tuning starts from
        else:
            _rising_lml(patched)  # the best state is the one fine-tuning starts from
        argv = [] if finetune else ["--finetune-steps", "0"]
        assert main(["train", *TINY, *argv, "--out", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    highest = report["highest_lml_state"]
    with monkeypatch.context() as patched:  # calibrated at the end of the run: exported without a trainer
        patched.setattr(PartitionedTrainer, "__init__", _no_trainer)
        loaded = _record_splits(patched)
        best, last = _exported(run, "best"), _exported(run, "last")
    assert loaded == ["test", "test"]  # ... and without the training data
    assert (best["checkpoint_step"], last["checkpoint_step"]) == (highest["step"], report["steps"])
    assert last["test_accuracy"] == report["test_accuracy"]
    if finetune:  # the best state is the one fine-tuning began from, scored before fine-tuning by its own hook
        assert highest["step"] == report["finetune_start"] == 4  # 6 - int(0.4 x 6)
        assert best["test_accuracy"] == report["partitioned_test_accuracy"]
    else:
        assert highest["step"] == 2 != report["steps"]
        assert best["test_accuracy"] == _recalibrated_accuracy(run, "best")
        assert not os.path.samefile(run / "checkpoint" / "best.safetensors", run / "checkpoint" / "last.safetensors")
    assert best["test_accuracy"] == highest["test_accuracy"]
    # neither the report nor the export presents this earlier state as the final model
    assert not highest["is_final_model"] and "not the fine-tuned model" in highest["explained"]
    assert best["state"] == highest["explained"] and last["state"].startswith("the run's final state")
    # calibrated at the end of the run: their export needs no training data to recalibrate them
    assert best["norm_statistics"] == last["norm_statistics"] == "final"
    assert best["recalibrated_norms"] == last["recalibrated_norms"] == 0
    if not finetune:  # another subnetwork than the final one: recalibrated for it, over the training split
        with monkeypatch.context() as patched:
            loaded = _record_splits(patched)
            other = _exported(run, "last", "--subnetwork", "2")
        assert loaded == ["test", "train"]
        assert other["recalibrated_norms"] > 0
        assert other["test_accuracy"] == _recalibrated_accuracy(run, "last", subnetwork=2)


def test_an_interrupted_runs_checkpoints_export_recalibrated(tmp_path, monkeypatch, capsys):
    original = PartitionedTrainer.iteration

    def interrupt_after_step_4(self):
        if self.step == 4:
            raise KeyboardInterrupt
        original(self)

    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        _falling_lml(patched)  # best: step 2, last: step 4
        patched.setattr(PartitionedTrainer, "iteration", interrupt_after_step_4)
        assert main(["train", *TINY, "--out", str(run)]) == 130
    states = {}
    for which, step in (("best", 2), ("last", 4)):
        exported = _exported(run, which)
        states[which] = exported["state"]
        assert exported["checkpoint_step"] == step
        assert exported["test_accuracy"] == _recalibrated_accuracy(run, which), which
        meta = read_checkpoint(run / "checkpoint" / f"{which}.safetensors", {})[1]
        assert meta["norm_statistics"] == exported["norm_statistics"] == "training"
        assert exported["recalibrated_norms"] > 0
    # the last checkpoint of an unfinished run is said to be one, not the run's final model
    assert states["last"].startswith("the last checkpoint of a run that did not finish (interrupted, step 4 of ")
    assert "not its final model" in states["last"] and "not the fine-tuned model" in states["best"]


def _bn_pmodel() -> nn.Module:
    torch.manual_seed(0)
    # dropout after the BatchNorm: a recalibration pass draws random numbers but its statistics do not depend on them
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    return partitionify(model, 3, (0.5, 0.25, 0.25), seed=1)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g) * 3 + 1
    return x, (x[:, 0] > 1).long()


@pytest.mark.parametrize("case", ["earlier best", "best is last", "restored best"])
def test_the_end_of_a_run_writes_best_recalibrated_on_a_copy(tmp_path, monkeypatch, case):
    x, y = _data()
    kwargs = dict(steps=6, eval_every=2, batch_size=8, progress=False, restore_best=case == "restored best")
    if case != "best is last":
        _falling_lml(monkeypatch)
    returned = {}
    for directory in (None, tmp_path):
        pmodel = _bn_pmodel()
        result = fit(pmodel, (x, y), PAPER, checkpoint_dir=directory, **kwargs)
        returned[directory] = (pmodel.state_dict(), torch.get_rng_state())
    # the extra recalibration ran on a copy, with torch's generator forked: the run is what it was
    (plain, plain_rng), (written, written_rng) = returned.values()
    assert plain.keys() == written.keys() and all(torch.equal(plain[k], written[k]) for k in plain)
    assert torch.equal(plain_rng, written_rng)
    assert (result.best_step == result.steps) == (case == "best is last")
    best, last = tmp_path / "best.safetensors", tmp_path / "last.safetensors"
    assert os.path.samefile(best, last) == (case == "best is last")
    # best holds the best state recalibrated for the final subnetwork (the definition, on the resumed best state)
    expected = _bn_pmodel()
    trainer = PartitionedTrainer(expected, (x, y), PAPER, batch_size=8)
    trainer.load_checkpoint(best)
    loaded = copy.deepcopy(expected.state_dict())
    with torch.random.fork_rng():
        recalibrate_norm_statistics(expected, trainer.examples, batch_size=trainer.config.evaluation.batch_size)
    assert all(torch.equal(loaded[k], v) for k, v in expected.state_dict().items())
    if case == "restored best":  # the run returned the best state: best and last hold the same tensors
        trainer.load_checkpoint(last)
        assert all(torch.equal(loaded[k], v) for k, v in expected.state_dict().items())
    meta = read_checkpoint(best, {})[1]
    assert (meta["step"], meta["norm_statistics"]) == (result.best_step, "final")
