"""Federated partitioned training, framework-free (appendix J.1): what a client computes in a round
(``client_update``) and what the server does with the replies (``FederatedServer``).

A client assigned to chunk k starts every partition j in k..C from the round's server values and trains it
alone through subnetwork j on its own data (one epoch of local SGD; eq. 25), each j independently; it returns
only partitions k..C (1..k-1 are untouched and not sent) and, for k >= 2, the gradient of psi through
subnetwork k-1 at the server values on all its data (eq. 26). In the fine-tuning rounds at the end of a run
(``finetune=True``), every client trains the final subnetwork, every partition at once, on all its data with
psi frozen, and returns every partition: the server's step is then one FedAdam over the whole model, as the
central path's fine-tuning phase trains the final subnetwork on all the data. The server averages each
partition's deltas over the clients that sent it, weighted by their numbers of examples, and takes a FedAdam
step (Reddi et al. 2020) per partition: a partition no client sent does not move, its Adam state included (its
gradient stays None). psi's gradients are averaged the same way into an Adam step. With C=1 and psi frozen
this is plain FedAdam, the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from ..fx.partitioned_model import PartitionedModel
from ..training.objective.likelihoods import Likelihood
from ..training.objective.lml import forward_log_likelihood
from ..training.objective.objective import Objective
from ..training.sampling.schedule import Schedule


@dataclass
class ClientUpdate:
    """What one client sends: its chunk ``k``, its number of examples, partitions k..C as trained
    (``partitions[j]``: the tensors of ``pmodel.partition_parameters(j)``), and psi's gradient (k >= 2)."""

    client: int
    k: int
    num_examples: int
    partitions: dict[int, list[torch.Tensor]]
    psi_gradient: list[torch.Tensor] | None
    train_loss: float = float("nan")
    """The mean negative log-likelihood of its local steps (every partition's, every epoch's)."""
    heldout_nll: float = float("nan")
    """With psi's gradient: the mean negative log-likelihood of its own data, unaugmented, through subnetwork k-1,
    which never trained on it (the model's progress, by which psi's warm-up ends)."""


def client_update(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    data: tuple[torch.Tensor, torch.Tensor],
    k: int,
    *,
    client: int = 0,
    lr: float = 0.05,
    batch_size: int = 64,
    seed: int = 0,
    epochs: int = 1,
    finetune: bool = False,
    psi_step: bool = True,
) -> ClientUpdate:
    """One client's round from the server values in ``pmodel`` / ``hyper`` (left as they were): ``epochs``
    epochs of local SGD per partition. Its random numbers (the epochs' order, dropout and augmentation noise)
    come from ``seed`` alone. ``finetune``: a fine-tuning round, whatever ``k``: the final subnetwork trained
    with every partition's parameters at once (psi applied, not learned), every partition returned, no psi
    gradient. ``psi_step`` False: no psi gradient either (psi takes no step this round, e.g. in its warm-up).

    >>> from partition_fx import partitionify
    >>> from partition_fx.training import Categorical
    >>> pmodel = partitionify(torch.nn.Linear(4, 2), 3)
    >>> update = client_update(pmodel, Categorical(), None, (torch.randn(8, 4), torch.randint(0, 2, (8,))), k=2)
    >>> sorted(update.partitions), update.psi_gradient is None  # partitions 2..3; no psi to learn here
    ([2, 3], True)
    >>> sorted(client_update(pmodel, Categorical(), None, (torch.randn(8, 4), torch.randint(0, 2, (8,))), k=2,
    ...                      finetune=True).partitions)
    [1, 2, 3]
    """
    with torch.random.fork_rng(devices=[]):  # the client's noise is a function of ``seed``, on any engine
        torch.manual_seed(seed)
        return _client_update(pmodel, likelihood, hyper, data, k, client, lr, batch_size, seed, epochs, finetune,
                              psi_step)  # fmt: skip


def _client_update(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    data: tuple[torch.Tensor, torch.Tensor],
    k: int,
    client: int,
    lr: float,
    batch_size: int,
    seed: int,
    epochs: int,
    finetune: bool,
    psi_step: bool,
) -> ClientUpdate:
    x, y = data
    pmodel.train()
    if hyper is not None:
        hyper.train()
    last = pmodel.num_partitions
    # What trains through which subnetwork: each partition j in k..C alone through subnetwork j, or (fine-tuning)
    # every partition at once through the final subnetwork C.
    groups = [(last, list(range(1, last + 1)))] if finetune else [(j, [j]) for j in range(k, last + 1)]
    generator = torch.Generator().manual_seed(seed)
    trained = {}
    losses: list[torch.Tensor] = []
    for subnetwork, partitions in groups:
        params = [p for j in partitions for p in pmodel.partition_parameters(j)]
        server_values = [p.detach().clone() for p in params]
        losses += _local_sgd(pmodel, likelihood, hyper, data, params, subnetwork, lr, batch_size, generator, epochs)
        for j in partitions:
            trained[j] = [p.detach().clone() for p in pmodel.partition_parameters(j)]
        with torch.no_grad():
            for p, value in zip(params, server_values):
                p.copy_(value)
    gradient, heldout = (None, None)
    if psi_step and not finetune:
        gradient, heldout = _psi_gradient(pmodel, likelihood, hyper, x, y, k)
    train_loss = float(torch.stack(losses).mean())
    return ClientUpdate(client, 1 if finetune else k, len(x), trained, gradient, train_loss,
                        float("nan") if heldout is None else heldout)  # fmt: skip


def _local_sgd(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    data: tuple[torch.Tensor, torch.Tensor],
    params: Sequence[torch.Tensor],
    j: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    epochs: int,
) -> list[torch.Tensor]:
    """``epochs`` epochs of SGD on ``params`` through subnetwork ``j``; the step's losses. Leaves ``params`` as
    trained (the caller keeps them and restores the server's values)."""
    x, y = data
    optimizer = torch.optim.SGD(params, lr=lr)
    losses = []
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = -forward_log_likelihood(pmodel, likelihood, x[batch], y[batch], j, hyper, transform_grad=False)
            loss.mean().backward(inputs=params)
            optimizer.step()
            losses.append(loss.detach().mean())
    return losses


def _psi_gradient(
    pmodel: PartitionedModel, likelihood: Likelihood, hyper: nn.Module | None, x: torch.Tensor, y: torch.Tensor, k: int
) -> tuple[list[torch.Tensor] | None, float | None]:
    """d/dpsi of the mean negative log-likelihood of all the client's data through subnetwork k-1, and the mean
    negative log-likelihood of the data unaugmented, in eval mode (None, None: chunk 1, or nothing to learn)."""
    psi = Objective(pmodel, hyper, likelihood).hyperparameters()
    if k < 2 or not psi:
        return None, None
    loss = -forward_log_likelihood(pmodel, likelihood, x, y, k - 1, hyper).mean()
    gradient = torch.autograd.grad(loss, psi, allow_unused=True, materialize_grads=True)
    pmodel.eval()  # the model as it predicts: no dropout, no augmentation
    with torch.no_grad():
        heldout = -forward_log_likelihood(pmodel, likelihood, x, y, k - 1).mean()
    pmodel.train()
    return [g.detach() for g in gradient], float(heldout)


class ProgressWarmup:
    """psi's warm-up decided by the model's progress: psi takes no step until the model its gradients come through
    has learned, the senders' held-out negative log-likelihood per example (their own data, unaugmented, through the
    subnetworks that never trained on it) at most ``threshold``; from the first round where it is (``started_at``),
    psi steps every partitioned round. A run whose model has still not learned at round ``deadline`` has no rounds
    left for psi to learn in (:attr:`expired`).

    >>> warmup = ProgressWarmup(threshold=1.0, deadline=6)
    >>> warmup.admits(3, 2.2), warmup.expired(6), warmup.admits(4, 0.9), warmup.admits(5, 1.5), warmup.started_at
    (False, True, True, True, 4)
    """

    def __init__(self, threshold: float, deadline: int | None = None) -> None:
        self.threshold = threshold
        self.deadline = deadline
        self.started_at: int | None = None
        self.heldout_nll: dict[int, float] = {}
        """Each round's held-out negative log-likelihood (the senders' example-weighted mean)."""

    def admits(self, server_round: int, heldout_nll: float) -> bool:
        """Whether psi steps on the gradients of ``server_round``, whose senders' held-out negative
        log-likelihood is ``heldout_nll``."""
        self.heldout_nll[server_round] = heldout_nll
        if self.started_at is None and heldout_nll <= self.threshold:
            self.started_at = server_round
        return self.started_at is not None

    def expired(self, server_round: int) -> bool:
        """Whether psi has not started by ``server_round``, the last round it could start at and still learn."""
        return self.started_at is None and self.deadline is not None and server_round >= self.deadline


class FederatedServer:
    """The server's model, psi and optimisers; ``apply`` turns a round's client updates into a step.

    With a ``schedule`` (the run's rounds) and a ``warmup`` (:class:`ProgressWarmup`), psi steps only once the
    model has learned, and if it has not by the warm-up's deadline, partitioned training ends there: ``fallback()``
    (psi as the baseline's: no augmentation) is called and the remaining rounds fine-tune (:meth:`finetunes` tells
    the clients).

    >>> from partition_fx import partitionify
    >>> from partition_fx.training import Categorical
    >>> pmodel = partitionify(torch.nn.Linear(4, 2), 3)
    >>> server = FederatedServer(pmodel, Categorical(), None)
    >>> data = (torch.randn(8, 4), torch.randint(0, 2, (8,)))
    >>> before = [p.detach().clone() for p in pmodel.partition_parameters(1)]
    >>> server.apply([client_update(pmodel, Categorical(), None, data, k=2)])
    >>> all(torch.equal(a, b) for a, b in zip(before, pmodel.partition_parameters(1)))  # nobody sent partition 1
    True
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        likelihood: Likelihood,
        hyper: nn.Module | None,
        *,
        lr: float = 1e-3,
        hyper_lr: float = 3e-3,
        learn_hyperparameters: bool = True,
        schedule: Schedule | None = None,
        warmup: ProgressWarmup | None = None,
        fallback: Callable[[], None] | None = None,
    ) -> None:
        self.pmodel, self.likelihood, self.hyper = pmodel, likelihood, hyper
        self.partitions = {j: pmodel.partition_parameters(j) for j in range(1, pmodel.num_partitions + 1)}
        self.optimizer = torch.optim.Adam([p for params in self.partitions.values() for p in params], lr=lr)
        psi = Objective(pmodel, hyper, likelihood).hyperparameters() if learn_hyperparameters else []
        self.psi = psi
        self.hyper_optimizer = torch.optim.Adam(psi, lr=hyper_lr) if psi else None
        self.schedule, self.warmup, self.fallback = schedule, warmup if psi else None, fallback

    def finetunes(self, server_round: int) -> bool:
        """Whether ``server_round`` is a fine-tuning round (False without a schedule)."""
        return self.schedule is not None and self.schedule.finetunes(server_round)

    def apply(self, updates: Sequence[ClientUpdate], server_round: int = 0) -> None:
        """FedAdam on each partition some client sent (pseudo-gradient: minus the example-weighted mean of
        the deltas), Adam on psi with the example-weighted mean of the clients' gradients (once the warm-up
        admits them); then, if the warm-up expired at ``server_round``, the end of partitioned training."""
        updates = sorted(updates, key=lambda u: u.client)  # a fixed order: the same sums every run
        self.optimizer.zero_grad(set_to_none=True)
        for j, params in self.partitions.items():
            senders = [u for u in updates if j in u.partitions]
            if not senders:
                continue  # grad None: Adam skips these parameters and keeps their state
            weights = _weights(senders)
            for i, p in enumerate(params):
                p.grad = -_weighted_sum(weights, (u.partitions[j][i] - p.detach() for u in senders))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        senders = [u for u in updates if u.psi_gradient is not None]
        gradients = [u.psi_gradient for u in updates if u.psi_gradient is not None]
        if self.hyper_optimizer is not None and senders and self._admits(server_round, senders):
            weights = _weights(senders)
            for i, p in enumerate(self.psi):
                p.grad = _weighted_sum(weights, (g[i] for g in gradients))
            self.hyper_optimizer.step()
            self.hyper_optimizer.zero_grad(set_to_none=True)
            for _, module in Objective(self.pmodel, self.hyper, self.likelihood).hyperparameter_modules():
                module.constrain_()
        schedule, warmup = self.schedule, self.warmup
        if schedule is None or warmup is None or schedule.finetune_from is None or schedule.finetunes(server_round):
            return
        if warmup.expired(server_round):  # the model never learned in time: fine-tune from here, as the baseline
            schedule.end_partitioned_training(server_round)
            if self.fallback is not None:
                self.fallback()

    def _admits(self, server_round: int, senders: Sequence[ClientUpdate]) -> bool:
        """Whether psi steps on these senders' gradients: always without a warm-up, else when it admits their
        held-out negative log-likelihood."""
        if self.warmup is None:
            return True
        heldout = _weighted_sum(_weights(senders), (torch.tensor(u.heldout_nll) for u in senders))
        return self.warmup.admits(server_round, float(heldout))


def _weighted_sum(weights: Sequence[float], tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """``sum(w * t)`` over one term or more (Python's ``sum``: 0 plus the first term is that term)."""
    return cast(torch.Tensor, sum(w * t for w, t in zip(weights, tensors)))


def _weights(updates: Sequence[ClientUpdate]) -> list[float]:
    total = sum(u.num_examples for u in updates)
    return [u.num_examples / total for u in updates]


__all__ = ["ClientUpdate", "FederatedServer", "ProgressWarmup", "client_update"]
