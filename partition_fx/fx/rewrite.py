"""The fx pass: every use of a partitioned parameter reads the effective tensor of subnetwork k.

``partitionify`` copies the model, traces it (``tracing``), replaces each parameter tensor by a
``PartitionedTensor`` (``params``; which kind: ``treatment``), and rewrites the graph:

* a ``get_attr`` of a parameter becomes a call of its ``PartitionedTensor`` with the subnetwork index;
* a leaf module call becomes ``torch.func.functional_call`` of the same module with the effective
  tensors of its parameters, so leaves of any type work unchanged (BatchNorm still updates its
  running statistics in place; dropout still follows ``.train()``);
* a ``subnetwork`` placeholder is added as the graph's first input.

Each effective tensor is computed once per forward and shared by every use (tied weights stay tied):
tensors in flat storage (``flat``) all at once, by one call of their group just before the first use of
any of them; the others just before their first use.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils.weight_norm import WeightNorm
from torch.overrides import TorchFunctionMode

from .._validation import check_choice, check_num_partitions, check_proportions, check_seed
from ..choices import ASSIGNMENTS, DEFAULTS
from ..errors import PartitionArgumentError, PartitionError, PartitionTypeError
from .config import PartitionConfig
from .flat import flat_groups
from .kinds import kind_names
from .partitioned_model import PartitionedModel, TracedFrom
from .records import ParameterRecord
from .runtime import call_leaf, call_leaf_clearing_caches, clear_parameter_caches, get_path, parameter_caches
from .tracing import TRACE_MODES, trace_consistently
from .treatment import treat_parameters


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


def _remove_parameter(root: nn.Module, path: str) -> None:
    """Take a parameter out of its module, leaving a meta-device stand-in (no memory) so code that
    only inspects it (``extra_repr``'s ``self.bias is None``) still works; calls replace it."""
    prefix, _, local = path.rpartition(".")
    owner = get_path(root, prefix) if prefix else root
    if isinstance(owner, nn.Module) and local in owner._parameters:
        param = owner._parameters.pop(local)
        if param is not None:
            object.__setattr__(owner, local, torch.empty_like(param, device="meta"))


class _DetachDerivedTensors(TorchFunctionMode):
    """While active, ``copy.deepcopy`` copies a tensor that is not a graph leaf as a detached copy instead of
    refusing it. Such tensors are state derived by a forward run with autograd on (timm's LeViT and TinyViT
    keep their attention biases in an ``attention_bias_cache`` dict); a forward under ``torch.no_grad()``
    leaves the same values as leaves, which copy as they are. Every other call passes through unchanged."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__deepcopy__ and not args[0].is_leaf:
            tensor, memo = args
            if id(tensor) not in memo:  # deepcopy keeps the detached view alive in memo: its id is not reused
                memo[id(tensor)] = copy.deepcopy(tensor.detach(), memo)
            return memo[id(tensor)]
        return func(*args, **(kwargs or {}))


def _copy_model(model: nn.Module, memo: dict[int, Any] | None = None) -> nn.Module:
    """``copy.deepcopy(model, memo)`` that also copies state derived by an earlier forward with autograd on
    (tensors with a ``grad_fn``, anywhere deepcopy reaches): detached, as a forward under ``no_grad`` would
    have left them. ``model`` is not changed.

    >>> layer = torch.nn.Linear(2, 2)
    >>> layer.last_output = layer(torch.ones(1, 2))  # derived state with a grad_fn
    >>> copied = _copy_model(layer)
    >>> copied.last_output.grad_fn is None, torch.equal(copied.last_output, layer.last_output)
    (True, True)
    """
    with _DetachDerivedTensors():
        return copy.deepcopy(model, memo)


def _meta_skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on the meta device (no memory)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return _copy_model(model, memo)


def _container_name(root: nn.Module) -> str:
    name = "partitioned"
    while hasattr(root, name):
        name += "_"
    return name


def partitionify(
    model: nn.Module,
    num_partitions: int = 3,
    proportions: Sequence[float] | None = None,
    *,
    scheme: str = "random",
    default: str = "init",
    seed: int = 0,
    assignments: str = "stored",
    config: PartitionConfig | None = None,
    trace: str = "auto",
) -> PartitionedModel:
    """Convert ``model`` into a partitioned equivalent; ``model`` itself is not modified.

    Args:
        model: any ``nn.Module`` (timm, torchvision, your own), traced by torch.fx where it can be (see
            ``trace``).
        num_partitions: C, the number of partitions (and of data chunks in training).
        proportions: share of each tensor's entries per partition; ``None`` = equal shares.
        scheme: ``"random"`` (random-weight partitioning: each entry of each tensor) or ``"node"`` (node
            partitioning: each output unit of a conv/linear layer, with its weight row and bias entry; other
            tensors keep random-weight partitioning, norm affines product/sum scales); any kind registered as a
            scheme in ``partition_fx.fx.kinds``.
        default: value of untrained partitions: ``"init"`` (the values at conversion, stored: +100% of
            parameter memory), ``"zero"``, or ``"seed"``: each random/node tensor is re-initialised at
            conversion with the mean and std it had, from a counter-based normal generator, and its defaults
            are regenerated from the seed when needed, never stored (for training from scratch: it replaces
            pretrained values). Product/sum scales keep their value at conversion under ``"seed"``. The
            layout index is still stored unless ``assignments="regenerated"``.
        seed: seeds the assignment of entries to partitions (and ``"seed"`` defaults).
        assignments: ``"stored"`` (an int32 layout index per random-weight tensor: +100% of parameter
            memory, fastest) or ``"regenerated"`` (recomputed from the seed in every forward and backward
            with integer ops; bit-identical on every device). Node partitioning always stores one index
            entry per output unit. Tensors too small or oddly sized for the regenerating permutation
            (no divisor pair both >= 32) store theirs either way.
        config: per-parameter rules and extra leaf modules (:class:`PartitionConfig`).
        trace: ``"auto"`` (trace the model with torch.fx; a submodule fx cannot trace is called as one call, and
            a model whose own forward fx cannot trace, such as torchvision's detection and optical-flow models,
            runs untraced: its Python ``forward`` unchanged, fed the subnetwork's tensors by
            ``torch.func.functional_call``), ``"always"`` (refuse what fx cannot trace, naming the module, the
            line and the fix) or ``"never"`` (run untraced). An untraced model runs one subnetwork per call: per-
            example subnetworks and the fused iterations are refused for it (``PartitionedModel.untraced`` says
            why it is untraced).

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
    settings = _validated_settings(
        model, num_partitions, proportions, scheme, default, seed, assignments, config, trace
    )
    return _convert(model, settings)


@dataclass(frozen=True)
class _Settings:
    num_partitions: int
    proportions: tuple[float, ...]
    scheme: str
    default: str
    seed: int
    assignments: str
    config: PartitionConfig
    trace: str


def _validated_settings(
    model: object,
    num_partitions: object,
    proportions: object,
    scheme: object,
    default: object,
    seed: object,
    assignments: object,
    config: object,
    trace: object,
) -> _Settings:
    if not isinstance(model, nn.Module):
        raise PartitionTypeError(f"partitionify needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, PartitionedModel):
        raise PartitionArgumentError("model is already a PartitionedModel; export_subnetwork(model) first")
    _check_convertible(model)
    c = check_num_partitions(num_partitions)
    props = check_proportions(proportions, c)  # type: ignore[arg-type]
    scheme = check_choice("scheme", scheme, kind_names(scheme=True))
    default = check_choice("default", default, DEFAULTS)
    assignments = check_choice("assignments", assignments, ASSIGNMENTS)
    trace = check_choice("trace", trace, TRACE_MODES)
    seed = check_seed("seed", seed)
    config = config if config is not None else PartitionConfig()
    if not isinstance(config, PartitionConfig):
        raise PartitionTypeError(f"config must be a PartitionConfig, got {type(config).__name__}")
    for name in config.leaf_modules:
        if isinstance(name, str) and get_path(model, name) is None:
            raise PartitionArgumentError(f"config leaf module {name!r} is not a submodule of {type(model).__name__}")
    return _Settings(c, props, scheme, default, seed, assignments, config, trace)


def _check_convertible(model: nn.Module) -> None:
    """Refuse models that cannot be copied, traced or called functionally, naming the module and the fix."""
    if isinstance(model, torch.jit.ScriptModule):
        raise PartitionTypeError(
            f"{type(model).__name__} is a TorchScript module, which torch.fx cannot rewrite: partitionify the "
            "Python nn.Module before torch.jit.script (or use export_onnx after training)"
        )
    for name, module in model.named_modules():
        where = f"module '{name or '<root>'}' ({type(module).__name__})"
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            raise PartitionTypeError(
                f"{where} is a parallel wrapper: partitionify the wrapped model (its .module), then wrap the result"
            )
        if any(isinstance(hook, WeightNorm) for hook in module._forward_pre_hooks.values()):
            raise PartitionTypeError(
                f"{where} uses the deprecated torch.nn.utils.weight_norm, whose hooks cannot be copied: use "
                "torch.nn.utils.parametrizations.weight_norm, which partitionify supports"
            )
        for local, param in module.named_parameters(recurse=False):
            if is_lazy(param):
                raise PartitionArgumentError(
                    f"{where} has an uninitialised parameter '{local}' (a lazy module): run one forward pass "
                    "with an example batch first, so every parameter has its shape"
                )


def _convert(model: nn.Module, settings: _Settings) -> PartitionedModel:
    skeleton = _meta_skeleton(model)
    clear_parameter_caches(skeleton)  # exports must not reuse values cached from the original weights
    working = _copy_model(model)
    clear_parameter_caches(working)  # a cache filled by an earlier forward would be traced as a constant
    leaves = settings.config.leaf_modules
    graph, promoted, untraced, specialised = trace_consistently(
        working, [m for m in leaves if isinstance(m, type)], [m for m in leaves if isinstance(m, str)], settings.trace
    )
    clear_parameter_caches(working)  # tracing in eval mode may have stored fx proxies in them
    root_leaf = "" in promoted
    container = _container_name(working)
    get_attrs: dict[str, list[fx.Node]] = {}
    if root_leaf:  # the whole model is one call: functional_call on the copy itself
        module: nn.Module = working
    else:
        module = fx.GraphModule(working, graph, class_name=f"Partitioned{type(model).__name__}")
        graph = module.graph
        for node in graph.nodes:
            if node.op == "get_attr":
                get_attrs.setdefault(node.target, []).append(node)

    records = treat_parameters(
        working,
        get_attrs,
        settings.config,
        proportions=settings.proportions,
        scheme=settings.scheme,
        default=settings.default,
        seed=settings.seed,
        assignments=settings.assignments,
    )
    for record in records:
        if record.partitioned is not None:
            _set_path(module, f"{container}.{record.names[0]}", record.partitioned)
    slots = _store_flat(module, container, records)
    if not root_leaf:
        record_by_name = {name: record for record in records for name in record.names}
        _rewrite_graph(module, graph, working, record_by_name, container, slots)  # type: ignore[arg-type]
    for record in records:
        if record.partitioned is not None:
            for name in record.names:
                _remove_parameter(working, name)
                _remove_parameter(module, name)
    _keep_unreached_state(module, working, records)
    if not root_leaf:
        graph.lint()
        module.recompile()  # type: ignore[operator]
    pmodel = PartitionedModel(
        module,
        records,
        skeleton,
        num_partitions=settings.num_partitions,
        proportions=settings.proportions,
        scheme=settings.scheme,
        default=settings.default,
        seed=settings.seed,
        assignments=settings.assignments,
        root_leaf=root_leaf,
        promoted_leaves=promoted,
        untraced=untraced,
        container=container,
        traced_from=None if root_leaf else TracedFrom(working, specialised, settings.trace),
        # A conversion with rules cannot be replayed from the model's name alone.
        build=None if settings.config.has_rules() else getattr(model, "partition_fx_build", None),
    )
    _keep_modes(pmodel, module, working)
    return pmodel


def _keep_modes(pmodel: PartitionedModel, module: nn.Module, working: nn.Module) -> None:
    """The partitioned model in the modes the model was given: the model's own modules each as it was (tracing
    restored them), a module the rewritten graph made in place of one (a GraphModule's containers) as that one,
    and the wrapper and the partitions' modules in the root's mode."""
    own = {id(m) for m in working.modules()}
    pmodel.training = working.training
    for name, added in module.named_modules():
        if id(added) not in own:
            original = get_path(working, name) if name else working
            added.training = original.training if isinstance(original, nn.Module) else working.training
    if pmodel._container in module._modules:  # an untraced model holds the partitions in its own tree
        pmodel._partitions().train(working.training)


def _store_flat(module: nn.Module, container: str, records: list[ParameterRecord]) -> dict[int, tuple[str, int]]:
    """Put the partitioned tensors in flat storage (``flat``), registered under ``<container>.flat_groups``;
    returns ``id(tensor) -> (group path, slot)`` for every grouped tensor."""
    groups = flat_groups([r.partitioned for r in records if r.partitioned is not None])
    if not groups:
        return {}
    owner = get_path(module, container)
    name = "flat_groups"
    while hasattr(owner, name):  # a model with its own submodule of that name
        name += "_"
    owner.add_module(name, nn.ModuleList(groups))
    return {
        id(member): (f"{container}.{name}.{i}", slot)
        for i, group in enumerate(groups)
        for slot, member in enumerate(group.members)
    }


def _rewrite_graph(
    gm: fx.GraphModule,
    graph: fx.Graph,
    working: nn.Module,
    record_by_name: dict[str, ParameterRecord],
    container: str,
    slots: dict[int, tuple[str, int]],
) -> None:
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        subnetwork = graph.placeholder("subnetwork")
    effective: dict[int, fx.Node] = {}
    group_calls: dict[str, fx.Node] = {}

    def effective_node(record: ParameterRecord, before: fx.Node) -> fx.Node:
        """The node of the record's effective tensor: its own module's call, or an item of its flat group's
        call, which computes every member at the first use of any (one call per group and forward)."""
        key = id(record)
        if key not in effective:
            slot = slots.get(id(record.partitioned))
            with graph.inserting_before(before):
                if slot is None:
                    effective[key] = graph.call_module(f"{container}.{record.names[0]}", (subnetwork,))
                else:
                    path, i = slot
                    if path not in group_calls:
                        group_calls[path] = graph.call_module(path, (subnetwork,))
                    effective[key] = graph.call_function(operator.getitem, (group_calls[path], i))
        return effective[key]

    for node in list(graph.nodes):
        if node.op == "get_attr":
            record = record_by_name.get(node.target)
            if record is not None and record.partitioned is not None:
                _refuse_in_place_update(node, working)
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
                caller = call_leaf_clearing_caches if parameter_caches(leaf) else call_leaf
                with graph.inserting_before(node):
                    module_ref = graph.get_attr(node.target)
                    call = graph.call_function(caller, (module_ref, params, *node.args), dict(node.kwargs))
                call.meta = dict(node.meta)
                node.replace_all_uses_with(call)
                graph.erase_node(node)


_IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow}


def _refuse_in_place_update(node: fx.Node, model: nn.Module) -> None:
    """A forward that updates a parameter in place (``self.w.data.clamp_()``, weight clipping) would only
    change that forward's effective tensor, never the partitions: refuse it rather than drop the update."""
    same_storage = [node]
    for tensor in same_storage:  # grows with ``.data`` views of the parameter
        for user in tensor.users:
            if user.op == "call_function" and user.target is getattr and user.args[1:] == ("data",):
                same_storage.append(user)
                continue
            method = (
                user.op == "call_method"
                and isinstance(user.target, str)
                and user.target.endswith("_")
                and not user.target.startswith("__")
            )
            operator_ = user.op == "call_function" and user.target in _IN_PLACE_OPERATORS
            if (method or operator_) and user.args[0] is tensor:
                what = user.target if isinstance(user.target, str) else user.target.__name__
                stack = list((user.meta.get("nn_module_stack") or {}).values())
                path = stack[-1][0] if stack else ""
                where = f"module '{path or '<root>'}' ({type(model.get_submodule(path)).__name__})"
                raise PartitionError(
                    f"the forward of {where} updates parameter '{node.target}' in place ({what}); a partitioned "
                    "parameter is rebuilt for each subnetwork, so the update would be lost. Keep it whole with "
                    f"PartitionConfig().set_name('{node.target}', partition=False), or move the update out of "
                    "forward (e.g. after optimizer.step())"
                )


def _keep_unreached_state(module: nn.Module, working: nn.Module, records: list[ParameterRecord]) -> None:
    """Register buffers and unpartitioned parameters the graph never touches, at their original paths,
    so the state dict and exports still hold them."""
    for record in records:
        if record.partitioned is None and get_path(module, record.names[0]) is None:
            _set_path(module, record.names[0], working.get_parameter(record.names[0]))
    for name, b in working.named_buffers(remove_duplicate=False):
        if get_path(module, name) is None:
            _set_path(module, name, b, buffer=True)
