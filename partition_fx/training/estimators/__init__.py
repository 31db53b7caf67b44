"""Hyperparameter-gradient estimators: which chunks a hyperparameter step scores (``hyper_chunks=``).

Each is a :class:`HyperEstimator` in a file of its own, registered here by name; a new one is one file and
one entry of :data:`ESTIMATORS`.
"""

from __future__ import annotations

from ...errors import PartitionArgumentError
from .all_chunks import AllChunks
from .base import HyperBatches, HyperEstimator
from .one_chunk import OneChunk

ESTIMATORS: dict[str, type[HyperEstimator]] = {cls.name: cls for cls in (OneChunk, AllChunks)}
"""The estimators by the name the configuration picks them with."""


def hyper_estimator(name: str) -> HyperEstimator:
    """The registered estimator called ``name``.

    >>> type(hyper_estimator("all")).__name__
    'AllChunks'
    >>> hyper_estimator("both")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: no hyperparameter estimator 'both'; the registered ones are 'one', 'all'
    """
    if name not in ESTIMATORS:
        known = ", ".join(repr(n) for n in ESTIMATORS)
        raise PartitionArgumentError(f"no hyperparameter estimator {name!r}; the registered ones are {known}")
    return ESTIMATORS[name]()


__all__ = ["ESTIMATORS", "AllChunks", "HyperBatches", "HyperEstimator", "OneChunk", "hyper_estimator"]
