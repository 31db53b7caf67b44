"""The command line's parsing machinery: an ``ArgumentParser`` whose refusals are one line naming the command's
own ``--help`` (with a did-you-mean for a mistyped option), and the ``type=`` parsers that turn option text into
values. The argument tree itself is ``cli.parser``; this module, like it, imports no torch."""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..job.settings import Field, Settings


class Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line, like every other refusal of the command.

    A top-level parser knows its commands (``commands``, filled by :meth:`add_command`), so an option no
    command knows is refused by that command's parser: the message suggests the closest option and points to
    ``partition-fx COMMAND --help``, not to the top-level help.

    >>> parser = Parser(prog="tool")
    >>> run = parser.add_command(parser.add_subparsers(dest="command"), "run", help="run it")
    >>> _ = run.add_argument("--steps", type=int, default=1)
    >>> parser.parse_args(["run", "--steps", "3"]).steps
    3
    >>> parser.parse_args(["run", "--stepz", "3"])
    Traceback (most recent call last):
    ...
    SystemExit: 2
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}
        self.defaults_from: Callable[[list[str]], dict[str, Any]] | None = None
        """Sets the options' defaults from the words before they are parsed (``train``: a ``--recipe``'s and a
        ``--config`` file's values, which every option given then overrides); raises ``PartitionError`` for a file
        it refuses."""

    def add_command(self, subparsers: Any, name: str, **kwargs: Any) -> Parser:
        """``subparsers.add_parser(name, **kwargs)``, remembered for the refusals of unknown options."""
        command = subparsers.add_parser(name, **kwargs)
        self.commands[name] = command
        return command

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(unrecognized_message(extras, command))
        return parsed

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        if self.defaults_from is not None:
            from ..errors import PartitionError

            try:
                self.set_defaults(**self.defaults_from(args))
            except PartitionError as e:
                self.error(str(e))
        for arg in args:
            option, equals, value = arg.partition("=")
            if arg.startswith("-") and equals and value == "--":  # argparse would drop it and store []
                self.error(f"argument {option}: expected one argument, not '--'")
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):  # argparse reads "-1e-3" or "-0.5,1.5" as an option
            message += " (for a value that starts with '-', write --option=VALUE)"
        self.exit(2, f"partition-fx: error: {message}; see `{self.prog} --help`\n")


def unrecognized_message(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" with the closest known option for each mistyped one.

    >>> parser = argparse.ArgumentParser()
    >>> _ = parser.add_argument("--steps"); _ = parser.add_argument("--batch-size")
    >>> unrecognized_message(["--stepz", "5", "--batch_size=4"], parser)
    'unrecognized arguments: --stepz 5 --batch_size=4 (did you mean --steps? did you mean --batch-size?)'
    """
    known = [option for action in parser._actions for option in action.option_strings]
    hints = []
    for arg in extras:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.partition("=")[0], known, n=1, cutoff=0.6)
            hints += [f"did you mean {close[0]}?"] if close else []
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({' '.join(hints)})" if hints else "")


def int_at_least(minimum: int) -> Any:
    """A ``type=`` that reads an int >= ``minimum``.

    >>> int_at_least(1)("3")
    3
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def trackers(text: str) -> tuple[str, ...]:
    """A ``type=`` for ``--log``: trackers by name, comma-separated.

    >>> trackers("csv,tensorboard")
    ('csv', 'tensorboard')
    """
    from ..choices import TRACKERS

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in TRACKERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: name trackers among {', '.join(TRACKERS)}, comma-separated")
    return tuple(dict.fromkeys(names))


def seed(text: str) -> int:
    """A ``type=`` for seeds: an int in 0..2**63-1.

    >>> seed("7")
    7
    """
    from .._validation import MAX_SEED  # torch-free

    value = int_at_least(0)(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be at most 2**63-1 = {MAX_SEED}, got {value}")
    return value


def path(text: str) -> Path:
    """A ``type=`` for paths that refuses the empty one (``Path("")`` is the current directory, which
    ``--overwrite`` would replace).

    >>> path("runs/a")
    PosixPath('runs/a')
    """
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (write . for the current directory)")
    return Path(text)


def path_text(text: str) -> str:
    """:func:`path` kept as text, for an option a report records (JSON has no paths).

    >>> path_text("runs/a")
    'runs/a'
    """
    return str(path(text))


def proportions(text: str) -> tuple[float, ...]:
    """A ``type=`` for comma-separated proportions (checked against ``--partitions`` after parsing).

    >>> proportions("0.8,0.1,0.1")
    (0.8, 0.1, 0.1)
    """
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"proportions must be comma-separated numbers, got {text!r}") from None
    if not all(math.isfinite(p) for p in values):
        raise argparse.ArgumentTypeError(f"proportions must be finite numbers, got {text!r}")
    return values


def range_start(text: str) -> dict[str, float] | str:
    """A ``type=`` for ``--init``: a named start (``wide``, ``zero``, ``bounds``: ``choices.RANGE_STARTS``), or
    :func:`range_values`' pairs.

    >>> range_start("zero"), range_start("wide"), range_start("rotation=1.5")
    ('zero', 'wide', {'rotation': 1.5})
    """
    from ..choices import RANGE_STARTS

    return text.strip() if text.strip() in RANGE_STARTS else range_values(text)


def range_values(text: str) -> dict[str, float]:
    """A ``type=`` for ``--fix``, ``--init``, ``--max-range`` and ``--train-range-factors``: comma-separated
    ``NAME=VALUE`` pairs, each an affine augmentation range (``choices.RANGE_NAMES``) and a finite number, each name
    once (the option's field checks the number: a half-width >= 0, a factor > 0).

    >>> range_values("rotation=3.1416,translation_x=0.1")
    {'rotation': 3.1416, 'translation_x': 0.1}
    >>> range_values("rotaton=1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: unknown range 'rotaton' (did you mean rotation?); the ranges are translation_x, ...
    """
    from ..choices import RANGE_NAMES

    values: dict[str, float] = {}
    for pair in text.split(","):
        name, equals, value = pair.partition("=")
        name = name.strip()
        if not equals:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE pairs separated by commas, got {pair!r}")
        if name not in RANGE_NAMES:
            close = difflib.get_close_matches(name, RANGE_NAMES, n=1)
            raise argparse.ArgumentTypeError(
                f"unknown range {name!r}"
                + (f" (did you mean {close[0]}?)" if close else "")
                + f"; the ranges are {', '.join(RANGE_NAMES)}"
            )
        if name in values:
            raise argparse.ArgumentTypeError(f"{name} is given twice; give each range once")
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={value!r} is not a number") from None
        if not math.isfinite(number):  # what else it must be is the option's own rule (a range's, a factor's)
            raise argparse.ArgumentTypeError(f"{name}={value} must be a finite number")
        values[name] = number
    return values


def add_settings(parser: argparse.ArgumentParser, config: type[Settings], groups: dict[str, Any]) -> None:
    """An option for every field of ``config`` (a :class:`~partition_fx.job.settings.Settings`) that is on the command
    line, generated from its declaration: ``--hyper-lr`` for the keyword ``hyper_lr``, its default,
    choices, metavar and help, the help ending with the default; a False bool becomes a flag, a field with a
    ``const`` an option whose value may be left out (``--compile [MODE]``). Each goes in the group titled by
    its section's ``section_help`` (``groups``, created when missing). The values are checked by the
    configuration itself when it is built from them (``JobSpec.from_keywords``).

    >>> from partition_fx.job.train_config import TrainConfig
    >>> parser = argparse.ArgumentParser()
    >>> add_settings(parser, TrainConfig, {})
    >>> args = parser.parse_args(["--hyper-lr", "0.1", "--fused"])
    >>> args.hyper_lr, args.fused, args.steps
    (0.1, True, 400)
    """
    for section in config.sections().values():
        group = groups.get(section.section_help)
        if group is None:
            group = groups[section.section_help] = parser.add_argument_group(section.section_help)
        for field in section.fields():
            if field.option.command_line:
                add_setting(group, field)


def add_setting(group: Any, field: Field, **overrides: Any) -> None:
    """The option of one field of a :class:`~partition_fx.job.settings.Settings` (see :func:`add_settings`), in
    ``group``; ``overrides``: the command's own ``add_argument`` keywords (``federated``'s ``--data`` choices)."""
    option = field.option
    kwargs: dict[str, Any] = {"dest": field.keyword, "default": field.default}
    if field.kind is bool:
        if field.default is not False:
            raise TypeError(f"{field.keyword}: a bool option on the command line must default to False")
        kwargs.update(action="store_true", help=f"{option.help} (default: off)")
    else:
        default = option.default_text if field.default is None else "%(default)s"
        kwargs.update(help=f"{option.help} (default: {default})", choices=option.choices)
        if option.metavar:
            kwargs["metavar"] = option.metavar
        if option.const is not None:
            kwargs.update(nargs="?", const=option.const)
        elif option.choices is None:
            # A mapping setting (train_range_factors) holds a value per affine range: NAME=VALUE pairs.
            kwargs.update(type=seed if option.seed else range_values if field.kind is Mapping else field.kind)
    group.add_argument(field.flag, **{**kwargs, **overrides})
