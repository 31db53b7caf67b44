"""Data-parallel training (``training.step.stepping``) against its definition: one process with the whole
global minibatch. Two real processes (torch.multiprocessing, gloo on CPU) train with half of every minibatch
each; the trained model and hyperparameters must equal one process's (to float tolerance: the gradients are
summed in another order), for the paper's iteration, fused and every-partition iterations, and for a run the two
processes stopped and resumed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.training.step.stepping import DataParallel
from partition_fx.transforms import InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning

VARIANTS = {"paper": {}, "fused": {"fused": True}, "every_partition": {"every_partition": True}}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(160, 6, generator=generator)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def _train(variant: str, checkpoint_dir: Path | None = None, **extra: object) -> dict[str, torch.Tensor]:
    """A model without batch statistics (LayerNorm), an input mask as psi; returns the trained state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    pmodel = partitionify(model, 3, (0.6, 0.2, 0.2))
    hyper = InputMask(6)
    fit(
        pmodel, _data(), PAPER, hyper=hyper, steps=12, batch_size=16, hyper_batch_size=8, progress=False,
        checkpoint_dir=checkpoint_dir, recalibrate_norms=False, eval_every=3, **VARIANTS[variant], **extra,
    )  # fmt: skip
    state = {f"model.{k}": v.detach().clone() for k, v in pmodel.state_dict().items()}
    state.update({f"hyper.{k}": v.detach().clone() for k, v in hyper.state_dict().items()})
    return state


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        trainer = PartitionedTrainer(partitionify(torch.nn.Linear(6, 2), 2), _data(), PAPER, batch_size=16)
        assert trainer.data_parallel is not None and trainer.data_parallel.world_size == world_size
        assert trainer.data_parallel.shard(torch.arange(16))[0].tolist() == list(range(8 * rank, 8 * rank + 8))
        # Each rank gets its own checkpoint directory, so what is found in it was written by that rank (in one
        # shared directory the two ranks' listings were equal whoever wrote: every rank writing passed).
        own = Path(out) / f"rank{rank}"
        results = {}
        for variant in VARIANTS:
            results[variant] = _train(variant, own / f"checkpoints-{variant}")
        # Stopped at step 6 (a callback), then resumed by both processes from the resume directory rank 0 wrote.
        _train("paper", own / "interrupted", callbacks=[lambda trainer, record: trainer.step >= 6])
        results["resumed"] = _train("paper", resume=Path(out) / "rank0" / "interrupted" / "resume")
        if rank == 0:
            torch.save(results, Path(out) / "rank0.pt")
        written = {d: sorted(str(p.relative_to(own)) for p in (own / d).rglob("*") if p.is_file())
                   for d in [*(f"checkpoints-{v}" for v in VARIANTS), "interrupted"]}  # fmt: skip
        torch.save(written, Path(out) / f"files{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_what_one_process_trains_with_the_whole_batch(tmp_path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    two = torch.load(tmp_path / "rank0.pt")
    for variant in [*VARIANTS, "resumed"]:
        one = _train("paper" if variant == "resumed" else variant)
        assert two[variant].keys() == one.keys()
        for key, value in one.items():
            torch.testing.assert_close(two[variant][key], value, rtol=1e-5, atol=1e-6, msg=f"{variant}: {key}")
        # psi moved, so the comparison is between trained models
        assert not torch.allclose(one["hyper.logits"], InputMask(6).logits, atol=1e-3), variant
    files = [torch.load(tmp_path / f"files{rank}.pt") for rank in (0, 1)]
    assert all(files[0].values()), f"rank 0 writes the checkpoints: {files[0]}"
    assert not any(files[1].values()), f"rank 1 wrote files: {files[1]}"


def test_data_parallel_needs_a_process_group_and_an_even_split() -> None:
    assert DataParallel.from_environment(None) is None
    x, y = _data()
    with pytest.raises(PartitionArgumentError, match="torchrun --nproc_per_node"):
        PartitionedTrainer(partitionify(torch.nn.Linear(6, 2), 2), (x, y), PAPER, batch_size=16, data_parallel=True)
