"""The commands of ``partition-fx``, each declared once, in one module of this package: a :class:`Command` named
``COMMAND`` holding its help, its options, its checks (which turn the parsed options into the command's own typed
options, refusing bad ones in one line before torch loads), the function that runs it, the summary it prints, the
files it writes in its run directory and what to lower when it runs out of memory. Adding a command is adding a
module here (:func:`commands` finds it); nothing else names it.

This package imports no torch: ``partition-fx --help`` and every refusal answer at once. A command's ``run`` is
named as ``"module:function"`` and imported when the command runs.

>>> list(commands())
['train', 'convert', 'describe', 'export', 'federated', 'predict']
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..argparsing import Parser


def _nothing(result: Any, options: Any) -> None:
    """The summary of a command that prints none."""


def _no_way_on(options: Any) -> str:
    """What an interrupted command says beyond "interrupted": nothing, for a command that keeps nothing."""
    return ""


@dataclass(frozen=True)
class Command:
    """One command of ``partition-fx``, all of it.

    ``name``, its ``summary`` (its line in ``partition-fx --help``), its ``description`` (its own ``--help``) and
    its ``order`` among the commands there; ``add_options(parser)`` declares its options; ``options(namespace)``
    checks them without torch and returns the command's typed options (no ``argparse.Namespace`` goes further);
    ``run`` (``"module:function"``) takes those options and returns the command's result, which
    ``show(result, options)`` prints, returning the exit status when it is not 0 (``predict``: 2 when
    some images could not be read) or None; ``files`` is what it writes in its run directory, by name (a file, a whole
    directory as None, or a directory of which only the named entries are the run's), which ``--overwrite``
    alone replaces; ``out_of_memory`` says what to lower when it runs out; ``interrupted(options)`` what an
    interrupted run can do next.
    """

    name: str
    summary: str
    description: str
    order: int
    add_options: Callable[[Parser], None]
    options: Callable[[Any], Any]
    run: str
    show: Callable[[Any, Any], int | None] = _nothing
    files: dict[str, Any] = field(default_factory=dict)
    out_of_memory: str = "run it on a machine with more memory"
    interrupted: Callable[[Any], str] = _no_way_on

    def execute(self, options: Any) -> Any:
        """Run the command on its checked ``options`` (its module imported now: torch comes with it)."""
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)(options)


@functools.cache
def commands() -> dict[str, Command]:
    """Every command, by name, in their order: each module of this package's ``COMMAND``."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        command = getattr(importlib.import_module(f"{__name__}.{module.name}"), "COMMAND", None)
        if isinstance(command, Command):
            found.append(command)
    return {command.name: command for command in sorted(found, key=lambda c: c.order)}
