"""``partition-fx federated``'s options (imported by ``--help``: no torch here).

They follow ``train``'s conventions: the shared ``type=`` parsers of ``cli.argparsing``, the named image datasets
of the registry, ``--proportions`` None meaning the default shares with their number of partitions and equal
shares with any other, and every help ending with its default once. The values are checked, without torch, by
``cli.checks.check_federated_options`` before anything is written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..datasets.registry import dataset_names
from .argparsing import default_shares_text, path, proportions, seed

DEFAULT_FEDERATED_PROPORTIONS = (0.7, 0.2, 0.1)
"""``--proportions`` when it is not given and ``--partitions`` is 3 (the default): the paper's chunk shares of
appendix J; other counts get equal shares."""


def add_federated(parser: argparse.ArgumentParser) -> None:
    """The options of ``partition-fx federated``.

    >>> parser = argparse.ArgumentParser()
    >>> add_federated(parser)
    >>> args = parser.parse_args(["--proportions", "0.5,0.5", "--partitions", "2"])
    >>> args.proportions, args.alpha, args.data
    ((0.5, 0.5), 0.1, 'rotdigits')
    """
    data = parser.add_argument_group("data and clients (appendix J.2)")
    data.add_argument(
        "--data",
        default="rotdigits",
        choices=dataset_names(task="images"),
        help="a bundled image dataset (nothing downloaded); rotated digits are skewed over 10 rotation bins, others "
        "by label (default: %(default)s)",
    )
    data.add_argument(
        "--image-size",
        type=int,
        default=16,
        metavar="PIXELS",
        help="images are resized to this square, a multiple of 4 (default: %(default)s)",
    )
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
        "--partitions",
        type=int,
        default=3,
        metavar="C",
        help="number of partitions and chunks C, 1..255; without --proportions, any C but 3 gets equal shares "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--proportions",
        type=proportions,
        default=None,
        metavar="P1,P2,...",
        help="each partition's share of the parameters and of the clients (their chunks), C positive numbers "
        f"summing to 1 (default: {default_shares_text(DEFAULT_FEDERATED_PROPORTIONS)})",
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
        "--seed",
        type=seed,
        default=0,
        metavar="N",
        help="seeds the clients' data and chunks, the partition layout and the model (default: %(default)s)",
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
