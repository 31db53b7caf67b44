"""Small models that exercise one conversion feature each."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class TiedLM(nn.Module):
    """Embedding and output projection share one weight."""

    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(tokens)))


class FunctionalWeights(nn.Module):
    """Parameters used directly in forward (fx get_attr), a module called twice, a scalar scale."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4))
        self.bias = nn.Parameter(torch.randn(5))
        self.pos = nn.Parameter(torch.randn(1, 4))
        self.gain = nn.Parameter(torch.full((1,), 1.5))
        self.shared = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x + self.pos, self.weight, self.bias)
        h = self.shared(torch.tanh(self.shared(h)))
        return h * self.gain


class ConvBN(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(h.mean((2, 3))))


class TrainingDependentRoot(nn.Module):
    """The model's own forward branches on ``self.training`` (like torchvision's Inception)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.aux = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor):
        h = self.a(x)
        if self.training:
            return h, self.aux(h)
        return h


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Branchy()
        self.out = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: fx cannot trace this
            return self.lin(x)
        return -self.lin(x)


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers[:-1])


class SharedSubmodule(nn.Module):
    """One submodule reachable under several paths (as timm's CoaT shares its positional encoders)."""

    def __init__(self, width: int = 6, depth: int = 8) -> None:
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width))
        self.blocks = nn.ModuleList(UsesShared(self.shared, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.shared(x)


class UsesShared(nn.Module):
    def __init__(self, shared: nn.Module, width: int) -> None:
        super().__init__()
        self.shared = shared
        self.own = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.own(self.shared(x)))


class InPlaceOps(nn.Module):
    """In-place activations and in-place arithmetic on activations with parameters (not on parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.act = nn.ReLU(inplace=True)
        self.shift = nn.Parameter(torch.randn(6))
        self.gain = nn.Parameter(torch.tensor(2.0))
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.bn(self.fc(x)))
        h += self.shift
        h.mul_(self.gain)
        F.leaky_relu(h, inplace=True)
        h = self.out(h)
        h.add_(1.0)
        return h


class WeightClipping(nn.Module):
    """Updates its own parameter in place inside forward (weight clipping)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.weight.data.clamp_(-0.1, 0.1)
        return self.fc(x)


class MixedPrecision(nn.Module):
    """A float32 body and a float64 head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Tanh())
        self.head = nn.Linear(8, 3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).double())


def small_cnn() -> nn.Sequential:
    """Conv, BatchNorm, ReLU, Linear on 1x8x8 images into 3 classes (seeded): a quick model to train."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3))


def small_images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random 1x8x8 images in [0, 1) and labels in 0..2, for ``small_cnn``."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def small_partitioned_cnn(seed: int = 0, proportions: tuple[float, ...] = (0.5, 0.3, 0.2)) -> Any:
    """:func:`small_cnn`'s architecture, seeded by ``seed``, in 3 partitions with ``proportions``."""
    from partition_fx import partitionify

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3))
    return partitionify(model, 3, proportions, seed=seed)


def gradient_step_trainer(**options: Any) -> Any:
    """A trainer of :func:`small_partitioned_cnn` on 60 :func:`small_images` with the paper's configuration, whose
    optimisers are SGD with lr 1 (new = old - grad: each update is the gradient); ``options`` change it."""
    from functools import partial

    from partition_fx.job.train_config import TrainConfig
    from partition_fx.training import PartitionedTrainer
    from partition_fx.transforms import AffineAugmentation

    sgd = partial(torch.optim.SGD, lr=1.0)
    defaults = {"hyper": AffineAugmentation(num_samples=2, init=0.3), "optimizer": sgd, "hyper_optimizer": sgd}
    config = TrainConfig.paper()
    return PartitionedTrainer(
        small_partitioned_cnn(), small_images(60), config, **{"batch_size": 8, "seed": 5, **defaults, **options}
    )
