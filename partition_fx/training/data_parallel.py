"""Data-parallel partitioned training: one trainer per process under ``torchrun``, gradients averaged.

Every rank builds the same trainer (same seed, so the same chunks and the same sampler): each iteration all
ranks draw the same partition k, hyperparameter chunk and global minibatch, and each takes its own
contiguous share of the minibatch (``shard``). After the backward pass the gradients of what is stepped
(the partitions of k, and psi) are averaged across ranks in ONE all-reduce (``average``), with the step's
losses, so every rank takes the same optimiser step on the gradient of the global minibatch's mean loss,
as one process with the whole minibatch would, and the models stay identical without being exchanged.

Why not ``DistributedDataParallel``: a partitioned step leaves most parameters unused and changes which
ones every iteration. With DDP's defaults such a step is silently unsynchronised and the next one raises
"Expected to have finished reduction"; ``find_unused_parameters=True`` handles one forward per step at the
cost of a graph traversal; ``static_graph=True`` fails when the partition changes. An explicit all-reduce of
the gradients that exist is exact, cheap (the stepped partitions and psi only) and independent of how many
forwards a step makes (the fused and every-partition iterations make several).

What stays per rank: BatchNorm batch statistics (each rank normalises its share, as DDP without
``SyncBatchNorm``); running statistics are broadcast from rank 0 before every step, as DDP's
``broadcast_buffers=True`` does. Evaluations (LML, accuracies) run on every rank on the full data, so all
ranks keep the same history and best state; only rank 0 writes files (``is_writer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import PartitionArgumentError


def running_statistics_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that keep running statistics (BatchNorm and the like: ``running_mean``).

    >>> [type(m).__name__ for m in running_statistics_modules(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))]
    ['BatchNorm1d']
    """
    return [m for m in model.modules() if isinstance(getattr(m, "running_mean", None), torch.Tensor)]


class DataParallel:
    """The process group a trainer averages over (see the module docstring).

    >>> DataParallel.from_environment(None) is None  # no process group: a single process
    True
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    @classmethod
    def from_environment(cls, requested: bool | None) -> DataParallel | None:
        """The default process group when one is initialised with more than one process (``torchrun``) and
        ``requested`` is not False; None otherwise. ``requested=True`` without such a group is an error."""
        active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if requested and not active:
            raise PartitionArgumentError(
                "data_parallel=True needs an initialised process group with 2 or more processes: launch with "
                "torchrun --nproc_per_node=N and call torch.distributed.init_process_group() first"
            )
        return cls() if active and requested is not False else None

    @property
    def is_writer(self) -> bool:
        """Whether this process writes checkpoints, reports and exports (rank 0)."""
        return self.rank == 0

    def check_batch_size(self, name: str, size: int) -> None:
        if size % self.world_size:
            raise PartitionArgumentError(
                f"{name}={size} does not split evenly over {self.world_size} processes; use a multiple of "
                f"{self.world_size} (each process takes {name} / {self.world_size} examples of the global batch)"
            )

    def shard(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's contiguous share of each tensor's first dimension (equal shares)."""
        return tuple(t.chunk(self.world_size)[self.rank] for t in tensors)

    def broadcast(self, modules: Sequence[nn.Module | None], buffers_only: bool = False) -> None:
        """Rank 0's parameters (unless ``buffers_only``) and buffers on every rank."""
        for module in modules:
            if module is None:
                continue
            tensors = list(module.buffers()) if buffers_only else [*module.parameters(), *module.buffers()]
            for tensor in tensors:
                if tensor.numel():
                    dist.broadcast(tensor.data, src=0, group=self.group)

    def average(
        self, params: Sequence[torch.Tensor], losses: Sequence[torch.Tensor | None]
    ) -> list[torch.Tensor | None]:
        """Average the gradients of ``params`` and the ``losses`` across ranks, in place, in one all-reduce;
        returns the averaged losses.

        A parameter that received no gradient on this rank (its partition had no example in this rank's
        share, e.g. in an every-partition step) contributes zeros; one that received none on any rank keeps
        ``grad=None``, so the optimiser still skips it on every rank. Only then is the device read (which
        parameters got a gradient anywhere); when every parameter has one here, nothing is read."""
        given = [loss.detach().float().reshape(1) for loss in losses if loss is not None]
        if not params and not given:
            return list(losses)
        device = params[0].device if params else given[0].device
        missing = [p.grad is None for p in params]
        grads = [
            p.new_zeros(p.numel(), dtype=torch.float32) if absent else p.grad.reshape(-1).float()
            for p, absent in zip(params, missing)
        ]
        present = torch.tensor([not absent for absent in missing], dtype=torch.float32, device=device)
        flat = torch.cat([*grads, present, *given])
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        *averaged, counts, averaged_losses = flat.split([g.numel() for g in grads] + [len(params), len(given)])
        anywhere = counts.gt(0).tolist() if any(missing) else [True] * len(params)
        for p, grad, absent, received in zip(params, averaged, missing, anywhere):
            if not received:
                p.grad = None
            elif absent:
                p.grad = grad.view_as(p).to(p.dtype)
            else:
                p.grad.copy_(grad.view_as(p))
        values = iter(averaged_losses)
        return [None if loss is None else next(values).to(loss.dtype).reshape(loss.shape) for loss in losses]
