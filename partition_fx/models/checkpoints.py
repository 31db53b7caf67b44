"""Pretrained weights from a local file into a model built for other data: the classifier re-initialised for
another number of classes and the stem adapted to other input channels, as timm's ``pretrained=True`` does, for
timm, torchvision and plain ``torch.nn`` models alike.

Everything else must fit exactly: a checkpoint of another architecture is refused naming its first tensor that
does not fit. What was not loaded or was adapted is reported in one line (a :class:`PartitionWarning`). A file
that is not a plain state dict (another kind of file, a ``torch.save`` of a whole module, a partition-fx run's
partitioned checkpoint) is refused in one line saying what it is and what to pass instead.
"""

from __future__ import annotations

import pickle
import sys
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from timm.models import adapt_input_conv, clean_state_dict, load_state_dict

from ..errors import PartitionCheckpointError, PartitionWarning, first_names, is_out_of_memory, shortened

AUXILIARY_CLASSIFIERS = ("aux1.", "aux2.", "AuxLogits.")
"""Checkpoint tensors under these prefixes (torchvision's GoogLeNet and Inception v3 auxiliary classifiers,
which training does not use) are skipped when the model has none."""


PLAIN_STATE_DICT = (
    "a state dict saved with safetensors.torch.save_file(model.state_dict(), PATH) or "
    "torch.save(model.state_dict(), PATH)"
)
"""What a checkpoint must be, as every refusal of :func:`read_checkpoint` says."""


RUN_CHECKPOINT_METADATA = "partition_fx"
"""The safetensors metadata key of a partition-fx run's checkpoint files (``training.checkpoint.write_checkpoint``:
a run's ``checkpoint/last.safetensors`` and ``best.safetensors``)."""

RESUME_TENSOR = "rng/torch"
"""A tensor every resume directory's ``tensors.safetensors`` holds, with the model's tensors under ``model/``
(``training.checkpoint``)."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What :func:`load_checkpoint_into` did: ``loaded`` tensors as they are in the checkpoint, ``adapted`` stem
    weights (other input channels), ``reinitialised`` classifier tensors (kept at the model's initialisation),
    ``skipped`` checkpoint tensors with no place in the model (auxiliary classifiers)."""

    source: str
    loaded: tuple[str, ...]
    adapted: tuple[str, ...] = ()
    reinitialised: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: what was not loaded as it is (empty when everything was).

        >>> LoadedCheckpoint("checkpoint 'r18.safetensors'", ("conv1.weight",), reinitialised=("fc.weight",)).summary()
        "checkpoint 'r18.safetensors': not loaded (the classifier, re-initialised for this model): fc.weight"
        """
        parts = []
        if self.reinitialised:
            parts.append(f"not loaded (the classifier, re-initialised for this model): {', '.join(self.reinitialised)}")
        if self.adapted:
            parts.append(f"adapted to the model's input channels: {', '.join(self.adapted)}")
        if self.skipped:
            parts.append(f"skipped (auxiliary classifiers the model lacks): {', '.join(self.skipped)}")
        return f"{self.source}: {'; '.join(parts)}" if parts else ""


def load_checkpoint_into(
    model: torch.nn.Module,
    checkpoint: str | Path | Mapping[str, torch.Tensor],
    *,
    classifier: str | tuple[str, ...] | None = None,
    first_conv: str | tuple[str, ...] | None = None,
) -> LoadedCheckpoint:
    """Load ``checkpoint`` (a safetensors or torch file, read by :func:`read_checkpoint`, or a state dict) into
    ``model``: the classifier re-initialised where its shape differs (another number of classes),
    the first conv's weight adapted by ``timm.models.adapt_input_conv`` where the input channels differ.

    ``classifier`` and ``first_conv`` name modules; by default timm's ``pretrained_cfg`` names them, and for
    other models (torchvision's) the classifier is the last ``Linear``/``Conv2d`` module and the stem the first
    ``Conv2d``. Anything else that is missing, extra or of another shape is a
    :class:`~partition_fx.errors.PartitionCheckpointError` naming the first such tensor; ``model`` is then
    unchanged. What was not loaded as it is, is said in one line by a :class:`PartitionWarning`.

    >>> import timm, warnings
    >>> imagenet = timm.create_model("resnet10t")  # 1000 classes, 3 channels
    >>> model = timm.create_model("resnet10t", num_classes=10, in_chans=1)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     result = load_checkpoint_into(model, imagenet.state_dict())
    >>> result.reinitialised, result.adapted
    (('fc.weight', 'fc.bias'), ('conv1.0.weight',))
    >>> print(caught[0].message)
    state dict: not loaded (the classifier, re-initialised for this model): fc.weight, fc.bias; adapted ...
    >>> load_checkpoint_into(model, timm.create_model("resnet18").state_dict())
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionCheckpointError: state dict does not fit ResNet: it lacks ... 'conv1.0.weight'...
    """
    source = "state dict" if isinstance(checkpoint, Mapping) else f"checkpoint {str(checkpoint)!r}"
    state = dict(checkpoint) if isinstance(checkpoint, Mapping) else read_checkpoint(checkpoint)
    state = _timm_filtered(state, model)
    classifiers = _module_names(classifier, model, "classifier") or _last_classifier(model)
    stems = _module_names(first_conv, model, "first_conv") or _first_conv(model)
    heads = {k for k in model.state_dict() if any(k.startswith(f"{name}.") for name in classifiers)}
    stem_weights = {f"{name}.weight" for name in stems}
    values, loaded, adapted, reinitialised = {}, [], [], []
    refuse = f"{source} does not fit {type(model).__name__}"
    fix = "pass a checkpoint saved from this model's state_dict() (same architecture and options)"
    for key, target in model.state_dict().items():
        value = state.get(key)
        if value is None and (key in heads or key.endswith("num_batches_tracked")):
            reinitialised += [key] if key in heads else []
            continue
        if not isinstance(value, torch.Tensor):
            raise PartitionCheckpointError(f"{refuse}: it lacks the model's tensor {key!r}; {fix}")
        if value.shape == target.shape:
            values[key] = value
            loaded.append(key)
        elif key in heads:
            reinitialised.append(key)
        elif key in stem_weights and value.ndim == 4 and _other_channels_only(value.shape, target.shape):
            values[key] = adapt_input_conv(target.shape[1], value, base_chans=value.shape[1]).to(value.dtype)
            adapted.append(key)
        else:
            raise PartitionCheckpointError(
                f"{refuse}: its tensor {key!r} has shape {list(value.shape)} where the model's is "
                f"{list(target.shape)}; {fix}"
            )
    model_keys = set(model.state_dict())
    extra = [k for k in state if k not in model_keys]
    skipped = tuple(k for k in extra if k.startswith(AUXILIARY_CLASSIFIERS))
    unplaced = [k for k in extra if k not in skipped]
    if unplaced:
        others = f" (and {len(unplaced) - 1} more)" if len(unplaced) > 1 else ""
        raise PartitionCheckpointError(f"{refuse}: its tensor {unplaced[0]!r}{others} has no place in the model; {fix}")
    model.load_state_dict(values, strict=False)
    result = LoadedCheckpoint(source, tuple(loaded), tuple(adapted), tuple(reinitialised), skipped)
    if result.summary():
        warnings.warn(result.summary(), PartitionWarning, stacklevel=2)
    return result


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict in a local safetensors or torch file (``timm.models.load_state_dict``: a nested
    ``state_dict``/``model`` entry and a ``module.`` prefix are unwrapped; torch files load with
    ``weights_only=True``, nothing else is unpickled), or a :class:`~partition_fx.errors.PartitionCheckpointError`
    in one line saying what the file is instead and what to pass: a file of another kind, a ``torch.save`` of
    Python objects besides tensors (a whole module, say), a TorchScript archive, or a partition-fx run's
    partitioned training checkpoint or resume state (the run's plain model is its ``model.safetensors``). The
    file's kind is told by its first bytes, not by its name.

    >>> read_checkpoint("no/such/file.safetensors")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionCheckpointError: checkpoint 'no/such/file.safetensors' is not a file
    >>> import tempfile
    >>> notes = Path(tempfile.mkdtemp()) / "notes.txt"
    >>> _ = notes.write_text("not weights")
    >>> read_checkpoint(notes)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionCheckpointError: checkpoint '.../notes.txt' is neither a safetensors file nor a ...
    """
    path = Path(path)
    source = f"checkpoint {str(path)!r}"
    if not path.is_file():
        raise PartitionCheckpointError(f"{source} is not a file")
    kind = _file_kind(path)
    if kind is None:
        raise PartitionCheckpointError(
            f"{source} is neither a safetensors file nor a torch.save file of a state dict of tensors; pass "
            f"{PLAIN_STATE_DICT}"
        )
    if kind == "torchscript":
        raise PartitionCheckpointError(
            f"{source} is a TorchScript archive (torch.jit.save), not a state dict; pass {PLAIN_STATE_DICT}"
        )
    state = _read_safetensors(path, source) if kind == "safetensors" else _read_torch(path, source)
    if not isinstance(state, Mapping) or not state:
        raise PartitionCheckpointError(f"{source} holds no state dict of tensors; pass {PLAIN_STATE_DICT}")
    other = next(((k, v) for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if other is not None:
        raise PartitionCheckpointError(
            f"{source} is not a state dict of tensors (its entry {other[0]!r} is a {type(other[1]).__name__}); "
            f"pass {PLAIN_STATE_DICT}"
        )
    return dict(state)


def _file_kind(path: Path) -> str | None:
    """What the first bytes of ``path`` say it is: ``"safetensors"`` (a little-endian header length, then the
    header's JSON), ``"torchscript"`` or ``"torch"`` (a zip archive: ``torch.jit.save``'s holds
    ``constants.pkl``), ``"torch"`` (the legacy ``torch.save`` format: a pickle), or None."""
    with path.open("rb") as f:
        head = f.read(9)
    size = path.stat().st_size
    if len(head) == 9 and head[8:] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return None
        return "torchscript" if any(n.endswith("/constants.pkl") for n in names) else "torch"
    if len(head) >= 2 and head[0] == pickle.PROTO[0] and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL:
        return "torch"
    return None


def _read_safetensors(path: Path, source: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (whatever its name), ``module.`` prefixes removed as timm does; a
    partition-fx run's own files are refused (:func:`_refuse_run_file`)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            _refuse_run_file(path, source, f.metadata() or {}, list(f.keys()))
            state = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError) as e:
        raise PartitionCheckpointError(
            f"{source} is a damaged or truncated safetensors file ({_short(e)}); pass {PLAIN_STATE_DICT}"
        ) from e
    return clean_state_dict(state)


def _read_torch(path: Path, source: str) -> Any:
    """What ``timm.models.load_state_dict`` reads from a ``torch.save`` file with ``weights_only=True``; a file
    holding Python objects besides tensors is refused naming them, never loaded."""
    if path.name.endswith(".safetensors"):  # timm would read it as safetensors, by its name
        raise PartitionCheckpointError(
            f"{source} is a torch.save file named like a safetensors file: rename it (e.g. to .pt)"
        )
    try:
        return load_state_dict(str(path), weights_only=True)
    except Exception as e:
        if is_out_of_memory(e):
            raise
        if not isinstance(e, pickle.UnpicklingError) and not isinstance(e.__cause__, pickle.UnpicklingError):
            raise PartitionCheckpointError(
                f"{source} cannot be read as a torch.save file ({_short(e)}); pass {PLAIN_STATE_DICT}"
            ) from e
        try:  # weights_only refused a Python object: name its class (zip archives only)
            objects = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception:
            objects = []
        named = f" ({first_names(objects)})" if objects else ""
        raise PartitionCheckpointError(
            f"{source} is a torch.save file holding Python objects besides tensors{named}, which partition-fx "
            f"does not unpickle; pass {PLAIN_STATE_DICT}"
        ) from None


def _refuse_run_file(path: Path, source: str, metadata: dict[str, str], keys: list[str]) -> None:
    """Refuse a partition-fx run's partitioned checkpoint (by its metadata) or resume state (by its documented key
    layout), saying where that run's plain model is."""
    if RUN_CHECKPOINT_METADATA in metadata:
        what, run = "a partitioned training checkpoint of partition-fx", _run_of(path, "checkpoint")
    elif RESUME_TENSOR in keys and any(k.startswith("model/") for k in keys):
        what, run = "the resume state of a partition-fx training run", _run_of(path, "checkpoint", "resume")
    else:
        return
    raise PartitionCheckpointError(
        f"{source} is {what} (the model's partitions, not its tensors): the run's plain model is "
        f"{run}/model.safetensors, or the one `partition-fx export --run {run}` writes"
    )


def _run_of(path: Path, *inner: str) -> str:
    """The run directory of ``path`` when it lies in ``RUN/<inner...>/``, else ``"RUN"``.

    >>> _run_of(Path("out/run1/checkpoint/last.safetensors"), "checkpoint"), _run_of(Path("last.safetensors"), "x")
    ('out/run1', 'RUN')
    """
    parents = path.parents
    if len(inner) < len(parents) and all(parents[i].name == name for i, name in enumerate(reversed(inner))):
        return str(parents[len(inner)])
    return "RUN"


def _short(error: BaseException) -> str:
    """``"Type: message"`` on one line, shortened; just the type where the message would suggest unsafe loading
    (``weights_only``)."""
    if "weights_only" in str(error):
        return type(error).__name__
    return shortened(f"{type(error).__name__}: {error}", limit=200)


def _timm_filtered(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state`` through the ``checkpoint_filter_fn`` of the timm module that defines ``model`` (what
    ``timm.create_model(pretrained=True)`` applies: e.g. a ViT's position embedding resampled to its image size)."""
    if not type(model).__module__.startswith("timm.") or not hasattr(model, "pretrained_cfg"):
        return state
    filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    if filter_fn is None:
        return state
    try:
        return dict(filter_fn(state, model))
    except Exception:  # a filter for another checkpoint format: compare the tensors as they are
        return state


def _module_names(names: str | tuple[str, ...] | None, model: torch.nn.Module, cfg_key: str) -> tuple[str, ...]:
    if names is None:
        names = (getattr(model, "pretrained_cfg", None) or {}).get(cfg_key)
    return (names,) if isinstance(names, str) else tuple(names or ())


def _last_classifier(model: torch.nn.Module) -> tuple[str, ...]:
    layers = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    return tuple(layers[-1:])


def _first_conv(model: torch.nn.Module) -> tuple[str, ...]:
    return tuple(n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d))[:1]


def _other_channels_only(source: torch.Size, target: torch.Size) -> bool:
    return source[0] == target[0] and source[2:] == target[2:] and source[1] != target[1]
