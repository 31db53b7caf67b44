"""The named datasets, each registered once: its name, its loader, what it is, its task and size.

:func:`load_dataset` looks names up here, and the command line reads the names of the image datasets from here
for ``--data`` (its choices, help and did-you-mean) and sizes its memory check by them. This module imports no
torch, so ``partition-fx --help`` lists them: a loader is named by import path and imported on first use, as
a plugin's entry point is. A new dataset is one :func:`register_dataset` call.

>>> dataset_names(), dataset_names(task="images")
(('digits', 'rotdigits', 'input_selection'), ('digits', 'rotdigits'))
>>> named_dataset("rotdigits").images
1797
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import PartitionArgumentError, PartitionError

if TYPE_CHECKING:
    from .splits import DatasetSplits, Split

Task = Literal["images", "regression"]


@dataclass(frozen=True)
class NamedDataset:
    """A dataset :func:`load_dataset` knows by name.

    Attributes:
        name: what ``load_dataset`` and ``--data`` take.
        loader: the function returning its ``DatasetSplits`` (keyword arguments passed through), or its
            ``"module:function"`` import path, imported on first use.
        description: one line for help and docs.
        task: ``"images"``, image classification (what ``partition-fx train`` and ``federated`` take), or
            ``"regression"``.
        images: how many examples it holds, train and test together, whatever the size asked: the command line
            bounds its memory before loading by it (None: it depends on the loader's arguments).
    """

    name: str
    loader: Callable[..., DatasetSplits] | str
    description: str
    task: Task = "images"
    images: int | None = None

    def load_function(self) -> Callable[..., DatasetSplits]:
        """The loader (imported now if named by path).

        >>> named_dataset("digits").load_function().__name__
        'digits'
        """
        if not isinstance(self.loader, str):
            return self.loader
        module, _, name = self.loader.partition(":")
        return getattr(importlib.import_module(module), name)


NAMED_DATASETS: dict[str, NamedDataset] = {}
"""Every registered dataset by name, in registration order (:func:`register_dataset` adds to it)."""


def register_dataset(dataset: NamedDataset) -> NamedDataset:
    """Add ``dataset`` to the table; a name already registered is refused. Returns ``dataset``.

    >>> register_dataset(NamedDataset("digits", "partition_fx.datasets.sklearn_digits:digits", "again"))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: dataset 'digits' is registered already
    """
    if dataset.name in NAMED_DATASETS:
        raise PartitionArgumentError(f"dataset {dataset.name!r} is registered already")
    NAMED_DATASETS[dataset.name] = dataset
    return dataset


def named_dataset(name: str) -> NamedDataset | None:
    """The dataset registered as ``name``, or None (a folder's path, say)."""
    return NAMED_DATASETS.get(name)


def dataset_names(*, task: Task | None = None) -> tuple[str, ...]:
    """The registered names (of ``task`` only, if given), in registration order."""
    return tuple(d.name for d in NAMED_DATASETS.values() if task is None or d.task == task)


def load_dataset(name_or_path: str, *, split: Split | None = None, **kwargs: Any) -> DatasetSplits:
    """The dataset called ``name_or_path`` (registered: "digits", "rotdigits", "input_selection", ...) or an
    image folder path.

    Names win over folders of the same name; write ``./digits`` for a folder called ``digits``. ``kwargs``
    go to the loader (:func:`~partition_fx.datasets.digits`, ``rotdigits``, ``input_selection`` or
    ``image_folder``). ``split="train"`` or ``"test"`` loads that split alone (``DatasetSplits.split``; the
    other is empty): the same tensors as loading both, without reading the other's images. A registered loader
    that does not take ``split`` loads both, and the other is dropped.

    >>> load_dataset("input_selection", num_train=8, num_test=4, num_inputs=4).input_shape
    (4,)
    >>> test = load_dataset("digits", size=12, split="test")
    >>> len(test.train), len(test.test), test.split
    (0, 359, 'test')
    >>> load_dataset("rotdigit")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown dataset 'rotdigit': not one of ... (did you mean rotdigits?), ...
    """
    named = NAMED_DATASETS.get(str(name_or_path))
    if named is not None:
        loader = named.load_function()
    else:
        if not Path(name_or_path).is_dir():
            close = difflib.get_close_matches(str(name_or_path), NAMED_DATASETS, n=1)
            raise PartitionError(
                f"unknown dataset {name_or_path!r}: not one of {', '.join(NAMED_DATASETS)}"
                + (f" (did you mean {close[0]}?)" if close else "")
                + ", and no folder of that name exists; pass one of those names or the path of an image folder "
                "laid out as <folder>/<class>/<image>"
            )
        if "root" in kwargs:
            raise PartitionArgumentError(
                f"pass the folder once: as name_or_path ({name_or_path!r}) or as root=, not both"
            )
        from .folder import image_folder

        loader = image_folder
        kwargs = {"root": name_or_path, **kwargs}
    accepted = list(inspect.signature(loader).parameters)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise PartitionArgumentError(
            f"{loader.__name__} does not take {', '.join(unknown)}; it accepts {', '.join(accepted)}"
        )
    from .splits import check_split, only_split

    if check_split(split) is None:
        splits = loader(**kwargs)
    elif "split" in accepted:
        splits = loader(**kwargs, split=split)
    else:
        splits = only_split(loader(**kwargs), split)
    if len(splits.input_shape) == 3 and set(kwargs) - {"root"} <= {"size", "channels"}:
        # What `partition-fx train --data --image-size --channels` loads it with: a run of these splits records
        # it, so `partition-fx export` can load them again (training.run_record).
        source = {"data": str(name_or_path), "image_size": splits.input_shape[-1], "channels": kwargs.get("channels")}
        for split in (splits.train, splits.test):
            split.partition_fx_source = source
    return splits


_DIGITS = 1797  # scikit-learn's load_digits(); tests/test_data.py checks it against sklearn_digits.NUM_DIGITS

register_dataset(
    NamedDataset(
        "digits",
        "partition_fx.datasets.sklearn_digits:digits",
        "scikit-learn's 8x8 digits, centred on a larger canvas",
        images=_DIGITS,
    )
)
register_dataset(
    NamedDataset(
        "rotdigits",
        "partition_fx.datasets.sklearn_digits:rotdigits",
        "the digits, each rotated by a fixed random angle (a RotMNIST analogue)",
        images=_DIGITS,
    )
)
register_dataset(
    NamedDataset(
        "input_selection",
        "partition_fx.datasets.synthetic:input_selection",
        "synthetic regression where only the first inputs matter (the input-selection experiment)",
        task="regression",
    )
)
