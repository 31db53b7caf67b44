"""How ``partitionify`` treats each parameter tensor: left whole (hyperparameter, excluded by config, frozen)
or partitioned, and how: random-weight, the scheme's kind for output units of conv/linear layers (node), or
product/sum copies for norm affines and scalar scales and biases (appendix I.2 of the paper). The kinds, and
the tensor class that builds each, are ``partition_fx.fx.kinds``'s.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

from ..transforms.base import HyperparameterModule
from .assign import name_salt
from .config import PartitionConfig
from .kinds import partition_kind
from .params import PartitionedTensor
from .records import ParameterRecord

_NORM_TYPES: tuple[type, ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
_MULTIPLICATIVE = {operator.mul, operator.imul, operator.truediv, operator.itruediv, torch.mul, torch.div}
_ADDITIVE = {operator.add, operator.iadd, operator.sub, operator.isub, torch.add, torch.sub}
_MULTIPLICATIVE_METHODS = {"mul", "mul_", "div", "div_"}
_ADDITIVE_METHODS = {"add", "add_", "sub", "sub_"}


def _has_output_units(owner: nn.Module, local_name: str, param: torch.Tensor) -> bool:
    """Weight/bias of a conv or linear layer whose dim 0 indexes output units (transposed convs store
    [in, out/groups, ...] and keep random-weight partitioning)."""
    if local_name not in ("weight", "bias") or param.dim() == 0:
        return False
    if isinstance(owner, nn.Linear):
        return param.shape[0] == owner.out_features
    if isinstance(owner, nn.modules.conv._ConvNd) and not owner.transposed:
        return param.shape[0] == owner.out_channels
    return False


def _is_norm(owner: nn.Module) -> bool:
    return isinstance(owner, _NORM_TYPES) or "norm" in type(owner).__name__.lower()


def _use_kind(nodes: list[fx.Node]) -> str | None:
    """'product' if every use multiplies/divides by the tensor, 'sum' if every use adds it, else None."""
    kinds = set()
    for node in nodes:
        for user in node.users:
            if user.op == "call_function" and user.target in _MULTIPLICATIVE:
                kinds.add("product")
            elif user.op == "call_function" and user.target in _ADDITIVE:
                kinds.add("sum")
            elif user.op == "call_method" and user.target in _MULTIPLICATIVE_METHODS:
                kinds.add("product")
            elif user.op == "call_method" and user.target in _ADDITIVE_METHODS:
                kinds.add("sum")
            else:
                return None
    return kinds.pop() if len(kinds) == 1 else None


def _auto_kind(local_name: str, owner: nn.Module, param: torch.Tensor, get_attrs: list[fx.Node]) -> tuple[str, str]:
    if _is_norm(owner) and param.dim() <= 1 and local_name in ("weight", "bias"):
        kind = "product" if local_name == "weight" else "sum"
        return kind, f"affine of {type(owner).__name__}"
    if param.numel() == 1 and get_attrs:
        use = _use_kind(get_attrs)
        if use is not None:
            return use, "scalar " + ("scale" if use == "product" else "bias")
    return "random", f"{local_name} of {type(owner).__name__}"


def treat_parameters(
    working: nn.Module,
    get_attrs: dict[str, list[fx.Node]],
    config: PartitionConfig,
    *,
    proportions: tuple[float, ...],
    scheme: str,
    default: str,
    seed: int,
    assignments: str,
) -> list[ParameterRecord]:
    """One record per parameter tensor of ``working`` (tied names together), with its ``PartitionedTensor``
    if it is partitioned. ``get_attrs``: the graph's ``get_attr`` nodes by target, to see how scalars are used.

    >>> import torch
    >>> from partition_fx.fx.config import PartitionConfig
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    >>> records = treat_parameters(
    ...     model, {}, PartitionConfig(), proportions=(0.5, 0.5), scheme="node", default="init", seed=0,
    ...     assignments="stored")
    >>> [(r.names[0], r.treatment) for r in records]
    [('0.weight', 'node'), ('0.bias', 'node'), ('1.weight', 'product'), ('1.bias', 'sum')]
    """
    names_by_id: dict[int, list[str]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for name, p in working.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(p), []).append(name)
        tensors[id(p)] = p
    records = []
    for pid, names in names_by_id.items():
        p = tensors[pid]
        owner_name, _, local = names[0].rpartition(".")
        owner = working.get_submodule(owner_name)
        rule = config.rule_for(names[0], owner)
        record = ParameterRecord(names=names, shape=tuple(p.shape), treatment="", reason="")
        if isinstance(owner, HyperparameterModule):
            record.treatment, record.reason = "hyper", f"hyperparameter of {type(owner).__name__}; learned by fit"
        elif rule.partition is False:
            record.treatment, record.reason = "shared", "excluded by config; same value in every subnetwork"
        elif not p.requires_grad and rule.partition is not True:
            record.treatment, record.reason = "frozen", "requires_grad=False; left as is"
        else:
            uses = [node for name in names for node in get_attrs.get(name, [])]
            kind, reason = _auto_kind(local, owner, p, uses)
            if rule.kind is not None:
                kind, reason = rule.kind, "kind set by config"
            value_default = rule.default or default
            if value_default != default:
                reason += f"; default={value_default!r} by config"
            # The scheme decides the kind of random-weight tensors with output units (node: whole units).
            if kind == "random" and partition_kind(scheme).units and _has_output_units(owner, local, p):
                kind, reason = scheme, f"output units of {type(owner).__name__}"
            spec = partition_kind(kind)
            # kinds.py types tensor_class as any class (it may be named by a path); each builds a PartitionedTensor.
            tensor_class: type[PartitionedTensor] = spec.tensor_class()
            pt = tensor_class.from_parameter(
                p,
                kind,
                proportions,
                seed=seed,
                # Partitioning by output unit salts by the layer, so its weight rows and bias entries agree.
                salt=name_salt(owner_name if spec.units else names[0]),
                default_salt=name_salt(names[0]),
                default=value_default,
                regenerate=assignments == "regenerated",
            )
            if not p.requires_grad:  # partitioned on request; its parts keep requires_grad=False
                reason += "; frozen, partitioned by config"
            record.treatment, record.reason, record.partitioned = pt.kind, reason, pt
        records.append(record)
    return records
