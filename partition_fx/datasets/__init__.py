"""Datasets for the training command and the examples, loaded whole into memory.

Every loader returns a :class:`DatasetSplits`: a fixed, seeded train/test split of float32 inputs, with int64
class targets (classification) or float32 targets of shape ``(N, 1)`` (regression). Nothing is downloaded.

* :func:`digits` -- scikit-learn's bundled 8x8 digits (1797 images) drawn into the centre of a larger canvas.
* :func:`rotdigits` -- the same images and split, each rotated by a fixed random angle (a RotMNIST analogue).
* :func:`normalized_digits` -- the first digits stretched to a size and normalised (what ``convert`` checks on).
* :func:`image_folder` -- a torchvision ``ImageFolder``-style folder, with or without ``train/``/``test/``.
* :func:`write_scattered_digits` -- writes an image folder of digits at random positions and sizes.
* :func:`input_selection` -- the synthetic regression task of the paper's input-selection experiment.
* :func:`load_dataset` -- one of the names above, or a folder path.

One module per source: ``sklearn_digits``, ``folder`` and ``synthetic``; ``splits`` holds what they share
(the seeded random streams, one per purpose, and the stratified split).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PartitionArgumentError, PartitionError
from .folder import image_folder, write_scattered_digits
from .sklearn_digits import NUM_DIGITS, digits, normalized_digits, rotdigits
from .splits import DatasetSplits
from .synthetic import input_selection

__all__ = [
    "NUM_DIGITS",
    "DatasetSplits",
    "digits",
    "image_folder",
    "input_selection",
    "load_dataset",
    "normalized_digits",
    "rotdigits",
    "write_scattered_digits",
]


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
    >>> load_dataset("rotdigit")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown dataset 'rotdigit': not one of ... (did you mean rotdigits?), ...
    """
    loader = _NAMED.get(str(name_or_path))
    if loader is None:
        if not Path(name_or_path).is_dir():
            close = difflib.get_close_matches(str(name_or_path), _NAMED, n=1)
            raise PartitionError(
                f"unknown dataset {name_or_path!r}: not one of {', '.join(_NAMED)}"
                + (f" (did you mean {close[0]}?)" if close else "")
                + ", and no folder of that name exists; pass one of those names or the path of an image folder "
                "laid out as <folder>/<class>/<image>"
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
