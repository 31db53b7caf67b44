"""torchvision's image classifiers by name, for any number of classes, input channels and (where possible) image
size: ``torchvision.models.get_model`` without weights, the stem adapted to other channel counts as timm's
``in_chans`` is, and a model that cannot run on the data refused in one line."""

from __future__ import annotations

from typing import Any

import torch
import torchvision
from timm.models import adapt_input_conv

from ..errors import PartitionError, is_out_of_memory, shortened

TORCHVISION_PREFIX = "torchvision:"
"""A ``--model`` name with this prefix is torchvision's (``torchvision:mobilenet_v3_small``); without, timm's."""

_NO_AUXILIARY = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}
"""Training uses no auxiliary classifier: without them the model returns plain logits."""


def torchvision_model_names() -> list[str]:
    """torchvision's image classifiers (``torchvision.models.list_models(module=torchvision.models)``).

    >>> "mobilenet_v3_small" in torchvision_model_names(), "fasterrcnn_resnet50_fpn" in torchvision_model_names()
    (True, False)
    """
    return torchvision.models.list_models(module=torchvision.models)


def build_torchvision_model(
    name: str, num_classes: int, in_chans: int = 3, img_size: int | None = None
) -> torch.nn.Module:
    """torchvision's classifier ``name`` (randomly initialised) with ``num_classes`` outputs for ``in_chans``
    input channels: the first conv's weights adapted from 3 channels by ``timm.models.adapt_input_conv`` (sum
    for 1 channel, repeat and scale otherwise). ``img_size``, when given, is passed to the vision transformers
    (``models.build_model`` checks that the model runs on such images).

    >>> build_torchvision_model("mobilenet_v3_small", 10, in_chans=1)(torch.zeros(2, 1, 32, 32)).shape
    torch.Size([2, 10])
    """
    if name not in torchvision_model_names():
        raise PartitionError(f"unknown model {TORCHVISION_PREFIX}{name} (not one of torchvision's classifiers)")
    kwargs: dict[str, Any] = {"num_classes": num_classes, **_NO_AUXILIARY.get(name, {})}
    if img_size is not None and name.startswith("vit_"):
        kwargs["image_size"] = img_size
    elif img_size is not None and name.startswith("maxvit_"):
        kwargs["input_size"] = (img_size, img_size)
    try:
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    except Exception as e:
        if is_out_of_memory(e):
            raise
        detail = f"{type(e).__name__}: {shortened(str(e) or type(e).__name__, 160)}"
        raise PartitionError(
            f"{TORCHVISION_PREFIX}{name} cannot be built for {num_classes} classes"
            + (f" at {img_size}x{img_size}" if img_size is not None else "")
            + f" ({detail}); choose another --model or --image-size"
        ) from e
    if in_chans != 3:
        _adapt_stem(model, in_chans)
    return model


def _adapt_stem(model: torch.nn.Module, in_chans: int) -> None:
    """Replace the first ``Conv2d`` by one taking ``in_chans`` channels, its weights adapted from the original's."""
    stem_name, stem = next((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d))
    # A Conv2d's sizes are pairs; torch annotates the attributes as tuple[int, ...] (its _ConvNd's).
    new = torch.nn.Conv2d(
        in_chans,
        stem.out_channels,
        stem.kernel_size,  # type: ignore[arg-type]
        stem.stride,  # type: ignore[arg-type]
        stem.padding,  # type: ignore[arg-type]
        stem.dilation,  # type: ignore[arg-type]
        stem.groups,
        stem.bias is not None,
        stem.padding_mode,
    )
    with torch.no_grad():
        new.weight.copy_(adapt_input_conv(in_chans, stem.weight))
        if stem.bias is not None and new.bias is not None:  # new has a bias where stem has
            new.bias.copy_(stem.bias)
    model.set_submodule(stem_name, new)
