"""scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes): :func:`digits`, :func:`rotdigits`
(each image rotated by a fixed random angle, a RotMNIST analogue), :func:`scaledigits` (each zoomed by a fixed
random log-uniform factor, a ScaledMNIST analogue) and :func:`normalized_digits` (the images ``partition-fx
convert`` verifies a conversion on). Nothing is downloaded.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from .._validation import check_int, check_open_unit
from .images import ImagePreprocessing, rotate_images, zoom_images
from .splits import (
    BOTH_SPLITS_HINT,
    DatasetSplits,
    Split,
    check_split,
    fixed_angles,
    fixed_zooms,
    only_split,
    stratified_split,
)
from .truths import MAX_ZOOM

NUM_DIGITS = 1797
"""How many images scikit-learn's digits hold: the size of ``--data digits`` and ``rotdigits``."""
_MIN_DIGITS_SIZE = 8


@functools.lru_cache(maxsize=1)
def raw_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 digits as (images (1797, 8, 8) in [0, 1], targets int64); cached, do not modify.

    >>> images, targets = raw_digits()
    >>> tuple(images.shape), float(images.max()), targets[:3].tolist()
    ((1797, 8, 8), 1.0, [0, 1, 2])
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32) / 16.0  # pixel values are 0..16
    return images, torch.tensor(data.target, dtype=torch.int64)


def _digit_side(size: int) -> int:
    """Side of the square the digit is drawn in: the largest s <= size/sqrt(2) with size - s even.

    size/sqrt(2) keeps the square's corners inside the canvas at any rotation about the centre; an even
    margin puts the square exactly in the centre, which is the rotation centre.

    >>> _digit_side(28), _digit_side(32), _digit_side(8)
    (18, 22, 4)
    """
    side = math.floor(size / math.sqrt(2))
    return side - (size - side) % 2


def _digit_canvas(size: int) -> torch.Tensor:
    """All 1797 digits as (1797, 1, size, size): upsampled into the central square, zero background."""
    images, _ = raw_digits()
    side = _digit_side(size)
    small = F.interpolate(images.unsqueeze(1), size=(side, side), mode="bilinear", align_corners=False, antialias=False)
    margin = (size - side) // 2
    canvas = torch.zeros(len(images), 1, size, size)
    canvas[:, :, margin : margin + side, margin : margin + side] = small
    return canvas.clamp_(0.0, 1.0)


def _digits_splits(
    name: str,
    size: int,
    channels: int,
    test_fraction: float,
    seed: int,
    split: Split | None,
    rotate: bool,
    zoom: bool = False,
) -> DatasetSplits:
    split = check_split(split)
    size = check_int("size", size, _MIN_DIGITS_SIZE, noun="an integer")
    channels = check_int("channels", channels, 1, noun="an integer")
    test_fraction = check_open_unit("test_fraction", test_fraction, hint=BOTH_SPLITS_HINT)
    seed = check_int("seed", seed, 0, noun="an integer")
    _, targets = raw_digits()
    x = _digit_canvas(size)
    info: dict[str, Any] = {}
    if rotate:
        angles = fixed_angles(NUM_DIGITS, seed)
        x = rotate_images(x, angles)
    if zoom:  # drawn at the middle size, 1/MAX_ZOOM of the safe square, so the largest zoom fills it uncut
        log_scales = fixed_zooms(NUM_DIGITS, seed, MAX_ZOOM)
        x = zoom_images(x, log_scales - math.log(MAX_ZOOM)).clamp_(0.0, 1.0)
    train_rows, test_rows = stratified_split(targets.numpy(), test_fraction, seed)
    train_idx, test_idx = torch.from_numpy(train_rows), torch.from_numpy(test_rows)
    info["train_indices"], info["test_indices"] = train_idx, test_idx
    if rotate:
        info["train_angles"], info["test_angles"] = angles[train_idx], angles[test_idx]
    if zoom:
        info["train_log_scales"], info["test_log_scales"] = log_scales[train_idx], log_scales[test_idx]
    x = x.expand(-1, channels, -1, -1)  # grey to `channels` identical channels; indexing below copies
    side = _digit_side(size)
    description = (
        f"scikit-learn 8x8 digits upsampled (bilinear) to {side}x{side} in the centre of a {size}x{size} zero "
        f"canvas, {channels} channel(s), values in [0, 1] with background 0"
        + (", each rotated by a fixed angle uniform on [-pi, pi]" if rotate else "")
        + (
            f", each zoomed by a fixed factor log-uniform on [1/{MAX_ZOOM:g}, {MAX_ZOOM:g}] about half the square"
            if zoom
            else ""
        )
        + f"; stratified split {len(train_idx)} train / {len(test_idx)} test (seed {seed})"
    )
    both = DatasetSplits(
        train=TensorDataset(x[train_idx], targets[train_idx]),
        test=TensorDataset(x[test_idx], targets[test_idx]),
        num_classes=10,
        input_shape=(channels, size, size),
        name=name,
        description=description,
        info=info,
        classes=tuple(str(digit) for digit in range(10)),
        # a picture of a digit as these are drawn (light on a dark background, in the centre) is read as grey
        preprocessing=ImagePreprocessing("RGB" if channels == 3 else "L", channels, size, size),
    )
    return only_split(both, split)  # every image is in memory already (scikit-learn's): dropping one costs nothing


def digits(
    size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0, split: Split | None = None
) -> DatasetSplits:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes) on a ``size`` x ``size`` canvas.

    Geometry: each digit, scaled from 0..16 to [0, 1], is upsampled (bilinear, ``align_corners=False``, no
    antialias) to ``s x s`` with ``s`` the largest integer <= size/sqrt(2) such that ``size - s`` is even
    (18 for size 28), and placed exactly in the centre of a zero canvas, so a rotation about the centre
    never cuts it (see :func:`rotdigits`). Values stay in [0, 1] with background exactly 0 (no mean/std
    normalisation: rotation pads with 0, which must equal the background). The grey image is repeated to
    ``channels``. The split is stratified: ``test_fraction * n_c`` (nearest, halves up) images of each class
    c go to test, chosen with ``seed``. ``info`` holds ``train_indices``/``test_indices`` into scikit-learn's order.
    ``classes`` are "0".."9"; ``preprocessing`` reads a picture of a digit as grey at ``size`` (light on dark, as
    these digits are drawn).
    ``split="train"`` or ``"test"`` returns that split alone, the same tensors; the other is left empty.

    >>> splits = digits(size=12)
    >>> len(splits.train), len(splits.test), tuple(splits.train[0][0].shape), splits.num_classes
    (1438, 359, (1, 12, 12), 10)
    """
    return _digits_splits("digits", size, channels, test_fraction, seed, split, rotate=False)


def rotdigits(
    size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0, split: Split | None = None
) -> DatasetSplits:
    """:func:`digits` with every image (train and test) rotated by its own fixed angle, uniform on [-pi, pi].

    Same images, canvas and split as ``digits(size, channels, test_fraction, seed, split)``; the angles are drawn
    per image (in scikit-learn's order, from a stream of ``seed`` separate from the split's, so an image's
    angle does not depend on ``test_fraction``). Rotation is about the canvas centre, counter-clockwise as
    displayed, with ``affine_grid``/``grid_sample`` (bilinear, zeros padding, ``align_corners=False``).
    ``info`` adds ``train_angles``/``test_angles`` (radians, aligned with the splits).

    >>> splits = rotdigits(size=12)
    >>> bool(splits.info["train_angles"].abs().max() <= math.pi), len(splits.test)
    (True, 359)
    """
    return _digits_splits("rotdigits", size, channels, test_fraction, seed, split, rotate=True)


def scaledigits(
    size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0, split: Split | None = None
) -> DatasetSplits:
    """:func:`digits` with every image (train and test) zoomed about the canvas centre by its own fixed factor,
    log-uniform on [1/2, 2] (``truths.MAX_ZOOM``) about a digit half the side of ``digits``' square: its largest zoom
    fills that square, so no zoom cuts the digit (a ScaledMNIST analogue with a known truth: an isotropic
    log-scale range of log 2, Augerino's ``scale`` generator). The log-scales come from a stream of ``seed`` of
    their own (``splits.fixed_zooms``); ``info`` adds ``train_log_scales``/``test_log_scales``. At 28 px the digit
    spans 4.5 to 18 pixels.

    >>> splits = scaledigits(size=12)
    >>> bool(splits.info["train_log_scales"].abs().max() <= math.log(2.0)), len(splits.test)
    (True, 359)
    """
    return _digits_splits("scaledigits", size, channels, test_fraction, seed, split, rotate=False, zoom=True)


def normalized_digits(count: int, size: int, channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` digits, each stretched (bilinear) to fill ``size`` x ``size``, normalised to [-1, 1]
    and repeated to ``channels``; with their targets. No canvas, no split: what ``partition-fx convert``
    compares a converted model with the original on.

    >>> x, y = normalized_digits(4, 32)
    >>> tuple(x.shape), float(x.min()), y.tolist()
    ((4, 3, 32, 32), -1.0, [0, 1, 2, 3])
    """
    images, targets = raw_digits()
    x = F.interpolate(images[:count].unsqueeze(1), size=(size, size), mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    return x.expand(-1, channels, -1, -1).contiguous(), targets[:count].clone()
