"""The ``partition-fx`` command.

``partition-fx train`` (the main job; see ``partition_fx.cli.train``) trains a model with learned
hyperparameters. With no other arguments it learns affine augmentation for timm's ResNet-10-T on ``rotdigits``
(scikit-learn's digits, each rotated by a fixed random angle) in a few minutes on 2 CPU cores, on CUDA when
available (``--device auto``).

``partition-fx export --run DIR`` exports a trained run's checkpoint to safetensors and ONNX.

``partition-fx convert`` converts a timm model, verifies every subnetwork on digits and exports it;
``partition-fx describe --model NAME`` prints how a model would be partitioned.

One module per purpose: ``parser`` (every option and default), ``dispatch`` (the entry point, one-line
errors), ``job`` (a train job before training: checks, data, model, conversion, recipe), ``runs`` (run
directories, reports, ``--resume``), ``train``, ``export``, ``convert`` (and describe) and ``plots``.

For scripts and benchmarks that train exactly what the command trains::

    job = train_job(["--steps", "100"])          # TrainJob(args, data, model, pmodel, hyper, device)
    fit(job.pmodel, job.data.train, hyper=job.hyper, **training_recipe(job.args), device=job.device)
"""

from .dispatch import main
from .job import TrainJob, train_job, training_recipe
from .parser import build_parser

__all__ = ["TrainJob", "build_parser", "main", "train_job", "training_recipe"]
