"""Memory of partitioned training relative to plain training: the partitioning's own storage (trained parts,
defaults, layout indices and seeds) as a share of parameter memory, the persistent state (parameters, Adam
state, buffers), and the peak of a training step.

The peak is tracked by torch's ``MemTracker`` (a dispatch mode that follows every tensor's storage): the
most bytes alive at once during a parameter step (of subnetwork 1 or C, whichever is higher) against one
plain step of the exported model with the same examples; activations, gradients, optimiser state and
temporaries included.
On CPU these are tensor bytes, on CUDA the same tracker on device memory. Prints a table and writes
``benchmarks/results/memory.json``.

    python -m benchmarks.memory [--models resnet18,fixup_resnet14] [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import timm
import torch
from torch.distributed._tools.mem_tracker import MemTracker

import partition_fx  # noqa: F401  (registers the shipped models)
from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results
from partition_fx import export_subnetwork, partitionify
from partition_fx.training import PartitionedTrainer

MODELS = {
    "resnet18": {},
    "fixup_resnet14": {},
    "cifar_wrn16_4": {},
    "vit_tiny_patch16_224": dict(img_size=32, patch_size=4),
}
# (scheme, default, assignments). Node partitioning always stores its (per-unit) index.
VARIANTS = [
    ("random", "init", "stored"),
    ("random", "zero", "stored"),
    ("random", "zero", "regenerated"),
    ("random", "seed", "regenerated"),
    ("node", "init", "stored"),
    ("node", "zero", "stored"),
    ("node", "seed", "stored"),
]
BATCH = 32


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def _peak_bytes(step, modules, optimizer, device: str) -> int:
    tracker = MemTracker()
    tracker.track_external(*modules, optimizer)
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device(device)]["Total"])


def measure(name: str, scheme: str, default: str, assignments: str, device: str = "cpu") -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **MODELS.get(name, {}))
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), scheme=scheme, default=default, assignments=assignments)
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    trainer = PartitionedTrainer(
        pmodel, (x, y), batch_size=BATCH, optimizer=partial(torch.optim.Adam, lr=1e-4), device=device
    )
    batch = torch.arange(BATCH)
    for k in (1, 2, 3):  # every partition stepped once: its Adam state exists
        trainer.parameter_step(k, batch)
    plain = export_subnetwork(pmodel).train().to(device)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-4)
    xd, yd = x.to(device), y.to(device)

    def plain_step() -> None:
        plain_opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(plain(xd), yd).backward()
        plain_opt.step()

    plain_step()
    param_bytes = _bytes(plain.parameters())
    parts = _bytes(pmodel.parameters())
    defaults = indices = 0
    holders = [t for _, t in pmodel.partitioned_tensors()] + [g for _, g in pmodel.flat_groups()]
    for t in holders:  # flat groups hold their members' layouts and defaults
        for buffer_name, buffer in t.named_buffers(recurse=False):
            if buffer_name == "default":
                defaults += _bytes([buffer])
            else:  # layout indices, seeds, moments
                indices += _bytes([buffer])
    plain_total = param_bytes + _optimizer_bytes(plain_opt) + _bytes(plain.buffers())
    partitioned_total = parts + _optimizer_bytes(trainer.optimizer) + _bytes(pmodel.buffers())

    plain_peak = _peak_bytes(plain_step, [plain], plain_opt, device)
    partitioned_peak = max(
        _peak_bytes(partial(trainer.parameter_step, k, batch), [pmodel], trainer.optimizer, device) for k in (1, 3)
    )
    overhead = {
        "trained_parts": parts / param_bytes - 1,  # product/sum tensors keep C copies
        "defaults": defaults / param_bytes,
        "indices_and_seeds": indices / param_bytes,
    }
    return {
        "model": name,
        "scheme": scheme,
        "default": default,
        "assignments": assignments,
        "parameter_bytes": param_bytes,
        "overhead_of_parameter_memory": {**overhead, "total": sum(overhead.values())},
        "state_vs_plain": partitioned_total / plain_total,
        "peak_step_bytes": {"plain": plain_peak, "partitioned": partitioned_peak},
        "peak_vs_plain": partitioned_peak / plain_peak,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="one small model, two variants (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS / "memory.json")
    args = parser.parse_args(argv)
    names = ["fixup_resnet8"] if args.quick else args.models.split(",")
    variants = VARIANTS[:1] + VARIANTS[3:4] if args.quick else VARIANTS
    rows = [measure(n, *v, device=args.device) for n in names for v in variants]
    config = {"batch": BATCH, "image_size": 32}
    result = results(header("memory", quick=args.quick, device=args.device), config, rows)
    print(tables.memory(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
