"""CIFAR Wide-ResNet-N-D (Zagoruyko & Komodakis, 2016): pre-activation blocks, three stages of
(16D, 32D, 64D) channels, (N-4)/6 blocks per stage, with BatchNorm or GroupNorm.

>>> import timm, torch, partition_fx
>>> timm.create_model("cifar_wrn16_4", num_classes=10)(torch.randn(2, 3, 32, 32)).shape
torch.Size([2, 10])
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from ..errors import PartitionArgumentError
from .fixup import cifar_cfg


def _norm(kind: str, groups: int) -> type[nn.Module] | partial[nn.Module]:
    if kind == "batchnorm":
        return nn.BatchNorm2d
    if kind == "groupnorm":
        return partial(nn.GroupNorm, groups)  # type: ignore[return-value]
    raise PartitionArgumentError(f"norm must be 'batchnorm' or 'groupnorm', got {kind!r}")


class PreActBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int, norm, drop_rate: float) -> None:
        super().__init__()
        self.norm1 = norm(in_channels)
        self.act = nn.ReLU(inplace=False)
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.norm2 = norm(channels)
        self.drop = nn.Dropout(drop_rate)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False)
            if stride != 1 or in_channels != channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.act(self.norm1(x))
        identity = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = self.conv2(self.drop(self.act(self.norm2(out))))
        return out + identity


class CifarWideResNet(nn.Module):
    """Wide-ResNet-``depth``-``width`` for 32x32 inputs; ``depth`` is 6n+4."""

    def __init__(
        self,
        depth: int = 16,
        width: int = 4,
        num_classes: int = 10,
        in_chans: int = 3,
        norm: str = "batchnorm",
        gn_groups: int = 2,
        drop_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if (depth - 4) % 6 != 0 or depth < 10:
            raise PartitionArgumentError(
                f"Wide-ResNet depth must be 6n+4 with n >= 1 (10, 16, 22, 28, ...), got {depth}"
            )
        norm_layer = _norm(norm, gn_groups)
        n = (depth - 4) // 6
        widths = (16 * width, 32 * width, 64 * width)
        self.num_classes = num_classes
        self.num_features = widths[-1]
        self.conv1 = nn.Conv2d(in_chans, 16, 3, padding=1, bias=False)
        stages = []
        in_channels = 16
        for i, channels in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(PreActBlock(in_channels, channels, 2 if i > 0 and j == 0 else 1, norm_layer, drop_rate))
                in_channels = channels
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.norm = norm_layer(widths[-1])
        self.act = nn.ReLU(inplace=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[-1], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.fc.bias)

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        return self.act(self.norm(x))

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(x).flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


_VARIANTS: dict[str, dict[str, Any]] = {
    "cifar_wrn16_4": dict(depth=16, width=4),
    "cifar_wrn16_8": dict(depth=16, width=8),
    "cifar_wrn28_2": dict(depth=28, width=2),
    "cifar_wrn28_10": dict(depth=28, width=10),
    "cifar_wrn16_4_gn": dict(depth=16, width=4, norm="groupnorm"),
    "cifar_wrn28_10_gn": dict(depth=28, width=10, norm="groupnorm"),
}
default_cfgs = generate_default_cfgs({name: cifar_cfg() for name in _VARIANTS})


def _create(variant: str, pretrained: bool, **kwargs: Any) -> CifarWideResNet:
    return build_model_with_cfg(CifarWideResNet, variant, pretrained, **{**_VARIANTS[variant], **kwargs})


@register_model
def cifar_wrn16_4(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-16-4 with BatchNorm."""
    return _create("cifar_wrn16_4", pretrained, **kwargs)


@register_model
def cifar_wrn16_8(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-16-8 with BatchNorm."""
    return _create("cifar_wrn16_8", pretrained, **kwargs)


@register_model
def cifar_wrn28_2(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-28-2 with BatchNorm."""
    return _create("cifar_wrn28_2", pretrained, **kwargs)


@register_model
def cifar_wrn28_10(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-28-10 with BatchNorm."""
    return _create("cifar_wrn28_10", pretrained, **kwargs)


@register_model
def cifar_wrn16_4_gn(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-16-4 with GroupNorm (2 groups), usable with per-example batches."""
    return _create("cifar_wrn16_4_gn", pretrained, **kwargs)


@register_model
def cifar_wrn28_10_gn(pretrained: bool = False, **kwargs: object) -> CifarWideResNet:
    """WRN-28-10 with GroupNorm (2 groups)."""
    return _create("cifar_wrn28_10_gn", pretrained, **kwargs)
