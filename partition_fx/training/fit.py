"""``fit``: partitioned training with hyperparameters learned by the LML, in one call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._validation import check_directory
from ..errors import PartitionArgumentError
from ..partitioned_model import PartitionedModel
from .options import Callback, RunOptions, TrainerOptions
from .result import FitResult
from .resume import load_training_state
from .trainer import PartitionedTrainer


def fit(
    pmodel: PartitionedModel,
    dataset: Any,
    *,
    steps: int,
    eval_every: int | None = None,
    patience: int | None = None,
    restore_best: bool = False,
    callbacks: Sequence[Callback] = (),
    progress: bool | None = None,
    recalibrate_norms: bool = True,
    finetune_steps: int = 0,
    resume: str | Path | None = None,
    **options: Any,
) -> FitResult:
    """Train a partitioned model and learn its hyperparameters by the partitioned marginal likelihood.

    Args (the keyword ``options`` are :class:`TrainerOptions`' fields, with its defaults):
        pmodel: from ``partitionify`` (C >= 2 to learn hyperparameters).
        dataset: ``(inputs, targets)`` tensors, a ``TensorDataset``, or a map-style dataset of pairs.
        hyper: an input transform whose parameters are hyperparameters (``AffineAugmentation``,
            ``InputMask``, or a module holding several); ``HyperparameterModule`` s inside the model
            (``ConcreteDropout``) and a Gaussian likelihood's noise scale are learned too.
        likelihood: ``"classification"``, ``"regression"`` (Gaussian, learned noise scale), a
            ``Likelihood``, or ``fn(outputs, targets) -> per-example log-likelihood``.
        steps: iterations (each: one parameter step, plus a hyperparameter step when due).
        optimizer / hyper_optimizer: ``params -> torch.optim.Optimizer``, e.g.
            ``functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-4)``; both default to
            Adam(lr=1e-3). The model optimiser gets one param group per partition, with its weight decay
            scaled by ``weight_decay_scaling`` (``reciprocal``/``sqrt``/``none`` of |D_1:k|, see
            ``weight_decay_scales``). ``scheduler``: ``optimizer -> LR scheduler``, stepped every iteration.
        hyper_every / warmup_steps / hyper_batch_size: a hyperparameter step every ``hyper_every``
            iterations once ``warmup_steps`` have passed, on ``hyper_batch_size`` (default ``batch_size``).
        chunks: ``DataChunks`` or a per-example chunk id (1..C, e.g. by client); default: a random split
            with the model's proportions, from ``seed``.
        seed: an int in 0..2**63-1; seeds the chunks, the sampler and torch's global RNG (augmentation and
            dropout noise).
        eval_every: LML evaluation interval (default ``steps // 10``); the last step is always evaluated.
        eval_examples_per_chunk: score at most this many examples per chunk (an unbiased estimate).
        patience / restore_best: stop after ``patience`` evaluations without a better conditional LML (the
            evidence the best state is chosen by; see ``PartitionedTrainer.selection_score``); return the
            best state (``restore_best``).
        callbacks: ``cb(trainer, record)`` after each evaluation; returning True stops training.
        on_nonfinite: ``"raise"`` (default: stop with the step and partition named) or ``"skip"`` the step.
        check_every: steps between reads of the device for the non-finite check (default: 1 on the CPU,
            50 on an accelerator, which then runs ahead of Python between reads). With ``"raise"`` and more
            than 1, a fault is found at the next read, at the latest at the next evaluation and before any
            state is saved: the error names the step it happened at, and the last checkpoint is the one
            written before it. ``"skip"`` decides before each step, so it reads every step.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: the forwards (training and LML) run under
            ``torch.autocast`` to that dtype; the partitions, their gradients and the optimiser state stay
            fp32. fp16 adds a ``torch.amp.GradScaler`` (its loss scale is saved for resuming); a step whose
            scaled gradient overflows is skipped by the scaler, not reported as a fault.
        compile: True or a ``torch.compile`` mode (``"reduce-overhead"``: CUDA graphs; ``"max-autotune"``)
            compiles the model in place first (``PartitionedModel.compile``): each subnetwork's forward and
            backward compile once per (k, gradient partition, mode), the first steps paying for it.
        checkpoint_dir: write ``last.safetensors`` / ``best.safetensors`` and ``resume/`` at each evaluation
            (atomically; ``best`` is a hard link when it equals ``last``), and ``last`` again at the end with
            the state the run returns (see ``CheckpointWriter``).
        progress: None (default): a tqdm bar when stderr is a terminal, otherwise one line per evaluation on
            stderr (step, LML, loss, hyperparameters, elapsed and remaining time); True: the bar; False: nothing.
        fused: the parameter and hyperparameter steps of an iteration in one forward and one backward
            (``PartitionedTrainer.fused_iteration``); not yet with hyperparameter modules inside the model.
        every_partition: each example of a parameter batch draws its own partition (k_i ~ Cat(u), example
            from D_1:k_i) and trains only it, so every partition is updated every iteration.
        checkpoint_defaults: store the partitions' default values in checkpoints (default). False leaves
            them out (a third of an ``init``-default checkpoint) for runs whose model is rebuilt the same way
            before loading (same seed and weights, as ``partition-fx`` does); a model that rebuilds them
            differently is refused. Layouts are always left out: ``partitionify`` rebuilds them from its seed.
        resume: a ``resume`` directory written by an earlier ``fit(..., checkpoint_dir=...)`` (at
            ``checkpoint_dir/resume``, refreshed at every evaluation) with the same arguments: training
            continues from its step to ``steps`` in total, bit for bit as if it had not stopped (on CPU).
            A directory from another configuration is refused, naming what differs.
        recalibrate_norms: at the end, recompute BatchNorm running statistics for the final subnetwork
            over the training data (see ``recalibrate_norm_statistics``); they are shared by all
            subnetworks during training. The LML does not use them (it runs in training mode).
        finetune_steps: the last ``finetune_steps`` of the ``steps`` iterations fine-tune the final model
            (the paper's Table 2): psi is frozen, every weight of subnetwork C (all partitions, as exported)
            trains on ALL the data with the learned augmentation, the optimiser and ``scheduler`` carry on
            (so a schedule over ``steps`` spans both phases) and the weight decay is no longer scaled. The
            LML is not estimated then (no subnetwork is unseen by a chunk any more): those evaluations
            record ``phase: "finetune"`` and the training loss. ``patience`` ends the partitioned phase
            early (fine-tuning then runs to ``steps``); ``restore_best`` restores the best state (highest
            conditional LML) before fine-tuning. Default 0: partitioned training only.
        hyper_chunks: ``"one"`` (default, the paper's): a hyperparameter step scores one chunk k ~ Cat(u_2..C);
            ``"all"``: it scores a minibatch of every chunk 2..C (each through its own subnetwork k-1),
            weighted by the same probabilities: the same expected gradient, without the variance of the
            draw of k, at C-1 times the hyper step's cost.
        hyper_samples: augmentation samples per example in hyperparameter steps (default: the input
            transform's own ``num_samples``); more samples lower the variance of the hyper-gradient.
        hyper_scheduler: ``hyper_optimizer -> LR scheduler``, stepped after every hyperparameter step.
        hooks: ``TrainingHook`` s run after each evaluation, when fine-tuning begins and at the end.
        data_parallel: None (default): average over the processes of an initialised process group when
            there are 2 or more (``torchrun --nproc_per_node=N``; see ``training.data_parallel``); each process
            takes ``batch_size / N`` examples of every global minibatch and only rank 0 writes checkpoints.
            False: train this process alone even then; True: require such a group.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import fit
        >>> from partition_fx.transforms import InputMask
        >>> x = torch.randn(200, 4); y = (x[:, 0] > 0).long()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        >>> pmodel = partitionify(model, 2, (0.7, 0.3))
        >>> result = fit(pmodel, (x, y), hyper=InputMask(4), steps=20, batch_size=32, progress=False)
        >>> sorted(result.hyperparameters), len(result.history), result.lml < 0
        (['mask'], 10, True)
    """
    run = RunOptions(steps, eval_every, patience, restore_best, callbacks, progress, recalibrate_norms, finetune_steps)
    if run.finetune_steps == run.steps:
        raise PartitionArgumentError(
            f"finetune_steps ({finetune_steps}) must be less than steps ({steps}): partitioned training needs at "
            "least one iteration to learn the hyperparameters that fine-tuning keeps"
        )
    resume = check_directory("resume", resume)
    trainer_options = TrainerOptions.from_kwargs("fit", options)
    torch.manual_seed(trainer_options.seed)
    trainer = PartitionedTrainer(pmodel, dataset, trainer_options)
    if resume is not None:
        load_training_state(trainer, resume)
        if trainer.step >= run.steps:
            raise PartitionArgumentError(
                f"the run in {resume} is at step {trainer.step}, not before steps={run.steps}: nothing to resume; "
                "pass a larger steps to train on (with the same LR schedule arguments)"
            )
    return trainer.run(
        run.steps - trainer.step,
        eval_every=run.eval_every,  # steps // 10 of the whole run, also when resumed
        patience=patience,
        restore_best=restore_best,
        callbacks=run.callbacks,
        progress=progress,
        recalibrate_norms=recalibrate_norms,
        # The switch stays at iteration steps - finetune_steps of the whole run, also when resumed.
        finetune_steps=min(run.finetune_steps, run.steps - trainer.step),
    )


__all__ = ["fit"]
