"""The optional extras: which ``pip install 'partition-fx[EXTRA]'`` provides which import, and the one refusal of a
feature whose extra is missing (:func:`require`), in one line naming the install, before anything is written.

No torch here: the command line asks before it loads torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import PartitionDependencyError

EXTRAS = {
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "sqlalchemy": "mlflow",  # MLflow's database store (sqlite under the run directory)
    "alembic": "mlflow",
    "lightning": "lightning",
    "optuna": "optuna",
    "flwr": "federated",
    "transformers": "hf",
}
"""The extra that installs each optional import."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported; a module blocked in ``sys.modules`` is not).

    >>> installed("json"), installed("no_such_module_here")
    (True, False)
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is not a package; a module set to None in sys.modules
        return False


def import_extra(feature: str, module: str) -> ModuleType:
    """``module`` imported for ``feature``; if it cannot be (not installed, or broken), the one-line refusal of
    :func:`require`.

    >>> import_extra("reading JSON", "json").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(feature, module) from None


def require(feature: str, *modules: str) -> None:
    """Refuse ``feature`` in one line naming the ``pip install`` of the first of ``modules`` that is missing.

    >>> require("reading JSON", "json")
    >>> require("logging to mlflow", "no_such_module_here")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionDependencyError: logging to mlflow needs no_such_module_here, which is not ...
    """
    for module in modules:
        if not installed(module):
            raise _missing(feature, module)


def _missing(feature: str, module: str) -> PartitionDependencyError:
    extra = EXTRAS.get(module)
    how = f"pip install 'partition-fx[{extra}]'" if extra else f"pip install {module}"
    return PartitionDependencyError(f"{feature} needs {module}, which is not installed: {how}")
