"""Conversion time and step-time overhead of a partitioned model relative to the plain model.

Prints a table and writes ``benchmarks/results/conversion.json``. Step times are ratios measured in
one process, alternating plain and partitioned steps, medians over repeats (the machines are noisy).

    python -m benchmarks.conversion [--models resnet18,resnet50] [--repeats 15] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import timm
import torch

import partition_fx  # noqa: F401  (registers the shipped models)
from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results
from partition_fx import export_subnetwork, partitionify

INPUT = {"fixup_resnet14": 32, "cifar_wrn16_4": 32, "vit_tiny_patch16_224": 224}


def _step(model, x, subnetwork=None) -> None:
    model.zero_grad(set_to_none=True)
    out = model(x) if subnetwork is None else model(x, subnetwork=subnetwork)
    out.float().logsumexp(-1).mean().backward()


def measure(name: str, repeats: int, batch: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10)
    conversions = []
    for _ in range(3):
        start = time.perf_counter()
        pmodel = partitionify(model, 3, (0.8, 0.1, 0.1))
        conversions.append(time.perf_counter() - start)
    size = INPUT.get(name, 64)
    x = torch.randn(batch, 3, size, size)
    plain = export_subnetwork(pmodel).train()
    pmodel.train()
    ratios = {f"step_subnetwork_{k}": [] for k in (1, 3)}
    for _ in range(2):  # warm-up
        _step(plain, x)
        _step(pmodel, x, 3)
    plain_times = []
    for _ in range(repeats):
        for k in (1, 3):
            t0 = time.perf_counter()
            _step(plain, x)
            t1 = time.perf_counter()
            _step(pmodel, x, k)
            t2 = time.perf_counter()
            ratios[f"step_subnetwork_{k}"].append((t2 - t1) / (t1 - t0))
            plain_times.append(t1 - t0)
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "conversion_seconds_median": statistics.median(conversions),
        "input": [batch, 3, size, size],
        "plain_step_seconds_median": statistics.median(plain_times),
        **{key: statistics.median(v) for key, v in ratios.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="fixup_resnet14,cifar_wrn16_4,resnet18,resnet50,vit_tiny_patch16_224")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="one small model, 3 repeats")
    parser.add_argument("--out", type=Path, default=RESULTS / "conversion.json")
    args = parser.parse_args(argv)
    names = ["fixup_resnet14"] if args.quick else args.models.split(",")
    repeats = 3 if args.quick else args.repeats
    rows = [measure(n, repeats, 8 if args.quick else args.batch) for n in names]
    result = results(header("conversion", quick=args.quick), {"repeats": repeats}, rows)
    print(tables.conversion(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
