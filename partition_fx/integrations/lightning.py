"""Partitioned training as a ``lightning.LightningModule`` (the ``lightning`` extra): a stock ``lightning.Trainer``
fits it on your dataset, with Lightning's loggers, callbacks and checkpoints, and it exports the final model.

The module runs the pieces of your own loop (``docs/loops.md``): its ``train_dataloader`` reads your dataset
through a ``PartitionedBatchSampler`` (one batch per iteration, one epoch per run) and each ``training_step`` takes
the iteration's steps (``TrainingSteps.take``) with manual optimisation. With the same ``TrainConfig`` it trains
what ``fit`` trains, bit for bit on one CPU process (tested), when that configuration has ``restore_best=False``:
``fit`` returns to the best state by the LML before fine-tuning, the module carries on from the last.

Not supported, and refused in one line that says what works instead:

- several processes (``devices > 1``, DDP and its relatives). A partitioned step leaves most parameters unused, and
  which ones changes every iteration, so DDP's reducer cannot synchronise it. ``fit`` under ``torchrun`` trains
  data-parallel exactly. (The strategies that spawn their processes, ``ddp_spawn``, fail before the module can say
  so: a ``PartitionedModel`` does not survive pickling into the new processes.)
- Lightning's mixed precision. Use ``TrainConfig(precision=...)`` with ``fit``.
- Resuming a run from a Lightning checkpoint. Lightning restores neither torch's generator nor the phase of the
  run. A checkpoint still loads for export (``load_from_checkpoint``), and ``fit(checkpoint_dir=..., resume=...)``
  resumes bit for bit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..errors import PartitionArgumentError
from ..export import export_subnetwork
from ..extras import import_extra
from ..fx.partitioned_model import PartitionedModel
from ..job.train_config import TrainConfig
from ..training.objective.likelihoods import Likelihood
from ..training.objective.lml import recalibrate_norm_statistics
from ..training.sampling.chunks import Examples, split_into_chunks
from ..training.sampling.schedule import PartitionedBatchSampler
from ..training.step.steps import TrainingSteps
from ..training.tracking import evaluation_metrics

if TYPE_CHECKING:  # the test extra installs lightning: mypy reads its types
    import lightning as L
else:
    L = import_extra("partition_fx.integrations.lightning", "lightning")  # one line naming the install, if missing


class PartitionedLightningModule(L.LightningModule):
    """``pmodel`` trained on ``dataset`` by partitioned training, learning the hyperparameters of ``hyper`` (and of
    the model's hyperparameter modules), as ``config`` says (default ``TrainConfig()``, ``fit``'s recipe): fit it
    with ``lightning.Trainer(max_epochs=1)`` (one epoch is the whole run, ``config``'s ``steps``). ``dataset`` is a
    map-style dataset of ``(input, target)`` pairs, or a ``LightningDataModule`` whose training set
    (``setup("fit")``, then ``train_dataloader().dataset``) is read through the partitioned sampler (its own
    batch size and sampling are not used).

    It logs, through the trainer's loggers at each evaluation (where its steps' schedule says, as ``fit``), what
    ``partition-fx train --log`` logs: the conditional and full LML, the LML per chunk, the losses, the
    learning rates and every hyperparameter by name (``training.tracking.evaluation_metrics``). Lightning's
    checkpoints hold the model, the input transform and the optimisers. At the run's last iteration BatchNorm's
    statistics are recalibrated for the final subnetwork; :meth:`export` is then the final model as a plain module.

    Example::

        >>> import lightning
        >>> from partition_fx import partitionify
        >>> x = torch.randn(64, 4); y = (x[:, 0] > 0).long()
        >>> pmodel = partitionify(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), 2)
        >>> config = TrainConfig.recommended(steps=6, batch_size=8)
        >>> module = PartitionedLightningModule(pmodel, torch.utils.data.TensorDataset(x, y), config=config)
        >>> trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
        ...                             enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(module)
        >>> trainer.global_step, type(module.export()).__name__
        (6, 'Sequential')
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        dataset: Any,
        *,
        hyper: nn.Module | None = None,
        likelihood: Likelihood | None = None,
        config: TrainConfig | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(pmodel, PartitionedModel):
            raise PartitionArgumentError(
                f"PartitionedLightningModule needs a PartitionedModel (from partitionify(model)), got "
                f"{type(pmodel).__name__}"
            )
        self.config = config if config is not None else TrainConfig()
        if self.config.population.members > 1:
            members = self.config.population.members
            raise PartitionArgumentError(
                f"PartitionedLightningModule trains one run, and config has population={members}: "
                "train a population with fit(..., population=N) or partition-fx train --population N"
            )
        self.pmodel = pmodel
        self.hyper = hyper
        if isinstance(dataset, L.LightningDataModule):  # its training set, read through the partitioned sampler
            dataset.prepare_data()
            dataset.setup("fit")
            dataset = dataset.train_dataloader().dataset
        self.dataset = dataset
        self.num_workers = num_workers
        self.chunks = split_into_chunks(len(dataset), pmodel.proportions, seed=self.config.runtime.seed)
        self.steps = TrainingSteps.create(
            pmodel, self.chunks, hyper=hyper, likelihood=likelihood, config=self.config, scored=Examples(dataset)
        )
        """What is trained, its optimisers and the LML estimates, assembled as ``fit``'s are."""
        self.likelihood = self.steps.likelihood
        self.automatic_optimization = False  # the steps step their own optimisers
        self._draws: Any = None
        self._batches: PartitionedBatchSampler | None = None
        self._started = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The final subnetwork C's outputs (what :meth:`export` returns as a plain module)."""
        return self.pmodel(x)

    # --- what Lightning asks for -------------------------------------------------------------------------------

    def configure_optimizers(self) -> Any:
        stepper = self.steps.stepper
        optimizers = [o for o in (stepper.optimizer, stepper.hyper_optimizer) if o is not None]
        if stepper.scheduler is None:
            return optimizers
        # returned so that checkpoints hold its state; with manual optimisation Lightning never steps it
        return optimizers, [stepper.scheduler]

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        processes = trainer.num_devices * trainer.num_nodes
        if processes > 1:
            raise PartitionArgumentError(
                f"PartitionedLightningModule trains in one process, not {processes}: a partitioned step "
                "leaves most parameters unused (which ones changes every iteration), which DDP cannot synchronise; "
                "use lightning.Trainer(devices=1), or fit() under torchrun, which trains data-parallel exactly"
            )
        if str(trainer.precision) not in ("32-true", "32"):
            raise PartitionArgumentError(
                f"PartitionedLightningModule takes its steps in fp32, not Lightning's precision "
                f"{trainer.precision!r}: use lightning.Trainer(precision='32-true'), or fit(precision='bf16') "
                "for mixed precision"
            )

    def train_dataloader(self) -> DataLoader:
        learns = self.steps.stepper.hyper_optimizer is not None
        self._batches = PartitionedBatchSampler(self.chunks, self.config, hyperparameters=learns)
        # the loader's own generator for its workers' seed: torch's global one draws the augmentation, as in fit
        return DataLoader(
            self.dataset, batch_sampler=self._batches, num_workers=self.num_workers, generator=torch.Generator()
        )

    def on_train_start(self) -> None:
        loader = self.trainer.train_dataloader
        if self._batches is None or loader is None or loader.batch_sampler is not self._batches:
            raise PartitionArgumentError(
                "the batches of a PartitionedLightningModule are drawn by its partitioned sampler: give the dataset "
                "or LightningDataModule to PartitionedLightningModule(pmodel, data), and call trainer.fit(module) "
                "without train_dataloaders= or datamodule="
            )
        if self.trainer.global_step > 0 or self.steps.step > 0:
            raise PartitionArgumentError(
                "a PartitionedLightningModule cannot resume a run (Lightning restores neither torch's generator "
                "nor the run's phase): train it from the start, load the checkpoint with load_from_checkpoint to "
                "export it, or resume with fit(checkpoint_dir=..., resume=...)"
            )
        torch.manual_seed(self.config.runtime.seed)  # as fit seeds it: the augmentation's and dropout's draws
        # the weights' steps through Lightning's wrapper of their optimiser, which counts trainer.global_step
        wrapped = self.optimizers(use_pl_optimizer=True)
        # a LightningOptimizer: at runtime an instance of a subclass of the optimiser's class, which it steps
        self.steps.stepper.optimizer = wrapped[0] if isinstance(wrapped, list) else wrapped  # type: ignore[assignment]
        assert self._batches is not None
        self._draws = iter(self._batches.draws())
        self._started = time.perf_counter()

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        steps = self.steps
        steps.take(next(self._draws), x, y)
        schedule = steps.schedule
        assert schedule is not None  # TrainingSteps.create builds one
        if schedule.evaluates_at(steps.step):
            self._log_evaluation()
        if steps.step >= schedule.end:
            # the end of the run, before the epoch's end, where Lightning's checkpoints are written: they then hold
            # the final model as export() returns it
            recalibrate_norm_statistics(self.pmodel, Examples(self.dataset))
            self.trainer.should_stop = True  # one epoch is the run; a second would draw it again

    # --- the final model ---------------------------------------------------------------------------------------

    def export(self) -> nn.Module:
        """The final subnetwork as a new module of the original model's class (``export_subnetwork``)."""
        return export_subnetwork(self.pmodel)

    def _log_evaluation(self) -> None:
        """The evaluation ``fit`` records (``TrainingSteps.evaluation``), logged as ``partition-fx train --log``
        logs it."""
        steps = self.steps
        record = steps.evaluation(time.perf_counter() - self._started)
        metrics = evaluation_metrics(record, steps.stepper.optimizer, steps.stepper.hyper_optimizer)
        # to the loggers directly, at the iteration's number: self.log would log only every log_every_n_steps
        for logger in self.loggers:
            logger.log_metrics(metrics, step=steps.step)
