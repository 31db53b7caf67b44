"""partition-fx: learn hyperparameters in one training run by partitioning a network.

Public API::

    partitionify(model, num_partitions, proportions, *, scheme, default, seed, config) -> PartitionedModel
    export_subnetwork(pmodel, k) -> nn.Module of the original class
    export_onnx(pmodel, path, example_inputs, *, subnetwork, dynamic_batch) -> Path
    fit(pmodel, dataset, *, hyper, likelihood, steps, ...) -> FitResult      (partition_fx.training)

Learnable hyperparameter modules live in ``partition_fx.transforms``; datasets in ``partition_fx.datasets``.

The package registers its models with timm (``fixup_resnet8``.., ``cifar_wrn16_4``..) as soon as both it and
timm are imported, in either order. Its names are loaded on first use (PEP 562), so that importing it, and
``partition-fx --help``, does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import PartitionArgumentError as PartitionArgumentError
    from .errors import PartitionError as PartitionError
    from .errors import PartitionTypeError as PartitionTypeError
    from .export import export_onnx as export_onnx
    from .export import export_subnetwork as export_subnetwork
    from .fx.config import ParameterRule as ParameterRule
    from .fx.config import PartitionConfig as PartitionConfig
    from .fx.params import PartitionedTensor as PartitionedTensor
    from .fx.params import RandomPartitionedTensor as RandomPartitionedTensor
    from .fx.params import ScalePartitionedTensor as ScalePartitionedTensor
    from .fx.partitioned_model import PartitionedModel as PartitionedModel
    from .fx.rewrite import partitionify as partitionify
    from .training import FitResult as FitResult
    from .training import PartitionedTrainer as PartitionedTrainer
    from .training import fit as fit

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
__version__ = "0.2.0"
"""The package's version (``pyproject.toml`` reads it from here): ``partition-fx --version``, and every
``report.json`` and ``export.json`` records the one that wrote it."""

_HOME = {
    "ParameterRule": "fx.config",
    "PartitionConfig": "fx.config",
    "PartitionArgumentError": "errors",
    "PartitionError": "errors",
    "PartitionTypeError": "errors",
    "export_onnx": "export",
    "export_subnetwork": "export",
    "PartitionedTensor": "fx.params",
    "RandomPartitionedTensor": "fx.params",
    "ScalePartitionedTensor": "fx.params",
    "PartitionedModel": "fx.partitioned_model",
    "partitionify": "fx.rewrite",
    "FitResult": "training",
    "PartitionedTrainer": "training",
    "fit": "training",
}
"""Each public name's module."""


def __getattr__(name: str) -> Any:
    """A public name (its module imported now, with the models registered), or a submodule not yet imported."""
    if name in _HOME:
        importlib.import_module(f"{__name__}.models")  # registers the package's models with timm
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _RegisterModelsWithTimm:
    """A meta path finder that waits for ``import timm`` and, once timm is loaded, imports ``partition_fx.models``
    (which registers the package's models with timm), then steps aside."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "timm":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("timm")  # by the other finders
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            load_timm = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                load_timm(module)
                importlib.import_module(f"{__name__}.models")

            loader.exec_module = exec_module
        return spec


if "timm" in sys.modules:  # torch is loaded already: registering now costs little
    importlib.import_module(f"{__name__}.models")
else:
    sys.meta_path.insert(0, _RegisterModelsWithTimm())
