"""Step time of partitioned training relative to a plain training step, per scheme and default mode.

For each model, scheme (random, node) and default mode (init and zero with stored layout indices; seed:
seed-regenerated defaults and, for random-weight tensors, regenerated layout indices), the trainer's steps
are timed against a plain step (forward, backward, Adam step of the exported model) on the same examples:

* parameter step (subnetwork C, the most expensive) vs a plain step on the same batch;
* hyperparameter step (an ``InputMask`` over the input, subnetwork C-1) vs a plain step on the same batch;
* paper iteration (parameter step + hyperparameter step) vs two plain steps;
* fused iteration (both in one forward/backward) vs one plain step on the two batches together; where the
  model runs per-example subnetworks in one pass (node partitioning, ``partition_fx.one_pass``) it is also
  timed with the grouped forward.

Variants are timed in turn (round robin) in one process and the ratio of medians over repeats is
reported, with the device, because these machines are noisy. Prints a table and writes
``benchmarks/results/step_time.json`` (``step_time_<device>.json`` on CUDA).

Operator counts (``--operators``): the aten operators one step dispatches (forward, backward and optimiser
step; nested calls included), counted with the torch profiler on CPU. They do not depend on the machine's
noise, so they are the figure to watch without a GPU: a host-bound GPU step costs about one kernel launch
per operator. ``--operators`` counts without timing and writes ``benchmarks/results/operator_counts.json``.

    python -m benchmarks.step_time [--models resnet18,fixup_resnet14] [--repeats 9] [--device cuda] [--quick]
        [--precision bf16|fp16] [--compile default|reduce-overhead]
    python -m benchmarks.step_time --operators [--models ...]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import timm
import torch

import partition_fx  # noqa: F401  (registers the shipped models)
from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results
from partition_fx import export_subnetwork, partitionify
from partition_fx.training import PartitionedTrainer
from partition_fx.training.step.stepping import Precision
from partition_fx.transforms import InputMask

MODELS = {
    "resnet18": dict(),
    "fixup_resnet14": dict(),
    "cifar_wrn16_4": dict(),
    "vit_tiny_patch16_224": dict(img_size=32, patch_size=4),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _plain_step(model, optimizer, x, y, precision: Precision) -> None:
    """A plain training step in ``precision``, as the trainer takes one (autocast; a GradScaler for fp16)."""
    optimizer.zero_grad(set_to_none=True)
    with precision.autocast():
        loss = torch.nn.functional.cross_entropy(model(x), y)
    precision.backward(loss, list(model.parameters()))
    precision.unscale([optimizer])
    precision.step(optimizer, scaled=True)
    precision.update(scaled=True)


def count_operators(fn: Callable[[], object], warmup: int = 2) -> dict[str, int]:
    """The aten operators one call of ``fn`` dispatches on CPU, by name (nested calls included), after
    ``warmup`` calls (optimisers create their state on the first step).

    >>> counts = count_operators(lambda: torch.ones(2).add(1))
    >>> counts["aten::add"], sum(counts.values()) >= 2
    (1, True)
    """
    for _ in range(warmup):
        fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    counts = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return dict(sorted(counts.items()))


def _grouped(pmodel, fn: Callable[[], None]) -> None:
    pmodel.per_example = "grouped"
    try:
        fn()
    finally:
        pmodel.per_example = "auto"


def _setup(
    name: str, scheme: str, default: str, batch: int, device: torch.device, precision: str = "fp32", compile: str = ""
):
    """The partitioned model and every step to measure, each a no-argument callable ("plain": the exported
    model's step on the same batch; "plain_double": on twice the batch), in ``precision`` and, with a
    ``compile`` mode, compiled (the plain model too)."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **MODELS.get(name, {}))
    assignments = "regenerated" if default == "seed" else "stored"
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), scheme=scheme, default=default, assignments=assignments)
    n = batch * 8
    x = torch.randn(n, 3, 32, 32)
    y = torch.randint(0, 10, (n,))
    adam = partial(torch.optim.Adam, lr=1e-4)
    plain = export_subnetwork(pmodel).to(device).train()  # before compiling: the export reads the graph
    trainer = PartitionedTrainer(
        pmodel, (x, y), hyper=InputMask((3, 32, 32)), batch_size=batch, optimizer=adam, hyper_optimizer=adam,
        device=device, precision=precision, compile=compile or False,
    )  # fmt: skip
    fused = PartitionedTrainer(
        pmodel, (x, y), hyper=trainer.steps.hyper, batch_size=batch, optimizer=adam, hyper_optimizer=adam,
        device=device, fused=True, precision=precision,
    )  # fmt: skip
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-4)
    if compile:
        plain.compile(mode=compile)
    plain_precision = Precision(precision, device)
    xb, yb = x[:batch].to(device), y[:batch].to(device)
    x2, y2 = x[: 2 * batch].to(device), y[: 2 * batch].to(device)
    indices = torch.arange(batch)
    variants: dict[str, Callable[[], None]] = {
        "plain": lambda: _plain_step(plain, plain_opt, xb, yb, plain_precision),
        "plain_double": lambda: _plain_step(plain, plain_opt, x2, y2, plain_precision),
        "parameter_step": lambda: trainer.parameter_step(3, indices),
        "hyper_step": lambda: trainer.hyper_step(3, indices),
        "paper_iteration": lambda: (trainer.parameter_step(3, indices), trainer.hyper_step(3, indices)),
        "fused_iteration": fused.fused_iteration,
    }
    if pmodel.supports_one_pass():  # the fused iteration runs in one pass: time the grouped forward too
        variants["fused_iteration_grouped"] = partial(_grouped, pmodel, fused.fused_iteration)
    return pmodel, assignments, variants


def measure(
    name: str, scheme: str, default: str, batch: int, repeats: int, device: torch.device, precision: str, compile: str
) -> dict:
    _, assignments, variants = _setup(name, scheme, default, batch, device, precision, compile)
    times: dict[str, list[float]] = {key: [] for key in variants}
    # Warm-up. Compiled, every (subnetwork, gradient partition) the random draws of k reach compiles once
    # first: the fused iteration draws k for its hyperparameter batch.
    for _ in range(30 if compile else 2):
        for fn in variants.values():
            fn()
    for _ in range(repeats):
        for key, fn in variants.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[key].append(time.perf_counter() - start)
    med = {key: statistics.median(v) for key, v in times.items()}
    return {
        "model": name,
        "scheme": scheme,
        "default": default,
        "assignments": assignments,
        "batch": batch,
        "precision": precision,
        "compile": compile or None,
        "plain_step_seconds": med["plain"],
        "parameter_step": med["parameter_step"] / med["plain"],
        "hyper_step": med["hyper_step"] / med["plain"],
        "paper_iteration_vs_two_plain": med["paper_iteration"] / (2 * med["plain"]),
        "fused_iteration_vs_plain_double_batch": med["fused_iteration"] / med["plain_double"],
        "fused_one_pass": "fused_iteration_grouped" in med,
        "fused_grouped_vs_plain_double_batch": (
            med["fused_iteration_grouped"] / med["plain_double"] if "fused_iteration_grouped" in med else None
        ),
    }


OPERATOR_STEPS = ("plain", "parameter_step", "hyper_step", "fused_iteration", "plain_double")


def count(name: str, scheme: str, default: str, batch: int) -> dict:
    """Aten operators per step on CPU: plain, parameter, hyper and fused steps, and the excess per partitioned
    tensor (what grows with the model's number of tensors)."""
    torch.set_num_threads(1)  # the count does not depend on threads; one keeps intra-op dispatch simple
    pmodel, assignments, variants = _setup(name, scheme, default, batch, torch.device("cpu"))
    counts = {key: count_operators(variants[key]) for key in OPERATOR_STEPS}
    totals = {key: sum(c.values()) for key, c in counts.items()}
    tensors = sum(1 for _ in pmodel.partitioned_tensors())
    plain = totals["plain"]
    excess = {op: n - counts["plain"].get(op, 0) for op, n in counts["parameter_step"].items()}
    return {
        "model": name,
        "scheme": scheme,
        "default": default,
        "assignments": assignments,
        "partitioned_tensors": tensors,
        "operators": totals,
        "parameter_step": totals["parameter_step"] / plain,
        "hyper_step": totals["hyper_step"] / plain,
        "fused_iteration_vs_plain_double_batch": totals["fused_iteration"] / totals["plain_double"],
        "parameter_step_excess_per_tensor": (totals["parameter_step"] - plain) / tensors,
        "parameter_step_top_excess": dict(sorted(excess.items(), key=lambda kv: -kv[1])[:8]),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--schemes", default="random,node")
    parser.add_argument("--defaults", default="init,zero,seed", help="seed: with regenerated layout indices")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="one small model, 2 repeats (a smoke run)")
    parser.add_argument("--operators", action="store_true", help="count aten operators per step on CPU, no timing")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"), help="autocast dtype")
    parser.add_argument(
        "--compile", default="", metavar="MODE", help="torch.compile mode, both models (default: eager)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    names = ["fixup_resnet14"] if args.quick else args.models.split(",")
    schemes, defaults = args.schemes.split(","), args.defaults.split(",")
    repeats, batch = (2, 8) if args.quick else (args.repeats, args.batch)
    combos = [(n, s, d) for n in names for s in schemes for d in defaults]
    if args.operators:
        rows = [count(n, s, d, batch) for n, s, d in combos]
        result = results(header("operator_counts", quick=args.quick), {"batch": batch}, rows)
        print(tables.operator_counts(result))
        if not args.quick:
            write_results(args.out or RESULTS / "operator_counts.json", result)
        return result
    rows = [measure(n, s, d, batch, repeats, device, args.precision, args.compile) for n, s, d in combos]
    result = results(header("step_time", quick=args.quick, device=args.device), {"repeats": repeats}, rows)
    print(tables.step_time(result))
    if not args.quick:
        suffix = "" if device.type == "cpu" else "_cuda"
        suffix += "" if args.precision == "fp32" else f"_{args.precision}"
        suffix += f"_compiled_{args.compile}" if args.compile else ""
        write_results(args.out or RESULTS / f"step_time{suffix}.json", result)
    return result


if __name__ == "__main__":
    main()
