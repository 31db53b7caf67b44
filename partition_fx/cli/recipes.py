"""The paper's image experiments as presets of ``partition-fx train`` (``--recipe NAME``): YAML files shipped with
the package (``partition_fx/recipes/NAME.yaml``), each part of a configuration file as ``--print-config`` writes
one, its first line a comment that says what it reproduces. A recipe's values are the command's defaults; a
``--config`` file's values and the options given on the command line override them.

Values from the paper's appendix I.4 (CIFAR-10 and RotCIFAR-10 with FixUp ResNets) and the fine-tuning run of its
Table 2; where the appendix gives no value, the option keeps this package's default (``docs/data.md`` lists
each). No torch here: ``partition-fx train --help`` names them at once.

>>> recipe = RECIPES["paper-cifar10-fixup14"]
>>> recipe.values["model"], recipe.values["train"]["optimization"]["steps"], recipe.file
('fixup_resnet14', 40000, 'recipes/paper-cifar10-fixup14.yaml')
>>> recipe_name(["--steps", "10", "--recipe=paper-cifar10-fixup8"]), recipe_name(["--steps", "10"])
('paper-cifar10-fixup8', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

OPTION = "--recipe"


@dataclass(frozen=True)
class Recipe:
    """A preset: its ``name``, what it reproduces (``description``, with the data it expects), the ``file`` it is
    read from (relative to the package) and its ``values`` (a configuration file's keys)."""

    name: str
    description: str
    file: str
    values: dict[str, Any]


def _read_recipes() -> dict[str, Recipe]:
    import yaml

    found = {}
    for entry in sorted(resources.files("partition_fx").joinpath("recipes").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        text = entry.read_text()
        name = entry.name.removesuffix(".yaml")
        first = text.splitlines()[0] if text else ""
        if not first.startswith("# "):  # the package's own files: a test reads every one
            raise ValueError(f"partition_fx/recipes/{entry.name}: its first line must be '# what it reproduces'")
        found[name] = Recipe(name, first[2:].strip(), f"recipes/{entry.name}", yaml.safe_load(text) or {})
    return found


RECIPES = _read_recipes()
"""Every recipe by name."""


def recipe_name(argv: list[str]) -> str | None:
    """The ``NAME`` of ``--recipe NAME`` (or ``--recipe=NAME``) in ``argv``; None without one (a ``--recipe``
    without its value, or with an unknown name, is left for the parser to refuse)."""
    for i, word in enumerate(argv):
        if word == OPTION and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(OPTION + "="):
            return word.partition("=")[2]
    return None
