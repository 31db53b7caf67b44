"""Argument checks shared by the whole package: each returns the checked value or raises one
:class:`~partition_fx.errors.PartitionError` that names the argument, what it got and what is allowed.

``PartitionArgumentError`` is also a ``ValueError`` and ``PartitionTypeError`` a ``TypeError``, so callers'
usual ``except ValueError`` keeps working.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import PartitionArgumentError, PartitionTypeError, first_line

PROPORTION_TOLERANCE = 1e-6
MAX_SEED = 2**63 - 1
"""The largest seed the package takes: a signed 64-bit int, what every torch generator accepts."""

if TYPE_CHECKING:
    import torch


def _is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch: this module is imported by the command
    line's checks, which answer before torch is loaded, and no value can be a tensor before then."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return tensor is not None and isinstance(value, tensor)


def check_int(name: str, value: object, minimum: int = 1, *, hint: str = "", noun: str = "an int") -> int:
    """``value`` as an int >= ``minimum``; bool is refused (``steps=True`` is certainly a mistake).

    ``noun`` is how the message names the expected type (the datasets write "an integer").

    Example::

        >>> check_int("steps", 3)
        3
        >>> check_int("steps", 0)
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: steps must be an int >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise PartitionArgumentError(f"{name} must be {noun} >= {minimum}, got {value!r}{hint}")
    return int(value)


def check_image_options(size: object, channels: object, *, own_channels: str) -> tuple[int | None, int | None]:
    """An image loader's ``size`` (an int >= 1, or None: the data's own) and ``channels`` (1, 3, or None:
    ``own_channels`` says whose), as given.

    Example::

        >>> check_image_options(32, None, own_channels="the data's own")
        (32, None)
        >>> check_image_options(None, 2, own_channels="the data's own")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: channels must be 1 (greyscale), 3 (RGB) or None (...), got 2
    """
    if size is not None:
        size = check_int("size", size, 1, noun="an integer")
    if channels is not None and channels not in (1, 3):
        raise PartitionArgumentError(
            f"channels must be 1 (greyscale), 3 (RGB) or None ({own_channels}), got {channels!r}"
        )
    return size, channels


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is a bool: a truthy ``"False"`` or ``"no"`` would silently switch an option on."""
    if not isinstance(value, bool):
        raise PartitionTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_real(name: str, value: object) -> float:
    """``value`` as a finite float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise PartitionArgumentError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_open_unit(name: str, value: object, *, hint: str = "") -> float:
    """``value`` as a float strictly between 0 and 1 (a probability or a fraction of the data)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        raise PartitionArgumentError(f"{name} must be a number strictly between 0 and 1, got {value!r}{hint}")
    return float(value)


def check_seed(name: str, value: object) -> int:
    """``value`` as a seed in 0..MAX_SEED, or a clear error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PartitionTypeError(f"{name} must be an int in 0..2**63-1, got {value!r} ({type(value).__name__})")
    if not 0 <= int(value) <= MAX_SEED:
        raise PartitionArgumentError(f"{name} must be an int in 0..2**63-1, got {value}")
    return int(value)


def check_choice(name: str, value: object, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise PartitionArgumentError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
    return str(value)


def check_callable(name: str, value: object, example: str) -> None:
    """``value`` is None or callable (an optimiser or scheduler factory, a callback)."""
    if value is not None and not callable(value):
        raise PartitionTypeError(f"{name} must be a callable such as {example}, or None; got {value!r}")


def check_num_partitions(num_partitions: object) -> int:
    """C as an int in 1..255 (assignments are stored as bytes)."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, numbers.Integral):
        raise PartitionTypeError(
            f"num_partitions must be an int >= 1, got {num_partitions!r} ({type(num_partitions).__name__})"
        )
    if int(num_partitions) < 1:
        raise PartitionArgumentError(f"num_partitions must be >= 1, got {num_partitions}")
    if int(num_partitions) > 255:
        raise PartitionArgumentError(f"num_partitions must be <= 255, got {num_partitions}")
    return int(num_partitions)


def check_proportions(proportions: Sequence[float] | None, num_partitions: int) -> tuple[float, ...]:
    """Check proportions (``None`` = equal shares): C non-negative finite numbers summing to 1."""
    if proportions is None:
        return tuple(1.0 / num_partitions for _ in range(num_partitions))
    if _is_tensor(proportions):
        proportions = proportions.tolist()  # type: ignore[attr-defined]
    if isinstance(proportions, (str, bytes)) or not isinstance(proportions, Sequence):
        raise PartitionTypeError(f"proportions must be a sequence of {num_partitions} numbers, got {proportions!r}")
    if len(proportions) != num_partitions:
        raise PartitionArgumentError(
            f"proportions has {len(proportions)} entries but num_partitions={num_partitions}; "
            f"give one proportion per partition (or proportions=None for equal shares)"
        )
    values: list[float] = []
    for i, p in enumerate(proportions):
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise PartitionTypeError(f"proportions[{i}] must be a number, got {p!r}")
        p = float(p)
        if not math.isfinite(p) or p < 0:
            raise PartitionArgumentError(f"proportions[{i}] = {p} must be finite and >= 0")
        values.append(p)
    total = math.fsum(values)
    if abs(total - 1.0) > PROPORTION_TOLERANCE:
        raise PartitionArgumentError(
            f"proportions must sum to 1 (within {PROPORTION_TOLERANCE}), got {tuple(values)} summing to {total!r}"
        )
    return tuple(values)


def check_directory(name: str, value: object) -> Path | None:
    """A directory argument (it need not exist yet), refused before anything is written to it."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise PartitionTypeError(f"{name} must be a path (str or os.PathLike) or None, got {type(value).__name__}")
    if os.fspath(value) == "":
        raise PartitionArgumentError(f"{name} must not be empty; pass '.' to mean the current directory")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise PartitionArgumentError(f"{name} {str(path)!r} exists and is not a directory; pass a directory")
    return path


def check_device(value: object) -> torch.device | None:
    """``device`` as a ``torch.device`` that can hold a model here, or a clear error."""
    import torch

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise PartitionTypeError(
            f"device must be a string such as 'cpu' or 'cuda:0', a torch.device or None, got {value!r}"
        )
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as e:  # ValueError: an index beyond int64 ("Overflow when unpacking")
        raise PartitionArgumentError(
            f"device {value!r} is not a torch device ({e}); use e.g. 'cpu' or 'cuda'"
        ) from None
    if device.type == "meta":
        raise PartitionArgumentError(
            "device 'meta' holds no values: the model would lose its weights; use 'cpu' or 'cuda'"
        )
    try:
        torch.empty(0, device=device)
    except Exception as e:  # no driver, an index beyond the devices, torch built without it, no backend at all
        raise PartitionArgumentError(f"device {value!r} is not usable here ({first_line(e)}); use 'cpu'") from None
    return device


def check_positive(name: str, value: object, *, hint: str = "") -> float:
    """``value`` as a finite float > 0 (a temperature, a bound).

    Example::

        >>> check_positive("temperature", 0.1)
        0.1
        >>> check_positive("temperature", 0, hint="; e.g. 0.1")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: temperature must be a finite number > 0, got 0; e.g. 0.1
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < math.inf:
        raise PartitionArgumentError(f"{name} must be a finite number > 0, got {value!r}{hint}")
    return float(value)


def check_concentration(value: object, *, option: str | None = None) -> float:
    """``value`` as the Dirichlet concentration alpha of the federated clients' skew: a finite number > 0 (0.1:
    most clients hold one group; large: close to i.i.d.). The one check of alpha: the command line's (which
    names its ``option``) and ``federated.dirichlet_split``'s.

    Example::

        >>> check_concentration(0.1)
        0.1
        >>> check_concentration(0.0, option="--alpha")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: --alpha 0.0: the Dirichlet concentration must be > 0 and ...
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < math.inf:
        if option is not None:
            raise PartitionArgumentError(
                f"{option} {value}: the Dirichlet concentration must be > 0 and finite (0.1: most clients hold "
                "one group)"
            )
        raise PartitionArgumentError(f"alpha must be > 0 and finite (the Dirichlet concentration), got {value!r}")
    return float(value)


def check_subnetwork(value: object, num_partitions: int) -> int:
    """A subnetwork index as an int in 0..C (``None`` means C): an int or a one-element integer tensor.

    Example::

        >>> import torch
        >>> check_subnetwork(None, 3), check_subnetwork(torch.tensor(1), 3)
        (3, 1)
        >>> try:
        ...     check_subnetwork(4, 3)
        ... except PartitionArgumentError as e:
        ...     print(e)
        subnetwork must be in 0..3 (0 = all defaults, 3 = final model), got 4
    """
    if value is None:
        return num_partitions
    tensor = _is_tensor(value)
    integral_tensor = (
        tensor
        and value.numel() == 1  # type: ignore[attr-defined]
        and not value.is_floating_point()  # type: ignore[attr-defined]
        and not value.is_complex()  # type: ignore[attr-defined]
        and value.dtype != sys.modules["torch"].bool  # type: ignore[attr-defined]
    )
    if tensor and not integral_tensor:
        raise PartitionTypeError(
            f"subnetwork must be an int in 0..{num_partitions}, got a tensor of shape "
            f"{tuple(value.shape)} and dtype {value.dtype}"  # type: ignore[attr-defined]
        )
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise PartitionTypeError(
            f"subnetwork must be an int in 0..{num_partitions}, got {value!r} ({type(value).__name__})"
        )
    k = operator.index(value)
    if not 0 <= k <= num_partitions:
        raise PartitionArgumentError(
            f"subnetwork must be in 0..{num_partitions} (0 = all defaults, {num_partitions} = final model), got {k}"
        )
    return k


def check_partition(value: object, num_partitions: int) -> int:
    """A partition index as an int in 1..C (partitions are 1-based; 0 is no partition).

    Example::

        >>> check_partition(2, 3)
        2
        >>> check_partition(0, 3)
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: partition must be an int in 1..3, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_partitions:
        raise PartitionArgumentError(f"partition must be an int in 1..{num_partitions}, got {value!r}")
    return value


def check_given_partition(step: str, k: int | None) -> int:
    """The partition a ``step`` given its examples trains or scores: it must be given with them.

    Example::

        >>> check_given_partition("parameter_step", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: parameter_step(indices=...) needs the partition k ...
    """
    if k is None:
        raise PartitionArgumentError(f"{step}(indices=...) needs the partition k the examples are for: pass k as well")
    return k


def check_per_example(name: str, values: torch.Tensor, batch: int, num_partitions: int) -> torch.Tensor:
    """One subnetwork (or partition) index per example: an integer tensor of shape (batch,) with values in
    0..C, as int64.

    Example::

        >>> import torch
        >>> check_per_example("subnetwork", torch.tensor([0, 2]), 2, 2)
        tensor([0, 2])
        >>> check_per_example("subnetwork", torch.tensor([0, 3]), 2, 2)
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: subnetwork values must be in 0..2, got 0..3
    """
    if values.is_floating_point() or values.is_complex() or values.dtype == sys.modules["torch"].bool:
        raise PartitionTypeError(f"{name} per example must be an integer tensor, got {values.dtype}")
    if values.shape != (batch,):
        raise PartitionArgumentError(
            f"{name} per example must have shape ({batch},) (the batch size), got {tuple(values.shape)}"
        )
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > num_partitions):
        raise PartitionArgumentError(
            f"{name} values must be in 0..{num_partitions}, got {int(values.min())}..{int(values.max())}"
        )
    return values.long()


def batch_pools(chunk_sizes: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The smallest data each kind of step draws a batch from, as (chunk k, its examples), given the examples of
    chunks 1..C: a parameter step of partition 1 draws from chunk 1 alone (partition k from chunks 1..k); a
    hyperparameter step from one chunk k >= 2 (None with one chunk: there are no hyperparameter steps).

    >>> batch_pools([115, 14, 15])
    ((1, 115), (2, 14))
    >>> batch_pools([100])
    ((1, 100), None)
    """
    later = chunk_sizes[1:]
    k = 2 + min(range(len(later)), key=lambda i: later[i]) if later else None
    return (1, chunk_sizes[0]), (None if k is None else (k, chunk_sizes[k - 1]))


def check_batches_fit(chunk_sizes: Sequence[int], batch_size: int, hyper_batch_size: int, names: Sequence[str]) -> None:
    """Refuse a batch larger than the data it is drawn from (:func:`batch_pools`): batches are drawn with
    replacement, so a larger one only repeats examples, at the cost of its size. ``names``: how the refusal names
    the parameter and the hyperparameter steps' batch sizes (options or keywords).

    >>> check_batches_fit([115, 14, 15], 64, 14, ("--batch-size", "--hyper-batch-size"))
    >>> check_batches_fit([115, 14, 15], 5000, 14, ("--batch-size", "--hyper-batch-size"))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --batch-size 5000 is larger than the 115 examples of chunk 1, which ...
    """
    parameter, hyper = batch_pools(chunk_sizes)
    steps = [(names[0], batch_size, parameter, "partition 1's parameter steps draw from")]
    if hyper is not None:
        steps.append((names[1], hyper_batch_size, hyper, "hyperparameter steps draw from"))
    for name, size, (k, examples), what in steps:
        if size > examples:
            raise PartitionArgumentError(
                f"{name} {size} is larger than the {examples} examples of chunk {k}, which {what} (a batch drawn "
                f"from fewer examples only repeats them); pass {name} {examples} or less, or train on more data"
            )


def check_fits_in_memory(options: str, what: str, nbytes: int) -> None:
    """Refuse sizes whose data alone exceed this machine's memory, before trying to allocate them.

    ``options`` names what the user chose (e.g. ``"--image-size 10000"``), ``what`` the data it sizes.

    Example::

        >>> check_fits_in_memory("--image-size 28", "1797 image(s)", 1797 * 28 * 28 * 4)
        >>> check_fits_in_memory("--image-size 10**9", "1 image(s)", 2**80)
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: --image-size 10**9: 1 image(s) alone would take ...
    """
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): leave it to the allocator
        return
    if nbytes > memory:
        raise PartitionArgumentError(
            f"{options}: {what} alone would take {nbytes / 2**30:,.0f} GiB, more than this machine's "
            f"{memory / 2**30:,.0f} GiB of memory; choose smaller values"
        )
