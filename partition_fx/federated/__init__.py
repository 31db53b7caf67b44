"""Federated partitioned training (appendix J): clients in chunk k train partitions k..C of the model and send
the gradient of psi through subnetwork k-1; the server averages each partition's updates over the clients
that sent it (FedAdam) and psi's gradients (Adam).

``clients`` splits the data and assigns chunks, ``algorithm`` holds a client's round and the server's step
(framework-free), ``flower`` runs them on Flower's simulation engine (``pip install -e ".[federated]"``; imported
only when used), and ``job`` puts together the run of ``partition-fx federated``."""

from .algorithm import ClientUpdate, FederatedServer, client_update
from .clients import client_chunks, dirichlet_split

__all__ = ["ClientUpdate", "FederatedServer", "client_chunks", "client_update", "dirichlet_split"]
