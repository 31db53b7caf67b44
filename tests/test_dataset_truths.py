"""The built-in datasets' truths (``datasets.truths``, ``NamedDataset.true_ranges``) are what their images are drawn
under: the loaders draw by the same constants, and ``write_scattered_digits`` records what
``scattered_digits_ranges`` says."""

from __future__ import annotations

import math

from partition_fx.datasets import named_dataset, rotdigits, scaledigits, scattered_digits_ranges, write_scattered_digits


def test_the_named_datasets_record_their_truths():
    assert named_dataset("rotdigits").true_ranges == {"rotation": math.pi}
    assert named_dataset("scaledigits").true_ranges == {"scale": math.log(2.0)}
    assert named_dataset("drawndigits").true_ranges == {"scale": math.log(math.sqrt(2.0))}
    assert named_dataset("digits").true_ranges == {}
    assert named_dataset("rotcifar10").true_ranges == {"rotation": math.pi}
    assert named_dataset("cifar10").true_ranges is None and named_dataset("input_selection").true_ranges is None


def test_the_images_are_drawn_within_their_truth():
    angles = rotdigits(size=8).info["train_angles"]
    assert float(angles.abs().max()) <= named_dataset("rotdigits").true_ranges["rotation"]
    assert float(angles.abs().max()) > 0.99 * math.pi  # every angle: the truth is the whole range
    scales = scaledigits(size=8).info["train_log_scales"]
    assert float(scales.abs().max()) <= named_dataset("scaledigits").true_ranges["scale"] + 1e-6


def test_a_scattered_folder_records_the_ranges_it_is_drawn_under(tmp_path):
    truth = write_scattered_digits(tmp_path / "folder", size=12, side_range=(4, 8), max_shift=2)
    expected = scattered_digits_ranges(size=12, side_range=(4, 8), max_shift=2)
    assert {name: truth[name] for name in expected} == expected
    assert scattered_digits_ranges() == {
        "translation_x": 0.3,
        "translation_y": 0.3,
        "scale": math.log(2) / 2,
        "rotation": 0.0,
    }
