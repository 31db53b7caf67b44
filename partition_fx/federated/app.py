"""Federated partitioned training as a Flower app: ``server_app`` and ``client_app`` read their settings from
Flower's run config (``FederatedConfig.from_run_config``); ``examples/flower_app`` ships them with a run
config, so ``flwr run examples/flower_app`` starts a simulated federation.

A client (a SuperNode) finds its share of the data by its ``partition-id`` among ``num-partitions`` (its node
config): it loads the dataset and computes the run's Dirichlet split and chunks from the run's seed, as every
other client does, and keeps its own share. It trains the partitions of its chunk from the server's values
(``train``) and evaluates the server's model on its own test share (``evaluate``, when the strategy samples it
with ``fraction-evaluate``). The server (``main``) builds the same model, runs ``PartitionedFedAdam`` for the
rounds with the server-side test evaluation every ``evaluate-every`` rounds, and writes the run's history and
final model to ``out`` when the run config names one.

``make_server_app(config)`` / ``make_client_app(config)`` build the same apps for a config given in Python
(``partition-fx federated`` does this).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from flwr.app import Context, Message, MetricRecord, MetricRecordValues, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .._io import replace_file, write_json
from ..datasets import DatasetSplits
from ..export import export_subnetwork
from .config import FederatedConfig
from .job import (
    ClientData,
    FederatedPlan,
    FederatedRun,
    client_data,
    curve_point,
    evaluate_model,
    federated_model,
    federated_server,
    is_evaluated,
    load_federated_data,
    plan_clients,
    train_client,
    validation_data,
    warmup_record,
)
from .messages import array_record, load_state, record_number, train_reply
from .models import FederatedModel
from .strategy import PartitionedFedAdam

OnRound = Callable[[int, "dict[str, Any] | None"], None]

_CLIENT_STATE: dict[tuple[FederatedConfig, int], tuple[DatasetSplits, FederatedPlan, FederatedModel]] = {}
"""Per worker process: the data, the plan and the client model of a run (built once, then reloaded with every
round's values)."""
_CLIENT_SHARES: dict[tuple[FederatedConfig, int, int], ClientData] = {}
"""Per worker process: each client's share, cut from the data once (a worker serves many clients)."""


def _client(
    config: FederatedConfig | None, context: Context
) -> tuple[FederatedConfig, int, ClientData, FederatedModel]:
    config = config or FederatedConfig.from_run_config(context.run_config)
    client, clients = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    key = (config, clients)
    if key not in _CLIENT_STATE:
        torch.set_num_threads(1)  # one simulated client per CPU the engine gives it
        data = load_federated_data(config)
        plan = plan_clients(data, clients, config.alpha, config.proportions, config.seed, config.validation)
        _CLIENT_STATE[key] = (data, plan, federated_model(config, data))
    data, plan, model = _CLIENT_STATE[key]
    share = (*key, client)
    if share not in _CLIENT_SHARES:
        _CLIENT_SHARES[share] = client_data(data, plan, client)
    return config, client, _CLIENT_SHARES[share], model


def client_train(message: Message, context: Context, config: FederatedConfig | None = None) -> Message:
    """A client's training round: the server's values in, its update (partitions k..C, psi's gradient) and
    metrics out. ``config`` None: the run config.

    It is public so that an app can wrap it, e.g. a ``ClientApp`` of its own that adds privacy or logging."""
    run_config, client, share, model = _client(config, context)
    load_state(model, array_record(message.content))
    server_round = int(record_number(message.content, "config", "server-round"))
    finetune = bool(record_number(message.content, "config", "finetune"))
    update = train_client(model, run_config, share, client, server_round, finetune)
    return Message(train_reply(update), reply_to=message)


def client_evaluate(message: Message, context: Context, config: FederatedConfig | None = None) -> Message:
    """A client's evaluation of the server's model on its own test share: ``eval-accuracy``,
    ``eval-accuracy-averaged`` (over ``test_samples`` augmentations), ``eval-nll`` and ``num-examples``."""
    run_config, _, share, model = _client(config, context)
    load_state(model, array_record(message.content))
    scores = evaluate_model(model, share.test, run_config.test_samples)
    metrics: dict[str, MetricRecordValues] = {
        "num-examples": len(share.test[1]),
        **{f"eval-{key}": value for key, value in scores.items()},
    }
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)


def make_client_app(config: FederatedConfig | None = None) -> ClientApp:
    """The ``ClientApp``: ``client_train`` and ``client_evaluate`` for ``config``, or for the run config when
    None.

    >>> type(make_client_app()).__name__
    'ClientApp'
    """
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return client_train(message, context, config)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        return client_evaluate(message, context, config)

    return app


def make_server_app(
    config: FederatedConfig | None = None,
    *,
    on_round: OnRound | None = None,
    on_finish: Callable[[FederatedRun], None] | None = None,
    min_available_nodes: int = 2,
) -> ServerApp:
    """The ``ServerApp`` for ``config`` (None: the run config). ``on_round(round, point)`` is called as the
    rounds begin (0, None) and after each (its ``curve`` point, or None when not evaluated);
    ``on_finish(run)`` with the finished ``FederatedRun``.

    >>> type(make_server_app()).__name__
    'ServerApp'
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_config = config or FederatedConfig.from_run_config(context.run_config)
        run = _serve(grid, run_config, on_round, min_available_nodes)
        if run_config.out:
            write_run(run, Path(run_config.out))
        if on_finish is not None:
            on_finish(run)

    return app


def _serve(grid: Grid, config: FederatedConfig, on_round: OnRound | None, min_available_nodes: int) -> FederatedRun:
    data = load_federated_data(config)
    model = federated_model(config, data)
    server = federated_server(config, model, cast(int, data.num_classes))
    strategy = PartitionedFedAdam(
        server, fraction_train=config.fraction_train, fraction_evaluate=config.fraction_evaluate,
        min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=min_available_nodes,
    )  # fmt: skip
    run = FederatedRun(model, config)
    started = [time.perf_counter()]
    validation: list[tuple[torch.Tensor, torch.Tensor] | None] = []

    def evaluate_fn(server_round: int, arrays: Any) -> MetricRecord | None:  # before the rounds and after each
        if server_round == 0:
            started[0] = time.perf_counter()
            if on_round is not None:
                on_round(0, None)
            return None
        run.bytes_up, run.bytes_down = strategy.bytes_up, strategy.bytes_down
        if config.validation and not validation:  # the clients' shares: a plan over the federation's nodes
            plan = plan_clients(data, len(list(grid.get_node_ids())), config.alpha, config.proportions, config.seed,
                                config.validation)  # fmt: skip
            validation.append(validation_data(data, plan))
        held = validation[0] if validation else None
        point = curve_point(run, data, server_round, held) if is_evaluated(config, server_round) else None
        if on_round is not None:
            on_round(server_round, point)
        if point is None:
            return None
        return MetricRecord({key: point[key] for key in ("test-accuracy", "test-accuracy-averaged", "test-nll")})

    result = strategy.start(
        grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=config.rounds, evaluate_fn=evaluate_fn
    )
    run.seconds = time.perf_counter() - started[0]
    run.client_train_metrics = strategy.client_train_metrics
    # The clients' evaluate metrics: numbers (client_evaluate), which Flower types as any metric value.
    run.federated_evaluation = {
        r: cast("dict[str, float]", dict(m)) for r, m in result.evaluate_metrics_clientapp.items()
    }
    run.failures = strategy.failures
    run.warmup = warmup_record(config, server)
    return run


def write_run(run: FederatedRun, out: Path) -> None:
    """``history.json`` (``FederatedRun.history``) and ``model.safetensors`` (the exported final model) in
    ``out``, each replaced atomically."""
    from safetensors.torch import save_model

    out.mkdir(parents=True, exist_ok=True)
    exported = export_subnetwork(run.model.pmodel).eval()
    replace_file(out / "model.safetensors", lambda tmp: save_model(exported, str(tmp)))
    write_json(out / "history.json", run.history())


server_app = make_server_app()
"""The ``ServerApp`` of ``examples/flower_app`` (``serverapp = "partition_fx.federated.app:server_app"``)."""
client_app = make_client_app()
"""The ``ClientApp`` of ``examples/flower_app`` (``clientapp = "partition_fx.federated.app:client_app"``)."""

__all__ = [
    "client_app",
    "client_evaluate",
    "client_train",
    "make_client_app",
    "make_server_app",
    "server_app",
    "write_run",
]
