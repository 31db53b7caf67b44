"""What crosses Flower in a round, as ``ArrayRecord`` s: the server's values down, a client's update up.

Keys: ``p{j}.{i}`` is tensor i of ``pmodel.partition_parameters(j)``; ``psi.{i}`` is psi's value i (server to
client) or its gradient (client to server). A client uploads only the partitions it trained (k..C), so the
replies of one round have different keys; ``PartitionedFedAdam`` aggregates them per partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from ..errors import PartitionError
from ..fx.partitioned_model import PartitionedModel
from ..training.objective.objective import Objective
from .algorithm import ClientUpdate, FederatedServer
from .models import FederatedModel


def _state_tensors(pmodel: PartitionedModel, likelihood: Any, hyper: Any) -> dict[str, torch.Tensor]:
    """The tensors the server sends, by their keys: every partition's, then psi's."""
    tensors: dict[str, torch.Tensor] = {
        f"p{j}.{i}": p
        for j in range(1, pmodel.num_partitions + 1)
        for i, p in enumerate(pmodel.partition_parameters(j))
    }
    tensors.update((f"psi.{i}", p) for i, p in enumerate(Objective(pmodel, hyper, likelihood).hyperparameters()))
    return tensors


def state_record(server: FederatedServer) -> ArrayRecord:
    """The server's partitions and psi."""
    tensors = _state_tensors(server.pmodel, server.likelihood, server.hyper)
    return ArrayRecord({key: Array(t.detach().cpu().numpy()) for key, t in tensors.items()})


def load_state(model: FederatedModel, record: ArrayRecord) -> None:
    """A round's server values (``state_record``) into a client's copy of the model."""
    tensors = _state_tensors(model.pmodel, model.likelihood, model.hyper)
    if tensors.keys() != set(record):
        raise PartitionError(
            f"the server sent {sorted(record)} but this client's model holds {sorted(tensors)}: the server and "
            "the client were built from different configs (partitions, or whether psi is learned)"
        )
    with torch.no_grad():
        for key, p in tensors.items():
            p.copy_(torch.from_numpy(record[key].numpy()))


def update_record(update: ClientUpdate) -> ArrayRecord:
    """A client's reply: partitions k..C as trained and, for k >= 2, psi's gradient."""
    arrays = {f"p{j}.{i}": t for j, tensors in update.partitions.items() for i, t in enumerate(tensors)}
    if update.psi_gradient is not None:
        arrays.update((f"psi.{i}", g) for i, g in enumerate(update.psi_gradient))
    return ArrayRecord({key: Array(t.detach().cpu().numpy()) for key, t in arrays.items()})


def array_record(content: RecordDict, key: str = "arrays") -> ArrayRecord:
    """``content[key]``: the values a server or client sent (Flower types a record dict's entries as any record)."""
    return cast(ArrayRecord, content[key])


def record_number(content: RecordDict, record: str, key: str) -> float:
    """``content[record][key]``: a number a server or client sent in a metric or config record (Flower types a
    record's entries as any value a record holds, lists and arrays included)."""
    return cast(float, content[record][key])


def client_updates(replies: Iterable[Message], arrays_key: str = "arrays") -> list[ClientUpdate]:
    """The ``ClientUpdate`` s of a round's (error-free) replies; their ``metrics`` name the client, its chunk,
    its number of examples and its held-out negative log-likelihood."""
    updates = []
    for reply in replies:
        client, chunk, examples = (
            int(record_number(reply.content, "metrics", key)) for key in ("client", "chunk", "num-examples")
        )
        partitions: dict[int, dict[int, torch.Tensor]] = {}
        psi: dict[int, torch.Tensor] = {}
        for key, array in array_record(reply.content, arrays_key).items():
            name, index = key.split(".")
            tensor = torch.from_numpy(array.numpy().copy())
            if name == "psi":
                psi[int(index)] = tensor
            else:
                partitions.setdefault(int(name[1:]), {})[int(index)] = tensor
        ordered = {j: [tensors[i] for i in range(len(tensors))] for j, tensors in partitions.items()}
        gradient = [psi[i] for i in range(len(psi))] if psi else None
        heldout = reply_metrics(reply.content).get("heldout-nll", float("nan"))
        updates.append(ClientUpdate(client, chunk, examples, ordered, gradient, heldout_nll=heldout))
    return updates


def train_instruction(state: ArrayRecord, server_round: int, finetune: bool = False) -> RecordDict:
    """What the server sends a sampled client to train: its values, the round and whether it fine-tunes
    (``PartitionedFedAdam.configure_train`` builds this same content)."""
    return RecordDict(
        {"arrays": state, "config": ConfigRecord({"server-round": server_round, "finetune": int(finetune)})}
    )


def train_reply(update: ClientUpdate) -> RecordDict:
    """What a client sends back: its update and its metrics (``strategy.CLIENT_METRICS``)."""
    return RecordDict({"arrays": update_record(update), "metrics": MetricRecord({**client_metrics(update)})})


def client_metrics(update: ClientUpdate) -> dict[str, float]:
    """What a client reports with its update (``strategy.CLIENT_METRICS``)."""
    metrics = {"client": update.client, "chunk": update.k, "num-examples": update.num_examples,
               "train-loss": update.train_loss}  # fmt: skip
    if update.psi_gradient is not None:  # the model's progress, by which psi's warm-up ends
        metrics["heldout-nll"] = update.heldout_nll
    return metrics


def reply_metrics(content: RecordDict) -> dict[str, float]:
    """Every metric of a client's train reply (``client_metrics``), as floats."""
    return {key: float(cast(float, value)) for key, value in cast(MetricRecord, content["metrics"]).items()}


def train_instruction_bytes(server: FederatedServer, server_round: int) -> int:
    """The bytes of one client's ``train_instruction`` (for ``simulate``, counting as Flower counts)."""
    return record_bytes(train_instruction(state_record(server), server_round, server.finetunes(server_round)))


def train_reply_bytes(update: ClientUpdate) -> int:
    """The bytes of one client's ``train_reply``."""
    return record_bytes(train_reply(update))


def record_bytes(content: Any) -> int:
    """The serialised bytes of a message's records (``count_bytes``: each array's bytes and its key)."""
    return sum(record.count_bytes() for record in content.values())


__all__ = [
    "client_metrics",
    "client_updates",
    "load_state",
    "record_bytes",
    "reply_metrics",
    "state_record",
    "train_instruction",
    "train_instruction_bytes",
    "train_reply",
    "train_reply_bytes",
    "update_record",
]
