"""The fx pass: every use of a partitioned parameter reads the effective tensor of subnetwork k.

``partitionify`` copies the model, traces it (``tracing``), replaces each parameter tensor by a
``PartitionedTensor`` (``params``), and rewrites the graph:

* a ``get_attr`` of a parameter becomes a call of its ``PartitionedTensor`` with the subnetwork index;
* a leaf module call becomes ``torch.func.functional_call`` of the same module with the effective
  tensors of its parameters, so leaves of any type work unchanged (BatchNorm still updates its
  running statistics in place; dropout still follows ``.train()``);
* a ``subnetwork`` placeholder is added as the graph's first input.

Each effective tensor is computed once per forward, just before its first use, and shared by every
use (tied weights stay tied).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from . import config as cfg
from .assign import name_salt
from .errors import PartitionArgumentError, PartitionTypeError
from .params import PartitionedTensor, RandomPartitionedTensor, ScalePartitionedTensor
from .tracing import trace_consistently

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


def _call_leaf(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """Call a leaf module with some of its parameters replaced (the rewritten graph calls this)."""
    return torch.func.functional_call(module, params, args, kwargs, tie_weights=False, strict=False)


def _call_leaf_clearing_caches(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """``_call_leaf`` for modules that cache values derived from their parameters (e.g. timm's
    ``attention_bias_cache`` in eval mode): the cache would leak one subnetwork's values into the next."""
    clear_parameter_caches(module)
    try:
        return _call_leaf(module, params, *args, **kwargs)
    finally:
        clear_parameter_caches(module)


def _parameter_caches(module: nn.Module) -> list[dict[Any, Any]]:
    return [
        value
        for m in module.modules()
        for name, value in vars(m).items()
        if isinstance(value, dict) and "cache" in name.lower() and not name.startswith("_")
    ]


def clear_parameter_caches(module: nn.Module) -> bool:
    """Empty every dict attribute named like ``*cache*`` in ``module``'s tree; True if there were any."""
    caches = _parameter_caches(module)
    for cache in caches:
        cache.clear()
    return bool(caches)


torch.fx.wrap("_call_leaf")  # so a PartitionedModel's graph module can itself be traced again
torch.fx.wrap("_call_leaf_clearing_caches")


@dataclass
class ParameterRecord:
    """How one original parameter tensor was treated (for ``describe``, export and optimisation)."""

    names: list[str]
    """Every qualified name of the tensor in the original model (several when tied)."""
    shape: tuple[int, ...]
    treatment: str
    """``random``, ``product``, ``sum``, ``shared`` (left unpartitioned) or ``frozen``."""
    reason: str
    partitioned: PartitionedTensor | None = None


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
        kind = _use_kind(get_attrs)
        if kind is not None:
            return kind, "scalar " + ("scale" if kind == "product" else "bias")
    return "random", "weight"


def _set_path(root: nn.Module, path: str, value: nn.Module | torch.Tensor, *, buffer: bool = False) -> None:
    """Set ``root.<path>`` to a module, parameter or buffer, creating empty parent modules as needed."""
    *parents, leaf = path.split(".")
    module = root
    for name in parents:
        child = getattr(module, name, None)
        if child is None:
            child = nn.Module()
            module.add_module(name, child)
        module = child
    if buffer:
        module.register_buffer(leaf, value)  # type: ignore[arg-type]
    else:
        setattr(module, leaf, value)


def _get_path(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _remove_parameter(root: nn.Module, path: str) -> None:
    """Take a parameter out of its module, leaving a meta-device stand-in (no memory) so code that
    only inspects it (``extra_repr``'s ``self.bias is None``) still works; calls replace it."""
    prefix, _, local = path.rpartition(".")
    owner = _get_path(root, prefix) if prefix else root
    if isinstance(owner, nn.Module) and local in owner._parameters:
        param = owner._parameters.pop(local)
        if param is not None:
            object.__setattr__(owner, local, torch.empty_like(param, device="meta"))


def _meta_skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device (no memory)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def _container_name(root: nn.Module) -> str:
    name = "partitioned"
    while hasattr(root, name):
        name += "_"
    return name


class PartitionedModel(nn.Module):
    """A model whose every parameter tensor is split into C partitions (build with ``partitionify``).

    ``pmodel(x, subnetwork=k)`` runs subnetwork k: partitions 1..k at their trained values, k+1..C at
    their defaults (k=0: all defaults; k=C, the default: the final model).
    """

    def __init__(
        self,
        module: nn.Module,
        records: list[ParameterRecord],
        skeleton: nn.Module,
        *,
        num_partitions: int,
        proportions: tuple[float, ...],
        scheme: str,
        default: str,
        seed: int,
        root_leaf: bool,
        promoted_leaves: set[str],
    ) -> None:
        super().__init__()
        self.module = module
        self.num_partitions = num_partitions
        self.proportions = proportions
        self.scheme = scheme
        self.default = default
        self.seed = seed
        self.promoted_leaves = sorted(promoted_leaves)
        # Plain attributes (not submodules): the skeleton must not show up in parameters() or state_dict.
        self.__dict__["_records"] = records
        self.__dict__["_skeleton"] = skeleton
        self.__dict__["_root_leaf"] = root_leaf

    @property
    def original_class(self) -> type:
        """The class of the converted model (and of what ``export_subnetwork`` returns)."""
        return type(self._skeleton)

    def check_subnetwork(self, subnetwork: object) -> int:
        """``subnetwork`` as an int in 0..C (``None`` means C), or a clear error."""
        if subnetwork is None:
            return self.num_partitions
        integral_tensor = (
            isinstance(subnetwork, torch.Tensor)
            and subnetwork.numel() == 1
            and not subnetwork.is_floating_point()
            and not subnetwork.is_complex()
            and subnetwork.dtype != torch.bool
        )
        if isinstance(subnetwork, torch.Tensor) and not integral_tensor:
            raise PartitionTypeError(
                f"subnetwork must be an int in 0..{self.num_partitions}, got a tensor of shape "
                f"{tuple(subnetwork.shape)} and dtype {subnetwork.dtype}"
            )
        if isinstance(subnetwork, bool) or not hasattr(subnetwork, "__index__"):
            raise PartitionTypeError(
                f"subnetwork must be an int in 0..{self.num_partitions}, "
                f"got {subnetwork!r} ({type(subnetwork).__name__})"
            )
        k = operator.index(subnetwork)  # type: ignore[arg-type]
        if not 0 <= k <= self.num_partitions:
            raise PartitionArgumentError(
                f"subnetwork must be in 0..{self.num_partitions} (0 = all defaults, "
                f"{self.num_partitions} = final model), got {k}"
            )
        return k

    def forward(self, *args: Any, subnetwork: int | None = None, **kwargs: Any) -> Any:
        k = self.check_subnetwork(subnetwork)
        if self._root_leaf:
            return _call_leaf_clearing_caches(self.module, self.effective_parameters(k), *args, **kwargs)
        return self.module(k, *args, **kwargs)

    def partitioned_tensors(self) -> Iterator[tuple[str, PartitionedTensor]]:
        """``(original name, PartitionedTensor)`` for every partitioned tensor (tied tensors once).

        >>> import torch
        >>> from partition_fx import partitionify
        >>> [(name, pt.kind) for name, pt in partitionify(torch.nn.BatchNorm1d(3), 2).partitioned_tensors()]
        [('weight', 'product'), ('bias', 'sum')]
        """
        for record in self._records:
            if record.partitioned is not None:
                yield record.names[0], record.partitioned

    def effective_parameters(self, k: int | None = None) -> dict[str, torch.Tensor]:
        """Subnetwork k's value of every partitioned tensor, under each of its original names.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> sorted(partitionify(torch.nn.Linear(3, 2), 2).effective_parameters(0))
        ['bias', 'weight']
        """
        k = self.check_subnetwork(k)
        out = {}
        for record in self._records:
            if record.partitioned is not None:
                value = record.partitioned(k)
                out.update((name, value) for name in record.names)
        return out

    def partition_parameters(self, k: int) -> list[nn.Parameter]:
        """The trainable tensors of partition k (1..C): what an optimiser steps when training partition k.

        Over k = 1..C they are all trainable parameters, each exactly once; parameters left
        unpartitioned by the config are listed with partition 1.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> pmodel = partitionify(torch.nn.Linear(10, 1), 2, (0.8, 0.2))
        >>> [p.numel() for p in pmodel.partition_parameters(2)]  # 2 of 10 weights, 0 of 1 bias
        [2]
        >>> optimizer = torch.optim.Adam(pmodel.partition_parameters(1), lr=1e-3)
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.num_partitions:
            raise PartitionArgumentError(f"partition must be an int in 1..{self.num_partitions}, got {k!r}")
        params: list[nn.Parameter] = []
        for record in self._records:
            if record.partitioned is not None:
                part = record.partitioned.part(k)
                if part.requires_grad and part.numel() > 0:
                    params.append(part)
            elif k == 1 and record.treatment == "shared":
                params.append(self.module.get_parameter(record.names[0]))
        return params

    def original_state(self, k: int | None = None) -> dict[str, torch.Tensor]:
        """Every original parameter and buffer name -> subnetwork k's value (not copies)."""
        effective = self.effective_parameters(k)
        state: dict[str, torch.Tensor] = {}
        for name, _ in self._skeleton.named_parameters(remove_duplicate=False):
            state[name] = effective[name] if name in effective else _get_path(self.module, name)
        for name, _ in self._skeleton.named_buffers(remove_duplicate=False):
            state[name] = _get_path(self.module, name)
        return state

    def describe(self) -> str:
        """A table: per tensor, its treatment, its entries per partition, and why.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> print(partitionify(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.LayerNorm(2)), 2).describe())
        PartitionedModel of Sequential: C=2, proportions=(0.5, 0.5), scheme='random', default='init', seed=0
        tensor    shape  treatment  p1  p2  note
        --------  -----  ---------  --  --  -------------------
        0.weight  2x4    random     4   4   weight
        0.bias    2      random     1   1   weight
        1.weight  2      product    2   2   affine of LayerNorm
        1.bias    2      sum        2   2   affine of LayerNorm
        total                       9   9
        """
        return _describe(self)

    def extra_repr(self) -> str:
        return (
            f"num_partitions={self.num_partitions}, proportions={self.proportions}, scheme={self.scheme!r}, "
            f"default={self.default!r}, seed={self.seed}"
        )


def _describe(pmodel: PartitionedModel) -> str:
    c = pmodel.num_partitions
    header = ["tensor", "shape", "treatment"] + [f"p{k}" for k in range(1, c + 1)] + ["note"]
    rows = [header]
    totals = [0] * c
    for record in pmodel._records:
        if record.partitioned is not None:
            sizes = record.partitioned.partition_sizes()
            totals = [t + s for t, s in zip(totals, sizes)]
            counts = [str(s) for s in sizes]
        else:
            counts = ["-"] * c
        note = record.reason + (f"; tied with {', '.join(record.names[1:])}" if len(record.names) > 1 else "")
        rows.append([record.names[0], "x".join(map(str, record.shape)) or "scalar", record.treatment, *counts, note])
    rows.append(["total", "", "", *map(str, totals), ""])
    buffers = list(pmodel._skeleton.named_buffers())
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"PartitionedModel of {pmodel.original_class.__name__}: C={c}, proportions={pmodel.proportions}, "
        f"scheme={pmodel.scheme!r}, default={pmodel.default!r}, seed={pmodel.seed}"
    ]
    if pmodel.promoted_leaves:
        promoted = ["<whole model>" if n == "" else n for n in pmodel.promoted_leaves]
        lines.append(f"traced as whole calls (their code depends on .training): {', '.join(promoted)}")
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if buffers:
        count = sum(b.numel() for _, b in buffers)
        lines.append(f"buffers (not partitioned; shared by every subnetwork): {len(buffers)} tensors, {count} entries")
    return "\n".join(lines)


def partitionify(
    model: nn.Module,
    num_partitions: int = 3,
    proportions: Sequence[float] | None = None,
    *,
    scheme: str = "random",
    default: str = "init",
    seed: int = 0,
    config: cfg.PartitionConfig | None = None,
) -> PartitionedModel:
    """Convert ``model`` into a partitioned equivalent; ``model`` itself is not modified.

    Args:
        model: any ``nn.Module`` that torch.fx can trace with leaves (timm, torchvision, your own).
        num_partitions: C, the number of partitions (and of data chunks in training).
        proportions: share of each tensor's entries per partition; ``None`` = equal shares.
        scheme: ``"random"`` (random-weight partitioning).
        default: value of untrained partitions: ``"init"`` (the values at conversion) or ``"zero"``.
        seed: seeds the assignment of entries to partitions.
        config: per-parameter rules and extra leaf modules (:class:`PartitionConfig`).

    Example::

        >>> import torch
        >>> from partition_fx import partitionify, export_subnetwork
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> pmodel = partitionify(model, num_partitions=3, proportions=(0.8, 0.1, 0.1))
        >>> x = torch.randn(5, 4)
        >>> torch.equal(pmodel(x, subnetwork=1), model(x))  # equal to the original right after conversion
        True
        >>> type(export_subnetwork(pmodel, 2)) is torch.nn.Sequential
        True
    """
    if not isinstance(model, nn.Module):
        raise PartitionTypeError(f"partitionify needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, PartitionedModel):
        raise PartitionArgumentError("model is already a PartitionedModel; export_subnetwork(model) first")
    c = cfg.validate_num_partitions(num_partitions)
    props = cfg.validate_proportions(proportions, c)
    scheme = cfg.validate_choice("scheme", scheme, cfg.SCHEMES)
    default = cfg.validate_choice("default", default, cfg.DEFAULTS)
    if scheme == "node":
        raise NotImplementedError("scheme='node' (node partitioning) is not implemented yet; use scheme='random'")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PartitionTypeError(f"seed must be a non-negative int, got {seed!r}")
    config = config if config is not None else cfg.PartitionConfig()
    if not isinstance(config, cfg.PartitionConfig):
        raise PartitionTypeError(f"config must be a PartitionConfig, got {type(config).__name__}")

    skeleton = _meta_skeleton(model)
    clear_parameter_caches(skeleton)  # exports must not reuse values cached from the original weights
    working = copy.deepcopy(model)
    leaf_types = [m for m in config.leaf_modules if isinstance(m, type)]
    leaf_names = [m for m in config.leaf_modules if isinstance(m, str)]
    for name in leaf_names:
        if _get_path(working, name) is None:
            raise PartitionArgumentError(f"config leaf module {name!r} is not a submodule of {type(model).__name__}")
    graph, promoted = trace_consistently(working, leaf_types, leaf_names)
    clear_parameter_caches(working)  # tracing in eval mode may have stored fx proxies in them
    root_leaf = "" in promoted

    container = _container_name(working)
    if root_leaf:
        module: nn.Module = working
        get_attrs: dict[str, list[fx.Node]] = {}
    else:
        module = fx.GraphModule(working, graph, class_name=f"Partitioned{type(model).__name__}")
        graph = module.graph
        get_attrs = {}
        for node in graph.nodes:
            if node.op == "get_attr":
                get_attrs.setdefault(node.target, []).append(node)

    names_by_id: dict[int, list[str]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for name, p in working.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(p), []).append(name)
        tensors[id(p)] = p

    records: list[ParameterRecord] = []
    record_by_name: dict[str, ParameterRecord] = {}
    for pid, names in names_by_id.items():
        p = tensors[pid]
        first = names[0]
        owner_name, _, local = first.rpartition(".")
        owner = working.get_submodule(owner_name)
        rule = config.rule_for(first, owner)
        uses = [n for name in names for n in get_attrs.get(name, [])]
        record = ParameterRecord(names=names, shape=tuple(p.shape), treatment="", reason="")
        if rule.partition is False:
            record.treatment, record.reason = "shared", "excluded by config; same value in every subnetwork"
        elif not p.requires_grad and rule.partition is not True:
            record.treatment, record.reason = "frozen", "requires_grad=False; left as is"
        else:
            kind, reason = _auto_kind(local, owner, p, uses)
            if rule.kind is not None:
                kind, reason = rule.kind, "kind set by config"
            tensor_default = rule.default or default
            if kind == "random":
                pt: PartitionedTensor = RandomPartitionedTensor(
                    p, props, seed=seed, salt=name_salt(first), default=tensor_default
                )
            else:
                pt = ScalePartitionedTensor(p, c, kind=kind, default=tensor_default)
            record.treatment, record.reason, record.partitioned = kind, reason, pt
            if tensor_default != default:
                record.reason += f"; default={tensor_default!r} by config"
            _set_path(module, f"{container}.{first}", pt)
        records.append(record)
        record_by_name.update((n, record) for n in names)

    if not root_leaf:
        _rewrite_graph(module, graph, working, record_by_name, container)  # type: ignore[arg-type]
    for record in records:
        if record.partitioned is not None:
            for name in record.names:
                _remove_parameter(working, name)
                _remove_parameter(module, name)
    _keep_unreached_state(module, working, records)
    if not root_leaf:
        graph.lint()
        module.recompile()  # type: ignore[operator]
    return PartitionedModel(
        module,
        records,
        skeleton,
        num_partitions=c,
        proportions=props,
        scheme=scheme,
        default=default,
        seed=seed,
        root_leaf=root_leaf,
        promoted_leaves=promoted,
    )


def _rewrite_graph(
    gm: fx.GraphModule,
    graph: fx.Graph,
    working: nn.Module,
    record_by_name: dict[str, ParameterRecord],
    container: str,
) -> None:
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        subnetwork = graph.placeholder("subnetwork")
    effective: dict[int, fx.Node] = {}

    def effective_node(record: ParameterRecord, before: fx.Node) -> fx.Node:
        key = id(record)
        if key not in effective:
            with graph.inserting_before(before):
                effective[key] = graph.call_module(f"{container}.{record.names[0]}", (subnetwork,))
        return effective[key]

    for node in list(graph.nodes):
        if node.op == "get_attr":
            record = record_by_name.get(node.target)
            if record is not None and record.partitioned is not None:
                node.replace_all_uses_with(effective_node(record, node))
                graph.erase_node(node)
        elif node.op == "call_module":
            leaf = working.get_submodule(node.target)
            params = {}
            for local, _ in leaf.named_parameters(remove_duplicate=False):
                record = record_by_name.get(f"{node.target}.{local}")
                if record is not None and record.partitioned is not None:
                    params[local] = effective_node(record, node)
            if params:
                caller = _call_leaf_clearing_caches if _parameter_caches(leaf) else _call_leaf
                with graph.inserting_before(node):
                    module_ref = graph.get_attr(node.target)
                    call = graph.call_function(caller, (module_ref, params, *node.args), dict(node.kwargs))
                call.meta = dict(node.meta)
                node.replace_all_uses_with(call)
                graph.erase_node(node)


def _keep_unreached_state(module: nn.Module, working: nn.Module, records: list[ParameterRecord]) -> None:
    """Register buffers and unpartitioned parameters the graph never touches, at their original paths,
    so the state dict and exports still hold them."""
    for record in records:
        if record.partitioned is None and _get_path(module, record.names[0]) is None:
            _set_path(module, record.names[0], working.get_parameter(record.names[0]))
    for name, b in working.named_buffers(remove_duplicate=False):
        if _get_path(module, name) is None:
            _set_path(module, name, b, buffer=True)
