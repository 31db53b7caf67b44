"""What a run leaves on disk: an export that reproduces the run, files of sensible size and ordinary modes,
and checkpoints that leave out what the model rebuilds (issue 15)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.errors import PartitionCheckpointError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit, load_checkpoint
from partition_fx.training.checkpoint import read_checkpoint
from partition_fx.transforms import InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

# resnet10t has BatchNorm: its running statistics are recalibrated for the final subnetwork at the end
TINY = ["--model", "resnet10t", "--image-size", "16", "--steps", "6", "--eval-every", "3", "--batch-size", "8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    umask = os.umask(0o022)
    try:
        # --keep-resume: the resume state's contents are checked below (a completed run removes it by default)
        assert main(["train", *TINY, "--quiet", "--keep-resume", "--out", str(out)]) == 0
        assert main(["export", "--run", str(out)]) == 0
    finally:
        os.umask(umask)
    return out


def test_export_reports_the_test_accuracy_train_reported_for_a_batchnorm_model(run: Path) -> None:
    report = json.loads((run / "report.json").read_text())
    exported = json.loads((run / "export" / "export.json").read_text())
    assert exported["checkpoint_step"] == report["steps"] == 6
    assert exported["test_accuracy"] == report["test_accuracy"]
    assert exported["test_log_likelihood"] == pytest.approx(report["test_log_likelihood"], rel=1e-6)


def test_every_file_and_directory_of_a_run_has_the_users_umask(run: Path) -> None:
    for path in [run, *run.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path.relative_to(run)}: {oct(mode)}"


def test_a_run_writes_nothing_that_can_be_rebuilt(run: Path) -> None:
    model = (run / "model.safetensors").stat().st_size  # the plain exported model: the unit of size
    last = run / "checkpoint" / "last.safetensors"
    # the parts of every partition and the BatchNorm statistics; no layouts, no defaults
    assert last.stat().st_size < 1.05 * model
    with safe_open(str(last), framework="pt") as f:
        assert not [k for k in f.keys() if k.rsplit(".", 1)[-1] in ("index", "unit_index", "default")]
    with safe_open(str(run / "checkpoint" / "resume" / "tensors.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    report = json.loads((run / "report.json").read_text())
    # no second copy when the last evaluation was the best
    best_copy = report["highest_lml_state"]["step"] != report["steps"]
    assert any(k.startswith("best/") for k in keys) == best_copy
    # model, ONNX, last, best, resume (the model, Adam's two moments, the best state if it is another):
    # 7 or 8 models' worth, each file a few % over the bare weights (names, metadata); before, 15. With
    # fine-tuning (the default) the best-LML state is a partitioned one, never the last: 8.
    weights = [p for p in run.rglob("*") if p.suffix in (".safetensors", ".onnx") and "export" not in p.parts]
    assert sum(p.stat().st_size for p in weights) < (7 + best_copy) * 1.03 * model


def _pmodel(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return partitionify(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)), 3, (0.5, 0.25, 0.25), seed=1)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    return x, (x[:, 0] > 0).long()


def test_best_is_a_link_to_last_and_the_final_last_holds_what_the_run_returned(tmp_path: Path) -> None:
    x, y = _data()
    seen = []

    def linked(trainer: PartitionedTrainer, record: dict) -> None:
        last, best = tmp_path / "last.safetensors", tmp_path / "best.safetensors"
        if trainer.best.step == record["step"]:  # this evaluation improved: best is last, on disk once
            seen.append(os.path.samefile(last, best))

    pmodel = _pmodel(0)
    fit(pmodel, (x, y), PAPER, hyper=InputMask(6), steps=8, eval_every=4, checkpoint_dir=tmp_path, callbacks=[linked],
        progress=False)  # fmt: skip
    assert seen and all(seen)
    reloaded = _pmodel(0)
    PartitionedTrainer(reloaded, (x, y), PAPER, hyper=InputMask(6)).load_checkpoint(tmp_path / "last.safetensors")
    for a, b in zip(pmodel.state_dict().values(), reloaded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _refusal(load) -> str:
    with pytest.raises(PartitionCheckpointError) as refused:
        load()
    return str(refused.value)


@pytest.mark.parametrize("checkpoint_defaults", [True, False])
def test_load_checkpoint_restores_what_the_trainer_restores_without_one(tmp_path: Path, checkpoint_defaults) -> None:
    """``training.load_checkpoint`` (no trainer, no data) restores the same tensors as the trainer's
    ``load_checkpoint``, and refuses a checkpoint from another configuration with the same message."""
    x, y = _data()
    trained = (_pmodel(0), InputMask(6))
    fit(trained[0], (x, y), PAPER, hyper=trained[1], steps=6, eval_every=3, checkpoint_dir=tmp_path,
        checkpoint_defaults=checkpoint_defaults, progress=False)  # fmt: skip
    last = tmp_path / "last.safetensors"
    by_trainer, by_function = (_pmodel(0), InputMask(6)), (_pmodel(0), InputMask(6))
    trainer_meta = PartitionedTrainer(by_trainer[0], (x, y), PAPER, hyper=by_trainer[1]).load_checkpoint(last)
    assert load_checkpoint(by_function[0], last, hyper=by_function[1]) == trainer_meta
    assert trainer_meta["step"] == 6
    for a, b, c in zip(by_trainer, by_function, trained):
        assert a.state_dict().keys() == b.state_dict().keys() == c.state_dict().keys()
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
        assert all(torch.equal(c.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    other_partitions = partitionify(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)), 2, seed=1)
    other_layouts = partitionify(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)), 3, (0.5, 0.25, 0.25))
    for other in (other_partitions, other_layouts):
        expected = _refusal(lambda other=other: PartitionedTrainer(other, (x, y), PAPER).load_checkpoint(last))
        assert _refusal(lambda other=other: load_checkpoint(other, last)) == expected
        assert "different configuration" in expected or "builds differently" in expected
    wrong_mask = InputMask(5)  # a hyperparameter module of another shape: refused, naming the file and the module
    message = _refusal(lambda: load_checkpoint(_pmodel(0), last, hyper=wrong_mask))
    assert f"checkpoint {last}: its hyper state does not fit this InputMask" in message


def test_checkpoints_without_defaults_refuse_a_model_that_rebuilds_them_differently(tmp_path: Path) -> None:
    x, y = _data()
    fit(_pmodel(0), (x, y), PAPER, steps=4, checkpoint_dir=tmp_path, checkpoint_defaults=False, progress=False)
    meta = PartitionedTrainer(_pmodel(0), (x, y), PAPER).load_checkpoint(tmp_path / "last.safetensors")
    assert meta["omitted"] == "layouts+defaults"
    with pytest.raises(PartitionCheckpointError, match="default values, which this model builds differently"):
        PartitionedTrainer(_pmodel(9), (x, y), PAPER).load_checkpoint(tmp_path / "last.safetensors")


def _as_format_1(resume: Path, pmodel: nn.Module) -> None:
    """Rewrite a resume directory as the previous format wrote it: every model tensor stored (the layouts
    and defaults too), a best copy even when it is the current state, no digest in the fingerprint."""
    from safetensors.torch import load_file, save_file

    state = json.loads((resume / "state.json").read_text())
    tensors = load_file(str(resume / "tensors.safetensors"))
    rebuilt = {f"model/{k}": v.clone() for k, v in pmodel.rebuilt_buffers(defaults=True).items()}
    tensors.update(rebuilt)
    if state["best"] is not None and state["best"].pop("same_as_current", False):
        current = {k: v for k, v in tensors.items() if k.split("/")[0] in ("model", "hyper", "likelihood")}
        tensors.update({f"best/{k}": v.clone() for k, v in current.items()})
    for key in ("omitted", "omitted_sha256"):
        state["fingerprint"].pop(key)
    state["format"] = 1
    save_file(tensors, str(resume / "tensors.safetensors"))
    (resume / "state.json").write_text(json.dumps(state))


def test_state_from_before_flat_storage_is_refused_with_one_clear_message(tmp_path: Path) -> None:
    """Formats 1 and 2 kept one optimiser state per tensor and partition, which flat groups do not map onto:
    their resume directories, checkpoint files and per-tensor state dicts are refused, naming why."""
    x, y = _data()
    kwargs = dict(steps=4, eval_every=2, batch_size=8, progress=False)
    first = _pmodel(0)
    fit(first, (x, y), PAPER, hyper=InputMask(6), checkpoint_dir=tmp_path, **kwargs)
    _as_format_1(tmp_path / "resume", first)
    with pytest.raises(PartitionCheckpointError, match="before flat storage"):
        fit(_pmodel(0), (x, y), PAPER, hyper=InputMask(6), resume=tmp_path / "resume", **kwargs)
    from safetensors.torch import load_file, save_file

    path = tmp_path / "last.safetensors"
    meta = read_checkpoint(path, {})[1]
    assert meta["storage"] == "flat"
    del meta["storage"]
    save_file(load_file(str(path)), str(path), metadata={"partition_fx": json.dumps(meta)})
    with pytest.raises(PartitionCheckpointError, match="before flat storage"):
        PartitionedTrainer(_pmodel(0), (x, y), PAPER).load_checkpoint(path)
    per_tensor = {"module.partitioned.0.weight.part1": torch.zeros(3)}
    with pytest.raises(PartitionCheckpointError, match="per tensor"):
        _pmodel(0).load_state_dict(per_tensor)
