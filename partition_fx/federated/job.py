"""A federated run on a dataset: the model of appendix J (the MNIST CNN of table 9 with learned concrete
dropout between layers, affine augmentation as psi), the clients' non-i.i.d. data and chunks, the partitioned
run and its FedAdam baseline (C=1, psi fixed at its initial values), scored on the test split."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import partitionify
from ..datasets import DatasetSplits
from ..errors import PartitionArgumentError
from ..export import export_subnetwork
from ..partitioned_model import PartitionedModel
from ..training import Categorical, evaluate_classifier
from ..training.hyperparameters import hyperparameter_modules, hyperparameter_values
from ..training.progress import ProgressLines, progress_outputs, round_line
from ..transforms import AffineAugmentation, ConcreteDropout
from .clients import client_chunks, dirichlet_split
from .flower import FederatedRun, run_flower

ROTATION_BINS = 10


def federated_cnn(in_chans: int = 1, image_size: int = 28, num_classes: int = 10, dropout: float = 0.1) -> nn.Module:
    """The MNIST CNN of the paper's table 9 (Schwoebel et al. 2021) with ``ConcreteDropout(dropout)`` after each
    hidden layer, as in its federated experiments (appendix J.2). Its layers are named, so the learned rates
    are reported as ``dropout1.p`` .. ``dropout4.p`` (and the exported weights as ``conv1.weight``, ...).

    >>> federated_cnn(image_size=16)(torch.zeros(2, 1, 16, 16)).shape
    torch.Size([2, 10])
    >>> [name for name, m in federated_cnn().named_modules() if isinstance(m, ConcreteDropout)]
    ['dropout1', 'dropout2', 'dropout3', 'dropout4']
    """
    side = image_size // 4
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(in_chans, 20, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("dropout1", ConcreteDropout(dropout)),
        ("conv2", nn.Conv2d(20, 50, 5, padding=2)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("dropout2", ConcreteDropout(dropout)), ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(50 * side * side, 500)), ("relu3", nn.ReLU()), ("dropout3", ConcreteDropout(dropout)),
        ("fc2", nn.Linear(500, 50)), ("relu4", nn.ReLU()), ("dropout4", ConcreteDropout(dropout)),
        ("fc3", nn.Linear(50, num_classes)),
    ]))  # fmt: skip


@dataclass(frozen=True)
class ModelFactory:
    """Builds the same partitioned model, likelihood and augmentation on every call (the server and every
    client call it; pickled to the clients, so it holds only numbers)."""

    input_shape: tuple[int, ...]
    num_classes: int
    proportions: tuple[float, ...]
    seed: int
    samples: int
    learn_hyperparameters: bool = True

    def __call__(self) -> tuple[PartitionedModel, Categorical, nn.Module | None]:
        torch.manual_seed(self.seed)
        model = federated_cnn(self.input_shape[0], self.input_shape[-1], self.num_classes)
        pmodel = partitionify(model, len(self.proportions), self.proportions, seed=self.seed)
        hyper = AffineAugmentation(num_samples=self.samples)
        if not self.learn_hyperparameters:
            for module in (hyper, *(m for _, m in pmodel.hyperparameter_modules())):
                module.requires_grad_(False)
        return pmodel, Categorical(), hyper


@dataclass
class FederatedPlan:
    """Who holds what: each client's examples (indices into the training split) and chunk."""

    clients: list[torch.Tensor]
    chunks: list[int]
    skew: str


def plan_clients(
    data: DatasetSplits, clients: int, alpha: float, proportions: Sequence[float], seed: int = 0
) -> FederatedPlan:
    """Split the training data over ``clients`` (Dirichlet ``alpha`` over labels, or over 10 rotation bins for
    rotated data) and give each client a chunk; every refusal names the option to change (``alpha``'s, by
    ``dirichlet_split``, the argument: the command line has refused a bad ``--alpha`` before loading anything).

    >>> from partition_fx.datasets import digits
    >>> plan = plan_clients(digits(size=8), clients=10, alpha=0.1, proportions=(0.7, 0.2, 0.1))
    >>> len(plan.clients), plan.skew, plan.chunks.count(1)
    (10, 'labels', 7)
    """
    n = len(data.train)
    if clients > n:
        raise PartitionArgumentError(
            f"--clients {clients}: more clients than the {n} training examples; use at most {n}"
        )
    angles = data.info.get("train_angles")
    if angles is not None:  # appendix J.2: skew over the rotation, binned
        groups, skew = (
            ((angles + math.pi) / (2 * math.pi) * ROTATION_BINS).long().clamp_(0, ROTATION_BINS - 1),
            "rotation",
        )
    else:
        groups, skew = data.train.tensors[1], "labels"
    return FederatedPlan(dirichlet_split(groups, clients, alpha, seed), client_chunks(clients, proportions, seed), skew)


@dataclass
class FederatedResult:
    """A finished run: the test accuracy of its exported final model, its hyperparameters, its traffic."""

    test_accuracy: float
    hyperparameters: dict[str, Any]
    bytes_up: int
    bytes_down: int
    curve: list[dict[str, Any]] = field(default_factory=list)
    model: nn.Module | None = None


def run_federated(
    data: DatasetSplits,
    plan: FederatedPlan,
    factory: ModelFactory,
    *,
    rounds: int,
    lr: float,
    batch_size: int,
    server_lr: float,
    hyper_lr: float,
    evaluate_every: int,
    seed: int = 0,
    progress: bool | None = None,
    label: str = "partitioned",
) -> FederatedResult:
    """Train ``factory``'s model on ``plan``'s clients for ``rounds`` rounds on Flower; every client takes part
    in every round. The baseline is the same call with ``ModelFactory(proportions=(1.0,),
    learn_hyperparameters=False)`` and every client in chunk 1.

    Progress, as ``fit``'s: None shows a bar of the rounds (named ``label``) when stderr is a terminal and
    otherwise one line per evaluated round on stderr (``round_line``: ``label``, round, test accuracy, bytes
    so far); True forces the bar, False shows nothing."""
    from tqdm.auto import tqdm

    x, y = data.train.tensors
    x_test, y_test = data.test.tensors

    def evaluate(pmodel: PartitionedModel, hyper: nn.Module | None) -> dict[str, float]:
        accuracy, _ = evaluate_classifier(export_subnetwork(pmodel).eval(), x_test, y_test)
        return {"test_accuracy": accuracy}

    show, write_lines = progress_outputs(progress)
    lines = ProgressLines(0, rounds, position="round", line=round_line) if write_lines else None
    bar = tqdm(total=rounds, disable=not show, desc=label, unit="round", dynamic_ncols=True)

    def on_round(server_round: int, point: dict[str, Any] | None) -> None:
        if server_round == 0:  # the simulation is up: time the rounds from here, not from Ray's start
            bar.reset()
            if lines is not None:
                lines.started = time.perf_counter()
            return
        bar.update(1)
        if point is not None:
            bar.set_postfix(accuracy=f"{point['test_accuracy']:.3f}", traffic=f"{point['bytes'] / 1e6:.1f}MB")
            if lines is not None:
                lines({"arm": label, **point})

    try:
        run: FederatedRun = run_flower(
            factory, [(x[c], y[c]) for c in plan.clients], plan.chunks, rounds=rounds, lr=lr, batch_size=batch_size,
            server_lr=server_lr, hyper_lr=hyper_lr, learn_hyperparameters=factory.learn_hyperparameters,
            evaluate=evaluate, evaluate_every=evaluate_every, on_round=on_round, seed=seed,
        )  # fmt: skip
    finally:
        bar.close()
    exported = export_subnetwork(run.pmodel).eval()
    accuracy, _ = evaluate_classifier(exported, x_test, y_test)
    hyper = hyperparameter_values(hyperparameter_modules(run.pmodel, run.hyper, None))
    return FederatedResult(accuracy, hyper, run.bytes_up, run.bytes_down, run.curve, exported)
