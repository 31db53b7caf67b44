"""fx tracing that keeps modules' behaviour: a leaf-aware tracer and a train/eval consistency check.

Leaves (called as a whole, never entered): torch.nn and torch.ao.nn modules (except containers),
``HyperparameterModule`` subclasses, timm's registered no-trace modules and functions, modules named in
``PartitionConfig.leaf_modules``,
and any module whose traced code differs between ``.train()`` and ``.eval()`` (found by tracing in both
modes), so BatchNorm, dropout and drop-path still switch after conversion.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch.fx as fx
from timm.layers import get_notrace_functions, get_notrace_modules
from torch import nn

from ..errors import PartitionError, first_line
from ..transforms.base import HyperparameterModule

_MAX_LEAF_ROUNDS = 64
TRACE_MODES = ("auto", "always", "never")
"""How ``partitionify`` runs a model's code (its ``trace=``): ``always`` traces it with torch.fx and refuses what fx
cannot trace; ``auto`` traces it, calling a submodule fx cannot trace as one call and the whole model untraced when
its own forward cannot be traced; ``never`` calls the whole model untraced."""


class TraceFailure(PartitionError):
    """fx could not trace a model: the message names the module, the line and the fix; ``where`` is the module's
    qualified name ('' for the model's own forward)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


class Traced(NamedTuple):
    """What :func:`trace_consistently` found: the ``graph``, the modules ``promoted`` to whole calls (``''``: the
    whole model is one call), why the model runs ``untraced`` (None: it is traced, or a lone leaf), and the forward
    arguments the graph is ``specialised`` to (:func:`concrete_default_args`; empty unless traced)."""

    graph: fx.Graph
    promoted: set[str]
    untraced: str | None = None
    specialised: dict[str, Any] = {}


class LeafAwareTracer(fx.Tracer):
    """An ``fx.Tracer`` that does not enter the leaves described in the module docstring."""

    def __init__(self, leaf_types: Iterable[type] = (), leaf_names: Iterable[str] = ()) -> None:
        # Read at each construction: timm models register theirs when their module is imported.
        timm_modules, timm_functions = get_notrace_modules(), get_notrace_functions()
        super().__init__(autowrap_functions=tuple(timm_functions))
        # Hyperparameter modules (ConcreteDropout, ...) sample noise and switch with .train(): one call each.
        self.leaf_types = (HyperparameterModule, *timm_modules, *leaf_types)
        self.leaf_names = set(leaf_names)
        self.current_module = ""
        self.failed_module: str | None = None  # innermost module whose code raised while tracing

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names:
            return True
        if isinstance(m, self.leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def create_arg(self, a: Any) -> Any:
        """fx's, but a dataclass that is a dict (``transformers``' ``ModelOutput``s) or an ``OrderedDict`` keeps its
        type: built in the graph by its class (a dataclass from its present fields) instead of lowered to a plain
        dict."""
        dataclass_dict = isinstance(a, dict) and dataclasses.is_dataclass(a) and all(isinstance(k, str) for k in a)
        if dataclass_dict or (isinstance(a, OrderedDict) and type(a).__init__ is OrderedDict.__init__):
            items = {k: self.create_arg(v) for k, v in a.items()}
            if dataclass_dict:
                return self.create_node("call_function", type(a), (), items)
            return self.create_node("call_function", type(a), (items,), {})
        return super().create_arg(a)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        outer = self.current_module
        self.current_module = self.path_of_module(m)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_module is None:
                self.failed_module = self.current_module
            raise
        finally:
            self.current_module = outer


_CONCRETE_DEFAULT_TYPES = (type(None), bool, int, float, str)
VARIADIC_PREFIX: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
"""How fx names the placeholder of a forward's ``*args`` and ``**kwargs``."""


def _forward_parameters(model: nn.Module) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def concrete_default_args(model: nn.Module) -> dict[str, Any]:
    """Forward arguments with a None/bool/number/str default, bound to it so ``if mask is None`` and
    ``if is_causal`` trace; never the first argument, the model's input, which every caller passes (Hugging Face
    models declare theirs ``pixel_values=None``). A traced model is specialised to these values: a call passing
    another runs the model's own forward (``PartitionedModel``), never the graph.

    >>> class Classifier(nn.Module):
    ...     def forward(self, pixel_values=None, labels=None, return_dict=None, scale=1.0):
    ...         return pixel_values
    >>> concrete_default_args(Classifier())
    {'labels': None, 'return_dict': None, 'scale': 1.0}
    """
    named = [p for p in _forward_parameters(model) if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    first = _forward_parameters(model)[:1]
    return {
        p.name: p.default
        for p in named
        if p not in first and type(p.default) in _CONCRETE_DEFAULT_TYPES and p.default is not inspect.Parameter.empty
    }


def _restore_placeholder_names(graph: fx.Graph, model: nn.Module) -> None:
    """fx renames concrete arguments (``mask`` -> ``mask_1``); give the inputs their original names
    back so keyword calls keep working (``*args`` and ``**kwargs`` keep their places)."""
    parameters = _forward_parameters(model)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if parameters and len(placeholders) == len(parameters):
        for node, p in zip(placeholders, parameters):
            node.target = VARIADIC_PREFIX.get(p.kind, "") + p.name


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame outside torch, e.g. ``model.py:42 in forward: if x.sum() > 0:``."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "/torch/" not in f.filename and not f.filename.endswith("partition_fx/fx/tracing.py")
    ]
    if not frames:
        return "unknown location"
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def _trace_once(model: nn.Module, leaf_types: tuple[type, ...], leaf_names: set[str], mode_note: str = "") -> fx.Graph:
    """Trace ``model`` in its current mode, or raise a :class:`TraceFailure` (``mode_note`` follows the model's name
    in its message)."""
    tracer = LeafAwareTracer(leaf_types, leaf_names)
    bound = concrete_default_args(model)
    try:
        graph = tracer.trace(model, concrete_args=bound or None)
    except Exception as e:  # fx raises TraceError, TypeError, RuntimeError, ... for untraceable code
        where = tracer.failed_module or ""
        owner = model.get_submodule(where)
        if where:
            fix = (
                f"Trace that module as one call: partitionify(..., trace='auto') does, as does config="
                f"PartitionConfig().add_leaf_module({type(owner).__name__}) or .add_leaf_module('{where}')."
            )
        else:
            fix = (
                "The failing code is in the model's own forward: partitionify(..., trace='auto') runs the model "
                "untraced (one subnetwork per call), or make it traceable."
            )
        said = first_line(e) if str(e).strip() else ""
        cause = "data-dependent control flow or Python operations on traced values"
        nones = [name for name, value in bound.items() if value is None]
        if nones and "NoneType" in str(e):  # the code used an argument fx was tracing at its default None
            cause = (
                f"code that uses an argument fx traced at its default None ({', '.join(f'{n}=None' for n in nones)}): "
                "a traced graph is specialised to those defaults"
            )
        raise TraceFailure(
            f"could not trace {type(model).__name__}{mode_note}: module '{where or '<root>'}' ({type(owner).__name__}) "
            f"at {_user_frame(e)}\n  {type(e).__name__}: {said}\n  This usually means {cause}. {fix}",
            where,
        ) from None
    _restore_placeholder_names(graph, model)
    return graph


def _node_signature(node: fx.Node) -> tuple[Any, ...]:
    return (node.op, str(node.target), str(node.args), str(node.kwargs))


def _first_difference(a: fx.Graph, b: fx.Graph) -> fx.Node | None:
    nodes_a, nodes_b = list(a.nodes), list(b.nodes)
    for na, nb in zip(nodes_a, nodes_b):
        if _node_signature(na) != _node_signature(nb):
            return na
    if len(nodes_a) != len(nodes_b):
        longer = nodes_a if len(nodes_a) > len(nodes_b) else nodes_b
        return longer[min(len(nodes_a), len(nodes_b))]
    return None


def _responsible_module(node: fx.Node) -> str:
    """Qualified name of the innermost non-leaf module whose code created ``node`` ('' = root)."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    paths = [path for path, _ in stack]
    if node.op == "call_module" and paths and paths[-1] == node.target:
        paths = paths[:-1]  # the node is the call of a leaf; its caller made the choice
    return paths[-1] if paths else ""


def _failure_as_given(
    model: nn.Module,
    was_training: bool,
    failure: TraceFailure,
    leaf_types: tuple[type, ...],
    names: set[str],
    anywhere: bool = True,
) -> TraceFailure:
    """What to report of ``failure``, which fx raised tracing ``model`` in its current mode, so that it is true in the
    mode the model was given in (a detector in eval mode, traced first in training mode, would otherwise be told
    that training mode needs targets): fx's failure in that mode, when it differs and fails too (at the same
    module unless ``anywhere``), else ``failure`` naming its mode."""
    failed_training = model.training
    if failed_training == was_training:
        return failure
    as_given: TraceFailure | None = None
    try:
        model.train(was_training)
        _trace_once(model, leaf_types, names)
    except TraceFailure as e:
        as_given = e
        if anywhere or e.where == failure.where:
            return e
    modes = ("eval", "training")
    note = f" in {modes[failed_training]} mode"
    if as_given is None:
        note += (
            f" (it traces in {modes[was_training]} mode, as given, but partitionify traces both, so that .train() and "
            ".eval() keep working)"
        )
    try:
        model.train(failed_training)
        _trace_once(model, leaf_types, names, note)
    except TraceFailure as named:
        return named
    return failure  # fx traces the same way twice: not reached


def trace_consistently(
    model: nn.Module, leaf_types: Iterable[type] = (), leaf_names: Iterable[str] = (), trace: str = "always"
) -> Traced:
    """Trace ``model`` so its graph is the same in train and eval mode, as ``trace`` (:data:`TRACE_MODES`) says.

    Returns a :class:`Traced`: the graph and the names of modules that had to become leaves because their
    traced code depended on ``self.training`` (or, with ``trace="auto"``, because fx could not trace them).
    ``''`` in ``promoted`` means the root's own forward depends on it: the caller must then call the whole model
    as one leaf; with ``untraced`` set, because the model was not traced at all (that message says why).

    >>> class Branchy(nn.Module):
    ...     def forward(self, x):
    ...         return x if x.sum() > 0 else -x  # data-dependent: fx cannot trace it
    >>> trace_consistently(Branchy(), trace="auto").untraced.splitlines()[0]
    "could not trace Branchy: module '<root>' (Branchy) at <doctest ...>:3 in forward: ..."
    """
    leaf_types = tuple(leaf_types)
    names = set(leaf_names)
    promoted: set[str] = set()
    if LeafAwareTracer(leaf_types, names).is_leaf_module(model, ""):
        return Traced(fx.Graph(), {""})  # a lone leaf (e.g. a bare BatchNorm): call it whole
    if trace == "never":
        return Traced(fx.Graph(), {""}, f"{type(model).__name__} is not traced: partitionify(..., trace='never')")
    was_training = model.training
    modes = {name: module.training for name, module in model.named_modules()}  # each module's, as it was given
    try:
        for _ in range(_MAX_LEAF_ROUNDS):
            try:
                model.train(True)
                g_train = _trace_once(model, leaf_types, names)
                model.train(False)
                g_eval = _trace_once(model, leaf_types, names)
            except TraceFailure as failure:
                if trace != "auto":
                    raise _failure_as_given(model, was_training, failure, leaf_types, names) from None
                if failure.where == "":  # the model's own forward: nothing smaller to call whole
                    reason = _failure_as_given(model, was_training, failure, leaf_types, names, anywhere=False)
                    return Traced(fx.Graph(), {""}, str(reason))
                names.add(failure.where)  # that module as one call, the rest traced
                promoted.add(failure.where)
                continue
            diff = _first_difference(g_train, g_eval)
            if diff is None:
                return Traced(g_train if was_training else g_eval, promoted, None, concrete_default_args(model))
            culprit = _responsible_module(diff)
            if culprit == "" or culprit in names:
                promoted.add("")
                return Traced(g_train if was_training else g_eval, promoted)
            # Every instance of the culprit's class (e.g. all of a model's stochastic-depth modules)
            # becomes a leaf in this round, not one per round of two traces.
            culprit_type = type(model.get_submodule(culprit))
            same = {n for n, m in model.named_modules() if type(m) is culprit_type and n}
            names |= same
            promoted |= same
    finally:
        for name, module in model.named_modules():
            module.training = modes.get(name, was_training)
    raise PartitionError(
        f"{type(model).__name__}: more than {_MAX_LEAF_ROUNDS} modules change their traced code between "
        f"train and eval mode; list them with PartitionConfig().add_leaf_module(...)"
    )
