"""Pretrained weights from a local file into a model built for other data: the classifier re-initialised for
another number of classes and the stem adapted to other input channels, as timm's ``pretrained=True`` does, for
timm, torchvision and plain ``torch.nn`` models alike.

Everything else must fit exactly: a checkpoint of another architecture is refused naming its first tensor that
does not fit. What was not loaded or was adapted is reported in one line (a :class:`PartitionWarning`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from timm.models import adapt_input_conv, load_state_dict

from ..errors import PartitionCheckpointError, PartitionWarning, is_out_of_memory

AUXILIARY_CLASSIFIERS = ("aux1.", "aux2.", "AuxLogits.")
"""Checkpoint tensors under these prefixes (torchvision's GoogLeNet and Inception v3 auxiliary classifiers,
which training does not use) are skipped when the model has none."""


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
    """Load ``checkpoint`` (a safetensors or torch file, read by ``timm.models.load_state_dict``, or a state
    dict) into ``model``: the classifier re-initialised where its shape differs (another number of classes),
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
    ``weights_only=True``), or a :class:`~partition_fx.errors.PartitionCheckpointError` saying why not.

    >>> read_checkpoint("no/such/file.safetensors")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionCheckpointError: checkpoint 'no/such/file.safetensors' is not a file
    """
    if not Path(path).is_file():
        raise PartitionCheckpointError(f"checkpoint {str(path)!r} is not a file")
    try:
        state = load_state_dict(str(path), weights_only=True)
    except Exception as e:
        if is_out_of_memory(e):
            raise
        detail = " ".join(str(e).split())
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        raise PartitionCheckpointError(
            f"checkpoint {str(path)!r} cannot be read ({type(e).__name__}: {detail}); it must be a safetensors "
            "or torch file of a state dict"
        ) from e
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PartitionCheckpointError(f"checkpoint {str(path)!r} is not a state dict of tensors")
    return dict(state)


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
