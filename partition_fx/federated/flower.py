"""Federated partitioned training on Flower's simulation engine (``flwr[simulation]``, the ``federated`` extra).

The server (a ``ServerApp`` running in a thread of this process) holds the model and a ``FederatedServer``;
each round its strategy sends every sampled client the model's partitions and psi, and each client (a
``ClientApp`` in a Ray worker) runs ``client_update`` for its chunk and replies with partitions k..C and psi's
gradient only. Flower's stock strategies refuse replies with different keys ("All ArrayRecords must have the
same keys for aggregation"), so ``_PartitionedStrategy`` aggregates per partition itself. The bytes counted
are those of the records that crossed Flower (``ArrayRecord.count_bytes``: each array's serialised bytes and
its key), per message.

Message keys: ``p{j}.{i}`` is tensor i of ``pmodel.partition_parameters(j)``; ``psi.{i}`` psi's value i (server
to client) or its gradient (client to server).
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PartitionError
from ..partitioned_model import PartitionedModel
from ..training.hyperparameters import collect_hyperparameters
from ..training.likelihoods import Likelihood
from .algorithm import ClientUpdate, FederatedServer, client_update

ModelFactory = Callable[[], tuple[PartitionedModel, Likelihood, "nn.Module | None"]]
"""Builds the partitioned model, the likelihood and the input transform (psi), the same on every call: the
clients rebuild the server's model with it (once per worker process) and then load each round's values."""


@dataclass
class FederatedRun:
    """What ``run_flower`` leaves: ``bytes_up`` / ``bytes_down`` (every message of every round), ``curve``
    (per evaluated round: ``round``, ``bytes``, what ``evaluate`` returned), and the server's trained model."""

    pmodel: PartitionedModel
    hyper: nn.Module | None
    rounds: int
    bytes_up: int = 0
    bytes_down: int = 0
    curve: list[dict[str, Any]] = field(default_factory=list)


def import_flower() -> Any:
    """Import Flower quietly, or say how to install it."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # read at import: no network calls from a simulation
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    try:
        import flwr
    except ImportError:
        raise PartitionError(
            'federated training runs on Flower, which is not installed: pip install -e ".[federated]"'
        ) from None
    logging.getLogger("flwr").setLevel(logging.ERROR)
    import flwr.app
    import flwr.clientapp
    import flwr.serverapp
    import flwr.serverapp.strategy
    import flwr.simulation

    return flwr


def _state_arrays(server: FederatedServer) -> dict[str, torch.Tensor]:
    arrays = {f"p{j}.{i}": p.detach() for j, params in server.partitions.items() for i, p in enumerate(params)}
    psi = collect_hyperparameters(server.pmodel, server.hyper, server.likelihood)
    arrays.update((f"psi.{i}", p.detach()) for i, p in enumerate(psi))
    return arrays


def _load(pmodel: PartitionedModel, likelihood: Likelihood, hyper: nn.Module | None, arrays: dict[str, Any]) -> None:
    """The round's server values into a client's model (``arrays``: key -> numpy array)."""
    with torch.no_grad():
        for j in range(1, pmodel.num_partitions + 1):
            for i, p in enumerate(pmodel.partition_parameters(j)):
                p.copy_(torch.from_numpy(arrays[f"p{j}.{i}"]))
        for i, p in enumerate(collect_hyperparameters(pmodel, hyper, likelihood)):
            p.copy_(torch.from_numpy(arrays[f"psi.{i}"]))


_WORKER_STATE: dict[str, tuple[PartitionedModel, Likelihood, nn.Module | None, list[Any]]] = {}
"""Per Ray worker process and run: the client model (built once, then reloaded with every round's values) and
the clients' data (read once from the run's file)."""


@dataclass(frozen=True)
class _ClientSpec:
    """What a client needs besides the round's values. Flower pickles the ClientApp, and so this, with every
    message: it names the file holding the clients' data (the simulation's clients share this machine)
    instead of carrying them."""

    token: str
    factory: ModelFactory
    data_file: str
    chunks: Sequence[int]


def _client_app(spec: _ClientSpec, flwr: Any) -> Any:
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    app = flwr.clientapp.ClientApp()

    @app.train()
    def train(message: Any, context: Any) -> Any:
        client = int(context.node_config["partition-id"])
        if spec.token not in _WORKER_STATE:
            torch.set_num_threads(1)
            _WORKER_STATE[spec.token] = (*spec.factory(), torch.load(spec.data_file, weights_only=True))
        pmodel, likelihood, hyper, data = _WORKER_STATE[spec.token]
        config = message.content["config"]
        _load(pmodel, likelihood, hyper, {key: array.numpy() for key, array in message.content["arrays"].items()})
        update = client_update(
            pmodel, likelihood, hyper, data[client], spec.chunks[client], client=client,
            lr=float(config["lr"]), batch_size=int(config["batch-size"]),
            seed=int(config["seed"]) * 1_000_003 + int(config["server-round"]) * 1009 + client,
        )  # fmt: skip
        arrays = {
            f"p{j}.{i}": Array(t.numpy()) for j, tensors in update.partitions.items() for i, t in enumerate(tensors)
        }
        if update.psi_gradient is not None:
            arrays.update((f"psi.{i}", Array(g.numpy())) for i, g in enumerate(update.psi_gradient))
        metrics = MetricRecord({"num-examples": update.num_examples, "client": client, "chunk": update.k})
        return Message(RecordDict({"arrays": ArrayRecord(arrays), "metrics": metrics}), reply_to=message)

    return app


def _updates(replies: Iterable[Any]) -> list[ClientUpdate]:
    updates = []
    for reply in replies:
        metrics, arrays = reply.content["metrics"], reply.content["arrays"]
        partitions: dict[int, list[torch.Tensor]] = {}
        psi: dict[int, torch.Tensor] = {}
        for key, array in arrays.items():
            name, index = key.split(".")
            tensor = torch.from_numpy(array.numpy().copy())
            if name == "psi":
                psi[int(index)] = tensor
            else:
                partitions.setdefault(int(name[1:]), {})[int(index)] = tensor  # type: ignore[index]
        ordered = {j: [tensors[i] for i in range(len(tensors))] for j, tensors in partitions.items()}  # type: ignore[arg-type]
        gradient = [psi[i] for i in range(len(psi))] if psi else None
        updates.append(
            ClientUpdate(int(metrics["client"]), int(metrics["chunk"]), int(metrics["num-examples"]), ordered, gradient)
        )
    return updates


def run_flower(
    factory: ModelFactory,
    client_data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    chunks: Sequence[int],
    *,
    rounds: int,
    lr: float = 0.05,
    batch_size: int = 64,
    server_lr: float = 1e-3,
    hyper_lr: float = 3e-3,
    learn_hyperparameters: bool = True,
    evaluate: Callable[[PartitionedModel, nn.Module | None], dict[str, float]] | None = None,
    evaluate_every: int = 1,
    on_round: Callable[[int, dict[str, Any] | None], None] | None = None,
    seed: int = 0,
    cpus: int = 2,
) -> FederatedRun:
    """Federated partitioned training of ``factory()``'s model for ``rounds`` rounds on Flower's simulation
    engine, one client per entry of ``client_data`` (its chunk in ``chunks``), every client in every round;
    ``evaluate(pmodel, hyper)`` scores the server's model every ``evaluate_every`` rounds and after the last;
    ``on_round(round, point)`` is called as the rounds begin (round 0) and after every round with its point of
    ``curve`` (None if the round was not evaluated), e.g. to show progress.

    See ``partition_fx.federated.run_federated`` for the checked entry point."""
    flwr = import_flower()
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

    pmodel, likelihood, hyper = factory()
    server = FederatedServer(
        pmodel, likelihood, hyper, lr=server_lr, hyper_lr=hyper_lr, learn_hyperparameters=learn_hyperparameters
    )
    run = FederatedRun(pmodel, hyper, rounds)

    class _PartitionedStrategy(flwr.serverapp.strategy.FedAvg):
        def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
            messages = list(super().configure_train(server_round, arrays, config, grid))
            run.bytes_down += sum(record.count_bytes() for m in messages for record in m.content.values())
            return messages

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
            replies = list(replies)
            failed = [r for r in replies if r.has_error()]
            if failed:
                raise PartitionError(
                    f"{len(failed)} client(s) failed in round {server_round}: {failed[0].error.reason}"
                )
            run.bytes_up += sum(record.count_bytes() for r in replies for record in r.content.values())
            server.apply(_updates(replies))
            arrays = ArrayRecord({key: Array(t.cpu().numpy()) for key, t in _state_arrays(server).items()})
            return arrays, MetricRecord({"clients": len(replies)})

    def evaluate_fn(server_round: int, arrays: Any) -> Any:  # Flower calls it before the rounds and after each
        if server_round == 0:
            if on_round is not None:
                on_round(0, None)
            return None
        scores = None
        if evaluate is not None and (server_round % evaluate_every == 0 or server_round == rounds):
            scores = evaluate(pmodel, hyper)
            run.curve.append({"round": server_round, "bytes": run.bytes_up + run.bytes_down, **scores})
        if on_round is not None:
            on_round(server_round, run.curve[-1] if scores is not None else None)
        return None if scores is None else MetricRecord(dict(scores))

    server_app = flwr.serverapp.ServerApp()
    n = len(client_data)

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        strategy = _PartitionedStrategy(
            fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n
        )
        initial = ArrayRecord({key: Array(t.cpu().numpy()) for key, t in _state_arrays(server).items()})
        config = ConfigRecord({"lr": lr, "batch-size": batch_size, "seed": seed})
        strategy.start(
            grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=config, evaluate_fn=evaluate_fn
        )

    with tempfile.TemporaryDirectory(prefix="partition-fx-federated-") as directory:
        data_file = str(Path(directory) / "clients.pt")
        torch.save([(x.contiguous(), y.contiguous()) for x, y in client_data], data_file)
        spec = _ClientSpec(token=uuid.uuid4().hex, factory=factory, data_file=data_file, chunks=list(chunks))
        _simulate(flwr, server_app, _client_app(spec, flwr), len(client_data), cpus)
    return run


def _simulate(flwr: Any, server_app: Any, client_app: Any, clients: int, cpus: int) -> None:
    flwr.simulation.run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False, "logging_level": "ERROR",
                          "log_to_driver": False},
        },
    )  # fmt: skip
