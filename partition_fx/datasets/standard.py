"""The standard image datasets from a copy already on disk, read by torchvision's own classes with
``download=False``: :func:`standard_dataset` (CIFAR-10, CIFAR-100, MNIST, Fashion-MNIST, SVHN), each also
rotated (``rotate=True``, the paper's RotCIFAR-10 and RotMNIST: a fixed random angle per image).

Nothing is ever downloaded. A missing or malformed copy is refused naming the layout torchvision expects under
the root, the class that reads it, and where the files come from.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import TensorDataset

from .._validation import check_image_options, check_int
from ..errors import PartitionArgumentError, PartitionError
from .images import (
    DEFAULT_MEMORY_BUDGET,
    DecodedImages,
    ImagePreprocessing,
    PairImages,
    empty_split,
    in_memory_or_streamed,
    pil_mode,
)
from .splits import SPLITS, DatasetSplits, Split, check_split, fixed_angles, wanted


@dataclass(frozen=True)
class StandardDataset:
    """How torchvision reads one standard dataset: its class, the files it expects under the root, and its
    images' native shape."""

    name: str
    torchvision_class: str
    layout: str
    channels: int
    size: int
    classes: int
    source: str

    def open(self, root: Path, split: Split) -> Any:
        """torchvision's dataset of ``split`` under ``root`` (never downloading)."""
        import torchvision.datasets

        cls = getattr(torchvision.datasets, self.torchvision_class)
        if self.torchvision_class == "SVHN":
            return cls(str(root), split=split, download=False)
        return cls(str(root), train=split == "train", download=False)


STANDARD_DATASETS = {
    d.name: d
    for d in (
        StandardDataset(
            "cifar10",
            "CIFAR10",
            "ROOT/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}",
            3,
            32,
            10,
            "the python version of https://www.cs.toronto.edu/~kriz/cifar.html (cifar-10-python.tar.gz, unpacked)",
        ),
        StandardDataset(
            "cifar100",
            "CIFAR100",
            "ROOT/cifar-100-python/{train, test, meta}",
            3,
            32,
            100,
            "the python version of https://www.cs.toronto.edu/~kriz/cifar.html (cifar-100-python.tar.gz, unpacked)",
        ),
        StandardDataset(
            "mnist",
            "MNIST",
            "ROOT/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte",
            1,
            28,
            10,
            "the four idx files of MNIST, unzipped",
        ),
        StandardDataset(
            "fashion_mnist",
            "FashionMNIST",
            "ROOT/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte",
            1,
            28,
            10,
            "the four idx files of Fashion-MNIST (github.com/zalandoresearch/fashion-mnist), unzipped",
        ),
        StandardDataset(
            "svhn",
            "SVHN",
            "ROOT/{train_32x32.mat, test_32x32.mat}",
            3,
            32,
            10,
            "the cropped-digits .mat files of http://ufldl.stanford.edu/housenumbers/",
        ),
    )
}
"""Every standard dataset by name: what ``load_dataset(name, root=...)`` and ``--data NAME:DIR`` read."""


def _open(spec: StandardDataset, root: Path, split: Split) -> Any:
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise PartitionError(
            f"{spec.name}: {root} {what}; pass the folder holding {spec.layout.replace('ROOT/', '')} "
            f"({spec.source}); nothing is downloaded"
        )
    try:
        return spec.open(root, split)
    except (RuntimeError, OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as error:
        raise PartitionError(
            f"{spec.name}: no readable {split} split under {root}: torchvision.datasets.{spec.torchvision_class} "
            f"expects {spec.layout} ({spec.source}) and said: {error}. Nothing is downloaded: put the files there, "
            f"or pass the folder that holds them"
        ) from None


def standard_dataset(
    name: str,
    root: str | Path,
    size: int | None = None,
    channels: int | None = None,
    rotate: bool = False,
    seed: int = 0,
    split: Split | None = None,
    in_memory: bool | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> DatasetSplits:
    """The standard dataset ``name`` (a key of :data:`STANDARD_DATASETS`) from the copy under ``root``, with its
    own train/test split, read by its torchvision class with ``download=False``.

    Images are converted to ``channels`` (1 or 3; default the dataset's own), resized to ``size`` x ``size``
    (bilinear; default the native size) and scaled to [0, 1], no mean/std normalisation (the learned
    augmentation pads with 0). ``rotate``: each image turned by its own fixed angle uniform on [-pi, pi] (the
    train and test images' angles from separate streams of ``seed``), as :func:`~partition_fx.datasets.rotdigits`
    does. ``in_memory``: decode every image once into memory (True), read each as training asks (False), or
    decide by whether they fit ``memory_budget`` bytes decoded (None). ``split``: that split alone.
    ``classes`` are torchvision's class names (SVHN's: "0".."9"); ``preprocessing`` decodes a new image as these are.

    Example (with a copy of CIFAR-10 under ``~/data``; nothing here is downloaded)::

        splits = standard_dataset("cifar10", "~/data", rotate=True)   # RotCIFAR-10
        len(splits.train), splits.input_shape                         # (50000, (3, 32, 32))

    >>> standard_dataset("cifar10", "/no/such/folder")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: cifar10: /no/such/folder does not exist; pass the folder holding ...
    """
    spec = STANDARD_DATASETS.get(name)
    if spec is None:
        raise PartitionArgumentError(f"unknown standard dataset {name!r}: not one of {', '.join(STANDARD_DATASETS)}")
    split = check_split(split)
    size, channels = check_image_options(size, channels, own_channels="the data's own")
    seed = check_int("seed", seed, 0, noun="an integer")
    root = Path(root).expanduser()
    mode = pil_mode(channels or spec.channels, "L")
    side = size or spec.size
    shape = (len(mode), side, side)
    parts: dict[Split, TensorDataset | DecodedImages] = {}
    classes = tuple(str(digit) for digit in range(10))  # SVHN's (torchvision names none): label i is the digit i
    for part, which in enumerate(SPLITS, start=1):
        if not wanted(split, which):
            continue
        source = _open(spec, root, which)
        classes = tuple(getattr(source, "classes", classes))  # torchvision's names, in label order
        angles = fixed_angles(len(source), seed, part) if rotate else None
        images = DecodedImages(PairImages(source, spec.name), len(source), mode, size, angles)
        parts[which] = in_memory_or_streamed(images, shape, in_memory, memory_budget)
    empty = empty_split(shape)  # the split not asked for
    streamed = any(isinstance(p, DecodedImages) for p in parts.values())
    counts = " / ".join(f"{len(p)} {which}" for which, p in parts.items())
    return DatasetSplits(
        train=parts.get("train", empty),  # type: ignore[arg-type]
        test=parts.get("test", empty),  # type: ignore[arg-type]
        num_classes=spec.classes,
        input_shape=shape,
        name=("rot" if rotate else "") + spec.name,
        description=(
            f"{spec.name} from {root} (torchvision.datasets.{spec.torchvision_class}), {counts}, "
            f"{shape[0]}x{side}x{side} in [0, 1]"
            + (", each image rotated by a fixed angle uniform on [-pi, pi]" if rotate else "")
            + ("; read from disk as training asks" if streamed else "; decoded into memory")
        ),
        info={"root": str(root), "torchvision_class": spec.torchvision_class, "streamed": streamed},
        split=split,
        classes=classes,
        preprocessing=ImagePreprocessing(mode, len(mode), side, side),
    )
