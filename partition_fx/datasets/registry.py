"""The named datasets, each registered once: its name, its loader, what it is, its task and size.

:func:`load_dataset` looks names up here, and the command line reads the names of the image datasets from here
for ``--data`` (its choices, help and did-you-mean) and sizes its memory check by them. This module imports no
torch, so ``partition-fx --help`` lists them: a loader is named by import path and imported on first use, as
a plugin's entry point is. A new dataset is one :func:`register_dataset` call.

>>> dataset_names()[:5]
('digits', 'rotdigits', 'scaledigits', 'drawndigits', 'input_selection')
>>> dataset_names(task="images")[:5]
('digits', 'rotdigits', 'scaledigits', 'drawndigits', 'cifar10')
>>> named_dataset("rotdigits").images, named_dataset("rotdigits").true_ranges
(1797, {'rotation': 3.141592653589793})
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from ..errors import PartitionArgumentError, PartitionError
from .truths import DRAWN_MAX_ZOOM, MAX_ROTATION, MAX_ZOOM

if TYPE_CHECKING:
    from .splits import DatasetSplits, Split

Task = Literal["images", "regression"]


class _RecordsSource(Protocol):
    """A split :func:`load_dataset` has marked with how the command line loads it again (``--data``,
    ``--image-size``, ``--channels``): ``training.fit`` reads it, so a run on it can be written down as a command."""

    partition_fx_source: dict[str, Any]


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
        keywords: passed to the loader before the caller's (``rotate=True`` for ``rotcifar10``).
        on_disk: it reads a copy the user has on disk, under ``root=`` (``--data NAME:DIR``); nothing is
            downloaded.
        true_ranges: the ``AffineAugmentation`` ranges its images were drawn under, by generator name (rotation in
            radians, ``scale`` a log-scale half-width; ``datasets.truths``): what a range learned on it is judged
            by and what an oracle fixes; ``{}`` for images drawn under none, None where it is not known.
    """

    name: str
    loader: Callable[..., DatasetSplits] | str
    description: str
    task: Task = "images"
    images: int | None = None
    keywords: Mapping[str, Any] = field(default_factory=dict)
    on_disk: bool = False
    true_ranges: Mapping[str, float] | None = None

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


def dataset_names(*, task: Task | None = None, on_disk: bool | None = None) -> tuple[str, ...]:
    """The registered names (of ``task`` only, and only those read from the user's disk or only the bundled
    ones, if given), in registration order.

    >>> dataset_names(task="images", on_disk=False)
    ('digits', 'rotdigits', 'scaledigits', 'drawndigits')
    """
    return tuple(
        d.name
        for d in NAMED_DATASETS.values()
        if (task is None or d.task == task) and (on_disk is None or d.on_disk == on_disk)
    )


def split_data_spec(spec: str) -> tuple[str, str | None]:
    """``(name, root)`` of a ``NAME:DIR`` data spec naming a dataset read from disk (``cifar10:~/data``), else
    ``(spec, None)``: a bundled name or a folder's path.

    >>> split_data_spec("cifar10:~/data"), split_data_spec("rotdigits"), split_data_spec("./my:folder")
    (('cifar10', '~/data'), ('rotdigits', None), ('./my:folder', None))
    """
    name, sep, root = spec.partition(":")
    named = NAMED_DATASETS.get(name)
    if sep and named is not None and named.on_disk:
        return name, root
    return spec, None


def load_dataset(name_or_path: str, *, split: Split | None = None, **kwargs: Any) -> DatasetSplits:
    """The dataset called ``name_or_path`` (registered: "digits", "rotdigits", "input_selection", "cifar10", ...)
    or an image folder path.

    A dataset read from the user's disk (CIFAR-10/100, MNIST, Fashion-MNIST, SVHN and their rotated variants)
    needs its folder: ``load_dataset("cifar10", root="~/data")`` or ``load_dataset("cifar10:~/data")``; nothing
    is downloaded. Names win over folders of the same name; write ``./digits`` for a folder called ``digits``.
    ``kwargs`` go to the loader (:func:`~partition_fx.datasets.digits`, ``rotdigits``, ``input_selection``,
    ``standard_dataset`` or ``image_folder``). ``split="train"`` or ``"test"`` loads that split alone
    (``DatasetSplits.split``; the other is empty): the same examples as loading both, without reading the
    other's images. A registered loader that does not take ``split`` loads both, and the other is dropped.

    >>> load_dataset("input_selection", num_train=8, num_test=4, num_inputs=4).input_shape
    (4,)
    >>> test = load_dataset("digits", size=12, split="test")
    >>> len(test.train), len(test.test), test.split
    (0, 359, 'test')
    >>> load_dataset("rotdigit")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: unknown dataset 'rotdigit': not one of ... (did you mean rotdigits?), ...
    >>> load_dataset("cifar10")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: cifar10 is read from a copy on your disk: pass its folder, ...
    """
    name, root = split_data_spec(str(name_or_path))
    if root is not None:
        if "root" in kwargs:
            raise PartitionArgumentError(f"pass the folder once: in {name_or_path!r} or as root=, not both")
        kwargs = {"root": root, **kwargs}
    named = NAMED_DATASETS.get(name)
    if named is not None:
        loader = named.load_function()
        if named.on_disk and "root" not in kwargs:
            raise PartitionArgumentError(
                f"{name} is read from a copy on your disk: pass its folder, load_dataset({name!r}, root=DIR) or "
                f"--data {name}:DIR (nothing is downloaded)"
            )
        fixed = sorted(set(named.keywords) & set(kwargs))
        if fixed:
            raise PartitionArgumentError(f"{name} fixes {', '.join(fixed)}; pass the dataset it varies instead")
        kwargs = {**named.keywords, **kwargs}
    else:
        if not Path(name_or_path).is_dir():
            close = difflib.get_close_matches(str(name_or_path), NAMED_DATASETS, n=1)
            raise PartitionError(
                f"unknown dataset {name_or_path!r}: not one of {', '.join(NAMED_DATASETS)}"
                + (f" (did you mean {close[0]}?)" if close else "")
                + ", and no folder of that name exists; pass one of those names (NAME:DIR for a dataset on your "
                "disk) or the path of an image folder laid out as <folder>/<class>/<image>"
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
    user = set(kwargs) - set(named.keywords if named is not None else ()) - {"root"}
    if len(splits.input_shape) == 3 and user <= {"size", "channels"}:
        # What `partition-fx train --data --image-size --channels` loads it with: a run of these splits records
        # it, so `partition-fx export` can load them again (training.fit).
        data = f"{name}:{kwargs['root']}" if named is not None and named.on_disk else str(name_or_path)
        source = {"data": data, "image_size": splits.input_shape[-1], "channels": kwargs.get("channels")}
        for part in (splits.train, splits.test):
            cast(_RecordsSource, part).partition_fx_source = source  # a plain instance attribute
    return splits


_DIGITS = 1797  # scikit-learn's load_digits(); tests/test_data.py checks it against sklearn_digits.NUM_DIGITS

register_dataset(
    NamedDataset(
        "digits",
        "partition_fx.datasets.sklearn_digits:digits",
        "scikit-learn's 8x8 digits, centred on a larger canvas",
        images=_DIGITS,
        true_ranges={},
    )
)
register_dataset(
    NamedDataset(
        "rotdigits",
        "partition_fx.datasets.sklearn_digits:rotdigits",
        "the digits, each rotated by a fixed random angle (a RotMNIST analogue)",
        images=_DIGITS,
        true_ranges={"rotation": MAX_ROTATION},
    )
)
register_dataset(
    NamedDataset(
        "scaledigits",
        "partition_fx.datasets.sklearn_digits:scaledigits",
        "the digits, each zoomed by a fixed random factor log-uniform on [1/2, 2] (a ScaledMNIST analogue)",
        images=_DIGITS,
        true_ranges={"scale": math.log(MAX_ZOOM)},
    )
)
register_dataset(
    NamedDataset(
        "drawndigits",
        "partition_fx.datasets.drawn_digits:drawndigits",
        "digits drawn as pen strokes at a fixed random zoom log-uniform on [1/sqrt(2), sqrt(2)], drawn, not resampled",
        images=10 * 180,  # drawn_digits.PER_CLASS of each digit; tests/test_data.py checks it
        true_ranges={"scale": math.log(DRAWN_MAX_ZOOM)},
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

_STANDARD = (  # name, images (train + test), what it is
    ("cifar10", 60000, "CIFAR-10 (32x32 colour, 10 classes)"),
    ("cifar100", 60000, "CIFAR-100 (32x32 colour, 100 classes)"),
    ("mnist", 70000, "MNIST (28x28 grey handwritten digits)"),
    ("fashion_mnist", 70000, "Fashion-MNIST (28x28 grey clothing, 10 classes)"),
    ("svhn", 99289, "SVHN cropped digits (32x32 colour house numbers)"),
)
for _name, _images, _what in _STANDARD:
    for _rotate in (False, True):
        register_dataset(
            NamedDataset(
                ("rot" if _rotate else "") + _name,
                "partition_fx.datasets.standard:standard_dataset",
                f"{_what}{', each image rotated by a fixed random angle' if _rotate else ''}, from your copy "
                "(NAME:DIR; read by torchvision, never downloaded)",
                images=_images,
                keywords={"name": _name, "rotate": _rotate},
                on_disk=True,
                true_ranges={"rotation": MAX_ROTATION} if _rotate else None,  # the originals' own: not known
            )
        )
