"""FixUp ResNets for 32x32 inputs (Zhang et al., 2019), as used in the partitioned-networks paper.

Three stages of (16, 32, 64) channels with depth 6n+2 (n basic blocks per stage), no normalisation:
scalar biases before every convolution and activation and a scalar multiplier per residual branch,
the branch's last convolution and the classifier initialised to zero, and parameter-free shortcuts
(strided 1x1 average pooling, then zero channels) in downsampling blocks.

>>> import timm, torch, partition_fx
>>> timm.create_model("fixup_resnet8", num_classes=10)(torch.randn(2, 3, 32, 32)).shape
torch.Size([2, 10])
"""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn
from torch.nn import functional as F

from ..errors import PartitionArgumentError


class FixupBasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int, num_residual_layers: int) -> None:
        super().__init__()
        self.bias1a = nn.Parameter(torch.zeros(1))
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bias1b = nn.Parameter(torch.zeros(1))
        self.act = nn.ReLU(inplace=True)
        self.bias2a = nn.Parameter(torch.zeros(1))
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.bias2b = nn.Parameter(torch.zeros(1))
        self.downsample = nn.AvgPool2d(1, stride=stride) if stride != 1 or in_channels != channels else None
        self.extra_channels = channels - in_channels
        # FixUp: He init scaled by L^(-1/(2m-2)) with m=2 layers per branch; the branch's last layer is zero.
        fan_out = self.conv1.weight.shape[0] * math.prod(self.conv1.weight.shape[2:])
        nn.init.normal_(self.conv1.weight, 0.0, math.sqrt(2.0 / fan_out) * num_residual_layers**-0.5)
        nn.init.zeros_(self.conv2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x + self.bias1a
        out = self.act(self.conv1(shifted) + self.bias1b)
        out = self.conv2(out + self.bias2a)
        out = out * self.scale + self.bias2b
        identity = x
        if self.downsample is not None:
            identity = self.downsample(shifted)
            identity = F.pad(identity, (0, 0, 0, 0, 0, self.extra_channels))  # zero channels
        return self.act(out + identity)


class FixupResNet(nn.Module):
    """CIFAR-style FixUp ResNet; ``depth`` is 6n+2 (8, 14, 20, 26, ...)."""

    def __init__(self, depth: int = 14, num_classes: int = 10, in_chans: int = 3, widths=(16, 32, 64)) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0 or depth < 8:
            raise PartitionArgumentError(
                f"FixUp ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, 26, ...), got {depth}"
            )
        blocks_per_stage = (depth - 2) // 6
        self.num_classes = num_classes
        self.num_features = widths[-1]
        self.conv1 = nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False)
        self.bias1 = nn.Parameter(torch.zeros(1))
        self.act = nn.ReLU(inplace=True)
        stages = []
        in_channels = widths[0]
        for i, channels in enumerate(widths):
            blocks = []
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(FixupBasicBlock(in_channels, channels, stride, blocks_per_stage * len(widths)))
                in_channels = channels
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.bias2 = nn.Parameter(torch.zeros(1))
        self.fc = nn.Linear(widths[-1], num_classes)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        fan_out = self.conv1.weight.shape[0] * 9
        nn.init.normal_(self.conv1.weight, 0.0, math.sqrt(2.0 / fan_out))

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.conv1(x) + self.bias1)
        return self.layer3(self.layer2(self.layer1(x)))

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(x).flatten(1) + self.bias2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def cifar_cfg(**kwargs: object) -> dict[str, object]:
    """timm's pretrained config of the shipped CIFAR-sized models (10 classes, 3x32x32, CIFAR-10 statistics)."""
    return {
        "num_classes": 10,
        "input_size": (3, 32, 32),
        "pool_size": (8, 8),
        "mean": (0.4914, 0.4822, 0.4465),
        "std": (0.2470, 0.2435, 0.2616),
        "first_conv": "conv1",
        "classifier": "fc",
        "license": "apache-2.0",
        **kwargs,
    }


default_cfgs = generate_default_cfgs({f"fixup_resnet{d}": cifar_cfg() for d in (8, 14, 20, 26)})


def _create(variant: str, depth: int, pretrained: bool, **kwargs: Any) -> FixupResNet:
    return build_model_with_cfg(FixupResNet, variant, pretrained, depth=depth, **kwargs)


@register_model
def fixup_resnet8(pretrained: bool = False, **kwargs: object) -> FixupResNet:
    """FixUp ResNet-8 (1 block per stage)."""
    return _create("fixup_resnet8", 8, pretrained, **kwargs)


@register_model
def fixup_resnet14(pretrained: bool = False, **kwargs: object) -> FixupResNet:
    """FixUp ResNet-14 (2 blocks per stage)."""
    return _create("fixup_resnet14", 14, pretrained, **kwargs)


@register_model
def fixup_resnet20(pretrained: bool = False, **kwargs: object) -> FixupResNet:
    """FixUp ResNet-20 (3 blocks per stage)."""
    return _create("fixup_resnet20", 20, pretrained, **kwargs)


@register_model
def fixup_resnet26(pretrained: bool = False, **kwargs: object) -> FixupResNet:
    """FixUp ResNet-26 (4 blocks per stage)."""
    return _create("fixup_resnet26", 26, pretrained, **kwargs)
