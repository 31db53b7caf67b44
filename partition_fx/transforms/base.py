"""``HyperparameterModule``: the base class of every module whose parameters are hyperparameters."""

from __future__ import annotations

from torch import nn

from ..errors import PartitionNotImplementedError


class HyperparameterModule(nn.Module):
    """A module whose parameters are hyperparameters psi, learned by the partitioned marginal likelihood.

    ``partitionify`` never partitions them (they are the same in every subnetwork) and traces the module
    as one call; ``fit`` steps them with the hyperparameter optimiser only, never with the model's.
    Subclasses implement ``hyperparameters()`` (plain-Python values for reports) and may override
    ``constrain_()`` to project their parameters back into documented bounds after each hyper step.
    """

    def hyperparameters(self) -> dict[str, float | list[float]]:
        """The current hyperparameter values as plain floats/lists (for logs and ``report.json``)."""
        raise PartitionNotImplementedError(f"{type(self).__name__} must implement hyperparameters()")

    def constrain_(self) -> None:
        """Clamp the parameters into their documented bounds, in place (called after each hyper step)."""


def outermost_hyperparameter_modules(root: nn.Module | None) -> list[tuple[str, HyperparameterModule]]:
    """``(name, module)`` for every ``HyperparameterModule`` in ``root``'s tree that is not inside another
    one (``root`` itself has the name ``""``).

    >>> outermost_hyperparameter_modules(nn.Sequential(nn.Linear(2, 2)))
    []
    """
    found: list[tuple[str, HyperparameterModule]] = []
    for name, module in root.named_modules() if root is not None else ():
        inside = any(outer == "" or name.startswith(outer + ".") for outer, _ in found)
        if isinstance(module, HyperparameterModule) and not inside:
            found.append((name, module))
    return found
