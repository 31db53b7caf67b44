"""The model factory of the command line and the benchmarks: a timm model by name, or torchvision's classifier
by ``torchvision:NAME``, optionally with weights from a local file, with every failure a
:class:`~partition_fx.errors.PartitionError` naming the option."""

from __future__ import annotations

import difflib
from itertools import zip_longest
from pathlib import Path
from typing import Any

import timm
import torch

from ..errors import PartitionCheckpointError, PartitionError, first_line, is_out_of_memory, shortened
from ..hf_folders import HF_PREFIX, check_hf_folder
from .checkpoints import load_checkpoint_into
from .hf_models import build_hf_model
from .torchvision_models import TORCHVISION_PREFIX, build_torchvision_model, torchvision_model_names


def build_model(
    name: str, num_classes: int, checkpoint: str | None = None, in_chans: int = 3, img_size: int | None = None
) -> torch.nn.Module:
    """A timm model by name (the shipped FixUp/WRN models included), or torchvision's classifier by
    ``torchvision:NAME``, optionally with weights from ``checkpoint``, a local safetensors or torch file
    (nothing is downloaded). A plain name is timm's: ``resnet18`` is timm's ResNet-18,
    ``torchvision:resnet18`` torchvision's.

    The checkpoint goes through :func:`~partition_fx.models.load_checkpoint_into`: a checkpoint with another
    number of classes (an ImageNet one, say) loads all but its classifier, which is re-initialised for
    ``num_classes``, and its stem is adapted to ``in_chans``; one line (a ``PartitionWarning``) says so. A
    checkpoint of another architecture is refused naming its first tensor that does not fit.

    ``img_size`` is passed to models that take it (transformers need it) and ignored by the others; a model
    that cannot run on such images is refused, naming the smallest size it runs on (:func:`check_image_size`).

    >>> model = build_model("fixup_resnet8", num_classes=10, in_chans=1)
    >>> model(torch.zeros(2, 1, 16, 16)).shape
    torch.Size([2, 10])
    >>> type(build_model("torchvision:resnet18", 10)).__module__
    'torchvision.models.resnet'
    >>> build_model("no_such_net", 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'no_such_net' (not in timm's registry)
    >>> build_model("resnet10", 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'resnet10' (not in timm's registry); did you mean resnet10t, ...
    >>> build_model("torchvision:mobilenet_v3_smal", 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'torchvision:mobilenet_v3_smal' ...mobilenet_v3_small, ...
    """
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise PartitionError(f"--checkpoint {checkpoint!r} is not a file")
    model = _architecture(name, num_classes, in_chans, img_size)
    if img_size is not None:
        check_image_size(model, name, in_chans, img_size)
    if checkpoint is not None:
        try:
            load_checkpoint_into(model, checkpoint)
        except PartitionCheckpointError as e:  # "checkpoint 'FILE' ...": name the option
            raise PartitionCheckpointError(f"--{e}") from e.__cause__
    # How to build it again: partitionify keeps it (PartitionedModel.build), so a run of it records its name
    # and `partition-fx export` can rebuild it (training.fit).
    # torch annotates Module.__setattr__ for tensors and modules; any other value is a plain attribute.
    model.partition_fx_build = {"name": name, "num_classes": num_classes, "in_chans": in_chans}  # type: ignore[assignment]
    return model


SIZE_STEP = 32
"""Image sizes :func:`check_image_size` suggests: multiples of this, the total stride of most classifiers."""


def check_image_size(model: torch.nn.Module, name: str, in_chans: int, img_size: int) -> None:
    """Refuse ``model`` (``name``, for the message) if it cannot classify ``img_size`` x ``img_size`` images, checked
    by a forward pass of two blank images in eval mode without autograd (some classifiers need a minimum size);
    the refusal names the smallest multiple of :data:`SIZE_STEP` above ``img_size`` (up to 256) it runs on.

    >>> check_image_size(build_model("resnet10t", 10), "resnet10t", 3, 16)
    >>> check_image_size(build_model("convnext_atto", 10, in_chans=1), "convnext_atto", 1, 28)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: convnext_atto cannot run on 28x28 images (...); pass --image-size 32 ...
    """
    error = _forward_error(model, in_chans, img_size)
    if error is None:
        return
    larger = range((img_size // SIZE_STEP + 1) * SIZE_STEP, 257, SIZE_STEP)
    runs_on = next((size for size in larger if _forward_error(model, in_chans, size) is None), None)
    fix = (
        f"pass --image-size {runs_on} (the smallest multiple of {SIZE_STEP} it runs on) or choose another --model"
        if runs_on is not None
        else "choose another --model"
    )
    detail = f"{type(error).__name__}: {shortened(first_line(error))}"
    raise PartitionError(f"{name} cannot run on {img_size}x{img_size} images ({detail}); {fix}")


def _forward_error(model: torch.nn.Module, in_chans: int, img_size: int) -> Exception | None:
    """What a forward pass of two blank images raises (None: it runs); the model's mode is kept."""
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(2, in_chans, img_size, img_size))
    except (RuntimeError, ValueError, AssertionError, IndexError) as e:
        if is_out_of_memory(e):
            raise
        return e
    finally:
        model.train(training)
    return None


def check_model_name(name: str) -> None:
    """Refuse a ``name`` that :func:`build_model` does not know (not in timm's registry, or not one of
    torchvision's classifiers with the ``torchvision:`` prefix), suggesting the closest names; nothing is built.

    >>> check_model_name("resnet10t")
    >>> check_model_name("torchvision:resnet19")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'torchvision:resnet19' (not one of torchvision's ...
    """
    if name.startswith(HF_PREFIX):
        check_hf_folder(name)
    elif name.startswith(TORCHVISION_PREFIX):
        if name[len(TORCHVISION_PREFIX) :] not in torchvision_model_names():
            raise PartitionError(f"unknown model {name!r} (not one of torchvision's classifiers){_hint(name)}")
    elif not timm.is_model(name):
        raise PartitionError(f"unknown model {name!r} (not in timm's registry){_hint(name)}")


def _architecture(name: str, num_classes: int, in_chans: int, img_size: int | None) -> torch.nn.Module:
    """The randomly initialised model ``name`` (timm's, or torchvision's with the prefix)."""
    check_model_name(name)
    if name.startswith(HF_PREFIX):
        return build_hf_model(name, num_classes, in_chans, img_size)
    if name.startswith(TORCHVISION_PREFIX):
        return build_torchvision_model(name[len(TORCHVISION_PREFIX) :], num_classes, in_chans, img_size)
    kwargs: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_chans}
    if img_size is not None:
        try:  # transformers need the image size; most CNNs do not take the argument
            return timm.create_model(name, img_size=img_size, **kwargs)
        except TypeError as e:
            if "img_size" not in str(e):
                raise
    return timm.create_model(name, **kwargs)


def _hint(name: str) -> str:
    close = similar_model_names(name)
    return f"; did you mean {', '.join(close)}?" if close else ""


def similar_model_names(name: str, count: int = 5) -> list[str]:
    """Up to ``count`` names in timm's registry (the shipped models included) like ``name``: the closest by
    ``difflib`` alternating with the shortest that start with it, best first. A ``torchvision:`` name is
    matched against torchvision's classifiers instead; a plain name of one of them gets its prefixed name first.

    >>> similar_model_names("resnet10tt")[0], similar_model_names("FIXUP_RESNET8")[0]
    ('resnet10t', 'fixup_resnet8')
    >>> "vit_tiny_patch16_224" in similar_model_names("vit_tiny")
    True
    >>> similar_model_names("torchvision:mobilenet_v3_smal")[0], similar_model_names("mobilenet_v3_small")[0]
    ('torchvision:mobilenet_v3_small', 'torchvision:mobilenet_v3_small')
    """
    query = name.strip().lower()
    if query.startswith(TORCHVISION_PREFIX):
        found = _similar_names(query[len(TORCHVISION_PREFIX) :], torchvision_model_names(), count)
        return [TORCHVISION_PREFIX + n for n in found]
    # a torchvision name without its prefix (plain names are timm's): the prefixed name first
    exact = [TORCHVISION_PREFIX + query] if query in torchvision_model_names() else []
    return [*exact, *_similar_names(query, timm.list_models(), count)][:count]


def _similar_names(query: str, names: list[str], count: int) -> list[str]:
    """Up to ``count`` of ``names`` like ``query``: the closest by ``difflib`` alternating with the shortest that
    start with it, best first."""
    close = difflib.get_close_matches(query, names, n=count, cutoff=0.6)
    prefixed = sorted((n for n in names if query and n.startswith(query)), key=len)[:count]
    merged = [n for pair in zip_longest(close, prefixed) for n in pair if n is not None]
    return list(dict.fromkeys(merged))[:count]
