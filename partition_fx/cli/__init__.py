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
torch-free check), ``dispatch`` (the entry point, one-line errors), ``runs`` (run directories, reports, a run's
``JobSpec`` from its report, ``--resume``), ``train``, ``export``, ``predict``, ``convert`` (and describe),
``federated`` and ``plots``. A train job before training (its spec checked, data, model, conversion) is built by
:mod:`partition_fx.job.build`, which the commands and Python scripts share.

Importing this package imports neither torch nor the commands (``partition-fx --help`` answers at once).
"""

from __future__ import annotations

from .dispatch import main
from .parser import build_parser

__all__ = ["build_parser", "main"]
