"""The commands under ``torchrun``: the process group of a launch with several processes.

``torchrun --nproc_per_node=N $(which partition-fx) train ...`` starts N copies of the command with
``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` set. Each joins one process group (gloo on CPU, NCCL on CUDA,
each process on its own GPU), ``fit`` then averages every step over them (``training.step.stepping``), and
rank 0 alone writes ``--out``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


@contextmanager
def torchrun_group(device: str) -> Iterator[int | None]:
    """This process's rank in the launch's process group (initialised here and destroyed on exit), or None
    for a single process (no ``WORLD_SIZE`` > 1 in the environment, or a group initialised by the caller).

    >>> with torchrun_group("cpu") as rank:
    ...     rank is None
    True
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield None
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" is then this process's GPU
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


def barrier(rank: int | None) -> None:
    """Wait for every process of the launch (nothing for a single process)."""
    if rank is not None:
        dist.barrier()


def processes(rank: int | None) -> int:
    """How many processes the launch trains with (1 for a single process)."""
    return 1 if rank is None else dist.get_world_size()
