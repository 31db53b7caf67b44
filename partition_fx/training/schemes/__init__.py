"""Iteration schemes: which steps one iteration of partitioned training takes (``fused=``, ``every_partition=``).

Each is an :class:`IterationScheme`, registered here by name; a new one is one file and one entry of
:data:`SCHEMES`. Running examples of several subnetworks in one pass (``per_example="one_pass"``) is not a
scheme: it is how the model runs the routed forward of the every-partition and fused schemes.
"""

from __future__ import annotations

from ...errors import PartitionArgumentError
from .alternating import Alternating, EveryPartition
from .base import IterationScheme
from .fused import Fused, FusedEveryPartition
from .phases import Iterations

SCHEMES: dict[str, type[IterationScheme]] = {
    cls.name: cls for cls in (Alternating, EveryPartition, Fused, FusedEveryPartition)
}
"""The schemes by the name the configuration picks them with."""


def iteration_scheme(name: str) -> IterationScheme:
    """The registered scheme called ``name``.

    >>> type(iteration_scheme("fused")).__name__
    'Fused'
    >>> iteration_scheme("one-pass")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: no iteration scheme 'one-pass'; the registered ones are ...
    """
    if name not in SCHEMES:
        known = ", ".join(repr(n) for n in SCHEMES)
        raise PartitionArgumentError(f"no iteration scheme {name!r}; the registered ones are {known}")
    return SCHEMES[name]()


def scheme_name(fused: bool, every_partition: bool) -> str:
    """The scheme today's two options name: ``fused`` and ``every_partition`` compose.

    >>> scheme_name(fused=True, every_partition=True)
    'fused-every-partition'
    """
    return {
        (False, False): Alternating.name,
        (False, True): EveryPartition.name,
        (True, False): Fused.name,
        (True, True): FusedEveryPartition.name,
    }[(fused, every_partition)]


__all__ = [
    "SCHEMES",
    "Alternating",
    "EveryPartition",
    "Fused",
    "FusedEveryPartition",
    "IterationScheme",
    "Iterations",
    "iteration_scheme",
    "scheme_name",
]
