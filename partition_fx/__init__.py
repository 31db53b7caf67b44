"""partition-fx: learn hyperparameters in one training run by partitioning a network.

Public API::

    partitionify(model, num_partitions, proportions, *, scheme, default, seed, config) -> PartitionedModel
    export_subnetwork(pmodel, k) -> nn.Module of the original class
    export_onnx(pmodel, path, example_inputs, *, subnetwork, dynamic_batch) -> Path
    fit(pmodel, dataset, *, hyper, likelihood, steps, ...) -> FitResult      (partition_fx.training)

Learnable hyperparameter modules live in ``partition_fx.transforms``; datasets in ``partition_fx.datasets``.

Importing the package also registers its models with timm (``fixup_resnet8``.., ``cifar_wrn16_4``..).
"""

from . import models as models  # registers the package's models with timm
from .config import ParameterRule, PartitionConfig
from .errors import PartitionArgumentError, PartitionError, PartitionTypeError
from .export import export_onnx, export_subnetwork
from .params import PartitionedTensor, RandomPartitionedTensor, ScalePartitionedTensor
from .partitioned_model import PartitionedModel
from .rewrite import partitionify
from .training import FitResult, PartitionedTrainer, fit

__all__ = [
    "FitResult",
    "ParameterRule",
    "PartitionArgumentError",
    "PartitionConfig",
    "PartitionError",
    "PartitionTypeError",
    "PartitionedModel",
    "PartitionedTensor",
    "PartitionedTrainer",
    "RandomPartitionedTensor",
    "ScalePartitionedTensor",
    "export_onnx",
    "export_subnetwork",
    "fit",
    "partitionify",
]
__version__ = "0.1.0"
