"""``PartitionedFedAdam``: the server side of federated partitioned training as a Flower strategy.

It is Flower's ``FedAvg`` in everything but aggregation (client sampling by ``fraction_train`` /
``min_train_nodes``, federated evaluation by ``fraction_evaluate``, the ``start`` loop and its ``Result``):
Flower's stock aggregation refuses replies with different keys, and a partitioned round's replies have them
(a client in chunk k uploads partitions k..C only). So ``aggregate_train`` turns the replies into
``ClientUpdate`` s and lets a framework-free ``FederatedServer`` take the step: FedAdam per partition over the
clients that sent it, Adam on psi with their gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..errors import PartitionError
from .algorithm import FederatedServer
from .messages import client_updates, record_bytes, reply_metrics, state_record

CLIENT_METRICS = ("client", "chunk", "num-examples", "train-loss")
"""The metrics each client's train reply carries (``client`` is its partition id, ``chunk`` its k); one that sent
psi's gradient also its ``heldout-nll``."""


class PartitionedFedAdam(FedAvg):
    """Flower strategy for partitioned networks (appendix J.1) around a ``FederatedServer``.

    Besides ``FedAvg``'s arguments (``fraction_evaluate`` 0, the default here, is no federated evaluation, not
    warned of as ``FedAvg`` warns): ``accept_failures`` (Flower's convention: True aggregates the replies that
    came back and warns of the failures, once a round; False raises on the first round with one).
    ``bytes_up`` / ``bytes_down`` count the training messages' records both ways (evaluation traffic is
    ``bytes_evaluate``), ``client_train_metrics[round]`` keeps every client's reply metrics
    (:data:`CLIENT_METRICS`), and ``failures[round]`` each failed reply's stage and reason.

    Example (a server-side ``main``; ``partition_fx.federated.app`` is the complete one)::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical
        >>> server = FederatedServer(partitionify(torch.nn.Linear(4, 2), 3), Categorical(), None)
        >>> strategy = PartitionedFedAdam(server, fraction_train=0.5, min_train_nodes=1)
        >>> sorted(strategy.initial_arrays())  # each partition's flat tensor; no psi in this model
        ['p1.0', 'p2.0', 'p3.0']
    """

    def __init__(
        self,
        server: FederatedServer,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        accept_failures: bool = True,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate or 1.0,  # 0 is this strategy's default: FedAvg warns of it
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        if fraction_evaluate == 0.0:  # no federated evaluation, set as FedAvg sets it, without its warning
            self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.server = server
        self.accept_failures = accept_failures
        self.bytes_up = self.bytes_down = self.bytes_evaluate = 0
        self.client_train_metrics: dict[int, list[dict[str, float]]] = {}
        self.failures: dict[int, list[str]] = {}

    def initial_arrays(self) -> ArrayRecord:
        """The server's partitions and psi, to ``start`` from."""
        return state_record(self.server)

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> PartitionedFedAdam: %d partitions, server Adam lr %g, psi Adam lr %s, accept_failures=%s",
            self.server.pmodel.num_partitions, self.server.optimizer.param_groups[0]["lr"],
            self.server.hyper_optimizer.param_groups[0]["lr"] if self.server.hyper_optimizer else "(psi fixed)",
            self.accept_failures)  # fmt: skip

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config["finetune"] = int(self.server.finetunes(server_round))  # the server's schedule (the warm-up ends it)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.bytes_down += sum(record_bytes(m.content) for m in messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One server step from the replies that came back (Flower's key-consistency check is skipped: the
        replies' partitions differ by chunk); the server's new state and the round's metrics."""
        valid, failed = self._check_and_log_replies(replies, is_train=True, validate=False)
        self._failed(server_round, failed, "train")
        if not valid:
            log(WARNING, "round %d: no client replied; the server's model stays as it was", server_round)
            return None, MetricRecord({"clients": 0, "failures": len(failed)})
        self.bytes_up += sum(record_bytes(m.content) for m in valid)
        updates = client_updates(valid, self.arrayrecord_key)
        self.server.apply(updates, server_round)
        clients = [reply_metrics(m.content) for m in valid]
        self.client_train_metrics[server_round] = sorted(clients, key=lambda c: c["client"])
        total = sum(c["num-examples"] for c in clients)
        loss = sum(c["train-loss"] * c["num-examples"] for c in clients) / total
        metrics = MetricRecord({"train-loss": loss, "clients": len(valid), "failures": len(failed)})
        return state_record(self.server), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self.bytes_evaluate += sum(record_bytes(m.content) for m in messages)
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The example-weighted mean of the clients' evaluation metrics."""
        valid, failed = self._check_and_log_replies(list(replies), is_train=False, validate=True)
        self._failed(server_round, failed, "evaluate")
        return self.evaluate_metrics_aggr_fn([m.content for m in valid], self.weighted_by_key) if valid else None

    def _failed(self, server_round: int, failed: list[Message], stage: str) -> None:
        """Keep each failure as ``"train: <the error's last line>"`` (Ray's tracebacks end with the client's
        message) and say so in a warning, or raise if failures are not accepted."""
        if not failed:
            return
        last_lines = [((m.error.reason or "").strip().splitlines() or [""])[-1] for m in failed]
        reasons = [f"{stage}: {line}" for line in last_lines]
        self.failures.setdefault(server_round, []).extend(reasons)
        if not self.accept_failures:
            raise PartitionError(
                f"{len(failed)} client(s) failed in round {server_round} (accept_failures=False): {reasons[0]}"
            )
        log(WARNING, "round %d: %d client(s) failed to %s, their replies left out (the first: %s)", server_round,
            len(failed), stage, last_lines[0])  # fmt: skip


__all__ = ["CLIENT_METRICS", "PartitionedFedAdam"]
