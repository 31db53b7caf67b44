"""Loading one split (``load_dataset(..., split="train" | "test")``) gives exactly the tensors of loading both,
the other split empty with the same shapes, and never decodes the other split's images (what ``partition-fx
export`` relies on to leave the training data alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import TensorDataset

from partition_fx.datasets import DatasetSplits, load_dataset, write_scattered_digits
from partition_fx.datasets import folder as folder_module
from partition_fx.datasets.registry import NAMED_DATASETS, NamedDataset
from partition_fx.errors import PartitionArgumentError, PartitionError


def _assert_one_split(both: DatasetSplits, one: DatasetSplits, split: str) -> None:
    other = "test" if split == "train" else "train"
    assert one.split == split and both.split is None
    for kept, full in zip(getattr(one, split).tensors, getattr(both, split).tensors):
        assert kept.dtype == full.dtype and torch.equal(kept, full)  # bit for bit
    for empty, full in zip(getattr(one, other).tensors, getattr(both, other).tensors):
        assert empty.shape == (0, *full.shape[1:]) and empty.dtype == full.dtype
    assert (one.num_classes, one.input_shape, one.name) == (both.num_classes, both.input_shape, both.name)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("digits", {"size": 10}),
        ("rotdigits", {"size": 10, "channels": 3, "seed": 2}),
        ("input_selection", {"num_train": 30, "num_test": 20}),
    ],
)
def test_a_named_dataset_loads_one_split_exactly(name, kwargs, split) -> None:
    _assert_one_split(load_dataset(name, **kwargs), load_dataset(name, split=split, **kwargs), split)


def _write_mixed_folder(root: Path) -> None:
    """Two classes of 4x6 images, the first file RGB and the others grey (so the first file fixes the mode)."""
    for label, count in (("a", 5), ("b", 6)):
        (root / label).mkdir(parents=True)
        for i in range(count):
            mode, color = ("RGB", (90, 10, 200)) if (label, i) == ("a", 0) else ("L", 20 * i + (label == "b"))
            Image.new(mode, (6, 4), color=color).save(root / label / f"{i}.png")


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("layout", ["split by class", "train/ and test/"])
def test_an_image_folder_decodes_only_the_split_asked_for(tmp_path, monkeypatch, layout, split) -> None:
    if layout == "split by class":
        _write_mixed_folder(tmp_path)
    else:
        write_scattered_digits(tmp_path, size=12, side_range=(4, 8), max_shift=2)
    both = load_dataset(str(tmp_path))
    decoded: list[Path] = []
    original = folder_module._load_images

    def recording(files, *args):
        decoded.extend(files)
        return original(files, *args)

    monkeypatch.setattr(folder_module, "_load_images", recording)
    one = load_dataset(str(tmp_path), split=split)
    _assert_one_split(both, one, split)
    assert sorted(decoded) == sorted(both.info[f"{split}_files"]) and one.info == both.info
    if layout == "split by class":  # the first file (RGB, in train or test) fixes every image's mode
        assert one.input_shape == (3, 4, 6)


def test_one_splits_images_must_match_the_others_size(tmp_path) -> None:
    for part, size in (("train", (6, 4)), ("test", (5, 5))):
        for label in ("a", "b"):
            (tmp_path / part / label).mkdir(parents=True)
            Image.new("L", size).save(tmp_path / part / label / "0.png")
    with pytest.raises(PartitionError, match=r"train[/\\]a[/\\]0.png is 6x4 but .*test[/\\]a[/\\]0.png is 5x5.*size="):
        load_dataset(str(tmp_path))
    assert load_dataset(str(tmp_path), split="test").input_shape == (1, 5, 5)  # alone, the test split is consistent


def _no_split_loader(size: int = 4) -> DatasetSplits:
    rows = np.arange(10, dtype=np.float32)
    x = torch.from_numpy(rows)[:, None].expand(10, size).contiguous()
    return DatasetSplits(
        TensorDataset(x[:7], torch.zeros(7, dtype=torch.int64)),
        TensorDataset(x[7:], torch.ones(3, dtype=torch.int64)),
        2,
        (size,),
        "nosplit",
        "a loader without split=",
    )


def test_a_loader_without_split_loads_both_and_drops_one(monkeypatch) -> None:
    monkeypatch.setitem(NAMED_DATASETS, "nosplit", NamedDataset("nosplit", _no_split_loader, "no split="))
    _assert_one_split(load_dataset("nosplit", size=3), load_dataset("nosplit", split="test", size=3), "test")


@pytest.mark.parametrize("loader", ["digits", "input_selection"])
def test_a_bad_split_is_refused(loader) -> None:
    with pytest.raises(PartitionArgumentError, match=r"split must be 'train', 'test' or None \(both\), got 'val'"):
        load_dataset(loader, split="val")
