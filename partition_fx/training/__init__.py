"""Partitioned training: learn hyperparameters in one run by the partitioned marginal likelihood.

``fit(pmodel, dataset, hyper=..., steps=...)`` is the one-liner; ``PartitionedTrainer`` exposes the steps;
your own loop takes them on your ``DataLoader``'s batches with ``PartitionedBatchSampler`` and ``TrainingSteps``
(``docs/loops.md``); ``load_checkpoint(pmodel, path)`` restores a run's checkpoint file without any of them.
"""

from ..errors import PartitionCheckpointError
from ..train_config import TrainConfig
from .checkpoint import load_checkpoint, load_training_state, resume_directory, save_training_state
from .components import Components
from .data import DataChunks, Examples, PartitionedSampler, chunks_from_assignment, split_into_chunks
from .fit import fit
from .hooks import BestState, CallbackHook, CheckpointWriter, Patience, TrainingHook
from .iteration import Draw, IterationBatch, PartitionedBatchSampler, TrainingSteps
from .likelihoods import CallableLikelihood, Categorical, Gaussian, Likelihood, ModelLoss, resolve_likelihood
from .lml import (
    EvaluationRecord,
    LMLEstimate,
    LMLEvaluator,
    Phase,
    estimate_lml,
    evaluation_record,
    evidence,
    recalibrate_norm_statistics,
)
from .metrics import evaluate_averaged, evaluate_classifier
from .objective import Objective
from .optim import partition_optimizer, weight_decay_scales
from .tracking import CSVTracker, MLflowTracker, TensorBoardTracker, Tracker
from .trainer import FitResult, PartitionedTrainer

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
    "TensorBoardTracker",
    "Tracker",
    "TrainConfig",
    "TrainingHook",
    "TrainingSteps",
    "chunks_from_assignment",
    "estimate_lml",
    "evaluate_averaged",
    "evaluate_classifier",
    "evaluation_record",
    "evidence",
    "fit",
    "load_checkpoint",
    "load_training_state",
    "partition_optimizer",
    "recalibrate_norm_statistics",
    "resolve_likelihood",
    "resume_directory",
    "save_training_state",
    "split_into_chunks",
    "weight_decay_scales",
]
