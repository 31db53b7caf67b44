"""Experiment tracking: a run's configuration and, per evaluation, its LMLs (conditional, full, per chunk), losses,
learning rates and every hyperparameter by name, written to TensorBoard, MLflow or a CSV file, one
:class:`~partition_fx.training.TrainingHook` per backend (``fit(..., hooks=[TensorBoardTracker(dir)])``;
``partition-fx train --log tensorboard,mlflow,csv``).

TensorBoard goes through ``torch.utils.tensorboard`` (the ``tensorboard`` extra), MLflow through its client (the
``mlflow`` extra) to ``MLFLOW_TRACKING_URI`` when it is set, else to a SQLite database (MLflow's recommended local
store). A missing extra, or a tracking store MLflow cannot open, is one line naming the fix.

A tracker opens when its run starts. A run resumed from its last checkpoint continues what its trackers logged: a
tracker drops what it logged after that checkpoint (CSV rows, TensorBoard events: the iterations are trained
again), and MLflow continues the same MLflow run (its id is the hook's state, saved with the checkpoint).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import replace_file
from ..choices import TRACKER_FILES, TRACKERS, Phase, RunStatus
from ..errors import PartitionArgumentError, PartitionError, first_line
from ..extras import require as require_extra
from .loop.hooks import TrainingHook
from .objective.lml import EvaluationRecord

if TYPE_CHECKING:
    from .loop.trainer import FitResult, PartitionedTrainer

_MODULES = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic")}
"""What each backend imports (MLflow's local store is a SQLite database, through SQLAlchemy and Alembic)."""
MLFLOW_DATABASE = TRACKER_FILES["mlflow"][0]
"""The SQLite file of MLflow's local store, under the run directory (``partition-fx train --log mlflow``)."""


def require(backend: str) -> None:
    """Refuse, in one line naming the install, a backend whose library is missing."""
    require_extra(f"logging to {backend}", *_MODULES.get(backend, ()))


def check_trackers(backends: list[str] | tuple[str, ...]) -> None:
    """Everything that can stop the trackers ``backends`` from starting, checked before a run writes anything: an
    unknown name, a missing extra, and a tracking store MLflow cannot open (``MLFLOW_TRACKING_URI``: a file store
    MLflow refuses, a server that does not answer), each refused in one line.

    >>> check_trackers(["csv"])
    >>> check_trackers(["wandb"])
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --log 'wandb': not a tracker; one of tensorboard, mlflow, csv
    """
    for backend in backends:
        if backend not in TRACKERS:
            raise PartitionArgumentError(f"--log {backend!r}: not a tracker; one of {', '.join(TRACKERS)}")
        require(backend)
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if "mlflow" in backends and uri:
        with _mlflow_errors(uri), _environment(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10"):
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``values`` set in the environment for a moment (MLflow reads its request retries from there), then put back."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _mlflow_errors(uri: str, opening: bool = True) -> Iterator[None]:
    """MLflow's failures as one line naming the store ``uri``: one it cannot open (``opening``; named as
    ``MLFLOW_TRACKING_URI`` when that is where it comes from), or a write it refuses."""
    try:
        yield
    except PartitionError:
        raise
    except Exception as e:  # MlflowException, and what the store's drivers raise
        if not opening:
            raise PartitionError(f"--log mlflow: MLflow refused to log to {uri!r}: {first_line(e)}") from None
        source = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") == uri else "the tracking URI"
        raise PartitionError(
            f"--log mlflow: MLflow cannot use {source} {uri!r}: {first_line(e)}; set it to a store MLflow accepts "
            f"(e.g. sqlite:///mlflow.db, or a server's http:// address), or unset it to log to --out/{MLFLOW_DATABASE}"
        ) from None


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
    metrics["finetuning"] = float(record.get("phase") == Phase.FINETUNE)
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
    test accuracy); :meth:`close` ends the run (a tracker is also a context manager, which ends it as failed or
    interrupted when its block raised). Only the process that writes checkpoints logs (rank 0 under ``torchrun``).

    The backend opens when the run starts (or at the first thing logged outside a run). A trainer resumed at step
    N (``fit(resume=...)``) opens its trackers at N: each drops what it logged after N, which the resumed run logs
    again, and keeps its own state in the resume directory (:meth:`state_dict`).

    A backend implements ``_open``, ``_write_params``, ``_write_metrics`` and ``_close``.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        self.params = dict(params or {})
        self.active = True
        self.opened = False
        self.closed = False

    def before_run(self, trainer: PartitionedTrainer) -> None:
        self.active = trainer.data_parallel is None or trainer.data_parallel.is_writer
        if self.active and not self.opened:
            self.opened = True
            self._open(resumed_at=trainer.step)  # 0 for a new run
        self.log_params({"train": trainer.config.to_dict()})

    def log_params(self, params: Mapping[str, Any] | None = None) -> None:
        """Write the tracker's ``params`` and ``params`` given here, flattened (nothing in a process that does not
        write)."""
        if self.active:
            self._ensure_open()
            self._write_params(flat_params({**self.params, **(params or {})}))

    def after_evaluation(self, trainer: PartitionedTrainer, record: EvaluationRecord, improved: bool) -> None:
        stepper = trainer.steps.stepper
        self.log_metrics(record["step"], evaluation_metrics(record, stepper.optimizer, stepper.hyper_optimizer))

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        self.log_metrics(result.steps, run_metrics(result))

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write ``metrics`` at ``step`` (nothing in a process that does not write)."""
        if self.active and metrics:
            self._ensure_open()
            self._write_metrics(step, dict(metrics))

    def close(self, ending: RunStatus | str = RunStatus.COMPLETED) -> None:
        """End the run in the backend (flush and close its files; MLflow: the run's status from ``ending``, how the
        run ended: completed, interrupted or failed); idempotent."""
        ended = (RunStatus.COMPLETED, RunStatus.INTERRUPTED, RunStatus.FAILED)
        if ending not in ended:
            raise PartitionArgumentError(f"ending {ending!r}: one of {', '.join(e.value for e in ended)}")
        ending = RunStatus(ending)
        if not self.closed:
            self.closed = True
            if self.opened:
                self._close(ending)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        self.close(RunStatus.of(error))

    def _ensure_open(self) -> None:
        if not self.opened:  # logged outside a run: a new one
            self.opened = True
            self._open(resumed_at=0)

    def _open(self, resumed_at: int) -> None:
        pass

    def _write_params(self, params: dict[str, str]) -> None:
        raise NotImplementedError

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def _close(self, ending: RunStatus) -> None:
        pass


class CSVTracker(Tracker):
    """``directory/metrics.csv`` (``step,name,value``, a row per number, appended and flushed at each evaluation,
    so a run that fails keeps what it logged) and ``directory/params.csv`` (``name,value``). Resumed at step N, the
    rows of later steps are dropped first (the resumed run logs them again).

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

    @property
    def path(self) -> Path:
        """The metrics file."""
        return self.directory / "metrics.csv"

    def _open(self, resumed_at: int) -> None:
        if resumed_at and self.path.is_file():
            with open(self.path, newline="") as f:
                rows = list(csv.reader(f))
            kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) <= resumed_at]

            def write(tmp: Path) -> None:
                with open(tmp, "w", newline="") as f:
                    csv.writer(f).writerows(kept)

            replace_file(self.path, write)

    def _write_params(self, params: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "params.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "value"])
            writer.writerows(sorted(params.items()))

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.is_file() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="")
            if fresh:
                csv.writer(self._file).writerow(["step", "name", "value"])
        csv.writer(self._file).writerows([step, name, repr(value)] for name, value in metrics.items())
        self._file.flush()

    def _close(self, ending: RunStatus) -> None:
        if self._file is not None:
            self._file.close()


class TensorBoardTracker(Tracker):
    """Scalars in a TensorBoard event file under ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``), one
    tag per metric; the configuration as the text ``config`` (a JSON object of the flattened parameters). Resumed
    at step N, the writer purges the events of later steps (``purge_step``)."""

    def __init__(self, log_dir: str | os.PathLike[str], params: Mapping[str, Any] | None = None) -> None:
        require("tensorboard")
        super().__init__(params)
        self.log_dir = Path(log_dir)
        self.writer: Any = None

    def _open(self, resumed_at: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=resumed_at + 1 if resumed_at else None)

    def _write_params(self, params: dict[str, str]) -> None:
        self.writer.add_text("config", json.dumps(params, indent=1, sort_keys=True), global_step=0)

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def _close(self, ending: RunStatus) -> None:
        self.writer.close()


class MLflowTracker(Tracker):
    """An MLflow run (named ``run_name``, in ``experiment``) with the configuration as its parameters and every
    metric at its step; its status at the end says how the run ended (FINISHED, KILLED when interrupted, FAILED).
    It goes to ``tracking_uri``, else to ``MLFLOW_TRACKING_URI``, else to the SQLite database ``database``
    (``mlflow.db``; MLflow's recommended local store, its artifacts in ``mlartifacts/`` beside it). A store MLflow
    cannot open is refused in one line.

    Read a run back with MLflow's client: ``MlflowClient("sqlite:///runs/train/mlflow.db").search_runs(...)``, or
    browse it with ``mlflow ui --backend-store-uri sqlite:///runs/train/mlflow.db`` (the full ``mlflow`` package).
    A resumed run (``fit(resume=...)``) continues the same MLflow run: its id is this hook's state."""

    def __init__(
        self,
        experiment: str = "partition-fx",
        run_name: str | None = None,
        *,
        tracking_uri: str | None = None,
        database: str | os.PathLike[str] = MLFLOW_DATABASE,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        require("mlflow")
        super().__init__(params)
        self.experiment, self.run_name = experiment, run_name
        self.database = Path(database).resolve()
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.database}"
        self.run_id: str | None = None
        self.client: Any = None

    @property
    def local(self) -> bool:
        """Whether the run goes to the local database (not to ``tracking_uri`` or ``MLFLOW_TRACKING_URI``)."""
        return self.tracking_uri == f"sqlite:///{self.database}"

    def state_dict(self) -> dict[str, Any]:
        # the local database by its place now, so that a run directory moved before it is resumed still finds it
        uri = None if self.local else self.tracking_uri
        return {} if self.run_id is None else {"run_id": self.run_id, "tracking_uri": uri}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state["run_id"]  # the run being resumed, in the store that holds it
        self.tracking_uri = state["tracking_uri"] or f"sqlite:///{self.database}"

    def _open(self, resumed_at: int) -> None:
        from mlflow.tracking import MlflowClient

        with _mlflow_errors(self.tracking_uri), _quiet_database_setup():
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            if self.run_id is not None:  # resumed: the same MLflow run goes on
                self.client.update_run(self.run_id, status="RUNNING")
                return
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                experiment_id = found.experiment_id
            else:
                artifacts = (self.database.parent / "mlartifacts").as_uri() if self.local else None
                experiment_id = self.client.create_experiment(self.experiment, artifact_location=artifacts)
            self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id

    def _write_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        # MLflow caps a parameter's value at 6000 characters; a configuration's values are far shorter
        with _mlflow_errors(self.tracking_uri, opening=False):
            self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in sorted(params.items())])

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with _mlflow_errors(self.tracking_uri, opening=False):
            self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def _close(self, ending: RunStatus) -> None:
        status = {RunStatus.COMPLETED: "FINISHED", RunStatus.INTERRUPTED: "KILLED", RunStatus.FAILED: "FAILED"}[ending]
        with _mlflow_errors(self.tracking_uri, opening=False):
            self.client.set_terminated(self.run_id, status=status)


@contextlib.contextmanager
def _quiet_database_setup() -> Iterator[None]:
    """MLflow's and Alembic's INFO lines while a new SQLite store creates its tables, held back."""
    loggers = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def tracker_files(backends: list[str] | tuple[str, ...], out: Path) -> list[str]:
    """What the trackers ``backends`` wrote under the run directory ``out`` (MLflow's database only where it went
    there: ``MLFLOW_TRACKING_URI`` unset), a directory with a trailing ``/``.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> CSVTracker(out).log_metrics(1, {"lml": -1.0})
    >>> tracker_files(["csv", "tensorboard"], out)
    ['metrics.csv']
    """
    names = [name for backend in backends for name in TRACKER_FILES[backend]]
    return [name for name in names if (out / name.rstrip("/")).exists()]


def trackers_for(backends: list[str], out: Path, params: Mapping[str, Any] | None = None) -> list[Tracker]:
    """The trackers ``--log`` names, writing under the run directory ``out``: ``out/tensorboard/``,
    ``out/metrics.csv`` and ``out/params.csv``, MLflow to ``MLFLOW_TRACKING_URI`` or ``out/mlflow.db``; each
    checked first (:func:`check_trackers`), before any is built.

    >>> import tempfile
    >>> [type(t).__name__ for t in trackers_for(["csv"], Path(tempfile.mkdtemp()))]
    ['CSVTracker']
    """
    check_trackers(backends)
    built: list[Tracker] = []
    for backend in backends:
        if backend == "csv":
            built.append(CSVTracker(out, params))
        elif backend == "tensorboard":
            built.append(TensorBoardTracker(out / "tensorboard", params))
        else:
            built.append(MLflowTracker(run_name=out.name, database=out / MLFLOW_DATABASE, params=params))
    return built
