"""The model factory of the command line and the benchmarks: a timm model by name, optionally with weights
from a local file, with every failure a :class:`~partition_fx.errors.PartitionError` naming the option."""

from __future__ import annotations

import difflib
from itertools import zip_longest
from pathlib import Path
from typing import Any

import timm
import torch

from ..errors import PartitionError, is_out_of_memory


def build_model(
    name: str, num_classes: int, checkpoint: str | None = None, in_chans: int = 3, img_size: int | None = None
) -> torch.nn.Module:
    """A timm model by name (the shipped FixUp/WRN models included), optionally with weights from ``checkpoint``,
    a local safetensors or torch file (nothing is downloaded).

    ``img_size`` is passed to models that take it (transformers need it) and ignored by the others.

    >>> model = build_model("fixup_resnet8", num_classes=10, in_chans=1)
    >>> model(torch.zeros(2, 1, 16, 16)).shape
    torch.Size([2, 10])
    >>> build_model("no_such_net", 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'no_such_net' (not in timm's registry)
    >>> build_model("resnet10", 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown model 'resnet10' (not in timm's registry); did you mean resnet10t, ...
    """
    if not timm.is_model(name):
        close = similar_model_names(name)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise PartitionError(f"unknown model {name!r} (not in timm's registry){hint}")
    kwargs: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_chans}
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            raise PartitionError(f"--checkpoint {checkpoint!r} is not a file")
        kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint), num_classes=num_classes))
    try:
        if img_size is not None:
            try:  # transformers need the image size; most CNNs do not take the argument
                return timm.create_model(name, img_size=img_size, **kwargs)
            except TypeError as e:
                if "img_size" not in str(e):
                    raise
        return timm.create_model(name, **kwargs)
    except Exception as e:
        if checkpoint is None or is_out_of_memory(e):
            raise
        # unreadable file, not a state dict, or weights of another architecture (a long multi-line list of keys)
        detail = " ".join(str(e).split())
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        raise PartitionError(
            f"--checkpoint {checkpoint!r} cannot be loaded into {name}: {type(e).__name__}: {detail}"
        ) from e


def similar_model_names(name: str, count: int = 5) -> list[str]:
    """Up to ``count`` names in timm's registry (the shipped models included) like ``name``: the closest by
    ``difflib`` alternating with the shortest that start with it, best first.

    >>> similar_model_names("resnet10tt")[0], similar_model_names("FIXUP_RESNET8")[0]
    ('resnet10t', 'fixup_resnet8')
    >>> "vit_tiny_patch16_224" in similar_model_names("vit_tiny")
    True
    """
    query = name.strip().lower()
    names = timm.list_models()
    close = difflib.get_close_matches(query, names, n=count, cutoff=0.6)
    prefixed = sorted((n for n in names if query and n.startswith(query)), key=len)[:count]
    merged = [n for pair in zip_longest(close, prefixed) for n in pair if n is not None]
    return list(dict.fromkeys(merged))[:count]
