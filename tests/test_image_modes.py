"""Every PIL mode an image file can open in is decoded by its bit depth, in one place (``datasets.images.in_mode``),
for training from a folder and for ``partition-fx predict`` alike: 16-bit grey scaled to 8 bits (PIL's own
``convert("L")`` clips it at 255), transparency composited over black, the modes PIL converts itself converted,
and the ones no decoding can scale (float, integer of unknown depth, LAB) refused in one line naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from partition_fx.cli.predict import read_image
from partition_fx.datasets import image_folder
from partition_fx.datasets.images import ImagePreprocessing, UndecodableImage, in_mode
from partition_fx.errors import PartitionError


def _grey16(pixels: np.ndarray) -> Image.Image:
    """8-bit grey ``pixels`` as the same image in 16 bits (v * 257 maps 0..255 onto 0..65535 exactly)."""
    return Image.fromarray(pixels.astype(np.uint16) * 257)


@settings(max_examples=40, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9))))
def test_a_16_bit_image_decodes_as_the_same_8_bit_image(pixels):
    image16 = _grey16(pixels)
    assert image16.mode == "I;16"
    assert np.array_equal(np.asarray(in_mode(image16, "L")), pixels)
    assert np.array_equal(np.asarray(in_mode(image16, "RGB")), np.asarray(Image.fromarray(pixels).convert("RGB")))


@settings(max_examples=40, deadline=None)
@given(arrays(np.uint16, st.tuples(st.integers(1, 9), st.integers(1, 9))))
def test_16_bit_values_are_scaled_not_clipped(values):
    expected = np.rint(values.astype(np.float64) * 255 / 65535).astype(np.uint8)
    assert np.array_equal(np.asarray(in_mode(Image.fromarray(values), "L")), expected)


def test_16_bit_files_read_as_their_8_bit_twins(tmp_path):
    """PNG and TIFF, as PIL opens the files (I;16), through the preprocessing predict uses."""
    pixels = np.random.default_rng(0).integers(0, 256, (6, 7), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "grey8.png")
    for name in ("grey16.png", "grey16.tif"):
        _grey16(pixels).save(tmp_path / name)
        for preprocessing in (ImagePreprocessing("L", 1, 6, 7), ImagePreprocessing("RGB", 3, 4, 5)):
            assert torch.equal(
                read_image(tmp_path / name, preprocessing), read_image(tmp_path / "grey8.png", preprocessing)
            )


def _alpha_over_black(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The definition: each channel times its pixel's opacity, over a black background."""
    composite = Image.alpha_composite(
        Image.new("RGBA", rgb.shape[1::-1], (0, 0, 0, 255)), Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA")
    )
    return np.asarray(composite.convert("RGB"))


def test_transparency_is_composited_over_black_in_every_mode_that_has_it():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    alpha[0, :] = 0  # fully transparent: black whatever colour the pixel holds
    expected = _alpha_over_black(rgb, alpha)
    rgba = Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA")
    assert np.array_equal(np.asarray(in_mode(rgba, "RGB")), expected)
    assert np.array_equal(np.asarray(in_mode(rgba, "L")), np.asarray(Image.fromarray(expected).convert("L")))
    assert np.array_equal(np.asarray(in_mode(rgba, "RGBA")), np.asarray(rgba))  # kept where the mode has alpha
    assert not np.asarray(in_mode(rgba, "L"))[0].any()
    grey = rgb[..., 0]
    la = Image.fromarray(np.dstack([grey, alpha]), mode="LA")
    assert np.array_equal(
        np.asarray(in_mode(la, "L")),
        _alpha_over_black(np.dstack([grey] * 3), alpha)[..., 0],
    )
    # a palette image with a transparent index (a GIF's): that index is black, the others their colour
    palette = Image.fromarray(rng.integers(0, 4, (5, 6), dtype=np.uint8), mode="P")
    palette.putpalette([255, 255, 255, 10, 20, 30, 40, 50, 60, 70, 80, 90])
    palette.info["transparency"] = 0
    decoded = np.asarray(in_mode(palette, "RGB"))
    indices = np.asarray(palette)
    assert not decoded[indices == 0].any()
    assert np.array_equal(decoded[indices == 1], np.tile([10, 20, 30], ((indices == 1).sum(), 1)))
    # premultiplied alpha (La, RGBa) and palette-with-alpha (PA) decode too
    for mode in ("La", "RGBa", "PA"):
        assert in_mode(Image.new(mode, (3, 3)), "L").mode == "L"


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "HSV"])
def test_modes_pil_converts_decode_as_pil_converts_them(mode):
    rng = np.random.default_rng(2)
    image = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8), mode="RGB").convert(mode)
    for target in ("L", "RGB"):
        assert np.array_equal(np.asarray(in_mode(image, target)), np.asarray(image.convert(target)))


def test_integer_pixels_of_known_depth_are_scaled_by_it():
    png = Image.fromarray(np.array([[0, 257 * 100, 65535]], dtype=np.int32), mode="I")
    png.format = "PNG"  # a PNG's "I" pixels are 16 bits
    assert np.asarray(in_mode(png, "L")).tolist() == [[0, 100, 255]]


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: Image.new("F", (3, 3), 0.5), "32-bit float pixels (PIL mode F)"),
        (lambda: Image.new("I", (3, 3), 7), "32-bit integer pixels (PIL mode I) of no recorded bit depth"),
        (lambda: Image.new("LAB", (3, 3)), "PIL cannot convert LAB"),
    ],
)
def test_pixels_no_decoding_can_scale_are_refused_naming_the_file_and_the_fix(tmp_path, make, fragment):
    with pytest.raises(UndecodableImage, match="save it as an 8- or 16-bit PNG"):
        in_mode(make(), "L")
    path = tmp_path / "odd.tif"
    make().save(path)
    with pytest.raises(PartitionError) as refused:
        read_image(path, ImagePreprocessing("L", 1, 3, 3))
    message = str(refused.value)
    assert message.startswith(f"cannot decode image {path}: ") and "\n" not in message


def test_a_folder_of_16_bit_images_trains_on_what_its_8_bit_twin_holds(tmp_path):
    rng = np.random.default_rng(3)
    for label in ("a", "b"):
        for folder in ("eight", "sixteen"):
            (tmp_path / folder / label).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "eight" / label / f"{i}.png")
            _grey16(pixels).save(tmp_path / "sixteen" / label / f"{i}.png")
    for in_memory in (True, False):
        eight = image_folder(tmp_path / "eight", in_memory=in_memory, test_fraction=0.25)
        sixteen = image_folder(tmp_path / "sixteen", in_memory=in_memory, test_fraction=0.25)
        assert sixteen.preprocessing == eight.preprocessing
        for part in ("train", "test"):
            ours, theirs = getattr(sixteen, part), getattr(eight, part)
            assert all(torch.equal(ours[i][0], theirs[i][0]) for i in range(len(theirs)))


def test_a_folder_of_float_images_is_refused_when_it_is_read(tmp_path):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(2):
            Image.new("F", (4, 4), 0.5).save(tmp_path / label / f"{i}.tif")
    for in_memory in (True, False):  # streamed folders check every header before training starts
        with pytest.raises(PartitionError, match=r"cannot decode image .*\.tif: 32-bit float pixels"):
            image_folder(Path(tmp_path), in_memory=in_memory)
