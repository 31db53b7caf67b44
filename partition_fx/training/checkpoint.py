"""Checkpoint files on disk: the model, input transform and likelihood of one state of a run.

A **checkpoint file** (``last.safetensors``, ``best.safetensors``) holds the model, input transform and
likelihood tensors (``model.<key>``, ``hyper.<key>``, ``likelihood.<key>``) with the step, the latest LML and
the partitioning in its metadata. :func:`load_checkpoint` restores one into a partitioned model without a
trainer or any data (what ``partition-fx export`` does).

Its ``norm_statistics`` says what the model's BatchNorm running statistics are calibrated for (see
:data:`NORM_STATISTICS`): at the end of a run both files hold statistics recalibrated for the final subnetwork,
so an export of either reproduces the accuracy the run reports for it without the training data; an
interrupted run's files hold training's statistics, which an export recalibrates (:func:`needs_recalibration`).

Resume directories are ``training.resume``; the hook that writes both during a run is
``training.checkpoint_writer``. Nothing is unpickled. A file is written through ``partition_fx._io``: a crash
mid-save leaves the previous version loadable.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._io import replace_file
from ..errors import PartitionCheckpointError, earlier_version

if TYPE_CHECKING:
    from ..partitioned_model import PartitionedModel

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
    return meta["norm_statistics"]


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
    restore_module_states(pmodel, modules, {name: with_prefix(tensors, name + ".") for name in modules}, source)
    return meta
