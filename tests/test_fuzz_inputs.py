"""Fuzzed bad input: every refusal of the command line is one clear line naming the option, with nothing
written (no output directory, no staging leftovers, an existing directory unchanged), and every refusal of
``fit`` is a ``PartitionError`` naming the argument, raised before anything is trained or written.

Nothing is trained here: ``PartitionedTrainer.run`` (and, for ``convert`` and ``export``, the first step after
validation) raises ``WorkStarted``, so an input wrongly accepted fails the test as accepted, in a fraction of a
second. The tables ``CLI_BAD`` and ``FIT_BAD`` hold the bad inputs by category.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.torch import save_file
from torch import nn

import partition_fx.cli.convert
import partition_fx.cli.export
from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.errors import PartitionError
from partition_fx.job.records import read_spec
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit, split_into_chunks
from partition_fx.transforms import InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

TINY = ["--model", "fixup_resnet8", "--image-size", "16", "--steps", "4", "--batch-size", "8", "--samples", "2"]
TINY += ["--eval-every", "2", "--quiet"]
BASE = {"train": TINY, "convert": ["--model", "fixup_resnet8"], "describe": ["--model", "fixup_resnet8"], "export": []}
CUDA = torch.cuda.is_available()


class WorkStarted(BaseException):
    """Raised where the real work (training, conversion, export) would begin: the input was accepted."""


@pytest.fixture(scope="module", autouse=True)
def nothing_runs() -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise WorkStarted

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionedTrainer, "run", refuse)
        patch.setattr(partition_fx.cli.convert, "normalized_digits", refuse)  # convert: after the model is converted
        patch.setattr(partition_fx.cli.export, "export_subnetwork", refuse)  # export: after the run is rebuilt
        yield


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run as `partition-fx train` leaves it when training fails at once: report.json and checkpoints."""
    out = tmp_path_factory.mktemp("fuzz") / "run"

    def checkpoint_then_stop(self: PartitionedTrainer, *args: Any, **kwargs: Any) -> None:
        self.save_checkpoint(out / "checkpoint" / "last.safetensors")
        self.save_checkpoint(out / "checkpoint" / "best.safetensors")
        raise WorkStarted

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(io.StringIO()):
        patch.setattr(PartitionedTrainer, "run", checkpoint_then_stop)
        with pytest.raises(WorkStarted):
            main(["train", *TINY, "--out", str(out)])
    assert json.loads((out / "report.json").read_text())["status"] == "failed"
    return out


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Loadable weights for the `train` model (fixup_resnet8 on 1-channel digits)."""
    path = tmp_path_factory.mktemp("weights") / "fixup_resnet8.safetensors"
    save_file(timm.create_model("fixup_resnet8", num_classes=10, in_chans=1).state_dict(), str(path))
    return path


# --- bad values ---------------------------------------------------------------------------------------


def _parses(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=8)  # argv cannot hold NUL
NOT_INT = st.sampled_from(["", "abc", "1.5", "1e3", "0x10", "nan", "inf", "1,2", " ", "--"]) | TEXT.filter(
    lambda s: not _parses(int, s)
)
NOT_FLOAT = st.sampled_from(["", "abc", "1,5", "1e", "--", "0.1.2"]) | TEXT.filter(lambda s: not _parses(float, s))
NON_POSITIVE = st.integers(max_value=0).map(str)
NEGATIVE = st.integers(max_value=-1).map(str)
NOT_POSITIVE_FLOAT = st.floats(max_value=0.0).map(repr) | st.sampled_from(["nan", "inf", "-inf", "1e400", "-1e400"])
NOT_NON_NEGATIVE_FLOAT = st.floats(max_value=0.0, exclude_max=True).map(repr) | st.sampled_from(["nan", "inf", "1e400"])
NOT_FRACTION = st.floats(max_value=0.0, exclude_max=True) | st.floats(min_value=1.0, exclude_min=True)
NOT_FRACTION |= st.just(math.nan)


def _not(*allowed: str) -> st.SearchStrategy[str]:
    return TEXT.filter(lambda s: s not in allowed)


def _numbers(count: int) -> st.SearchStrategy[list[float]]:
    return st.lists(st.floats(0.05, 1.0), min_size=count, max_size=count)


def _joined(values: list[float], sep: str = ",") -> str:
    return sep.join(repr(v / sum(values)) for v in values)


MALFORMED_PROPORTIONS = st.one_of(
    st.tuples(_numbers(3), st.sampled_from([";", " ", ":", "|", "/", ",,", "\t"])).map(lambda t: _joined(*t)),
    _numbers(3).map(lambda v: _joined(v) + ","),
    _numbers(3).map(lambda v: "," + _joined(v)),
    st.sampled_from(["", ",", "a,b,c", "0.8,0.1,x", "[0.8,0.1,0.1]", "(0.8, 0.1, 0.1)", "0.8 ,0.1,,0.1"]),
)
BAD_PROPORTIONS = st.one_of(
    st.sampled_from([1, 2, 4, 5]).flatmap(_numbers).map(_joined),  # not one per partition (3)
    _numbers(3).filter(lambda v: abs(sum(v) - 1) > 1e-3).map(lambda v: ",".join(map(repr, v))),  # sum != 1
    st.sampled_from(["nan,0.5,0.5", "inf,0.1,0.1", "0.5,-0.5,1.0", "-0.1,0.6,0.5"]),
)
OTHER_COUNTS = st.sampled_from(["2", "4", "7"])  # with THREE_SHARES: a --partitions --proportions mismatch
THREE_SHARES = ("--proportions", "0.8,0.1,0.1")
OTHER_SHARES = st.sampled_from(["0.5,0.5", "0.25,0.25,0.25,0.25"])  # with the default 3 partitions
EMPTY_CHUNK = st.sampled_from(["1,0,0", "0.9999,0.00005,0.00005", "0.5,0.5,0"])  # for train


@dataclass(frozen=True)
class Bad:
    """A command's option and values of it that must be refused; the line must contain one of ``names``."""

    command: str
    option: str
    values: st.SearchStrategy[str]
    category: str
    names: tuple[str, ...]
    extra: tuple[str, ...] = ()  # more arguments the case needs (e.g. --overwrite)
    no_out: bool = False  # the case gives its own --out, or none (--resume)


def _paths(*names: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name.replace("ROOT", "{root}") for name in names])


BAD_CHECKPOINTS = _paths(
    "ROOT/missing.safetensors", "ROOT/emptydir", "ROOT/afile", "ROOT/empty.safetensors", "ROOT/garbage.pth",
    "ROOT/garbage.safetensors", "ROOT/wrong_keys.safetensors", "ROOT/list.pth",
)  # fmt: skip
BAD_OUTS = _paths("ROOT/afile", "ROOT/nonempty", "ROOT/afile/sub", ".", "ROOT", "")
BAD_RUNS = _paths(
    "ROOT/missing", "ROOT/afile", "ROOT/emptydir", "ROOT/nonempty", "ROOT/bad_json", "ROOT/no_config",
    "ROOT/list_json", "ROOT/config_without_keys", "ROOT/earlier_run", "",
)  # fmt: skip


def _common(command: str) -> list[Bad]:
    """The conversion options `train`, `convert` and `describe` share."""
    return [
        Bad(command, "--partitions", NOT_INT, "type errors", ("--partitions",)),
        Bad(command, "--partitions", NON_POSITIVE, "out-of-range numbers", ("--partitions",)),
        Bad(command, "--partitions", st.integers(256, 10**6).map(str), "out-of-range numbers", ("--partitions",)),
        # --partitions alone means equal shares; it conflicts only with --proportions given for another count
        Bad(command, "--partitions", OTHER_COUNTS, "conflicting options", ("--partitions",), THREE_SHARES),
        Bad(command, "--proportions", OTHER_SHARES, "conflicting options", ("--proportions",)),
        Bad(command, "--proportions", MALFORMED_PROPORTIONS, "malformed lists", ("--proportions",)),
        Bad(command, "--proportions", BAD_PROPORTIONS, "out-of-range numbers", ("--proportions",)),
        Bad(command, "--scheme", _not("random", "node"), "unknown choices", ("--scheme",)),
        Bad(command, "--default", _not("init", "zero", "seed"), "unknown choices", ("--default",)),
        Bad(command, "--assignments", _not("stored", "regenerated"), "unknown choices", ("--assignments",)),
        Bad(command, "--seed", NOT_INT, "type errors", ("--seed",)),
        Bad(command, "--seed", NEGATIVE, "out-of-range numbers", ("--seed",)),
        Bad(command, "--seed", st.integers(2**63, 10**30).map(str), "huge numbers", ("--seed",)),
        Bad(command, "--model", _not(*timm.list_models()).filter(lambda s: s.strip()), "unknown choices", ("model",)),
        Bad(command, "--checkpoint", BAD_CHECKPOINTS, "bad paths", ("--checkpoint",)),
    ]


# fmt: off
CLI_BAD: list[Bad] = [
    *_common("train"),
    *[
        Bad("train", f"--{name}", values, category, (f"--{name}",))
        for name in ("steps", "batch-size", "samples", "hyper-every", "hyper-samples", "hyper-batch-size",
                     "eval-every", "image-size", "channels")
        for values, category in ((NOT_INT, "type errors"), (NON_POSITIVE, "out-of-range numbers"))
    ],
    Bad("train", "--warmup-steps", NOT_INT, "type errors", ("--warmup-steps",)),
    Bad("train", "--warmup-steps", NEGATIVE, "out-of-range numbers", ("--warmup-steps",)),
    Bad("train", "--finetune-steps", NOT_INT, "type errors", ("--finetune-steps",)),
    Bad("train", "--finetune-steps", NEGATIVE, "out-of-range numbers", ("--finetune-steps",)),
    Bad("train", "--finetune-steps", st.integers(400, 10**30).map(str), "conflicting options", ("--finetune-steps",)),
    Bad("train", "--finetune-fraction", NOT_FLOAT, "type errors", ("--finetune-fraction",)),
    Bad("train", "--finetune-fraction", NOT_FRACTION.map(repr), "out-of-range numbers", ("--finetune-fraction",)),
    Bad("train", "--hyper-chunks", _not("one", "all"), "unknown choices", ("--hyper-chunks",)),
    Bad("train", "--hyper-samples", st.integers(10**12, 10**30).map(str), "huge numbers", ("--hyper-samples",)),
    *[
        Bad("train", f"--{name}", values, category, (f"--{name}",))
        for name, bad in (
            ("lr", NOT_POSITIVE_FLOAT), ("hyper-lr", NOT_POSITIVE_FLOAT), ("weight-decay", NOT_NON_NEGATIVE_FLOAT)
        )
        for values, category in ((NOT_FLOAT, "type errors"), (bad, "out-of-range numbers"))
    ],
    Bad("train", "--image-size", st.integers(1, 7).map(str), "out-of-range numbers", ("--image-size",)),
    Bad("train", "--image-size", st.integers(10**6, 10**30).map(str), "huge numbers", ("--image-size",)),
    Bad("train", "--channels", st.integers(10**8, 10**30).map(str), "huge numbers", ("--channels",)),
    Bad("train", "--batch-size", st.integers(10**12, 10**30).map(str), "huge numbers", ("--batch-size",)),
    Bad("train", "--samples", st.integers(10**12, 10**30).map(str), "huge numbers", ("--samples",)),
    Bad("train", "--weight-decay", st.sampled_from(["1.5e308", "1.7e308"]), "huge numbers", ("--weight-decay",)),
    Bad("train", "--augment", _not("affine", "none"), "unknown choices", ("--augment",)),
    Bad("train", "--device", _not("cpu", "auto", *(["cuda"] if CUDA else [])), "unknown choices", ("--device",)),
    Bad("train", "--data", _paths("ROOT/missing", "ROOT/afile", "ROOT/emptydir", "ROOT/nonempty", ""), "bad paths",
        ("--data",)),
    Bad("train", "--data", _not("digits", "rotdigits"), "unknown choices", ("--data",)),
    Bad("train", "--data", st.just("input_selection"), "conflicting options", ("--data",)),
    Bad("train", "--out", BAD_OUTS, "bad paths", ("--out",)),
    Bad("train", "--out", _paths("ROOT/images", "ROOT"), "conflicting options", ("--out",),
        ("--data", "{root}/images/digits", "--proportions", "0.4,0.3,0.3", "--overwrite")),
    Bad("train", "--out", _paths("ROOT/nonempty", "ROOT"), "conflicting options", ("--out",),
        ("--checkpoint", "{root}/nonempty/weights.safetensors", "--overwrite")),
    Bad("train", "--resume", BAD_RUNS, "bad paths", ("--resume",), no_out=True),
    Bad("train", "--resume", st.just("{run}"), "conflicting options", ("--steps",), ("--steps", "5"), no_out=True),
    Bad("train", "--resume", st.just("{run}"), "bad paths", ("--resume",), no_out=True),  # no resume state in it
    Bad("train", "--partitions", st.just("1"), "conflicting options", ("--partitions",)),  # with --augment affine
    Bad("train", "--proportions", EMPTY_CHUNK, "out-of-range numbers", ("--proportions",)),
    Bad("train", "--bogus", st.just("1"), "unknown options", ("--bogus",)),
    *_common("convert"),
    Bad("convert", "--num-classes", NOT_INT, "type errors", ("--num-classes",)),
    Bad("convert", "--num-classes", NON_POSITIVE, "out-of-range numbers", ("--num-classes",)),
    Bad("convert", "--num-classes", st.integers(10**13, 10**30).map(str), "huge numbers", ("--num-classes",)),
    Bad("convert", "--input-size", NOT_INT, "type errors", ("--input-size",)),
    Bad("convert", "--input-size", NON_POSITIVE, "out-of-range numbers", ("--input-size",)),
    Bad("convert", "--input-size", st.integers(10**7, 10**30).map(str), "huge numbers", ("--input-size",)),
    Bad("convert", "--out", BAD_OUTS, "bad paths", ("--out",)),
    *_common("describe"),
    Bad("describe", "--num-classes", NON_POSITIVE, "out-of-range numbers", ("--num-classes",)),
    Bad("export", "--run", BAD_RUNS | _paths("ROOT/corrupt_run"), "bad paths", ("--run", "checkpoint")),
    Bad("export", "--which", _not("last", "best"), "unknown choices", ("--which",), ("--run", "{run}")),
    Bad("export", "--subnetwork", NOT_INT, "type errors", ("--subnetwork",), ("--run", "{run}")),
    Bad("export", "--subnetwork", st.integers(max_value=-1).map(str) | st.integers(4, 10**30).map(str),
        "out-of-range numbers", ("--subnetwork",), ("--run", "{run}")),
    Bad("export", "--out", BAD_OUTS, "bad paths", ("--out",), ("--run", "{run}")),
    Bad("export", "--out", st.sampled_from(["{run}", "{run}/.."]), "conflicting options", ("--out",),
        ("--run", "{run}", "--overwrite")),
]
# fmt: on


def _make_root(root: Path, run: Path, weights: Path) -> None:
    """The files the bad paths point at."""
    (root / "afile").write_text("not a directory, not weights\n")
    (root / "emptydir").mkdir()
    (root / "nonempty").mkdir()
    (root / "nonempty" / "keep.txt").write_text("mine\n")
    (root / "nonempty" / "weights.safetensors").write_bytes(weights.read_bytes())
    (root / "empty.safetensors").write_bytes(b"")
    (root / "garbage.pth").write_bytes(bytes(range(256)) * 4)
    (root / "garbage.safetensors").write_bytes(b"\xff" * 64)
    save_file({"foo": torch.zeros(3)}, str(root / "wrong_keys.safetensors"))
    torch.save([1, 2], root / "list.pth")
    reports = {"bad_json": "{", "no_config": "{}", "list_json": "[1]", "config_without_keys": '{"config": {"a": 1}}'}
    for name, text in reports.items():
        (root / name / "checkpoint").mkdir(parents=True)
        (root / name / "report.json").write_text(text)
        (root / name / "checkpoint" / "last.safetensors").write_bytes(
            (run / "checkpoint/last.safetensors").read_bytes()
        )
    report = json.loads((run / "report.json").read_text())
    del report["config"]["train"]["runtime"]["precision"]  # as an earlier development version wrote it
    (root / "earlier_run" / "checkpoint").mkdir(parents=True)
    (root / "earlier_run" / "report.json").write_text(json.dumps(report))
    (root / "corrupt_run" / "checkpoint").mkdir(parents=True)
    (root / "corrupt_run" / "report.json").write_text((run / "report.json").read_text())
    (root / "corrupt_run" / "checkpoint" / "last.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    for label in ("a", "b"):  # an image folder the --out conflicts point into
        (root / "images" / "digits" / label).mkdir(parents=True)
        for i in range(12):
            pixels = torch.full((8, 8), 40 if label == "a" else 200, dtype=torch.uint8).numpy()
            Image.fromarray(pixels, mode="L").save(root / "images" / "digits" / label / f"{i}.png")


def _snapshot(*roots: Path) -> dict[str, tuple[bool, int, int]]:
    return {
        str(path): (path.is_dir(), path.stat().st_size if path.is_file() else 0, path.stat().st_mtime_ns)
        for root in roots
        for path in [root, *root.rglob("*")]
    }


@contextlib.contextmanager
def _inside(directory: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


def run_cli(argv: list[str]) -> tuple[int | str | None, str, str]:
    """``main(argv)`` in-process: (exit code, stdout, stderr). Logged warnings go to stderr too, as they do
    from the console script (logging's last-resort handler), where pytest would capture them."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: int | str | None = main(argv)
            except SystemExit as e:
                code = e.code
            except WorkStarted:
                code = 0  # accepted: the work began
    finally:
        logging.getLogger().removeHandler(handler)
    return code, out.getvalue(), err.getvalue()


def check_refused(case: Bad, value: str, run: Path, weights: Path, joined: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _make_root(root, run, weights)
        own_run = shutil.copytree(run, root / "runs" / "run")  # what a wrong --overwrite could delete
        fill = lambda text: text.replace("{root}", str(root)).replace("{run}", str(own_run))  # noqa: E731
        given = [f"{case.option}={fill(value)}"] if joined else [case.option, fill(value)]
        argv = [case.command, *BASE[case.command], *given, *map(fill, case.extra)]
        if case.command in ("train", "convert", "export") and case.option != "--out" and not case.no_out:
            argv += ["--out", str(root / "out")]
        before = _snapshot(root, run)
        with _inside(root):
            code, out, err = run_cli(argv)
        lines = err.strip().splitlines()
        assert code not in (0, None), f"{argv} was accepted"
        assert len(lines) == 1, f"{argv}: stderr is not one line:\n{err}"
        assert lines[0].startswith("partition-fx: error: "), lines[0]
        assert any(name in lines[0] for name in case.names), f"{lines[0]!r} does not name {case.names}"
        assert "Traceback" not in out + err
        assert _snapshot(root, run) == before, f"{argv} changed the files"


# Each example takes a fraction of a second: the data are the small digits, the model a FixUp ResNet-8, and
# an accepted input stops before any work.
@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CLI_BAD), data=st.data(), joined=st.booleans())
def test_bad_cli_input_is_one_clear_line_and_writes_nothing(run_dir, weights, case, data, joined):
    value = data.draw(case.values, label="value")
    check_refused(case, value, run_dir, weights, joined)


@pytest.mark.parametrize("case", CLI_BAD, ids=lambda case: f"{case.command}{case.option}-{case.category}")
def test_each_bad_cli_case_is_refused_once(run_dir, weights, case):
    """Every row of the table at least once, whatever the fuzzer above draws (its first example)."""
    value = _first_example(case.values)
    check_refused(case, value, run_dir, weights, joined=True)


def _first_example(strategy: st.SearchStrategy[Any]) -> Any:
    """The strategy's first (derandomised) example: every table row runs at least once."""
    found: list[Any] = []

    @settings(max_examples=1, database=None, derandomize=True)
    @given(strategy)
    def take(value: Any) -> None:
        found.append(value)

    take()
    return found[0]


# --- accepted input reaches training with a consistent output directory ------------------------------


TRAIN_EXAMPLES = 1438
"""The training split of rotdigits and digits, which the accepted options train on."""


@st.composite
def good_train_options(draw: st.DrawFn) -> dict[str, Any]:
    partitions = draw(st.integers(2, 5))
    weights = draw(st.lists(st.floats(0.1, 1.0), min_size=partitions, max_size=partitions))
    proportions = _joined(weights)
    # a batch fits the chunk it is drawn from (chunk 1; the smallest later one): a larger one is refused
    sizes = split_into_chunks(TRAIN_EXAMPLES, [float(p) for p in proportions.split(",")]).sizes
    return {
        "steps": draw(st.integers(1, 10**9)),
        "batch-size": draw(st.integers(1, min(256, sizes[0]))),
        "samples": draw(st.integers(1, 4)),
        "partitions": partitions,
        "proportions": proportions,
        "image-size": draw(st.integers(8, 24)),
        "channels": draw(st.sampled_from([None, 1, 2, 3])),
        "lr": draw(st.floats(1e-6, 10.0)),
        "hyper-lr": draw(st.floats(1e-6, 10.0)),
        "weight-decay": draw(st.floats(0.0, 1.0)),
        "hyper-every": draw(st.integers(1, 20)),
        "hyper-chunks": draw(st.sampled_from(["one", "all"])),
        "hyper-samples": draw(st.integers(1, 8)),
        "hyper-batch-size": draw(st.integers(1, min(64, *sizes[1:]))),
        "warmup-steps": draw(st.integers(0, 100)),
        "eval-every": draw(st.sampled_from([None, 1, 7, 10**6])),
        "scheme": draw(st.sampled_from(["random", "node"])),
        "default": draw(st.sampled_from(["init", "zero", "seed"])),
        "assignments": draw(st.sampled_from(["stored", "regenerated"])),
        "augment": draw(st.sampled_from(["affine", "none"])),
        "data": draw(st.sampled_from(["rotdigits", "digits"])),
        "seed": draw(st.integers(0, 2**63 - 1)),
        "fused": draw(st.booleans()),
        "every-partition": draw(st.booleans()),
    }


@settings(max_examples=20, deadline=None)
@given(options=good_train_options())
def test_good_train_input_reaches_training_with_only_a_report_written(options):
    started: dict[str, Any] = {}

    def record(trainer: PartitionedTrainer, **kwargs: Any) -> None:
        started.update(trainer=trainer, **kwargs)
        raise WorkStarted

    argv = ["train", "--model", "fixup_resnet8", "--quiet"]
    for key, value in options.items():
        if isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        elif value is not None:
            argv += [f"--{key}={value}"]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionedTrainer, "run", record)
        out = Path(tmp) / "out"
        assert run_cli([*argv, "--out", str(out)])[0] == 0
        assert sorted(p.name for p in out.iterdir()) == ["report.json"]
        report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["history"] == []
    spec = read_spec(report["config"])
    for key, value in options.items():
        expected = tuple(float(p) for p in value.split(",")) if key == "proportions" else value
        assert spec.value(key.replace("-", "_")) == expected, key
    trainer = started["trainer"]
    assert trainer.config.optimization.steps == options["steps"] and trainer.step == 0
    # a tenth of the run, at least 20 iterations apart (at its end alone when shorter)
    assert trainer.config.eval_every == (
        options["eval-every"] or max(options["steps"] // 10, min(options["steps"], 20))
    )
    assert trainer.sampler.batch_size == options["batch-size"] and trainer.config.runtime.seed == options["seed"]
    assert (trainer.schedule.hyper_every, trainer.schedule.warmup_steps) == (
        options["hyper-every"],
        options["warmup-steps"],
    )
    assert trainer.config.hyper.chunks == options["hyper-chunks"]
    assert trainer.sampler.hyper_batch_size == options["hyper-batch-size"]
    assert trainer.steps.hyper_samples == (options["hyper-samples"] if options["augment"] == "affine" else None)
    assert trainer.config.finetune_steps == int(options["steps"] * 0.4)  # the default --finetune-fraction
    runtime = trainer.config.runtime
    assert (runtime.fused, runtime.every_partition) == (options["fused"], options["every-partition"])
    assert trainer.pmodel.num_partitions == options["partitions"] and min(trainer.chunks.sizes) >= 1
    assert all(math.isfinite(g["weight_decay"]) for g in trainer.optimizer.param_groups)


# --- fit ----------------------------------------------------------------------------------------------


def _tiny() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    pmodel = partitionify(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), 3, (0.5, 0.25, 0.25), seed=1)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    return pmodel, (x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long())


class _File:
    """Stands for the path of an existing file (made in each example's directory)."""

    def __repr__(self) -> str:
        return "<an existing file>"


class _NoStep:
    pass


WRONG_TYPES = st.one_of(st.text(max_size=4), st.floats(), st.lists(st.integers(), max_size=2), st.just(object()))
NOT_POSITIVE_INT = st.one_of(st.integers(max_value=0), st.booleans(), WRONG_TYPES)
NOT_NON_NEGATIVE_INT = st.one_of(st.integers(max_value=-1), st.booleans(), WRONG_TYPES)
NOT_BOOL = st.one_of(st.integers(), st.text(max_size=5), st.floats(), st.just([True]))
LR = st.floats(min_value=1e-3, max_value=1.0)
# fmt: off
BAD_HYPER_FACTORIES = st.one_of(
    st.integers(), st.text(max_size=5), st.just([1]),  # not callable
    LR.map(lambda lr: partial(torch.optim.Adam, lr=-lr)),  # refused by torch
    st.sampled_from([partial(torch.optim.Adam, lr=math.nan), partial(torch.optim.Adam, lr=1e-3, lrr=1)]),
    st.sampled_from([partial(torch.optim.Adam, lr=math.inf), partial(torch.optim.SGD, lr=0.1, weight_decay=math.inf)]),
    st.just(lambda params: 3),  # does not return an optimiser
)
# fmt: on
BAD_FACTORIES = BAD_HYPER_FACTORIES | st.just(partial(torch.optim.AdamW, lr=1e-3, weight_decay=1.7e308))  # x2: inf
# fmt: off
CHUNKS = st.one_of(
    st.text(max_size=4), st.just({}), st.integers(),
    st.lists(st.floats(1.0, 3.0), min_size=64, max_size=64),  # not integers
    st.lists(st.integers(1, 3), min_size=1, max_size=63) | st.lists(st.integers(1, 3), min_size=65, max_size=80),
    st.lists(st.integers(1, 3), min_size=64, max_size=64).map(lambda ids: [*ids[:-1], 0]),  # id 0
    st.lists(st.integers(1, 3), min_size=64, max_size=64).map(lambda ids: [*ids[:-1], 4]),  # id > C
    st.lists(st.integers(1, 2), min_size=64, max_size=64),  # chunk 3 empty
    st.just(torch.ones(64, 2, dtype=torch.long)),
)
FIT_BAD: list[tuple[str, str, st.SearchStrategy[Any]]] = [
    *[(name, "type errors / out-of-range numbers", NOT_POSITIVE_INT | st.none()) for name in
      ("steps", "batch_size", "hyper_every", "eval_batch_size")],
    *[(name, "type errors / out-of-range numbers", NOT_POSITIVE_INT) for name in
      ("hyper_batch_size", "eval_every", "eval_examples_per_chunk", "patience")],
    ("warmup_steps", "type errors / out-of-range numbers", NOT_NON_NEGATIVE_INT | st.none()),
    # None is TrainConfig's default for finetune_steps (finetune_fraction of the steps), as the command's
    ("finetune_steps", "type errors / out-of-range numbers", NOT_NON_NEGATIVE_INT | st.integers(4, 10**6)),
    ("finetune_fraction", "type errors / out-of-range numbers", NOT_FRACTION | st.booleans() | st.text(max_size=3)),
    ("hyper_samples", "type errors / out-of-range numbers", NOT_POSITIVE_INT),
    ("hyper_chunks", "unknown choices", _not("one", "all") | NOT_BOOL | st.none()),
    ("hyper_scheduler", "bad factories", st.one_of(st.integers(), st.text(max_size=3), st.just(lambda o: _NoStep()))),
    ("hooks", "type errors", st.one_of(st.none(), st.integers(), st.just(print), st.lists(st.integers(), min_size=1))),
    ("seed", "type errors / out-of-range numbers", NOT_NON_NEGATIVE_INT | st.none() | st.integers(min_value=2**63)),
    *[(name, "type errors", NOT_BOOL | st.none()) for name in
      ("restore_best", "recalibrate_norms", "fused", "every_partition")],
    ("progress", "type errors", NOT_BOOL),
    ("callbacks", "type errors", st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just(print),
                                           st.lists(st.integers(), min_size=1, max_size=2))),
    ("on_nonfinite", "unknown choices", _not("raise", "skip") | NOT_BOOL | st.none()),
    ("weight_decay_scaling", "unknown choices", _not("reciprocal", "sqrt", "none") | NOT_BOOL | st.none()),
    ("likelihood", "unknown choices", _not("classification", "regression") | st.integers() | st.none()),
    ("hyper", "type errors",
     st.one_of(st.integers(), st.text(max_size=3), st.just(InputMask), st.just([InputMask(6)]))),
    ("optimizer", "bad factories", BAD_FACTORIES),
    ("hyper_optimizer", "bad factories", BAD_HYPER_FACTORIES),
    ("scheduler", "bad factories", st.one_of(st.integers(), st.text(max_size=3), st.just(lambda opt: _NoStep()))),
    ("chunks", "malformed lists", CHUNKS),
    ("checkpoint_dir", "bad paths", st.one_of(st.integers(), st.just(""), st.just(_File()), st.just([1]))),
    ("resume", "bad paths", st.one_of(st.integers(), st.just(""), st.just(_File()), st.just("{tmp}/missing"))),
    ("device", "unknown choices", st.one_of(
        _not("cpu").filter(lambda s: not s.startswith("cpu:")), st.just("meta"), st.just("cuda:99"),
        st.booleans(), st.floats(), st.integers(max_value=-1), st.just([0]),
        *([] if CUDA else [st.just("cuda"), st.just(0)]))),
]
# fmt: on
NAMED = {"chunks": "chunk", "resume": "resume"}


def check_fit_refuses(name: str, value: Any) -> None:
    pmodel, data = _tiny()
    before = {k: v.clone() for k, v in pmodel.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "afile").write_text("x")
        if isinstance(value, _File):
            value = str(root / "afile")
        elif isinstance(value, str):
            value = value.replace("{tmp}", tmp)
        kwargs = dict(hyper=InputMask(6), steps=4, batch_size=8, eval_every=2, progress=False)
        kwargs["checkpoint_dir"] = root / "checkpoints"
        kwargs[name] = value
        with pytest.raises(PartitionError) as info:
            fit(pmodel, data, PAPER, **kwargs)
        assert sorted(p.name for p in root.iterdir()) == ["afile"], "fit wrote before refusing"
    message = str(info.value)
    assert NAMED.get(name, name) in message, f"{name}={value!r}: {message!r} does not name the argument"
    after = pmodel.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(FIT_BAD), data=st.data())
def test_bad_fit_argument_is_a_partition_error_naming_it_before_anything_happens(case, data):
    name, _, values = case
    check_fit_refuses(name, data.draw(values, label=name))


@pytest.mark.parametrize("case", FIT_BAD, ids=lambda case: f"{case[0]}")
def test_each_bad_fit_case_is_refused_once(case):
    name, _, values = case
    check_fit_refuses(name, _first_example(values))


def test_ordinary_fit_arguments_pass_the_checks(tmp_path):
    """The checks leave ordinary use alone: SGD with weight decay, a scheduler, client-id chunks, a new
    checkpoint directory, device 'cpu', the largest seed, a callback."""
    pmodel, data = _tiny()
    started: dict[str, Any] = {}

    def record(trainer: PartitionedTrainer, **kwargs: Any) -> None:
        started.update(trainer=trainer)
        raise WorkStarted

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PartitionedTrainer, "run", record)
        with pytest.raises(WorkStarted):
            fit(
                pmodel, data, PAPER, hyper=InputMask(6), steps=10,
                optimizer=partial(torch.optim.SGD, lr=0.1, weight_decay=1e-4),
                scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10), chunks=[1, 2, 3, 1] * 16,
                checkpoint_dir=tmp_path / "new", device="cpu", seed=2**63 - 1, callbacks=[lambda t, r: None],
                restore_best=True, progress=False, fused=False,
            )  # fmt: skip
    assert started["trainer"].config.optimization.steps == 10 and started["trainer"].chunks.sizes == [32, 16, 16]
    assert not (tmp_path / "new").exists()


def test_a_device_index_beyond_int64_is_a_partition_error() -> None:
    """Found by the fuzzer above: torch.device raises ValueError (not RuntimeError) for such an index."""
    from partition_fx._validation import check_device

    with pytest.raises(PartitionError, match="is not a torch device"):
        check_device(-(2**63) - 1)
