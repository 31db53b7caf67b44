"""Datasets for the training command and the examples, loaded whole into memory.

Every loader returns a :class:`DatasetSplits`: a fixed, seeded train/test split of float32 inputs, with int64
class targets (classification) or float32 targets of shape ``(N, 1)`` (regression). Nothing is downloaded.

* :func:`digits` -- scikit-learn's bundled 8x8 digits (1797 images) drawn into the centre of a larger canvas.
* :func:`rotdigits` -- the same images and split, each rotated by a fixed random angle (a RotMNIST analogue).
* :func:`image_folder` -- a torchvision ``ImageFolder``-style folder, with or without ``train/``/``test/``.
* :func:`write_scattered_digits` -- writes an image folder of digits at random positions and sizes.
* :func:`input_selection` -- the synthetic regression task of the paper's input-selection experiment.
* :func:`load_dataset` -- one of the names above, or a folder path.

Randomness comes only from ``numpy.random.default_rng([seed, stream])`` with a separate stream per purpose
(split, angles, function, samples), never from a global RNG, so the same arguments give identical tensors
and, e.g., the rotation angles do not change when ``test_fraction`` does.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from .errors import PartitionArgumentError, PartitionError

__all__ = [
    "DatasetSplits",
    "digits",
    "image_folder",
    "input_selection",
    "load_dataset",
    "rotdigits",
    "write_scattered_digits",
]

# One numpy stream per purpose (the second entry of the seed sequence), so that changing one use of
# randomness (e.g. the split) never changes another (e.g. the angles).
_SPLIT_STREAM = 0
_ANGLE_STREAM = 1
_FUNCTION_STREAM = 2
_TRAIN_INPUT_STREAM = 3
_TRAIN_NOISE_STREAM = 4
_TEST_INPUT_STREAM = 5
_TEST_NOISE_STREAM = 6
_PLACEMENT_STREAM = 7

_NUM_DIGITS = 1797
_MIN_DIGITS_SIZE = 8
_NUM_SINES = 16  # terms of the input-selection target function


@dataclass(frozen=True)
class DatasetSplits:
    """A dataset's fixed train/test split, in memory.

    ``num_classes`` is None for regression. ``input_shape`` is one example's shape (no batch dimension).
    ``info`` holds extras specific to a loader (indices, angles, class names, informative inputs...).

    >>> splits = input_selection(num_train=4, num_test=2, num_inputs=3, num_informative=1)
    >>> len(splits.train), len(splits.test), splits.input_shape, splits.num_classes
    (4, 2, (3,), None)
    """

    train: TensorDataset
    test: TensorDataset
    num_classes: int | None
    input_shape: tuple[int, ...]
    name: str
    description: str
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Argument checks


def _check_int(name: str, value: object, minimum: int) -> int:
    # bool is an int subclass, but digits(size=True) is certainly a mistake
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PartitionArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise PartitionArgumentError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _check_fraction(test_fraction: object) -> float:
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise PartitionArgumentError(f"test_fraction must be a number strictly between 0 and 1, got {test_fraction!r}")
    if not 0.0 < float(test_fraction) < 1.0:
        raise PartitionArgumentError(
            f"test_fraction must be strictly between 0 and 1 (e.g. 0.2), got {test_fraction}; "
            "both the train and the test split need examples"
        )
    return float(test_fraction)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


# ---------------------------------------------------------------------------------------------------------------
# Splitting


def _stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int, class_names: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): ``test_fraction * n_c`` (nearest) of each class c held out, clamped to 1..n_c-1.

    Both index arrays come back in a seeded shuffled order, not grouped by class, so contiguous slices (e.g.
    the data chunks of partitioned training) hold every class in expectation.

    >>> train, test = _stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), 0.25, seed=0)
    >>> sorted(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])[test].tolist()), len(train)
    ([0, 1], 7)
    """
    rng = _rng(seed, _SPLIT_STREAM)
    train_parts, test_parts = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < 2:
            label = class_names[int(c)] if class_names is not None else str(c)
            raise PartitionError(
                f"class {label!r} has {len(members)} example(s); splitting needs at least 2 per class "
                "(one for train, one for test). Add examples, remove the class, or provide train/ and test/ folders"
            )
        members = rng.permutation(members)
        # nearest, halves up (Python's round() would send halves to even), then at least 1 each side
        num_test = min(max(math.floor(test_fraction * len(members) + 0.5), 1), len(members) - 1)
        test_parts.append(members[:num_test])
        train_parts.append(members[num_test:])
    return rng.permutation(np.concatenate(train_parts)), rng.permutation(np.concatenate(test_parts))


# ---------------------------------------------------------------------------------------------------------------
# Digits and rotated digits


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 digits as (images (1797, 8, 8) in [0, 1], targets int64); cached, do not modify."""
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
    images, _ = _digits_raw()
    side = _digit_side(size)
    small = F.interpolate(images.unsqueeze(1), size=(side, side), mode="bilinear", align_corners=False, antialias=False)
    margin = (size - side) // 2
    canvas = torch.zeros(len(images), 1, size, size)
    canvas[:, :, margin : margin + side, margin : margin + side] = small
    return canvas.clamp_(0.0, 1.0)


def _rotate(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image (N, C, H, W) about its centre by its angle in radians, counter-clockwise as displayed.

    Bilinear sampling; what comes from outside the image is 0, which is the digits' background.

    >>> image = torch.zeros(1, 1, 5, 5)
    >>> image[0, 0, 2, 4] = 1.0  # right of the centre
    >>> _rotate(image, torch.tensor([math.pi / 2]))[0, 0].nonzero().tolist()  # now above it
    [[0, 2]]
    """
    cos, sin, zero = angles.cos(), angles.sin(), torch.zeros_like(angles)
    # affine_grid maps output coordinates to input ones; with y pointing down the screen this matrix
    # makes the content turn counter-clockwise by +angle as displayed
    theta = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], 1)
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    rotated = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return rotated.clamp_(0.0, 1.0)  # bilinear weights sum to 1 only up to rounding


def _digits_angles(seed: int) -> torch.Tensor:
    """The rotdigits angle of each of the 1797 digits (in scikit-learn's order), uniform on [-pi, pi]."""
    return torch.from_numpy(_rng(seed, _ANGLE_STREAM).uniform(-math.pi, math.pi, _NUM_DIGITS)).float()


def _digits_splits(name: str, size: int, channels: int, test_fraction: float, seed: int, rotate: bool) -> DatasetSplits:
    size = _check_int("size", size, _MIN_DIGITS_SIZE)
    channels = _check_int("channels", channels, 1)
    test_fraction = _check_fraction(test_fraction)
    seed = _check_int("seed", seed, 0)
    _, targets = _digits_raw()
    x = _digit_canvas(size)
    info: dict[str, Any] = {}
    if rotate:
        angles = _digits_angles(seed)
        x = _rotate(x, angles)
    train_idx, test_idx = _stratified_split(targets.numpy(), test_fraction, seed)
    train_idx, test_idx = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    info["train_indices"], info["test_indices"] = train_idx, test_idx
    if rotate:
        info["train_angles"], info["test_angles"] = angles[train_idx], angles[test_idx]
    x = x.expand(-1, channels, -1, -1)  # grey to `channels` identical channels; indexing below copies
    side = _digit_side(size)
    description = (
        f"scikit-learn 8x8 digits upsampled (bilinear) to {side}x{side} in the centre of a {size}x{size} zero "
        f"canvas, {channels} channel(s), values in [0, 1] with background 0"
        + (", each rotated by a fixed angle uniform on [-pi, pi]" if rotate else "")
        + f"; stratified split {len(train_idx)} train / {len(test_idx)} test (seed {seed})"
    )
    return DatasetSplits(
        train=TensorDataset(x[train_idx], targets[train_idx]),
        test=TensorDataset(x[test_idx], targets[test_idx]),
        num_classes=10,
        input_shape=(channels, size, size),
        name=name,
        description=description,
        info=info,
    )


def digits(size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0) -> DatasetSplits:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes) on a ``size`` x ``size`` canvas.

    Geometry: each digit, scaled from 0..16 to [0, 1], is upsampled (bilinear, ``align_corners=False``, no
    antialias) to ``s x s`` with ``s`` the largest integer <= size/sqrt(2) such that ``size - s`` is even
    (18 for size 28), and placed exactly in the centre of a zero canvas, so a rotation about the centre
    never cuts it (see :func:`rotdigits`). Values stay in [0, 1] with background exactly 0 (no mean/std
    normalisation: rotation pads with 0, which must equal the background). The grey image is repeated to
    ``channels``. The split is stratified: ``test_fraction * n_c`` (nearest, halves up) images of each class
    c go to test, chosen with ``seed``. ``info`` holds ``train_indices``/``test_indices`` into scikit-learn's order.

    >>> splits = digits(size=12)
    >>> len(splits.train), len(splits.test), tuple(splits.train[0][0].shape), splits.num_classes
    (1438, 359, (1, 12, 12), 10)
    """
    return _digits_splits("digits", size, channels, test_fraction, seed, rotate=False)


def rotdigits(size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0) -> DatasetSplits:
    """:func:`digits` with every image (train and test) rotated by its own fixed angle, uniform on [-pi, pi].

    Same images, canvas and split as ``digits(size, channels, test_fraction, seed)``; the angles are drawn
    per image (in scikit-learn's order, from a stream of ``seed`` separate from the split's, so an image's
    angle does not depend on ``test_fraction``). Rotation is about the canvas centre, counter-clockwise as
    displayed, with ``affine_grid``/``grid_sample`` (bilinear, zeros padding, ``align_corners=False``).
    ``info`` adds ``train_angles``/``test_angles`` (radians, aligned with the splits).

    >>> splits = rotdigits(size=12)
    >>> bool(splits.info["train_angles"].abs().max() <= math.pi), len(splits.test)
    (True, 359)
    """
    return _digits_splits("rotdigits", size, channels, test_fraction, seed, rotate=True)


# ---------------------------------------------------------------------------------------------------------------
# Image folders


def _image_extensions() -> tuple[str, ...]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return tuple(IMG_EXTENSIONS)


def _scan_classes(root: Path) -> dict[str, list[Path]]:
    """``{class name: sorted image files}`` for the class folders of ``root`` (hidden entries ignored)."""
    extensions = _image_extensions()
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise PartitionError(
            f"data folder {root} has no class folders; lay it out as {root}/<class>/<image> "
            f"(or {root}/train/<class>/... and {root}/test/<class>/...)"
        )
    found: dict[str, list[Path]] = {}
    for folder in classes:
        candidates = (p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        files = sorted(p for p in candidates if p.suffix.lower() in extensions)
        if not files:
            raise PartitionError(
                f"class folder {folder} has no images (looked for {', '.join(extensions)}); add images or remove it"
            )
        found[folder.name] = files
    return found


def _pil_mode(channels: int | None, first_mode: str) -> str:
    """The PIL mode every image is converted to: from ``channels``, else the first image's (made 8-bit)."""
    from PIL import Image

    if channels == 1:
        return "L"
    if channels == 3:
        return "RGB"
    if first_mode in ("L", "LA", "RGB", "RGBA"):
        return first_mode
    # "1", "I", "I;16", "F" are grey; palette ("P"), CMYK, YCbCr... are colour
    return "L" if Image.getmodebase(first_mode) == "L" else "RGB"


def _load_images(files: list[Path], size: int | None, channels: int | None) -> torch.Tensor:
    """Load ``files`` as one float32 tensor (N, C, H, W) in [0, 1]."""
    from PIL import Image

    arrays: list[np.ndarray] = []
    mode: str | None = None
    first: tuple[Path, tuple[int, int]] | None = None
    for path in files:
        try:
            with Image.open(path) as img:
                if mode is None:
                    mode = _pil_mode(channels, img.mode)
                img = img.convert(mode)
                if size is not None:
                    img = img.resize((size, size), Image.Resampling.BILINEAR)
                elif first is None:
                    first = (path, img.size)
                elif img.size != first[1]:
                    raise PartitionError(
                        f"images differ in size: {first[0]} is {first[1][0]}x{first[1][1]} but {path} is "
                        f"{img.size[0]}x{img.size[1]} (width x height); pass size=... to resize all images"
                    )
                arrays.append(np.asarray(img, dtype=np.uint8))
        except OSError as error:  # includes PIL.UnidentifiedImageError
            raise PartitionError(f"cannot read image {path}: {error}; remove or replace the file") from error
    stacked = np.stack(arrays)
    if stacked.ndim == 3:  # single-band modes have no channel axis
        stacked = stacked[..., None]
    return torch.from_numpy(stacked).permute(0, 3, 1, 2).float().div_(255.0).contiguous()


def image_folder(
    root: str | Path,
    size: int | None = None,
    channels: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DatasetSplits:
    """Images in torchvision's ``ImageFolder`` layout (``root/<class>/<image>``), loaded into memory.

    If ``root/train`` and ``root/test`` both exist they are the split (same class folders required,
    ``test_fraction`` unused); otherwise root's images are split stratified by class, ``test_fraction * n_c``
    (nearest) of each class to test (at least 1, and at least 1 left for train), chosen with ``seed``.
    Classes are the sorted folder names (targets index them). Images are resized to ``size`` x ``size``
    (bilinear) if ``size`` is given, else they must all have one size; they are converted to ``channels``
    (1: "L", 3: "RGB") or else to the first image's mode, and scaled to [0, 1]. Both splits come in a seeded
    shuffled order (not grouped by class).
    ``info`` holds ``classes`` and ``train_files``/``test_files`` (aligned with the splits).

    >>> import tempfile
    >>> from PIL import Image
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     for label in ("a", "b"):
    ...         (Path(tmp) / label).mkdir()
    ...         for i in range(5):
    ...             Image.new("L", (4, 4), color=40 * i).save(Path(tmp) / label / f"{i}.png")
    ...     splits = image_folder(tmp)
    >>> len(splits.train), len(splits.test), splits.input_shape, splits.info["classes"]
    (8, 2, (1, 4, 4), ['a', 'b'])
    """
    root = Path(root)
    if size is not None:
        size = _check_int("size", size, 1)
    if channels is not None and channels not in (1, 3):
        raise PartitionArgumentError(
            f"channels must be 1 (greyscale), 3 (RGB) or None (the first image's mode), got {channels!r}"
        )
    test_fraction = _check_fraction(test_fraction)
    seed = _check_int("seed", seed, 0)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise PartitionError(f"data folder {root} {what}; pass a folder laid out as <folder>/<class>/<image>")

    train_dir, test_dir = root / "train", root / "test"
    if train_dir.is_dir() != test_dir.is_dir():
        have, missing = (train_dir, test_dir) if train_dir.is_dir() else (test_dir, train_dir)
        raise PartitionError(
            f"data folder {root} has {have.name}/ but no {missing.name}/; add {missing} with the same class "
            f"folders, or move the class folders up into {root} to have them split with test_fraction"
        )
    if train_dir.is_dir():
        train_found, test_found = _scan_classes(train_dir), _scan_classes(test_dir)
        if list(train_found) != list(test_found):
            only_train = sorted(set(train_found) - set(test_found))
            only_test = sorted(set(test_found) - set(train_found))
            raise PartitionError(
                f"class folders of {train_dir} and {test_dir} differ (only in train: {only_train}, only in test: "
                f"{only_test}); both must hold the same classes"
            )
        classes = list(train_found)
        files = [p for found in (train_found, test_found) for paths in found.values() for p in paths]
        labels = np.array([i for found in (train_found, test_found) for i, ps in enumerate(found.values()) for _ in ps])
        num_train = sum(len(paths) for paths in train_found.values())
        # shuffled like the stratified split, so contiguous slices of train are not single classes
        rng = _rng(seed, _SPLIT_STREAM)
        train_idx = rng.permutation(num_train)
        test_idx = num_train + rng.permutation(len(files) - num_train)
        layout = f"train/ and test/ folders: {len(train_idx)} train / {len(test_idx)} test (order seed {seed})"
    else:
        found = _scan_classes(root)
        classes = list(found)
        files = [p for paths in found.values() for p in paths]
        labels = np.array([i for i, paths in enumerate(found.values()) for _ in paths])
        train_idx, test_idx = _stratified_split(labels, test_fraction, seed, classes)
        layout = f"stratified split {len(train_idx)} train / {len(test_idx)} test (seed {seed})"
    x, y = _load_images(files, size, channels), torch.from_numpy(labels).long()
    train_x, train_y = x[torch.from_numpy(train_idx)], y[torch.from_numpy(train_idx)]
    test_x, test_y = x[torch.from_numpy(test_idx)], y[torch.from_numpy(test_idx)]
    train_files, test_files = [files[i] for i in train_idx], [files[i] for i in test_idx]

    input_shape = tuple(train_x.shape[1:])
    shape_text = f"{input_shape[0]}x{input_shape[1]}x{input_shape[2]}"
    return DatasetSplits(
        train=TensorDataset(train_x, train_y),
        test=TensorDataset(test_x, test_y),
        num_classes=len(classes),
        input_shape=input_shape,
        name=root.resolve().name,
        description=f"image folder {root}: {len(classes)} classes, {shape_text} images in [0, 1]; {layout}",
        info={"classes": classes, "train_files": train_files, "test_files": test_files},
    )


def write_scattered_digits(
    root: str | Path,
    size: int = 20,
    side_range: tuple[int, int] = (7, 14),
    max_shift: int = 3,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Write the 1797 digits, each at its own random size and position, as an image folder for :func:`image_folder`.

    Each digit is upsampled (bilinear) to a square of side ``s``, with ``log s`` uniform on
    ``log side_range``, and pasted on a ``size`` x ``size`` zero canvas centred, then shifted by a whole
    number of pixels uniform in ``[-max_shift, max_shift]`` along each axis. So the labels are invariant to
    translation and scale over known ranges, not to rotation. Files go to ``root/train/<digit>/`` and
    ``root/test/<digit>/`` (PNG, greyscale), with the stratified split of :func:`digits`; ``root`` must not
    exist or be empty. Returns (and writes to ``root/invariances.json``) the data's true ranges in the units of
    :class:`~partition_fx.transforms.AffineAugmentation`: ``translation_x``/``translation_y`` =
    ``max_shift / (size / 2)`` (normalised coordinates) and ``scale`` = ``log(max / min) / 2`` (the zoom's
    log half-width around the geometric middle size).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     truth = write_scattered_digits(tmp, size=12, side_range=(4, 8), max_shift=2)
    ...     splits = image_folder(tmp)
    >>> len(splits.train), len(splits.test), splits.input_shape, round(truth["translation_x"], 3)
    (1438, 359, (1, 12, 12), 0.333)
    """
    import json

    from PIL import Image

    root = Path(root)
    size = _check_int("size", size, 4)
    max_shift = _check_int("max_shift", max_shift, 0)
    low, high = (_check_int("side_range", v, 2) for v in side_range)
    if low > high or high + 2 * max_shift > size:
        raise PartitionArgumentError(
            f"side_range {side_range} and max_shift {max_shift} do not fit a {size}x{size} canvas: need "
            f"min <= max and max + 2 * max_shift <= size"
        )
    test_fraction = _check_fraction(test_fraction)
    seed = _check_int("seed", seed, 0)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise PartitionError(f"{root} exists and is not an empty folder; pass a new or empty folder")
    images, targets = _digits_raw()
    rng = _rng(seed, _PLACEMENT_STREAM)
    sides = np.rint(np.exp(rng.uniform(math.log(low), math.log(high), len(images)))).astype(int)
    shifts = rng.integers(-max_shift, max_shift + 1, size=(len(images), 2))
    train_idx, test_idx = _stratified_split(targets.numpy(), test_fraction, seed)
    split_of = {int(i): "train" for i in train_idx} | {int(i): "test" for i in test_idx}
    for i, (image, side, (dy, dx)) in enumerate(zip(images, sides, shifts)):
        small = F.interpolate(image[None, None], size=(int(side), int(side)), mode="bilinear", align_corners=False)
        canvas = torch.zeros(size, size)
        top, left = (size - side) // 2 + dy, (size - side) // 2 + dx
        canvas[top : top + side, left : left + side] = small[0, 0].clamp(0.0, 1.0)
        folder = root / split_of[i] / str(int(targets[i]))
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (canvas * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    truth = {
        "translation_x": max_shift / (size / 2),
        "translation_y": max_shift / (size / 2),
        "scale": math.log(high / low) / 2,
        "rotation": 0.0,
        "size": size,
        "side_range": [low, high],
        "max_shift": max_shift,
        "seed": seed,
    }
    (root / "invariances.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


# ---------------------------------------------------------------------------------------------------------------
# Synthetic input selection


def _input_selection_function(num_informative: int, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The noiseless target f: (N, D) -> (N,), reading only the first ``num_informative`` columns.

    ``f(x) = sqrt(2 / J) * sum_j sin(w_j . x[:k] + b_j)`` with J = 16, ``w_j ~ N(0, I_k / k)`` (so each
    projection has unit variance under x ~ N(0, I): smooth, a few bends per input) and ``b_j ~ U[0, 2 pi)``;
    each term has variance about 1/2, hence the scale makes Var f about 1.

    >>> f = _input_selection_function(1, seed=0)
    >>> x = torch.zeros(2, 3)
    >>> x[1, 1:] = 5.0  # the uninformative inputs do not matter
    >>> bool(f(x)[0] == f(x)[1])
    True
    """
    rng = _rng(seed, _FUNCTION_STREAM)
    weights = torch.from_numpy(rng.normal(0.0, 1.0 / math.sqrt(num_informative), (num_informative, _NUM_SINES)))
    phases = torch.from_numpy(rng.uniform(0.0, 2 * math.pi, _NUM_SINES))
    scale = math.sqrt(2.0 / _NUM_SINES)

    def f(x: torch.Tensor) -> torch.Tensor:
        informative = x[:, :num_informative].double()  # float64 so f does not depend on the batch's rounding
        return (scale * torch.sin(informative @ weights + phases).sum(1)).float()

    return f


def input_selection(
    num_train: int = 3000,
    num_test: int = 1000,
    num_informative: int = 3,
    num_inputs: int = 10,
    noise: float = 0.1,
    seed: int = 0,
) -> DatasetSplits:
    """Synthetic regression where only the first ``num_informative`` of ``num_inputs`` inputs matter.

    ``x ~ N(0, I_num_inputs)``, ``y = f(x[:num_informative]) + noise * eps`` with ``eps ~ N(0, 1)`` and f a
    fixed (per ``seed``) random sum of 16 sines of unit-variance random projections, scaled to variance about
    1. The paper's appendix (I.5) gives only the sizes (3000 train, a fresh 1000 for test); the generative
    process here is this package's. Train and test are independent samples; x and the noise come from
    separate streams, so a smaller ``num_train`` gives a prefix of a larger one. Targets have shape (N, 1).
    ``info`` holds ``informative`` (input indices), ``noise`` and the noiseless ``train_clean``/``test_clean``.

    >>> splits = input_selection(num_train=50, num_test=20)
    >>> tuple(splits.train.tensors[0].shape), tuple(splits.test.tensors[1].shape), splits.info["informative"]
    ((50, 10), (20, 1), [0, 1, 2])
    """
    num_train = _check_int("num_train", num_train, 1)
    num_test = _check_int("num_test", num_test, 1)
    num_informative = _check_int("num_informative", num_informative, 1)
    num_inputs = _check_int("num_inputs", num_inputs, 1)
    if num_informative > num_inputs:
        raise PartitionArgumentError(
            f"num_informative ({num_informative}) must be at most num_inputs ({num_inputs}); "
            "raise num_inputs or lower num_informative"
        )
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise) or noise < 0:
        raise PartitionArgumentError(f"noise must be a finite standard deviation >= 0 (e.g. 0.1), got {noise!r}")
    seed = _check_int("seed", seed, 0)
    f = _input_selection_function(num_informative, seed)

    def sample(count: int, input_stream: int, noise_stream: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(_rng(seed, input_stream).standard_normal((count, num_inputs))).float()
        clean = f(x)
        eps = torch.from_numpy(_rng(seed, noise_stream).standard_normal(count)).float()
        return x, (clean + float(noise) * eps).unsqueeze(1), clean.unsqueeze(1)

    train_x, train_y, train_clean = sample(num_train, _TRAIN_INPUT_STREAM, _TRAIN_NOISE_STREAM)
    test_x, test_y, test_clean = sample(num_test, _TEST_INPUT_STREAM, _TEST_NOISE_STREAM)
    return DatasetSplits(
        train=TensorDataset(train_x, train_y),
        test=TensorDataset(test_x, test_y),
        num_classes=None,
        input_shape=(num_inputs,),
        name="input_selection",
        description=(
            f"synthetic regression: x ~ N(0, I_{num_inputs}), y = f(x[:{num_informative}]) + {noise} * N(0, 1), "
            f"f a random sum of {_NUM_SINES} sines (seed {seed}); inputs {num_informative}..{num_inputs - 1} are "
            f"pure noise; {num_train} train / {num_test} test"
        ),
        info={
            "informative": list(range(num_informative)),
            "noise": float(noise),
            "train_clean": train_clean,
            "test_clean": test_clean,
        },
    )


# ---------------------------------------------------------------------------------------------------------------
# By name


_NAMED: dict[str, Callable[..., DatasetSplits]] = {
    "digits": digits,
    "rotdigits": rotdigits,
    "input_selection": input_selection,
}


def load_dataset(name_or_path: str, **kwargs: Any) -> DatasetSplits:
    """The dataset called ``name_or_path`` ("digits", "rotdigits", "input_selection") or an image folder path.

    Names win over folders of the same name; write ``./digits`` for a folder called ``digits``. ``kwargs``
    go to the loader (:func:`digits`, :func:`rotdigits`, :func:`input_selection` or :func:`image_folder`).

    >>> load_dataset("input_selection", num_train=8, num_test=4, num_inputs=4).input_shape
    (4,)
    """
    loader = _NAMED.get(str(name_or_path))
    if loader is None:
        if not Path(name_or_path).is_dir():
            raise PartitionError(
                f"unknown dataset {name_or_path!r}: not one of {', '.join(_NAMED)}, and no folder of that name "
                "exists; pass one of those names or the path of an image folder laid out as <folder>/<class>/<image>"
            )
        if "root" in kwargs:
            raise PartitionArgumentError(
                f"pass the folder once: as name_or_path ({name_or_path!r}) or as root=, not both"
            )
        loader = image_folder
        kwargs = {"root": name_or_path, **kwargs}
    accepted = list(inspect.signature(loader).parameters)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise PartitionArgumentError(
            f"{loader.__name__} does not take {', '.join(unknown)}; it accepts {', '.join(accepted)}"
        )
    return loader(**kwargs)
