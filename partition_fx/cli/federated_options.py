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
from ..federated.config import FederatedConfig
from .argparsing import default_shares_text, path, proportions, seed

DEFAULTS = FederatedConfig()
"""The options' defaults are ``FederatedConfig``'s (one set for the command, the Flower app and ``simulate``)."""
DEFAULT_FEDERATED_PROPORTIONS = DEFAULTS.proportions
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
    d = DEFAULTS
    data = parser.add_argument_group("data and clients (appendix J.2)")
    data.add_argument(
        "--data",
        default=d.data,
        choices=dataset_names(task="images", on_disk=False),
        help="a bundled image dataset (nothing downloaded); rotated digits are skewed over 10 rotation bins, others "
        "by label (default: %(default)s)",
    )
    data.add_argument(
        "--image-size",
        type=int,
        default=d.image_size,
        metavar="PIXELS",
        help="images are resized to this square, a multiple of 4 (default: %(default)s)",
    )
    data.add_argument("--clients", type=int, default=d.clients, metavar="N", help="clients (default: %(default)s)")
    data.add_argument(
        "--alpha",
        type=float,
        default=d.alpha,
        metavar="A",
        help="Dirichlet concentration of the clients' skew; 0.1: most hold one group (default: %(default)s)",
    )
    data.add_argument(
        "--fraction-train",
        type=float,
        default=d.fraction_train,
        metavar="F",
        help="share of the clients sampled to train each round, as Flower's (default: %(default)s)",
    )
    data.add_argument(
        "--fraction-evaluate",
        type=float,
        default=d.fraction_evaluate,
        metavar="F",
        help="share of the clients sampled each round to evaluate the server's model on their own test share "
        "(default: %(default)s)",
    )
    model = parser.add_argument_group("model, partitions and training (appendix J.1)")
    model.add_argument(
        "--model",
        default=d.model,
        metavar="NAME",
        help="'cnn' (the paper's MNIST CNN with learned dropout) or a registry model without BatchNorm, e.g. "
        "cifar_wrn16_4_gn (default: %(default)s)",
    )
    model.add_argument(
        "--partitions",
        type=int,
        default=len(d.proportions),
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
        "--rounds", type=int, default=d.rounds, metavar="R", help="communication rounds (default: %(default)s)"
    )
    model.add_argument(
        "--local-epochs",
        type=int,
        default=d.local_epochs,
        metavar="E",
        help="clients' epochs per round (default: %(default)s)",
    )
    model.add_argument("--lr", type=float, default=d.lr, metavar="LR", help="clients' SGD step (default: %(default)s)")
    model.add_argument(
        "--batch-size", type=int, default=d.batch_size, metavar="N", help="clients' minibatch (default: %(default)s)"
    )
    model.add_argument(
        "--server-lr",
        type=float,
        default=d.server_lr,
        metavar="LR",
        help="server FedAdam learning rate, both runs, the paper's (default: %(default)s)",
    )
    model.add_argument(
        "--hyper-lr",
        type=float,
        default=d.hyper_lr,
        metavar="LR",
        help="server Adam learning rate of psi (default: the paper's 3e-3 x 2000 / --rounds, between 3e-3 and 0.06)",
    )
    model.add_argument(
        "--rotation-init",
        type=float,
        default=d.rotation_init,
        metavar="RAD",
        help="where the learned rotation range starts, in radians; at 0 it cannot move, so the default is pi/2 "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--samples",
        type=int,
        default=d.samples,
        metavar="S",
        help="augmentation samples per example in training, the paper's (default: %(default)s)",
    )
    model.add_argument(
        "--test-samples",
        type=int,
        default=d.test_samples,
        metavar="S",
        help="fixed augmentations the test evaluation averages over, 1 for none, the paper's (default: %(default)s)",
    )
    model.add_argument(
        "--evaluate-every",
        type=int,
        default=d.evaluate_every,
        metavar="R",
        help="rounds between test evaluations of the learning curve (default: %(default)s)",
    )
    model.add_argument(
        "--seed",
        type=seed,
        default=d.seed,
        metavar="N",
        help="seeds the clients' data and chunks, the partition layout and the model (default: %(default)s)",
    )
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
