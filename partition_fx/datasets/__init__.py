"""Datasets for the training command and the examples: in memory, or read from disk as training asks.

Every loader returns a :class:`DatasetSplits`: a fixed, seeded train/test split of float32 inputs, with int64
class targets (classification) or float32 targets of shape ``(N, 1)`` (regression). Nothing is downloaded.

* :func:`digits` -- scikit-learn's bundled 8x8 digits (1797 images) drawn into the centre of a larger canvas.
* :func:`rotdigits` -- the same images and split, each rotated by a fixed random angle (a RotMNIST analogue).
* :func:`scaledigits` -- the same images and split, each zoomed by a fixed log-uniform factor (a ScaledMNIST
  analogue).
* :func:`drawndigits` -- 1800 digits drawn as pen strokes, each at a fixed log-uniform zoom drawn rather than
  resampled (a zoom's truth where a zoom is not a blur).
* :func:`normalized_digits` -- the first digits stretched to a size and normalised (what ``convert`` checks on).
* :func:`standard_dataset` -- CIFAR-10/100, MNIST, Fashion-MNIST or SVHN from the user's copy, read by torchvision
  (never downloaded), optionally each image rotated by a fixed angle (``rotcifar10``, ...).
* :func:`image_folder` -- a torchvision ``ImageFolder``-style folder of any size, with or without
  ``train/``/``test/``, decoded into memory or read from disk as training asks.
* :func:`write_scattered_digits` -- writes an image folder of digits at random positions and sizes
  (:func:`scattered_digits_ranges`: the ranges they are drawn under).
* :func:`input_selection` -- the synthetic regression task of the paper's input-selection experiment.
* :func:`load_dataset` -- a registered name (``digits``, ``rotdigits``, ``input_selection``), or a folder path.

One module per source: ``sklearn_digits``, ``drawn_digits``, ``standard``, ``folder`` and ``synthetic``;
``splits`` holds what they share (the seeded random streams, one per purpose, and the stratified split),
``images`` how an image is decoded, ``truths`` the ranges the built-in images are drawn under (each named dataset's
``NamedDataset.true_ranges``), ``registry`` the named datasets (:func:`register_dataset`). The loaders are imported
on first use (PEP 562), so that the command line reads the names without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .registry import NamedDataset, dataset_names, load_dataset, named_dataset, register_dataset
from .truths import scattered_digits_ranges

if TYPE_CHECKING:
    from .drawn_digits import drawndigits as drawndigits
    from .folder import image_folder as image_folder
    from .folder import write_scattered_digits as write_scattered_digits
    from .sklearn_digits import NUM_DIGITS as NUM_DIGITS
    from .sklearn_digits import digits as digits
    from .sklearn_digits import normalized_digits as normalized_digits
    from .sklearn_digits import rotdigits as rotdigits
    from .sklearn_digits import scaledigits as scaledigits
    from .splits import DatasetSplits as DatasetSplits
    from .standard import STANDARD_DATASETS as STANDARD_DATASETS
    from .standard import standard_dataset as standard_dataset
    from .synthetic import input_selection as input_selection

__all__ = [
    "NUM_DIGITS",
    "STANDARD_DATASETS",
    "DatasetSplits",
    "NamedDataset",
    "dataset_names",
    "digits",
    "drawndigits",
    "image_folder",
    "input_selection",
    "load_dataset",
    "named_dataset",
    "normalized_digits",
    "register_dataset",
    "rotdigits",
    "scaledigits",
    "scattered_digits_ranges",
    "standard_dataset",
    "write_scattered_digits",
]

_HOME = {
    "drawndigits": "drawn_digits",
    "image_folder": "folder",
    "write_scattered_digits": "folder",
    "NUM_DIGITS": "sklearn_digits",
    "digits": "sklearn_digits",
    "normalized_digits": "sklearn_digits",
    "rotdigits": "sklearn_digits",
    "scaledigits": "sklearn_digits",
    "DatasetSplits": "splits",
    "input_selection": "synthetic",
    "STANDARD_DATASETS": "standard",
    "standard_dataset": "standard",
}
"""Each loader's module, imported on first use."""


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
