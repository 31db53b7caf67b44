"""Federated partitioned training (appendix J): clients in chunk k train partitions k..C of the model and send
the gradient of psi through subnetwork k-1; the server averages each partition's updates over the clients
that sent it (FedAdam) and psi's gradients (Adam).

``config`` holds a run's settings (``FederatedConfig``), ``clients`` splits the data and assigns chunks,
``algorithm`` holds a client's round and the server's step (framework-free), ``models`` the run's model,
``job`` the pieces of a run on a dataset and ``simulate`` (the rounds in this process, no Flower),
``strategy`` the Flower strategy ``PartitionedFedAdam``, ``app`` the Flower ``server_app`` / ``client_app``
(shipped as ``examples/flower_app``), ``flower`` runs them from Python. The Flower parts need the extra
(``pip install -e ".[federated]"``) and are imported when first used.

>>> from partition_fx.federated import FederatedConfig
>>> FederatedConfig(rounds=100).hyper_lr_value
0.06
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "ClientUpdate": "algorithm",
    "FederatedServer": "algorithm",
    "client_update": "algorithm",
    "client_chunks": "clients",
    "dirichlet_split": "clients",
    "FederatedConfig": "config",
    "scaled_hyper_lr": "config",
    "FederatedRun": "job",
    "simulate": "job",
    "build_federated_model": "models",
    "federated_cnn": "models",
    "PartitionedFedAdam": "strategy",
    "server_app": "app",
    "client_app": "app",
    "make_server_app": "app",
    "make_client_app": "app",
    "client_train": "app",
    "client_evaluate": "app",
    "run_flower": "flower",
}
_NEEDS_FLOWER = {"strategy", "app"}


def __getattr__(name: str) -> Any:
    """Every name imported on first use: ``partition_fx.federated.config`` stays importable without torch (the
    command line's ``--help`` reads its defaults), and the Flower parts without the extra until used."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _HOMES[name] in _NEEDS_FLOWER:
        from .flower import import_flower

        import_flower()  # refused, with the way to install it, if the extra is missing
    return getattr(import_module(f".{_HOMES[name]}", __name__), name)


__all__ = [
    "ClientUpdate",
    "FederatedConfig",
    "FederatedRun",
    "FederatedServer",
    "PartitionedFedAdam",
    "build_federated_model",
    "client_app",
    "client_chunks",
    "client_evaluate",
    "client_train",
    "client_update",
    "dirichlet_split",
    "federated_cnn",
    "make_client_app",
    "make_server_app",
    "run_flower",
    "scaled_hyper_lr",
    "server_app",
    "simulate",
]
