"""``PartitionedModel``: the module ``partitionify`` returns: forward dispatch and public queries.

What its rewritten graph calls at run time lives in ``runtime``; per-example subnetworks in ``per_example``;
how each original tensor was treated in ``records``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn

from .._validation import check_choice, check_partition, check_subnetwork
from ..errors import PartitionArgumentError, PartitionCheckpointError
from ..per_example import batch_size, checked_routing, forward_grouped, forward_one_pass, supports_one_pass
from ..transforms.base import HyperparameterModule, outermost_hyperparameter_modules
from .flat import FlatGroup
from .kinds import partition_kind
from .params import PartitionedTensor, gradient_only_to
from .records import ParameterRecord, records_table
from .runtime import LEAF_CALLERS, call_leaf_clearing_caches, get_path
from .tracing import VARIADIC_PREFIX

LAYOUT_BUFFERS = ("index", "unit_index")
"""A ``PartitionedTensor``'s stored layout: rebuilt identically from the partitionify seed and the name."""
DEFAULT_BUFFERS = ("default",)
"""A ``PartitionedTensor``'s default values: rebuilt identically when the original model is."""

PER_EXAMPLE_MODES = ("auto", "grouped", "one_pass")


class TracedFrom(NamedTuple):
    """What a traced model keeps of the model it was traced from, so that a call the graph cannot take faithfully
    still reaches the model: the ``original`` module tree (its partitioned parameters taken out; its submodules are
    the graph's), the forward arguments the graph is ``specialised`` to (name -> default), and ``partitionify``'s
    ``trace``."""

    original: nn.Module
    specialised: dict[str, Any]
    trace: str


def _same_value(value: Any, default: Any) -> bool:
    return value is default or (
        type(value) is type(default) and not isinstance(value, torch.Tensor) and value == default
    )


class PartitionedModel(nn.Module):
    """A model whose every parameter tensor is split into C partitions (build with ``partitionify``).

    ``pmodel(x, subnetwork=k)`` runs subnetwork k: partitions 1..k at their trained values, k+1..C at
    their defaults (k=0: all defaults; k=C, the default: the final model).
    """

    # Plain attributes kept in __dict__ (see __init__), not submodules or buffers.
    _records: list[ParameterRecord]
    _skeleton: nn.Module
    _root_leaf: bool
    _container: str | None
    _one_pass_supported: bool | None
    _traced_from: TracedFrom | None
    _signature: tuple[inspect.Signature, set[Any]] | None

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
        assignments: str,
        root_leaf: bool,
        promoted_leaves: set[str],
        build: dict[str, Any] | None = None,
        untraced: str | None = None,
        container: str | None = None,
        traced_from: TracedFrom | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.num_partitions = num_partitions
        self.proportions = proportions
        self.scheme = scheme
        self.default = default
        self.seed = seed
        self.assignments = assignments
        self.promoted_leaves = sorted(promoted_leaves)
        self.build = build
        """How the original model was built (``models.build_model``'s name, classes and input channels), when it
        was built by name and converted without rules; None otherwise."""
        # Plain attributes (not submodules): the skeleton must not show up in parameters() or state_dict.
        self.__dict__["_records"] = records
        self.__dict__["_skeleton"] = skeleton
        self.__dict__["_root_leaf"] = root_leaf
        # The child of ``module`` that holds the partitioned tensors; a model called whole must not meet it
        # (an nn.Sequential would call it as a layer): it is out of the module tree while the model runs.
        self.__dict__["_container"] = container
        self.untraced = untraced
        """Why the model runs untraced, its own ``forward`` fed each subnetwork's tensors (``partitionify``'s
        ``trace``); None when torch.fx traced it (or it is a single layer, called whole)."""
        self.per_example = "auto"
        """How ``forward`` runs per-example subnetworks: ``"one_pass"`` (node partitioning of conv/linear
        layers and norm scales only: see ``partition_fx.per_example.one_pass``), ``"grouped"`` (one forward per distinct
        subnetwork), or ``"auto"`` (one pass where the model supports it)."""
        self.__dict__["_one_pass_supported"] = None
        self.__dict__["_traced_from"] = traced_from
        self.__dict__["_signature"] = None

    @property
    def records(self) -> tuple[ParameterRecord, ...]:
        """How each original parameter tensor was treated, in the original ``named_parameters`` order."""
        return tuple(self._records)

    @property
    def skeleton(self) -> nn.Module:
        """The original module tree on the meta device (no memory): what exports are rebuilt from.
        Deep-copy it before filling it in."""
        return self._skeleton

    @property
    def original_class(self) -> type:
        """The class of the converted model (and of what ``export_subnetwork`` returns)."""
        return type(self._skeleton)

    def check_subnetwork(self, subnetwork: object) -> int:
        """``subnetwork`` as an int in 0..C (``None`` means C), or a clear error.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> partitionify(torch.nn.Linear(2, 2), 3).check_subnetwork(None)
        3
        """
        return check_subnetwork(subnetwork, self.num_partitions)

    def forward(
        self,
        *args: Any,
        subnetwork: int | torch.Tensor | None = None,
        grad_partition: int | torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run subnetwork ``subnetwork`` (0..C; default C).

        ``subnetwork`` may also be a 1-D integer tensor with one entry per example: example i then goes
        through subnetwork ``subnetwork[i]`` (every tensor argument whose first dimension is the batch size
        is split; see ``partition_fx.per_example``). ``grad_partition`` (an int, or one per example) lets the
        loss reach only that partition's parameters (0: none), as a parameter step of that partition
        needs; None lets gradients reach every partition the subnetwork uses. ``per_example`` chooses how
        per-example subnetworks run.
        """
        per_example = isinstance(subnetwork, torch.Tensor) and subnetwork.dim() == 1
        refused_for = "per-example subnetworks (subnetwork= a tensor)" if per_example else ""
        beyond = self._beyond_the_graph(args, kwargs, refused_for)
        if per_example:
            self.check_traced("per-example subnetworks (subnetwork= a tensor)")
            return self._forward_per_example(args, kwargs, subnetwork, grad_partition)  # type: ignore[arg-type]
        k = self.check_subnetwork(subnetwork)
        run = self._forward_untraced if beyond else self._forward
        if grad_partition is None:
            return run(k, args, kwargs)
        if isinstance(grad_partition, torch.Tensor):
            grad_partition = int(grad_partition)  # a single value for the whole batch
        with gradient_only_to(self.check_subnetwork(grad_partition)):
            return run(k, args, kwargs)

    def _beyond_the_graph(self, args: tuple[Any, ...], kwargs: dict[str, Any], refused_for: str) -> bool:
        """Whether a call passes what the traced graph cannot take faithfully: another value for an argument the
        graph is specialised to (``labels=`` of a Hugging Face model), or a keyword or extra positional argument
        the forward's ``**kwargs``/``*args`` would take and the graph never reads. Such a call runs the model's own
        forward (as ``trace="never"`` would); it is refused, naming the argument, for per-example subnetworks
        (``refused_for``) and for a model converted with ``trace="always"``."""
        traced_from = self._traced_from
        if traced_from is None or (not kwargs and len(args) <= 1):
            return False
        found = self._signature
        if found is None:  # read once: the forward's signature, and the graph's inputs it reads
            graph: torch.fx.Graph = self.module.graph  # type: ignore[assignment]  # a traced model's is a GraphModule
            read = {n.target for n in graph.nodes if n.op == "placeholder" and n.users}
            found = (inspect.signature(traced_from.original.forward), read)
            self.__dict__["_signature"] = found
        signature, read = found
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return False  # the graph's forward raises Python's own error for the call
        name = None
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if name in traced_from.specialised and not _same_value(value, traced_from.specialised[name]):
                break
            star = VARIADIC_PREFIX.get(kind)
            if star is not None and value and star + name not in read:
                name = f"{next(iter(value))}" if kind == inspect.Parameter.VAR_KEYWORD else f"*{name}"
                break
        else:
            return False
        why = (
            f"{name}= is not an input of this {self.original_class.__name__}'s traced graph: torch.fx traced it with "
            f"{name} at its default"
        )
        if refused_for:
            raise PartitionArgumentError(
                f"{refused_for} need the traced graph, and {why}: leave {name}= out, or run one subnetwork per call "
                "(subnetwork= an int), which passes it to the model's own forward"
            )
        if traced_from.trace == "always":
            raise PartitionArgumentError(
                f"{why} (trace='always'): leave {name}= out, or convert with trace='auto', whose calls that pass it "
                "run the model's own forward"
            )
        return True

    def _forward_untraced(self, k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Subnetwork k through the model's own forward, untraced: its module tree fed every original tensor."""
        assert self._traced_from is not None
        original = self._traced_from.original
        for name, module in original.named_modules():  # in the graph's modes (its submodules are the same)
            counterpart = get_path(self.module, name) if name else self.module
            module.training = counterpart.training if isinstance(counterpart, nn.Module) else self.module.training
        return call_leaf_clearing_caches(original, self.original_state(k), *args, **kwargs)

    def check_traced(self, what: str) -> None:
        """Refuse ``what`` (something that needs the traced graph) for an untraced model, in one line naming why
        the model is untraced and the fix.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> partitionify(model, 2, trace="never").check_traced("the fused iteration")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: the fused iteration needs a model torch.fx traced, ...
        """
        if self.untraced is not None:
            reason = self.untraced.splitlines()[0]
            raise PartitionArgumentError(
                f"{what} needs a model torch.fx traced, but this {self.original_class.__name__} runs untraced "
                f"({reason}): run one subnetwork per call (subnetwork= an int; train with fused=False and "
                "every_partition=False), or make its forward traceable and convert it with trace='always'"
            )

    def _forward(self, k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._root_leaf:
            params = self.effective_parameters(k)
            with self._partitions_out_of_the_tree():
                return call_leaf_clearing_caches(self.module, params, *args, **kwargs)
        return self.module(k, *args, **kwargs)

    def _partitions(self) -> nn.Module:
        """The module that holds the partitioned tensors."""
        assert self._container is not None
        return self.module.get_submodule(self._container)

    @contextmanager
    def _partitions_out_of_the_tree(self) -> Iterator[None]:
        children = self.module._modules
        if self._container not in children:
            yield
            return
        kept = list(children.items())
        children.pop(self._container)
        try:
            yield
        finally:
            children.clear()
            children.update(kept)

    def _forward_group(self, args: tuple[Any, ...], kwargs: dict[str, Any], k: int, g: int | None) -> Any:
        return self.forward(*args, subnetwork=k, grad_partition=g, **kwargs)

    def _forward_per_example(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], ks: torch.Tensor, gs: int | torch.Tensor | None
    ) -> Any:
        """Example i through subnetwork ks[i]: in one pass (``per_example.one_pass``) where the model and
        ``per_example`` allow, else one forward per group of examples (``per_example.grouped``)."""
        mode = check_choice("per_example", self.per_example, PER_EXAMPLE_MODES)
        compiled = self.__dict__.get("_compiled", False)
        if mode == "one_pass" and compiled:
            raise PartitionArgumentError(
                "per_example='one_pass' routes examples by a context the compiled graph would guard on (one graph "
                "per batch); a compiled model groups examples by subnetwork: use per_example='auto' or 'grouped'"
            )
        one_pass = mode != "grouped" and not compiled and self.supports_one_pass()
        if mode == "one_pass" and not one_pass:
            raise PartitionArgumentError(
                "per_example='one_pass' needs node partitioning (scheme='node') with every partitioned tensor "
                "a conv/linear weight or bias or a norm affine, each used only by its layer; this model has "
                "others (see describe()). Use per_example='auto' to group examples by subnetwork instead."
            )
        routing = checked_routing(ks, gs, batch_size(args, kwargs), self.num_partitions)
        if one_pass:
            return forward_one_pass(self.module, self.num_partitions, args, kwargs, routing)  # type: ignore[arg-type]
        return forward_grouped(self._forward_group, args, kwargs, routing, self.num_partitions)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile the subnetworks' forward in place with ``torch.compile`` (its arguments: ``mode=``,
        ``backend=``, ...); parameters, ``state_dict`` keys and exports are unchanged.

        The rewritten graph is compiled, not this wrapper: a forward through subnetwork k compiles once per
        (k, gradient partition, grad mode, train/eval, whether the input needs a gradient) and is reused
        after, with no graph break; a training run uses about 4C such graphs. Per-example subnetworks
        (``subnetwork=`` a tensor) group the examples on the host and run each group through its compiled
        graph (``per_example="one_pass"`` is refused: its routing would be guarded per batch). Dynamo's
        recompile limit is raised to 8(C+1), so that no graph a run uses falls back to eager.

        Example::

            >>> import torch
            >>> from partition_fx import export_subnetwork, partitionify
            >>> pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh()), 3)
            >>> pmodel.compile(backend="eager")
            >>> x = torch.randn(2, 4)
            >>> torch.allclose(pmodel(x, subnetwork=2), export_subnetwork(pmodel, 2)(x))
            True
        """
        import torch._dynamo

        graphs = 8 * (self.num_partitions + 1)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
        self.module.compile(*args, **kwargs)
        self.__dict__["_compiled"] = True

    def supports_one_pass(self) -> bool:
        """Whether per-example subnetworks can run in one pass (see ``partition_fx.per_example.one_pass``).

        >>> import torch
        >>> from partition_fx import partitionify
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        >>> partitionify(model, 2, scheme="node").supports_one_pass(), partitionify(model, 2).supports_one_pass()
        (True, False)
        """
        supported = self._one_pass_supported
        if supported is None:
            kinds = (PartitionedTensor, FlatGroup)
            tensors = {name: m for name, m in self.module.named_modules() if isinstance(m, kinds)}
            module = self.module
            supported = (
                partition_kind(self.scheme).one_pass == "layer"  # the scheme's conv/linear tensors are routed
                and not self._root_leaf
                and isinstance(module, torch.fx.GraphModule)
                and supports_one_pass(module, tensors, LEAF_CALLERS)
            )
            self.__dict__["_one_pass_supported"] = supported
        return supported

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

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``, refusing with one clear message a state written before flat storage
        (``partition_fx.fx.flat``), whose partitions are stored per tensor."""
        own = set(self.state_dict(keep_vars=True))
        legacy = [key for key in state_dict if key.endswith(".part1") and key not in own]
        if legacy and any(".flat_groups" in key for key in own):
            raise PartitionCheckpointError(
                f"this state dict stores partitions per tensor ({legacy[0]}, ...), as partition-fx did before flat "
                "storage; this model keeps them in flat groups (module.partitioned.flat_groups.*). Export the old "
                "model with that version (export_subnetwork) or partitionify and train again"
            )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def flat_groups(self) -> Iterator[tuple[str, FlatGroup]]:
        """``(name, FlatGroup)`` for every group of partitioned tensors in flat storage (``partition_fx.fx.flat``).

        >>> import torch
        >>> from partition_fx import partitionify
        >>> [(group.kind, len(group.members)) for _, group in partitionify(torch.nn.Linear(3, 2), 2).flat_groups()]
        [('random', 2)]
        """
        for name, module in self.named_modules():
            if isinstance(module, FlatGroup):
                yield name, module

    def rebuilt_buffers(self, defaults: bool = False) -> dict[str, torch.Tensor]:
        """The ``state_dict`` entries that ``partitionify`` builds again, identically, from the same arguments:
        every stored layout (``index``, ``unit_index``: a hash of the seed and the names), and with
        ``defaults=True`` the default values too (``default``: the original model's values, the same only if
        the model is rebuilt the same way, e.g. the same seed and weights file). None of them train;
        checkpoints leave them out and store a digest instead (``partition_fx.training.checkpoint``).

        >>> import torch
        >>> from partition_fx import partitionify
        >>> pmodel = partitionify(torch.nn.Linear(4, 2), 2)
        >>> sorted(pmodel.rebuilt_buffers()), len(pmodel.rebuilt_buffers(defaults=True))
        (['module.partitioned.flat_groups.0.index'], 2)
        """
        names = LAYOUT_BUFFERS + DEFAULT_BUFFERS if defaults else LAYOUT_BUFFERS
        found: dict[str, torch.Tensor] = {}
        for prefix, module in self.named_modules():
            if isinstance(module, (PartitionedTensor, FlatGroup)):
                for name, buffer in module.named_buffers(recurse=False):
                    if name in names:
                        found[f"{prefix}.{name}"] = buffer
        return found

    def effective_parameters(self, k: int | None = None) -> dict[str, torch.Tensor]:
        """Subnetwork k's value of every partitioned tensor, under each of its original names.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> sorted(partitionify(torch.nn.Linear(3, 2), 2).effective_parameters(0))
        ['bias', 'weight']
        """
        k = self.check_subnetwork(k)
        grouped = {id(m): v for _, group in self.flat_groups() for m, v in zip(group.members, group(k))}
        out: dict[str, torch.Tensor] = {}
        for record in self._records:
            if record.partitioned is not None:
                pt = record.partitioned
                value = grouped[id(pt)] if id(pt) in grouped else pt(k)
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
        check_partition(k, self.num_partitions)
        params: list[nn.Parameter] = []
        seen: set[int] = set()
        for record in self._records:
            if record.partitioned is not None:
                part = record.partitioned.storage(k)  # flat storage: one parameter for the whole group
                if id(part) not in seen and part.requires_grad and part.numel() > 0:
                    params.append(part)
                    seen.add(id(part))
            elif k == 1 and record.treatment == "shared":
                params.append(self.module.get_parameter(record.names[0]))
        return params

    def hyperparameter_modules(self) -> Iterator[tuple[str, HyperparameterModule]]:
        """``(name, module)`` for every ``HyperparameterModule`` inside the model (e.g. ``ConcreteDropout``),
        outermost only; their parameters are the model's own hyperparameters.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.transforms import ConcreteDropout
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), ConcreteDropout(p=0.2), torch.nn.Linear(8, 2))
        >>> [name for name, _ in partitionify(model, 2).hyperparameter_modules()]
        ['1']
        """
        yield from outermost_hyperparameter_modules(self.module)

    def original_state(self, k: int | None = None) -> dict[str, torch.Tensor]:
        """Every original parameter and buffer name -> subnetwork k's value (not copies)."""
        effective = self.effective_parameters(k)
        state: dict[str, torch.Tensor] = {}
        for name, _ in self._skeleton.named_parameters(remove_duplicate=False):
            state[name] = effective[name] if name in effective else get_path(self.module, name)
        for name, _ in self._skeleton.named_buffers(remove_duplicate=False):
            state[name] = get_path(self.module, name)
        return state

    def describe(self) -> str:
        """A table: per tensor, its treatment, its entries per partition, and why.

        >>> import torch
        >>> from partition_fx import partitionify
        >>> print(partitionify(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.LayerNorm(2)), 2).describe())
        PartitionedModel of Sequential: C=2, proportions=(0.5, 0.5), scheme='random'
        default='init', assignments='stored', seed=0
        tensor    shape  treatment  p1  p2  note
        --------  -----  ---------  --  --  -------------------
        0.weight  2x4    random     4   4   weight of Linear
        0.bias    2      random     1   1   bias of Linear
        1.weight  2      product    2   2   affine of LayerNorm
        1.bias    2      sum        2   2   affine of LayerNorm
        total                       9   9
        """
        lines = [
            f"PartitionedModel of {self.original_class.__name__}: C={self.num_partitions}, "
            f"proportions={self.proportions}, scheme={self.scheme!r}",
            f"default={self.default!r}, assignments={self.assignments!r}, seed={self.seed}",
        ]
        if self.untraced is not None:
            lines.append(f"untraced, its forward run as written: {self.untraced.splitlines()[0]}")
        elif self.promoted_leaves:
            promoted = ["<whole model>" if n == "" else n for n in self.promoted_leaves]
            lines.append(
                "called as whole calls (their code depends on .training, or fx cannot trace it): " + ", ".join(promoted)
            )
        lines += records_table(self._records, self.num_partitions)
        buffers = list(self._skeleton.named_buffers())
        if buffers:
            count = sum(b.numel() for _, b in buffers)
            lines.append(
                f"buffers (not partitioned; shared by every subnetwork): {len(buffers)} tensors, {count} entries"
            )
        return "\n".join(lines)

    def extra_repr(self) -> str:
        return (
            f"num_partitions={self.num_partitions}, proportions={self.proportions}, scheme={self.scheme!r}, "
            f"default={self.default!r}, seed={self.seed}, assignments={self.assignments!r}"
        )
