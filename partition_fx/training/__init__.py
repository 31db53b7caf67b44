"""Partitioned training: learn hyperparameters in one run by the partitioned marginal likelihood.

``fit(pmodel, dataset, hyper=..., steps=...)`` is the one-liner; ``PartitionedTrainer`` exposes the steps;
``load_checkpoint(pmodel, path)`` restores a run's checkpoint file without either.
"""

from ..errors import PartitionCheckpointError
from ..train_config import TrainConfig
from .checkpoint import load_checkpoint
from .checkpoint_writer import CheckpointWriter
from .chunks import DataChunks, Examples, chunks_from_assignment, split_into_chunks
from .fit import fit
from .hooks import CallbackHook, TrainingHook
from .likelihoods import CallableLikelihood, Categorical, Gaussian, Likelihood, resolve_likelihood
from .lml import LMLEstimate, estimate_lml, recalibrate_norm_statistics
from .metrics import evaluate_averaged, evaluate_classifier
from .optim import partition_optimizer, weight_decay_scales
from .options import Components
from .result import FitResult
from .resume import load_training_state, resume_directory, save_training_state
from .sampler import PartitionedSampler
from .trainer import PartitionedTrainer

__all__ = [
    "CallableLikelihood",
    "CallbackHook",
    "Categorical",
    "CheckpointWriter",
    "Components",
    "DataChunks",
    "Examples",
    "FitResult",
    "Gaussian",
    "LMLEstimate",
    "Likelihood",
    "PartitionCheckpointError",
    "PartitionedSampler",
    "PartitionedTrainer",
    "TrainConfig",
    "TrainingHook",
    "chunks_from_assignment",
    "estimate_lml",
    "evaluate_averaged",
    "evaluate_classifier",
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
