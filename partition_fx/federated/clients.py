"""Federated data: non-i.i.d. client datasets (Dirichlet skew, appendix J.2) and the clients' chunks (J.1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_concentration
from ..errors import PartitionArgumentError
from ..fx.assign import partition_sizes


def dirichlet_split(groups: torch.Tensor, num_clients: int, alpha: float, seed: int = 0) -> list[torch.Tensor]:
    """Example indices of each client, skewed over ``groups`` (a class, or a rotation bin, per example) as in
    Reddi et al. (2020): every client holds the same number of examples (up to one), drawn group by group
    from its own proportions q ~ Dir(alpha * prior); a group that runs out is dropped from the proportions
    of the clients still drawing. Small ``alpha``: most clients hold one group; large: close to i.i.d.

    >>> groups = torch.arange(100) % 10
    >>> clients = dirichlet_split(groups, num_clients=5, alpha=0.1, seed=0)
    >>> [len(c) for c in clients], sorted(torch.cat(clients).tolist()) == list(range(100))
    ([20, 20, 20, 20, 20], True)
    """
    n = groups.numel()
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise PartitionArgumentError(f"num_clients must be a positive int, got {num_clients!r}")
    if num_clients > n:
        raise PartitionArgumentError(
            f"{num_clients} clients for {n} examples: every client needs at least one; use at most {n} clients"
        )
    check_concentration(alpha)
    rng = np.random.default_rng(seed)
    labels, inverse = np.unique(groups.cpu().numpy(), return_inverse=True)
    pools = [list(rng.permutation(np.flatnonzero(inverse == g))) for g in range(len(labels))]
    prior = np.array([len(pool) for pool in pools], dtype=np.float64) / n
    clients = []
    for size in partition_sizes(n, [1 / num_clients] * num_clients):
        weights = rng.dirichlet(alpha * prior * len(labels))
        taken = []
        for _ in range(size):
            available = np.array([bool(pool) for pool in pools])
            probabilities = weights * available
            if probabilities.sum() <= 0:  # this client's groups ran out: draw from what is left, as the prior
                probabilities = prior * available
            taken.append(int(pools[rng.choice(len(pools), p=probabilities / probabilities.sum())].pop()))
        clients.append(torch.tensor(sorted(taken), dtype=torch.long))
    return clients


def client_chunks(num_clients: int, proportions: Sequence[float], seed: int = 0) -> list[int]:
    """The chunk k (1..C) of each client: exactly ``partition_sizes(num_clients, proportions)`` clients per
    chunk, in a random order, so the chunks' shares of clients follow the proportions (appendix J.1).

    >>> client_chunks(10, (0.7, 0.2, 0.1), seed=0).count(1)
    7
    """
    sizes = partition_sizes(num_clients, proportions)
    empty = [k for k, size in enumerate(sizes, start=1) if size == 0]
    if empty:
        raise PartitionArgumentError(
            f"{num_clients} clients with proportions {tuple(proportions)} leave chunk {empty[0]} without a client; "
            f"use more clients (at least {max(round(1 / min(proportions)), len(sizes))}) or larger proportions"
        )
    chunks = torch.tensor([k for k, size in enumerate(sizes, start=1) for _ in range(size)])
    order = torch.randperm(num_clients, generator=torch.Generator().manual_seed(seed))
    return chunks[order].tolist()
