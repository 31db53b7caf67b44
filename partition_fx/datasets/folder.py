"""Image folders: :func:`image_folder` loads torchvision's ``ImageFolder`` layout (with or without ``train/``
and ``test/``) into memory; :func:`write_scattered_digits` writes one (digits at random sizes and positions).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from .._validation import check_image_options, check_int, check_open_unit
from ..errors import PartitionArgumentError, PartitionError
from .images import (
    DEFAULT_MEMORY_BUDGET,
    DecodedImages,
    ImagePreprocessing,
    UndecodableImage,
    decode_pixels,
    decoded_bytes,
    empty_split,
    pil_mode,
    pixels_to_tensor,
    rotate_images,
    size_mismatch,
    undecodable,
    unreadable_image,
)
from .sklearn_digits import raw_digits
from .splits import (
    BOTH_SPLITS_HINT,
    PLACEMENT_STREAM,
    SPLIT_STREAM,
    SPLITS,
    DatasetSplits,
    Split,
    check_split,
    fixed_angles,
    seeded_rng,
    stratified_split,
    wanted,
)
from .truths import scattered_digits_ranges


def image_extensions() -> tuple[str, ...]:
    """The suffixes of the files read as images (lower case; a file's suffix is compared in lower case), in an
    image folder and by ``partition-fx predict`` given a folder: torchvision's ``ImageFolder``'s.

    >>> image_extensions()[:3]
    ('.jpg', '.jpeg', '.png')
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return tuple(IMG_EXTENSIONS)


def describe_skipped(files: Sequence[Path]) -> str:
    """The files skipped for not being images, in words: how many and their suffixes (the first five), or their
    names when there are at most three.

    >>> describe_skipped([Path("a/readme.txt")]), describe_skipped([Path(f"{i}.csv") for i in range(5)])
    ('1 file that is not an image (readme.txt)', '5 files that are not images (.csv)')
    """
    if len(files) <= 3:
        listed = ", ".join(p.name for p in files)
    else:
        suffixes = sorted({p.suffix or "no suffix" for p in files})
        listed = ", ".join(suffixes[:5]) + (", ..." if len(suffixes) > 5 else "")
    what = "file that is not an image" if len(files) == 1 else "files that are not images"
    return f"{len(files)} {what} ({listed})"


def _scan_classes(root: Path, skipped: list[Path]) -> dict[str, list[Path]]:
    """``{class name: sorted image files}`` for the class folders of ``root`` (hidden entries ignored); the files
    in them that are not images by their suffix are added to ``skipped``."""
    extensions = image_extensions()
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise PartitionError(
            f"data folder {root} has no class folders; lay it out as {root}/<class>/<image> "
            f"(or {root}/train/<class>/... and {root}/test/<class>/...)"
        )
    found: dict[str, list[Path]] = {}
    for folder in classes:
        candidates = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]
        files = sorted(p for p in candidates if p.suffix.lower() in extensions)
        skipped.extend(sorted(p for p in candidates if p.suffix.lower() not in extensions))
        if not files:
            raise PartitionError(
                f"class folder {folder} has no images (looked for {', '.join(extensions)}); add images or remove it"
            )
        found[folder.name] = files
    return found


def _check_two_classes(classes: list[str], where: str, how: str) -> None:
    """Refuse a folder of one class (``where``: "data folder X has", ``how``: where the others go)."""
    if len(classes) == 1:
        raise PartitionError(
            f"{where} one class folder ({classes[0]}/): a classifier needs at least two; add a folder of images for "
            f"each other class, {how}"
        )


def _header(path: Path) -> tuple[str, tuple[int, int]]:
    """The PIL mode and (width, height) of the image at ``path`` (read from its header; nothing is decoded); a mode
    no decoding handles is refused naming the file (``images.undecodable``)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            problem = undecodable(img)  # a mode no decoding scales to [0, 1]: refused now, not mid-run
            if problem is not None:
                raise UndecodableImage(problem)
            return img.mode, img.size
    except OSError as error:  # includes PIL.UnidentifiedImageError
        raise unreadable_image(path, error) from error


def _check_headers(files: list[Path], size: tuple[int, int] | None) -> None:
    """Refuse now, naming the file, what would stop a streamed run later: a file that is not an image, or (when
    the images are not resized) one whose size is not ``size``. Headers only: nothing is decoded."""
    for path in files:
        _, found = _header(path)
        if size is not None and found != size:
            raise size_mismatch(files[0], size, path, found)


class ImageFiles:
    """The :class:`~partition_fx.datasets.images.ImageReader` of image files: ``files[i]`` opened, with class
    ``labels[i]``."""

    def __init__(self, files: list[Path], labels: np.ndarray) -> None:
        self.files = files
        self.labels = labels

    def __call__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        with Image.open(self.files[index]) as img:
            img.load()
            return img, int(self.labels[index])

    def name(self, index: int) -> str:
        return str(self.files[index])


def _load_images(files: list[Path], size: int | None, mode: str) -> torch.Tensor:
    """Load ``files`` as one float32 tensor (N, C, H, W) in [0, 1], decoded as a streamed folder decodes them
    (``to_tensor``: converted to PIL ``mode``, resized to ``size`` if given), held as 8-bit pixels until all are."""
    from PIL import Image

    arrays: list[np.ndarray] = []
    first: tuple[Path, tuple[int, int]] | None = None
    for path in files:
        try:
            with Image.open(path) as img:
                if size is None:
                    first = first or (path, img.size)
                    if img.size != first[1]:
                        raise size_mismatch(first[0], first[1], path, img.size)
                arrays.append(decode_pixels(img, mode, size))
        except OSError as error:  # includes PIL.UnidentifiedImageError
            raise unreadable_image(path, error) from error
    return pixels_to_tensor(np.stack(arrays)).contiguous()


def image_folder(
    root: str | Path,
    size: int | None = None,
    channels: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    split: Split | None = None,
    rotate: bool = False,
    in_memory: bool | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> DatasetSplits:
    """Images in torchvision's ``ImageFolder`` layout (``root/<class>/<image>``), of any size.

    If ``root/train`` and ``root/test`` both exist they are the split (same class folders required,
    ``test_fraction`` unused); otherwise root's images are split stratified by class, ``test_fraction * n_c``
    (nearest) of each class to test (at least 1, and at least 1 left for train), chosen with ``seed``.
    Classes are the sorted folder names (targets index them). Images are resized to ``size`` x ``size``
    (bilinear) if ``size`` is given, else they must all have one size; they are converted to ``channels``
    (1: "L", 3: "RGB") or else to the first image's mode, and scaled to [0, 1]. Both splits come in a seeded
    shuffled order (not grouped by class).
    ``rotate``: each image turned by its own fixed angle uniform on [-pi, pi] (as ``rotdigits``; angles drawn
    in the folder's file order from ``seed``). ``in_memory``: decode every image once into memory (True), or
    read each as training asks (False: a folder larger than memory trains; the input pipeline's workers decode
    it), or decide by whether the split(s) fit ``memory_budget`` bytes decoded (None).
    ``classes`` are the class folders' names (also ``info["classes"]``), and ``preprocessing`` decodes a new image
    as the folder's images are. ``info`` holds ``classes``, ``train_files``/``test_files`` (aligned with the splits),
    ``skipped_files`` (the files in the class folders whose suffix is not an image's, :func:`image_extensions`:
    not read) and ``streamed``.
    ``split="train"`` or ``"test"`` decodes that split's images alone (every file is still listed, to split
    them and to number the classes) and returns the same tensors; the other split is left empty.

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
    split = check_split(split)
    size, channels = check_image_options(size, channels, own_channels="the first image's mode")
    test_fraction = check_open_unit("test_fraction", test_fraction, hint=BOTH_SPLITS_HINT)
    seed = check_int("seed", seed, 0, noun="an integer")
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise PartitionError(f"data folder {root} {what}; pass a folder laid out as <folder>/<class>/<image>")

    train_dir, test_dir = root / "train", root / "test"
    skipped: list[Path] = []  # files in the class folders that are not images: said, not read
    if train_dir.is_dir() != test_dir.is_dir():
        have, missing = (train_dir, test_dir) if train_dir.is_dir() else (test_dir, train_dir)
        raise PartitionError(
            f"data folder {root} has {have.name}/ but no {missing.name}/; add {missing} with the same class "
            f"folders, or move the class folders up into {root} to have them split with test_fraction"
        )
    if train_dir.is_dir():
        train_found, test_found = _scan_classes(train_dir, skipped), _scan_classes(test_dir, skipped)
        if list(train_found) != list(test_found):
            only_train = sorted(set(train_found) - set(test_found))
            only_test = sorted(set(test_found) - set(train_found))
            raise PartitionError(
                f"class folders of {train_dir} and {test_dir} differ (only in train: {only_train}, only in test: "
                f"{only_test}); both must hold the same classes"
            )
        classes = list(train_found)
        _check_two_classes(classes, f"data folders {train_dir} and {test_dir} have", "to both")
        files = [p for found in (train_found, test_found) for paths in found.values() for p in paths]
        labels = np.array([i for found in (train_found, test_found) for i, ps in enumerate(found.values()) for _ in ps])
        num_train = sum(len(paths) for paths in train_found.values())
        # shuffled like the stratified split, so contiguous slices of train are not single classes
        rng = seeded_rng(seed, SPLIT_STREAM)
        train_idx = rng.permutation(num_train)
        test_idx = num_train + rng.permutation(len(files) - num_train)
        layout = f"train/ and test/ folders: {len(train_idx)} train / {len(test_idx)} test (order seed {seed})"
    else:
        found = _scan_classes(root, skipped)
        classes = list(found)
        _check_two_classes(classes, f"data folder {root} has", f"as {root}/<class>/<image>")  # before the split
        files = [p for paths in found.values() for p in paths]
        labels = np.array([i for i, paths in enumerate(found.values()) for _ in paths])
        train_idx, test_idx = stratified_split(labels, test_fraction, seed, classes)
        layout = f"stratified split {len(train_idx)} train / {len(test_idx)} test (seed {seed})"
    asked = [idx for which, idx in zip(SPLITS, (train_idx, test_idx)) if wanted(split, which)]
    rows = np.sort(np.concatenate(asked))
    first_mode, _ = _header(files[0])  # the folder's first file fixes every image's mode, whichever split is asked
    _, first_size = _header(files[rows[0]])  # and the split's first its size (unless resized)
    mode = pil_mode(channels, first_mode)
    width, height = (size, size) if size is not None else first_size
    input_shape = (len(mode), height, width)
    angles = fixed_angles(len(files), seed) if rotate else None
    if in_memory is None:
        in_memory = decoded_bytes(len(rows), input_shape) <= memory_budget
    if not in_memory:
        _check_headers([files[i] for i in rows], None if size is not None else first_size)
    if in_memory:
        # decoded in the folder's order, as if every file were (so the first file fixes every image's mode and
        # size errors name the same files), but only the files of the split(s) asked for
        x = _load_images([files[i] for i in rows], size, mode)
        if angles is not None:
            x = rotate_images(x, angles[torch.from_numpy(rows)])
        row_of = np.zeros(len(files), dtype=np.int64)
        row_of[rows] = np.arange(len(rows))
    y = torch.from_numpy(labels).long()

    def take(which: Split, idx: np.ndarray) -> Dataset:
        idx = idx if wanted(split, which) else idx[:0]  # a split not asked for: empty, with the same shapes
        if in_memory:
            return TensorDataset(x[torch.from_numpy(row_of[idx])], y[torch.from_numpy(idx)])
        if not len(idx):
            return empty_split(input_shape)
        read = ImageFiles([files[i] for i in idx], labels[idx])
        return DecodedImages(read, len(idx), mode, size, None if angles is None else angles[idx])

    train_files, test_files = [files[i] for i in train_idx], [files[i] for i in test_idx]
    shape_text = f"{input_shape[0]}x{input_shape[1]}x{input_shape[2]}"
    how = "decoded into memory" if in_memory else "read from disk as training asks"
    return DatasetSplits(
        train=take("train", train_idx),  # type: ignore[arg-type]
        test=take("test", test_idx),  # type: ignore[arg-type]
        num_classes=len(classes),
        input_shape=input_shape,
        name=("rot" if rotate else "") + root.resolve().name,
        description=(
            f"image folder {root}: {len(classes)} classes, {shape_text} images in [0, 1]"
            + (", each rotated by a fixed angle uniform on [-pi, pi]" if rotate else "")
            + f"; {layout}; {how}"
        ),
        info={
            "classes": classes,
            "train_files": train_files,
            "test_files": test_files,
            "skipped_files": skipped,
            "streamed": not in_memory,
        },
        split=split,
        classes=tuple(classes),
        preprocessing=ImagePreprocessing(mode, len(mode), height, width),
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
    :class:`~partition_fx.transforms.AffineAugmentation` (:func:`~partition_fx.datasets.scattered_digits_ranges`:
    ``translation_x``/``translation_y`` = ``max_shift / (size / 2)`` in normalised coordinates, ``scale`` =
    ``log(max / min) / 2``, the zoom's log half-width around the geometric middle size) and how it was drawn.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     truth = write_scattered_digits(tmp, size=12, side_range=(4, 8), max_shift=2)
    ...     splits = image_folder(tmp)
    >>> len(splits.train), len(splits.test), splits.input_shape, round(truth["translation_x"], 3)
    (1438, 359, (1, 12, 12), 0.333)
    """
    from PIL import Image

    root = Path(root)
    size = check_int("size", size, 4, noun="an integer")
    max_shift = check_int("max_shift", max_shift, 0, noun="an integer")
    low, high = (check_int("side_range", v, 2, noun="an integer") for v in side_range)
    if low > high or high + 2 * max_shift > size:
        raise PartitionArgumentError(
            f"side_range {side_range} and max_shift {max_shift} do not fit a {size}x{size} canvas: need "
            f"min <= max and max + 2 * max_shift <= size"
        )
    test_fraction = check_open_unit("test_fraction", test_fraction, hint=BOTH_SPLITS_HINT)
    seed = check_int("seed", seed, 0, noun="an integer")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise PartitionError(f"{root} exists and is not an empty folder; pass a new or empty folder")
    images, targets = raw_digits()
    rng = seeded_rng(seed, PLACEMENT_STREAM)
    sides = np.rint(np.exp(rng.uniform(math.log(low), math.log(high), len(images)))).astype(int)
    shifts = rng.integers(-max_shift, max_shift + 1, size=(len(images), 2))
    train_idx, test_idx = stratified_split(targets.numpy(), test_fraction, seed)
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
        **scattered_digits_ranges(size, (low, high), max_shift),
        "size": size,
        "side_range": [low, high],
        "max_shift": max_shift,
        "seed": seed,
    }
    (root / "invariances.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth
