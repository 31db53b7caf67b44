"""``partition-fx train`` / ``export`` end to end on a tiny budget (real model, real data, real ONNX)."""

from __future__ import annotations

import json
import os
import shutil

import onnxruntime as ort
import pytest
import timm
import torch
from disk_formats import write_image_folder
from safetensors.torch import load_file

import partition_fx
from partition_fx.cli import main
from partition_fx.datasets import digits
from partition_fx.training import PartitionedTrainer

TINY = ["--model", "fixup_resnet8", "--image-size", "16", "--steps", "4", "--batch-size", "8", "--samples", "2"]
TINY += ["--eval-every", "2", "--quiet"]
_ITERATION = PartitionedTrainer.iteration


def interrupt_at(step: int):
    """A ``PartitionedTrainer.iteration`` that raises KeyboardInterrupt (Ctrl-C) once the trainer is at ``step``."""

    def iteration(self):
        if self.step == step:
            raise KeyboardInterrupt
        _ITERATION(self)

    return iteration


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "train"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    return out


def test_train_writes_report_plots_model_and_onnx(run_dir):
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["checkpoint", "hyperparameters.png", "lml.png", "model.onnx", "model.safetensors", "report.json"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 4
    assert 0.0 <= report["test_accuracy"] <= 1.0 and report["test_log_likelihood"] < 0
    # the last quarter of --steps fine-tunes: an evaluation where it begins, none of the LML after it
    assert report["lml"] < 0 and [h["step"] for h in report["history"]] == [2, 3, 4]
    assert [h["phase"] for h in report["history"]] == ["partitioned", "partitioned", "finetune"]
    assert report["finetune_start"] == 3 and 0.0 <= report["partitioned_test_accuracy"] <= 1.0
    assert all("partitioned_test_accuracy" not in r for r in report["history"])  # the hook's own state now
    assert set(report["hyperparameters"]) >= {"rotation", "translation_x", "scale_y", "shear"}
    assert report["config"]["data"] == "rotdigits" and report["config"]["proportions"] == [0.8, 0.1, 0.1]
    assert (run_dir / "lml.png").stat().st_size > 1000
    # the exported weights are a plain fixup_resnet8 that reproduces the ONNX model and the report's accuracy
    plain = timm.create_model("fixup_resnet8", num_classes=10, in_chans=1).eval()
    plain.load_state_dict(load_file(run_dir / "model.safetensors"))
    x = digits(size=16).test.tensors[0]  # rotdigits shares digits' split; only the accuracy differs
    session = ort.InferenceSession(str(run_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: x[:7].numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(onnx_out), plain(x[:7]), rtol=1e-4, atol=1e-5)


def test_export_command_rebuilds_the_run(run_dir, capsys):
    out = run_dir.parent / "exported"
    assert main(["export", "--run", str(run_dir), "--subnetwork", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "export.json").read_text())
    assert summary["subnetwork"] == 2 and summary["checkpoint_step"] == 4
    printed = capsys.readouterr().out.splitlines()
    assert (out / "model.onnx").is_file() and "exported subnetwork 2" in printed[0]
    assert printed[1] == f"wrote {out}/: model.safetensors, model.onnx, export.json"
    full = run_dir.parent / "exported_full"
    assert main(["export", "--run", str(run_dir), "--out", str(full)]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert json.loads((full / "export.json").read_text())["test_accuracy"] == report["test_accuracy"]
    assert main(["export", "--run", str(run_dir), "--test-time-samples", "2"]) == 0  # without --out: RUN/export
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {run_dir / 'export'}/: model.safetensors, model.onnx (averaged), export.json"
    )
    shutil.rmtree(run_dir / "export")  # the run directory as train left it, for the tests after this one
    # every report says which version of partition-fx wrote it
    assert report["version"] == summary["version"] == partition_fx.__version__


def test_the_tool_says_its_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"partition-fx {partition_fx.__version__}\n"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "no_such_net"], "unknown model 'no_such_net'"),
        (["--data", "/no/such/folder"], "unknown dataset '/no/such/folder'"),
        (["--proportions", "0.9995,0.0004,0.0001"], "data chunk 3 of 3 is empty"),
        (["--proportions", "0.5,0.6"], "proportions has 2 entries but num_partitions=3"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--data", "input_selection"], "is a regression task"),
        # found by fuzzing: these used to fail only after --out was created, or with a traceback
        (["--eval-every", "0"], "--eval-every must be >= 1"),
        (["--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
        (["--weight-decay", "-1"], "--weight-decay must be finite and >= 0"),
        (["--weight-decay", "nan"], "--weight-decay must be finite and >= 0"),
        (["--weight-decay", "inf"], "--weight-decay must be finite and >= 0"),
        (["--partitions", "1", "--proportions", "1"], "--augment affine learns its ranges"),
        (["--image-size", "1000000"], "more than this machine's"),
        (["--data", ""], "--data must be digits, rotdigits, scaledigits, drawndigits or an image folder"),
        # issue 41: a traceback after --out was written, and batches that only repeat the data for minutes
        (["--model", "convnext_atto", "--image-size", "28"], "convnext_atto cannot run on 28x28 images"),
        (["--model", "convnext_atto", "--image-size", "28"], "pass --image-size 32"),
        (["--batch-size", "5000"], "--batch-size 5000 is larger than the 1150 examples of chunk 1"),
        (["--hyper-batch-size", "200"], "--hyper-batch-size 200 is larger than the 144 examples of chunk 2"),
    ],
)
def test_bad_train_input_is_one_clear_line_and_no_output(tmp_path, capsys, argv, fragment):
    out = tmp_path / "never"
    assert main(["train", *TINY, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error:") and fragment in err and "\n" not in err
    assert not out.exists()


def test_existing_output_needs_overwrite_and_export_needs_a_run(run_dir, tmp_path, capsys):
    assert main(["train", *TINY, "--out", str(run_dir)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["export", "--run", str(tmp_path)]) == 2
    assert "is not a training run" in capsys.readouterr().err


def test_interrupted_run_keeps_its_last_checkpoint_and_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(PartitionedTrainer, "iteration", interrupt_at(2))
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 130
    assert "interrupted" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and report["last_checkpoint_step"] == 2
    assert [h["step"] for h in report["history"]] == [2]
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["best.safetensors", "last.safetensors", "resume"]
    (out / "report.json").write_text("{")  # damaged: the refusal says the resume state is intact, and how to go on
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "report.json cannot be read" in err and "checkpoint/resume, is intact: put back its report.json" in err


@pytest.mark.parametrize("interrupted_at", [2, 3])  # partitioned training; fine-tuning (it begins at step 3)
def test_resumed_run_equals_the_uninterrupted_one(run_dir, tmp_path, monkeypatch, capsys, interrupted_at):
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(interrupted_at))
        assert main(["train", *TINY, "--out", str(out)]) == 130
    assert main(["train", "--resume", str(out), "--steps", "5"]) == 2  # contradicts the run's --steps 4
    assert "drop --steps 5 (the run has 4)" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--train-range-factors", "rotation=1"]) == 2
    assert "drop --train-range-factors rotation=1.0 (the run has unset)" in capsys.readouterr().err
    before = json.loads((out / "report.json").read_text())["history"][-1]["seconds"]
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    resumed, uninterrupted = (json.loads((d / "report.json").read_text()) for d in (out, run_dir))
    clock = [r["seconds"] for r in resumed["history"]]  # the run's clock goes on across the resume
    assert clock == sorted(clock) and clock[-1] >= before and resumed["seconds"] >= before
    assert resumed["status"] == "completed" and resumed["steps"] == 4
    for key in ("test_accuracy", "test_log_likelihood", "partitioned_test_accuracy", "lml", "hyperparameters"):
        assert resumed[key] == uninterrupted[key], key
    strip = lambda history: [{k: v for k, v in r.items() if k != "seconds"} for r in history]  # noqa: E731
    assert strip(resumed["history"]) == strip(uninterrupted["history"])
    a, b = load_file(str(out / "model.safetensors")), load_file(str(run_dir / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["train", "--resume", str(out)]) == 2  # completed now
    assert "nothing to resume" in capsys.readouterr().err


def test_train_on_an_image_folder(tmp_path, capsys):
    """The run says its plan and, at the end, its train/test sizes (a folder's test images were nowhere), and the
    files of the folder it skipped for not being images (they were skipped silently)."""
    from PIL import Image

    root = tmp_path / "shapes"
    generator = torch.Generator().manual_seed(0)
    for label in ("bright", "dark"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            value = 200 if label == "bright" else 40
            pixels = (torch.rand(12, 12, generator=generator) * 30 + value).to(torch.uint8).numpy()
            Image.fromarray(pixels, mode="L").save(root / label / f"{i}.png")
    (root / "dark" / "notes.txt").write_text("taken on a cloudy day\n")
    (root / "bright" / "labels.csv").write_text("0,bright\n")
    out = tmp_path / "run"
    loud = [a for a in TINY if a != "--quiet"]
    argv = ["train", *loud, "--data", str(root), "--proportions", "0.5,0.25,0.25", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["data"]["classes"] == 2 and report["data"]["train"] + report["data"]["test"] == 24
    train, test = report["data"]["train"], report["data"]["test"]
    captured = capsys.readouterr()
    plan = (
        f"partition-fx: train fixup_resnet8 on shapes ({train} training images, {test} test) for 4 steps: "
        "3 partitioned, then 1 fine-tuning; evaluated every 2 steps; skipped 2 files that are not images (labels.csv, "
        "notes.txt)"
    )
    assert plan in captured.err.splitlines()
    assert f"on shapes ({train} training images, {test} test) for 4 iterations" in captured.out
    assert report["status"] == "completed" and (out / "model.onnx").is_file()


def test_nonfinite_training_fails_clearly_and_keeps_the_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "20", "--lr", "1e30", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: step") and "non-finite" in err and "\n" not in err
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and "non-finite" in report["error"]


def test_fused_every_partition_training(tmp_path):
    out = tmp_path / "fused"
    assert main(["train", *TINY, "--fused", "--every-partition", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (
        report["status"] == "completed"
        and report["config"]["train"]["runtime"]["fused"]
        and report["config"]["train"]["runtime"]["every_partition"]
    )


def test_mixed_precision_training_records_its_precision_and_exports_fp32(tmp_path):
    out = tmp_path / "bf16"
    assert main(["train", *TINY, "--precision", "bf16", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and report["config"]["train"]["runtime"]["precision"] == "bf16"
    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values() if t.is_floating_point())


def test_train_under_torchrun_with_two_processes(run_dir, tmp_path):
    """``torchrun --nproc_per_node=2``: both processes train (gloo), rank 0 alone writes the run, which exports
    and reports like a single process's (the equivalence of the steps is ``test_data_parallel``'s)."""
    import subprocess
    import sys

    out = tmp_path / "torchrun"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command = [*launch, "-m", "partition_fx.cli", "train", *TINY, "--out", str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 4 and 0 <= report["test_accuracy"] <= 1
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert written == sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))  # what one process writes


def test_a_completed_run_keeps_what_a_user_needs_and_drops_its_resume_state(run_dir, tmp_path, capsys):
    """A completed run without --keep-resume holds no optimiser state: its checkpoints are the last and best
    partitioned states, each the size of the model (the mutation that keeps checkpoint/resume/ fails here)."""
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == ["best.safetensors", "last.safetensors"]
    model = (run_dir / "model.safetensors").stat().st_size
    for name in ("last", "best"):
        assert (run_dir / "checkpoint" / f"{name}.safetensors").stat().st_size < 1.2 * model
    assert "resume" not in json.loads((run_dir / "report.json").read_text())["files"]
    kept = tmp_path / "kept"
    assert main(["train", *TINY, "--keep-resume", "--out", str(kept)]) == 0
    assert (kept / "checkpoint" / "resume" / "state.json").is_file()
    report = json.loads((kept / "report.json").read_text())
    assert report["files"]["resume"] == "checkpoint/resume/"
    out = capsys.readouterr().out  # the summary leads with the conditional LML
    assert f"evidence: conditional LML {report['conditional_lml']:.1f} nats" in out.splitlines()[1]


def test_the_report_leads_with_the_conditional_lml_and_explains_both(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    last = [r for r in report["history"] if r["lml"] is not None][-1]
    assert report["lml_step"] == last["step"] == report["finetune_start"]
    assert report["conditional_lml"] == last["conditional_lml"] == pytest.approx(sum(report["lml_per_chunk"][1:]))
    assert report["lml"] == pytest.approx(sum(report["lml_per_chunk"]))
    scored = sum(report["chunk_sizes"][1:])
    assert report["conditional_lml_per_example"] == pytest.approx(report["conditional_lml"] / scored)
    assert set(report["lml_explained"]) >= {"conditional_lml", "lml", "lml_per_chunk"}
    assert report["highest_lml_state"]["conditional_lml"] == max(
        r["conditional_lml"] for r in report["history"] if r["lml"]
    )


def test_an_interrupted_run_says_how_to_continue(tmp_path, monkeypatch, capsys):
    """The hint is what the run's report allows: --resume after an evaluation, a new run before the first one,
    export once training had finished (an interrupt while the files are written)."""
    for step, hint in ((2, "continue with `partition-fx train --resume {out}`"), (0, "run it again")):
        out = tmp_path / f"at{step}"
        with monkeypatch.context() as patched:
            patched.setattr(PartitionedTrainer, "iteration", interrupt_at(step))
            assert main(["train", *TINY, "--out", str(out)]) == 130
        assert hint.format(out=out) in capsys.readouterr().err
    out = tmp_path / "writing"
    monkeypatch.setattr("partition_fx.cli.train.write_onnx", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["train", *TINY, "--out", str(out)]) == 130
    assert f"`partition-fx export --run {out}` writes its model" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["status"] == "interrupted"
    assert main(["export", "--run", str(out)]) == 0  # the hint works


@pytest.mark.parametrize("command", ["train", "convert", "export", "federated"])
def test_overwrite_replaces_only_a_run_directory(run_dir, tmp_path, capsys, command):
    """``--overwrite`` deleted a plain file given as ``--out`` and wrote a run folder in its place; now it
    replaces only a directory a partition-fx command wrote (its report names the command)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    given = {"train": TINY, "convert": ["--model", "fixup_resnet8"], "export": ["--run", str(run_dir)]}
    for out in (notes, mine):
        assert main([command, *given.get(command, []), "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("partition-fx: error: --out") and "\n" not in err and "run" in err
    assert notes.read_text() == "precious\n" and [p.name for p in mine.iterdir()] == ["thesis.tex"]


def test_overwrite_replaces_an_earlier_run(tmp_path):
    out = tmp_path / "converted"
    convert = ["convert", "--model", "fixup_resnet8", "--out", str(out)]
    assert main(convert) == 0
    assert main(convert) == 2  # an earlier run: replaced only when asked
    (out / "model.onnx").write_text("an earlier run's file, damaged")
    assert main([*convert, "--overwrite"]) == 0
    assert json.loads((out / "report.json").read_text())["command"] == "convert"
    assert (out / "model.onnx").read_bytes()[:2] != b"an"  # the run's own files are replaced
    (out / "stale.txt").write_text("not the run's\n")
    assert main([*convert, "--overwrite"]) == 2  # anything else is kept, and the run with it (issue 41)
    assert (out / "stale.txt").read_text() == "not the run's\n"


def test_keep_resume_is_honoured_when_the_run_resumes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(2))
        assert main(["train", *TINY, "--keep-resume", "--out", str(out)]) == 130
    assert main(["train", "--resume", str(out), "--quiet"]) == 0  # --keep-resume not repeated
    assert (out / "checkpoint" / "resume" / "state.json").is_file()


def test_overwrite_replaces_no_run_an_earlier_version_wrote(run_dir, tmp_path, capsys):
    """Reports did not name their command before this version, which reads no earlier development format (issue
    27): such a directory is refused like any other that is not a run, and left as it is; so is someone else's
    report with ``status`` and ``config``."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    report = json.loads((run_dir / "report.json").read_text())
    for key in ("command", "keep_resume"):
        report.pop(key)
    (earlier / "report.json").write_text(json.dumps(report))
    assert main(["convert", "--model", "fixup_resnet8", "--out", str(earlier), "--overwrite"]) == 2
    assert "holds no partition-fx run" in capsys.readouterr().err
    assert [p.name for p in earlier.iterdir()] == ["report.json"]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "report.json").write_text(json.dumps({"status": "completed", "config": {"lr": 0.1}}))
    assert main(["convert", "--model", "fixup_resnet8", "--out", str(theirs), "--overwrite"]) == 2
    assert [p.name for p in theirs.iterdir()] == ["report.json"]


def _tree(root):
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_deletes_nothing_the_earlier_run_did_not_write(tmp_path, capsys):
    """``--overwrite`` removed the user's notes and plots with the run. Now a run directory holding anything its
    run did not write (a file of the user's inside the run's ``export/`` too) is refused, naming it, and left byte
    for byte; once only the run's own files are there, ``--overwrite`` replaces them."""
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    assert main(["export", "--run", str(out)]) == 0  # writes out/export/ by default
    (out / "export" / "deployed.txt").write_text("where I deployed it\n")
    (out / "my_analysis.txt").write_text("notes\n")
    (out / "my_plots").mkdir()
    (out / "my_plots" / "figure.png").write_bytes(b"png")
    (out / "checkpoint" / "mine.pt").write_bytes(b"weights")
    before = _tree(out)
    for command in (["train", *TINY], ["convert", "--model", "fixup_resnet8"]):
        assert main([*command, "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "deletes nothing else" in err
        assert all(name in err for name in ("checkpoint/mine.pt", "export/", "my_analysis.txt", "my_plots/"))
        assert _tree(out) == before
    for extra in ("my_analysis.txt", "my_plots", "checkpoint/mine.pt", "export"):
        shutil.move(out / extra, tmp_path / extra.replace("/", "_"))
    assert main(["train", *TINY, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "report.json").read_text())["config"]["train"]["runtime"]["seed"] == 1


def test_overwrite_replaces_the_export_the_tool_wrote_from_the_run(tmp_path, capsys):
    """The README's own flow, train, export, train again with ``--overwrite``, was refused: "holds export/, which
    its earlier train run did not write". The export at the default place was made from the run being replaced,
    so it is that run's and goes with it; an export elsewhere is untouched."""
    out, elsewhere = tmp_path / "run", tmp_path / "deployed"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    assert main(["export", "--run", str(out)]) == 0
    assert main(["export", "--run", str(out), "--out", str(elsewhere)]) == 0
    kept = _tree(elsewhere)
    capsys.readouterr()
    assert main(["train", *TINY, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert capsys.readouterr().err == ""
    assert not (out / "export").exists() and _tree(elsewhere) == kept
    assert main(["export", "--run", str(out)]) == 0  # the flow goes on
    assert json.loads((out / "export" / "export.json").read_text())["run"] == str(out)


def test_overwriting_an_unfinished_run_says_its_resume_state_goes(tmp_path, monkeypatch, capsys):
    """``--overwrite`` dropped an interrupted run's resume state without a word; a completed run's, or one that
    kept none, is replaced quietly as before."""
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(2))
        assert main(["train", *TINY, "--out", str(out)]) == 130
    capsys.readouterr()
    assert main(["train", *TINY, "--out", str(out), "--overwrite"]) == 0
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("partition-fx: warning: --overwrite replaces") and "\n" not in warning
    assert (
        "interrupted, its last checkpoint at step 2 of 4" in warning
        and f"`partition-fx train --resume {out}`" in warning
    )
    assert main(["train", *TINY, "--out", str(out), "--overwrite"]) == 0  # completed: nothing to say
    assert capsys.readouterr().err == ""


def test_export_and_convert_replace_their_directory_whole_or_not_at_all(run_dir, tmp_path, monkeypatch, capsys):
    """An export that fails leaves the earlier export as it was (it used to empty the directory first)."""
    out = tmp_path / "export"
    assert main(["export", "--run", str(run_dir), "--out", str(out)]) == 0
    before = _tree(out)

    def broken(*args, **kwargs):
        raise RuntimeError("the ONNX exporter broke")

    monkeypatch.setattr("partition_fx.cli.export.write_onnx", broken)
    with pytest.raises(RuntimeError, match="exporter broke"):
        main(["export", "--run", str(run_dir), "--out", str(out), "--overwrite"])
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging directory left beside it


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("optimization", "steps"), "many", "config.train.optimization.steps must be an int >= 1, got 'many'"),
        (("hyper", "lr"), -1, "config.train.hyper.lr must be"),
    ],
)
def test_a_damaged_report_value_is_named_not_blamed_on_the_version(tmp_path, monkeypatch, capsys, path, value, said):
    """``steps: "many"`` in report.json made ``--resume`` say the report "was written by an earlier development
    version of partition-fx ... train again"; it names the field and its value now, and leaves the file as it is."""
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(3))
        assert main(["train", *TINY, "--out", str(out)]) == 130
    report = json.loads((out / "report.json").read_text())
    report["config"]["train"][path[0]][path[1]] = value
    (out / "report.json").write_text(json.dumps(report))
    written = (out / "report.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"partition-fx: error: --resume {str(out)!r}: report.json: {said}") and "\n" not in err
    assert "earlier development version" not in err and "correct that value, or train again" in err
    assert (out / "report.json").read_bytes() == written


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_refused_resume_leaves_the_report_byte_for_byte(tmp_path, monkeypatch, capsys, damage):
    """Issue 41: a refused ``--resume`` rewrote report.json as a failed run with no history. A refusal writes
    nothing; a resumed run that gets under way and stops again keeps the history it continued."""
    out = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(3))  # after the evaluation at step 2
        assert main(["train", *TINY, "--out", str(out)]) == 130
    tensors = out / "checkpoint" / "resume" / "tensors.safetensors"
    intact = tensors.read_bytes()
    if damage == "truncated":
        tensors.write_bytes(intact[: len(intact) // 2])
    else:
        tensors.unlink()
    report = (out / "report.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error:") and "\n" not in err
    assert (out / "report.json").read_bytes() == report
    tensors.write_bytes(intact)
    with monkeypatch.context() as patched:  # under way again, and interrupted before its next evaluation
        patched.setattr(PartitionedTrainer, "iteration", interrupt_at(3))
        assert main(["train", "--resume", str(out), "--quiet"]) == 130
    resumed = json.loads((out / "report.json").read_text())
    earlier = json.loads(report)
    assert resumed["status"] == "interrupted" and resumed["history"] == earlier["history"]
    for key in ("last_checkpoint_step", "lml", "conditional_lml", "hyperparameters"):
        assert resumed[key] == earlier[key], key


def test_a_one_class_folder_is_refused(tmp_path, capsys):
    write_image_folder(tmp_path / "shapes", classes=1)
    assert main(["train", *TINY, "--data", str(tmp_path / "shapes"), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip()
    assert "one class folder (c0/)" in err and "at least two" in err and "\n" not in err
    assert not (tmp_path / "never").exists()


def test_a_default_batch_larger_than_its_chunk_is_lowered_with_one_warning(tmp_path, capsys):
    """A batch size left at its default fits a small folder (a given one larger than its chunk is refused, above):
    the run trains with, and records, the size it used."""
    write_image_folder(tmp_path / "small", per_class=8, classes=3)  # chunks 2 and 3 of its training split: 2 each
    out = tmp_path / "run"
    assert main(["train", *TINY, "--data", str(tmp_path / "small"), "--out", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "partition-fx: warning: --hyper-batch-size 16 (the default) is larger than the 2 examples of chunk 2, which "
        "hyperparameter steps draw from: this run uses --hyper-batch-size 2"
    ]
    config = json.loads((out / "report.json").read_text())["config"]
    assert config["train"]["hyper"]["batch_size"] == 2
    assert main(["train", "--resume", str(out)]) == 2  # completed: its recorded options read back as they are
