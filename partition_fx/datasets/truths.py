"""What the built-in datasets' images were drawn under, in :class:`~partition_fx.transforms.AffineAugmentation`'s units
(rotation in radians, translations in normalised coordinates, ``scale`` as a log-scale half-width): the truths a
learned range on them is judged by, and the ranges an oracle fixes.

The loaders draw their images by these same constants (``splits.fixed_angles`` by :data:`MAX_ROTATION`,
``scaledigits`` by :data:`MAX_ZOOM`, ``drawndigits`` by :data:`DRAWN_MAX_ZOOM`, ``write_scattered_digits`` by
:func:`scattered_digits_ranges`), and the
registry records each named dataset's truth from them (``NamedDataset.true_ranges``), so a truth is written once.
This module imports no torch.

>>> scattered_digits_ranges()["scale"] == math.log(14 / 7) / 2
True
"""

from __future__ import annotations

import math

MAX_ROTATION = math.pi
"""A rotated dataset's angles (``rotdigits``, ``rotcifar10``, ...) are uniform on [-MAX_ROTATION, MAX_ROTATION],
one per image: the truth of a learned rotation range is every angle."""

MAX_ZOOM = 2.0
"""``scaledigits``' zooms are log-uniform on [1/MAX_ZOOM, MAX_ZOOM] about the middle size: the truth of a learned
isotropic scale range is log(MAX_ZOOM), as LILA's ScaledMNIST."""


DRAWN_MAX_ZOOM = math.sqrt(2.0)
"""``drawndigits``' zooms are log-uniform on [1/DRAWN_MAX_ZOOM, DRAWN_MAX_ZOOM]: the truth of a learned isotropic
scale range is log(DRAWN_MAX_ZOOM) (0.347), narrow enough that the augmentation's views at it stay legible and
uncut at 28 px."""


def scattered_digits_ranges(
    size: int = 20, side_range: tuple[int, int] = (7, 14), max_shift: int = 3
) -> dict[str, float]:
    """The truth of ``write_scattered_digits(root, size, side_range, max_shift)``'s folder (its defaults by
    default): shifts of up to ``max_shift`` pixels, ``translation_x``/``translation_y`` = ``max_shift / (size /
    2)``; sides log-uniform on ``side_range``, ``scale`` = ``log(max / min) / 2`` (the zoom's log half-width about
    the geometric middle size); no ``rotation``.

    >>> scattered_digits_ranges()
    {'translation_x': 0.3, 'translation_y': 0.3, 'scale': 0.34657359027997264, 'rotation': 0.0}
    """
    low, high = side_range
    return {
        "translation_x": max_shift / (size / 2),
        "translation_y": max_shift / (size / 2),
        "scale": math.log(high / low) / 2,
        "rotation": 0.0,
    }
