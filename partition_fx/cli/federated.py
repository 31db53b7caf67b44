"""``partition-fx federated``: federated partitioned training (appendix J) and its FedAdam baseline, both run by
the Flower apps of ``partition_fx.federated.app`` on Flower's simulation engine.

Writes to ``--out``: ``report.json`` (the partitioned run's final ``test_accuracy``, ``test_accuracy_averaged``
over ``--test-samples`` augmentations, the mean of its last 10 evaluations, ``hyperparameters``, ``bytes_up`` /
``bytes_down`` as counted from the messages that crossed Flower, ``upload_share`` and ``traffic_share`` of the
baseline's, ``seconds_per_round``; ``baseline`` with the same for the unpartitioned model with psi fixed;
``curves``, ``clients`` and ``config``), ``history.json`` (each run's ``FederatedRun.history``: every client's
train metrics per round, federated evaluation, failures), ``curves.png`` (test accuracy against rounds and
against communicated bytes, appendix J.3) and ``model.safetensors`` (the exported final model, a plain
``nn.Sequential`` for the default CNN: the partitioned run's, or, when its psi learned nothing (``note``: its
evidence never became informative), the baseline's, as ``model`` says). Every option is checked, the clients
planned and Flower imported before ``--out`` is touched. Unless ``--quiet``, each run's start and its evaluated
rounds are one line each on stderr (:class:`RoundLines`); Flower's own log shows only its warnings and errors
(``federated.flower.flower_logging``: ``FLWR_LOG_LEVEL=INFO`` shows all of it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from .. import __version__
from .._io import write_json
from ..choices import RunStatus
from .commands.federated import FederatedRequest
from .config_files import federated_config_text
from .runs import write_run


def run_federated_command(request: FederatedRequest) -> dict[str, Any] | str:
    """The ``federated`` command (its ``request``, checked: ``cli.commands.federated``); returns the report (also
    written to ``out/report.json``), or, with ``print_config``, the run as the YAML ``--config`` reads.

    >>> from partition_fx.cli.parser import build_parser
    >>> from partition_fx.cli.commands import commands
    >>> commands()["federated"].options(build_parser().parse_args(["federated", "--alpha", "0"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --alpha 0.0: the Dirichlet concentration must be > 0 ...
    """
    config = request.config
    if request.print_config:
        return federated_config_text(config)
    from ..federated.flower import import_flower, run_flower
    from ..federated.job import federated_model, load_federated_data, plan_clients
    from ..training.tracking import require

    import_flower()  # refused now, with the way to install it, if the extra is missing
    for backend in request.log:  # so is a tracker's
        require(backend)
    data = load_federated_data(config)
    plan = plan_clients(data, config.clients, config.alpha, config.proportions, config.seed, config.validation)
    federated_model(config, data)  # a model the federation cannot train (BatchNorm) is refused here
    runs: dict[str, Any] = {}
    for arm, arm_config in (("partitioned", config), ("baseline", config.baseline())):
        runs[arm] = run_flower(arm_config, on_round=None if request.quiet else RoundLines(arm, arm_config))
    report = _report(config, plan, runs)
    write_run(request.out, request.overwrite, {}, lambda staging: _write(staging, report, runs))  # all, or none
    if request.log:
        _log_rounds(list(request.log), request.out, config, runs)
    return report


class RoundLines:
    """The progress of one run (``arm``, ``config``) as ``run_flower``'s ``on_round``: a line on stderr as the
    rounds begin and one per evaluated round (test accuracy, communicated bytes, the learned hyperparameters,
    time since the rounds began).

    >>> from partition_fx.federated.config import FederatedConfig
    >>> lines = RoundLines("partitioned", FederatedConfig(clients=6, rounds=4, evaluate_every=2))
    >>> print(lines.line(0, None, 0.0))
    partition-fx: partitioned run | 6 clients, 4 rounds, test evaluation every 2
    >>> point = {"round": 2, "bytes": 2.5e6, "test-accuracy": 0.5, "test-accuracy-averaged": 0.625,
    ...          "hyperparameters": {"rotation": 1.234}}
    >>> print(lines.line(2, point, 10.0))
    partition-fx: partitioned round 2/4 | test accuracy 0.500 (averaged 0.625) | 2.5 MB up+down | rotation 1.23 | ...
    """

    def __init__(self, arm: str, config: Any) -> None:
        self.arm, self.config = arm, config
        self.started = time.perf_counter()  # reset as the rounds begin

    def line(self, server_round: int, point: dict[str, Any] | None, seconds: float) -> str:
        """The line of ``on_round(server_round, point)``, ``seconds`` after the rounds began."""
        from ..training.loop.progress import clock, compact_hyperparameters

        rounds, every = self.config.rounds, self.config.evaluate_every
        if point is None:
            evaluated = f", test evaluation every {every}" if every < rounds else ""
            clients = f"{self.config.clients} client{'s' if self.config.clients != 1 else ''}"
            return f"partition-fx: {self.arm} run | {clients}, {rounds} round{'s' if rounds != 1 else ''}{evaluated}"
        left = f", ~{clock(seconds / server_round * (rounds - server_round))} left" if server_round < rounds else ""
        learned = self.config.learn_hyperparameters and compact_hyperparameters(point["hyperparameters"])
        parts = [
            f"partition-fx: {self.arm} round {server_round}/{rounds}",
            f"test accuracy {point['test-accuracy']:.3f} (averaged {point['test-accuracy-averaged']:.3f})",
            f"{point['bytes'] / 1e6:.1f} MB up+down",
            *([learned] if learned else []),
            f"{clock(seconds)} elapsed{left}",
        ]
        return " | ".join(parts)

    def __call__(self, server_round: int, point: dict[str, Any] | None) -> None:
        if server_round == 0:
            self.started = time.perf_counter()
        elif point is None:  # a round without a test evaluation
            return
        stream = sys.stderr
        if stream is not None:
            stream.write(self.line(server_round, point, time.perf_counter() - self.started) + "\n")
            stream.flush()


def _log_rounds(backends: list[str], out: Path, config: Any, runs: dict[str, Any]) -> None:
    """Each evaluated round of both runs (``partitioned/...``, ``baseline/...``) to the trackers ``--log``
    names, in ``out`` once the run's files are written; the configuration as their parameters."""
    from ..training.tracking import trackers_for

    for tracker in trackers_for(backends, out, {"federated": config.to_dict()}):
        with tracker:
            tracker.log_params()
            for arm, run in runs.items():
                for point in run.curve:
                    metrics = {
                        f"{arm}/test_accuracy": point["test-accuracy"],
                        f"{arm}/test_accuracy_averaged": point["test-accuracy-averaged"],
                        f"{arm}/test_nll": point["test-nll"],
                        f"{arm}/bytes": float(point["bytes"]),
                    }
                    metrics.update({f"{arm}/hyper/{k}": v for k, v in point["hyperparameters"].items()})
                    tracker.log_metrics(point["round"], metrics)


def _summary(run: Any) -> dict[str, Any]:
    from ..federated.job import hyperparameters, mean_of_last

    return {
        "test_accuracy": run.curve[-1]["test-accuracy"],
        "test_accuracy_averaged": run.curve[-1]["test-accuracy-averaged"],
        "mean_last_accuracy": mean_of_last(run.curve, "test-accuracy"),
        "mean_last_accuracy_averaged": mean_of_last(run.curve, "test-accuracy-averaged"),
        "hyperparameters": hyperparameters(run.model),
        "bytes_up": run.bytes_up,
        "bytes_down": run.bytes_down,
        "seconds_per_round": round(run.seconds / run.config.rounds, 3),
    }


def _report(config: Any, plan: Any, runs: dict[str, Any]) -> dict[str, Any]:
    from ..federated.job import LAST_EVALUATIONS

    ours, base = runs["partitioned"], runs["baseline"]
    note = ours.warmup.get("note")
    return {
        "command": "federated",
        "version": __version__,
        "status": RunStatus.COMPLETED.value,
        # A run whose psi learned nothing hands back what it reduces to, trained as that is trained: the baseline.
        "model": "baseline" if note else "partitioned",
        "note": note,
        "psi_started_at": ours.warmup.get("started_at"),
        **_summary(ours),
        "last_evaluations": min(LAST_EVALUATIONS, len(ours.curve)),
        "rounds": config.rounds,
        "upload_share": ours.bytes_up / base.bytes_up,
        "traffic_share": (ours.bytes_up + ours.bytes_down) / (base.bytes_up + base.bytes_down),
        "baseline": _summary(base),
        "curves": {name: run.curve for name, run in runs.items()},
        "clients": {"skew": plan.skew, "sizes": [len(c) for c in plan.clients], "chunks": plan.chunks},
        "proportions": list(config.proportions),
        "config": {"clients": config.clients, **config.run_config(), "hyper-lr": config.hyper_lr_value},
    }


def _write(out: Path, report: dict[str, Any], runs: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors.torch import save_model

    from ..export import export_subnetwork

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, curve in report["curves"].items():
        accuracy = [p["test-accuracy-averaged"] for p in curve]
        axes[0].plot([p["round"] for p in curve], accuracy, marker="o", label=name)
        axes[1].plot([p["bytes"] / 1e6 for p in curve], accuracy, marker="o", label=name)
    axes[0].set(xlabel="round", ylabel="test accuracy (augmentation-averaged)", title="federated training")
    axes[1].set(xlabel="communicated MB (up + down)")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out / "curves.png", format="png")
    plt.close(figure)
    model = export_subnetwork(runs[report["model"]].model.pmodel).eval()
    save_model(model, str(out / "model.safetensors"))
    write_json(out / "history.json", {name: run.history() for name, run in runs.items()})
    write_json(out / "report.json", report)
