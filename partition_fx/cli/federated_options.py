"""``partition-fx federated``'s options (imported by ``--help``: no torch here).

Every option that sets a field of :class:`~partition_fx.federated.FederatedConfig` is generated from the field's
declaration, as ``train``'s are from ``TrainConfig``'s: ``--fraction-train`` for ``fraction_train``, with its
default, metavar and help, the help ending with its default once. The command adds what is its own:
``--data``'s choices (the bundled image datasets of the registry), ``--partitions`` with ``--proportions`` (None
meaning the default shares with their number of partitions and equal shares with any other, as ``train``'s),
and ``--out``, ``--overwrite``, ``--quiet``. The values are checked, without torch, by
``cli.checks.check_federated_options`` before anything is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..datasets.registry import dataset_names
from ..federated.config import FederatedConfig
from ..settings import Field
from .argparsing import add_setting, default_shares_text, path, proportions

DEFAULT_FEDERATED_PROPORTIONS: tuple[float, ...] = FederatedConfig.keywords()["proportions"].default
"""``--proportions`` when it is not given and ``--partitions`` is 3 (the default): the paper's chunk shares of
appendix J; other counts get equal shares."""
DATA_OPTIONS = ("data", "image_size", "clients", "alpha", "fraction_train", "fraction_evaluate")
"""The fields whose options are in the group "data and clients"; the others' are in "model, partitions and
training" (each group in the fields' order)."""


def add_federated(parser: argparse.ArgumentParser) -> None:
    """The options of ``partition-fx federated``.

    >>> parser = argparse.ArgumentParser()
    >>> add_federated(parser)
    >>> args = parser.parse_args(["--proportions", "0.5,0.5", "--partitions", "2"])
    >>> args.proportions, args.alpha, args.data
    ((0.5, 0.5), 0.1, 'rotdigits')
    """
    data = parser.add_argument_group("data and clients (appendix J.2)")
    model = parser.add_argument_group("model, partitions and training (appendix J.1)")
    fields = list(FederatedConfig.fields())
    for group, members in ((data, [f for f in fields if f.keyword in DATA_OPTIONS]),
                           (model, [f for f in fields if f.keyword not in DATA_OPTIONS])):  # fmt: skip
        for field in members:
            if field.keyword == "proportions":
                _add_proportions(group, field)
            elif field.keyword == "data":
                add_setting(group, field, choices=dataset_names(task="images", on_disk=False))
            elif field.option.command_line:
                add_setting(group, field)
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        type=path,
        default=Path("runs/federated"),
        metavar="DIR",
        help="report.json, history.json, curves.png, model.safetensors (default: %(default)s)",
    )
    output.add_argument("--overwrite", action="store_true", help="replace --out if it is not empty (default: off)")
    output.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (default: off: Flower's log of every round on stderr)",
    )


def _add_proportions(group: Any, field: Field) -> None:
    """``--partitions`` and ``--proportions`` (``field``'s help): C and the shares, as ``train``'s."""
    group.add_argument(
        "--partitions",
        type=int,
        default=len(DEFAULT_FEDERATED_PROPORTIONS),
        metavar="C",
        help="number of partitions and chunks C, 1..255; without --proportions, any C but 3 gets equal shares "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--proportions",
        type=proportions,
        default=None,
        metavar="P1,P2,...",
        help=f"{field.option.help} (default: {default_shares_text(DEFAULT_FEDERATED_PROPORTIONS)})",
    )
