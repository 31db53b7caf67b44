"""``drawndigits``: digits drawn as pen strokes straight onto the canvas at their own zoom, so that a zoomed digit is
drawn, not resampled: the zoom's truth can be judged where a zoom is not a blur.

``scaledigits`` zooms scikit-learn's 8x8 digits, already upsampled, so its small digits are blurs and its large ones
smooth; and at its truth (zooms of 1/2 to 2) the augmentation's views reach 2.25 and 36 pixels at 28. Here each of the
ten digits is a template of strokes (lines and arcs in a unit box), every example's own: its points jittered, slanted,
narrowed or widened, tilted, drawn with its own pen width and with two stray strokes beside it; the whole digit, pen
included, is then scaled by the example's zoom, log-uniform on [1/sqrt(2), sqrt(2)] (``truths.DRAWN_MAX_ZOOM``) about a
digit 0.32 of the canvas high, and drawn anti-aliased (each pixel's coverage from its distance to the nearest stroke).
At 28 px a digit is 6.3 to 12.7 pixels high, and the views of the truth's range 4.5 to 17.9: every one legible and
uncut.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .._validation import check_int, check_open_unit
from .images import ImagePreprocessing
from .splits import (
    BOTH_SPLITS_HINT,
    DatasetSplits,
    Split,
    check_split,
    fixed_zooms,
    only_split,
    seeded_rng,
    stratified_split,
)
from .truths import DRAWN_MAX_ZOOM

PER_CLASS = 180
"""Examples of each digit: 1800 in all, about as many as scikit-learn's 1797."""
MIDDLE_HEIGHT = 0.32
"""A digit's height at zoom 1 as a share of the canvas side (9.0 px at 28)."""
SHAPES = ((-0.3, 0.3), (0.75, 1.25), (0.07, 0.15), (-0.25, 0.25))
"""Each example's slant (x moves by -slant * y), width (x times it), pen (of the digit's height) and tilt (radians),
uniform on these."""
JITTER = 0.045
"""The standard deviation of every stroke point's own displacement, of the digit's height (cut at two of them)."""
STRAY_STROKES = 2
"""Short strokes drawn at random inside each digit's box with it (lengths 0.15-0.35 of its height): marks no digit
template has, so that telling digits apart takes more than their outlines."""
SHAPE_STREAM = 9
"""The seeded stream of the strokes' jitter, slant, width and pen (``splits.seeded_rng``; 0-8 are taken)."""
_POINTS_PER_ARC = 12


def _arc(cx: float, cy: float, rx: float, ry: float, start: float, end: float) -> list[tuple[float, float]]:
    """Points of an elliptical arc from angle ``start`` to ``end`` (degrees; 0 is right, 90 down: y grows down)."""
    angles = np.radians(np.linspace(start, end, _POINTS_PER_ARC))
    return [(cx + rx * math.cos(a), cy + ry * math.sin(a)) for a in angles]


STROKES: dict[int, list[list[tuple[float, float]]]] = {
    0: [_arc(0, 0, 0.27, 0.48, 0, 360)],
    1: [[(-0.13, -0.33), (0.02, -0.5), (0.02, 0.5)]],
    2: [[*_arc(0, -0.24, 0.25, 0.24, 180, 380), (-0.26, 0.5), (0.28, 0.5)]],
    3: [_arc(0, -0.25, 0.23, 0.23, 200, 450), _arc(0, 0.24, 0.26, 0.26, 270, 500)],
    4: [[(0.12, 0.5), (0.12, -0.5), (-0.28, 0.2), (0.3, 0.2)]],
    5: [[(0.25, -0.5), (-0.2, -0.5), (-0.23, -0.05), *_arc(0, 0.2, 0.27, 0.29, 235, 500)]],
    6: [[(0.2, -0.5), (-0.05, -0.38), (-0.21, -0.1), *_arc(0, 0.24, 0.25, 0.25, 180, 540)]],
    7: [[(-0.28, -0.5), (0.28, -0.5), (-0.06, 0.5)]],
    8: [_arc(0, -0.26, 0.2, 0.22, 0, 360), _arc(0, 0.22, 0.26, 0.27, 0, 360)],
    9: [_arc(0, -0.23, 0.24, 0.26, 0, 360), [(0.24, -0.23), (0.2, 0.2), (0.08, 0.5)]],
}
"""Each digit's strokes: polylines in a box 1 high (y from -0.5 at the top to 0.5, x about 0)."""


def _segments(strokes: list[list[tuple[float, float]]]) -> torch.Tensor:
    """The strokes as segments (S, 2, 2): each consecutive pair of points."""
    pairs = [(a, b) for line in strokes for a, b in itertools.pairwise(line)]
    return torch.tensor(pairs, dtype=torch.float64)


def draw(segments: torch.Tensor, pens: torch.Tensor, size: int) -> torch.Tensor:
    """Images (N, size, size) in [0, 1] of ``segments`` (N, S, 2, 2) in pixel coordinates (x right, y down, the
    canvas from 0 to ``size``), each pixel the share of it within ``pens / 2`` (N,) of one of its image's segments
    (anti-aliased over one pixel).

    >>> image = draw(torch.tensor([[[[2.0, 4.0], [6.0, 4.0]]]], dtype=torch.float64), torch.tensor([2.0]), size=8)
    >>> image[0, 3:5, 2:6].min().item(), image[0, 0, 0].item()
    (1.0, 0.0)
    """
    grid = torch.arange(size, dtype=torch.float64) + 0.5
    pixels = torch.stack(torch.meshgrid(grid, grid, indexing="xy"), dim=-1).reshape(1, -1, 1, 2)  # x, y
    a, b = segments[:, None, :, 0], segments[:, None, :, 1]  # (N, 1, S, 2)
    along = b - a
    length2 = (along * along).sum(-1).clamp_min(1e-12)
    t = (((pixels - a) * along).sum(-1) / length2).clamp(0.0, 1.0)  # (N, P, S)
    nearest = a + t.unsqueeze(-1) * along
    distance = (pixels - nearest).norm(dim=-1).min(dim=-1).values  # (N, P)
    return (pens[:, None] / 2 - distance + 0.5).clamp(0.0, 1.0).reshape(-1, size, size)


def drawn_images(labels: np.ndarray, log_scales: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """One image (N, 1, size, size) per label: its digit's strokes jittered, slanted and stretched by draws from
    ``seed``'s shape stream (digit by digit, in label order), scaled by ``exp(log_scales)`` about the canvas centre
    (the pen too) and drawn.

    >>> x = drawn_images(np.array([0, 7]), torch.zeros(2), size=28, seed=0)
    >>> tuple(x.shape), float(x.max()), float(x[:, :, 0].max())  # ink, and none on the border
    ((2, 1, 28, 28), 1.0, 0.0)
    """
    rng = seeded_rng(seed, SHAPE_STREAM)
    images = torch.empty(len(labels), 1, size, size)
    for digit in range(10):
        rows = np.flatnonzero(labels == digit)
        if len(rows) == 0:
            continue
        segments = _segments(STROKES[digit]).expand(len(rows), -1, -1, -1)
        jitter = torch.from_numpy(rng.normal(0.0, JITTER, segments.shape)).clamp(-2 * JITTER, 2 * JITTER)
        slant, width, pen, tilt = (torch.from_numpy(rng.uniform(low, high, len(rows))) for low, high in SHAPES)
        start = torch.from_numpy(rng.uniform(-0.4, 0.4, (len(rows), STRAY_STROKES, 2)))
        angle = torch.from_numpy(rng.uniform(0, 2 * math.pi, (len(rows), STRAY_STROKES)))
        length = torch.from_numpy(rng.uniform(0.15, 0.35, (len(rows), STRAY_STROKES)))
        end = start + length.unsqueeze(-1) * torch.stack([angle.cos(), angle.sin()], dim=-1)
        x, y = segments[..., 0] + jitter[..., 0], segments[..., 1] + jitter[..., 1]
        x = (x - slant.view(-1, 1, 1) * y) * width.view(-1, 1, 1)
        cos, sin = tilt.cos().view(-1, 1, 1), tilt.sin().view(-1, 1, 1)
        shaped = torch.stack([cos * x - sin * y, sin * x + cos * y], dim=-1)
        shaped = torch.cat([shaped, torch.stack([start, end], dim=2).clamp(-0.45, 0.45)], dim=1)
        height = MIDDLE_HEIGHT * size * log_scales[torch.from_numpy(rows)].double().exp()
        drawn = draw(shaped * height.view(-1, 1, 1, 1) + size / 2, pen * height, size)
        images[torch.from_numpy(rows), 0] = drawn.float()
    return images


def drawndigits(
    size: int = 28, channels: int = 1, test_fraction: float = 0.2, seed: int = 0, split: Split | None = None
) -> DatasetSplits:
    """1800 digits (180 of each) drawn as pen strokes at their own fixed zoom, log-uniform on [1/sqrt(2), sqrt(2)]
    about a digit 0.32 of the canvas high: the truth of a learned isotropic scale range is log(sqrt(2)) (0.347), and no
    zoom, nor the augmentation's views at the truth, resamples or cuts a digit (see the module docstring). The
    log-scales come from ``seed``'s zoom stream (``splits.fixed_zooms``), the shapes from a stream of their own;
    ``info`` holds ``train_log_scales``/``test_log_scales``. Values in [0, 1] on a zero background, the grey image
    repeated to ``channels``; a stratified split as :func:`~partition_fx.datasets.digits`'.

    >>> splits = drawndigits(size=16)
    >>> len(splits.train), len(splits.test), bool(splits.info["train_log_scales"].abs().max() <= math.log(2) / 2)
    (1440, 360, True)
    """
    split = check_split(split)
    size = check_int("size", size, 8, noun="an integer")
    channels = check_int("channels", channels, 1, noun="an integer")
    test_fraction = check_open_unit("test_fraction", test_fraction, hint=BOTH_SPLITS_HINT)
    seed = check_int("seed", seed, 0, noun="an integer")
    labels = np.repeat(np.arange(10), PER_CLASS)
    log_scales = fixed_zooms(len(labels), seed, DRAWN_MAX_ZOOM)
    x = drawn_images(labels, log_scales, size, seed).expand(-1, channels, -1, -1)
    targets = torch.from_numpy(labels).long()
    train_rows, test_rows = stratified_split(labels, test_fraction, seed)
    train_idx, test_idx = torch.from_numpy(train_rows), torch.from_numpy(test_rows)
    low, high = (MIDDLE_HEIGHT * size * DRAWN_MAX_ZOOM**s for s in (-1, 1))
    both = DatasetSplits(
        train=TensorDataset(x[train_idx], targets[train_idx]),
        test=TensorDataset(x[test_idx], targets[test_idx]),
        num_classes=10,
        input_shape=(channels, size, size),
        name="drawndigits",
        description=(
            f"digits drawn as pen strokes on a {size}x{size} zero canvas, each at a fixed zoom log-uniform on "
            f"[1/{DRAWN_MAX_ZOOM:.4g}, {DRAWN_MAX_ZOOM:.4g}] ({low:.1f} to {high:.1f} px high), {channels} channel(s), "
            f"values in [0, 1]; stratified split {len(train_idx)} train / {len(test_idx)} test (seed {seed})"
        ),
        info={
            "train_indices": train_idx,
            "test_indices": test_idx,
            "train_log_scales": log_scales[train_idx],
            "test_log_scales": log_scales[test_idx],
        },
        classes=tuple(str(digit) for digit in range(10)),
        preprocessing=ImagePreprocessing("RGB" if channels == 3 else "L", channels, size, size),
    )
    return only_split(both, split)
