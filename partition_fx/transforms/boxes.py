"""``BoxZoom``: a learned zoom for object detection, applied to the images and their boxes alike."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._validation import check_real
from ..datasets.images import zoom_images
from ..errors import PartitionArgumentError
from .base import HyperparameterModule, Widenable

Target = dict[str, Any]
"""A detection target as torchvision's models take it: ``boxes`` [N, 4] (x1, y1, x2, y2, pixels), ``labels``
[N], other keys kept as they are."""


class BoxZoom(Widenable, HyperparameterModule):
    """Zoom each image about its centre by exp(s), s ~ U(-r, r) with the range r learned, and move its target's
    boxes with it (the boxes keep covering their objects): the augmentation of a detection model trained with
    ``training.ModelLoss``. The draw is reparametrised (s = r * eps), so the images carry a gradient to r;
    boxes are clipped to the image, and a box left with less than ``min_size`` pixels of width or height is
    dropped with its label (and any other per-box entry of the target). Eval mode: the identity.

    ``init`` is the starting range, ``max_range`` its bound (default log 2: zooms of 1/2 to 2). The images are
    a list of [C, H, W] tensors (sizes may differ) or one [B, C, H, W] batch; the output is the same form.

    >>> zoom = BoxZoom(init=0.5)
    >>> images = [torch.rand(3, 32, 32)]
    >>> targets = [{"boxes": torch.tensor([[8.0, 8.0, 24.0, 24.0]]), "labels": torch.tensor([1])}]
    >>> out, moved = zoom.transform(images, targets, torch.tensor([1.0]))  # eps = 1: a zoom of e^0.5
    >>> [round(v, 2) for v in moved[0]["boxes"][0].tolist()]  # about the centre (16, 16), clipped to 32
    [2.81, 2.81, 29.19, 29.19]
    """

    def __init__(self, init: float = 0.0, max_range: float = math.log(2.0), min_size: float = 1.0) -> None:
        super().__init__()
        init, max_range = check_real("init", init), check_real("max_range", max_range)
        if not 0 <= init <= max_range:
            raise PartitionArgumentError(f"BoxZoom's init must lie in [0, max_range={max_range:g}], got {init}")
        self.range = nn.Parameter(torch.tensor(float(init)))
        self.max_range = max_range
        self.min_size = min_size

    def hyperparameters(self) -> dict[str, float | list[float]]:
        return {"zoom": float(self.range.detach())}

    def constrain_(self) -> None:
        with torch.no_grad():
            self.range.clamp_(0.0, self.max_range)

    def forward(
        self, images: Sequence[torch.Tensor] | torch.Tensor, targets: Sequence[Target]
    ) -> tuple[Any, list[Target]]:
        if not self.training:
            return images, list(targets)
        eps = torch.rand(len(images), device=self.range.device) * 2 - 1
        return self.transform(images, targets, eps * self._spread)

    def transform(
        self, images: Sequence[torch.Tensor] | torch.Tensor, targets: Sequence[Target], eps: torch.Tensor
    ) -> tuple[Any, list[Target]]:
        """The zoom of coefficients ``eps`` (one per image; the log-zoom is range * eps) of the images and their
        targets."""
        if len(images) != len(targets) or len(eps) != len(images):
            raise PartitionArgumentError(
                f"BoxZoom needs one target and one coefficient per image, got {len(images)} images, "
                f"{len(targets)} targets and {len(eps)} coefficients"
            )
        log_zooms = self.range * eps.to(self.range.device)
        out_images, out_targets = [], []
        for image, target, log_zoom in zip(images, targets, log_zooms):
            out_images.append(zoom_images(image.unsqueeze(0), log_zoom.view(1))[0])
            out_targets.append(_moved(target, log_zoom.exp(), image.shape[-1], image.shape[-2], self.min_size))
        if isinstance(images, torch.Tensor):
            return torch.stack(out_images), out_targets
        return out_images, out_targets


def _moved(target: Target, zoom: torch.Tensor, width: int, height: int, min_size: float) -> Target:
    boxes = target["boxes"]
    centre = boxes.new_tensor([width / 2, height / 2, width / 2, height / 2])
    moved = (boxes - centre) * zoom.to(boxes.dtype) + centre
    limits = boxes.new_tensor([width, height, width, height])
    moved = torch.minimum(moved.clamp(min=0), limits)
    kept = ((moved[:, 2] - moved[:, 0]) >= min_size) & ((moved[:, 3] - moved[:, 1]) >= min_size)
    count = boxes.shape[0]
    out = {
        key: value[kept] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == count else value
        for key, value in target.items()
    }
    out["boxes"] = moved[kept]
    return out
