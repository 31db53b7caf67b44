"""A run on disk: checkpoint files and resume directories. Nothing is unpickled; every file is written through
``partition_fx._io``, so a crash mid-save leaves the previous version loadable.

A **checkpoint file** (``last.safetensors``, ``best.safetensors``) holds the model, input transform and
likelihood tensors (``model.<key>``, ``hyper.<key>``, ``likelihood.<key>``) of one state of a run, with the
step, its LMLs and the partitioning in its metadata. :func:`load_checkpoint` restores one into a partitioned
model without a trainer or any data (what ``partition-fx export`` does). Its ``norm_statistics`` says what the
model's BatchNorm running statistics are calibrated for (see :data:`NORM_STATISTICS`): at the end of a run both
files hold statistics recalibrated for the final subnetwork, so an export of either reproduces the accuracy the
run reports for it without the training data; an interrupted run's files hold training's statistics, which an
export recalibrates (:func:`needs_recalibration`).

A **resume directory** holds everything a :class:`~partition_fx.training.PartitionedTrainer` needs to continue a
run bit for bit (its ``state_dict()``), in two files:

* ``tensors.safetensors``: the model, input transform and likelihood (``model/``, ``hyper/``, ``likelihood/``),
  the optimisers' tensor state (``optimizer/<param index>/<key>``, ``hyper_optimizer/...``), the state of the
  best evaluation so far (``best/...``) and every random generator (``rng/torch``, ``rng/cuda/<i>``,
  ``rng/sampler``, ``rng/lml``);
* ``state.json``: the step, the LML history, the best step, the optimisers' param groups and non-tensor
  state, the LR scheduler's state, a fingerprint of the configuration, and ``hooks``: the states of the run's
  hooks that hold one (``TrainingHook.state_dict``), by ``state_key`` (absent when none does), and ``occam``: the
  Occam term's derivative at its last refresh (``training.objective.occam``; absent for a run without one).

The hook that writes both during a run is ``training.loop.trainer.CheckpointWriter``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from .._io import existing_directory, replace_directory, replace_file
from ..errors import PartitionCheckpointError, earlier_version
from ..fx.partitioned_model import PartitionedModel
from ..job.train_config import TrainConfig

# --- checkpoint files ------------------------------------------------------------------------------------------------


CHECKPOINT_FIELDS = ("step", "lml", "final", "norm_statistics", "storage", "omitted", "omitted_sha256")
"""What a checkpoint file's metadata holds besides the partitioning (:func:`checkpoint_identity`)."""


NORM_STATISTICS = {
    "final": "recalibrated for the final subnetwork C over the training data (the end of a run)",
    "training": "the running statistics training left, shared by every subnetwork (mostly subnetwork 1's)",
    "none": "the model keeps no running statistics",
}
"""The values of a checkpoint's ``norm_statistics``."""


def norm_statistics(meta: dict[str, Any]) -> str:
    """What the BatchNorm statistics of a checkpoint with metadata ``meta`` are calibrated for (a key of
    :data:`NORM_STATISTICS`).

    >>> norm_statistics({"norm_statistics": "final", "final": True})
    'final'
    """
    statistics: str = meta["norm_statistics"]
    return statistics


def needs_recalibration(meta: dict[str, Any], subnetwork: int, num_partitions: int) -> bool:
    """Whether exporting ``subnetwork`` of a checkpoint with metadata ``meta`` needs its BatchNorm statistics
    recalibrated for that subnetwork first: unless they already are (``"final"`` and ``subnetwork`` C) or
    there are none.

    >>> final, training, none = ({"norm_statistics": s} for s in ("final", "training", "none"))
    >>> needs_recalibration(final, 3, 3), needs_recalibration(final, 2, 3)
    (False, True)
    >>> needs_recalibration(training, 3, 3), needs_recalibration(none, 2, 3)
    (True, False)
    """
    stats = norm_statistics(meta)
    return stats == "training" or (stats == "final" and subnetwork != num_partitions)


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


def with_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``tensors`` under ``prefix``, with it removed.

    >>> with_prefix({"model/w": 1, "hyper/r": 2}, "model/")
    {'w': 1}
    """
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def state_tensors(
    states: dict[str, dict[str, torch.Tensor]], separator: str, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Module states (``{"model": ..., "hyper": ..., "likelihood": ...}``) as one flat dict of CPU copies keyed
    ``prefix + name + separator + key``: ``model.<key>`` in a checkpoint file, ``model/<key>`` and
    ``best/model/<key>`` in a resume directory. :func:`module_states` reads them back.

    >>> state_tensors({"model": {"w": torch.zeros(1)}}, "/", "best/")
    {'best/model/w': tensor([0.])}
    """
    return {
        f"{prefix}{name}{separator}{key}": cpu_copy(v) for name, state in states.items() for key, v in state.items()
    }


def module_states(
    tensors: dict[str, torch.Tensor], names: Iterable[str], separator: str, prefix: str = ""
) -> dict[str, dict[str, torch.Tensor]]:
    """The states of the modules ``names`` among ``tensors`` written by :func:`state_tensors`.

    >>> module_states({"model.w": 1, "hyper.r": 2}, ["model"], ".")
    {'model': {'w': 1}}
    """
    return {name: with_prefix(tensors, f"{prefix}{name}{separator}") for name in names}


def buffers_digest(buffers: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names and bytes of ``buffers`` (in name order): what a checkpoint that leaves them
    out stores to recognise a model that rebuilds them differently.

    >>> buffers_digest({"a": torch.zeros(2)}) == buffers_digest({"a": torch.zeros(2)}) != buffers_digest({})
    True
    """
    digest = hashlib.sha256()
    for key, value in sorted(buffers.items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def checkpoint_identity(pmodel: PartitionedModel) -> dict[str, Any]:
    """The partitioning a checkpoint of ``pmodel`` belongs to: model class, C, proportions and scheme (stored in
    its metadata, and compared by :func:`read_checkpoint`).

    >>> from partition_fx import partitionify
    >>> checkpoint_identity(partitionify(torch.nn.Linear(4, 2), 2))
    {'num_partitions': 2, 'proportions': [0.5, 0.5], 'scheme': 'random', 'model': 'Linear'}
    """
    return {
        "num_partitions": pmodel.num_partitions,
        "proportions": list(pmodel.proportions),
        "scheme": pmodel.scheme,
        "model": pmodel.original_class.__name__,
    }


def check_metadata(pmodel: PartitionedModel, saved: dict[str, Any], source: str) -> None:
    """Refuse a checkpoint whose metadata ``saved`` says it was written before flat storage (its partitions are
    stored per tensor), that lacks a field (:data:`CHECKPOINT_FIELDS`: an earlier development version wrote it),
    or whose left-out buffers ``pmodel`` rebuilds differently (their digest differs). ``source`` names the
    checkpoint in the message."""
    if saved.get("storage") != "flat" and any(True for _ in pmodel.flat_groups()):
        raise PartitionCheckpointError(
            f"{source} was written before flat storage (its partitions are stored per tensor); this version "
            "cannot load it: export its model with that version (export_subnetwork), or train again"
        )
    missing = [key for key in (*CHECKPOINT_FIELDS, *checkpoint_identity(pmodel)) if key not in saved]
    if missing:
        raise PartitionCheckpointError(earlier_version(source, f"metadata {', '.join(missing)}"))
    defaults = saved["omitted"] == "layouts+defaults"
    if buffers_digest(pmodel.rebuilt_buffers(defaults=defaults)) != saved["omitted_sha256"]:
        what = "layouts and default values" if defaults else "layouts"
        raise PartitionCheckpointError(
            f"{source} leaves out the partition {what}, which this model builds differently: build it as the "
            f"run did (the same partitionify seed and arguments{', model seed and weights' if defaults else ''})"
        )


def restore_module_states(
    pmodel: PartitionedModel, modules: dict[str, nn.Module], states: dict[str, dict[str, torch.Tensor]], source: str
) -> None:
    """Load ``states`` (``{"model": ..., "hyper": ..., "likelihood": ...}``, as checkpoints and a trainer's best
    state keep them; a missing one: empty) into ``modules`` (the same names; ``modules["model"]`` is ``pmodel``).
    The model's state leaves out what it rebuilds (:meth:`PartitionedModel.rebuilt_buffers`): its own are kept.
    A state that does not fit its module is refused naming ``source`` and the module."""
    for name, m in modules.items():
        state = states.get(name, {})
        if name == "model":
            state = {**pmodel.rebuilt_buffers(defaults=True), **state}
        try:
            m.load_state_dict(state)
        except RuntimeError as e:
            raise PartitionCheckpointError(
                f"{source}: its {name} state does not fit this {type(m).__name__} (build it as the run did): {e}"
            ) from e


def load_checkpoint(
    pmodel: PartitionedModel,
    path: str | Path,
    *,
    hyper: nn.Module | None = None,
    likelihood: nn.Module | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint file written by ``PartitionedTrainer.save_checkpoint`` (a run's
    ``checkpoint/last.safetensors`` or ``best.safetensors``) into ``pmodel``, and into the input transform
    ``hyper`` and the ``likelihood`` where given (built as the run built them; the file's tensors of a module not
    given are ignored). Needs no trainer and no data. Returns the checkpoint's metadata: ``step``, ``lml``,
    ``final``, ``norm_statistics`` (see :data:`NORM_STATISTICS`: whether an export needs the BatchNorm statistics
    recalibrated first, :func:`needs_recalibration`) and the partitioning.

    Refuses, with :class:`~partition_fx.errors.PartitionCheckpointError`: a missing, truncated or corrupted file;
    one from another partitioning (naming each field that differs) or whose left-out layouts or defaults this
    model rebuilds differently; and one written before flat storage.

    >>> import tempfile, torch
    >>> from partition_fx import partitionify
    >>> from partition_fx.training import fit
    >>> x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    >>> run = tempfile.mkdtemp()
    >>> trained = partitionify(torch.nn.Linear(4, 2), 2, seed=0)
    >>> _ = fit(trained, (x, y), steps=4, checkpoint_dir=run, progress=False)
    >>> pmodel = partitionify(torch.nn.Linear(4, 2), 2, seed=0)
    >>> meta = load_checkpoint(pmodel, f"{run}/last.safetensors")
    >>> meta["step"], meta["norm_statistics"], torch.equal(pmodel(x), trained(x))
    (4, 'none', True)
    >>> load_checkpoint(partitionify(torch.nn.Linear(4, 2), 3), f"{run}/last.safetensors")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionCheckpointError: checkpoint ... is from a different configuration (num_partitions: ...
    """
    tensors, meta = read_checkpoint(path, checkpoint_identity(pmodel))
    source = f"checkpoint {path}"
    check_metadata(pmodel, meta, source)
    found = {"model": pmodel, "hyper": hyper, "likelihood": likelihood}
    modules = {name: m for name, m in found.items() if m is not None}
    restore_module_states(pmodel, modules, module_states(tensors, modules, "."), source)
    return meta


# --- resume directories ----------------------------------------------------------------------------------------------


TENSORS = "tensors.safetensors"


STATE = "state.json"


FORMAT = 3
"""3: partitioned tensors in flat storage (``partition_fx.fx.flat``): the optimiser state is per group parameter.
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
    tensors.update(state_tensors(state["modules"], "/"))
    best = state["best"]
    if best is not None and best["step"] == state["step"]:
        best = {**best, "same_as_current": True}  # the modules above are the best state: no second copy
    else:
        tensors.update(state_tensors(state["best_modules"] or {}, "/", "best/"))
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
    if state["partitioned_ended_at"] is not None:  # only when patience ended partitioned training early
        plain["partitioned_ended_at"] = state["partitioned_ended_at"]
    if state["hooks"]:  # only when a hook holds state: the states of runs whose hooks hold none stay as they were
        plain["hooks"] = state["hooks"]
    if state.get("occam") is not None:  # only with an Occam term: other runs' states stay as they were
        plain["occam"] = state["occam"]
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
        plain: dict[str, Any] = json.loads((directory / STATE).read_text())
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
    # a setting added since the state was written: its absence means the value every run had before it
    plain["fingerprint"] = {**TrainConfig.absent_values(fingerprint=True), **plain.get("fingerprint", {})}
    missing += [f"fingerprint.{key}" for key in trainer.fingerprint() if key not in plain["fingerprint"]]
    if isinstance(plain.get("best"), dict) and "score" not in plain["best"]:
        missing.append("best.score: its best state was chosen by the full LML, not the conditional one")
    if missing:
        raise PartitionCheckpointError(earlier_version(f"{directory}/{STATE}", ", ".join(missing)))
    modules = module_states(tensors, ("model", "hyper", "likelihood"), "/")
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
            "partitioned_ended_at": plain.get("partitioned_ended_at"),  # absent: partitioned training ran as planned
            "grad_scaler": plain["grad_scaler"],  # fp16 runs' loss scale
            "hooks": plain.get("hooks", {}),  # absent: no hook held state when it was saved
            "occam": plain.get("occam"),  # absent: the run has no Occam term
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
    return module_states(tensors, modules, "/", "best/")


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
