"""Partitioned training: learn hyperparameters in one run by the partitioned marginal likelihood.

``fit(pmodel, dataset, hyper=..., steps=...)`` is the one-liner; ``PartitionedTrainer`` exposes the steps;
your own loop takes them on your ``DataLoader``'s batches with ``PartitionedBatchSampler`` and ``TrainingSteps``
(``docs/loops.md``); ``load_checkpoint(pmodel, path)`` restores a run's checkpoint file without any of them.
"""

from ..choices import Phase
from ..errors import PartitionCheckpointError
from ..job.train_config import TrainConfig
from .checkpoint import load_checkpoint, load_training_state, resume_directory, save_training_state
from .loop.components import Components
from .loop.fit import fit
from .loop.hooks import BestState, CallbackHook, CheckpointWriter, Patience, TrainingHook
from .loop.population import Population
from .loop.trainer import FitResult, PartitionedTrainer
from .objective.likelihoods import CallableLikelihood, Categorical, Gaussian, Likelihood, ModelLoss, resolve_likelihood
from .objective.lml import (
    EvaluationRecord,
    LMLEstimate,
    LMLEvaluator,
    buffers_restored,
    conditional_lml_of_draws,
    estimate_lml,
    evaluation_record,
    evidence,
    log_likelihood_of_draws,
    recalibrate_norm_statistics,
)
from .objective.metrics import evaluate_averaged, evaluate_classifier
from .objective.objective import Objective
from .sampling.chunks import (
    DataChunks,
    Examples,
    PartitionedSampler,
    chunks_from_assignment,
    hyper_step_batch_size,
    split_into_chunks,
)
from .sampling.schedule import PartitionedBatchSampler, Schedule
from .sampling.schemes import Draw, IterationBatch
from .step.optim import partition_optimizer, weight_decay_scales
from .step.steps import TrainingSteps
from .tracking import CSVTracker, MLflowTracker, TensorBoardTracker, Tracker

__all__ = [
    "BestState",
    "CSVTracker",
    "CallableLikelihood",
    "CallbackHook",
    "Categorical",
    "CheckpointWriter",
    "Components",
    "DataChunks",
    "Draw",
    "EvaluationRecord",
    "Examples",
    "FitResult",
    "Gaussian",
    "IterationBatch",
    "LMLEstimate",
    "LMLEvaluator",
    "Likelihood",
    "MLflowTracker",
    "ModelLoss",
    "Objective",
    "PartitionCheckpointError",
    "PartitionedBatchSampler",
    "PartitionedSampler",
    "PartitionedTrainer",
    "Patience",
    "Phase",
    "Population",
    "Schedule",
    "TensorBoardTracker",
    "Tracker",
    "TrainConfig",
    "TrainingHook",
    "TrainingSteps",
    "buffers_restored",
    "chunks_from_assignment",
    "conditional_lml_of_draws",
    "estimate_lml",
    "evaluate_averaged",
    "evaluate_classifier",
    "evaluation_record",
    "evidence",
    "fit",
    "hyper_step_batch_size",
    "load_checkpoint",
    "load_training_state",
    "log_likelihood_of_draws",
    "partition_optimizer",
    "recalibrate_norm_statistics",
    "resolve_likelihood",
    "resume_directory",
    "save_training_state",
    "split_into_chunks",
    "weight_decay_scales",
]
