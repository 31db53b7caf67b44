"""What every image loader shares: decoding one image to a float tensor (:class:`DecodedImages`, the map-style
dataset that data read from disk is, one example at a time), rotating images by the rotated variants' fixed angles
(:func:`rotate_images`; the angles are drawn from their seeded stream by ``splits.fixed_angles``), and the choice
between holding a dataset decoded in memory and reading it as training asks (:func:`in_memory_or_streamed`).

Decoding is deterministic (convert, resize, scale to [0, 1], rotate by the image's fixed angle): a batch is the
same whichever process decodes it, so the input pipeline's worker processes never change a run. The learned
augmentation is applied later, on the device, by the input transform.

:class:`ImagePreprocessing` is what a dataset's images went through, as data: the same decoding (:func:`to_tensor`)
applied to a new image makes it an input of a model trained on them (``partition-fx predict``), and its
:meth:`~ImagePreprocessing.to_dict` is what reports, ``export.json`` and the ONNX file's metadata record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from ..errors import PartitionError, shortened

DEFAULT_MEMORY_BUDGET = 2**30
"""Bytes of decoded float32 images a loader holds in memory before it streams them from disk instead (1 GiB):
large enough that CIFAR-10 at 32x32 is decoded once, small enough that an image folder of ImageNet's size is read
as training asks (the sizes: docs/benchmarks.md)."""
PIXEL_SCALE = 255.0
"""What :func:`to_tensor` divides 8-bit pixel values by: every decoded image is in [0, 1], not normalised further."""
RESAMPLE = "bilinear"
"""The PIL filter :func:`to_tensor` resizes with (``PIL.Image.Resampling`` of that name)."""
PIL_MODES = ("L", "LA", "RGB", "RGBA")
"""The modes :func:`pil_mode` converts images to."""


def rotate_images(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image (N, C, H, W) about its centre by its angle in radians, counter-clockwise as displayed.
    Bilinear sampling; what comes from outside the image is 0.

    >>> image = torch.zeros(1, 1, 5, 5)
    >>> image[0, 0, 2, 4] = 1.0  # right of the centre
    >>> rotate_images(image, torch.tensor([math.pi / 2]))[0, 0].nonzero().tolist()  # now above it
    [[0, 2]]
    """
    cos, sin, zero = angles.cos(), angles.sin(), torch.zeros_like(angles)
    # affine_grid maps output coordinates to input ones; with y pointing down the screen this matrix
    # makes the content turn counter-clockwise by +angle as displayed
    theta = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], 1)
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    rotated = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return rotated.clamp_(0.0, 1.0)  # bilinear weights sum to 1 only up to rounding


def zoom_images(images: torch.Tensor, log_scales: torch.Tensor) -> torch.Tensor:
    """Each image (N, C, H, W) zoomed about its centre by exp of its log-scale (> 0: larger). Bilinear sampling;
    what comes from outside the image is 0; differentiable in ``log_scales``; values are not clamped (a caller
    whose images lie in [0, 1] clamps the rounding).

    >>> image = torch.zeros(1, 1, 5, 5)
    >>> image[0, 0, 2, 3] = 1.0  # one pixel right of the centre
    >>> zoom_images(image, torch.tensor([math.log(2.0)]))[0, 0, 2].tolist()  # now two to the right, bilinear
    [0.0, 0.0, 0.0, 0.5, 1.0]
    """
    inverse = torch.exp(-log_scales)
    zero = torch.zeros_like(inverse)
    # affine_grid maps output coordinates to input ones: the output at x samples the input at x / zoom
    theta = torch.stack([torch.stack([inverse, zero, zero], -1), torch.stack([zero, inverse, zero], -1)], 1)
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def pil_mode(channels: int | None, mode: str) -> str:
    """The PIL mode images are converted to: from ``channels`` (1: "L", 3: "RGB"), else ``mode`` made 8-bit.

    >>> pil_mode(None, "P"), pil_mode(1, "RGB"), pil_mode(None, "I;16")
    ('RGB', 'L', 'L')
    """
    from PIL import Image

    if channels == 1:
        return "L"
    if channels == 3:
        return "RGB"
    if mode in PIL_MODES:
        return mode
    # "1", "I", "I;16", "F" are grey; palette ("P"), CMYK, YCbCr... are colour
    return "L" if Image.getmodebase(mode) == "L" else "RGB"


def to_tensor(image: Any, mode: str, size: int | tuple[int, int] | None) -> torch.Tensor:
    """A PIL image as a float32 tensor (C, H, W) in [0, 1]: :func:`decode_pixels` then :func:`pixels_to_tensor`.

    >>> from PIL import Image
    >>> tuple(to_tensor(Image.new("RGB", (6, 4), "white"), "L", 3).shape)
    (1, 3, 3)
    >>> tuple(to_tensor(Image.new("RGB", (6, 4), "white"), "RGB", (5, 2)).shape)
    (3, 2, 5)
    """
    return pixels_to_tensor(decode_pixels(image, mode, size))


def decode_pixels(image: Any, mode: str, size: int | tuple[int, int] | None) -> np.ndarray:
    """A PIL image's 8-bit pixels (H, W, C), converted to PIL ``mode`` (:func:`in_mode`: deeper pixels scaled to 8
    bits, transparency over black) and resized (:data:`RESAMPLE`) to ``size`` x ``size``, or to ``size = (width,
    height)``, if given and the image is not that size already.

    >>> from PIL import Image
    >>> decode_pixels(Image.new("RGB", (6, 4), "white"), "L", None).shape
    (4, 6, 1)
    """
    from PIL import Image

    image = in_mode(image, mode)
    target = (size, size) if isinstance(size, int) else size
    if target is not None and image.size != tuple(target):
        image = image.resize(tuple(target), Image.Resampling[RESAMPLE.upper()])
    array = np.array(image, dtype=np.uint8)  # a copy: PIL's buffer may be read-only
    return array[..., None] if array.ndim == 2 else array  # single-band modes have no channel axis


class UndecodableImage(OSError):
    """An image whose pixels :func:`in_mode` does not turn into 8-bit values (a float image has no fixed range, a
    32-bit integer image no known bit depth, PIL cannot convert LAB): the message says what and how to fix it."""


SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
"""PIL's modes of unsigned 16-bit grey pixels (a 16-bit greyscale PNG or TIFF opens as one of them)."""
PREMULTIPLIED = {"La": "LA", "RGBa": "RGBA"}
"""PIL's modes with premultiplied alpha, and the plain-alpha mode each converts to."""


def bit_depth(image: Any) -> int | None:
    """The bits per pixel of a 32-bit integer (PIL mode "I") image, where its file says: a PNG's "I" pixels are 16
    bits, a TIFF's BitsPerSample tag gives its own (unsigned only); None when nothing says (an image made in
    memory, a signed TIFF).

    >>> from PIL import Image
    >>> bit_depth(Image.new("I", (2, 2))) is None
    True
    """
    if getattr(image, "format", None) == "PNG":
        return 16
    tags = getattr(image, "tag_v2", None)
    if tags is not None and tags.get(339, 1) in (1, (1,)):  # SampleFormat 1: unsigned integers
        bits = tags.get(258)
        bits = bits[0] if isinstance(bits, tuple) else bits
        return int(bits) if isinstance(bits, int) and 1 <= bits <= 32 else None
    return None


def undecodable(image: Any) -> str | None:
    """Why :func:`in_mode` refuses ``image`` (from its mode and header; nothing is decoded), or None.

    >>> from PIL import Image
    >>> undecodable(Image.new("I;16", (2, 2))) is None, undecodable(Image.new("F", (2, 2)))[:40]
    (True, '32-bit float pixels (PIL mode F) have no')
    """
    fix = "save it as an 8- or 16-bit PNG"
    if image.mode == "F":
        return f"32-bit float pixels (PIL mode F) have no fixed range to scale to [0, 1]; {fix}"
    if image.mode == "I" and bit_depth(image) is None:
        return f"32-bit integer pixels (PIL mode I) of no recorded bit depth cannot be scaled to [0, 1]; {fix}"
    if image.mode == "LAB":
        return f"PIL cannot convert LAB colour to RGB; {fix} in RGB"
    return None


def in_mode(image: Any, mode: str) -> Any:
    """``image`` as an 8-bit PIL image of ``mode`` (one of :data:`PIL_MODES`), whatever mode PIL opened it in:
    16-bit (and deeper integer) grey is scaled to 8 bits, never clipped (PIL's own ``convert("L")`` clips it at
    255); palette transparency and premultiplied alpha become plain alpha; and where ``mode`` has no alpha
    channel, transparent pixels are composited over black, the value that padding and rotation fill in. Every
    other mode (bilevel, palette, CMYK, YCbCr, HSV, ...) is converted by PIL. Pixels it cannot scale are refused
    (:func:`undecodable`, an :class:`UndecodableImage`).

    >>> from PIL import Image
    >>> grey16 = Image.fromarray(np.full((2, 2), 257 * 200, dtype=np.uint16))
    >>> grey16.mode, in_mode(grey16, "L").getpixel((0, 0)), grey16.convert("L").getpixel((0, 0))
    ('I;16', 200, 255)
    >>> in_mode(Image.new("LA", (2, 2), (200, 0)), "L").getpixel((0, 0))  # transparent: black
    0
    """
    from PIL import Image

    problem = undecodable(image)
    if problem is not None:
        raise UndecodableImage(problem)
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
        bits = 16 if image.mode in SIXTEEN_BIT_MODES else bit_depth(image)
        levels = float(2 ** (bits or 16) - 1)
        values = np.asarray(image, dtype=np.float64).clip(0.0, levels)
        image = Image.fromarray(np.rint(values * (255.0 / levels)).astype(np.uint8), mode="L")
    elif image.mode in PREMULTIPLIED:
        image = image.convert(PREMULTIPLIED[image.mode])
    elif image.mode == "PA" or (image.mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")
    if image.mode in ("LA", "RGBA") and mode not in ("LA", "RGBA"):
        black = Image.new("RGBA", image.size, (0, 0, 0, 255))
        image = Image.alpha_composite(black, image.convert("RGBA"))
    return image if image.mode == mode else image.convert(mode)


def pixels_to_tensor(pixels: np.ndarray) -> torch.Tensor:
    """8-bit pixels (..., H, W, C), one image or a stack, as float32 (..., C, H, W) divided by :data:`PIXEL_SCALE`.

    >>> pixels_to_tensor(np.full((2, 3, 1), 255, dtype=np.uint8)).tolist()
    [[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]]
    """
    return torch.from_numpy(pixels).movedim(-1, -3).float().div_(PIXEL_SCALE)


@dataclass(frozen=True)
class ImagePreprocessing:
    """How an image becomes one input of a model trained on a dataset's images: converted to PIL ``mode``,
    resized (:data:`RESAMPLE`) to ``width`` x ``height`` unless it is that size already, its 8-bit values
    divided by :data:`PIXEL_SCALE` (inputs in [0, 1], no mean/std normalisation), a grey image repeated to
    ``channels`` where ``mode`` has fewer; float32, (C, H, W), batched as NCHW. Calling it decodes a PIL image
    with :func:`to_tensor`, the function every image dataset decodes with, so an image of the dataset's size
    gives the dataset's own tensor (a rotated dataset's fixed angles are the data's, not preprocessing).

    Every image loader's ``DatasetSplits.preprocessing`` is one; :meth:`to_dict` is the record written with a
    model (``report.json``, ``export.json``, the ONNX file's metadata) and :meth:`from_dict` reads it back.

    >>> from PIL import Image
    >>> grey = ImagePreprocessing("L", channels=1, height=4, width=6)
    >>> x = grey(Image.new("RGB", (12, 8), "white"))
    >>> tuple(x.shape), float(x.max())
    ((1, 4, 6), 1.0)
    >>> ImagePreprocessing.from_dict(grey.to_dict()) == grey
    True
    """

    mode: str
    channels: int
    height: int
    width: int

    def __call__(self, image: Any) -> torch.Tensor:
        x = to_tensor(image, self.mode, (self.width, self.height))
        if x.shape[0] != self.channels:  # grey repeated, as digits' --channels N does
            x = x.expand(self.channels, -1, -1).contiguous()
        return x

    def to_dict(self) -> dict[str, Any]:
        """The record: every field, and what follows from them (the resize, scaling, dtype, layout, and an
        identity mean/std for tools that expect one), spelled out for code that is not partition-fx."""
        repeat = f", the grey channel repeated to {self.channels}" if self.channels != len(self.mode) else ""
        return {
            "mode": self.mode,
            "channels": self.channels,
            "height": self.height,
            "width": self.width,
            "resample": RESAMPLE,
            "divide_by": PIXEL_SCALE,
            "mean": [0.0] * self.channels,
            "std": [1.0] * self.channels,
            "dtype": "float32",
            "layout": "NCHW",
            "steps": (
                f"convert to PIL mode {self.mode} (16-bit grey scaled to 8 bits, not clipped; transparent pixels "
                f"over black where the mode has no alpha); resize to {self.width}x{self.height} (width x height, PIL "
                f"{RESAMPLE}) unless it is that size; divide the 8-bit values by {PIXEL_SCALE:g} (inputs in [0, 1], "
                f"no mean/std normalisation){repeat}; float32 {self.channels}x{self.height}x{self.width}, batched NCHW"
            ),
        }

    @classmethod
    def from_dict(cls, record: Any, source: str = "the record") -> ImagePreprocessing:
        """The preprocessing :meth:`to_dict` wrote; anything else (another version's record) is refused naming
        ``source`` and what differs.

        >>> ImagePreprocessing.from_dict({"mode": "L"}, "model.onnx")
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionError: model.onnx: its preprocessing record is not this version's (...
        """
        problem, preprocessing = _preprocessing_problem(cls, record)
        if problem:
            shown = shortened(repr(dict(record) if isinstance(record, Mapping) else record))
            raise PartitionError(
                f"{source}: its preprocessing record is not this version's ({problem}): {shown}; export "
                "the model again with this version"
            )
        return preprocessing


def _preprocessing_problem(cls: type[ImagePreprocessing], record: Any) -> tuple[str, Any]:
    """What is wrong with ``record`` as :meth:`ImagePreprocessing.to_dict`'s (empty if nothing), and the
    preprocessing it describes."""
    if not isinstance(record, Mapping):
        return "not a JSON object", None
    missing = [name for name in ("mode", "channels", "height", "width") if name not in record]
    if missing:
        return f"it lacks {', '.join(missing)}", None
    mode, sizes = record["mode"], [record[name] for name in ("channels", "height", "width")]
    if mode not in PIL_MODES or not all(type(v) is int and v >= 1 for v in sizes):
        return "mode, channels, height or width is not valid", None
    if sizes[0] != len(mode) and mode != "L":
        return f"{sizes[0]} channels from mode {mode}", None
    preprocessing = cls(mode, *sizes)
    expected = preprocessing.to_dict()
    differ = sorted(k for k in {*expected, *record} if k != "steps" and record.get(k) != expected.get(k))
    return (f"{', '.join(differ)} differ from what this version decodes" if differ else ""), preprocessing


STATISTICS = ("brightness", "contrast", "roughness")
"""What :class:`InputStatistics` measures of each image: its mean value, its standard deviation, and the mean
absolute difference between neighbouring pixels (high for noise, low for a blurred or upscaled image)."""


def image_statistics(images: torch.Tensor) -> torch.Tensor:
    """Each image's :data:`STATISTICS` (N, 3) of a batch (N, C, H, W) of decoded inputs.

    >>> image_statistics(torch.ones(2, 1, 4, 4)).tolist()
    [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """
    x = images.double()  # in float64, so that the rounded ranges a model records are the same on every CPU
    across = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1) if x.shape[-1] > 1 else x.new_zeros(len(x))
    down = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1) if x.shape[-2] > 1 else x.new_zeros(len(x))
    flat = x.flatten(1)
    return torch.stack([flat.mean(1), flat.std(1, correction=0), (across + down) / 2], dim=1)


@dataclass(frozen=True)
class InputStatistics:
    """The range of each of :data:`STATISTICS` over a dataset's images (their 0.1% and 99.9% quantiles, widened by
    :attr:`MARGIN` of the range on each side): what ``partition-fx predict`` compares a new image with, to warn when
    it is unlike every image the model was trained on (an inverted background, noise, unscaled pixel values), where
    the model would still answer with confidence. ``images``: how many it was measured on, from the ``split``.

    >>> from partition_fx.datasets import digits
    >>> statistics = InputStatistics.of(digits(size=16).train)
    >>> statistics.unlike(digits(size=16).test[0][0]) is None
    True
    >>> statistics.unlike(1 - digits(size=16).test[0][0])  # an inverted digit
    "its brightness 0.89 is outside the training images' 0.08..0.17"
    """

    low: tuple[float, ...]
    high: tuple[float, ...]
    images: int
    split: str = "train"

    MARGIN = 0.1
    """The part of each statistic's range added on both of its sides: an image just beyond is not flagged."""
    SAMPLE = 2000
    """The most images measured (drawn at random, with a fixed seed, from a larger dataset)."""

    @classmethod
    def of(cls, dataset: Dataset, split: str = "train") -> InputStatistics:
        """Measured on up to :attr:`SAMPLE` images of ``dataset`` (a ``TensorDataset`` or any map-style dataset of
        ``(image, target)``)."""
        count = len(dataset)  # type: ignore[arg-type]
        if count == 0:
            raise PartitionError(f"no images in the {split} split to measure")
        rows = torch.randperm(count, generator=torch.Generator().manual_seed(0))[: cls.SAMPLE].sort().values
        if isinstance(dataset, TensorDataset):
            images = dataset.tensors[0][rows]
        else:
            images = torch.stack([dataset[int(i)][0] for i in rows])
        values = image_statistics(images)
        quantiles = torch.quantile(values.double(), torch.tensor([0.001, 0.999], dtype=torch.float64), dim=0)
        margin = (quantiles[1] - quantiles[0]) * cls.MARGIN
        low, high = (quantiles[0] - margin).tolist(), (quantiles[1] + margin).tolist()
        return cls(tuple(round(v, 6) for v in low), tuple(round(v, 6) for v in high), len(rows), split)

    def unlike(self, image: torch.Tensor) -> str | None:
        """Why ``image`` (C, H, W, decoded as the dataset's) is unlike the dataset's images, or None when each
        statistic is in its range."""
        values = image_statistics(image[None])[0].tolist()
        for name, value, low, high in zip(STATISTICS, values, self.low, self.high):
            if not low <= value <= high:
                return f"its {name} {value:.2f} is outside the training images' {max(low, 0.0):.2f}..{high:.2f}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The record written with a model, each range by its statistic's name."""
        ranges = {name: [low, high] for name, low, high in zip(STATISTICS, self.low, self.high)}
        return {**ranges, "images": self.images, "split": self.split, "quantiles": [0.001, 0.999],
                "margin": self.MARGIN}  # fmt: skip

    @classmethod
    def from_dict(cls, record: Any, source: str = "the record") -> InputStatistics:
        """The statistics :meth:`to_dict` wrote; anything else is refused naming ``source``."""
        try:
            ranges = [tuple(float(v) for v in record[name]) for name in STATISTICS]
            if not all(len(r) == 2 for r in ranges):
                raise ValueError("each range is two numbers")
            return cls(tuple(r[0] for r in ranges), tuple(r[1] for r in ranges), int(record["images"]),
                       str(record["split"]))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise PartitionError(
                f"{source}: its input_statistics record is not this version's ({e}); export the model again"
            ) from None


class ImageReader(Protocol):
    """Reads example ``i`` of a source as ``(PIL image, class)``; ``name(i)`` says what it is in an error (a
    file's path). Picklable, so that worker processes started by spawn or forkserver can hold it."""

    def __call__(self, index: int) -> tuple[Any, int]: ...

    def name(self, index: int) -> str: ...


class PairImages:
    """The :class:`ImageReader` of a sequence or map-style dataset of ``(PIL image, class)`` pairs, such as
    torchvision's datasets without a transform; ``name`` says what they are in an error.

    >>> from PIL import Image
    >>> read = PairImages([(Image.new("L", (3, 3), 7), 4), (Image.new("L", (3, 3), 7), 5)], "blank")
    >>> image, target = read(1)
    >>> image.size, image.mode, target, read.name(1)
    ((3, 3), 'L', 5, 'blank image 1')
    """

    def __init__(self, dataset: Any, name: str) -> None:
        self.dataset = dataset
        self.source = name

    def __call__(self, index: int) -> tuple[Any, int]:
        image, target = self.dataset[index]
        return image, int(target)

    def name(self, index: int) -> str:
        return f"{self.source} image {index}"


class DecodedImages(Dataset):
    """A map-style dataset of ``(image, target)``: example ``i`` is ``read(i)`` decoded by :func:`to_tensor` to
    PIL ``mode`` at ``size`` (None: as stored) and, with
    ``angles``, rotated by ``angles[i]``. Nothing is held but what ``read`` holds, so it can be larger than
    memory; worker processes decode it in parallel (the input pipeline), and the result does not depend on which
    process does.

    >>> from PIL import Image
    >>> pairs = [(Image.new("L", (4, 4), 50 * i), i % 2) for i in range(3)]
    >>> images = DecodedImages(PairImages(pairs, "grey"), 3, "L", size=2)
    >>> x, y = images[2]
    >>> len(images), tuple(x.shape), round(float(x[0, 0, 0]), 3), y
    (3, (1, 2, 2), 0.392, 0)
    """

    def __init__(
        self,
        read: ImageReader,
        length: int,
        mode: str,
        size: int | None = None,
        angles: torch.Tensor | None = None,
    ) -> None:
        self.read = read
        self.length = length
        self.mode = mode
        self.size = size
        self.angles = angles

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} images")
        try:
            image, target = self.read(index)
            x = to_tensor(image, self.mode, self.size)
        except OSError as error:  # includes PIL.UnidentifiedImageError
            raise unreadable_image(self.read.name(index), error) from error
        if self.angles is not None:
            x = rotate_images(x[None], self.angles[index : index + 1])[0]
        return x, int(target)


def size_mismatch(first: Any, first_size: tuple[int, int], path: Any, size: tuple[int, int]) -> PartitionError:
    """The refusal of images of different sizes that are not resized: ``path`` is not ``first``'s size.

    >>> str(size_mismatch("a.png", (6, 4), "b.png", (5, 5)))[:54]
    'images differ in size: a.png is 6x4 but b.png is 5x5 ('
    """
    return PartitionError(
        f"images differ in size: {first} is {first_size[0]}x{first_size[1]} but {path} is {size[0]}x{size[1]} "
        "(width x height); pass size=... (--image-size) to resize all images"
    )


def unreadable_image(path: Any, error: OSError) -> PartitionError:
    """The refusal of a file PIL cannot read as an image (``error``: PIL's, e.g. ``UnidentifiedImageError``), or
    whose pixels cannot be decoded (an :class:`UndecodableImage`, which says how to fix it).

    >>> str(unreadable_image("a.txt", OSError("not an image")))
    'cannot read image a.txt: not an image; remove or replace the file'
    """
    if isinstance(error, UndecodableImage):
        return PartitionError(f"cannot decode image {path}: {error}")
    return PartitionError(f"cannot read image {path}: {error}; remove or replace the file")


def empty_split(shape: Sequence[int]) -> TensorDataset:
    """A split with no examples of ``shape`` (what a loader returns for the split not asked for).

    >>> tuple(empty_split((3, 8, 8)).tensors[0].shape)
    (0, 3, 8, 8)
    """
    return TensorDataset(torch.zeros(0, *shape), torch.zeros(0, dtype=torch.long))


def decode_all(images: Dataset, batch_size: int = 256) -> TensorDataset:
    """Every example of ``images`` decoded into one ``TensorDataset`` (float32 inputs, int64 targets).

    >>> from PIL import Image
    >>> pairs = [(Image.new("L", (4, 4)), i % 2) for i in range(5)]
    >>> decoded = decode_all(DecodedImages(PairImages(pairs, "black"), 5, "L"))
    >>> tuple(decoded.tensors[0].shape), decoded.tensors[1].tolist()
    ((5, 1, 4, 4), [0, 1, 0, 1, 0])
    """
    from torch.utils.data import DataLoader

    parts = list(DataLoader(images, batch_size=batch_size))  # default_collate stacks each batch
    if not parts:
        return TensorDataset(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    return TensorDataset(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]).long())


def decoded_bytes(count: int, shape: Sequence[int]) -> int:
    """Bytes ``count`` float32 images of ``shape`` take decoded.

    >>> decoded_bytes(50000, (3, 32, 32))
    614400000
    """
    return count * math.prod(shape) * 4


def in_memory_or_streamed(
    images: DecodedImages, shape: Sequence[int], in_memory: bool | None, budget: int
) -> TensorDataset | DecodedImages:
    """``images`` decoded into memory (``in_memory=True``, or None and their decoded size within ``budget``
    bytes), else as they are, decoded one example at a time when training reads it.

    >>> from PIL import Image
    >>> images = DecodedImages(PairImages([(Image.new("L", (4, 4)), 0)] * 4, "black"), 4, "L")
    >>> type(in_memory_or_streamed(images, (1, 4, 4), None, budget=256)).__name__
    'TensorDataset'
    >>> type(in_memory_or_streamed(images, (1, 4, 4), None, budget=255)).__name__
    'DecodedImages'
    """
    if in_memory is None:
        in_memory = decoded_bytes(len(images), shape) <= budget
    return decode_all(images) if in_memory else images
