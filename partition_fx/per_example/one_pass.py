"""Many subnetworks in one pass, for node partitioning: every example of a batch through its own subnetwork
with the full weights, per-example output masks and per-example weight-gradient routing.

Under node partitioning, output unit u of a conv/linear layer belongs to one partition p(u), with its whole
weight row and bias entry; so subnetwork k's output at unit u is the full-weight output when p(u) <= k and
the all-defaults output otherwise. A layer therefore runs once with the trained weights (and once more with
the default weights, unless those are zero), and each example picks, per unit, one of the two. Weight
gradients are routed per example inside the layer's backward: example i's output gradient reaches the rows
of partition g_i only (none for g_i = 0), while its input gradient flows in full, as it does when each
example runs alone. Norm affines (product/sum scales) are applied per example after a parameter-free
normalisation.

A model qualifies when every partitioned tensor is a node-partitioned ``Linear``/``Conv{1,2,3}d`` weight or
bias or a product/sum affine of ``BatchNorm``/``GroupNorm``/``LayerNorm``, each used only by its own layer;
others (FixUp scalars, ViT position embeddings, random-weight tensors) fall back to grouping by subnetwork.
Which kinds play which part is their ``one_pass`` entry in ``partition_fx.fx.kinds``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ..errors import PartitionTypeError
from ..fx.kinds import PARTITION_KINDS, OnePass
from ..fx.params import HAND_OVER, PartitionedTensor, gradient_only_to
from .routing import Routing

if TYPE_CHECKING:
    from ..fx.flat import FlatGroup

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)
_Layer = nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d


_ROUTING: ContextVar[Routing | None] = ContextVar("partition_fx_one_pass_routing", default=None)


def _role(pt: Any) -> OnePass | None:
    """How one-pass routing applies ``pt``: its kind's ``one_pass`` ("layer", "norm"), None otherwise."""
    kind = PARTITION_KINDS.get(pt.kind) if isinstance(pt, PartitionedTensor) else None
    return None if kind is None else kind.one_pass


@contextmanager
def routed(routing: Routing) -> Iterator[None]:
    """Inside the block, partitioned tensors hand themselves to their layers, which route per example."""
    token, hand_over = _ROUTING.set(routing), HAND_OVER.set(True)
    try:
        yield
    finally:
        HAND_OVER.reset(hand_over)
        _ROUTING.reset(token)


def forward_one_pass(gm: torch.fx.GraphModule, num_partitions: int, args: tuple, kwargs: dict, routing: Routing) -> Any:
    """Every example of the batch through its own subnetwork in one forward of ``gm`` (a rewritten graph
    that ``supports_one_pass``). Exact where the grouped forward is; in train mode BatchNorm normalises the
    whole batch with one set of statistics (the grouped forward uses one per group).

    >>> import torch
    >>> from partition_fx import partitionify
    >>> from partition_fx.per_example import Routing
    >>> pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(4, 2)), 2, scheme="node", default="zero")
    >>> x = torch.randn(3, 4)
    >>> out = forward_one_pass(pmodel.module, 2, (x,), {}, Routing(torch.tensor([0, 1, 2]), None))
    >>> torch.equal(out[0], torch.zeros(2)), torch.allclose(out[2], pmodel(x[2:], subnetwork=2)[0])
    (True, True)
    """
    with routed(routing):
        return gm(num_partitions, *args, **kwargs)


def _tensor_nodes(gm: torch.fx.GraphModule, modules: Mapping[str, nn.Module]) -> dict[torch.fx.Node, Any] | None:
    """The graph node that yields each partitioned tensor: its module's call, or the item of its flat group's
    call (``partition_fx.fx.flat``); None if a group's call is used otherwise."""
    found: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        module = modules.get(node.target) if node.op == "call_module" else None
        if isinstance(module, PartitionedTensor):
            found[node] = module
        elif module is not None:  # a FlatGroup: every user takes one member
            for user in node.users:
                if user.op != "call_function" or user.target is not operator.getitem:
                    return None
                found[user] = cast("FlatGroup", module).members[cast(int, user.args[1])]
    return found


def supports_one_pass(
    gm: torch.fx.GraphModule, modules: Mapping[str, nn.Module], leaf_callers: Collection[Callable[..., Any]]
) -> bool:
    """Whether every partitioned tensor (``modules``: the ``PartitionedTensor`` s and ``FlatGroup`` s of
    ``gm`` by name) is node-partitioned and used only as the weight or bias of a ``Linear``/``Conv``, or is
    a product/sum affine used only by its norm layer. ``leaf_callers`` are the functions through which ``gm``
    calls its leaf modules (``runtime.LEAF_CALLERS``)."""
    tensors = _tensor_nodes(gm, modules)
    if tensors is None:
        return False
    for node, pt in tensors.items():
        for user in node.users:
            # A leaf caller's arguments: the leaf's get_attr node, then its parameters by name (runtime.py).
            if user.op != "call_function" or user.target not in leaf_callers:
                return False
            leaf_node = cast(torch.fx.Node, user.args[0])
            if leaf_node.op != "get_attr":
                return False
            leaf = gm.get_submodule(cast(str, leaf_node.target))
            params = cast("dict[str, Any]", user.args[1])  # its nodes by parameter name
            if isinstance(leaf, _LAYERS):
                weight = tensors.get(params["weight"]) if "weight" in params else None
                ok = _role(weight) == "layer"
                ok = ok and all(v is node or k in ("weight", "bias") for k, v in params.items())
                ok = ok and (pt is weight or _role(pt) == "layer")
            else:
                ok = isinstance(leaf, _NORMS) and _role(pt) == "norm"
            if not ok:
                return False
    return True


def call_routed(module: nn.Module, params: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A leaf call under ``routed``: ``params`` holds ``PartitionedTensor`` s, not values."""
    routing = _ROUTING.get()
    assert routing is not None
    if isinstance(module, _LAYERS):
        return _layer(module, params, routing, *args, **kwargs)
    return _norm(module, params, routing, *args, **kwargs)


def _value(module: nn.Module, params: dict[str, Any], name: str, k: int) -> torch.Tensor | None:
    """Subnetwork k's value of a layer parameter (partitioned or not)."""
    param = params.get(name)
    if isinstance(param, PartitionedTensor):
        return param.value(k)
    return getattr(module, name)


def _layer(module: _Layer, params: dict[str, Any], routing: Routing, x: torch.Tensor) -> torch.Tensor:
    weight_pt = params["weight"]
    if _role(weight_pt) != "layer":
        raise PartitionTypeError(f"one-pass routing needs a node-partitioned weight, got {weight_pt!r}")
    c = weight_pt.num_partitions
    ks = routing.subnetworks
    unit_part = weight_pt.unit_membership().to(x.device)  # [U]
    shape = (-1, unit_part.numel()) + (1,) * (x.dim() - 2)  # broadcast over the non-channel dims
    if isinstance(module, nn.Linear):
        shape = (-1,) + (1,) * (x.dim() - 2) + (unit_part.numel(),)
    with gradient_only_to(None):
        weight, bias = weight_pt.value(c), _value(module, params, "bias", c)
    if routing.grad_partitions is None:
        out = _forward(module, x, weight, bias)
    else:
        gs = routing.grad_partitions.to(x.device)
        grad_mask = (unit_part[None, :] == gs[:, None]).to(x.dtype).view(shape)
        out = _RoutedLayer.apply(x, weight, bias, grad_mask, module)
    trained = (unit_part[None, :] <= ks.to(x.device)[:, None]).view(shape)  # ks itself stays on the host
    if bool(trained.all()):
        return out
    bias_pt: Any = params.get("bias")
    zero_bias = module.bias is None if bias_pt is None else bias_pt.default_mode == "zero"
    if weight_pt.default_mode == "zero" and zero_bias:
        return out * trained.to(out.dtype)  # the all-defaults output is zero: no second pass
    # The all-defaults output, only for the units some example does not train (for proportions
    # 0.8/0.1/0.1 and k >= 1: the 20% of units in partitions 2 and 3).
    with torch.no_grad():
        units, default_weight = weight_pt.unit_defaults(int(ks.min()))
        if _role(bias_pt) == "layer":  # same layer, same salt: the same units
            default_bias = bias_pt.unit_defaults(int(ks.min()))[1]
        else:
            default_bias = None if module.bias is None else module.bias.index_select(0, units.to(x.device))
    units = units.to(x.device)
    dim = -1 if isinstance(module, nn.Linear) else 1
    if getattr(module, "groups", 1) > 1:
        # A grouped conv reads each unit's inputs by the unit's index, so a subset of rows would meet the
        # wrong groups: run the full layer with the default rows in place, and keep those units.
        full_weight = weight.detach().new_zeros(weight.shape).index_copy_(0, units, default_weight)
        full_bias = (
            None if default_bias is None else full_weight.new_zeros(weight.shape[0]).index_copy_(0, units, default_bias)
        )
        defaults = _forward(module, x, full_weight, full_bias).index_select(dim, units)
    else:
        defaults = _forward(module, x, default_weight, default_bias)
    mixed = torch.where(trained.index_select(dim, units), out.index_select(dim, units), defaults)
    return out.index_copy(dim % out.dim(), units, mixed)


def _forward(module: _Layer, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(module, nn.Linear):
        return F.linear(x, weight, bias)
    return module._conv_forward(x, weight, bias)


class _RoutedLayer(torch.autograd.Function):
    """``_forward(module, x, weight, bias)`` whose weight and bias gradients take each example's output
    gradient times ``grad_mask`` (its partition's units), and whose input gradient takes it whole."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Any, grad_mask: torch.Tensor, module: Any):
        ctx.save_for_backward(x, weight, grad_mask)
        ctx.module, ctx.has_bias = module, bias is not None
        return _forward(module, x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight, grad_mask = ctx.saved_tensors
        module = ctx.module
        routed_grad = grad * grad_mask
        if isinstance(module, nn.Linear):
            grad_x = grad @ weight
            grad_weight = routed_grad.reshape(-1, grad.shape[-1]).T @ x.reshape(-1, x.shape[-1])
            grad_bias = routed_grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        else:
            common = dict(
                bias_sizes=[weight.shape[0]] if ctx.has_bias else None,
                stride=list(module.stride),
                padding=list(module.padding) if not isinstance(module.padding, str) else None,
                dilation=list(module.dilation),
                transposed=False,
                output_padding=[0] * (x.dim() - 2),
                groups=module.groups,
            )
            grad_x = torch.ops.aten.convolution_backward(grad, x, weight, output_mask=[True, False, False], **common)[0]
            _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
                routed_grad, x, weight, output_mask=[False, True, ctx.has_bias], **common
            )
        return grad_x, grad_weight, grad_bias, None, None


def _norm(module: nn.Module, params: dict[str, Any], routing: Routing, x: torch.Tensor) -> torch.Tensor:
    """Normalise without the affine, then apply each example's subnetwork's scale and shift."""
    # None in place of the affine: functional_call takes it (its annotation says tensors only).
    neutral: dict[str, Any] = {name: None for name in ("weight", "bias") if getattr(module, name, None) is not None}
    y = torch.func.functional_call(module, neutral, (x,), tie_weights=False, strict=False)
    if isinstance(module, nn.LayerNorm):
        view = (x.shape[0],) + (1,) * (x.dim() - 1 - len(module.normalized_shape)) + tuple(module.normalized_shape)
    else:
        view = (x.shape[0], -1) + (1,) * (x.dim() - 2)
    weight = _per_example(module, params, "weight", routing)
    bias = _per_example(module, params, "bias", routing)
    if weight is not None:
        y = y * weight.view(view)
    if bias is not None:
        y = y + bias.view(view)
    return y


def _per_example(module: nn.Module, params: dict[str, Any], name: str, routing: Routing) -> torch.Tensor | None:
    """One row per example: the value its subnetwork uses, with gradients to its grad partition only."""
    pt: Any = params.get(name)
    if _role(pt) != "norm":
        value = getattr(module, name, None)
        return None if value is None else value.expand(routing.subnetworks.numel(), *value.shape)
    ks = routing.subnetworks
    gs = routing.grad_partitions
    keys = ks * (pt.num_partitions + 1) + (gs if gs is not None else 0)
    unique, inverse = torch.unique(keys, return_inverse=True)
    rows = []
    for key in unique.tolist():
        k, g = divmod(key, pt.num_partitions + 1)
        with gradient_only_to(g if gs is not None else None):
            rows.append(pt.value(k))
    values = torch.stack(rows)
    return values.index_select(0, inverse.to(values.device))
