"""``partition-fx federated``'s options (imported by ``--help``: no torch here)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .argparsing import path, proportions, seed

FEDERATED_DEFAULTS = {"proportions": (0.7, 0.2, 0.1)}
"""What an option left at None means (``--proportions``: the paper's chunk shares of appendix J)."""


def add_federated(parser: argparse.ArgumentParser) -> None:
    """The options; values are checked by ``cli.federated`` before anything is written."""
    data = parser.add_argument_group("data and clients (appendix J.2)")
    data.add_argument(
        "--data",
        default="rotdigits",
        choices=["rotdigits", "digits"],
        help="rotdigits: skew over 10 rotation bins; digits: label skew (default: %(default)s)",
    )
    data.add_argument("--image-size", type=int, default=16, metavar="PX", help="image side (default: %(default)s)")
    data.add_argument("--clients", type=int, default=100, metavar="N", help="clients (default: %(default)s)")
    data.add_argument(
        "--alpha",
        type=float,
        default=0.1,
        metavar="A",
        help="Dirichlet concentration of the clients' skew; 0.1: most hold one group (default: %(default)s)",
    )
    model = parser.add_argument_group("partitions and training (appendix J.1)")
    model.add_argument(
        "--partitions", type=int, default=3, metavar="C", help="partitions and chunks (default: %(default)s)"
    )
    model.add_argument(
        "--proportions",
        type=proportions,
        default=None,
        metavar="U1,..,UC",
        help="the partitions' shares and the clients' chunk shares (default: "
        + ",".join(map(str, FEDERATED_DEFAULTS["proportions"]))
        + ")",
    )
    model.add_argument(
        "--rounds", type=int, default=30, metavar="R", help="communication rounds (default: %(default)s)"
    )
    model.add_argument("--lr", type=float, default=0.05, metavar="LR", help="clients' SGD step (default: %(default)s)")
    model.add_argument(
        "--server-lr",
        type=float,
        default=1e-3,
        metavar="LR",
        help="server FedAdam learning rate (default: %(default)s)",
    )
    model.add_argument(
        "--hyper-lr",
        type=float,
        default=3e-3,
        metavar="LR",
        help="server Adam learning rate of psi (default: %(default)s)",
    )
    model.add_argument(
        "--batch-size", type=int, default=64, metavar="N", help="clients' minibatch (default: %(default)s)"
    )
    model.add_argument(
        "--samples", type=int, default=4, metavar="S", help="augmentation samples per example (default: %(default)s)"
    )
    model.add_argument(
        "--evaluate-every",
        type=int,
        default=5,
        metavar="R",
        help="rounds between test evaluations of the learning curve (default: %(default)s)",
    )
    model.add_argument(
        "--seed", type=seed, default=0, metavar="S", help="clients, chunks, model (default: %(default)s)"
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        type=path,
        default=Path("runs/federated"),
        metavar="DIR",
        help="report.json, curves.png, model.safetensors (default: %(default)s)",
    )
    output.add_argument("--overwrite", action="store_true", help="replace --out if it is not empty (default: off)")
    output.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (default: off: a bar of each run's rounds when stderr is a terminal, else a line per "
        "evaluated round)",
    )
