"""The ``partition-fx`` command.

``partition-fx train`` (the main job; see ``partition_fx.cli.train``) trains a model with learned
hyperparameters. With no other arguments it learns affine augmentation for timm's ResNet-10-T on ``rotdigits``
(scikit-learn's digits, each rotated by a fixed random angle), a job sized to train on a CPU of 2 cores (how
long it takes: docs/benchmarks.md), on CUDA when available (``--device auto``).

``partition-fx export --run DIR`` exports a trained run's checkpoint to safetensors and ONNX;
``partition-fx predict --run DIR IMAGE...`` (or ``--model FILE.onnx``) classifies images by name with the model.

``partition-fx convert`` converts a timm model, verifies every subnetwork on digits and exports it;
``partition-fx describe --model NAME`` prints how a model would be partitioned.

One module per purpose: ``parser`` (every command's options, help and defaults; the training options generated
from ``JobSpec`` and ``TrainConfig``, the federated ones from ``FederatedConfig``), ``argparsing`` (the parsing
machinery: the parser class, option types, options generated from a ``Settings`` declaration), ``checks`` (every
torch-free check), ``dispatch`` (the entry point, one-line errors), ``job`` (a train job before training: its spec
checked, data, model, conversion), ``runs`` (run directories, reports, a run's ``JobSpec`` from the options and
from its report, ``--resume``), ``train``, ``export``, ``predict``, ``convert`` (and describe), ``federated`` and
``plots``.

Importing this package imports neither torch nor the commands (``partition-fx --help`` answers at once);
``TrainJob`` and ``train_job`` are loaded on first use.

For scripts and benchmarks that train exactly what the command trains::

    job = train_job(["--steps", "100"])          # TrainJob(spec, data, model, pmodel, hyper, device)
    fit(job.pmodel, job.data.train, job.config, hyper=job.hyper, device=job.device)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dispatch import main
from .parser import build_parser

if TYPE_CHECKING:
    from .job import TrainJob as TrainJob
    from .job import train_job as train_job

__all__ = ["TrainJob", "build_parser", "main", "train_job"]
_FROM_JOB = ("TrainJob", "train_job")


def __getattr__(name: str) -> Any:
    if name in _FROM_JOB:
        from . import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
