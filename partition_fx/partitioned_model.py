"""``PartitionedModel``: the module ``partitionify`` returns, and the calls its graph makes."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import PartitionArgumentError, PartitionTypeError
from .params import HAND_OVER, PartitionedTensor, gradient_only_to
from .transforms.base import HyperparameterModule, outermost_hyperparameter_modules


def call_leaf(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """Call a leaf module with some of its parameters replaced (the rewritten graph calls this)."""
    if HAND_OVER.get():  # the params are PartitionedTensors handed over for a one-pass, per-example forward
        from .one_pass import call_routed

        return call_routed(module, params, args, kwargs)
    return torch.func.functional_call(module, params, args, kwargs, tie_weights=False, strict=False)


def call_leaf_clearing_caches(module: nn.Module, params: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
    """``call_leaf`` for modules that cache values derived from their parameters (e.g. timm's
    ``attention_bias_cache`` in eval mode): the cache would leak one subnetwork's values into the next."""
    clear_parameter_caches(module)
    try:
        return call_leaf(module, params, *args, **kwargs)
    finally:
        clear_parameter_caches(module)


def parameter_caches(module: nn.Module) -> list[dict[Any, Any]]:
    return [
        value
        for m in module.modules()
        for name, value in vars(m).items()
        if isinstance(value, dict) and "cache" in name.lower() and not name.startswith("_")
    ]


def clear_parameter_caches(module: nn.Module) -> bool:
    """Empty every dict attribute named like ``*cache*`` in ``module``'s tree; True if there were any."""
    caches = parameter_caches(module)
    for cache in caches:
        cache.clear()
    return bool(caches)


torch.fx.wrap("call_leaf")  # so a PartitionedModel's graph module can itself be traced again
torch.fx.wrap("call_leaf_clearing_caches")


@dataclass
class ParameterRecord:
    """How one original parameter tensor was treated (for ``describe``, export and optimisation)."""

    names: list[str]
    """Every qualified name of the tensor in the original model (several when tied)."""
    shape: tuple[int, ...]
    treatment: str
    """``random``, ``product``, ``sum``, ``shared`` (left unpartitioned), ``frozen`` or ``hyper`` (a parameter
    of a ``HyperparameterModule``: unpartitioned, stepped by the hyperparameter optimiser)."""
    reason: str
    partitioned: PartitionedTensor | None = None


def get_path(root: nn.Module, path: str) -> Any:
    """``root.<path>`` or None."""
    obj: Any = root
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


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
        assignments: str,
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
        self.assignments = assignments
        self.promoted_leaves = sorted(promoted_leaves)
        # Plain attributes (not submodules): the skeleton must not show up in parameters() or state_dict.
        self.__dict__["_records"] = records
        self.__dict__["_skeleton"] = skeleton
        self.__dict__["_root_leaf"] = root_leaf
        self.per_example = "auto"
        """How ``forward`` runs per-example subnetworks: ``"one_pass"`` (node partitioning of conv/linear
        layers and norm scales only: see ``partition_fx.one_pass``), ``"grouped"`` (one forward per distinct
        subnetwork), or ``"auto"`` (one pass where the model supports it)."""
        self.__dict__["_one_pass_supported"] = None

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
        is split; see ``_forward_per_example``). ``grad_partition`` (an int, or one per example) lets the
        loss reach only that partition's parameters (0: none), as a parameter step of that partition
        needs; None lets gradients reach every partition the subnetwork uses. ``per_example`` chooses how
        per-example subnetworks run.
        """
        if isinstance(subnetwork, torch.Tensor) and subnetwork.dim() == 1:
            if self.per_example not in ("auto", "grouped", "one_pass"):
                raise PartitionArgumentError(
                    f"per_example must be 'auto', 'grouped' or 'one_pass', got {self.per_example!r}"
                )
            if self.per_example != "grouped" and self.supports_one_pass():
                return self._forward_one_pass(args, kwargs, subnetwork, grad_partition)
            if self.per_example == "one_pass":
                raise PartitionArgumentError(
                    "per_example='one_pass' needs node partitioning (scheme='node') with every partitioned tensor "
                    "a conv/linear weight or bias or a norm affine, each used only by its layer; this model has "
                    "others (see describe()). Use per_example='auto' to group examples by subnetwork instead."
                )
            return self._forward_per_example(args, kwargs, subnetwork, grad_partition)
        k = self.check_subnetwork(subnetwork)
        if grad_partition is None:
            return self._forward(k, args, kwargs)
        if isinstance(grad_partition, torch.Tensor):
            grad_partition = int(grad_partition)  # a single value for the whole batch
        with gradient_only_to(self.check_subnetwork(grad_partition)):
            return self._forward(k, args, kwargs)

    def _forward(self, k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._root_leaf:
            return call_leaf_clearing_caches(self.module, self.effective_parameters(k), *args, **kwargs)
        return self.module(k, *args, **kwargs)

    def _per_example_values(self, name: str, values: torch.Tensor, batch: int) -> torch.Tensor:
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise PartitionTypeError(f"{name} per example must be an integer tensor, got {values.dtype}")
        if values.shape != (batch,):
            raise PartitionArgumentError(
                f"{name} per example must have shape ({batch},) (the batch size), got {tuple(values.shape)}"
            )
        if values.numel() and (int(values.min()) < 0 or int(values.max()) > self.num_partitions):
            raise PartitionArgumentError(
                f"{name} values must be in 0..{self.num_partitions}, got {int(values.min())}..{int(values.max())}"
            )
        return values.long()

    def supports_one_pass(self) -> bool:
        """Whether per-example subnetworks can run in one pass (see ``partition_fx.one_pass``)."""
        if self._one_pass_supported is None:
            from .one_pass import supports_one_pass

            tensors = {name: m for name, m in self.module.named_modules() if isinstance(m, PartitionedTensor)}
            ok = self.scheme == "node" and not self._root_leaf and isinstance(self.module, torch.fx.GraphModule)
            self.__dict__["_one_pass_supported"] = ok and supports_one_pass(
                self.module, tensors, {call_leaf, call_leaf_clearing_caches}
            )
        return self._one_pass_supported

    def _batch_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        from torch.utils import _pytree as pytree

        first = next((a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and a.dim()), None)
        if first is None:
            raise PartitionArgumentError("per-example subnetworks need a tensor input with a batch dimension")
        return first.shape[0]  # the first tensor argument's first dimension is the batch

    def _routing_values(self, ks: torch.Tensor, gs: int | torch.Tensor | None, batch: int):
        ks = self._per_example_values("subnetwork", ks, batch)
        if gs is None:
            return ks, None
        if not (isinstance(gs, torch.Tensor) and gs.dim() == 1):
            gs = torch.full((batch,), self.check_subnetwork(gs), dtype=torch.long, device=ks.device)
        gs = self._per_example_values("grad_partition", gs, batch).to(ks.device)
        if bool((gs > ks).any()):
            i = int(torch.nonzero(gs > ks)[0])
            raise PartitionArgumentError(
                f"example {i} would train partition {int(gs[i])} through subnetwork {int(ks[i])}, which "
                "does not use it; grad_partition must be <= subnetwork (0: no partition)"
            )
        return ks, gs

    def _forward_one_pass(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], ks: torch.Tensor, gs: int | torch.Tensor | None
    ) -> Any:
        """Every example through its own subnetwork in one forward (node partitioning: ``one_pass``). Exact
        where the grouped forward is; in train mode BatchNorm normalises the whole batch with one set of
        statistics (the grouped forward uses one per group)."""
        from .one_pass import Routing, routed

        batch = self._batch_of(args, kwargs)
        ks, gs = self._routing_values(ks, gs, batch)
        with routed(Routing(ks, gs)):
            return self.module(self.num_partitions, *args, **kwargs)

    def _forward_per_example(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], ks: torch.Tensor, gs: int | torch.Tensor | None
    ) -> Any:
        """Example i through subnetwork ks[i]: the batch is grouped by subnetwork (and gradient partition),
        each group runs as one batch, and the outputs are put back in the original order. Exact wherever
        an example's output does not depend on the other examples of its batch: eval mode, or models
        without batch statistics. In train mode, BatchNorm normalises each group by its own statistics
        (and updates its running statistics once per group)."""
        from torch.utils import _pytree as pytree

        flat_args, spec = pytree.tree_flatten((args, kwargs))
        batch = self._batch_of(args, kwargs)
        ks, gs = self._routing_values(ks, gs, batch)
        keys = ks * (self.num_partitions + 1) + (gs if gs is not None else 0)
        order, outputs, out_spec = [], [], None
        for key in torch.unique(keys).tolist():
            idx = torch.nonzero(keys == key).flatten()
            k, g = divmod(key, self.num_partitions + 1)
            g = g if gs is not None else None
            part = [
                a.index_select(0, idx.to(a.device))
                if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == batch
                else a
                for a in flat_args
            ]
            group_args, group_kwargs = pytree.tree_unflatten(part, spec)
            out = self.forward(*group_args, subnetwork=int(k), grad_partition=g, **group_kwargs)
            leaves, out_spec = pytree.tree_flatten(out)
            for leaf in leaves:
                if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0 or leaf.shape[0] != idx.numel():
                    raise PartitionArgumentError(
                        "per-example subnetworks need every output to be a tensor with the batch as its first "
                        f"dimension; got {type(leaf).__name__}"
                    )
            outputs.append(leaves)
            order.append(idx)
        perm = torch.cat(order)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(batch, device=perm.device)
        merged = [torch.cat(group).index_select(0, inverse.to(group[0].device)) for group in zip(*outputs)]
        return pytree.tree_unflatten(merged, out_spec)

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
            f"default={self.default!r}, seed={self.seed}, assignments={self.assignments!r}"
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
        f"scheme={pmodel.scheme!r}",
        f"default={pmodel.default!r}, assignments={pmodel.assignments!r}, seed={pmodel.seed}",
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
