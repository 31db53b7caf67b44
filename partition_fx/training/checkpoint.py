"""Checkpoints on disk: single-file model checkpoints and resumable training state.

A **checkpoint file** (``last.safetensors``, ``best.safetensors``) holds the model, input transform and
likelihood tensors (``model.<key>``, ``hyper.<key>``, ``likelihood.<key>``) with the step, the latest LML and
the partitioning in its metadata.

A **resume directory** holds everything a :class:`~partition_fx.training.PartitionedTrainer` needs to
continue a run bit for bit (its ``state_dict()``), in two files:

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

from .._io import existing_directory, replace_directory, replace_file
from ..errors import PartitionCheckpointError

TENSORS = "tensors.safetensors"
STATE = "state.json"
FORMAT = 1


class Resumable(Protocol):
    """What a resume directory saves and restores (``PartitionedTrainer`` is one)."""

    def state_dict(self) -> dict[str, Any]: ...
    def fingerprint(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU copy (what safetensors writes, independent of later training)."""
    return tensor.detach().to("cpu").contiguous().clone()


def differences(saved: dict[str, Any], expected: dict[str, Any], *, this: str = "this run") -> str:
    """``"key: saved X, this run Y; ..."`` for every key of ``expected`` whose saved value differs, or ``""``."""
    return "; ".join(
        f"{key}: saved {_short(saved.get(key))}, {this} {_short(value)}"
        for key, value in expected.items()
        if saved.get(key) != value
    )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- single-file checkpoints ------------------------------------------------------------------------


def write_checkpoint(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """``tensors`` in one safetensors file with ``metadata`` (JSON) under the key ``partition_fx``."""
    from safetensors.torch import save_file

    text = {"partition_fx": json.dumps(metadata)}
    replace_file(path, lambda tmp: save_file(tensors, str(tmp), metadata=text))


def read_checkpoint(path: str | Path, identity: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and metadata of a file written by :func:`write_checkpoint`; refuses a missing, truncated
    or corrupted file, and one whose metadata contradicts ``identity`` (naming every field that differs)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("partition_fx", "{}"))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise PartitionCheckpointError(f"checkpoint {path} is missing, corrupted or truncated: {e}") from e
    differ = [
        f"{key}: saved {meta[key]!r}, this model {value!r}"
        for key, value in identity.items()
        if key in meta and meta[key] != value
    ]
    if differ:
        raise PartitionCheckpointError(f"checkpoint {path} is from a different configuration ({'; '.join(differ)})")
    return tensors, meta


# --- resume directories ----------------------------------------------------------------------------


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
        "best": state["best"],
        "skipped_steps": state["skipped_steps"],
        "pending_losses": state["pending_losses"],
        "pending_hyper_losses": state["pending_hyper_losses"],
        "optimizer": _split_optimizer(state["optimizer"], "optimizer", tensors),
        "hyper_optimizer": _split_optimizer(state["hyper_optimizer"], "hyper_optimizer", tensors),
        "scheduler": state["scheduler"],
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
    if plain.get("format") != FORMAT:
        raise PartitionCheckpointError(f"{directory} has format {plain.get('format')!r}; this version reads {FORMAT}")
    differ = differences(plain["fingerprint"], trainer.fingerprint())
    if differ:
        raise PartitionCheckpointError(f"{directory} is from a different configuration ({differ})")

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

    modules = {name: part(f"{name}/") for name in ("model", "hyper", "likelihood") if part(f"{name}/")}
    cuda = part("rng/cuda/")
    trainer.load_state_dict(
        {
            **{key: plain[key] for key in ("step", "history", "best", "skipped_steps", "fingerprint")},
            "pending_losses": plain["pending_losses"],
            "pending_hyper_losses": plain["pending_hyper_losses"],
            "modules": modules,
            "best_modules": None if plain["best"] is None else {name: part(f"best/{name}/") for name in modules},
            "optimizer": _join_optimizer(plain["optimizer"], "optimizer", tensors),
            "hyper_optimizer": _join_optimizer(plain["hyper_optimizer"], "hyper_optimizer", tensors),
            "scheduler": plain["scheduler"],
            "rng": {
                "torch": tensors["rng/torch"],
                "cuda": [cuda[str(i)] for i in range(len(cuda))],
                "sampler": {"generator": tensors["rng/sampler"]},
                "lml": tensors["rng/lml"],
            },
        }
    )
    return plain


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


class CheckpointWriter:
    """An evaluation hook (``PartitionedTrainer.evaluation_hooks``) that keeps a run recoverable: after each
    evaluation it writes ``last.safetensors``, ``best.safetensors`` when the LML improved, and the resume
    directory ``resume/``, all under ``directory``, and records the step in ``trainer.last_checkpoint_step``.

    Example::

        >>> import tempfile, torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (x, y), batch_size=8)
        >>> trainer.evaluation_hooks.append(CheckpointWriter(tempfile.mkdtemp()))
        >>> _ = trainer.run(2, progress=False)
        >>> trainer.last_checkpoint_step
        2
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def __call__(self, trainer: Any, record: dict[str, Any], improved: bool) -> None:
        trainer.save_checkpoint(self.directory / "last.safetensors")
        if improved:
            trainer.save_checkpoint(self.directory / "best.safetensors")
        save_training_state(trainer, self.directory / "resume")
        trainer.last_checkpoint_step = trainer.step
