"""Small generated copies of the standard datasets in their real on-disk formats (CIFAR's pickled batches,
MNIST's idx files, SVHN's .mat), for torchvision's own classes to read; and an image folder of PNG/JPEG files.

torchvision checks the MD5 of CIFAR's and SVHN's files against the published ones, which generated files cannot
match: :func:`skip_checksums` bypasses that check in a test (the package itself never does).
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image


def _images(count: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, *shape), dtype=np.uint8), rng.integers(0, 10, count)


def write_cifar10(root: Path, per_batch: int = 6, test: int = 8) -> None:
    """``root/cifar-10-batches-py``: five training batches of ``per_batch`` images, a test batch, the meta file."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate([*(f"data_batch_{b}" for b in range(1, 6)), "test_batch"]):
        x, y = _images(test if name == "test_batch" else per_batch, (3072,), seed=i)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": x, "labels": y.tolist()}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{c}" for c in range(10)]}, f)


def write_cifar100(root: Path, train: int = 20, test: int = 8) -> None:
    """``root/cifar-100-python``: the train and test pickles (fine and coarse labels) and the meta file."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for i, (name, count) in enumerate((("train", train), ("test", test))):
        x, _ = _images(count, (3072,), seed=i)
        fine = np.random.default_rng(10 + i).integers(0, 100, count)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": x, "fine_labels": fine.tolist(), "coarse_labels": (fine // 5).tolist()}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{c}" for c in range(100)]}, f)


def write_idx(root: Path, folder: str = "MNIST", train: int = 20, test: int = 8) -> None:
    """``root/<folder>/raw``: MNIST's four idx files (big-endian headers, then the bytes)."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    for i, (prefix, count) in enumerate((("train", train), ("t10k", test))):
        x, y = _images(count, (28, 28), seed=i)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, count, 28, 28) + x.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, count) + y.astype(np.uint8).tobytes()
        )


def write_svhn(root: Path, train: int = 20, test: int = 8) -> None:
    """``root/{train,test}_32x32.mat``: X of shape (32, 32, 3, N), y in 1..10 (10 is the digit 0)."""
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    for i, (split, count) in enumerate((("train", train), ("test", test))):
        x, y = _images(count, (32, 32, 3), seed=i)
        savemat(root / f"{split}_32x32.mat", {"X": np.moveaxis(x, 0, -1), "y": (y + 1).reshape(-1, 1)})


WRITERS = {
    "cifar10": write_cifar10,
    "cifar100": write_cifar100,
    "mnist": write_idx,
    "fashion_mnist": lambda root: write_idx(root, "FashionMNIST"),
    "svhn": write_svhn,
}
"""A generated copy of each standard dataset, by name."""
TRAIN_SIZES = {"cifar10": 30, "cifar100": 20, "mnist": 20, "fashion_mnist": 20, "svhn": 20}


def skip_checksums(monkeypatch) -> None:
    """Let torchvision accept generated CIFAR and SVHN files: their MD5 check becomes an existence check."""
    import torchvision.datasets.cifar
    import torchvision.datasets.svhn

    exists = lambda path, md5=None: os.path.isfile(path)  # noqa: E731
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", exists)
    monkeypatch.setattr(torchvision.datasets.svhn, "check_integrity", exists)


def write_image_folder(root: Path, per_class: int = 6, size: int = 16, classes: int = 3, fmt: str = "png") -> None:
    """``root/<class>/<i>.<fmt>``: ``per_class`` noise RGB images of ``size`` x ``size`` per class."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.{fmt}")
