"""The model zoo the conversion is tested on: how to build each model small, and why any is excluded.

``TORCHVISION`` holds every torchvision classification model; ``TIMM`` one small model from each timm
family (module) that has one; ``SHIPPED`` this project's own models. ``DEFAULT_SUBSET`` is what CI runs;
the rest runs with ``pytest -m zoo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ZooModel:
    source: str  # "torchvision", "timm"
    name: str
    input_size: int = 64
    kwargs: dict[str, Any] = field(default_factory=dict)
    onnx: bool = False

    @property
    def id(self) -> str:
        return f"{self.source}:{self.name}"

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        if self.source == "torchvision":
            import torchvision

            return torchvision.models.get_model(self.name, weights=None, num_classes=10, **self.kwargs)
        import timm

        import partition_fx  # noqa: F401  (registers the shipped models)

        return timm.create_model(self.name, pretrained=False, num_classes=10, **self.kwargs)

    def example_input(self, batch: int = 2) -> torch.Tensor:
        g = torch.Generator().manual_seed(1)
        return torch.randn(batch, 3, self.input_size, self.input_size, generator=g)
