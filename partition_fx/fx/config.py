"""Configuration of a conversion: global settings plus per-parameter rules with a fixed precedence.

Precedence (most specific wins), modelled on torch.ao's ``QConfigMapping``:

1. ``set_name(name, ...)``: the parameter called ``name``, or every parameter under the module ``name``;
   when several names match, the longest (deepest) one wins.
2. ``set_name_regex(pattern, ...)``: ``re.fullmatch`` against the parameter's qualified name; the
   first pattern registered that matches wins.
3. ``set_module_type(cls, ...)``: the module that owns the parameter is an instance of ``cls``; the first
   type registered that matches wins.
4. The global settings (the arguments of :func:`partition_fx.partitionify`).

Only the fields a rule sets override; a rule that sets ``default`` only keeps the automatically chosen
``kind``, and so on. Example::

    cfg = (PartitionConfig()
           .set_name("head", partition=False)             # keep the classifier shared
           .set_module_type(torch.nn.LayerNorm, default="zero")
           .add_leaf_module(MyAttentionWithControlFlow))
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from torch import nn

from .._validation import check_choice, check_flag
from ..choices import DEFAULTS
from ..errors import PartitionArgumentError, PartitionTypeError
from .kinds import kind_names

Kind = str
"""A rule kind of ``partition_fx.fx.kinds`` (``kind_names(rule=True)``: ``"random"``, ``"product"``, ``"sum"`` and
any registered since)."""
Default = Literal["init", "zero", "seed"]
"""One of ``choices.DEFAULTS`` (the test suite checks that they agree)."""


@dataclass(frozen=True)
class ParameterRule:
    """What a rule says about the parameters it matches; ``None`` fields defer to the next rule.

    Attributes:
        partition: ``False`` leaves the parameter unpartitioned: every subnetwork, subnetwork 0
            included, uses its one trained value, and it is listed with partition 1 for optimisation.
        default: ``"init"``, ``"zero"`` or ``"seed"``, the value partitions take in subnetworks that do not
            train them (see :func:`partition_fx.partitionify`).
        kind: ``"random"`` (random-weight partitions), ``"product"`` or ``"sum"`` (C copies combined by
            product or sum, appendix I.2 of the paper), or another rule kind registered in
            ``partition_fx.fx.kinds``. ``None`` chooses automatically.
    """

    partition: bool | None = None
    default: Default | None = None
    kind: Kind | None = None

    def __post_init__(self) -> None:
        # None defers to the next rule, so only set fields are checked.
        if self.partition is not None:
            check_flag("rule partition", self.partition)
        if self.default is not None:
            check_choice("rule default", self.default, DEFAULTS)
        if self.kind is not None:
            check_choice("rule kind", self.kind, kind_names(rule=True))

    def merged_over(self, base: ParameterRule) -> ParameterRule:
        """This rule's set fields on top of ``base``."""
        return replace(
            base,
            **{k: v for k, v in vars(self).items() if v is not None},
        )


@dataclass
class PartitionConfig:
    """Per-parameter rules and tracing options for :func:`partition_fx.partitionify`.

    Example::

        >>> import torch
        >>> from partition_fx import PartitionConfig
        >>> cfg = PartitionConfig().set_name("fc", partition=False)
        >>> cfg = cfg.set_module_type(torch.nn.BatchNorm2d, default="zero")
        >>> cfg.rule_for("fc.weight", torch.nn.Linear(2, 2)).partition
        False
    """

    names: dict[str, ParameterRule] = field(default_factory=dict)
    name_regexes: list[tuple[re.Pattern[str], ParameterRule]] = field(default_factory=list)
    module_types: list[tuple[type, ParameterRule]] = field(default_factory=list)
    leaf_modules: list[type | str] = field(default_factory=list)
    """Module classes or qualified module names the tracer must not enter (called as a whole)."""

    def set_name(
        self, name: str, *, partition: bool | None = None, default: Default | None = None, kind: Kind | None = None
    ) -> PartitionConfig:
        """Rule for the parameter ``name`` or every parameter of the module ``name``; returns self."""
        self.names[name] = ParameterRule(partition, default, kind)
        return self

    def set_name_regex(
        self, pattern: str, *, partition: bool | None = None, default: Default | None = None, kind: Kind | None = None
    ) -> PartitionConfig:
        """Rule for parameters whose qualified name fully matches ``pattern``; returns self."""
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise PartitionArgumentError(f"set_name_regex: invalid pattern {pattern!r}: {e}") from e
        self.name_regexes.append((compiled, ParameterRule(partition, default, kind)))
        return self

    def set_module_type(
        self,
        module_type: type[nn.Module],
        *,
        partition: bool | None = None,
        default: Default | None = None,
        kind: Kind | None = None,
    ) -> PartitionConfig:
        """Rule for parameters owned by modules that are instances of ``module_type``; returns self."""
        if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
            raise PartitionTypeError(f"set_module_type needs an nn.Module subclass, got {module_type!r}")
        self.module_types.append((module_type, ParameterRule(partition, default, kind)))
        return self

    def has_rules(self) -> bool:
        """Whether any rule or extra leaf module was added (a conversion that differs from the default one).

        >>> PartitionConfig().has_rules(), PartitionConfig().set_name("fc", partition=False).has_rules()
        (False, True)
        """
        return bool(self.names or self.name_regexes or self.module_types or self.leaf_modules)

    def add_leaf_module(self, module: type | str) -> PartitionConfig:
        """Trace ``module`` (a class, or a qualified module name) as one call; returns self."""
        if not (isinstance(module, str) or (isinstance(module, type) and issubclass(module, nn.Module))):
            raise PartitionTypeError(f"add_leaf_module needs an nn.Module subclass or a name, got {module!r}")
        self.leaf_modules.append(module)
        return self

    def rule_for(self, param_name: str, owner: nn.Module) -> ParameterRule:
        """The merged rule for one parameter, following the documented precedence."""
        rule = ParameterRule()
        for module_type, r in reversed(self.module_types):  # first registered ends on top
            if isinstance(owner, module_type):
                rule = r.merged_over(rule)
        for pattern, r in reversed(self.name_regexes):
            if pattern.fullmatch(param_name):
                rule = r.merged_over(rule)
        matches = [n for n in self.names if param_name == n or param_name.startswith(n + ".") or n == ""]
        for n in sorted(matches, key=len):  # deepest name ends on top
            rule = self.names[n].merged_over(rule)
        return rule
