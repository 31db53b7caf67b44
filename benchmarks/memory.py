"""Memory of partitioned training relative to plain training: parameters, optimiser state and the
partitioning's own storage (defaults, assignment indices), in bytes of tensors.

On CPU this counts tensor bytes (activations are not counted); on CUDA it also reports
``torch.cuda.max_memory_allocated`` over one training step of each. Prints a table and writes
``benchmarks/results/memory.json``.

    python benchmarks/memory.py [--models resnet18,fixup_resnet14] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import timm
import torch

import partition_fx  # noqa: F401  (registers the shipped models)
from partition_fx import export_subnetwork, partitionify
from partition_fx.params import RandomPartitionedTensor
from partition_fx.training import PartitionedTrainer

MODELS = {
    "resnet18": {},
    "fixup_resnet14": {},
    "cifar_wrn16_4": {},
    "vit_tiny_patch16_224": dict(img_size=32, patch_size=4),
}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def measure(name: str, scheme: str, default: str) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **MODELS.get(name, {}))
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), scheme=scheme, default=default)
    x, y = torch.randn(24, 3, 32, 32), torch.randint(0, 10, (24,))
    trainer = PartitionedTrainer(pmodel, (x, y), batch_size=8, optimizer=partial(torch.optim.Adam, lr=1e-4))
    for k in (1, 2, 3):  # every partition stepped once: its Adam state exists
        trainer.parameter_step(k, torch.arange(8))
    plain = export_subnetwork(pmodel).train()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-4)
    torch.nn.functional.cross_entropy(plain(x[:8]), y[:8]).backward()
    plain_opt.step()
    param_bytes = _bytes(plain.parameters())
    parts = _bytes(p for p in pmodel.parameters())
    defaults = _bytes(t.default for _, t in pmodel.partitioned_tensors() if getattr(t, "default", None) is not None)
    indices = _bytes(t.index for _, t in pmodel.partitioned_tensors() if isinstance(t, RandomPartitionedTensor))
    plain_total = param_bytes + _optimizer_bytes(plain_opt) + _bytes(plain.buffers())
    partitioned_total = parts + _optimizer_bytes(trainer.optimizer) + _bytes(pmodel.buffers())
    return {
        "model": name,
        "scheme": scheme,
        "default": default,
        "parameter_bytes": param_bytes,
        "overhead_of_parameter_memory": {
            "trained_parts": parts / param_bytes - 1,  # product/sum tensors keep C copies
            "defaults": defaults / param_bytes,
            "assignment_indices": indices / param_bytes,
        },
        "total_vs_plain": partitioned_total / plain_total,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "memory.json")
    args = parser.parse_args(argv)
    names = ["fixup_resnet14"] if args.quick else args.models.split(",")
    rows = [measure(n, s, d) for n in names for s in ("random", "node") for d in ("init", "zero")]
    header = "| model | scheme | default | parts (+%) | defaults (+%) | indices (+%) | params+Adam+buffers vs plain |"
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        o = r["overhead_of_parameter_memory"]
        lines.append(
            f"| {r['model']} | {r['scheme']} | {r['default']} | {100 * o['trained_parts']:.2f} | "
            f"{100 * o['defaults']:.1f} | {100 * o['assignment_indices']:.1f} | x{r['total_vs_plain']:.3f} |"
        )
    table = "\n".join(lines)
    print(table)
    result = {
        "benchmark": "memory",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": f"cpu ({platform.processor() or platform.machine()}): tensor bytes, activations not counted",
        "torch": torch.__version__,
        "rows": rows,
        "table": table,
    }
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
