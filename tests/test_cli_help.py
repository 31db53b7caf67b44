"""What a new user meets on the command line: help that explains every command and option with its default
(once), name hints that point at what the command accepts, ``--partitions N`` alone, and a ``--help`` that
answers without importing torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from partition_fx.cli import build_parser, main
from partition_fx.cli.commands import commands
from partition_fx.cli.parser import DESCRIPTION

REQUIRED = {"export": ["--run", "somewhere"], "predict": ["--run", "somewhere", "image.png"]}
TINY = ["--model", "fixup_resnet8", "--image-size", "8", "--steps", "2", "--batch-size", "4", "--quiet"]


def help_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "300")  # one line per option where it fits: nothing split by wrapping
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def option_entries(text: str) -> dict[str, str]:
    """Each option's entry in a ``--help`` text (its first long name -> its help, lines joined)."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("  -"):
            head, _, rest = line.strip().partition("  ")
            name = re.findall(r"--[\w-]+", head)[0]
            current = entries.setdefault(name, [])
            current.append(rest.strip())
        elif line.startswith("    ") and current is not None:
            current.append(line.strip())
        else:
            current = None
    return {name: " ".join(part for part in parts if part) for name, parts in entries.items()}


def usage_options(text: str) -> set[str]:
    usage = text.split("\n\n")[0]
    return set(re.findall(r"(?<![\w-])--[\w-]+", usage))


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_option_of_every_command_has_help_and_shows_its_default_once(monkeypatch, capsys, command):
    text = help_text(monkeypatch, capsys, command)
    entries = option_entries(text)
    assert set(entries) == usage_options(text) | {"--help"}, "an option of the usage line has no help entry"
    defaults = vars(build_parser().parse_args([command, *REQUIRED.get(command, [])]))
    for option, help_ in entries.items():
        if option == "--help":
            continue
        words = help_.split("(default:")[0].strip()
        assert words, f"{command} {option} has no help text"
        if option == "--run" and command == "export":  # the one required option: no default, and it says so
            assert "(required)" in help_ and "(default:" not in help_
            continue
        if command == "predict" and option in ("--run", "--model"):  # one of them is required: they say so
            assert "(required: --run or --model)" in help_ and "(default:" not in help_
            continue
        assert help_.count("(default:") == 1, f"{command} {option}: {help_!r} shows its default not exactly once"
        assert "(default: None)" not in help_ and "(default: (" not in help_, f"{command} {option}: {help_!r}"
        value = defaults[option[2:].replace("-", "_")]
        if value is False:  # a flag
            assert "(default: off" in help_, f"{command} {option}: {help_!r}"
        elif value is not None:
            assert f"(default: {value})" in help_, f"{command} {option}: {help_!r} does not show {value!r}"


def test_the_tool_and_every_command_have_a_description(monkeypatch, capsys):
    top = help_text(monkeypatch, capsys)
    assert DESCRIPTION in " ".join(top.split()) and "partition" in DESCRIPTION.lower()
    for command, (summary, description) in ((c.name, (c.summary, c.description)) for c in commands().values()):
        assert re.search(rf"^\s+{command}\s+{re.escape(summary)}$", top, re.MULTILINE), f"{command}: no summary"
        text = help_text(monkeypatch, capsys, command)
        assert description and " ".join(text.split("\n\n")[1].split()) == description, f"{command}: no description"


def test_proportions_default_is_written_as_on_the_command_line(monkeypatch, capsys):
    for command in ("train", "convert", "describe"):
        entries = option_entries(help_text(monkeypatch, capsys, command))
        assert "(default: 0.8,0.1,0.1 with 3 partitions, equal shares" in entries["--proportions"]
        assert "equal shares" in entries["--partitions"]


def test_every_command_builds_the_same_default_model():
    parser = build_parser()
    models = {command: parser.parse_args([command]).model for command in ("train", "convert", "describe")}
    assert set(models.values()) == {"resnet10t"}, models


@pytest.mark.parametrize("name", ["resnet10", "resnet10tt", "ResNet10T "])
def test_an_unknown_model_suggests_the_close_names(capsys, name):
    assert main(["describe", "--model", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: unknown model") and "\n" not in err
    assert "did you mean resnet10t," in err, err


@pytest.mark.parametrize(("data", "suggestion"), [("nonsense", None), ("rotdigit", "rotdigits"), ("digit", "digits")])
def test_trains_unknown_dataset_hint_offers_only_what_train_accepts(tmp_path, capsys, data, suggestion):
    out = tmp_path / "never"
    assert main(["train", *TINY, "--data", data, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: unknown dataset") and "--data" in err and "\n" not in err
    assert "rotdigits" in err and "input_selection" not in err
    assert (f"did you mean {suggestion}?" in err) == (suggestion is not None), err
    assert not out.exists()


def test_partitions_alone_trains_with_equal_shares(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--partitions", "2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "completed" and report["config"]["partitions"] == 2
    assert report["config"]["proportions"] == [0.5, 0.5]
    capsys.readouterr()
    assert main(["describe", "--model", "fixup_resnet8", "--partitions", "4"]) == 0
    assert "C=4, proportions=(0.25, 0.25, 0.25, 0.25)" in capsys.readouterr().out
    assert main(["describe", "--model", "fixup_resnet8", "--partitions", "3"]) == 0  # the default shares
    assert "C=3, proportions=(0.8, 0.1, 0.1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["--proportions", "0.5,0.5"], "or --partitions 2 to match them"),
        (["--partitions", "2", "--proportions", "0.8,0.1,0.1"], "give --proportions 2 comma-separated shares"),
    ],
)
def test_proportions_of_another_length_are_refused_with_the_command_line_fix(tmp_path, capsys, argv, fix):
    out = tmp_path / "never"
    assert main(["convert", "--model", "fixup_resnet8", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: --partitions") and "--proportions" in err and "\n" not in err
    assert fix in err and "proportions=None" not in err and "leave --proportions out" in err
    assert not out.exists()


def _python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True, timeout=300
    )
    return result.stdout.strip()


def test_the_command_line_parses_and_helps_without_importing_torch():
    assert (
        _python("""
        import contextlib, io, sys
        import partition_fx.cli
        from partition_fx.cli import build_parser, main
        build_parser().parse_args(["train", "--steps", "5", "--proportions", "0.5,0.5", "--partitions", "2"])
        for argv in (["--help"], ["train", "--help"], ["describe", "--steps", "x"]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    main(argv)
                except SystemExit:
                    pass
        print(sorted(name for name in ("torch", "timm", "numpy") if name in sys.modules))
    """)
        == "[]"
    )


def test_the_lazy_package_still_registers_its_models_and_exports_its_names():
    assert (
        _python("""
        import sys
        import partition_fx
        assert "torch" not in sys.modules
        import timm
        print(timm.is_model("fixup_resnet8"), timm.is_model("cifar_wrn16_4"))
    """)
        == "True True"
    )
    assert (
        _python("""
        import timm, partition_fx
        from partition_fx import PartitionedModel, export_onnx, export_subnetwork, fit, partitionify
        import partition_fx.training
        print(timm.is_model("fixup_resnet8"), partition_fx.training.fit is fit, sorted(partition_fx.__all__) == \
sorted(n for n in partition_fx.__all__ if hasattr(partition_fx, n)))
    """)
        == "True True True"
    )
