"""``partition-fx federated``: federated partitioned training (appendix J) and its FedAdam baseline.

Writes to ``--out``: ``report.json`` (``test_accuracy`` and ``hyperparameters`` of the partitioned run,
``rounds``, ``bytes_up``, ``bytes_down`` as counted from the messages that crossed Flower, ``upload_share`` and
``traffic_share`` of the baseline's, ``baseline`` with the same for the unpartitioned model with its
hyperparameters fixed, ``curves`` and ``config``), ``curves.png`` (test accuracy against communicated bytes,
appendix J.3) and ``model.safetensors`` (the exported final model, a plain ``nn.Sequential``). Every option is
checked, the clients planned and Flower imported before ``--out`` is touched.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .._io import replace_file, write_json
from .checks import check_federated_options
from .runs import check_out, prepare_out


def run_federated_command(args: argparse.Namespace) -> dict[str, Any]:
    """The ``federated`` command; returns the report (also written to ``--out/report.json``).

    >>> from partition_fx.cli.parser import build_parser
    >>> run_federated_command(build_parser().parse_args(["federated", "--alpha", "0"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --alpha 0.0: the Dirichlet concentration must be > 0 ...
    """
    proportions = check_federated_options(args)
    check_out(args.out, args.overwrite, {})
    from ..datasets import load_dataset
    from ..federated.flower import import_flower
    from ..federated.job import FederatedPlan, ModelFactory, plan_clients

    import_flower()  # refused now, with the way to install it, if the extra is missing
    data = load_dataset(args.data, size=args.image_size)
    plan = plan_clients(data, args.clients, args.alpha, proportions, args.seed)
    prepare_out(args.out, args.overwrite, {})
    shape, classes = tuple(data.input_shape), data.num_classes
    partitioned = ModelFactory(shape, classes, proportions, args.seed, args.samples)
    baseline = ModelFactory(shape, classes, (1.0,), args.seed, args.samples, learn_hyperparameters=False)
    started = time.perf_counter()
    unpartitioned = FederatedPlan(plan.clients, [1] * len(plan.clients), plan.skew)  # one chunk: plain FedAdam
    results = {
        "partitioned": _train(args, data, plan, partitioned, "partitioned"),
        "baseline": _train(args, data, unpartitioned, baseline, "baseline"),
    }
    report = _report(args, proportions, plan, results, time.perf_counter() - started)
    _write(args.out, report, results["partitioned"].model)
    return report


def _train(args: argparse.Namespace, data: Any, plan: Any, factory: Any, label: str) -> Any:
    """One arm; its progress on stderr as ``train``'s (a bar on a terminal, else a line per evaluated round)
    unless ``--quiet``."""
    from ..federated.job import run_federated

    return run_federated(
        data, plan, factory, rounds=args.rounds, lr=args.lr, batch_size=args.batch_size, server_lr=args.server_lr,
        hyper_lr=args.hyper_lr, evaluate_every=args.evaluate_every, seed=args.seed,
        progress=False if args.quiet else None, label=label,
    )  # fmt: skip


def _report(
    args: argparse.Namespace, proportions: tuple[float, ...], plan: Any, results: dict[str, Any], seconds: float
) -> dict[str, Any]:
    ours, base = results["partitioned"], results["baseline"]
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "command"}
    return {
        "command": "federated",
        "status": "completed",
        "test_accuracy": ours.test_accuracy,
        "hyperparameters": ours.hyperparameters,
        "rounds": args.rounds,
        "bytes_up": ours.bytes_up,
        "bytes_down": ours.bytes_down,
        "upload_share": ours.bytes_up / base.bytes_up,
        "traffic_share": (ours.bytes_up + ours.bytes_down) / (base.bytes_up + base.bytes_down),
        "baseline": {
            "test_accuracy": base.test_accuracy,
            "hyperparameters": base.hyperparameters,
            "bytes_up": base.bytes_up,
            "bytes_down": base.bytes_down,
        },
        "curves": {"partitioned": ours.curve, "baseline": base.curve},
        "clients": {"skew": plan.skew, "sizes": [len(c) for c in plan.clients], "chunks": plan.chunks},
        "proportions": list(proportions),
        "seconds": round(seconds, 1),
        "config": config,
    }


def _write(out: Path, report: dict[str, Any], model: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors.torch import save_model

    figure, axis = plt.subplots(figsize=(6, 4))
    for name, curve in report["curves"].items():
        axis.plot([p["bytes"] / 1e6 for p in curve], [p["test_accuracy"] for p in curve], marker="o", label=name)
    axis.set(xlabel="communicated MB (up + down)", ylabel="test accuracy", title="federated training")
    axis.legend()
    figure.tight_layout()
    replace_file(out / "curves.png", lambda tmp: figure.savefig(tmp, format="png"))
    plt.close(figure)
    replace_file(out / "model.safetensors", lambda tmp: save_model(model, str(tmp)))
    write_json(out / "report.json", report)
