"""The model of a federated run: the paper's MNIST CNN (table 9) with learned dropout, or a model of the
registry normalised without running statistics (GroupNorm, as the paper's CIFAR ResNet-9), partitioned, with
learned affine augmentation as psi. Every client and the server build the same one from the run's config."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import nn

from .. import partitionify
from ..errors import PartitionArgumentError
from ..fx.partitioned_model import PartitionedModel
from ..training import Categorical
from ..training.objective.objective import running_norms
from ..transforms import AffineAugmentation, ConcreteDropout
from .config import FederatedConfig


class FederatedModel(NamedTuple):
    """The partitioned model, its likelihood and its input transform (psi's augmentation)."""

    pmodel: PartitionedModel
    likelihood: Categorical
    hyper: AffineAugmentation


def federated_cnn(in_chans: int = 1, image_size: int = 28, num_classes: int = 10, dropout: float = 0.1) -> nn.Module:
    """The MNIST CNN of the paper's table 9 (Schwoebel et al. 2021) with ``ConcreteDropout(dropout)`` after each
    hidden layer, as in its federated experiments (appendix J.2). Its layers are named, so the learned rates
    are reported as ``dropout1.p`` .. ``dropout4.p`` (and the exported weights as ``conv1.weight``, ...).

    >>> federated_cnn(image_size=16)(torch.zeros(2, 1, 16, 16)).shape
    torch.Size([2, 10])
    >>> [name for name, m in federated_cnn().named_modules() if isinstance(m, ConcreteDropout)]
    ['dropout1', 'dropout2', 'dropout3', 'dropout4']
    """
    side = image_size // 4
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(in_chans, 20, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("dropout1", ConcreteDropout(dropout)),
        ("conv2", nn.Conv2d(20, 50, 5, padding=2)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("dropout2", ConcreteDropout(dropout)), ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(50 * side * side, 500)), ("relu3", nn.ReLU()), ("dropout3", ConcreteDropout(dropout)),
        ("fc2", nn.Linear(500, 50)), ("relu4", nn.ReLU()), ("dropout4", ConcreteDropout(dropout)),
        ("fc3", nn.Linear(50, num_classes)),
    ]))  # fmt: skip


def build_federated_model(config: FederatedConfig, input_shape: tuple[int, ...], num_classes: int) -> FederatedModel:
    """``config``'s model for inputs of ``input_shape`` (C, H, W), the same on every call (seeded by
    ``config.seed``): partitioned into ``config.proportions`` with the rotation range starting at
    ``config.rotation_init``; with ``learn_hyperparameters=False`` (the baselines) psi frozen there (the rotation
    range at ``rotation_init``, no other augmentation) and dropout at its initial rate.

    A model with running statistics (BatchNorm) is refused: FedAdam aggregates parameters, and each client's
    statistics would describe its own skewed data.

    >>> config = FederatedConfig(image_size=8)
    >>> model = build_federated_model(config, (1, 8, 8), 10)
    >>> model.pmodel.num_partitions, round(model.hyper.hyperparameters()["rotation"], 4)
    (3, 1.5708)
    >>> build_federated_model(FederatedConfig(model="resnet10t"), (1, 16, 16), 10)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: model 'resnet10t' keeps running statistics (BatchNorm2d at conv1.1): ...
    """
    torch.manual_seed(config.seed)
    in_chans, size = input_shape[0], input_shape[-1]
    if config.model == "cnn":
        model = federated_cnn(in_chans, size, num_classes)
    else:
        from ..models import build_model

        model = build_model(config.model, num_classes, in_chans=in_chans, img_size=size)
    _refuse_running_statistics(model, config.model)
    pmodel = partitionify(model, len(config.proportions), config.proportions, seed=config.seed)
    hyper = AffineAugmentation(num_samples=config.samples, init={"rotation": config.rotation_init})
    if not config.learn_hyperparameters:
        for module in (hyper, *(m for _, m in pmodel.hyperparameter_modules())):
            module.requires_grad_(False)
    return FederatedModel(pmodel, Categorical(), hyper)


def _refuse_running_statistics(model: nn.Module, name: str) -> None:
    modules = running_norms(model)
    if modules:
        where = next(n for n, m in model.named_modules() if m is modules[0])
        raise PartitionArgumentError(
            f"model {name!r} keeps running statistics ({type(modules[0]).__name__} at {where}): federated training "
            "averages parameters only, and each client's statistics would describe its own skewed data; use a "
            "model with GroupNorm (as the paper's CIFAR ResNet-9), e.g. 'cifar_wrn16_4_gn', or the default 'cnn'"
        )


__all__ = ["FederatedModel", "build_federated_model", "federated_cnn"]
