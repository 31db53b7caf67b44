"""Settings: frozen dataclasses whose fields carry their default, help, choices, bounds and whether a resumed
run must match them; the machinery behind :class:`~partition_fx.job.train_config.TrainConfig`.

A configuration is a :class:`Settings` of sections, each section a :class:`Settings` of fields declared with
:func:`setting`, or a flat :class:`Settings` of fields alone (``federated.FederatedConfig``). From that one
declaration come

* the checks (run on construction, so a configuration that exists is valid),
* ``to_dict()``/``from_dict()`` (nested, JSON-ready; an unknown key is refused naming the known ones), the
  model being torch.ao's ``QConfigMapping.to_dict``/``from_dict``,
* the flat keyword spelling (``hyper_lr=0.05``), each field's keyword unique across the configuration,
  which ``fit`` takes and the command line's options are generated from (``--hyper-lr``).

No torch here: the command line builds its parser from these declarations before it loads torch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .._validation import MAX_SEED
from ..errors import PartitionArgumentError, PartitionTypeError

S = TypeVar("S", bound="Settings")

REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
"""``Option.absent_means`` of a field every written configuration holds: one without it is refused."""


@dataclass(frozen=True)
class Option:
    """What a field of a :class:`Settings` declares besides its default (see :func:`setting`)."""

    help: str
    keyword: str | None = None
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    positive: bool = False
    seed: bool = False
    metavar: str | None = None
    default_text: str | None = None
    fingerprint: bool = False
    command_line: bool = True
    const: Any = None
    bool_values: tuple[Any, Any] | None = None
    maximum: float | None = None
    validator: Callable[[str, Any], Any] | None = None
    absent_means: Any = REQUIRED


def setting(default: Any, help: str, **option: Any) -> Any:
    """A field of a :class:`Settings`: its ``default`` and its :class:`Option` (``help`` ends without the
    default, which the command line appends; ``keyword``: its flat name when not the field's own; ``choices``;
    ``minimum`` (ints) or ``positive`` (floats > 0; any other float must be finite and >= 0); ``seed``;
    ``default_text``: how the help says a None default; ``fingerprint``: a resumed run must have the same
    value; ``command_line=False``: not an option of ``partition-fx train``; ``const``: the value of the bare
    option, for an optional one such as ``--compile``; ``maximum``: the largest value, for an int or a float
    (floats then lie in [0, maximum], or (0, maximum] with ``positive``); ``validator``: a check in
    ``_validation``'s form, ``validator(name, value)`` returning the value as stored, run instead of the checks
    of the field's type, for a value the other options cannot describe, such as proportions summing to 1;
    ``absent_means``: for a field added after configurations were written without it, the value such a
    configuration had, which ``from_dict`` reads a missing key as; every other missing key is refused).

    >>> @dataclass(frozen=True)
    ... class Loop(Settings):
    ...     steps: int = setting(10, "iterations", minimum=1)
    >>> Loop(steps=3).to_dict(), Loop.from_dict({"steps": 4}).steps
    ({'steps': 3}, 4)
    """
    return dataclasses.field(default=default, metadata={"option": Option(help, **option)})


@dataclass(frozen=True)
class Field:
    """One field of a configuration, flattened: its ``path`` of attribute names from the root, its
    ``keyword``, its Python ``kind`` (int, float, str, bool or tuple), whether None is allowed, its default and its
    :class:`Option`; ``key``: how refusals name it, the keyword or (:attr:`Settings.hyphenated`) the keyword
    with ``-`` for ``_``."""

    path: tuple[str, ...]
    keyword: str
    kind: type
    optional: bool
    default: Any
    option: Option
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.keyword)

    @property
    def flag(self) -> str:
        """The command line's spelling: ``--hyper-samples``."""
        return "--" + self.keyword.replace("_", "-")


class SettingError(PartitionArgumentError):
    """A value a field refuses; ``field`` is the :class:`Field`, ``problem`` what is wrong in words that fit
    after its name (``"must be >= 1, got 0"``), so the command line can name its option instead."""

    def __init__(self, field: Field, problem: str, python_problem: str | None = None) -> None:
        super().__init__(f"{field.key} {python_problem or problem}")
        self.field = field
        self.problem = problem


class SettingTypeError(PartitionTypeError):
    """A value of the wrong type for a field (see :class:`SettingError`)."""

    def __init__(self, field: Field, problem: str) -> None:
        super().__init__(f"{field.key} {problem}")
        self.field = field
        self.problem = problem


class Settings:
    """Mixed into a frozen dataclass whose fields are :func:`setting` s or nested :class:`Settings`."""

    section_help: ClassVar[str] = ""
    """What the section is, as the command line's group title says it."""

    hyphenated: ClassVar[bool] = False
    """Whether refusals name a field by its keyword with ``-`` for ``_`` (``fraction-train``), as a
    configuration written that way does (Flower's run config, for ``FederatedConfig``)."""

    def __post_init__(self) -> None:
        for f in self.fields(recurse=False):
            value = getattr(self, f.path[-1])
            object.__setattr__(self, f.path[-1], _checked(f, value))
        self.check()

    def check(self) -> None:
        """Checks between fields, after each field was checked alone (override)."""

    @classmethod
    def fields(cls, *, recurse: bool = True) -> Iterator[Field]:
        """Every field (of the nested sections too with ``recurse``), in declaration order.

        >>> from partition_fx.job.train_config import TrainConfig
        >>> next(TrainConfig.fields()).keyword
        'steps'
        """
        own, sections = _declared(cls)  # type: ignore[arg-type]  # mypy: cls's unbound __hash__ taken for Hashable's
        for name in (f.name for f in dataclasses.fields(cls)):  # type: ignore[arg-type]
            if name in own:
                yield own[name]
            elif recurse:
                for f in sections[name].fields():
                    yield dataclasses.replace(f, path=(name, *f.path))

    @classmethod
    def sections(cls) -> dict[str, type[Settings]]:
        """The nested sections, by attribute name."""
        return dict(_declared(cls)[1])  # type: ignore[arg-type]  # as in fields()

    def to_dict(self) -> dict[str, Any]:
        """The configuration as nested plain values (JSON-ready); ``from_dict`` reads it back."""
        return {
            f.name: value.to_dict() if isinstance(value, Settings) else value
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            for value in [getattr(self, f.name)]
        }

    @classmethod
    def from_dict(cls: type[S], values: dict[str, Any], *, where: str = "") -> S:
        """The configuration ``to_dict`` wrote, exactly: an unknown key is refused with the known ones listed,
        and a missing one (:class:`MissingSettings`, naming every missing path) is never defaulted, so a
        configuration written by another version is not silently read as this one's defaults (build a
        partial configuration with ``replace`` or the named constructors instead). The one exception is a field
        declared with ``absent_means``: added later, its absence has one meaning, the value it stands for."""
        name = where or cls.__name__
        if not isinstance(values, dict):
            raise PartitionTypeError(f"{name} must be a dict, got {type(values).__name__}")
        unknown = _first_unknown(cls, values, name)  # at any depth, before anything is reported missing
        if unknown is not None:
            raise PartitionArgumentError(unknown)
        missing = [
            ".".join(f.path) for f in cls.fields() if not _has(values, f.path) and f.option.absent_means is REQUIRED
        ]
        if missing:
            raise MissingSettings(name, missing)
        sections = cls.sections()
        kwargs = {f.path[-1]: f.option.absent_means for f in cls.fields(recurse=False) if f.path[-1] not in values}
        kwargs.update(
            (key, sections[key].from_dict(value, where=f"{name}.{key}") if key in sections else value)
            for key, value in values.items()
        )
        return cls(**kwargs)

    @classmethod
    def keywords(cls) -> dict[str, Field]:
        """Every field by its flat keyword (``hyper_lr``)."""
        return {f.keyword: f for f in cls.fields()}

    def replace(self: S, **keywords: Any) -> S:
        """A copy with the fields named by their flat keywords changed; an unknown keyword is refused with
        the known ones listed.

        >>> from partition_fx.job.train_config import Optimization, TrainConfig
        >>> TrainConfig().replace(hyper_lr=0.1, steps=10).hyper.lr, Optimization().replace(steps=3).steps
        (0.1, 3)
        """
        known = self.keywords()
        unknown = sorted(set(keywords) - set(known))
        if unknown:
            raise PartitionTypeError(
                f"{type(self).__name__} got unknown argument(s) {', '.join(unknown)}; it takes "
                f"{', '.join(sorted(known))}"
            )
        own: dict[str, Any] = {}
        inner: dict[str, dict[str, Any]] = {}
        for keyword, value in keywords.items():
            path = known[keyword].path
            if len(path) == 1:
                own[path[0]] = value
            else:
                inner.setdefault(path[0], {})[keyword] = value
        for name, changes in inner.items():
            own[name] = getattr(self, name).replace(**changes)
        return dataclasses.replace(self, **own)  # type: ignore[type-var]

    def value(self, keyword: str) -> Any:
        """A field's value by its flat keyword.

        >>> from partition_fx.job.train_config import TrainConfig
        >>> TrainConfig().value("hyper_lr")
        0.05
        """
        return self._at(self.keywords()[keyword].path)

    def flat(self, *, fingerprint: bool = False) -> dict[str, Any]:
        """Every value by its flat keyword (only those a resumed run must match, with ``fingerprint``)."""
        return {f.keyword: self._at(f.path) for f in self.fields() if f.option.fingerprint or not fingerprint}

    @classmethod
    def absent_values(cls, *, fingerprint: bool = False) -> dict[str, Any]:
        """By flat keyword, the value a field added later (``absent_means``) stands for where something written
        before it lacks it (only the fields a resumed run must match, with ``fingerprint``)."""
        return {
            f.keyword: f.option.absent_means
            for f in cls.fields()
            if f.option.absent_means is not REQUIRED and (f.option.fingerprint or not fingerprint)
        }

    def _at(self, path: tuple[str, ...]) -> Any:
        target: Any = self
        for name in path:
            target = getattr(target, name)
        return target


class MissingSettings(PartitionArgumentError):
    """A configuration dict without some of the fields ``to_dict`` writes; ``missing``: their dotted paths."""

    def __init__(self, where: str, missing: list[str]) -> None:
        super().__init__(f"{where} lacks {', '.join(missing)}")
        self.missing = missing


def _first_unknown(cls: type[Settings], values: dict[str, Any], where: str) -> str | None:
    """The refusal of the first unknown key of ``values`` (``cls``'s, then its sections'), or None."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        return f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; it takes {', '.join(known)}"
    for key, section in cls.sections().items():
        inner = values.get(key)
        found = _first_unknown(section, inner, f"{where}.{key}") if isinstance(inner, dict) else None
        if found is not None:
            return found
    return None


def _has(values: Any, path: tuple[str, ...]) -> bool:
    """Whether the nested dict ``values`` holds ``path`` (a section that is not a dict counts as holding it:
    ``from_dict`` refuses its type)."""
    for name in path:
        if not isinstance(values, dict):
            return True
        if name not in values:
            return False
        values = values[name]
    return True


@functools.cache
def _declared(cls: type[Settings]) -> tuple[dict[str, Field], dict[str, type[Settings]]]:
    """``cls``'s own fields (by attribute name) and its nested sections, read once from its annotations."""
    hints = typing.get_type_hints(cls)
    own: dict[str, Field] = {}
    sections: dict[str, type[Settings]] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints[f.name]
        if isinstance(hint, type) and issubclass(hint, Settings):
            sections[f.name] = hint
            continue
        option: Option = f.metadata["option"]
        kind, optional = hint, False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            kind, optional = args[0], len(args) < len(typing.get_args(hint))
        keyword = option.keyword or f.name
        key = keyword.replace("_", "-") if cls.hyphenated else keyword
        own[f.name] = Field((f.name,), keyword, typing.get_origin(kind) or kind, optional, f.default, option, key)
    return own, sections


def _checked(f: Field, value: Any) -> Any:
    """``value`` if ``f`` takes it (an int for a float is returned as a float, a bool for a field with
    ``bool_values`` as the value it stands for)."""
    option = f.option
    if option.bool_values is not None and isinstance(value, bool):
        value = option.bool_values[value]
    if value is None:
        if f.optional:
            return None
        raise SettingTypeError(f, f"must be {_expected(f)}, got None")
    if option.validator is not None:
        try:
            return option.validator(f.key, value)
        except (SettingError, SettingTypeError):
            raise
        except (PartitionArgumentError, PartitionTypeError) as e:  # "KEY problem": the field's own, so a
            problem = str(e).removeprefix(f"{f.key} ")  # config file's refusal can name its place and option
            raise (SettingTypeError if isinstance(e, TypeError) else SettingError)(f, problem) from None
    if f.kind is bool:
        if not isinstance(value, bool):
            raise SettingTypeError(f, f"must be True or False, got {value!r} ({type(value).__name__})")
        return value
    if option.choices is not None:
        if value not in option.choices:
            raise SettingError(f, f"must be one of {', '.join(map(repr, option.choices))}, got {value!r}")
        return value
    if f.kind is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise SettingTypeError(f, f"must be {_expected(f)}, got {value!r} ({type(value).__name__})")
        integer = int(value)
        if option.seed and not 0 <= integer <= MAX_SEED:
            raise SettingError(f, f"must be an int in 0..2**63-1, got {value!r}")
        if option.minimum is not None and integer < option.minimum:
            raise SettingError(
                f, f"must be >= {option.minimum:g}, got {value!r}", f"must be {_expected(f)}, got {value!r}"
            )
        if option.maximum is not None and integer > option.maximum:
            raise SettingError(f, f"must be <= {option.maximum:g}, got {value!r}")
        return integer
    if f.kind is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SettingTypeError(f, f"must be a number, got {value!r} ({type(value).__name__})")
        number = float(value)
        if option.maximum is not None:
            low_ok = number > 0 if option.positive else number >= 0
            if not (low_ok and number <= option.maximum):  # NaN too
                raise SettingError(
                    f, f"must be in {'(' if option.positive else '['}0, {option.maximum:g}], got {value!r}"
                )
            return number
        if option.positive and not (math.isfinite(number) and number > 0):
            raise SettingError(f, f"must be positive (finite and > 0), got {value!r}")
        if not (math.isfinite(number) and number >= 0):
            raise SettingError(f, f"must be finite and >= 0, got {value!r}")
        return number
    if not isinstance(value, f.kind):
        raise SettingTypeError(f, f"must be a {f.kind.__name__}, got {value!r}")
    return value


def _expected(f: Field) -> str:
    """What an int field takes, in words: ``an int >= 1``, ``an int in 0..2**63-1``."""
    if f.kind is not int:
        return f"a {f.kind.__name__}"
    if f.option.seed:
        return "an int in 0..2**63-1"
    return "an int" + (f" >= {f.option.minimum:g}" if f.option.minimum is not None else "")
