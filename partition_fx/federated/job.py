"""A federated run on a dataset, the pieces both engines share: the data and every client's share of it
(computed by each client from the run's seed), the client's round, the server's evaluation, and the run's
record. ``simulate`` runs the rounds in this process without Flower; ``partition_fx.federated.app`` runs the
same pieces as Flower apps."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch

from ..datasets import DatasetSplits, load_dataset
from ..errors import PartitionArgumentError
from ..export import export_subnetwork
from ..training import Schedule, evaluate_classifier
from ..training.objective.objective import Objective
from ..transforms import TestTimeAveraged
from .algorithm import ClientUpdate, FederatedServer, ProgressWarmup, client_update
from .clients import client_chunks, dirichlet_split
from .config import FederatedConfig
from .models import FederatedModel, build_federated_model

ROTATION_BINS = 10
LAST_EVALUATIONS = 10
"""A run's accuracy is the mean of its last 10 evaluations (the paper's moving average, appendix J.3)."""


@dataclass
class FederatedPlan:
    """Who holds what: each client's training examples, validation examples and test examples (indices into the
    splits), its chunk, and what the split is skewed over (``labels`` or ``rotation``)."""

    clients: list[torch.Tensor]
    chunks: list[int]
    skew: str
    test_clients: list[torch.Tensor] = field(default_factory=list)
    validation_clients: list[torch.Tensor] = field(default_factory=list)
    """Each client's validation share of the training split (not in ``clients``); empty lists without one."""


def _groups(data: DatasetSplits, split: str) -> tuple[torch.Tensor, str]:
    """What a split is skewed over: 10 rotation bins for rotated data (appendix J.2), else the labels."""
    angles = data.info.get(f"{split}_angles")
    if angles is not None:
        bins = ((angles + math.pi) / (2 * math.pi) * ROTATION_BINS).long().clamp_(0, ROTATION_BINS - 1)
        return bins, "rotation"
    return getattr(data, split).tensors[1], "labels"


def plan_clients(
    data: DatasetSplits,
    clients: int,
    alpha: float,
    proportions: Sequence[float],
    seed: int = 0,
    validation: float = 0.0,
) -> FederatedPlan:
    """Split the training data over ``clients`` (Dirichlet ``alpha`` over labels, or over 10 rotation bins for
    rotated data), the test split the same way (each client's own test share, for federated evaluation), and
    give each client a chunk. With ``validation``, each client keeps that share of its training examples
    (rounded, at least one left to train on) aside as its validation share. Every client computes the same plan
    from the same arguments, so a client finds its share by its partition id alone. Every refusal names the
    option to change.

    >>> from partition_fx.datasets import digits
    >>> plan = plan_clients(digits(size=8), clients=10, alpha=0.1, proportions=(0.7, 0.2, 0.1), validation=0.2)
    >>> len(plan.clients), plan.skew, plan.chunks.count(1), len(plan.test_clients)
    (10, 'labels', 7, 10)
    >>> sum(map(len, plan.validation_clients)), sum(map(len, plan.clients))  # of the 1438 training examples
    (290, 1148)
    """
    n = len(data.train)
    if clients > min(n, len(data.test)):
        raise PartitionArgumentError(
            f"--clients {clients}: more clients than the {n} training (or {len(data.test)} test) examples; use at "
            f"most {min(n, len(data.test))}"
        )
    groups, skew = _groups(data, "train")
    test_groups, _ = _groups(data, "test")
    shares = dirichlet_split(groups, clients, alpha, seed)
    kept = [_validation_share(share, validation, seed, client) for client, share in enumerate(shares)]
    return FederatedPlan(
        [train for train, _ in kept],
        client_chunks(clients, proportions, seed),
        skew,
        dirichlet_split(test_groups, clients, alpha, seed + 1),
        [held for _, held in kept],
    )


def _validation_share(share: torch.Tensor, validation: float, seed: int, client: int) -> tuple[torch.Tensor, ...]:
    """A client's examples split into (training, validation): ``validation`` of them, rounded, drawn by the
    run's seed and the client, at least one left to train on."""
    count = min(round(validation * len(share)), len(share) - 1)
    generator = torch.Generator().manual_seed(client_seed(seed, 0, client))  # "round 0": before any round
    order = torch.randperm(len(share), generator=generator)
    return share[order[count:].sort().values], share[order[:count].sort().values]


def validation_data(data: DatasetSplits, plan: FederatedPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The union of the clients' validation shares (None without any)."""
    held = torch.cat([torch.zeros(0, dtype=torch.long), *plan.validation_clients])
    if not len(held):
        return None
    x, y = data.train.tensors
    return x[held], y[held]


class ClientData(NamedTuple):
    """One client's training share, its test share and its chunk."""

    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    chunk: int


def client_data(data: DatasetSplits, plan: FederatedPlan, client: int) -> ClientData:
    """Client ``client``'s share of ``data`` under ``plan``."""
    x, y = data.train.tensors
    x_test, y_test = data.test.tensors
    train, test = plan.clients[client], plan.test_clients[client]
    return ClientData((x[train], y[train]), (x_test[test], y_test[test]), plan.chunks[client])


def load_federated_data(config: FederatedConfig) -> DatasetSplits:
    """The run's dataset (a bundled one: nothing is downloaded)."""
    return load_dataset(config.data, size=config.image_size)


def federated_model(config: FederatedConfig, data: DatasetSplits) -> FederatedModel:
    """The run's model for ``data``'s images (the server's and every client's)."""
    if data.num_classes is None:
        raise PartitionArgumentError(f"federated training classifies images; {config.data!r} is a regression dataset")
    return build_federated_model(config, tuple(data.input_shape), data.num_classes)


def client_seed(seed: int, server_round: int, client: int) -> int:
    """The seed of one client's noise in one round: a function of the run's seed, the round and the client
    only, so any engine and any order of clients gives the same run."""
    return seed * 1_000_003 + server_round * 1009 + client


def round_schedule(config: FederatedConfig) -> Schedule:
    """The run's timeline over its rounds, the central path's :class:`~partition_fx.training.Schedule` with a
    round for an iteration: partitioned rounds (psi's steps after the first ``warmup_rounds``), then the last
    ``finetune_rounds`` fine-tuning; the server evaluates every ``evaluate_every`` rounds, after the last
    partitioned round and after the last.

    >>> schedule = round_schedule(FederatedConfig(rounds=10, finetune_fraction=0.4, evaluate_every=5))
    >>> [r for r in range(1, 11) if schedule.finetunes(r)], [r for r in range(1, 11) if schedule.evaluates_at(r)]
    ([7, 8, 9, 10], [5, 6, 10])
    """
    return Schedule(config.rounds, eval_every=config.evaluate_every, finetune_steps=config.finetune_rounds,
                    warmup_steps=config.warmup_rounds, learns=config.learn_hyperparameters)  # fmt: skip


def train_client(
    model: FederatedModel,
    config: FederatedConfig,
    share: ClientData,
    client: int,
    server_round: int,
    finetune: bool | None = None,
) -> ClientUpdate:
    """One client's round (``client_update``) with the run's settings: a fine-tuning round when the server says
    so (``finetune``; None: when the run's schedule plans one), else one that sends psi's gradient after the
    warm-up's least rounds."""
    schedule = round_schedule(config)
    return client_update(
        model.pmodel, model.likelihood, model.hyper, share.train, share.chunk, client=client, lr=config.lr,
        batch_size=config.batch_size, seed=client_seed(config.seed, server_round, client), epochs=config.local_epochs,
        finetune=schedule.finetunes(server_round) if finetune is None else finetune,
        psi_step=schedule.hyper_due(server_round),
    )  # fmt: skip


def evaluate_model(model: FederatedModel, data: tuple[torch.Tensor, ...], test_samples: int) -> dict[str, float]:
    """Accuracy and mean negative log-likelihood of the exported final model on ``data``, and its accuracy
    averaged over ``test_samples`` fixed transforms of the learned augmentation (the paper averages 10 at
    inference; equal to the plain accuracy when every range is 0)."""
    exported = export_subnetwork(model.pmodel).eval()
    x, y = data
    accuracy, log_likelihood = evaluate_classifier(exported, x, y)
    scores = {"accuracy": accuracy, "nll": -log_likelihood, "accuracy-averaged": accuracy}
    if test_samples > 1 and bool((model.hyper.ranges.detach() != 0).any()):
        averaged = TestTimeAveraged(exported, model.hyper, samples=test_samples).eval()
        scores["accuracy-averaged"] = evaluate_classifier(averaged, x, y)[0]
    return scores


def federated_server(config: FederatedConfig, model: FederatedModel, num_classes: int) -> FederatedServer:
    """The server's optimisers over ``model`` with the run's learning rates (psi's only if it is learned), its
    rounds, and psi's warm-up by the model's progress: a held-out negative log-likelihood at most ``warmup_progress``
    of chance's, log ``num_classes``, by round ``psi_deadline``, or fine-tuning begins there without
    augmentation."""
    warmup = ProgressWarmup(config.warmup_progress * math.log(num_classes), config.psi_deadline)
    return FederatedServer(*model, lr=config.server_lr, hyper_lr=config.hyper_lr_value,
                           learn_hyperparameters=config.learn_hyperparameters, schedule=round_schedule(config),
                           warmup=warmup, fallback=lambda: no_augmentation(model))  # fmt: skip


def no_augmentation(model: FederatedModel) -> None:
    """Every range of ``model``'s augmentation at 0, as the baseline's (psi's dropout rates stay)."""
    with torch.no_grad():
        model.hyper.ranges.zero_()


def warmup_record(config: FederatedConfig, server: FederatedServer) -> dict[str, Any]:
    """What psi's warm-up did: the round psi began at (None: never), the round partitioned training ended at when
    it ended early, each round's held-out negative log-likelihood per example, and ``note``, one line for a run
    whose psi learned nothing (None otherwise)."""
    warmup, schedule = server.warmup, server.schedule
    if warmup is None or schedule is None:
        return {"started_at": None, "partitioned_ended_at": None, "heldout_nll": {}, "note": None}
    note = None
    if warmup.started_at is None:
        least = min(warmup.heldout_nll.values(), default=float("nan"))
        ended = schedule.partitioned_ended_at
        where = f"fine-tuned from round {ended + 1} without augmentation, as the baseline" if ended else "psi unmoved"
        note = (f"psi learned nothing in {config.rounds} rounds: the model had not learned in time for it (held-out "
                f"negative log-likelihood {least:.2f} at best, {warmup.threshold:.2f} needed); {where}. Give more "
                "--rounds for psi to learn")  # fmt: skip
    return {"started_at": warmup.started_at, "partitioned_ended_at": schedule.partitioned_ended_at,
            "heldout_nll": {str(r): round(e, 4) for r, e in warmup.heldout_nll.items()}, "note": note}  # fmt: skip


def mean_of_last(curve: list[dict[str, Any]], key: str) -> float:
    """The mean of ``key`` over the last :data:`LAST_EVALUATIONS` points of ``curve`` (all, if fewer).

    >>> mean_of_last([{"acc": a} for a in range(12)], "acc")
    6.5
    """
    return statistics.fmean(point[key] for point in curve[-LAST_EVALUATIONS:])


def hyperparameters(model: FederatedModel) -> dict[str, Any]:
    """psi's values by name (``rotation``, ``dropout1.p``, ...)."""
    return Objective(model.pmodel, model.hyper).hyperparameter_values()


@dataclass
class FederatedRun:
    """A finished run: the server's model, its traffic, the server's test evaluations (``curve``: per
    evaluated round ``round``, ``bytes`` up+down so far, ``bytes_up``, ``test-accuracy``,
    ``test-accuracy-averaged``, ``test-nll``, ``hyperparameters``), every client's train metrics per round,
    the clients' federated evaluation per round, failures, and the seconds the rounds took."""

    model: FederatedModel
    config: FederatedConfig
    bytes_up: int = 0
    bytes_down: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)
    client_train_metrics: dict[int, list[dict[str, float]]] = field(default_factory=dict)
    federated_evaluation: dict[int, dict[str, float]] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    warmup: dict[str, Any] = field(default_factory=dict)
    """psi's warm-up (:func:`warmup_record`)."""

    def history(self) -> dict[str, Any]:
        """Everything but the model, as JSON-ready data."""
        return {
            "config": self.config.run_config(),
            "rounds": self.config.rounds,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "seconds": round(self.seconds, 2),
            "seconds_per_round": round(self.seconds / self.config.rounds, 3),
            "hyperparameters": hyperparameters(self.model),
            "warmup": self.warmup,
            "curve": self.curve,
            "client_train_metrics": {str(r): m for r, m in self.client_train_metrics.items()},
            "federated_evaluation": {str(r): m for r, m in self.federated_evaluation.items()},
            "failures": {str(r): f for r, f in self.failures.items()},
        }


def is_evaluated(config: FederatedConfig, server_round: int) -> bool:
    """Whether the server evaluates after ``server_round`` (:func:`round_schedule`'s ``evaluates_at``)."""
    return server_round > 0 and round_schedule(config).evaluates_at(server_round)


def curve_point(
    run: FederatedRun,
    data: DatasetSplits,
    server_round: int,
    validation: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The server's test evaluation after ``server_round`` (and on the clients' ``validation`` shares, when
    given: ``validation-accuracy``, ``validation-accuracy-averaged``), appended to ``run.curve``."""
    scores = evaluate_model(run.model, data.test.tensors, run.config.test_samples)
    point = {
        "round": server_round, "bytes": run.bytes_up + run.bytes_down, "bytes_up": run.bytes_up,
        "test-accuracy": scores["accuracy"], "test-accuracy-averaged": scores["accuracy-averaged"],
        "test-nll": scores["nll"], "hyperparameters": hyperparameters(run.model),
    }  # fmt: skip
    if validation is not None:
        held = evaluate_model(run.model, validation, run.config.test_samples)
        point["validation-accuracy"] = held["accuracy"]
        point["validation-accuracy-averaged"] = held["accuracy-averaged"]
    run.curve.append(point)
    return point


def sample_clients(config: FederatedConfig, server_round: int) -> list[int]:
    """The clients ``simulate`` trains in a round: all, or ``max(1, int(fraction_train * clients))`` drawn
    without replacement by a generator seeded with the run's seed and the round."""
    count = max(1, int(config.clients * config.fraction_train))
    if count >= config.clients:
        return list(range(config.clients))
    generator = torch.Generator().manual_seed(client_seed(config.seed, server_round, 0))
    return sorted(torch.randperm(config.clients, generator=generator)[:count].tolist())


def simulate(
    config: FederatedConfig,
    data: DatasetSplits | None = None,
    on_round: Callable[[int, dict[str, Any] | None], None] | None = None,
) -> FederatedRun:
    """``config``'s run in this process, without Flower: each round the sampled clients' ``train_client`` from
    the server's values, then the server's step, exactly as the Flower apps do; the server's test evaluation
    as ``curve_point``. The bytes are counted as Flower counts the same messages (``flwr`` must be
    installed). ``on_round(round, point)`` as in ``run_flower``.

    >>> run = simulate(FederatedConfig(data="digits", image_size=8, clients=6, rounds=1, samples=1))
    >>> [p["round"] for p in run.curve], 0 < run.bytes_up < run.bytes_down
    ([1], True)
    """
    import time

    from .messages import client_metrics, train_instruction_bytes, train_reply_bytes

    data = load_federated_data(config) if data is None else data
    plan = plan_clients(data, config.clients, config.alpha, config.proportions, config.seed, config.validation)
    validation = validation_data(data, plan)
    model = federated_model(config, data)
    server = federated_server(config, model, cast(int, data.num_classes))
    shares = [client_data(data, plan, c) for c in range(config.clients)]
    run = FederatedRun(model, config)
    if on_round is not None:
        on_round(0, None)
    started = time.perf_counter()
    for server_round in range(1, config.rounds + 1):
        clients = sample_clients(config, server_round)
        finetune = server.finetunes(server_round)
        run.bytes_down += len(clients) * train_instruction_bytes(server, server_round)
        updates = [train_client(model, config, shares[c], c, server_round, finetune) for c in clients]
        run.bytes_up += sum(train_reply_bytes(u) for u in updates)
        run.client_train_metrics[server_round] = [client_metrics(u) for u in updates]
        server.apply(updates, server_round)
        point = curve_point(run, data, server_round, validation) if is_evaluated(config, server_round) else None
        if on_round is not None:
            on_round(server_round, point)
    run.seconds = time.perf_counter() - started
    run.warmup = warmup_record(config, server)
    return run


__all__ = [
    "LAST_EVALUATIONS",
    "ClientData",
    "FederatedPlan",
    "FederatedRun",
    "client_data",
    "client_seed",
    "curve_point",
    "evaluate_model",
    "federated_model",
    "federated_server",
    "is_evaluated",
    "load_federated_data",
    "mean_of_last",
    "no_augmentation",
    "plan_clients",
    "round_schedule",
    "sample_clients",
    "simulate",
    "train_client",
    "validation_data",
    "warmup_record",
]
