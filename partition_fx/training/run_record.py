"""``run.json``: what ``fit(..., checkpoint_dir=DIR)`` records so that ``partition-fx export --run DIR`` can
rebuild the model and data without the Python that trained them.

The command rebuilds a run as ``partition-fx train`` builds one: a model by name (``models.build_model``), a
dataset by name (``datasets.load_dataset``), ``partitionify`` with the run's seed, and an
``AffineAugmentation`` or no input transform. Those record how they were built (``build_model`` on the model,
which ``partitionify`` keeps as ``PartitionedModel.build``; ``load_dataset`` on each split as
``partition_fx_source``), so a run made of them is written down in the command line's own terms (the
``config`` of a ``train`` report: the job's options and ``"train"``, the ``TrainConfig``). A run the command
cannot rebuild (another model or dataset, a custom transform, rules of a ``PartitionConfig``) gets
``config: null`` and the reason, which ``export`` reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .._io import write_json
from ..choices import AFFINE_GENERATORS
from ..partitioned_model import PartitionedModel
from ..train_config import RUN_FILE, TrainConfig
from ..transforms import AffineAugmentation
from ..transforms.affine import DEFAULT_MAX_RANGE
from .hooks import TrainingHook

__all__ = ["RUN_FILE", "RunRecordWriter", "run_record"]


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
    fixed = isinstance(hyper, AffineAugmentation) and hyper.is_fixed
    if hyper is not None and not (type(hyper) is AffineAugmentation and _as_the_command_builds(hyper)):
        return (
            f"the input transform {type(hyper).__name__} is not an AffineAugmentation with its default ranges "
            "(learned, or fixed with AffineAugmentation.fixed)"
        )
    if pmodel.seed != config.runtime.seed:
        return (
            f"partitionify's seed ({pmodel.seed}) is not fit's ({config.runtime.seed}), and the command seeds both "
            "with one --seed"
        )
    return {
        "recipe": None,  # a Python run's options are its own
        "model": model["name"],
        "checkpoint": None,  # the run's checkpoint replaces every weight (its defaults too, unless left out)
        "data": data["data"],
        "image_size": data["image_size"],
        "channels": data["channels"],
        "augment": "affine" if hyper is not None else "none",
        "samples": hyper.num_samples if hyper is not None else 1,
        "fix": hyper.hyperparameters() if fixed else None,
        "fix_from": None,
        "init": None,  # where learned ranges started does not change the trained checkpoint it rebuilds
        "test_time_samples": 0,  # fit reports no test-time averaged scores
        "partitions": pmodel.num_partitions,
        "proportions": list(pmodel.proportions),
        "scheme": pmodel.scheme,
        "default": pmodel.default,
        "assignments": pmodel.assignments,
        "device": "auto",
        "train": config.to_dict(),
    }


def _as_the_command_builds(hyper: AffineAugmentation) -> bool:
    """Whether ``--augment affine`` builds ``hyper``: every generator, learned from any start within the default
    bounds, or fixed (``--fix``; the bounds of fixed ranges constrain nothing)."""
    return hyper.generators == AFFINE_GENERATORS and (hyper.is_fixed or hyper.max_range == DEFAULT_MAX_RANGE)


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

    def after_evaluation(self, trainer: Any, record: dict[str, Any], improved: bool) -> None:
        parallel = trainer.data_parallel
        if not self.written and (parallel is None or parallel.is_writer):
            self.directory.mkdir(parents=True, exist_ok=True)
            run = run_record(trainer.pmodel, self.dataset, trainer.hyper, trainer.config)
            write_json(self.directory / RUN_FILE, run)
            self.written = True
