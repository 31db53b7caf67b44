"""What every benchmark and research diagnostic shares: the results header, the one results format, Markdown tables,
mean ± sd, and the files they write.

A results file is one JSON object::

    {
      "meta":   {"benchmark", "date", "machine", "device", "torch", "commit", "quick", ...},
      "config": {...},   # what was run: budgets, sizes, repeats (the script's own keys)
      "rows":   [...],   # one object per table row (or per run, where the table aggregates runs)
      "runs":    [...],  # optional: per-run records with histories/curves that the rows summarise
      "summary": {...}   # optional: scalar results that belong to no row (totals, verdicts)
    }

``meta`` says when (``date``, ISO 8601 UTC), where (``machine``: architecture, cores, threads, CPU;
``device``: ``cpu`` or the GPU's name) and with what (``torch``, the git ``commit``, ``-dirty`` when the
working tree had changes) the numbers were measured; results from before this format have
``machine``/``commit`` null where they were not recorded. Files are written whole or not at all
(:func:`write_text`, through :func:`write_results` and :func:`write_json`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
EXTRA_KEYS = ("runs", "summary")  # the only top-level keys besides meta, config and rows


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed onto it: an interrupted benchmark
    leaves the earlier file (hours of runs, or a generated page) as it was, never half of a new one. Its folder is
    made if need be.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_text(folder / "new" / "a.md", "# a"); (folder / "new" / "a.md").read_text()
    '# a'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # created with the user's umask, as path would be
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """``payload`` as indented JSON, written whole (:func:`write_text`)."""
    write_text(path, json.dumps(payload, indent=2) + "\n")


def git_commit() -> str | None:
    """The checked-out commit, with ``-dirty`` if tracked files differ from it; None outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def header(benchmark: str, *, quick: bool = False, device: str = "cpu", machine: str | None = None) -> dict[str, Any]:
    """The ``meta`` of a results file, measured now: when, where and with what."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
    if machine is None:
        cpu = platform.processor() or "cpu"
        machine = f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, {cpu}"
    return {
        "benchmark": benchmark,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "device": device,
        "torch": torch.__version__,
        "commit": git_commit(),
        "quick": quick,
    }


def results(meta: dict[str, Any], config: dict[str, Any], rows: list[Any], **extra: Any) -> dict[str, Any]:
    """A results object in the one format; ``extra`` only under the documented names (:data:`EXTRA_KEYS`)."""
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise ValueError(f"results: unknown top-level keys {unknown}; use {list(EXTRA_KEYS)} or put them in config")
    return {"meta": meta, "config": config, "rows": rows, **extra}


def write_results(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a :func:`results` object atomically and say where."""
    write_json(path, payload)
    print(f"wrote {path}")


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    payload = json.loads(Path(path).read_text())
    missing = {"meta", "config", "rows"} - set(payload)
    if missing:
        raise ValueError(f"{path}: not a benchmark results file (missing {sorted(missing)})")
    return payload


def provenance(meta: dict[str, Any]) -> str:
    """The line that heads a results table: what was run, where and when."""
    when = " to ".join(meta["runs_written"]) if meta.get("runs_written") else meta["date"]
    torch = f"torch {meta['torch']}"
    where = f"{meta['machine']} ({meta['device']}, {torch})" if meta.get("machine") else f"{meta['device']}, {torch}"
    commit = meta.get("commit")
    return f"Measured {when} on {where}, commit {commit[:12] if commit else 'not recorded'}."


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: a header row, the separator, then one line per row (cells as given, str()-ed)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def summary(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean; 0 for one value). The mean is ``statistics.fmean``'s, in floats
    (:func:`summary`'s ``statistics.mean`` is exact, and can differ in the last bit).

    >>> mean_se([1.0, 3.0]), mean_se([2.0])
    ((2.0, 1.0), (2.0, 0.0))
    """
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd / len(values) ** 0.5


def mean_sd(values: Sequence[float], fmt: str) -> str:
    """'mean ± sd' for a table (just the value for one)."""
    mean, sd = summary(values)
    return format(mean, fmt) + (f" ± {format(sd, fmt)}" if len(values) > 1 else "")


def paper_scheme(samples: int = 4, batch_size: int = 64) -> list[str]:
    """`partition-fx train` options for the paper's iteration (appendix I.1) instead of the command's defaults:
    one drawn chunk per hyperparameter step, every iteration, on a batch and samples like the parameter step's,
    and no fine-tuning.

    >>> paper_scheme()[:4]
    ['--hyper-chunks', 'one', '--hyper-every', '1']
    """
    return [
        "--hyper-chunks", "one", "--hyper-every", "1", "--hyper-samples", str(samples),
        "--hyper-batch-size", str(batch_size), "--finetune-steps", "0",
    ]  # fmt: skip
