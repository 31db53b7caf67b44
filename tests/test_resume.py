"""Resuming: a run stopped at step n and resumed equals the uninterrupted run bit for bit; bad resume
directories are refused before anything is loaded."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionCheckpointError, TrainingHook, fit
from partition_fx.transforms import AffineAugmentation, ConcreteDropout

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _images(n: int = 48, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _pmodel(partitions: int = 3, scheme: str = "random", seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
        ConcreteDropout(0.2), nn.Linear(256, 3),
    )  # fmt: skip
    return partitionify(model, partitions, scheme=scheme, seed=seed)


def _fit(pmodel, steps: int, **kwargs):
    return fit(
        pmodel,
        _images(),
        PAPER,
        hyper=AffineAugmentation(num_samples=2),
        steps=steps,
        batch_size=8,
        optimizer=partial(torch.optim.Adam, lr=1e-2, weight_decay=1e-3),
        hyper_optimizer=partial(torch.optim.Adam, lr=0.05),
        scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps, eta_min=1e-4),
        eval_every=2,
        eval_examples_per_chunk=4,  # subsampled: the LML generator's state matters
        seed=3,
        progress=False,
        **kwargs,
    )


def _without_seconds(history):
    return [{k: v for k, v in record.items() if k != "seconds"} for record in history]


@pytest.mark.parametrize("every_partition", [False, True])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, every_partition):
    reference = _pmodel()
    expected = _fit(reference, 8, every_partition=every_partition)

    stop_at_4 = lambda trainer, record: record["step"] == 4  # noqa: E731
    _fit(_pmodel(), 8, every_partition=every_partition, checkpoint_dir=tmp_path, callbacks=[stop_at_4])
    assert json.loads((tmp_path / "resume" / "state.json").read_text())["step"] == 4
    resumed_model = _pmodel()
    resumed = _fit(resumed_model, 8, every_partition=every_partition, resume=tmp_path / "resume")

    assert resumed.steps == 8 and resumed.hyperparameters == expected.hyperparameters
    assert _without_seconds(resumed.history) == _without_seconds(expected.history)
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), name


class _LossSum(TrainingHook):
    """A hook with state of its own: the sum of the training losses of the evaluations it has seen."""

    def __init__(self) -> None:
        self.total, self.seen = 0.0, []

    def after_evaluation(self, trainer, record, improved) -> None:
        self.total += record["train_loss"]
        self.seen.append(record["step"])

    def state_dict(self) -> dict:
        return {"total": self.total} if self.seen else {}

    def load_state_dict(self, state: dict) -> None:
        self.total = state["total"]


def test_a_hook_s_own_state_survives_a_resume_and_two_hooks_may_not_share_a_state_key(tmp_path):
    uninterrupted = _LossSum()
    _fit(_pmodel(), 8, hooks=[uninterrupted])
    stop_at_4 = lambda trainer, record: record["step"] == 4  # noqa: E731
    _fit(_pmodel(), 8, checkpoint_dir=tmp_path, callbacks=[stop_at_4], hooks=[_LossSum()])
    state = json.loads((tmp_path / "resume" / "state.json").read_text())
    assert list(state["hooks"]) == ["_LossSum"] and state["hooks"]["_LossSum"]["total"] > 0
    resumed = _LossSum()
    _fit(_pmodel(), 8, resume=tmp_path / "resume", hooks=[resumed])
    assert resumed.seen == [6, 8] and resumed.total == uninterrupted.total  # the evaluations at 2 and 4 carried over
    with pytest.raises(PartitionArgumentError, match="two hooks hold state under the state_key '_LossSum'"):
        _fit(_pmodel(), 2, checkpoint_dir=tmp_path / "two", hooks=[_LossSum(), _LossSum()])


def test_resume_refuses_another_configuration_naming_the_difference(tmp_path):
    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    with pytest.raises(PartitionCheckpointError, match=r"num_partitions: saved 3, this run 2"):
        _fit(_pmodel(partitions=2), 8, resume=tmp_path / "resume")
    with pytest.raises(PartitionCheckpointError, match=r"scheme: saved \"random\", this run \"node\""):
        _fit(_pmodel(scheme="node"), 8, resume=tmp_path / "resume")
    with pytest.raises(PartitionArgumentError, match="at step 4, not before steps=4"):
        _fit(_pmodel(), 4, resume=tmp_path / "resume")


def test_resume_refuses_missing_truncated_and_corrupted_files_without_loading(tmp_path):
    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    resume = tmp_path / "resume"
    with pytest.raises(PartitionCheckpointError, match="not a resume directory"):
        _fit(_pmodel(), 8, resume=tmp_path / "nothing")
    tensors = resume / "tensors.safetensors"
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])
    pmodel = _pmodel()
    before = {k: v.clone() for k, v in pmodel.state_dict().items()}
    with pytest.raises(PartitionCheckpointError, match="corrupted or truncated"):
        _fit(pmodel, 8, resume=resume)
    assert all(torch.equal(before[k], v) for k, v in pmodel.state_dict().items())  # nothing loaded
    tensors.write_bytes(data)
    (resume / "state.json").write_text("{not json")
    with pytest.raises(PartitionCheckpointError, match="corrupted or truncated"):
        _fit(_pmodel(), 8, resume=resume)


def test_a_save_interrupted_after_moving_the_old_state_aside_still_resumes(tmp_path):
    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    # the crash window of save_training_state: the old directory renamed aside, the new one not yet in place
    (tmp_path / "resume").rename(tmp_path / ".resume.old")
    assert _fit(_pmodel(), 6, resume=tmp_path / "resume").steps == 6


def test_single_file_checkpoints_refuse_other_configurations_and_truncation(tmp_path):
    from partition_fx.training import PartitionedTrainer

    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    last = tmp_path / "last.safetensors"
    assert PartitionedTrainer(_pmodel(), _images(), PAPER).load_checkpoint(last)["step"] == 4
    with pytest.raises(PartitionCheckpointError, match=r"num_partitions: saved 3, this model 2"):
        PartitionedTrainer(_pmodel(partitions=2), _images(), PAPER).load_checkpoint(last)
    last.write_bytes(last.read_bytes()[:100])
    with pytest.raises(PartitionCheckpointError, match="corrupted or truncated"):
        PartitionedTrainer(_pmodel(), _images(), PAPER).load_checkpoint(last)


def _rewrite_checkpoint_metadata(path, drop: str) -> None:
    from safetensors.torch import load_file, save_file

    from partition_fx.training.checkpoint import read_checkpoint

    meta = read_checkpoint(path, {})[1]
    del meta[drop]
    save_file(load_file(str(path)), str(path), metadata={"partition_fx": json.dumps(meta)})


def test_state_checkpoint_and_report_from_an_earlier_development_version_are_refused_naming_what_they_lack(tmp_path):
    """Version 0.1.0 reads only what it writes: a field an earlier development version did not write is
    never defaulted; the state, checkpoint or report is refused with one message naming the file and the field."""
    from partition_fx.cli.commands.train import job_spec
    from partition_fx.cli.parser import parse_train
    from partition_fx.errors import PartitionError
    from partition_fx.job.records import read_run
    from partition_fx.training import load_checkpoint

    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    state_file = tmp_path / "resume" / "state.json"
    current = json.loads(state_file.read_text())
    earlier = "was written by an earlier development version of partition-fx"
    for drop, named in (("grad_scaler", "grad_scaler"), ("hyper_chunks", "fingerprint.hyper_chunks")):
        state = json.loads(json.dumps(current))
        del (state["fingerprint"] if drop == "hyper_chunks" else state)[drop]
        state_file.write_text(json.dumps(state))
        with pytest.raises(PartitionCheckpointError, match=rf"state.json {earlier} \(it lacks {named}\)"):
            _fit(_pmodel(), 6, resume=tmp_path / "resume")
    state_file.write_text(json.dumps(current))
    assert _fit(_pmodel(), 6, resume=tmp_path / "resume").steps == 6  # the state as written resumes
    for drop in ("norm_statistics", "omitted_sha256", "num_partitions"):
        last = tmp_path / "last.safetensors"
        _rewrite_checkpoint_metadata(last, drop)
        with pytest.raises(PartitionCheckpointError, match=rf"last.safetensors {earlier} \(it lacks metadata {drop}\)"):
            load_checkpoint(_pmodel(), last)
        _fit(_pmodel(), 2, checkpoint_dir=tmp_path)  # a current checkpoint again
    run = tmp_path / "run"
    run.mkdir()
    config = job_spec(parse_train([])).replace(proportions=(0.8, 0.1, 0.1)).to_dict()
    del config["train"]["runtime"]["precision"]
    (run / "report.json").write_text(json.dumps({"command": "train", "config": config}))
    with pytest.raises(PartitionError, match=rf"report.json {earlier} \(it lacks config.train.runtime.precision\)"):
        read_run(run, "--run")


def test_a_state_written_before_a_setting_existed_resumes_as_every_run_then_ran(tmp_path):
    """hyper_gradient, implicit_terms and implicit_lr joined the fingerprint later: a state without them is a run
    at fixed weights, and resumes as one (and is refused for a run through training, naming the difference)."""
    _fit(_pmodel(), 4, checkpoint_dir=tmp_path)
    state_file = tmp_path / "resume" / "state.json"
    state = json.loads(state_file.read_text())
    for key in ("hyper_gradient", "implicit_terms", "implicit_lr"):
        del state["fingerprint"][key]
    state_file.write_text(json.dumps(state))
    with pytest.raises(PartitionCheckpointError, match=r"different configuration.*hyper_gradient"):
        _fit(_pmodel(), 6, resume=tmp_path / "resume", hyper_gradient="implicit")
    assert _fit(_pmodel(), 6, resume=tmp_path / "resume").steps == 6


def test_a_run_through_training_resumes_bit_for_bit(tmp_path):
    """The inner minibatches are the sampler's draws: a resumed run through training equals the uninterrupted one."""
    kwargs = {"hyper_gradient": "implicit", "implicit_terms": 1}
    reference = _pmodel()
    expected = _fit(reference, 6, **kwargs)
    stop_at_4 = lambda trainer, record: record["step"] == 4  # noqa: E731
    _fit(_pmodel(), 6, checkpoint_dir=tmp_path, callbacks=[stop_at_4], **kwargs)
    resumed_model = _pmodel()
    resumed = _fit(resumed_model, 6, resume=tmp_path / "resume", **kwargs)
    assert resumed.hyperparameters == expected.hyperparameters
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), name


class _RunsCodeWhenUnpickled:
    """A pickle payload: unpickling it would create ``path`` (what a malicious checkpoint could do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_weights_file_that_would_run_code_is_refused_without_running_it(tmp_path):
    """``--checkpoint`` weights go through torch.load(weights_only=True): no arbitrary object is unpickled."""
    from partition_fx.errors import PartitionError
    from partition_fx.models import build_model

    evil, marker = tmp_path / "weights.pt", tmp_path / "code-ran"
    torch.save({"conv1.weight": _RunsCodeWhenUnpickled(str(marker))}, evil)
    with pytest.raises(PartitionError, match="--checkpoint"):
        build_model("resnet10t", 3, str(evil))
    assert not marker.exists()


def test_the_best_state_is_saved_with_its_score_and_its_own_lmls(tmp_path):
    """The best state is chosen by the conditional LML; a resume state records that score (``best.score``), and
    one without it (written when the full LML chose the best state) is refused, not resumed with a best state no
    uninterrupted run would keep. ``best.safetensors`` names the LMLs of its own step."""
    from partition_fx.training import PartitionedTrainer, load_training_state
    from partition_fx.training.checkpoint import read_checkpoint

    x, y = torch.randn(48, 4, generator=torch.Generator().manual_seed(0)), torch.arange(48) % 2

    def trainer():
        return PartitionedTrainer(
            partitionify(nn.Linear(4, 2), 3), (x, y), PAPER, batch_size=8, checkpoint_dir=tmp_path
        )

    first = trainer()
    first.run(6, eval_every=2, progress=False)
    best_step = first.best.step
    record = next(r for r in first.history if r["step"] == best_step)
    assert first.best.score == record["conditional_lml"]
    _, meta = read_checkpoint(tmp_path / "best.safetensors", {})
    assert (meta["step"], meta["lml"], meta["conditional_lml"]) == (best_step, record["lml"], record["conditional_lml"])
    state = tmp_path / "resume" / "state.json"
    plain = json.loads(state.read_text())
    assert plain["best"]["score"] == record["conditional_lml"]
    plain["best"] = {"lml": record["lml"], "step": best_step}  # as an earlier development version wrote it
    state.write_text(json.dumps(plain))
    with pytest.raises(PartitionCheckpointError, match=r"earlier development version.*best\.score.*train again"):
        load_training_state(trainer(), tmp_path / "resume")
