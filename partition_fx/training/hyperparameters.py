"""Which tensors are hyperparameters (psi), and their values as plain numbers for reports."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import PartitionArgumentError
from ..partitioned_model import PartitionedModel
from ..transforms.base import HyperparameterModule, outermost_hyperparameter_modules


def hyperparameter_modules(
    pmodel: PartitionedModel, hyper: nn.Module | None, likelihood: nn.Module | None
) -> list[tuple[str, HyperparameterModule]]:
    """Every hyperparameter module (in the input transform, in the model, the likelihood) with the prefix
    its values are reported under.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.transforms import InputMask
        >>> pmodel = partitionify(torch.nn.Linear(4, 2), 2)
        >>> [(prefix, type(m).__name__) for prefix, m in hyperparameter_modules(pmodel, InputMask(4), None)]
        [('', 'InputMask')]
    """
    found = outermost_hyperparameter_modules(hyper)
    found += pmodel.hyperparameter_modules()
    if isinstance(likelihood, HyperparameterModule):
        found.append(("", likelihood))
    return found


def hyperparameter_values(modules: list[tuple[str, HyperparameterModule]]) -> dict[str, Any]:
    """The modules' hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
    values: dict[str, Any] = {}
    for prefix, m in modules:
        for key, value in m.hyperparameters().items():
            values[f"{prefix}.{key}" if prefix else key] = value
    return values


def collect_hyperparameters(
    pmodel: PartitionedModel, hyper: nn.Module | None, likelihood: nn.Module | None
) -> list[nn.Parameter]:
    """psi: the trainable parameters of the model's hyperparameter modules, of ``hyper`` and of the
    likelihood, each once; refused if one is also a model parameter (it would be stepped twice)."""
    seen: dict[int, nn.Parameter] = {}
    for _, m in pmodel.hyperparameter_modules():
        seen.update((id(p), p) for p in m.parameters() if p.requires_grad)
    for m in (hyper, likelihood):
        if m is not None:
            seen.update((id(p), p) for p in m.parameters() if p.requires_grad)
    model_params = {id(p) for k in range(1, pmodel.num_partitions + 1) for p in pmodel.partition_parameters(k)}
    if model_params & seen.keys():
        raise PartitionArgumentError("a hyperparameter is also a model parameter; hyper modules must be separate")
    return list(seen.values())
