"""``partition-fx export --run DIR``: a trained run's checkpoint -> a plain safetensors model and ONNX.

The run's model is rebuilt from its configuration (as ``train`` built it): a ``partition-fx train`` run's
``report.json``, or the ``run.json`` that ``fit(..., checkpoint_dir=DIR)`` writes for a run of a model and data
built by name (``training.fit``), with the test split of its data alone (``load_dataset(...,
split="test")``: the model's input shape and classes, and the examples the export is evaluated on). Its
checkpoint is loaded (``training.load_checkpoint``: no trainer is built), and the chosen subnetwork exported to
``--out`` (default ``RUN/export``) with an ``export.json`` summary. The training split is loaded only to
recalibrate BatchNorm statistics where they need it (below). ``export.json`` and the ONNX file's metadata also
record what using the model needs (``job.build.model_record``: class names, preprocessing, architecture, the ONNX input
``images`` and output ``logits``, or ``log_probs`` for the test-time-averaged model), which ``partition-fx predict``
reads. The export of a run of ``--model hf:DIR`` is a ``save_pretrained`` folder too (its ``config.json``, naming
the classes, beside ``model.safetensors``), which ``transformers.AutoModelForImageClassification.from_pretrained``
loads.

BatchNorm running statistics: a finished run's ``last`` and ``best`` checkpoints hold them recalibrated for the
final subnetwork (as the run evaluated them), so their export reproduces the run's ``test_accuracy`` and
``best_test_accuracy``. A checkpoint whose statistics are training's (an interrupted run's) or that exports
another ``--subnetwork`` has them recalibrated for the exported subnetwork over the training data first,
exactly as the end of a run does; ``export.json`` says so (``norm_statistics`` as saved, ``recalibrated_norms``:
how many BatchNorm modules were recalibrated, 0 for none).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from safetensors.torch import save_model

from .. import __version__
from .._io import write_json
from ..errors import PartitionArgumentError, PartitionWarning
from ..export import export_subnetwork
from ..hf_folders import hf_folder
from ..job.build import build_job, load_job_data, model_record, write_onnx
from ..job.records import read_json
from ..models.hf_models import save_hf_folder
from ..training.checkpoint import norm_statistics
from ..training.objective.lml import load_for_export
from ..transforms import TestTimeAveraged
from .commands.export import ExportRequest
from .runs import checkpoint_state, write_run


def run_export(request: ExportRequest) -> dict[str, Any]:
    """The ``export`` command (its ``request``, checked: ``cli.commands.export``); returns the summary it also
    writes to ``out/export.json``.

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> from partition_fx.cli.commands import commands
    >>> commands()["export"].options(build_parser().parse_args(["export", "--run", tempfile.mkdtemp()]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --run '...' is not a training run: it needs report.json and ...
    """
    run, spec, checkpoint, subnetwork = request.run, request.spec, request.checkpoint, request.subnetwork
    with warnings.catch_warnings():  # --checkpoint's report was train's: the run's checkpoint replaces every weight
        warnings.simplefilter("ignore", PartitionWarning)
        job = build_job(spec, split="test")
    pmodel = job.pmodel
    if subnetwork is not None:
        try:
            pmodel.check_subnetwork(subnetwork)
        except PartitionArgumentError as e:
            raise PartitionArgumentError(f"--subnetwork {subnetwork}: {e}") from None
    samples = request.test_time_samples
    if samples and job.hyper is None:
        raise PartitionArgumentError(
            f"--test-time-samples {samples} averages over the run's learned augmentation, and {run} "
            "trained with --augment none; drop --test-time-samples"
        )
    meta, recalibrated = load_for_export(
        pmodel,
        job.hyper,
        lambda: load_job_data(spec, split="train").train,
        checkpoint,
        job.config,
        subnetwork,
    )
    exported = export_subnetwork(pmodel, subnetwork).eval()
    # a fit(checkpoint_dir=...) run has no report.json, so no status: its states are said as a finished run's
    status = read_json(run, "report.json", "--run").get("status") if (run / "report.json").is_file() else None
    hf = hf_folder(spec.model) is not None  # the export is a save_pretrained folder too
    accuracy, loglik = job.test_scores(exported)
    averaged, averaged_loglik = job.averaged_test_scores(exported, samples)
    hyper = job.hyper  # not None when averaged is not
    wrap = None if averaged is None or hyper is None else (lambda model: TestTimeAveraged(model, hyper, samples))
    summary = {
        "command": "export",
        "version": __version__,
        "run": str(run),
        "checkpoint": str(checkpoint),
        "checkpoint_step": meta.get("step"),
        "state": checkpoint_state(request.which, status, meta.get("step"), spec.train.optimization.steps),
        "subnetwork": subnetwork if subnetwork is not None else pmodel.num_partitions,
        "norm_statistics": norm_statistics(meta),
        "recalibrated_norms": recalibrated,
        "test_accuracy": accuracy,
        "test_log_likelihood": loglik,
        "test_time_samples": samples if averaged is not None else 0,
        "averaged_test_accuracy": averaged,
        "averaged_test_log_likelihood": averaged_loglik,
        "files": {"model": "model.safetensors", "onnx": "model.onnx", **({"config": "config.json"} if hf else {})},
        **model_record(job, averaged=averaged is not None, statistics=_recorded_statistics(run)),
    }

    def fill(staging: Path) -> None:
        if hf:
            save_hf_folder(exported, staging, summary["classes"])
        else:
            save_model(exported, str(staging / "model.safetensors"))
        write_onnx(pmodel, staging / "model.onnx", job, summary, subnetwork=subnetwork, wrap=wrap)
        write_json(staging / "export.json", summary)

    write_run(request.out, request.overwrite, {"--run": run}, fill)  # a failed export leaves --out as it was
    return summary


def _recorded_statistics(run: Path) -> dict[str, Any] | None:
    """The statistics of the training images a ``train`` run recorded (None for a Python run, or one an earlier
    version wrote: the export measures its test images instead)."""
    report = read_json(run, "report.json", "--run") if (run / "report.json").is_file() else None
    return report.get("input_statistics") if isinstance(report, dict) else None
