"""The datasets: sizes, stratified splits, determinism, digit geometry, rotation, image folders, input selection."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch.nn import functional as F

from partition_fx.datasets import (
    DatasetSplits,
    digits,
    drawn_digits,
    drawndigits,
    image_folder,
    input_selection,
    load_dataset,
    rotdigits,
    scaledigits,
    sklearn_digits,
    synthetic,
    write_scattered_digits,
)
from partition_fx.datasets.images import rotate_images
from partition_fx.errors import PartitionArgumentError, PartitionError

SIZE = 20  # smaller than the default 28 to keep the file fast; the geometry is the same


@pytest.fixture(scope="module")
def sk_digits() -> tuple[np.ndarray, np.ndarray]:
    d = load_digits()
    return d.images, d.target


@pytest.fixture(scope="module")
def plain() -> DatasetSplits:
    return digits(size=SIZE)


@pytest.fixture(scope="module")
def rotated() -> DatasetSplits:
    return rotdigits(size=SIZE)


def test_digits_sizes_and_stratified_split(plain, sk_digits) -> None:
    _, target = sk_digits
    train_idx, test_idx = plain.info["train_indices"], plain.info["test_indices"]
    assert len(plain.train) + len(plain.test) == 1797
    assert sorted(torch.cat([train_idx, test_idx]).tolist()) == list(range(1797))  # disjoint and complete
    assert torch.equal(plain.train.tensors[1], torch.from_numpy(target[train_idx.numpy()]))
    for c in range(10):
        n = int((target == c).sum())
        expected_test = math.floor(0.2 * n + 0.5)
        assert int((plain.test.tensors[1] == c).sum()) == expected_test
        assert int((plain.train.tensors[1] == c).sum()) == n - expected_test
    assert (len(plain.train), len(plain.test)) == (1438, 359)
    assert plain.num_classes == 10 and plain.input_shape == (1, SIZE, SIZE) and plain.name == "digits"
    # shuffled, not grouped by class: the first tenth of train (a data chunk) holds every class
    assert set(plain.train.tensors[1][: len(plain.train) // 10].tolist()) == set(range(10))


def test_digits_test_fraction_changes_counts() -> None:
    splits = digits(size=8, test_fraction=0.5)
    counts = torch.bincount(splits.test.tensors[1], minlength=10)
    totals = counts + torch.bincount(splits.train.tensors[1], minlength=10)
    assert torch.equal(counts, torch.floor(totals * 0.5 + 0.5).long())


def test_digits_geometry_values_and_dtypes(plain, sk_digits) -> None:
    images, _ = sk_digits
    x, y = plain.train.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.shape == (1438, 1, SIZE, SIZE)
    assert float(x.min()) == 0.0 and float(x.max()) <= 1.0
    side = sklearn_digits._digit_side(SIZE)
    margin = (SIZE - side) // 2
    assert side == 14 and margin == 3 and side <= SIZE / math.sqrt(2)
    # independent rendering: scale 0..16 to [0, 1], bilinear upsample, paste into the centre of zeros
    i = int(plain.info["train_indices"][0])
    small = torch.tensor(images[i], dtype=torch.float32)[None, None] / 16
    expected = torch.zeros(SIZE, SIZE)
    expected[margin : margin + side, margin : margin + side] = F.interpolate(
        small, size=(side, side), mode="bilinear", align_corners=False
    )[0, 0]
    assert torch.allclose(x[0, 0], expected, atol=1e-6)
    outside = torch.ones(SIZE, SIZE, dtype=torch.bool)
    outside[margin : margin + side, margin : margin + side] = False
    assert float(x[:, :, outside].abs().max()) == 0.0  # background exactly 0


def test_digits_channels_are_repeated() -> None:
    grey, rgb = digits(size=8), digits(size=8, channels=3)
    assert rgb.input_shape == (3, 8, 8) and rgb.train.tensors[0].is_contiguous()
    assert torch.equal(rgb.train.tensors[0], grey.train.tensors[0].expand(-1, 3, -1, -1))


@pytest.mark.parametrize("loader", [digits, rotdigits, scaledigits, drawndigits])
def test_digits_deterministic_and_seeded(loader) -> None:
    a, b, other = loader(size=8), loader(size=8), loader(size=8, seed=1)
    for part in ("train", "test"):
        for ta, tb in zip(getattr(a, part).tensors, getattr(b, part).tensors):
            assert torch.equal(ta, tb)
    assert not torch.equal(a.info["test_indices"], other.info["test_indices"])
    assert not torch.equal(a.train.tensors[0], other.train.tensors[0])


def test_rotdigits_same_split_and_zero_angle_is_digits(plain, rotated) -> None:
    assert torch.equal(plain.info["train_indices"], rotated.info["train_indices"])
    assert torch.equal(plain.test.tensors[1], rotated.test.tensors[1])
    x = plain.train.tensors[0]
    assert torch.allclose(rotate_images(x, torch.zeros(len(x))), x, atol=1e-6)
    # rotdigits is exactly digits rotated by the reported angles
    expected = rotate_images(plain.test.tensors[0], rotated.info["test_angles"])
    assert torch.allclose(rotated.test.tensors[0], expected, atol=1e-6)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.flatten(1), b.flatten(1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def test_rotdigits_differ_from_digits_only_by_rotation(plain, rotated) -> None:
    x, xr = plain.train.tensors[0], rotated.train.tensors[0]
    assert float(xr.min()) >= 0.0 and float(xr.max()) <= 1.0
    angles = rotated.info["train_angles"]
    back = rotate_images(xr, -angles)
    assert float(_correlation(back, x).min()) > 0.95  # two bilinear resamplings blur a little
    assert float(_correlation(xr, x).mean()) < 0.8  # the rotation is real
    # the canvas leaves room: rotation keeps each digit's ink (nothing cut at the corners)
    ratio = xr.sum((1, 2, 3)) / x.sum((1, 2, 3))
    assert float((ratio - 1).abs().max()) < 0.05


def _radius(images: torch.Tensor) -> torch.Tensor:
    """Each image's root-mean-square distance of its ink from the canvas centre, in pixels."""
    size = images.shape[-1]
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    r2 = coords.view(-1, 1) ** 2 + coords.view(1, -1) ** 2
    ink = images[:, 0].double()
    return ((ink * r2).sum((1, 2)) / ink.sum((1, 2))).sqrt()


def test_scaledigits_zoom_each_digit_by_its_recorded_factor_log_uniform_on_half_to_two() -> None:
    """The truth a learned isotropic scale range should find: each digit is the digit of ``digits`` drawn at half
    the size, zoomed by exp(its log-scale), log-scales uniform on [-log 2, log 2]; nothing is cut."""
    plain, scaled = digits(size=28), scaledigits(size=28)
    assert torch.equal(plain.info["train_indices"], scaled.info["train_indices"])
    assert torch.equal(plain.test.tensors[1], scaled.test.tensors[1])
    log_scales = torch.cat([scaled.info["train_log_scales"], scaled.info["test_log_scales"]]).double()
    assert float(log_scales.abs().max()) <= math.log(2.0) and float(log_scales.std()) > 0.35  # U(-a, a): a/sqrt(3)
    x, xs = plain.train.tensors[0], scaled.train.tensors[0]
    ratio = _radius(xs) / _radius(x)
    expected = torch.exp(scaled.info["train_log_scales"].double()) / sklearn_digits.MAX_ZOOM
    assert float((ratio / expected - 1).abs().median()) < 0.05
    assert float((ratio / expected - 1).abs().max()) < 0.25  # the smallest digits span 4.5 pixels
    # no zoom cuts a digit: the largest fill digits' square, inside the canvas
    assert float(xs[:, :, 0].abs().max() + xs[:, :, -1].abs().max()) == 0.0


def test_drawndigits_draw_each_digit_at_its_recorded_zoom_uncut_at_the_truths_views() -> None:
    """The truth a learned scale range should find on ``drawndigits``: every example is its strokes drawn at zoom
    exp(its log-scale), log-scales uniform on [-log sqrt 2, log sqrt 2]: the same strokes drawn at zoom 1 have their
    ink at 1/exp(log-scale) of the distance from the centre; the augmentation's widest view at the truth (a further
    sqrt 2) still leaves the border clear; 180 of each digit, split stratified."""
    splits = drawndigits(size=28)
    log_scales = torch.cat([splits.info["train_log_scales"], splits.info["test_log_scales"]]).double()
    truth = math.log(math.sqrt(2))
    assert float(log_scales.abs().max()) <= truth + 1e-6 and float(log_scales.std()) > 0.9 * truth / math.sqrt(3)
    assert torch.bincount(splits.train.tensors[1]).tolist() == [144] * 10
    labels = np.repeat(np.arange(10), drawn_digits.PER_CLASS)
    every = torch.from_numpy(
        np.concatenate([splits.info["train_indices"].numpy(), splits.info["test_indices"].numpy()])
    )
    zooms = torch.empty(len(labels))
    zooms[every] = log_scales.float()
    drawn = drawn_digits.drawn_images(labels, zooms, 28, seed=0)
    assert torch.equal(drawn[splits.info["train_indices"]], splits.train.tensors[0])
    at_one = drawn_digits.drawn_images(labels, torch.zeros(len(labels)), 28, seed=0)
    ratio = _radius(drawn) / _radius(at_one)
    assert float((ratio / zooms.double().exp() - 1).abs().median()) < 0.03
    widest = drawn_digits.drawn_images(labels[::37], torch.full((len(labels[::37]),), 2 * truth), 28, seed=0)
    assert float(widest[:, :, [0, -1]].max() + widest[:, :, :, [0, -1]].max()) == 0.0


def test_rotation_direction_is_counter_clockwise() -> None:
    image = torch.zeros(1, 1, 7, 7)
    image[0, 0, 3, 5] = 1.0  # right of the centre
    assert rotate_images(image, torch.tensor([math.pi / 2]))[0, 0].nonzero().tolist() == [[1, 3]]  # above it
    assert rotate_images(image, torch.tensor([-math.pi / 2]))[0, 0].nonzero().tolist() == [[5, 3]]  # below it


def test_rotdigits_angles_uniform_and_independent_of_split(rotated) -> None:
    angles = torch.cat([rotated.info["train_angles"], rotated.info["test_angles"]]).double().sort().values
    assert len(angles) == 1797 and float(angles.min()) >= -math.pi and float(angles.max()) <= math.pi
    cdf = (angles + math.pi) / (2 * math.pi)
    n = len(angles)
    ks = max(float((torch.arange(1, n + 1) / n - cdf).max()), float((cdf - torch.arange(n) / n).max()))
    assert ks < 1.63 / math.sqrt(n)  # Kolmogorov-Smirnov at the 1% level
    other = rotdigits(size=8, test_fraction=0.5)
    by_index = dict(zip(rotated.info["test_indices"].tolist(), rotated.info["test_angles"].tolist()))
    for i, angle in zip(other.info["test_indices"].tolist(), other.info["test_angles"].tolist()):
        if i in by_index:
            assert by_index[i] == angle


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 7}, "size must be an integer >= 8"),
        ({"channels": 0}, "channels must be"),
        ({"test_fraction": 1.0}, "strictly between 0 and 1"),
        ({"test_fraction": 0}, "strictly between 0 and 1"),
        ({"seed": -1}, "seed must be"),
        ({"size": 28.0}, "size must be an integer"),
    ],
)
def test_digits_bad_arguments(kwargs, match) -> None:
    with pytest.raises(PartitionArgumentError, match=match):
        digits(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Image folders


def _write_images(folder: Path, count: int, size: tuple[int, int] = (6, 4), mode: str = "L", start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        color = (start + 10 * i) if mode == "L" else (start + 10 * i, 5, 200)
        Image.new(mode, size, color=color).save(folder / f"img{i}.png")


def test_image_folder_split_by_class(tmp_path) -> None:
    _write_images(tmp_path / "dog", 6, start=100)
    _write_images(tmp_path / "cat", 5, start=0)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    splits = image_folder(tmp_path)
    assert splits.info["classes"] == ["cat", "dog"] and splits.num_classes == 2
    assert splits.input_shape == (1, 4, 6)  # channels, height, width
    assert (len(splits.train), len(splits.test)) == (9, 2)
    assert sorted(splits.test.tensors[1].tolist()) == [0, 1]  # one of each class
    x, y = splits.train.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    for image, label, path in zip(x, y, splits.info["train_files"]):
        value = (0 if label == 0 else 100) + 10 * int(path.stem.removeprefix("img"))
        assert path.parent.name == ("cat", "dog")[int(label)]
        assert torch.allclose(image, torch.full((1, 4, 6), value / 255))
    again = image_folder(tmp_path)
    assert torch.equal(again.train.tensors[0], x) and again.info["test_files"] == splits.info["test_files"]


def test_image_folder_train_test_layout_channels_and_resize(tmp_path) -> None:
    for part, count in (("train", 4), ("test", 2)):
        _write_images(tmp_path / part / "a", count, mode="RGB")
        _write_images(tmp_path / part / "b", count, mode="RGB", start=50)
    splits = image_folder(tmp_path)
    assert (len(splits.train), len(splits.test)) == (8, 4)
    assert splits.input_shape == (3, 4, 6)
    assert sorted(splits.test.tensors[1].tolist()) == [0, 0, 1, 1]
    assert all(path.parts[-3] == "test" for path in splits.info["test_files"])
    b_first = splits.info["test_files"].index(tmp_path / "test" / "b" / "img0.png")
    assert int(splits.test.tensors[1][b_first]) == 1
    assert torch.allclose(splits.test.tensors[0][b_first, :, 0, 0], torch.tensor([50, 5, 200]) / 255)
    grey = image_folder(tmp_path, size=5, channels=1)
    assert grey.input_shape == (1, 5, 5) and grey.train.tensors[0].shape == (8, 1, 5, 5)
    assert float(grey.train.tensors[0].min()) >= 0 and float(grey.train.tensors[0].max()) <= 1
    via_name = load_dataset(str(tmp_path), channels=1)
    assert via_name.input_shape == (1, 4, 6) and via_name.num_classes == 2


def test_image_folder_errors(tmp_path) -> None:
    with pytest.raises(PartitionError, match=r"data folder .* does not exist"):
        image_folder(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PartitionError, match="has no class folders"):
        image_folder(empty)
    (empty / "a").mkdir()
    with pytest.raises(PartitionError, match="has no images"):
        image_folder(empty)

    sizes = tmp_path / "sizes"
    _write_images(sizes / "a", 2, size=(6, 4))
    _write_images(sizes / "b", 2, size=(5, 5))
    with pytest.raises(PartitionError, match=r"a[/\\]img0.png is 6x4 but .*b[/\\]img0.png is 5x5.*size="):
        image_folder(sizes)
    assert image_folder(sizes, size=3).input_shape == (1, 3, 3)

    lonely = tmp_path / "lonely"
    _write_images(lonely / "a", 3)
    _write_images(lonely / "b", 1)
    with pytest.raises(PartitionError, match="class 'b' has 1 example"):
        image_folder(lonely)

    mismatch = tmp_path / "mismatch"
    _write_images(mismatch / "train" / "a", 2)
    _write_images(mismatch / "test" / "b", 2)
    with pytest.raises(PartitionError, match=r"only in train: \['a'\], only in test: \['b'\]"):
        image_folder(mismatch)
    alone = tmp_path / "alone"
    for which in ("train", "test"):
        _write_images(alone / which / "a", 2)
    with pytest.raises(PartitionError, match=r"have one class folder \(a/\): a classifier needs at least two"):
        image_folder(alone)
    half = tmp_path / "half"
    _write_images(half / "train" / "a", 2)
    with pytest.raises(PartitionError, match="has train/ but no test/"):
        image_folder(half)

    broken = tmp_path / "broken"
    _write_images(broken / "a", 2)
    _write_images(broken / "b", 2)  # two classes: one alone is refused first (issue 41)
    (broken / "a" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(PartitionError, match=r"cannot read image .*bad\.png"):
        image_folder(broken)
    with pytest.raises(PartitionArgumentError, match="channels must be 1"):
        image_folder(lonely, channels=2)


# ---------------------------------------------------------------------------------------------------------------
# Input selection


def test_input_selection_shapes_and_determinism() -> None:
    splits = input_selection()
    x, y = splits.train.tensors
    assert x.shape == (3000, 10) and y.shape == (3000, 1) and x.dtype == y.dtype == torch.float32
    assert splits.test.tensors[0].shape == (1000, 10)
    assert splits.num_classes is None and splits.input_shape == (10,) and splits.info["informative"] == [0, 1, 2]
    again, other = input_selection(), input_selection(seed=1)
    assert torch.equal(again.train.tensors[1], y) and torch.equal(again.test.tensors[0], splits.test.tensors[0])
    assert not torch.equal(other.train.tensors[1], y)
    assert not torch.equal(splits.test.tensors[0][:100], x[:100])  # a fresh sample, not a split of train
    smaller = input_selection(num_train=100, num_test=10)
    assert torch.equal(smaller.train.tensors[0], x[:100]) and torch.equal(smaller.train.tensors[1], y[:100])
    # the noise is the documented size, and the signal dominates it
    residual = y - splits.info["train_clean"]
    assert abs(float(residual.std()) - 0.1) < 0.01
    assert float(splits.info["train_clean"].std()) > 0.5


def test_input_selection_target_depends_on_informative_inputs_only() -> None:
    splits = input_selection(num_train=500, num_test=10, num_informative=2, num_inputs=6, noise=0.0)
    x, y = splits.train.tensors
    f = synthetic._input_selection_function(2, seed=0)
    assert torch.equal(f(x).unsqueeze(1), y)
    perturbed = x.clone()
    perturbed[:, 2:] = torch.randn(500, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(f(perturbed), f(x))
    for j in (0, 1):
        moved = x.clone()
        moved[:, j] += 0.5
        assert float((f(moved) - f(x)).abs().mean()) > 0.05
    # with noise, the uninformative inputs are uncorrelated with y while y's variance is explained by x[:2]
    noisy = input_selection()
    x, y = noisy.train.tensors
    centred = (y[:, 0] - y.mean()) / y.std()
    assert all(abs(float((x[:, j] * centred).mean())) < 0.06 for j in range(3, 10))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_informative": 11}, "at most num_inputs"),
        ({"noise": -0.1}, "noise must be"),
        ({"num_train": 0}, "num_train must be"),
    ],
)
def test_input_selection_bad_arguments(kwargs, match) -> None:
    with pytest.raises(PartitionArgumentError, match=match):
        input_selection(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# By name


def test_load_dataset_names_and_errors(tmp_path, monkeypatch) -> None:
    assert load_dataset("digits", size=8).name == "digits"
    assert load_dataset("rotdigits", size=8, channels=3).input_shape == (3, 8, 8)
    assert load_dataset("input_selection", num_train=5, num_test=5).num_classes is None
    with pytest.raises(
        PartitionError,
        match=r"unknown dataset 'imagenet'.*rotdigits, scaledigits, drawndigits, input_selection.*folder",
    ):
        load_dataset("imagenet")
    with pytest.raises(PartitionArgumentError, match=r"mnist is read from a copy on your disk.*mnist:DIR"):
        load_dataset("mnist")
    with pytest.raises(PartitionArgumentError, match="input_selection does not take size"):
        load_dataset("input_selection", size=28)
    # a folder called like an embedded name is reached by a path
    monkeypatch.chdir(tmp_path)
    _write_images(tmp_path / "digits" / "a", 2)
    _write_images(tmp_path / "digits" / "b", 2)
    assert load_dataset("digits", size=8).num_classes == 10
    assert load_dataset("./digits").num_classes == 2


def _content_centres(x: torch.Tensor) -> torch.Tensor:
    """Per image (N, H, W): the centre of its non-zero pixels' bounding box minus the canvas centre, (row, col)."""
    centres = []
    for occupied in (x.sum(2) > 0, x.sum(1) > 0):
        first = occupied.float().argmax(1)
        last = occupied.shape[1] - 1 - occupied.flip(1).float().argmax(1)
        centres.append((first + last) / 2 - (occupied.shape[1] - 1) / 2)
    return torch.stack(centres, 1)


def test_write_scattered_digits_layout_truth_and_placement(tmp_path) -> None:
    truth = write_scattered_digits(tmp_path / "a", size=12, side_range=(4, 6), max_shift=3)
    assert truth["translation_x"] == pytest.approx(0.5) and truth["scale"] == pytest.approx(math.log(1.5) / 2)
    splits = image_folder(tmp_path / "a")
    reference = digits(size=12)
    assert (len(splits.train), len(splits.test)) == (len(reference.train), len(reference.test))
    assert splits.info["classes"] == [str(d) for d in range(10)]
    x = torch.cat([splits.train.tensors[0], splits.test.tensors[0]])[:, 0]
    extent = (x > 0).flatten(1).sum(1)
    assert int(extent.max()) <= 36 and int(extent.min()) > 0  # inside a square of side <= 6, never empty
    write_scattered_digits(tmp_path / "b", size=12, side_range=(4, 6), max_shift=0)
    still = image_folder(tmp_path / "b").train.tensors[0][:, 0]
    moved, centred = _content_centres(x), _content_centres(still)
    assert float(moved.mean(0).abs().max()) < 0.5  # shifts are symmetric
    assert float(moved.std(0).min()) > 1.5 * float(centred.std(0).max())  # and they are used
    # the sizes vary too: content areas spread more than the unscaled digits' on one size
    assert int(extent.max()) - int(extent.min()) >= 20
    again = tmp_path / "c"
    write_scattered_digits(again, size=12, side_range=(4, 6), max_shift=3)
    assert torch.equal(image_folder(again).train.tensors[0], splits.train.tensors[0])
    with pytest.raises(PartitionError, match="not an empty folder"):
        write_scattered_digits(tmp_path / "a", size=12, side_range=(4, 6), max_shift=3)
    with pytest.raises(PartitionArgumentError, match="do not fit"):
        write_scattered_digits(tmp_path / "d", size=12, side_range=(4, 10), max_shift=3)
