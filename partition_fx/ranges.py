"""The ranges an affine augmentation learns: their names, the bounds they are learned within and where learning
starts, and the two rules on them, each written once here. **A bound must be > 0** (:func:`learning_bounds`) and
**a start must lie within its bound** (:func:`learning_start`).

``transforms.AffineAugmentation`` asks these rules, and so do ``JobSpec.max_range`` and ``partition-fx train
--max-range``/``--init``, which word a :class:`~partition_fx.errors.RangeError` with their own names for the
options. No torch here: the command line refuses a bad bound or start before torch loads. Ranges live in float32
(an ``nn.Parameter``); :func:`float32` rounds a number as torch stores it.

The ranges are in the coefficient units of ``transforms.affine.GENERATORS``, by name ``choices.RANGE_NAMES``.

>>> DEFAULT_MAX_RANGE["rotation"] == math.pi, WIDE_START["scale_x"]
(True, 0.2)
>>> learning_start("zero", learning_bounds(generators="augerino"))
{'translation_x': 0.0, 'translation_y': 0.0, 'rotation': 0.0, 'scale': 0.0, 'stretch': 0.0, 'shear': 0.0}
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

from ._validation import check_choice, check_real
from .choices import AFFINE_GENERATORS, GENERATOR_SETS, RANGE_NAMES, RANGE_STARTS
from .errors import PartitionArgumentError, RangeError

# Default bounds on |range| enforced by ``AffineAugmentation.constrain_``, in the coefficient units of GENERATORS.
DEFAULT_MAX_RANGE: dict[str, float] = {
    # Normalised coordinates span [-1, 1], so 1.0 shifts by half the image; beyond that most of the
    # content leaves the frame and the samples are mostly padding.
    "translation_x": 1.0,
    "translation_y": 1.0,
    # Radians. Rotations are periodic, so [-pi, pi] already covers every angle; a larger range only
    # re-weights angles and is not identifiable.
    "rotation": math.pi,
    # exp(s * G) stretches the sampling grid by e^s, i.e. zooms the image by e^-s: log 2 allows
    # anything from half to double size, enough for natural-image augmentation without degenerate maps.
    "scale_x": math.log(2.0),
    "scale_y": math.log(2.0),
    # The symmetric shear generator stretches one diagonal by e^s and squeezes the other by e^-s;
    # bounded like the scales for the same reason.
    "shear": math.log(2.0),
    "scale": math.log(2.0),
    # The stretch is the shear turned by 45 degrees (x by e^s, y by e^-s): bounded as the shear.
    "stretch": math.log(2.0),
}
assert tuple(DEFAULT_MAX_RANGE) == RANGE_NAMES

# ``init="wide"``, the default: every range away from 0, where the LML's gradient is exactly 0 and a range leaves
# only by a random walk, and none where the transform destroys the image, so that the evidence can shrink what the
# data does not hold (docs/history.md, "The first wide default"). Every angle (a rotation
# keeps the content), an eighth of the image's width of shift, zooms, stretch and shear of about 20%.
WIDE_START: dict[str, float] = {
    "translation_x": 0.25,
    "translation_y": 0.25,
    "rotation": math.pi,
    "scale_x": 0.2,
    "scale_y": 0.2,
    "shear": 0.2,
    "scale": 0.2,
    "stretch": 0.2,
}
assert tuple(WIDE_START) == RANGE_NAMES


def float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even), as ``float(torch.tensor(value,
    dtype=torch.float32))`` reads it back: what a range stored in float32 is. A value beyond float32's largest
    rounds to an infinity, as torch's does.

    >>> float32(math.pi), float32(0.25), float32(1e39)
    (3.1415927410125732, 0.25, inf)
    """
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # rounds past float32's largest finite value
        return math.copysign(math.inf, value)


def generator_names(generators: Sequence[str] | str) -> tuple[str, ...]:
    """The ranges' names for ``generators``: a named set of ``choices.GENERATOR_SETS``, or a sequence of names
    of ``choices.RANGE_NAMES``, each once.

    >>> generator_names("augerino")[3:], generator_names(["rotation", "shear"])
    (('scale', 'stretch', 'shear'), ('rotation', 'shear'))
    >>> generator_names(["rotate"])
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: generators has unknown names ['rotate']; choose from (...)
    """
    if isinstance(generators, str) and generators in GENERATOR_SETS:
        return GENERATOR_SETS[generators]
    if isinstance(generators, str) or not isinstance(generators, Sequence) or len(generators) == 0:
        raise PartitionArgumentError(
            f"generators must be a non-empty sequence of names from {RANGE_NAMES}, or one of the sets "
            f"{', '.join(map(repr, GENERATOR_SETS))}, got {generators!r}"
        )
    unknown = [g for g in generators if g not in RANGE_NAMES]
    if unknown:
        raise PartitionArgumentError(f"generators has unknown names {unknown}; choose from {RANGE_NAMES}")
    duplicates = sorted({g for g in generators if list(generators).count(g) > 1})
    if duplicates:
        raise PartitionArgumentError(f"generators lists {duplicates} more than once; give each generator once")
    return tuple(generators)


def learning_bounds(
    max_range: Mapping[str, float] | None = None, generators: Sequence[str] | str = AFFINE_GENERATORS
) -> dict[str, float]:
    """The bound each range of ``generators`` is learned within (``AffineAugmentation.constrain_`` keeps it in
    [-bound, bound]): ``max_range``'s where it names the range, else :data:`DEFAULT_MAX_RANGE`'s. **A bound must be
    > 0**: a range bounded at 0 cannot be learned. This is the one place that rule is written: the transform asks
    it, and so do ``JobSpec.max_range`` and ``partition-fx train --max-range``, which word a
    :class:`~partition_fx.errors.RangeError` with their own names for the bound.

    >>> learning_bounds({"rotation": 1.0}, generators=["rotation", "shear"])
    {'rotation': 1.0, 'shear': 0.6931471805599453}
    >>> learning_bounds({"shear": 0})
    Traceback (most recent call last):
    ...
    partition_fx.errors.RangeError: max_range['shear'] must be > 0, got 0.0
    """
    names = generator_names(generators)
    bounds = {name: DEFAULT_MAX_RANGE[name] for name in names}
    for name, bound in _per_generator(max_range or {}, names, "max_range").items():
        if not bound > 0:
            raise RangeError(f"max_range[{name!r}] must be > 0, got {bound}", "max_range", name, bound)
        bounds[name] = bound
    return bounds


def learning_start(
    init: float | Mapping[str, float] | str = "wide", bounds: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Where each range's learning starts for ``AffineAugmentation``'s ``init``: a named start
    (``choices.RANGE_STARTS``: :data:`WIDE_START`, 0, or the bound, each clipped to its bound), one number for
    every range, or a mapping, every range it does not name at 0; within ``bounds`` (:func:`learning_bounds`,
    whose keys are the generators; the default generators' default bounds when None). **A start must lie within
    its bound**, ``|start| <= bound``; ranges live in float32, so the bound as float32 reads it back
    (:func:`float32`) counts as within (pi -> 3.1415927...), so that ``init=other.hyperparameters()`` always
    works. This is the one place that rule is written: the transform asks it, and so does ``partition-fx train
    --init``, which words a :class:`~partition_fx.errors.RangeError` with its options.

    >>> bounds = learning_bounds({"rotation": 1.0}, generators=["rotation", "shear"])
    >>> learning_start({"rotation": 0.5}, bounds)
    {'rotation': 0.5, 'shear': 0.0}
    >>> learning_start("wide", bounds)  # rotation's wide start, pi, clipped to its bound
    {'rotation': 1.0, 'shear': 0.2}
    >>> learning_start({"rotation": float32(math.pi)})["rotation"]  # a range learned up to its bound, pi
    3.1415927410125732
    >>> learning_start({"rotation": 1.5}, bounds)
    Traceback (most recent call last):
    ...
    partition_fx.errors.RangeError: init for 'rotation' is 1.5, outside the bound [-1.0, 1.0]; ...
    """
    bounds = learning_bounds() if bounds is None else dict(bounds)
    names = tuple(bounds)
    if isinstance(init, str):
        check_choice("init", init, RANGE_STARTS)
        named = {"bounds": bounds, "zero": dict.fromkeys(bounds, 0.0), "wide": WIDE_START}[init]
        return {name: min(named[name], bounds[name]) for name in names}
    if isinstance(init, Mapping):
        given = _per_generator(init, names, "init")
    else:
        given = dict.fromkeys(names, check_real("init", init))
    for name, value in given.items():  # in the order given: the first a caller named is the one refused
        bound = bounds[name]
        if abs(value) > bound and abs(value) > float32(bound):
            raise RangeError(
                f"init for {name!r} is {value}, outside the bound [-{bound}, {bound}]; "
                f"pass a smaller init or raise max_range={{{name!r}: ...}}",
                "init",
                name,
                value,
                bound,
            )
    return {name: given.get(name, 0.0) for name in names}


def _per_generator(values: Mapping[str, float], generators: tuple[str, ...], name: str) -> dict[str, float]:
    """``values`` (the keyword ``name``: ``max_range``, ``init``) as finite floats, each of a range of
    ``generators``."""
    if not isinstance(values, Mapping):
        raise PartitionArgumentError(f"{name} must be a mapping from generator name to number, got {values!r}")
    out = {}
    for key, value in values.items():
        if key not in generators:
            raise PartitionArgumentError(
                f"{name} has key {key!r}, which is not one of this module's generators {generators}; "
                f"remove it or add it to generators"
            )
        out[key] = check_real(f"{name}[{key!r}]", value)
    return out
