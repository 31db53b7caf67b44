"""Resume directories: everything a :class:`~partition_fx.training.PartitionedTrainer` needs to continue a run
bit for bit (its ``state_dict()``), in two files:

* ``tensors.safetensors``: the model, input transform and likelihood (``model/``, ``hyper/``, ``likelihood/``),
  the optimisers' tensor state (``optimizer/<param index>/<key>``, ``hyper_optimizer/...``), the state of the
  best evaluation so far (``best/...``) and every random generator (``rng/torch``, ``rng/cuda/<i>``,
  ``rng/sampler``, ``rng/lml``);
* ``state.json``: the step, the LML history, the best step, the optimisers' param groups and non-tensor
  state, the LR scheduler's state, and a fingerprint of the configuration.

Nothing is unpickled. Both are written through ``partition_fx._io``: a crash mid-save leaves the previous
version loadable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

from .._io import existing_directory, replace_directory
from ..errors import PartitionCheckpointError, earlier_version
from .checkpoint import cpu_copy, with_prefix

TENSORS = "tensors.safetensors"
STATE = "state.json"
FORMAT = 3
"""3: partitioned tensors in flat storage (``partition_fx.flat``): the optimiser state is per group parameter.
2: the model's rebuilt buffers left out (checked by digest), and no best copy when best is the current state.
1: everything stored. Formats 1 and 2 hold one optimiser state per tensor and partition: refused, as are their
checkpoint files (partitions per tensor). A format-3 state lacking a field of :data:`STATE_FIELDS` or of this
trainer's fingerprint is from an earlier development version of this format: refused, naming what it lacks."""

STATE_FIELDS = (
    "step", "history", "best", "skipped_steps", "pending_losses", "pending_hyper_losses", "optimizer",
    "hyper_optimizer", "scheduler", "hyper_scheduler", "finetune_start", "grad_scaler", "fingerprint",
)  # fmt: skip
"""What a resume directory's ``state.json`` holds besides its ``format``."""


class Resumable(Protocol):
    """What a resume directory saves and restores (``PartitionedTrainer`` is one)."""

    def state_dict(self) -> dict[str, Any]: ...
    def fingerprint(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], *, source: str = ...) -> None: ...


def resume_directory(directory: str | Path) -> Path:
    """The directory to resume from: ``directory``, or the previous state a save set aside if it crashed
    between moving that aside and moving the new state in."""
    return existing_directory(directory)


def save_training_state(trainer: Resumable, directory: str | Path) -> None:
    """Write ``trainer.state_dict()`` to ``directory`` (replaced atomically; see the module docstring)."""
    state = trainer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for name, module_state in state["modules"].items():
        tensors.update((f"{name}/{key}", cpu_copy(value)) for key, value in module_state.items())
    best = state["best"]
    if best is not None and best["step"] == state["step"]:
        best = {**best, "same_as_current": True}  # the modules above are the best state: no second copy
    else:
        for name, module_state in (state["best_modules"] or {}).items():
            tensors.update((f"best/{name}/{key}", cpu_copy(value)) for key, value in module_state.items())
    rng = state["rng"]
    tensors["rng/torch"] = rng["torch"]
    tensors.update((f"rng/cuda/{i}", value) for i, value in enumerate(rng["cuda"]))
    tensors["rng/sampler"] = rng["sampler"]["generator"]
    tensors["rng/lml"] = rng["lml"]
    plain = {
        "format": FORMAT,
        "step": state["step"],
        "history": state["history"],
        "best": best,
        "skipped_steps": state["skipped_steps"],
        "pending_losses": state["pending_losses"],
        "pending_hyper_losses": state["pending_hyper_losses"],
        "optimizer": _split_optimizer(state["optimizer"], "optimizer", tensors),
        "hyper_optimizer": _split_optimizer(state["hyper_optimizer"], "hyper_optimizer", tensors),
        "scheduler": state["scheduler"],
        "hyper_scheduler": state["hyper_scheduler"],
        "finetune_start": state["finetune_start"],
        "grad_scaler": state["grad_scaler"],
        "fingerprint": state["fingerprint"],
    }
    try:
        text = json.dumps(plain, indent=1)
    except TypeError as e:
        raise PartitionCheckpointError(
            f"the training state cannot be written as JSON ({e}); an LR scheduler or optimiser holding "
            "functions (e.g. LambdaLR with a lambda) cannot be resumed: use a scheduler without callables"
        ) from e

    def fill(staging: Path) -> None:
        from safetensors.torch import save_file

        save_file(tensors, str(staging / TENSORS))
        (staging / STATE).write_text(text + "\n")

    replace_directory(directory, fill, suffix="new-", fsync=True)


def load_training_state(trainer: Resumable, directory: str | Path) -> dict[str, Any]:
    """Restore ``trainer`` from a directory written by :func:`save_training_state`; returns its state.json.

    Refuses, with :class:`PartitionCheckpointError` and before changing anything, a directory that is missing
    a file, a corrupted or truncated file, or a state from another configuration (the message names every
    field that differs).
    """
    from safetensors import SafetensorError, safe_open

    directory = resume_directory(directory)
    missing = [name for name in (TENSORS, STATE) if not (directory / name).is_file()]
    if missing:
        raise PartitionCheckpointError(
            f"{directory} is not a resume directory: {', '.join(missing)} missing (it is written at each "
            "evaluation under checkpoint_dir/resume when fit(..., checkpoint_dir=...) runs)"
        )
    try:
        plain = json.loads((directory / STATE).read_text())
        with safe_open(str(directory / TENSORS), framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as e:
        raise PartitionCheckpointError(f"{directory} is corrupted or truncated and was not loaded: {e}") from e
    if plain.get("format") in (1, 2):
        raise PartitionCheckpointError(
            f"{directory} was written before flat storage (format {plain['format']}): its optimiser state is per "
            "tensor, which this version does not map onto flat groups. Resume it with partition-fx 0.x before "
            "flat storage, or start a new run (its checkpoint files are refused too: their partitions are per tensor)"
        )
    if plain.get("format") != FORMAT:
        raise PartitionCheckpointError(f"{directory} has format {plain.get('format')!r}; this version reads {FORMAT}")
    missing = [key for key in STATE_FIELDS if key not in plain]
    missing += [f"fingerprint.{key}" for key in trainer.fingerprint() if key not in plain.get("fingerprint", {})]
    if isinstance(plain.get("best"), dict) and "score" not in plain["best"]:
        missing.append("best.score: its best state was chosen by the full LML, not the conditional one")
    if missing:
        raise PartitionCheckpointError(earlier_version(f"{directory}/{STATE}", ", ".join(missing)))
    modules = {name: with_prefix(tensors, f"{name}/") for name in ("model", "hyper", "likelihood")}
    modules = {name: state for name, state in modules.items() if state}
    cuda = with_prefix(tensors, "rng/cuda/")
    trainer.load_state_dict(
        {
            **{key: plain[key] for key in ("step", "history", "best", "skipped_steps")},
            "fingerprint": plain["fingerprint"],
            "pending_losses": plain["pending_losses"],
            "pending_hyper_losses": plain["pending_hyper_losses"],
            "modules": modules,
            "best_modules": _best_modules(plain["best"], modules, tensors),
            "optimizer": _join_optimizer(plain["optimizer"], "optimizer", tensors),
            "hyper_optimizer": _join_optimizer(plain["hyper_optimizer"], "hyper_optimizer", tensors),
            **{key: plain[key] for key in ("scheduler", "hyper_scheduler", "finetune_start")},
            "grad_scaler": plain["grad_scaler"],  # fp16 runs' loss scale
            "rng": {
                "torch": tensors["rng/torch"],
                "cuda": [cuda[str(i)] for i in range(len(cuda))],
                "sampler": {"generator": tensors["rng/sampler"]},
                "lml": tensors["rng/lml"],
            },
        },
        source=str(directory),
    )
    return plain


def _best_modules(
    best: dict[str, Any] | None, modules: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> dict[str, Any] | None:
    """The best evaluation's module states: stored under ``best/``, or the current ones (no copy is stored when
    the best evaluation is the last one)."""
    if best is None:
        return None
    if best.get("same_as_current"):
        return {name: {k: v.clone() for k, v in state.items()} for name, state in modules.items()}
    return {name: with_prefix(tensors, f"best/{name}/") for name in modules}


def _split_optimizer(state: dict[str, Any] | None, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """An optimiser's ``state_dict()`` as JSON, its tensors moved into ``tensors`` under ``prefix/<index>/``."""
    if state is None:
        return None
    plain: dict[str, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}/{index}/{key}"] = cpu_copy(value)
            else:
                plain.setdefault(str(index), {})[key] = value
    return {"param_groups": state["param_groups"], "plain_state": plain}


def _join_optimizer(saved: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any] | None:
    """The inverse of :func:`_split_optimizer`: an optimiser ``state_dict()``."""
    if saved is None:
        return None
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith(prefix + "/"):
            index, name = key[len(prefix) + 1 :].split("/", 1)
            state.setdefault(int(index), {})[name] = value
    for index, entries in saved["plain_state"].items():
        state.setdefault(int(index), {}).update(entries)
    return {"state": state, "param_groups": saved["param_groups"]}
