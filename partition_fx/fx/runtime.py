"""What a ``PartitionedModel``'s rewritten graph calls at run time.

``rewrite`` replaces each leaf-module call whose parameters are partitioned by ``call_leaf`` (or
``call_leaf_clearing_caches``), which calls the module with subnetwork k's effective tensors in place of
its parameters. Both are registered with ``torch.fx.wrap``: a graph module that calls them can itself be
traced again (the tracer records them as calls instead of entering them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..per_example.one_pass import call_routed
from .params import HAND_OVER


def call_leaf(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """Call a leaf module with some of its parameters replaced (the rewritten graph calls this).

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> call_leaf(layer, {"weight": torch.ones(1, 2)}, torch.tensor([[1.0, 2.0]]))
    tensor([[3.]])
    """
    if HAND_OVER.get():  # the params are PartitionedTensors handed over for a one-pass, per-example forward
        return call_routed(module, params, args, kwargs)
    return torch.func.functional_call(module, params, args, kwargs, tie_weights=False, strict=False)


def call_leaf_clearing_caches(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """``call_leaf`` for modules that cache values derived from their parameters (e.g. timm's
    ``attention_bias_cache`` in eval mode): the cache would leak one subnetwork's values into the next.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> layer.weight_cache = {"stale": 1}
    >>> call_leaf_clearing_caches(layer, {"weight": torch.ones(1, 2)}, torch.ones(1, 2)), layer.weight_cache
    (tensor([[2.]]), {})
    """
    clear_parameter_caches(module)
    try:
        return call_leaf(module, params, *args, **kwargs)
    finally:
        clear_parameter_caches(module)


LEAF_CALLERS = frozenset({call_leaf, call_leaf_clearing_caches})
"""The functions through which a rewritten graph calls its leaf modules."""


def parameter_caches(module: nn.Module) -> list[dict[Any, Any]]:
    """Every public dict attribute named like ``*cache*`` in ``module``'s tree.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> layer.bias_cache = {}
    >>> parameter_caches(torch.nn.Sequential(layer))
    [{}]
    """
    return [
        value
        for m in module.modules()
        for name, value in vars(m).items()
        if isinstance(value, dict) and "cache" in name.lower() and not name.startswith("_")
    ]


def clear_parameter_caches(module: nn.Module) -> bool:
    """Empty every dict attribute named like ``*cache*`` in ``module``'s tree; True if there were any.

    >>> import torch
    >>> clear_parameter_caches(torch.nn.Linear(2, 2))
    False
    """
    caches = parameter_caches(module)
    for cache in caches:
        cache.clear()
    return bool(caches)


def get_path(root: nn.Module, path: str) -> Any:
    """``root.<path>`` or None.

    >>> import torch
    >>> get_path(torch.nn.Sequential(torch.nn.Linear(2, 3)), "0.weight").shape, get_path(torch.nn.Linear(1, 1), "x")
    (torch.Size([3, 2]), None)
    """
    obj: Any = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


torch.fx.wrap("call_leaf")  # so a PartitionedModel's graph module can itself be traced again
torch.fx.wrap("call_leaf_clearing_caches")
