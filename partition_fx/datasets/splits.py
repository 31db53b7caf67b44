"""What every loader returns (:class:`DatasetSplits`), the seeded random streams (and the draws from them that
loaders share: :func:`fixed_angles`), and the stratified split.

Randomness comes only from ``numpy.random.default_rng([seed, stream])`` with a separate stream per purpose
(split, angles, function, samples), never from a global RNG, so the same arguments give identical tensors
and, e.g., the rotation angles do not change when ``test_fraction`` does. The streams are numbered here, in
one place, so that two loaders never share one by accident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..errors import PartitionArgumentError, PartitionError
from .truths import MAX_ROTATION

if TYPE_CHECKING:
    from .images import ImagePreprocessing

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = ("train", "test")
"""What a loader's ``split=`` takes: the one split to load (None, the default, loads both)."""

# One numpy stream per purpose (the second entry of the seed sequence), so that changing one use of
# randomness (e.g. the split) never changes another (e.g. the angles).
SPLIT_STREAM = 0
ANGLE_STREAM = 1
FUNCTION_STREAM = 2
TRAIN_INPUT_STREAM = 3
TRAIN_NOISE_STREAM = 4
TEST_INPUT_STREAM = 5
TEST_NOISE_STREAM = 6
PLACEMENT_STREAM = 7
ZOOM_STREAM = 8

BOTH_SPLITS_HINT = "; both the train and the test split need examples"
"""Why ``test_fraction`` must be strictly between 0 and 1 (the end of that refusal's message)."""


@dataclass(frozen=True)
class DatasetSplits:
    """A dataset's fixed train/test split, in memory.

    ``num_classes`` is None for regression. ``input_shape`` is one example's shape (no batch dimension).
    ``info`` holds extras specific to a loader (indices, angles, class names, informative inputs...).
    ``split`` is None when both splits are loaded, else the one that is (a loader's ``split=``): the other is
    then empty (no examples, the same shapes), and everything else is as when both are loaded.
    ``classes`` names the classes in label order (target i is ``classes[i]``; None for regression), and
    ``preprocessing`` (image datasets; else None) is how an image becomes one of the inputs, as the loader
    decodes them: what a model trained on the data records, so that it can classify a new image by name.

    >>> import torch
    >>> splits = DatasetSplits(
    ...     train=TensorDataset(torch.zeros(4, 3), torch.zeros(4, 1)),
    ...     test=TensorDataset(torch.zeros(2, 3), torch.zeros(2, 1)),
    ...     num_classes=None, input_shape=(3,), name="toy", description="zeros")
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
    split: Split | None = None
    classes: tuple[str, ...] | None = None
    preprocessing: ImagePreprocessing | None = None


def check_split(split: object) -> Split | None:
    """``split`` if it is None, ``"train"`` or ``"test"``; anything else is refused.

    >>> check_split("test"), check_split(None)
    ('test', None)
    >>> check_split("val")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: split must be 'train', 'test' or None (both), got 'val'
    """
    if split is not None and split not in SPLITS:
        raise PartitionArgumentError(f"split must be 'train', 'test' or None (both), got {split!r}")
    return split


def wanted(split: Split | None, which: Split) -> bool:
    """Whether a loader asked for ``split`` loads ``which``.

    >>> wanted(None, "train"), wanted("test", "train"), wanted("test", "test")
    (True, False, True)
    """
    return split is None or split == which


def only_split(splits: DatasetSplits, split: Split | None) -> DatasetSplits:
    """``splits`` with every split but ``split`` emptied (the same shapes, no examples); all of it if None.

    What a loader that reads both splits anyway returns for ``split=`` (and what :func:`load_dataset` makes of a
    registered loader that does not take ``split``).

    >>> import torch
    >>> both = DatasetSplits(TensorDataset(torch.ones(4, 3)), TensorDataset(torch.zeros(2, 3)), None, (3,), "t", "")
    >>> test = only_split(both, "test")
    >>> len(test.train), tuple(test.train.tensors[0].shape), len(test.test), test.split
    (0, (0, 3), 2, 'test')
    """
    if check_split(split) is None:
        return splits

    def emptied(part: TensorDataset, which: Split) -> TensorDataset:
        return part if which == split else TensorDataset(*(t[:0] for t in part.tensors))

    return replace(splits, train=emptied(splits.train, "train"), test=emptied(splits.test, "test"), split=split)


def seeded_rng(seed: int, stream: int) -> np.random.Generator:
    """The generator of ``stream`` (one of the ``*_STREAM`` numbers above) for ``seed``.

    >>> float(seeded_rng(0, SPLIT_STREAM).uniform()) == float(seeded_rng(0, SPLIT_STREAM).uniform())
    True
    """
    return np.random.default_rng([seed, stream])


def fixed_angles(count: int, seed: int, part: int = 0) -> torch.Tensor:
    """``count`` angles uniform on [-pi, pi] (``truths.MAX_ROTATION``), one per image, from ``seed``'s angle
    stream; ``part`` > 0 draws from a stream of its own (a dataset's train images and test images each get one; 0 is
    rotdigits' stream).

    >>> torch.equal(fixed_angles(5, seed=0), fixed_angles(8, seed=0)[:5])
    True
    >>> bool(fixed_angles(3, seed=0, part=1).abs().max() <= math.pi)
    True
    """
    key = [seed, ANGLE_STREAM] if part == 0 else [seed, ANGLE_STREAM, part]
    return torch.from_numpy(np.random.default_rng(key).uniform(-MAX_ROTATION, MAX_ROTATION, count)).float()


def fixed_zooms(count: int, seed: int, max_zoom: float) -> torch.Tensor:
    """``count`` log-scales uniform on [-log(max_zoom), log(max_zoom)], one per image, from ``seed``'s zoom stream:
    an image zoomed by ``exp`` of its log-scale (``scaledigits``).

    >>> zooms = fixed_zooms(1000, seed=0, max_zoom=2.0)
    >>> bool(zooms.abs().max() <= math.log(2.0)), torch.equal(zooms[:5], fixed_zooms(5, seed=0, max_zoom=2.0))
    (True, True)
    """
    bound = math.log(max_zoom)
    return torch.from_numpy(seeded_rng(seed, ZOOM_STREAM).uniform(-bound, bound, count)).float()


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int, class_names: list[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): ``test_fraction * n_c`` (nearest) of each class c held out, clamped to 1..n_c-1.

    Both index arrays come back in a seeded shuffled order, not grouped by class, so contiguous slices (e.g.
    the data chunks of partitioned training) hold every class in expectation.

    >>> train, test = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), 0.25, seed=0)
    >>> sorted(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])[test].tolist()), len(train)
    ([0, 1], 7)
    """
    rng = seeded_rng(seed, SPLIT_STREAM)
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
