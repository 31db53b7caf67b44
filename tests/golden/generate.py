"""Golden outputs: small fixed-seed jobs of the training layer (``fit``) and of the command line (``partition-fx
train``, ``export``, ``convert``), run on the CPU with one thread, and what they produce as plain data.

``python -m tests.golden.generate`` (from the repository root) runs every job (or ``--jobs NAME ...``) and writes:

* ``data/environment.json``: what the outputs were computed with. Floating-point results are bit-exact for one
  build of torch on one kind of CPU only, so ``tests/test_golden.py`` skips where these differ;
* ``data/<job>/record.json``: the job's plain record (``FitResult.to_dict()``, the commands' exit statuses,
  stdout, reports and every JSON file written, ONNX metadata and initializer digests, directory listings), with
  the wall-clock and version fields (:data:`STRIPPED_KEYS`) dropped and the job's temporary directory replaced
  by ``<tmp>``;
* ``data/<job>/files/...``: every ``.safetensors`` file the job wrote, copied as written (checkpoints, ``resume/``,
  exported models);
* ``data/<job>/tensors.safetensors``: the tensors the job returns in memory (the trained model's and the input
  transform's state dicts);
* ``data/<job>/inputs/...``: what a job reads (the resume jobs' ``resume/`` directory, written by a run stopped
  early).

It then runs every job again and compares with what it wrote (``--no-check`` skips this): the outputs are
deterministic, and each stored ``resume/`` directory resumes to its stored uninterrupted run.

The test calls :func:`run_job` and :func:`first_difference`, the functions the generator itself uses.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded (as in the tests' conftest)

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

# --- the package's names: the one place to update when one moves --------------------------------------------
from partition_fx import fit, partitionify
from partition_fx.cli import main as cli_main
from partition_fx.datasets import image_folder
from partition_fx.training import TrainConfig
from partition_fx.transforms import AffineAugmentation, ConcreteDropout, InputMask

# ---------------------------------------------------------------------------------------------------------------

GENERATED_AT = "e0df00f"
"""The commit whose code wrote ``data/``."""
DATA = Path(__file__).resolve().parent / "data"
TMP = "<tmp>"
"""What the job's temporary directory becomes in records."""
STRIPPED_KEYS = frozenset({"seconds", "conversion_seconds", "torch", "version"})
"""Keys dropped from every record, at any depth: wall-clock durations (``FitResult.seconds``, each evaluation's
``seconds`` in histories, ``report.json``'s ``seconds`` and ``conversion_seconds``), the torch version
(``report.json``'s ``torch``; ``environment.json`` holds it) and the package's (``version`` of reports and
``export.json``)."""
ENVIRONMENT_KEYS = ("torch", "cpu_capability", "numpy", "onnx", "pillow", "matplotlib", "safetensors")
"""What must be the same for the outputs to be bit for bit the same (the test skips where one differs)."""


@dataclass
class Capture:
    """What one job produced: a plain record, the ``.safetensors`` files it wrote (by their name under the job's
    directory) and the tensors it returned in memory."""

    record: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """``run(work, inputs)``: the job, in the empty directory ``work``, reading the job's stored ``inputs``
    directory. ``prepare(work, inputs)``: when generating, writes ``inputs`` and returns the expected capture
    (default: ``run``'s)."""

    run: Callable[[Path, Path], Capture]
    prepare: Callable[[Path, Path], Capture] | None = None


# --- running a job --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread (the results of a reduction depend on how many share it), restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_job(name: str, work: Path, *, generating: bool = False) -> Capture:
    """Job ``name`` in the empty directory ``work`` (today's code), on one thread; ``generating``: write its
    inputs into ``data/<name>/inputs`` first and return the expected outputs."""
    job = JOBS[name]
    work = Path(work).resolve()
    inputs = DATA / name / "inputs"
    with one_thread():
        if generating and job.prepare is not None:
            shutil.rmtree(inputs, ignore_errors=True)
            inputs.mkdir(parents=True)
            return job.prepare(work, inputs)
        return job.run(work, inputs)


def plain(value: Any, work: Path) -> Any:
    """``value`` as JSON would hold it, without :data:`STRIPPED_KEYS`, the directory ``work`` written ``<tmp>``."""
    if isinstance(value, dict):
        return {str(k): plain(v, work) for k, v in value.items() if k not in STRIPPED_KEYS}
    if isinstance(value, list | tuple):
        return [plain(v, work) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return value.replace(str(work), TMP)
    if value is None or isinstance(value, bool | int | float):
        return value
    raise TypeError(f"cannot record a {type(value).__name__}: {value!r}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _onnx_summary(path: Path) -> dict[str, Any]:
    """An ONNX file's metadata, inputs and outputs, each initializer's dtype, dims and digest, and a digest of
    the graph's nodes (the file itself is large and holds the same weights as model.safetensors)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    nodes = "\n".join(f"{n.op_type}({','.join(n.input)})->{','.join(n.output)}" for n in model.graph.node)
    initializers = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        initializers[init.name] = {
            "dtype": str(array.dtype),
            "dims": list(init.dims),
            "sha256": _sha256(np.ascontiguousarray(array).tobytes()),
        }
    return {
        "metadata": {p.key: p.value for p in model.metadata_props},
        "opsets": {o.domain: o.version for o in model.opset_import},
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "initializers": initializers,
        "nodes": len(model.graph.node),
        "nodes_sha256": _sha256(nodes.encode()),
    }


def capture_outputs(capture: Capture, work: Path, directory: Path) -> None:
    """Everything under ``directory`` into ``capture``: ``.safetensors`` files as files, JSON files (cleaned),
    ONNX summaries, text, other files' digests, the listing and which files are hard links of one another."""
    record = capture.record
    base = directory.relative_to(work).as_posix()
    entries = sorted(directory.rglob("*"))
    record.setdefault("listing", {})[base] = [p.relative_to(directory).as_posix() for p in entries]
    inodes: dict[tuple[int, int], list[str]] = {}
    for path in entries:
        if not path.is_file():
            continue
        name = path.relative_to(work).as_posix()
        stat = path.stat()
        inodes.setdefault((stat.st_dev, stat.st_ino), []).append(name)
        if path.suffix == ".safetensors":
            capture.files[name] = path
        elif path.suffix == ".json":
            record.setdefault("json", {})[name] = plain(json.loads(path.read_text()), work)
        elif path.suffix == ".onnx":
            record.setdefault("onnx", {})[name] = plain(_onnx_summary(path), work)
        elif path.suffix == ".txt":
            record.setdefault("text", {})[name] = plain(path.read_text(), work)
        else:  # the plots (.png)
            record.setdefault("sha256", {})[name] = _sha256(path.read_bytes())
    linked = sorted(names for names in inodes.values() if len(names) > 1)
    if linked:
        record.setdefault("hard_links", []).extend(linked)


def _state(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{prefix}/{k}": v.detach().clone().contiguous() for k, v in module.state_dict().items()}


# --- the fit jobs --------------------------------------------------------------------------------------------

CONFIG = TrainConfig.recommended(
    steps=8,
    batch_size=8,
    hyper_batch_size=4,
    hyper_samples=2,
    eval_every=2,
    eval_examples_per_chunk=6,  # subsampled: the LML's generator matters
    finetune_steps=0,
    seed=5,
)
"""The base of the fit jobs: alternating steps, every chunk scored, no fine-tuning, fp32; each job changes one
axis (or two)."""


def _images(n: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _cnn(channels: int = 1, dropout: bool = False) -> Any:
    """Conv (stride 2), BatchNorm, ReLU, (ConcreteDropout,) Linear on ``channels`` x 8 x 8 images into 3
    classes, in 3 partitions (a few hundred weights: the stored checkpoints stay small)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv2d(channels, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU()]
    layers.append(nn.Flatten())
    if dropout:
        layers.append(ConcreteDropout(0.2))
    layers.append(nn.Linear(4 * 4 * 4, 3))
    return partitionify(nn.Sequential(*layers), 3, (0.5, 0.3, 0.2), seed=0)


def _fit_capture(work: Path, pmodel: Any, data: Any, config: Any, hyper: nn.Module | None, **keywords: Any) -> Capture:
    """``fit`` with ``checkpoint_dir=work/checkpoint``: its result, what it wrote there, and the returned state."""
    checkpoint = work / "checkpoint"
    result = fit(pmodel, data, config, hyper=hyper, checkpoint_dir=checkpoint, progress=False, **keywords)
    capture = Capture(record={"fit_result": plain(result.to_dict(), work)})
    capture_outputs(capture, work, checkpoint)
    capture.tensors.update(_state("model", pmodel))
    if hyper is not None:
        capture.tensors.update(_state("hyper", hyper))
    return capture


def _fit_job(model: Callable[[], Any] = _cnn, hyper: Callable[[], Any] | None = None, **changes: Any):
    """A job fitting ``model()`` on 60 random 1x8x8 images with :data:`CONFIG` changed by ``changes``."""

    def run(work: Path, inputs: Path) -> Capture:
        transform = AffineAugmentation(num_samples=2) if hyper is None else hyper()
        return _fit_capture(work, model(), _images(), CONFIG.replace(**changes), transform)

    return Job(run)


def write_image_folder(root: Path, per_class: int = 8, size: int = 8, classes: int = 3) -> None:
    """``root/c<k>/<i>.png``: ``per_class`` noise RGB images per class, the same bytes every time."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")


def _folder_job(workers: int) -> Job:
    """The base run on an image folder of PNGs read from disk as training asks, by ``workers`` processes."""

    def run(work: Path, inputs: Path) -> Capture:
        write_image_folder(work / "images")
        data = image_folder(work / "images", in_memory=False, seed=1)
        capture = _fit_capture(
            work, _cnn(channels=3), data.train, CONFIG.replace(workers=workers), AffineAugmentation(num_samples=2)
        )
        capture.record["data"] = plain({"train": len(data.train), "test": len(data.test), **data.info}, work)
        return capture

    return Job(run)


def _regression_data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, 6, generator=g)
    return x, 2 * x[:, :1] - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g)


def _regression(work: Path, inputs: Path) -> Capture:
    """A Gaussian likelihood (its noise scale learned) and an input mask, on an MLP."""
    torch.manual_seed(0)
    pmodel = partitionify(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)), 3, (0.5, 0.3, 0.2), seed=0)
    config = CONFIG.replace(hyper_samples=None, finetune_steps=2)
    return _fit_capture(work, pmodel, _regression_data(), config, InputMask(6), likelihood="regression")


PAPER_SGD = TrainConfig.paper(
    steps=6,
    batch_size=8,
    weight_optimizer="sgd",
    lr=0.05,
    momentum=0.9,
    weight_decay=1e-3,
    weight_decay_scaling="sqrt",
    hyper_lr=0.01,
    warmup_steps=2,
    eval_every=2,
    eval_examples_per_chunk=6,
    seed=7,
)
"""The paper's step (one chunk every iteration, constant LR) with SGD, scaled weight decay and a warm-up."""


# --- the resume jobs -----------------------------------------------------------------------------------------

RESUME_CONFIG = CONFIG.replace(finetune_steps=3)
"""8 steps, evaluations at 2, 4, 6 and 8, fine-tuning from step 5."""


def _resume_job(stop_at: int) -> Job:
    """A run stopped by a callback after its evaluation at ``stop_at`` (``resume/`` written there), resumed by
    today's code from the stored ``resume/``: it must equal the stored uninterrupted run, and its callbacks must
    see the evaluations after ``stop_at`` alone (a run that trained from the start again would equal it too)."""

    def fit_it(work: Path, **keywords: Any) -> tuple[Capture, list[int]]:
        seen: list[int] = []
        see = lambda trainer, record: seen.append(record["step"])  # noqa: E731
        callbacks = [see, *keywords.pop("callbacks", [])]
        capture = _fit_capture(
            work, _cnn(dropout=True), _images(), RESUME_CONFIG, AffineAugmentation(num_samples=2),
            callbacks=callbacks, **keywords,
        )  # fmt: skip
        return capture, seen

    def prepare(work: Path, inputs: Path) -> Capture:
        stopped = work / "stopped"
        stop = lambda trainer, record: record["step"] == stop_at  # noqa: E731
        fit_it(stopped, callbacks=[stop])
        state = json.loads((stopped / "checkpoint" / "resume" / "state.json").read_text())
        assert state["step"] == stop_at, f"the stopped run saved step {state['step']}, not {stop_at}"
        shutil.copytree(stopped / "checkpoint" / "resume", inputs / "resume")
        capture, seen = fit_it(work / "run")  # the uninterrupted run
        capture.record["evaluations_seen_by_callbacks"] = [step for step in seen if step > stop_at]
        return capture

    def run(work: Path, inputs: Path) -> Capture:
        resume = shutil.copytree(inputs / "resume", work / "stored_resume")  # the stored files are never written
        capture, seen = fit_it(work / "run", resume=resume)
        capture.record["evaluations_seen_by_callbacks"] = seen
        return capture

    return Job(run, prepare)


# --- the command-line jobs -----------------------------------------------------------------------------------

CLI_TRAIN = ["--model", "fixup_resnet8", "--image-size", "8", "--steps", "4", "--batch-size", "8", "--lr", "0.01"]
CLI_TRAIN += ["--samples", "2"]
CLI_TRAIN += ["--hyper-samples", "2", "--hyper-batch-size", "4", "--eval-every", "2", "--eval-examples-per-chunk", "16"]
CLI_TRAIN += ["--test-time-samples", "2", "--device", "cpu", "--quiet"]
"""A tiny ``partition-fx train`` on the bundled rotdigits at 8x8: 3 partitioned steps, then one fine-tuning."""


def _command(capture: Capture, work: Path, name: str, argv: list[str]) -> None:
    """``partition-fx ARGV`` into ``capture``: its exit status and stdout (durations written ``<seconds>``)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(argv)
    stdout = re.sub(r"\bin \d+(\.\d+)?s\b", "in <seconds>s", out.getvalue())
    command = {"argv": argv, "exit_status": status, "stdout": stdout}
    capture.record.setdefault("commands", {})[name] = plain(command, work)


def _train_and_export(work: Path, inputs: Path) -> Capture:
    """``partition-fx train``, then ``export --run`` of its best state's subnetwork 2, averaged in ONNX."""
    capture = Capture()
    run, export = work / "train", work / "export"
    _command(capture, work, "train", ["train", *CLI_TRAIN, "--out", str(run)])
    capture_outputs(capture, work, run)
    argv = ["export", "--run", str(run), "--which", "best", "--subnetwork", "2", "--test-time-samples", "2"]
    _command(capture, work, "export", [*argv, "--out", str(export)])
    capture_outputs(capture, work, export)
    return capture


def _convert(work: Path, inputs: Path) -> Capture:
    """``partition-fx convert`` of fixup_resnet8 into 2 partitions by whole units."""
    capture = Capture()
    out = work / "convert"
    argv = ["convert", "--model", "fixup_resnet8", "--partitions", "2", "--proportions", "0.7,0.3"]
    _command(capture, work, "convert", [*argv, "--scheme", "node", "--seed", "3", "--out", str(out)])
    capture_outputs(capture, work, out)
    return capture


# --- the jobs ----------------------------------------------------------------------------------------------------

JOBS: dict[str, Job] = {
    "fit_alternating": _fit_job(),
    "fit_every_partition": _fit_job(every_partition=True),
    "fit_fused": _fit_job(fused=True),
    "fit_fused_every_partition": _fit_job(fused=True, every_partition=True),
    "fit_hyper_chunks_one": _fit_job(hyper_chunks="one"),
    "fit_finetune": _fit_job(finetune_steps=3),
    "fit_patience_restore_best": _fit_job(
        steps=16, eval_every=1, patience=2, restore_best=True, finetune_steps=4, finetune_schedule="restart"
    ),
    "fit_bf16": _fit_job(precision="bf16"),
    "fit_folder_workers0": _folder_job(0),
    "fit_folder_workers2": _folder_job(2),
    "fit_paper_sgd_dropout": Job(
        lambda work, inputs: _fit_capture(
            work, _cnn(dropout=True), _images(), PAPER_SGD, AffineAugmentation(num_samples=2)
        )
    ),
    "fit_regression": Job(_regression),
    "resume_partitioned": _resume_job(4),
    "resume_finetuning": _resume_job(6),
    "cli_train_export": Job(_train_and_export),
    "cli_convert": Job(_convert),
}


# --- storing and comparing -------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import matplotlib
    import onnx
    import PIL
    import safetensors

    return {
        "generated_at": GENERATED_AT,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "pillow": PIL.__version__,
        "matplotlib": matplotlib.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }


def environment_difference() -> str | None:
    """Why this machine cannot reproduce ``data/`` bit for bit (another torch, CPU kind, ...), or None."""
    stored = json.loads((DATA / "environment.json").read_text())
    now = environment()
    changed = [f"{key} {stored.get(key)} -> {now[key]}" for key in ENVIRONMENT_KEYS if stored.get(key) != now[key]]
    return "; ".join(changed) or None


def write_job(name: str, capture: Capture) -> None:
    """``capture`` into ``data/<name>/`` (its ``inputs/`` kept)."""
    folder = DATA / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.name != "inputs":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    record = json.loads(json.dumps(capture.record))  # tuples as lists, as it will be read
    (folder / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    for relative, path in capture.files.items():
        target = folder / "files" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    if capture.tensors:
        save_file(capture.tensors, str(folder / "tensors.safetensors"))


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, torch.Tensor) else repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _same_scalar(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def json_difference(expected: Any, actual: Any, where: str) -> str | None:
    """The first place ``actual`` differs from ``expected`` (plain JSON values), or None."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in [*expected, *(k for k in actual if k not in expected)]:
            if key not in actual:
                return f"{where}.{key}: missing (expected {_short(expected[key])})"
            if key not in expected:
                return f"{where}.{key}: not expected (got {_short(actual[key])})"
            found = json_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        if list(expected) != list(actual):  # the same items: a file written in another order still differs
            return f"{where}: keys in another order: got {list(actual)}, expected {list(expected)}"
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for i, (a, b) in enumerate(zip(expected, actual)):
            found = json_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        if len(expected) != len(actual):
            return f"{where}: {len(actual)} items, expected {len(expected)}"
        return None
    if _same_scalar(expected, actual):
        return None
    return f"{where}: got {_short(actual)}, expected {_short(expected)}"


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.equal(a, b):
        return True
    if not a.is_floating_point() or a.shape != b.shape:
        return False
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])  # NaN where expected counts as equal


def tensors_difference(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], where: str) -> str | None:
    """The first tensor of ``actual`` that is missing, extra, or not ``expected``'s (dtype, shape, every value)."""
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    if missing or extra:
        return f"{where}: tensors missing {missing[:5]}, not expected {extra[:5]}"
    for key in expected:  # in the stored order
        a, b = expected[key], actual[key]
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}[{key}]: got {b.dtype} {list(b.shape)}, expected {a.dtype} {list(a.shape)}"
        if not _same_tensor(a, b):
            differs = (a != b) if not a.is_floating_point() else ~((a == b) | (a.isnan() & b.isnan()))
            first = tuple(int(i) for i in differs.nonzero()[0]) if a.dim() else ()
            largest = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
            return (
                f"{where}[{key}]: {int(differs.sum())} of {a.numel()} values differ; at {list(first)} got "
                f"{b[first].item()!r}, expected {a[first].item()!r} (largest difference {largest:.3g})"
            )
    return None


def _metadata(path: Path) -> dict[str, Any]:
    """A safetensors file's metadata, each value parsed where it is JSON."""
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata() or {}
    parsed = {}
    for key, value in metadata.items():
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


def first_difference(name: str, capture: Capture) -> str | None:
    """The first place job ``name``'s ``capture`` differs from ``data/<name>/``: the record, the set of files
    written, each file's metadata and tensors, the returned tensors. None: the same, bit for bit."""
    folder = DATA / name
    expected = json.loads((folder / "record.json").read_text())
    found = json_difference(expected, json.loads(json.dumps(capture.record)), "record")
    if found:
        return found
    stored = sorted(p.relative_to(folder / "files").as_posix() for p in (folder / "files").rglob("*.safetensors"))
    if stored != sorted(capture.files):
        return f"files written: {sorted(capture.files)}, expected {stored}"
    for relative in stored:
        path, written = folder / "files" / relative, capture.files[relative]
        found = json_difference(_metadata(path), _metadata(written), f"{relative} metadata")
        found = found or tensors_difference(load_file(str(path)), load_file(str(written)), relative)
        if found:
            return found
    saved = folder / "tensors.safetensors"
    return tensors_difference(load_file(str(saved)) if saved.exists() else {}, capture.tensors, "returned state")


def data_size() -> int:
    return sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS), metavar="NAME")
    parser.add_argument("--no-check", action="store_true", help="do not run the jobs again to compare")
    args = parser.parse_args(argv)
    DATA.mkdir(exist_ok=True)
    (DATA / "environment.json").write_text(json.dumps(environment(), indent=1) + "\n")
    for name in args.jobs:
        with tempfile.TemporaryDirectory() as work:
            write_job(name, run_job(name, Path(work), generating=True))
        print(f"wrote {name}", flush=True)
    failed = []
    if not args.no_check:
        for name in args.jobs:
            with tempfile.TemporaryDirectory() as work:
                found = first_difference(name, run_job(name, Path(work)))
            print(f"checked {name}: {found or 'the same'}", flush=True)
            if found:
                failed.append(name)
    print(f"data/: {data_size() / 1e6:.2f} MB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
