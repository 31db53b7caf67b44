"""``partition-fx export --run DIR``: a trained run's checkpoint -> a plain safetensors model and ONNX.

The run's model is rebuilt from its report's configuration (as ``train`` built it), its checkpoint loaded,
and the chosen subnetwork exported to ``--out`` (default ``RUN/export``) with an ``export.json`` summary.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

from safetensors.torch import save_model

from .._io import replace_file, write_json
from ..errors import PartitionArgumentError, PartitionWarning
from ..export import export_onnx, export_subnetwork
from ..training import PartitionedTrainer, evaluate_classifier
from .checks import check_export
from .job import job_from_args
from .runs import prepare_out


def run_export(args: argparse.Namespace) -> dict[str, Any]:
    """The ``export`` command; returns the summary it also writes to ``--out/export.json``.

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> run_export(build_parser().parse_args(["export", "--run", tempfile.mkdtemp()]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: '...' is not a training run: it needs report.json and ...
    """
    run: Path = args.run
    checkpoint = run / "checkpoint" / f"{args.which}.safetensors"
    config = check_export(args)["config"]
    out: Path = args.out if args.out is not None else run / "export"
    with warnings.catch_warnings():  # --checkpoint's report was train's: the run's checkpoint replaces every weight
        warnings.simplefilter("ignore", PartitionWarning)
        job = job_from_args(argparse.Namespace(**config))
    pmodel = job.pmodel
    if args.subnetwork is not None:
        try:
            pmodel.check_subnetwork(args.subnetwork)
        except PartitionArgumentError as e:
            raise PartitionArgumentError(f"--subnetwork {args.subnetwork}: {e}") from None
    trainer = PartitionedTrainer(pmodel, job.data.train, hyper=job.hyper, device="cpu")
    meta = trainer.load_checkpoint(checkpoint)
    prepare_out(out, args.overwrite, {"--run": run})
    exported = export_subnetwork(pmodel, args.subnetwork).eval()
    x_test, y_test = job.data.test.tensors
    accuracy, loglik = evaluate_classifier(exported, x_test, y_test)
    replace_file(out / "model.safetensors", lambda tmp: save_model(exported, str(tmp)))
    export_onnx(pmodel, out / "model.onnx", (x_test[:4],), subnetwork=args.subnetwork)
    summary = {
        "command": "export",
        "run": str(run),
        "checkpoint": str(checkpoint),
        "checkpoint_step": meta.get("step"),
        "subnetwork": args.subnetwork if args.subnetwork is not None else pmodel.num_partitions,
        "test_accuracy": accuracy,
        "test_log_likelihood": loglik,
        "files": {"model": "model.safetensors", "onnx": "model.onnx"},
    }
    write_json(out / "export.json", summary)
    return summary
