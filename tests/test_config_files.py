"""``partition-fx train --print-config`` / ``--config FILE``: the whole job as YAML and back.

Against definitions: a printed configuration read back prints the same (for option sets drawn by hypothesis), an
option given beside ``--config`` overrides the file, a partial file keeps every other default, a run from a file
trains bit for bit the model of the same run from flags, and every bad file is refused with one message naming
the file, the key and what the key takes.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from partition_fx.cli import main
from partition_fx.cli.commands.train import job_spec
from partition_fx.cli.parser import parse_train

TINY = ["--model", "fixup_resnet8", "--image-size", "8", "--steps", "3", "--batch-size", "4", "--hyper-batch-size", "4"]
TINY += ["--hyper-samples", "2", "--samples", "2", "--test-time-samples", "0", "--quiet"]


def _printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["train", *argv, "--print-config"]) == 0
    return capsys.readouterr().out


OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "--steps": st.integers(2, 500).map(str),
        "--model": st.sampled_from(["fixup_resnet8", "resnet10t"]),
        "--proportions": st.sampled_from(["0.6,0.2,0.2", "0.5,0.25,0.25"]),
        "--hyper-lr": st.floats(1e-4, 1.0).map(repr),
        "--draws": st.sampled_from(["uniform", "stratified"]),
        "--fix": st.sampled_from(["rotation=1.0", "translation_x=0.1,shear=0.2"]),
        "--finetune-steps": st.just("1"),
        "--restore-best": st.just(None),
    },
)


@settings(max_examples=15, deadline=None)
@given(OPTIONS)
def test_a_printed_configuration_reads_back_as_the_same_job(tmp_path_factory, options) -> None:
    argv = [word for option, value in options.items() for word in (option, *([] if value is None else [value]))]
    path = tmp_path_factory.mktemp("config") / "run.yaml"
    spec = job_spec(parse_train(argv))
    from partition_fx.cli.config_files import config_text

    path.write_text(config_text(spec))
    assert job_spec(parse_train(["--config", str(path)])) == spec
    assert yaml.safe_load(path.read_text()) == json.loads(json.dumps(spec.to_dict()))  # as report.json holds it


def test_options_given_override_the_file_and_a_partial_file_keeps_the_defaults(tmp_path, capsys) -> None:
    path = tmp_path / "part.yaml"
    path.write_text("model: fixup_resnet8\ntrain:\n  optimization:\n    steps: 40\n  hyper:\n    lr: 0.2\n")
    printed = yaml.safe_load(_printed(["--config", str(path), "--steps", "12"], capsys))
    expected = job_spec(parse_train(["--model", "fixup_resnet8", "--hyper-lr", "0.2", "--steps", "12"])).to_dict()
    assert printed == expected
    assert printed["train"]["optimization"]["steps"] == 12 and printed["train"]["hyper"]["lr"] == 0.2


def test_a_file_naming_a_recipe_fills_in_the_recipe_s_options(tmp_path, capsys) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text("recipe: paper-cifar10-fixup8\ntrain:\n  optimization:\n    steps: 10\n")
    printed = yaml.safe_load(_printed(["--config", str(path)], capsys))
    expected = job_spec(parse_train(["--recipe", "paper-cifar10-fixup8", "--steps", "10"])).to_dict()
    assert printed == json.loads(json.dumps(expected))
    assert printed["model"] == "fixup_resnet8" and printed["train"]["optimization"]["batch_size"] == 250
    path.write_text("recipe: paper-mnist\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(path)])
    assert "recipe 'paper-mnist' is not one of paper-cifar10-fixup14" in capsys.readouterr().err


def test_a_run_from_a_file_trains_the_model_of_the_same_run_from_flags(tmp_path, capsys) -> None:
    flags = [*TINY, "--proportions", "0.5,0.25,0.25", "--init", "rotation=1.0"]
    (tmp_path / "run.yaml").write_text(_printed(flags, capsys))
    assert main(["train", *flags, "--out", str(tmp_path / "flags")]) == 0
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--quiet", "--out", str(tmp_path / "file")]) == 0
    by_flags, by_file = (load_file(tmp_path / run / "model.safetensors") for run in ("flags", "file"))
    assert by_flags.keys() == by_file.keys()
    assert all(by_flags[k].equal(by_file[k]) for k in by_flags)
    reports = [json.loads((tmp_path / run / "report.json").read_text()) for run in ("flags", "file")]
    assert reports[0]["config"] == reports[1]["config"]


def test_print_config_with_resume_prints_the_run_s_job_and_config_with_resume_is_refused(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(run), "--keep-resume"]) == 0
    capsys.readouterr()
    report = json.loads((run / "report.json").read_text())
    report["status"] = "failed"  # a run that did not finish, as --resume continues
    (run / "report.json").write_text(json.dumps(report))
    assert yaml.safe_load(_printed(["--resume", str(run)], capsys)) == report["config"]
    (tmp_path / "c.yaml").write_text("model: resnet10t\n")
    assert main(["train", "--resume", str(run), "--config", str(tmp_path / "c.yaml")]) == 2
    assert "drop --config" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour: red\n", r"unknown key\(s\) colour at the top level; it takes model, checkpoint, data"),
        (
            "train:\n  optimization:\n    stepz: 3\n",
            r"unknown key\(s\) stepz at train.optimization \(did you mean steps\?\); it takes steps, ",
        ),
        ("train: 5\n", r"train must be a mapping of its settings, got 5"),
        ("- 1\n", r"holds a list, not a mapping of options; write it with `partition-fx train --print-config"),
        ("steps: [1\n", r"not valid YAML at line 2"),
        (
            "train:\n  optimization:\n    steps: -3\n",
            r"train.optimization.steps must be >= 1, got -3 \(the option --steps\)",
        ),
        ("draws: sobol\n", r"draws must be one of 'uniform', 'stratified', got 'sobol' \(the option --draws\)"),
        ("", r"holds no settings \(the file is empty\); write one with `partition-fx train --print-config > FILE`"),
        (
            'proportions: "0.8,0.1,0.1"\n',
            r"proportions must be a list of numbers, got '0.8,0.1,0.1' \(the option --proportions\)",
        ),
        ("steps: 40\n", r"unknown key\(s\) steps at the top level \(steps is train.optimization.steps\); it takes"),
        ("train:\n  hyper_lr: 0.1\n", r"unknown key\(s\) hyper_lr at train \(hyper_lr is train.hyper.lr\); it takes"),
        # a typo: the closest key, as the command line names the closest option
        (
            "train:\n  optimization:\n    step: 40\n",
            r"step at train.optimization \(did you mean steps\?\); it takes steps",
        ),
        ("step: 40\n", r"step at the top level \(did you mean train.optimization.steps\?\); it takes model, "),
        (
            "train:\n  optimisation:\n    steps: 40\n",
            r"optimisation at train \(did you mean optimization\?\); it takes",
        ),
        ("train:\n  hyper:\n    lrr: 0.1\n", r"lrr at train.hyper \(did you mean lr\?\); it takes"),
        (
            "modle: resnet10t\nstpes: 40\ncolour: red\n",
            r"colour, modle, stpes at the top level \(modle: did you mean model\?; stpes: did you mean "
            r"train.optimization.steps\?\); it takes model",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, capsys, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--config", str(path), "--print-config"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"partition-fx: error: --config {str(path)!r}: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("round: 3\n", r"unknown key\(s\) round at the top level \(did you mean rounds\?\); it takes data, "),
        ("steps: 3\n", r"unknown key\(s\) steps at the top level; it takes data, "),  # not train's steps: no such place
    ],
)
def test_a_federated_file_s_unknown_key_names_the_closest_of_its_own(tmp_path, capsys, text, message) -> None:
    path = tmp_path / "fed.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["federated", "--config", str(path), "--print-config"])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_missing_file_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "none.yaml")])
    assert "cannot read it (No such file or directory)" in capsys.readouterr().err


def test_print_config_writes_nothing_and_ignores_an_existing_out(tmp_path, capsys) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    printed = _printed(["--out", str(tmp_path / "taken")], capsys)
    assert yaml.safe_load(printed)["model"] == "resnet10t"
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


def test_a_recipe_a_file_and_the_command_line_override_each_other_in_that_order(tmp_path):
    """The recipe's values are the defaults, the --config file's override them, the options given override both."""
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  optimization:\n    steps: 7\n    momentum: 0.5\n")
    argv = ["--recipe", "paper-cifar10-fixup8", "--config", str(path), "--lr", "0.2"]
    spec = job_spec(parse_train(argv))
    optimization = spec.train.optimization
    assert (spec.model, spec.recipe, optimization.optimizer) == ("fixup_resnet8", "paper-cifar10-fixup8", "sgd")
    assert (optimization.steps, optimization.momentum, optimization.lr) == (7, 0.5, 0.2)


def test_print_config_refuses_a_model_training_would_refuse(capsys) -> None:
    assert main(["train", "--model", "resnet10", "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "unknown model 'resnet10' (not in timm's registry); did you mean" in captured.err
