"""``fit``: partitioned training with hyperparameters learned by the LML, in one call."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._validation import check_directory, check_flag
from ..errors import PartitionArgumentError
from ..partitioned_model import PartitionedModel
from ..train_config import TrainConfig
from .options import Callback, check_run_arguments, resolve
from .result import FitResult
from .resume import load_training_state
from .run_record import RunRecordWriter
from .trainer import PartitionedTrainer


def fit(
    pmodel: PartitionedModel,
    dataset: Any,
    config: TrainConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    resume: str | Path | None = None,
    record_run: bool = True,
    **keywords: Any,
) -> FitResult:
    """Train a partitioned model and learn its hyperparameters by the partitioned marginal likelihood.

    What is computed is ``config`` (default :meth:`TrainConfig.recommended`, the recipe ``partition-fx train``
    runs) with any of its fields changed by keyword: ``fit(pmodel, data, hyper=..., steps=200, seed=3)`` trains
    exactly what ``partition-fx train --steps 200 --seed 3`` trains for the same model, data and input transform.
    Each field's meaning, default and bounds: :mod:`partition_fx.train_config` (or ``partition-fx train
    --help``, which lists them as options). The other keywords are the run's :class:`Components`:

    Args:
        pmodel: from ``partitionify`` (C >= 2 to learn hyperparameters).
        dataset: ``(inputs, targets)`` tensors, a ``TensorDataset``, or a map-style dataset of pairs.
        config: a :class:`~partition_fx.train_config.TrainConfig` (``TrainConfig.paper()`` is the paper's
            exact hyperparameter step); keywords naming its fields change it.
        hyper: an input transform whose parameters are hyperparameters (``AffineAugmentation``,
            ``InputMask``, or a module holding several); ``HyperparameterModule`` s inside the model
            (``ConcreteDropout``) and a Gaussian likelihood's noise scale are learned too.
        likelihood: ``"classification"``, ``"regression"`` (Gaussian, learned noise scale), a
            ``Likelihood``, or ``fn(outputs, targets) -> per-example log-likelihood``.
        optimizer / hyper_optimizer: ``params -> torch.optim.Optimizer``, e.g.
            ``functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-4)``, in place of the
            configuration's Adam. The model optimiser gets one param group per partition, its weight decay
            scaled by ``weight_decay_scaling`` (see ``weight_decay_scales``).
        scheduler / hyper_scheduler: ``optimizer -> LR scheduler``, stepped after every parameter
            (hyperparameter) step; ``scheduler`` replaces the configuration's ``lr_schedule``.
        chunks: ``DataChunks`` or a per-example chunk id (1..C, e.g. by client); default: a random split
            with the model's proportions, from ``seed``.
        callbacks: ``cb(trainer, record)`` after each evaluation; returning True stops training (a
            ``TrainingHook`` in a thin adapter).
        hooks: ``TrainingHook`` s run after each evaluation, when fine-tuning begins and at the end.
        checkpoint_dir: write ``last.safetensors`` / ``best.safetensors`` and ``resume/`` at each evaluation
            (atomically; ``best`` is a hard link when it equals ``last``), ``last`` again at the end with the
            state the run returns (see ``CheckpointWriter``), and the run's ``config.json``.
        progress: None (default): a tqdm bar when stderr is a terminal, otherwise one line per evaluation on
            stderr (step, LML, loss, hyperparameters, elapsed and remaining time); True: the bar; False: nothing.
        device: where to train (default: where the model is).
        data_parallel: None (default): average over the processes of an initialised process group when
            there are 2 or more (``torchrun --nproc_per_node=N``; see ``training.data_parallel``); each process
            takes ``batch_size / N`` examples of every global minibatch and only rank 0 writes checkpoints.
            False: train this process alone even then; True: require such a group.
        resume: a ``resume`` directory written by an earlier ``fit(..., checkpoint_dir=...)`` (at
            ``checkpoint_dir/resume``, refreshed at every evaluation) with the same configuration: training
            continues from its step to ``steps`` in total, bit for bit as if it had not stopped (on CPU).
            A directory from another configuration is refused, naming what differs.
        record_run: with ``checkpoint_dir``, write ``checkpoint_dir/run.json``: the run in the command line's
            terms, so that ``partition-fx export --run checkpoint_dir`` rebuilds and exports it, or why it cannot
            (``training.run_record``). ``partition-fx train`` records its runs in its own ``report.json``.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import fit
        >>> from partition_fx.transforms import InputMask
        >>> x = torch.randn(200, 4); y = (x[:, 0] > 0).long()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        >>> pmodel = partitionify(model, 2, (0.7, 0.3))
        >>> result = fit(pmodel, (x, y), hyper=InputMask(4), steps=20, batch_size=32, progress=False)
        >>> sorted(result.hyperparameters), result.finetune_start, result.lml < 0  # the last quarter fine-tunes
        (['mask'], 15, True)
    """
    resume = check_directory("resume", resume)
    config, components = resolve("fit", config, keywords)
    check_run_arguments(callbacks, progress)  # before anything is built
    check_flag("record_run", record_run)
    torch.manual_seed(config.runtime.seed)
    if components.checkpoint_dir is not None and record_run:  # written with the first checkpoint
        record = RunRecordWriter(components.checkpoint_dir, dataset)
        components = dataclasses.replace(components, hooks=(*components.hooks, record))
    trainer = PartitionedTrainer(pmodel, dataset, config, components=components)
    if resume is not None:
        load_training_state(trainer, resume)
        if trainer.step >= config.optimization.steps:
            raise PartitionArgumentError(
                f"the run in {resume} is at step {trainer.step}, not before steps={config.optimization.steps}: "
                "nothing to resume; pass a larger steps to train on (with the same LR schedule arguments)"
            )
    return trainer.run(callbacks=callbacks, progress=progress)


__all__ = ["fit"]
