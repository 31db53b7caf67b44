"""What can make training go wrong: non-finite losses and gradients (found and named), and parameters left
unpartitioned (warned about)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import nn

from ..errors import first_names
from ..partitioned_model import PartitionedModel


def gradient_norm(params: list[torch.Tensor]) -> float:
    """The total 2-norm of the gradients that exist (0.0 when none does)."""
    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def nonfinite_problem(value: float, params: list[torch.Tensor], names: Callable[[], dict[int, str]]) -> str | None:
    """None if ``value`` and the gradients of ``params`` are finite, else what is not, e.g.
    ``gradient norm nan (in 0.weight partition 2, mask.logits)``. ``names()`` maps ``id(tensor)`` to a name;
    it is called only when something is not finite (every step runs this check).

    Example::

        >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([1.0, float("nan")])
        >>> nonfinite_problem(0.5, [p], lambda: {id(p): "w"})
        'gradient norm nan (in w)'
    """
    if not math.isfinite(value):
        return f"loss {value}"
    norm = gradient_norm(params)
    if math.isfinite(norm):
        return None
    named = names()
    bad = [named.get(id(p), "?") for p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
    return f"gradient norm {norm} (in {first_names(bad)})"


def _parameter_names(pmodel: PartitionedModel, hyper: nn.Module | None, likelihood: nn.Module | None) -> dict[int, str]:
    """``id(parameter) -> name`` for the model's own parameters and the hyperparameter modules'."""
    names = {id(p): n.removeprefix("module.") for n, p in pmodel.named_parameters()}
    for prefix, m in (("hyper", hyper), ("likelihood", likelihood)):
        if m is not None:
            names.update((id(p), f"{prefix}.{n}") for n, p in m.named_parameters())
    return names


def tensor_names(pmodel: PartitionedModel, hyper: nn.Module | None, likelihood: nn.Module | None) -> dict[int, str]:
    """``id(tensor) -> name`` for every trainable tensor: ``0.weight partition 2``, ``hyper.logits``, ..."""
    names = _parameter_names(pmodel, hyper, likelihood)
    shared: dict[int, list[str]] = {}  # a flat group's part: the members whose share of its gradient is bad
    for name, pt in pmodel.partitioned_tensors():
        for k in range(1, pt.num_partitions + 1):
            storage = pt.storage(k)
            if storage is pt.part(k):
                names[id(storage)] = f"{name} partition {k}"
                continue
            grad = pt.part_grad(k)
            bad = grad is not None and not torch.isfinite(grad).all()
            shared.setdefault(id(storage), [])
            if bad:
                shared[id(storage)].append(name)
                names[id(storage)] = ", ".join(f"{bad_name} partition {k}" for bad_name in shared[id(storage)])
    return names


def storage_names(pmodel: PartitionedModel, hyper: nn.Module | None, likelihood: nn.Module | None) -> dict[int, str]:
    """``id(tensor) -> name`` for every trainable tensor once its gradient is gone (a lazy check): a flat
    group's storage of partition k is named by its members, ``0.weight, 0.bias and 4 more partition 2``."""
    names = _parameter_names(pmodel, hyper, likelihood)
    members: dict[int, tuple[int, list[str]]] = {}
    for name, pt in pmodel.partitioned_tensors():
        for k in range(1, pt.num_partitions + 1):
            storage = pt.storage(k)
            if storage is pt.part(k):
                names[id(storage)] = f"{name} partition {k}"
            else:
                members.setdefault(id(storage), (k, []))[1].append(name)
    for key, (k, held) in members.items():
        names[key] = f"{first_names(held, 2)} partition {k}"
    return names


def warn_about_shared_parameters(pmodel: PartitionedModel) -> None:
    """Warn about trainable parameters a config left unpartitioned: they bias the LML's first term."""
    shared = [
        r.names[0]
        for r in pmodel.records
        if r.treatment == "shared" and pmodel.module.get_parameter(r.names[0]).requires_grad
    ]
    if shared:
        warnings.warn(
            f"{len(shared)} parameter(s) left unpartitioned by the config ({', '.join(shared[:3])}"
            f"{', ...' if len(shared) > 3 else ''}) train with partition 1 on D_1 but are used by every "
            "subnetwork, including subnetwork 0 that scores D_1: the LML's first term is then biased. "
            "Freeze them (requires_grad=False) or partition them for an unbiased LML.",
            stacklevel=4,
        )
