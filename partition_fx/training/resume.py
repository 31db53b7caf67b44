"""Resumable training state: everything ``PartitionedTrainer`` needs to continue a run bit for bit.

A resume directory holds two files:

* ``tensors.safetensors``: the model, input transform and likelihood (``model/``, ``hyper/``, ``likelihood/``),
  the optimisers' tensor state (``optimizer/<param index>/<key>``, ``hyper_optimizer/...``), the state of the
  best evaluation so far (``best/...``) and every random generator (``rng/torch``, ``rng/cuda/<i>``,
  ``rng/sampler``, ``rng/lml``);
* ``state.json``: the step, the LML history, the best step, the optimisers' param groups and non-tensor
  state, the LR scheduler's state, and a fingerprint of the configuration.

Nothing is unpickled. A save goes to a temporary sibling directory that then replaces the old one (the old
one is renamed aside first and removed last), so a crash mid-save leaves the previous state loadable: if
only the renamed-aside copy exists, :func:`load_training_state` reads that.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import PartitionCheckpointError

if TYPE_CHECKING:
    from .trainer import PartitionedTrainer

TENSORS = "tensors.safetensors"
STATE = "state.json"
FORMAT = 1


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU copy (what safetensors writes, independent of later training)."""
    return tensor.detach().to("cpu").contiguous().clone()


def fingerprint(trainer: PartitionedTrainer) -> dict[str, Any]:
    """What must match for a state to resume this trainer: the partitioning, the data chunks, the options
    that change the iteration, and the names and shapes of everything trained."""
    pmodel = trainer.pmodel
    return {
        **trainer.identity(),
        "default": pmodel.default,
        "chunk_sizes": trainer.chunks.sizes,
        "num_examples": len(trainer.examples),
        "batch_size": trainer.sampler.batch_size,
        "hyper_batch_size": trainer.sampler.hyper_batch_size,
        "hyper_every": trainer.hyper_every,
        "warmup_steps": trainer.warmup_steps,
        "fused": trainer.fused,
        "every_partition": trainer.every_partition,
        "parameters": {name: list(p.shape) for name, p in pmodel.named_parameters()},
        "hyperparameters": [list(p.shape) for p in trainer.hyperparameters_list],
    }


def _optimizer_state(optimizer: torch.optim.Optimizer | None, prefix: str, tensors: dict[str, torch.Tensor]):
    if optimizer is None:
        return None
    state = optimizer.state_dict()
    plain: dict[str, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}/{index}/{key}"] = cpu_copy(value)
            else:
                plain.setdefault(str(index), {})[key] = value
    return {"param_groups": state["param_groups"], "plain_state": plain}


def _load_optimizer(optimizer: torch.optim.Optimizer | None, saved: Any, prefix: str, tensors: dict) -> None:
    if optimizer is None:
        return
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith(prefix + "/"):
            index, name = key[len(prefix) + 1 :].split("/", 1)
            state.setdefault(int(index), {})[name] = value
    for index, entries in saved["plain_state"].items():
        state.setdefault(int(index), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


def _aside(directory: Path) -> Path:
    """Where a save moves the previous state while it swaps the new one in."""
    return directory.with_name(f".{directory.name}.old")


def resume_directory(directory: str | Path) -> Path:
    """The directory to resume from: ``directory``, or the previous state a save set aside if it crashed
    between moving that aside and moving the new state in."""
    directory = Path(directory)
    aside = _aside(directory)
    return aside if not directory.is_dir() and aside.is_dir() else directory


def save_training_state(trainer: PartitionedTrainer, directory: str | Path) -> None:
    """Write ``trainer``'s complete state to ``directory`` (replaced atomically; see the module docstring)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = trainer.module_tensors("/")
    if trainer.best is not None:
        for name, state in trainer.best[2].items():
            for key, value in state.items():
                tensors[f"best/{name}/{key}"] = cpu_copy(value)
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = state
    tensors["rng/sampler"] = trainer.sampler.generator.get_state()
    tensors["rng/lml"] = trainer._lml_generator.get_state()
    state = {
        "format": FORMAT,
        "step": trainer.step,
        "history": trainer.history,
        "best": None if trainer.best is None else {"lml": trainer.best[0], "step": trainer.best[1]},
        "skipped_steps": trainer.skipped_steps,
        "pending_losses": trainer._losses,
        "pending_hyper_losses": trainer._hyper_losses,
        "optimizer": _optimizer_state(trainer.optimizer, "optimizer", tensors),
        "hyper_optimizer": _optimizer_state(trainer.hyper_optimizer, "hyper_optimizer", tensors),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "fingerprint": fingerprint(trainer),
    }
    try:
        text = json.dumps(state, indent=1)
    except TypeError as e:
        raise PartitionCheckpointError(
            f"the training state cannot be written as JSON ({e}); an LR scheduler or optimiser holding "
            "functions (e.g. LambdaLR with a lambda) cannot be resumed: use a scheduler without callables"
        ) from e
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.new-", dir=directory.parent))
    aside = _aside(directory)
    try:
        save_file(tensors, str(tmp / TENSORS))
        (tmp / STATE).write_text(text + "\n")
        for path in (tmp / TENSORS, tmp / STATE):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        if aside.exists():
            shutil.rmtree(aside)
        if directory.exists():
            os.replace(directory, aside)
        os.replace(tmp, directory)
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_training_state(trainer: PartitionedTrainer, directory: str | Path) -> dict[str, Any]:
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
        state = json.loads((directory / STATE).read_text())
        with safe_open(str(directory / TENSORS), framework="pt") as f:
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as e:
        raise PartitionCheckpointError(f"{directory} is corrupted or truncated and was not loaded: {e}") from e
    if state.get("format") != FORMAT:
        raise PartitionCheckpointError(f"{directory} has format {state.get('format')!r}; this version reads {FORMAT}")
    expected, saved = fingerprint(trainer), state["fingerprint"]
    differ = [key for key in expected if expected[key] != saved.get(key)]
    if differ:
        details = "; ".join(
            f"{key}: saved {_short(saved.get(key))}, this run {_short(expected[key])}" for key in differ
        )
        raise PartitionCheckpointError(f"{directory} is from a different configuration ({details})")

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

    trainer.load_module_tensors(tensors, "/")
    _load_optimizer(trainer.optimizer, state["optimizer"], "optimizer", tensors)
    _load_optimizer(trainer.hyper_optimizer, state["hyper_optimizer"], "hyper_optimizer", tensors)
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = state["step"]
    trainer.history = state["history"]
    trainer.skipped_steps = state["skipped_steps"]
    trainer._losses = state["pending_losses"]
    trainer._hyper_losses = state["pending_hyper_losses"]
    if state["best"] is not None:
        best = {name: part(f"best/{name}/") for name, m in trainer._modules().items() if m is not None}
        trainer.best = (state["best"]["lml"], state["best"]["step"], best)
    torch.set_rng_state(tensors["rng/torch"])
    cuda = part("rng/cuda/")
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([cuda[str(i)] for i in range(len(cuda))])
    trainer.sampler.generator.set_state(tensors["rng/sampler"])
    trainer._lml_generator.set_state(tensors["rng/lml"])
    return state


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
