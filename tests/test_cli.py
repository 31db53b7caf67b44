"""The ``partition-fx`` command end to end on the bundled digits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import timm
import torch
from safetensors.torch import load_file

from partition_fx.cli import main
from partition_fx.datasets import normalized_digits


def test_convert_writes_a_verified_model(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["convert", "--model", "fixup_resnet8", "--out", str(out), "--proportions", "0.6,0.2,0.2"]) == 0
    assert "max relative difference 0.0e+00" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["describe.txt", "model.onnx", "model.safetensors", "report.json"]
    report = json.loads((out / "report.json").read_text())
    assert report["proportions"] == [0.6, 0.2, 0.2] and report["num_partitions"] == 3
    assert sum(report["trainable_entries_per_partition"]) >= report["original_parameters"]
    assert all(v == 0.0 for v in report["max_relative_difference_to_original"].values())
    # the exported weights are a plain fixup_resnet8 state dict that reproduces the ONNX outputs
    plain = timm.create_model("fixup_resnet8", num_classes=10).eval()
    plain.load_state_dict(load_file(out / "model.safetensors"))
    x, _ = normalized_digits(5, 32)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(onnx_out), plain(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["convert", "--model", "no_such_net"], "unknown model 'no_such_net'"),
        (["convert", "--proportions", "0.5,0.1,0.1"], "must sum to 1"),
        (["convert", "--partitions", "0"], "num_partitions must be >= 1"),
        (["convert", "--checkpoint", "/no/such/file.safetensors"], "is not a file"),
    ],
)
def test_bad_arguments_exit_nonzero_with_one_line_and_no_output(tmp_path, capsys, argv, fragment) -> None:
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error:") and fragment in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_a_non_empty_directory(tmp_path, capsys) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["convert", "--model", "fixup_resnet8", "--out", str(tmp_path)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_malformed_proportions_are_an_argparse_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["convert", "--proportions", "a,b"])
    assert info.value.code == 2 and "comma-separated numbers" in capsys.readouterr().err


def test_console_script_describe() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "partition_fx.cli", "describe", "--model", "fixup_resnet8", "--partitions", "2",
         "--proportions", "0.5,0.5"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "PartitionedModel of FixupResNet: C=2" in result.stdout and "layer1.0.scale" in result.stdout


def test_describe_with_seed_defaults_and_regenerated_indices(capsys) -> None:
    argv = ["describe", "--model", "cifar_wrn16_4", "--default", "seed", "--assignments", "regenerated"]
    assert main(argv) == 0
    assert "default='seed', assignments='regenerated', seed=0" in capsys.readouterr().out


REFUSED_WITHOUT_TORCH = [
    ["train", "--steps", "-5"],
    ["train", "--proportions", "0.5,0.6,0.1"],
    ["train", "--proportions", "0.5,0.5"],
    ["train", "--out", "{file}"],
    ["train", "--out", "{file}", "--overwrite"],
    ["train", "--resume", "{missing}"],
    ["train", "--data", "rotdigit"],
    ["train", "--max-range", "shear=0"],
    ["train", "--train-range-factors", "scale=0"],
    ["train", "--train-range-factors", "scale=1"],
    ["train", "--train-range-factors", "rotation=1", "--augment", "none"],
    ["train", "--population-interval", "5"],
    *([["train", "--out", "/proc/partition-fx-run"]] if Path("/proc").is_dir() else []),  # nothing can be made there
    ["train", "--init", "rotation=4"],
    ["convert", "--partitions", "0", "--out", "{missing}"],
    ["convert", "--out", "{file}", "--overwrite"],
    ["export", "--run", "{missing}"],
    ["federated", "--proportions", "0.5,0.6,0.1"],
    ["federated", "--alpha", "0", "--out", "{missing}"],
]


def test_a_refused_value_answers_before_torch_is_imported(tmp_path) -> None:
    """Bad option values took 8-15 s to refuse because the commands imported torch first; every check that
    needs no torch now runs before it (the test fails if any refusal below imports torch)."""
    (tmp_path / "afile").write_text("mine\n")
    paths = {"file": tmp_path / "afile", "missing": tmp_path / "missing"}
    cases = [[a.format(**paths) for a in argv] for argv in REFUSED_WITHOUT_TORCH]
    script = (
        "import contextlib, io, json, sys\n"
        "from partition_fx.cli import main\n"
        "codes = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    with contextlib.redirect_stderr(io.StringIO()):\n"
        "        codes.append(main(argv))\n"
        "print(json.dumps([codes, 'torch' in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    codes, torch_imported = json.loads(result.stdout)
    assert codes == [2] * len(cases) and not torch_imported
    assert (tmp_path / "afile").read_text() == "mine\n" and not (tmp_path / "missing").exists()
    assert not (tmp_path / "runs").exists()  # the default --out was never touched


def test_a_mistyped_option_gets_a_suggestion_and_the_commands_own_help(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--stepz", "5"])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err
    assert "--stepz 5 (did you mean --steps?)" in err and err.endswith("see `partition-fx train --help`")
