"""The partition kinds, each registered once: how a parameter tensor is split into C partitions.

A kind's name is a tensor's treatment (``describe``, ``PartitionedTensor.kind``), what ``PartitionConfig(kind=)``
sets and, for the kinds that are schemes, what ``partitionify(scheme=)`` and ``--scheme`` take. Its entry says
which ``PartitionedTensor`` class builds it, how flat storage (``partition_fx.fx.flat``) stores and groups it, how
subnetwork k combines whole copies, and whether one-pass per-example routing (``per_example.one_pass``) takes
it. ``treatment``, ``params``, ``flat``, ``config``, ``rewrite``, ``per_example``, ``partitioned_model``,
``testing`` and the command line read this table instead of branching on kind names or tensor classes; a new
kind is one :func:`register_kind` call (timm's ``register_notrace_module`` is the model).

This module imports no torch (``partition-fx --help`` lists the schemes): a kind names its tensor class by
import path, imported on first use, as a plugin's entry point is.

>>> [kind.name for kind in partition_kinds()]
['random', 'node', 'product', 'sum']
>>> kind_names(scheme=True), kind_names(rule=True)
(('random', 'node'), ('random', 'product', 'sum'))
>>> partition_kind("node").tensor_class().__name__
'RandomPartitionedTensor'
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import PartitionArgumentError

Storage = Literal["layout", "copies"]
OnePass = Literal["layer", "norm"]


@dataclass(frozen=True)
class PartitionKind:
    """One way of partitioning a tensor.

    Attributes:
        name: what the kind is called (``PartitionedTensor.kind``, the treatment ``describe`` prints).
        description: one line for the command line's help and the docs.
        tensor: the ``PartitionedTensor`` subclass that builds it (through its ``from_parameter``), or its
            ``"module:Class"`` import path, imported on first use.
        storage: how its parts hold the values, which decides how flat storage stores a group of them:
            ``"layout"``, each entry (a whole row with ``units``) belongs to one partition and a layout index
            puts the parts' entries in place (a group: one gather); ``"copies"``, C copies of the whole tensor,
            combined by ``combine`` (a group: k-1 elementwise operations); None, kept out of flat storage.
        group_by: the tensor's attributes that must agree, besides kind, dtype, device, ``requires_grad`` and
            C, for tensors to share a flat group.
        units: partitioned by output unit (node partitioning): each row of a conv/linear weight follows its
            unit, and a layer's weight and bias are salted alike so that their units agree.
        combine: ``"copies"``: how subnetwork k combines copies 1..k (``combine(out, copy)``, a picklable
            function); ``identity``: the value copies 2..C start at, so every subnetwork starts as the original.
        scheme: a value of ``partitionify(scheme=)`` and ``--scheme``: the kind that the tensors with output
            units (conv/linear weights and biases) take when nothing chooses another.
        rule: a value of ``PartitionConfig(kind=)``.
        one_pass: how one-pass per-example routing applies it: ``"layer"`` (a conv/linear weight or bias run
            with the full weights and masked per output unit), ``"norm"`` (a norm affine applied per example),
            None (the model falls back to grouping examples by subnetwork).
    """

    name: str
    description: str
    tensor: type | str
    storage: Storage | None = None
    group_by: tuple[str, ...] = ()
    units: bool = False
    combine: Callable[[Any, Any], Any] | None = None
    identity: float | None = None
    scheme: bool = False
    rule: bool = False
    one_pass: OnePass | None = None

    def tensor_class(self) -> type:
        """The ``PartitionedTensor`` subclass that builds this kind (imported now if named by path).

        >>> partition_kind("sum").tensor_class().__name__
        'ScalePartitionedTensor'
        """
        if isinstance(self.tensor, type):
            return self.tensor
        module, _, name = self.tensor.partition(":")
        tensor_class: type = getattr(importlib.import_module(module), name)
        return tensor_class


PARTITION_KINDS: dict[str, PartitionKind] = {}
"""Every registered kind by name, in registration order (:func:`register_kind` adds to it)."""


def register_kind(kind: PartitionKind) -> PartitionKind:
    """Add ``kind`` to the table; a name already registered is refused. Returns ``kind``.

    >>> register_kind(partition_kind("random"))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: partition kind 'random' is registered already
    """
    if kind.name in PARTITION_KINDS:
        raise PartitionArgumentError(f"partition kind {kind.name!r} is registered already")
    if kind.storage == "copies" and (kind.combine is None or kind.identity is None):
        raise PartitionArgumentError(f"partition kind {kind.name!r}: copies need a combine and an identity")
    PARTITION_KINDS[kind.name] = kind
    return kind


def partition_kind(name: str) -> PartitionKind:
    """The registered kind called ``name``.

    >>> partition_kind("product").combine(2.0, 3.0)
    6.0
    >>> partition_kind("nodes")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: unknown partition kind 'nodes'; registered: random, node, ...
    """
    kind = PARTITION_KINDS.get(name)
    if kind is None:
        raise PartitionArgumentError(
            f"unknown partition kind {name!r}; registered: {', '.join(PARTITION_KINDS)} "
            "(partition_fx.fx.kinds.register_kind adds one)"
        )
    return kind


def partition_kinds() -> tuple[PartitionKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(PARTITION_KINDS.values())


def kind_names(*, scheme: bool | None = None, rule: bool | None = None) -> tuple[str, ...]:
    """The names of the registered kinds, those that are (or are not) schemes or rule kinds if asked.

    >>> kind_names(), kind_names(scheme=False)
    (('random', 'node', 'product', 'sum'), ('product', 'sum'))
    """
    return tuple(
        kind.name
        for kind in PARTITION_KINDS.values()
        if (scheme is None or kind.scheme == scheme) and (rule is None or kind.rule == rule)
    )


_LAYOUT_GROUP = ("regenerated", "default_mode", "per_unit")  # regenerated and stored layouts gather differently

register_kind(
    PartitionKind(
        "random",
        "each entry of a tensor to a random partition",
        "partition_fx.fx.params:RandomPartitionedTensor",
        storage="layout",
        group_by=_LAYOUT_GROUP,
        scheme=True,
        rule=True,
    )
)
register_kind(
    PartitionKind(
        "node",
        "whole output units",
        "partition_fx.fx.params:RandomPartitionedTensor",
        storage="layout",
        group_by=_LAYOUT_GROUP,
        units=True,
        scheme=True,
        one_pass="layer",
    )
)
register_kind(
    PartitionKind(
        "product",
        "C copies, subnetwork k using their product (norm scales, scalar scales)",
        "partition_fx.fx.params:ScalePartitionedTensor",
        storage="copies",
        combine=operator.mul,
        identity=1.0,
        rule=True,
        one_pass="norm",
    )
)
register_kind(
    PartitionKind(
        "sum",
        "C copies, subnetwork k using their sum (norm shifts, scalar biases)",
        "partition_fx.fx.params:ScalePartitionedTensor",
        storage="copies",
        combine=operator.add,
        identity=0.0,
        rule=True,
        one_pass="norm",
    )
)
