"""``fit``: partitioned training with hyperparameters learned by the LML, in one call; and ``run.json``, what
``fit(..., checkpoint_dir=DIR)`` records so that ``partition-fx export --run DIR`` can rebuild the model and data
without the Python that trained them.

The command rebuilds a run as ``partition-fx train`` builds one: a model by name (``models.build_model``), a
dataset by name (``datasets.load_dataset``), ``partitionify`` with the run's seed, and an
``AffineAugmentation`` or no input transform. Those record how they were built (``build_model`` on the model,
which ``partitionify`` keeps as ``PartitionedModel.build``; ``load_dataset`` on each split as
``partition_fx_source``), so a run made of them is written down in the command line's own terms: a
:class:`~partition_fx.job.spec.JobSpec`, as the ``config`` of a ``train`` report (every field this run does not
decide at the command's default). A run the command
cannot rebuild (another model or dataset, a custom transform, rules of a ``PartitionConfig``) gets
``config: null`` and the reason, which ``export`` reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._io import write_json
from ..._validation import check_directory, check_flag
from ...choices import GENERATOR_SETS, generator_set_name
from ...errors import PartitionArgumentError
from ...fx.partitioned_model import PartitionedModel
from ...job.spec import JobSpec
from ...job.train_config import RUN_FILE, TrainConfig
from ...ranges import DEFAULT_MAX_RANGE
from ...transforms import AffineAugmentation
from ..checkpoint import load_training_state
from ..objective.lml import EvaluationRecord
from .components import check_run_arguments, resolve
from .hooks import Callback, TrainingHook
from .population import Population, population_size
from .trainer import FitResult, PartitionedTrainer

# --- run.json --------------------------------------------------------------------------------------------------------


def run_record(pmodel: PartitionedModel, dataset: Any, hyper: nn.Module | None, config: TrainConfig) -> dict[str, Any]:
    """``{"command": "fit", "config": ..., "why_not": ...}``: the command line's configuration of this run, or
    None and why the command cannot rebuild it.

    >>> import torch
    >>> from partition_fx import partitionify
    >>> record = run_record(partitionify(torch.nn.Linear(2, 2), 2), None, None, TrainConfig())
    >>> record["config"], record["why_not"]
    (None, 'the model was not built by name with partition_fx.models.build_model')
    """
    config_or_reason = _command_config(pmodel, dataset, hyper, config)
    if isinstance(config_or_reason, str):
        return {"command": "fit", "config": None, "why_not": config_or_reason}
    return {"command": "fit", "config": config_or_reason, "why_not": None}


def _command_config(
    pmodel: PartitionedModel, dataset: Any, hyper: nn.Module | None, config: TrainConfig
) -> dict[str, Any] | str:
    model = pmodel.build
    data = getattr(dataset, "partition_fx_source", None)
    if model is None:
        return "the model was not built by name with partition_fx.models.build_model"
    if data is None:
        return "the data is not the train split of partition_fx.datasets.load_dataset"
    if model["in_chans"] != (data["channels"] or model["in_chans"]):
        return f"the model takes {model['in_chans']} input channels and the data has {data['channels']}"
    # fixed ranges: where learned ranges started (init) does not matter
    fix = hyper.range_values() if isinstance(hyper, AffineAugmentation) and hyper.is_fixed else None
    fixed = fix is not None
    # the command builds every generator set, learned from any start within any bounds (--max-range), or fixed
    if hyper is not None and not (type(hyper) is AffineAugmentation and hyper.generators in GENERATOR_SETS.values()):
        return (
            f"the input transform {type(hyper).__name__} is not an AffineAugmentation of a named generator set "
            f"({', '.join(GENERATOR_SETS)}: --generators)"
        )
    if pmodel.seed != config.runtime.seed:
        return (
            f"partitionify's seed ({pmodel.seed}) is not fit's ({config.runtime.seed}), and the command seeds both "
            "with one --seed"
        )
    return JobSpec(
        model=model["name"],
        checkpoint=None,  # the run's checkpoint replaces every weight (its defaults too, unless left out)
        data=data["data"],
        image_size=data["image_size"],
        channels=data["channels"],
        partitions=pmodel.num_partitions,
        proportions=pmodel.proportions,
        scheme=pmodel.scheme,
        default=pmodel.default,
        assignments=pmodel.assignments,
        augment="affine" if hyper is not None else "none",
        **(_augmentation(hyper) if hyper is not None else {}),
        samples=hyper.num_samples if hyper is not None else 1,
        test_time_samples=0,  # fit reports no test-time averaged scores
        fix=fix,
        max_range=_raised_bounds(hyper) if hyper is not None and not fixed else None,
        train=config,
    ).to_dict()


def _augmentation(hyper: AffineAugmentation) -> dict[str, str]:
    """The command's ``--generators`` and ``--draws`` that build ``hyper``'s (of a named generator set, the only
    ones :func:`_command_config` asks for)."""
    generators = generator_set_name(hyper.generators)
    if generators is None:
        raise PartitionArgumentError(f"the generators {hyper.generators} are not a named set: the command has none")
    return {"generators": generators, "draws": hyper.draws}


def _raised_bounds(hyper: AffineAugmentation) -> dict[str, float] | None:
    """The bounds of ``hyper``'s learned ranges that are not their defaults, as ``--max-range`` gives them; None
    when every one is."""
    changed = {name: bound for name, bound in hyper.max_range.items() if bound != DEFAULT_MAX_RANGE[name]}
    return changed or None


class RunRecordWriter(TrainingHook):
    """Writes the run's :func:`run_record` (of the trainer's model, input transform and configuration, and
    ``dataset``, the data it was given) to ``directory/run.json`` with the run's first checkpoint, on the process
    that writes checkpoints, so a run refused before it starts leaves nothing behind.

    >>> import tempfile, torch
    >>> from partition_fx import partitionify
    >>> from partition_fx.training import PartitionedTrainer
    >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(2, 2), 2), (torch.randn(8, 2), torch.zeros(8).long()))
    >>> writer = RunRecordWriter(Path(tempfile.mkdtemp()), None)
    >>> writer.after_evaluation(trainer, {}, True)
    >>> sorted(p.name for p in writer.directory.iterdir())
    ['run.json']
    """

    def __init__(self, directory: Path, dataset: Any) -> None:
        self.directory = directory
        self.dataset = dataset
        self.written = False

    def after_evaluation(self, trainer: PartitionedTrainer, record: EvaluationRecord, improved: bool) -> None:
        parallel = trainer.data_parallel
        if not self.written and (parallel is None or parallel.is_writer):
            self.directory.mkdir(parents=True, exist_ok=True)
            run = run_record(trainer.pmodel, self.dataset, trainer.steps.hyper, trainer.config)
            write_json(self.directory / RUN_FILE, run)
            self.written = True


# --- fit -------------------------------------------------------------------------------------------------------------


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
    Each field's meaning, default and bounds: :mod:`partition_fx.job.train_config` (or ``partition-fx train
    --help``, which lists them as options). The other keywords are the run's :class:`Components`:

    Args:
        pmodel: from ``partitionify`` (C >= 2 to learn hyperparameters).
        dataset: ``(inputs, targets)`` tensors, a ``TensorDataset``, or a map-style dataset of pairs.
        config: a :class:`~partition_fx.job.train_config.TrainConfig` (``TrainConfig.paper()`` is the paper's
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
            (hyperparameter) step; ``scheduler`` replaces the configuration's ``lr_schedule`` and, without
            ``config`` or ``finetune_schedule``, spans fine-tuning too (``finetune_schedule="continue"``).
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
            there are 2 or more (``torchrun --nproc_per_node=N``; see ``training.step.stepping``); each process
            takes ``batch_size / N`` examples of every global minibatch and only rank 0 writes checkpoints.
            False: train this process alone even then; True: require such a group.
        resume: a ``resume`` directory written by an earlier ``fit(..., checkpoint_dir=...)`` (at
            ``checkpoint_dir/resume``, refreshed at every evaluation) with the same configuration: training
            continues from its step to ``steps`` in total, bit for bit as if it had not stopped (on CPU).
            A directory from another configuration is refused, naming what differs.
        population: N >= 2 (a field of the configuration) trains N members of the partitioned phase side by
            side and fine-tunes the fittest (``training.loop.population``); ``resume`` then continues the population.
        record_run: with ``checkpoint_dir``, write ``checkpoint_dir/run.json``: the run in the command line's
            terms, so that ``partition-fx export --run checkpoint_dir`` rebuilds and exports it, or why it cannot
            (``training.fit``). ``partition-fx train`` records its runs in its own ``report.json``.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import fit
        >>> from partition_fx.transforms import InputMask
        >>> x = torch.randn(200, 4); y = (x[:, 0] > 0).long()
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        >>> pmodel = partitionify(model, 2, (0.7, 0.3))
        >>> result = fit(pmodel, (x, y), hyper=InputMask(4), steps=20, batch_size=32, progress=False)
        >>> sorted(result.hyperparameters), result.finetune_start, result.lml < 0  # the last 0.4 fine-tunes
        (['mask'], 12, True)
    """
    resume = check_directory("resume", resume)
    config, components = resolve("fit", config, keywords)
    check_run_arguments(callbacks, progress)  # before anything is built
    check_flag("record_run", record_run)
    torch.manual_seed(config.runtime.seed)
    if components.checkpoint_dir is not None and record_run:  # written with the first checkpoint
        record = RunRecordWriter(Path(components.checkpoint_dir), dataset)  # Components stores it as a Path
        components = dataclasses.replace(components, hooks=(*components.hooks, record))
    if config.population.members > 1:
        population = Population(pmodel, dataset, config, components)
        if resume is not None:
            population.load(resume)
            _check_before_end(population.step, config, resume)
        return population.run(callbacks=callbacks, progress=progress)
    members = population_size(resume) if resume is not None else None
    if members is not None:
        raise PartitionArgumentError(
            f"{resume} holds the partitioned phase of a population of {members}: resume it with population={members}"
        )
    trainer = PartitionedTrainer(pmodel, dataset, config, components=components)
    if resume is not None:
        load_training_state(trainer, resume)
        _check_before_end(trainer.step, config, resume)
    return trainer.run(callbacks=callbacks, progress=progress)


def _check_before_end(step: int, config: TrainConfig, resume: Path) -> None:
    """Refuse to resume a run that has already reached its ``steps``."""
    if step >= config.optimization.steps:
        raise PartitionArgumentError(
            f"the run in {resume} is at step {step}, not before steps={config.optimization.steps}: "
            "nothing to resume; pass a larger steps to train on (with the same LR schedule arguments)"
        )
