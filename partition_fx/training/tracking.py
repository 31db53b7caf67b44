"""Experiment tracking: a run's configuration and, per evaluation, its LMLs (conditional, full, per chunk), losses,
learning rates and every hyperparameter by name, written to TensorBoard, MLflow or a CSV file, one
:class:`~partition_fx.training.TrainingHook` per backend (``fit(..., hooks=[TensorBoardTracker(dir)])``;
``partition-fx train --log tensorboard,mlflow,csv``).

TensorBoard goes through ``torch.utils.tensorboard`` (the ``tensorboard`` extra), MLflow through its client (the
``mlflow`` extra) to ``MLFLOW_TRACKING_URI`` when it is set, else to a local store. A missing extra is one line
naming the ``pip install`` to run.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..choices import TRACKERS
from ..errors import PartitionArgumentError
from .trainer import FitResult, TrainingHook

if TYPE_CHECKING:
    from .trainer import PartitionedTrainer

_EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
"""Each backend's import and the extra that installs it."""


def require(backend: str) -> None:
    """Refuse, in one line naming the install, a backend whose library is missing."""
    module, extra = _EXTRAS.get(backend, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        raise PartitionArgumentError(
            f"logging to {backend} needs the {module} package: pip install 'partition-fx[{extra}]'"
        )


def evaluation_metrics(
    record: Mapping[str, Any], optimizer: torch.optim.Optimizer, hyper_optimizer: torch.optim.Optimizer | None = None
) -> dict[str, float]:
    """One evaluation's numbers by name: ``conditional_lml``, ``lml``, their per-example values, ``lml_chunk_k``
    (k = 1..C), ``train_loss``, ``hyper_loss``, ``lr`` and ``hyper_lr`` (``optimizer``'s and ``hyper_optimizer``'s
    current rates),
    ``finetuning`` (1 in that phase) and ``hyper/NAME`` for every hyperparameter (``hyper/NAME/i`` for each
    entry of a vector one). What the record leaves out (no LML in fine-tuning) is left out.

    >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    >>> record = {"lml": -3.0, "conditional_lml": -1.0, "lml_per_chunk": [-2.0, -1.0], "phase": "partitioned",
    ...           "train_loss": 0.5, "hyper_loss": None, "hyperparameters": {"mask": [0.5, 1.0]}}
    >>> sorted(evaluation_metrics(record, sgd))  # doctest: +NORMALIZE_WHITESPACE
    ['conditional_lml', 'finetuning', 'hyper/mask/0', 'hyper/mask/1', 'lml', 'lml_chunk_1', 'lml_chunk_2', 'lr',
     'train_loss']
    """
    keys = ("conditional_lml", "lml", "conditional_lml_per_example", "lml_per_example", "train_loss", "hyper_loss")
    metrics = {key: float(record[key]) for key in keys if record.get(key) is not None}
    for k, value in enumerate(record.get("lml_per_chunk") or [], start=1):
        metrics[f"lml_chunk_{k}"] = float(value)
    metrics["lr"] = float(optimizer.param_groups[0]["lr"])
    if hyper_optimizer is not None:
        metrics["hyper_lr"] = float(hyper_optimizer.param_groups[0]["lr"])
    metrics["finetuning"] = float(record.get("phase") == "finetune")
    for name, value in (record.get("hyperparameters") or {}).items():
        if isinstance(value, (list, tuple)):
            metrics.update({f"hyper/{name}/{i}": float(v) for i, v in enumerate(value)})
        else:
            metrics[f"hyper/{name}"] = float(value)
    return metrics


def run_metrics(result: FitResult) -> dict[str, float]:
    """The end of a run: the best and the returned state's LMLs, steps and seconds (what is not None)."""
    values = {
        "final/lml": result.lml,
        "final/conditional_lml": result.conditional_lml,
        "final/best_lml": result.best_lml,
        "final/best_conditional_lml": result.best_conditional_lml,
        "final/best_step": result.best_step,
        "final/seconds": result.seconds,
    }
    return {name: float(value) for name, value in values.items() if value is not None}


def flat_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration as ``{"optimization.lr": "0.001", ...}``: what trackers take as parameters.

    >>> flat_params({"optimization": {"lr": 0.001, "steps": 400}, "seed": None})
    {'optimization.lr': '0.001', 'optimization.steps': '400', 'seed': 'null'}
    """
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value)
    return flat


class Tracker(TrainingHook):
    """A training hook that writes to one tracking backend: the run's configuration (``trainer.config`` and the
    ``params`` it was given, flattened) when the run starts, :func:`evaluation_metrics` at each evaluation's
    step, :func:`run_metrics` at the end. :meth:`log_metrics` logs more (the command logs the exported model's
    test accuracy); :meth:`close` ends the run (a tracker is also a context manager). Only the process that
    writes checkpoints logs (rank 0 under ``torchrun``).

    A backend implements ``_write_params``, ``_write_metrics`` and ``_close``.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        self.params = dict(params or {})
        self.active = True
        self.closed = False

    def before_run(self, trainer: PartitionedTrainer) -> None:
        self.active = trainer.data_parallel is None or trainer.data_parallel.is_writer
        self.log_params({"train": trainer.config.to_dict()})

    def log_params(self, params: Mapping[str, Any] | None = None) -> None:
        """Write the tracker's ``params`` and ``params`` given here, flattened (nothing in a process that does not
        write)."""
        if self.active:
            self._write_params(flat_params({**self.params, **(params or {})}))

    def after_evaluation(self, trainer: PartitionedTrainer, record: dict[str, Any], improved: bool) -> None:
        self.log_metrics(record["step"], evaluation_metrics(record, trainer.optimizer, trainer.hyper_optimizer))

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        self.log_metrics(result.steps, run_metrics(result))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write ``metrics`` at ``step`` (nothing in a process that does not write)."""
        if self.active and metrics:
            self._write_metrics(step, dict(metrics))

    def close(self) -> None:
        """End the run in the backend (flush and close its files); idempotent."""
        if not self.closed:
            self.closed = True
            self._close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_params(self, params: dict[str, str]) -> None:
        raise NotImplementedError

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class CSVTracker(Tracker):
    """``directory/metrics.csv`` (``step,name,value``, a row per number, appended and flushed at each evaluation,
    so a run that fails keeps what it logged) and ``directory/params.csv`` (``name,value``).

    >>> import tempfile
    >>> tracker = CSVTracker(tempfile.mkdtemp())
    >>> tracker.log_metrics(3, {"lml": -2.5})
    >>> tracker.close(); (tracker.directory / "metrics.csv").read_text().splitlines()
    ['step,name,value', '3,lml,-2.5']
    """

    def __init__(self, directory: str | os.PathLike[str], params: Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        self.directory = Path(directory)
        self._file: Any = None

    def _write_params(self, params: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "params.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "value"])
            writer.writerows(sorted(params.items()))

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / "metrics.csv"
            fresh = not path.is_file() or path.stat().st_size == 0
            self._file = open(path, "a", newline="")
            if fresh:
                csv.writer(self._file).writerow(["step", "name", "value"])
        csv.writer(self._file).writerows([step, name, repr(value)] for name, value in metrics.items())
        self._file.flush()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()


class TensorBoardTracker(Tracker):
    """Scalars in a TensorBoard event file under ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``), one
    tag per metric; the configuration as the text ``config`` (a JSON object of the flattened parameters)."""

    def __init__(self, log_dir: str | os.PathLike[str], params: Mapping[str, Any] | None = None) -> None:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        super().__init__(params)
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def _write_params(self, params: dict[str, str]) -> None:
        self.writer.add_text("config", json.dumps(params, indent=1, sort_keys=True), global_step=0)

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def _close(self) -> None:
        self.writer.close()


class MLflowTracker(Tracker):
    """An MLflow run (named ``run_name``, in ``experiment``) with the configuration as its parameters and every
    metric at its step. It goes to ``tracking_uri``, else to ``MLFLOW_TRACKING_URI``, else to the local file
    store ``default_store`` (``./mlruns``): MLflow keeps that store in maintenance mode and asks for an opt-in
    to use it, which is given here, for that default only."""

    def __init__(
        self,
        experiment: str = "partition-fx",
        run_name: str | None = None,
        *,
        tracking_uri: str | None = None,
        default_store: str | os.PathLike[str] = "mlruns",
        params: Mapping[str, Any] | None = None,
    ) -> None:
        require("mlflow")
        from mlflow.tracking import MlflowClient

        super().__init__(params)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = Path(default_store).resolve().as_uri()
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def _write_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        # MLflow caps a parameter's value at 6000 characters; a configuration's values are far shorter
        self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in sorted(params.items())])

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def _close(self) -> None:
        self.client.set_terminated(self.run_id)


def trackers_for(backends: list[str], out: Path, params: Mapping[str, Any] | None = None) -> list[Tracker]:
    """The trackers ``--log`` names, writing under the run directory ``out``: ``out/tensorboard/``,
    ``out/metrics.csv`` and ``out/params.csv``, MLflow to ``MLFLOW_TRACKING_URI`` or ``out/mlruns``; each
    missing extra refused first, before any is built.

    >>> import tempfile
    >>> [type(t).__name__ for t in trackers_for(["csv"], Path(tempfile.mkdtemp()))]
    ['CSVTracker']
    """
    for backend in backends:
        if backend not in TRACKERS:
            raise PartitionArgumentError(f"--log {backend!r}: not a tracker; one of {', '.join(TRACKERS)}")
        require(backend)
    built: list[Tracker] = []
    for backend in backends:
        if backend == "csv":
            built.append(CSVTracker(out, params))
        elif backend == "tensorboard":
            built.append(TensorBoardTracker(out / "tensorboard", params))
        else:
            built.append(MLflowTracker(run_name=out.name, default_store=out / "mlruns", params=params))
    return built
