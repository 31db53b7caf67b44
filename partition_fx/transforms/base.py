"""``HyperparameterModule``: the base class of every module whose parameters are hyperparameters."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from .._validation import check_real
from ..errors import PartitionArgumentError, PartitionNotImplementedError


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


class Widenable:
    """A transform that can draw from its ranges times a factor (:meth:`widened`;
    ``training.objective.objective.widens`` recognises it): its forward draws its coefficients from U[-spread, spread]
    with ``self._spread`` (1 outside the block; per generator where a subclass takes a factor per range,
    :meth:`spread_of`)."""

    _spread: Any = 1.0

    @contextlib.contextmanager
    def widened(self, factor: float | Mapping[str, float]) -> Iterator[None]:
        """Inside the block, ``forward`` draws its transforms from the ranges times ``factor`` (eps ~
        U[-factor, factor]); the ranges themselves, and their gradient, are unchanged. Partitioned training's
        parameter steps use it to train on augmentation wider than the learned one (``train_range_factor``, and
        per range ``train_range_factors``, for a transform whose :meth:`spread_of` takes a mapping).

        >>> import torch
        >>> from partition_fx.transforms import AffineAugmentation
        >>> aug = AffineAugmentation(num_samples=2, generators=["rotation"], init=0.5)
        >>> with aug.widened(2.0):  # rotations drawn from [-1, 1] rad
        ...     aug(torch.randn(3, 1, 8, 8)).shape
        torch.Size([6, 1, 8, 8])
        >>> aug.hyperparameters()
        {'rotation': 0.5}
        """
        previous, self._spread = self._spread, self.spread_of(factor)
        try:
            yield
        finally:
            self._spread = previous

    def spread_of(self, factor: float | Mapping[str, float]) -> Any:
        """What ``forward`` multiplies its coefficients by inside :meth:`widened`: here one number >= 0 for every
        range (a transform with several ranges may take a mapping, each range's own)."""
        if isinstance(factor, Mapping):
            raise PartitionArgumentError(
                f"{type(self).__name__} widens all its ranges alike: pass one factor, not a factor per range"
            )
        factor = check_real("factor", factor)
        if factor < 0:
            raise PartitionArgumentError(f"factor must be >= 0, got {factor}")
        return factor


@runtime_checkable
class WidensRanges(Protocol):
    """What the training layer asks of an input transform whose parameter steps may train on wider ranges than
    it learns (``train_range_factor``): a context in which it draws from its ranges times ``factor``. Any module
    with this method takes part; :class:`Widenable` gives one.

    >>> from partition_fx.transforms import AffineAugmentation, ConcreteDropout
    >>> isinstance(AffineAugmentation(), WidensRanges), isinstance(ConcreteDropout(), WidensRanges)
    (True, False)
    """

    def widened(self, factor: float | Mapping[str, float]) -> AbstractContextManager[None]: ...


@runtime_checkable
class LearnedRanges(Protocol):
    """What the training layer asks of a hyperparameter module with named ranges learned within bounds: their
    names (``generators``), their values (``ranges``, one entry each, and :meth:`range_values`), the bound of
    each (``max_range``) and whether they are fixed. A population (``fit(..., population=N)``) moves such ranges;
    :class:`~partition_fx.transforms.AffineAugmentation` is one, and a module of your own that has these
    attributes takes part the same way.

    >>> from partition_fx.transforms import AffineAugmentation, InputMask
    >>> isinstance(AffineAugmentation(), LearnedRanges), isinstance(InputMask(4), LearnedRanges)
    (True, False)
    """

    generators: Sequence[str]
    ranges: torch.Tensor
    max_range: Mapping[str, float]

    @property
    def is_fixed(self) -> bool: ...

    def range_values(self) -> dict[str, float]: ...


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
