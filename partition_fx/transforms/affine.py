"""``AffineAugmentation``: differentiable affine augmentation with learnable ranges (Augerino)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import check_choice, check_int
from ..choices import (
    AFFINE_GENERATORS,
    AUGMENTATION_DRAWS,
    RANGE_NAMES,
    generator_set_name,
)
from ..errors import PartitionArgumentError, PartitionCheckpointError
from ..ranges import DEFAULT_MAX_RANGE, generator_names, learning_bounds, learning_start
from .base import HyperparameterModule, Widenable

# Lie-algebra generators of the affine group as 3x3 homogeneous matrices in the normalised [-1, 1]
# coordinates of ``F.affine_grid`` (x: left to right, y: top to bottom). A coefficient vector c maps
# to the transform exp(sum_i c_i G_i), so every c is a valid (invertible) affine map and c = 0 is the
# identity -- which is why ranges can start at zero and be learned by gradient descent (Benton et al.
# 2020; the matrix-exponential parametrisation of Immer et al. 2022).
GENERATORS: dict[str, tuple[tuple[float, ...], ...]] = {
    "translation_x": ((0, 0, 1), (0, 0, 0), (0, 0, 0)),
    "translation_y": ((0, 0, 0), (0, 0, 1), (0, 0, 0)),
    "rotation": ((0, -1, 0), (1, 0, 0), (0, 0, 0)),
    "scale_x": ((1, 0, 0), (0, 0, 0), (0, 0, 0)),
    "scale_y": ((0, 0, 0), (0, 1, 0), (0, 0, 0)),
    "shear": ((0, 1, 0), (1, 0, 0), (0, 0, 0)),
    # Augerino's pair in place of scale_x/scale_y: both axes zoomed alike, and the aspect ratio on its own.
    "scale": ((1, 0, 0), (0, 1, 0), (0, 0, 0)),
    "stretch": ((1, 0, 0), (0, -1, 0), (0, 0, 0)),
}
assert tuple(GENERATORS) == RANGE_NAMES  # the command line names them without importing torch

PADDING_MODES = ("zeros", "border", "reflection")


class AffineAugmentation(Widenable, HyperparameterModule):
    """Random affine transforms of an image batch whose ranges are learnable hyperparameters.

    Each sample draws eps ~ U[-1, 1] per generator and applies exp(sum_i eps_i * ranges_i * G_i), so
    ``ranges_i`` (its absolute value: eps is symmetric) is the half-width of the uniform distribution
    over generator i's coefficient. Rotation is in radians and a positive coefficient turns the image
    counter-clockwise as displayed (row 0 at the top): a coefficient of pi/2 equals
    ``torch.rot90(x, 1, dims=(-2, -1))`` for square images with ``align_corners=False``. Coordinates are
    normalised to [-1, 1] per axis, so on non-square images a "rotation" also rescales by the aspect ratio.

    **Sample-major contract.** In training mode ``forward`` maps ``x`` of shape [B, C, H, W] to
    [S * B, C, H, W] with S = ``num_samples``, ordered sample-major: ``out.view(S, B, C, H, W)[s]`` is
    sample s of every example, and ``out[s * B + b]`` is sample s of example b. The trainer reshapes the
    model's outputs to [S, B, ...] and averages the per-sample likelihoods over S. In eval mode
    ``forward`` returns ``x`` itself (no augmentation, batch not expanded), so S = 1 there.

    **Generators.** ``generators`` names the ranges: a sequence of names of ``GENERATORS``, or a named set of
    ``choices.GENERATOR_SETS``: ``"xy"`` (the default: translations, rotation, independent x and y zooms,
    shear) or ``"augerino"`` (Augerino's: an isotropic ``scale`` and a ``stretch`` of the aspect ratio in place
    of the two zooms, which span the same maps but let the data keep one without the other).

    **Draws.** ``draws="stratified"`` (the default) draws each generator's S coefficients of an example as a
    Latin hypercube: one in each of S equal strata of [-1, 1], in a random order. Each coefficient is still
    uniform on [-1, 1], so the expected loss is the same; its average over the S samples varies less, which lets
    the hyperparameter step use few samples. ``"uniform"`` (the paper's) draws every coefficient independently.

    **Where learning starts.** ``init="wide"`` (the default) starts every range at ``ranges.WIDE_START`` (within its
    bound): wide augmentation that keeps the image, for the LML to shrink where the data does not hold it (with
    ``train_range_factor`` < 1, the default, the subnetworks that score psi are trained narrower than psi, which
    pulls such ranges down). ``init="zero"`` (or ``0.0``, the paper's start) starts every range at 0, a number
    every range there, a mapping the ranges it names (the others at 0) and ``init="bounds"`` every range at its
    bound (``max_range``, default ``ranges.DEFAULT_MAX_RANGE``). ``docs/benchmarks.md`` measures these starts.

    Example::

        >>> import torch
        >>> from partition_fx.transforms import AffineAugmentation
        >>> aug = AffineAugmentation(num_samples=4, init={"rotation": 0.5})
        >>> x = torch.randn(2, 3, 8, 8)
        >>> aug(x).shape
        torch.Size([8, 3, 8, 8])
        >>> aug.hyperparameters()["rotation"], aug.hyperparameters()["scale_x"]
        (0.5, 0.0)
        >>> aug.eval()(x) is x
        True
    """

    # The buffers __init__ registers (nn.Module's __getattr__ would type them Tensor | Module).
    generator_ids: torch.Tensor
    generator_matrices: torch.Tensor
    max_ranges: torch.Tensor

    def __init__(
        self,
        num_samples: int = 8,
        generators: Sequence[str] | str = AFFINE_GENERATORS,
        init: float | Mapping[str, float] | str = "wide",
        max_range: Mapping[str, float] | None = None,
        padding_mode: str = "zeros",
        align_corners: bool = False,
        draws: str = "stratified",
    ) -> None:
        super().__init__()
        self.num_samples = _check_num_samples(num_samples)
        self.generators: tuple[str, ...] = generator_names(generators)
        self.draws = check_choice("draws", draws, AUGMENTATION_DRAWS)
        self.padding_mode = check_choice("padding_mode", padding_mode, PADDING_MODES)  # F.grid_sample's modes
        self.align_corners = bool(align_corners)
        bounds = learning_bounds(max_range, self.generators)
        self.max_range: dict[str, float] = bounds
        start = learning_start(init, bounds)
        self.ranges = nn.Parameter(torch.tensor([start[name] for name in self.generators], dtype=torch.float32))
        # Which generator each range belongs to (its index in RANGE_NAMES), saved beside the ranges: the xy and
        # augerino sets both have six, so without it a checkpoint of one would load into the other without a word.
        self.register_buffer("generator_ids", torch.tensor([RANGE_NAMES.index(name) for name in self.generators]))
        # Constants derived from the arguments, not state: non-persistent so checkpoints hold only ranges.
        matrices = torch.tensor([GENERATORS[name] for name in self.generators], dtype=torch.float32)
        self.register_buffer("generator_matrices", matrices, persistent=False)
        limits = torch.tensor([bounds[name] for name in self.generators], dtype=torch.float32)
        self.register_buffer("max_ranges", limits, persistent=False)

    @classmethod
    def fixed(cls, ranges: Mapping[str, float], num_samples: int = 8, **options: Any) -> AffineAugmentation:
        """An augmentation whose ranges are fixed at ``ranges`` (every generator not named at 0) and are not
        learned (``self.ranges.requires_grad`` is False, so ``fit`` steps nothing): training with a chosen
        augmentation (appendix G's retraining; ``partition-fx train --fix``). A range may exceed its learning
        bound (``DEFAULT_MAX_RANGE``: rotation 3.1416 > pi): the bound of a fixed range is raised to hold it.
        ``options``: the constructor's others (``generators``, ``draws``, ``padding_mode``, ``align_corners``).

        >>> import math
        >>> aug = AffineAugmentation.fixed({"rotation": math.pi}, num_samples=2)
        >>> aug.hyperparameters()["rotation"] == float(torch.tensor(math.pi)), aug.ranges.requires_grad
        (True, False)
        >>> AffineAugmentation.fixed({"rotate": 1.0})
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: init has key 'rotate', which is not one of this module's ...
        """
        bounds = {
            name: max(DEFAULT_MAX_RANGE[name], abs(value)) for name, value in ranges.items() if name in GENERATORS
        }
        augmentation = cls(num_samples=num_samples, init=dict(ranges), max_range=bounds, **options)
        augmentation.ranges.requires_grad_(False)
        return augmentation

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Refuse a state of other generators, with one message naming both sets; a state written before the
        generators were saved (every such run used the xy set's order, or its own ``generators``) loads as before,
        as ``nn.BatchNorm`` fills in a missing ``num_batches_tracked``."""
        key = prefix + "generator_ids"
        saved = state_dict.setdefault(key, self.generator_ids)
        if isinstance(saved, torch.Tensor) and saved.tolist() != self.generator_ids.tolist():
            theirs = [RANGE_NAMES[i] if 0 <= i < len(RANGE_NAMES) else f"#{i}" for i in saved.tolist()]
            name = generator_set_name(theirs)
            fix = f"generators={name!r} (--generators {name})" if name else f"generators={theirs}"
            raise PartitionCheckpointError(
                f"the state's affine ranges are of the generators {', '.join(theirs)}, but this AffineAugmentation's "
                f"are {', '.join(self.generators)}: build the augmentation with {fix} to load it"
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def is_fixed(self) -> bool:
        """Whether the ranges are fixed (not learned): :meth:`fixed`, or ``ranges.requires_grad_(False)``."""
        return not self.ranges.requires_grad

    def forward(self, x: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
        """[B, C, H, W] -> [S * B, C, H, W] (sample-major) in training mode; ``x`` itself in eval mode.

        ``num_samples`` overrides ``self.num_samples`` for this call.
        """
        _check_images(x)
        if not self.training:
            return x
        s = self.num_samples if num_samples is None else _check_num_samples(num_samples)
        eps = self.draw(s, x.shape[0], x)
        if isinstance(self._spread, torch.Tensor):
            eps = eps * self._spread.to(eps.dtype)
        elif self._spread != 1.0:
            eps = eps * self._spread
        return self.transform(x, eps)

    def spread_of(self, factor: float | Mapping[str, float]) -> float | torch.Tensor:
        """:meth:`widened`'s factor as ``forward`` applies it: one number for every range, or a mapping from
        generator names to each range's own factor (every range it does not name at 1), as a tensor [G].

        >>> aug = AffineAugmentation(generators="augerino")
        >>> aug.spread_of({"scale": 2.0}).tolist()
        [1.0, 1.0, 1.0, 2.0, 1.0, 1.0]
        >>> aug.spread_of({"scale_x": 2.0})
        Traceback (most recent call last):
        ...
        partition_fx.errors.PartitionArgumentError: factor has key 'scale_x', which is not one of this module's ...
        """
        if not isinstance(factor, Mapping):
            return float(super().spread_of(factor))
        given = {name: float(super(AffineAugmentation, self).spread_of(value)) for name, value in factor.items()}
        unknown = [name for name in given if name not in self.generators]
        if unknown:
            raise PartitionArgumentError(
                f"factor has key {unknown[0]!r}, which is not one of this module's generators {self.generators}; "
                "remove it or add it to generators"
            )
        return torch.tensor([given.get(name, 1.0) for name in self.generators], device=self.ranges.device)

    def draw(self, num_samples: int, batch: int, like: torch.Tensor) -> torch.Tensor:
        """Coefficients eps [S, B, G] in [-1, 1] for ``num_samples`` transforms of each of ``batch`` examples, as
        ``draws`` says, on ``like``'s device and dtype, from the global generator (``torch.manual_seed`` fixes
        them).

        >>> aug = AffineAugmentation(generators=["rotation"], draws="stratified")
        >>> eps = aug.draw(4, 1, torch.zeros(1))
        >>> sorted(int(k) for k in ((eps.flatten() + 1) / 2 * 4).floor())  # one in each quarter of [-1, 1]
        [0, 1, 2, 3]
        """
        shape = (num_samples, batch, len(self.generators))
        uniform = torch.rand(shape, device=like.device, dtype=like.dtype)
        if self.draws == "uniform":
            return uniform * 2 - 1
        # A random permutation of the strata per example and generator: the ranks of S more uniform draws.
        strata = torch.rand(shape, device=like.device).argsort(dim=0).to(like.dtype)
        return (strata + uniform) / num_samples * 2 - 1

    def transform(self, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Apply the transforms of coefficients ``eps`` (shape [S, B, G], in [-1, 1]) to ``x`` [B, C, H, W].

        Deterministic and mode-independent: ``forward`` in training mode is ``transform`` with uniform eps.
        Returns [S * B, C, H, W], sample-major.
        """
        _check_images(x)
        b = x.shape[0]
        if eps.dim() != 3 or eps.shape[1] != b or eps.shape[2] != len(self.generators):
            raise PartitionArgumentError(
                f"eps must have shape [S, {b}, {len(self.generators)}] (samples, batch, generators), "
                f"got {tuple(eps.shape)}"
            )
        return apply_affine(x, self.transform_matrices(eps), self.padding_mode, self.align_corners)

    def transform_matrices(self, eps: torch.Tensor) -> torch.Tensor:
        """The affine matrices [..., 2, 3] (``F.affine_grid``'s theta) for coefficients ``eps`` [..., G].

        theta = exp(sum_i eps_i * ranges_i * G_i)[:2, :]; with eps = 1 and a single generator it is
        exp(ranges * G), e.g. the rotation matrix [[cos r, -sin r], [sin r, cos r]] for rotation r.
        """
        if eps.dim() < 1 or eps.shape[-1] != len(self.generators):
            raise PartitionArgumentError(
                f"eps must end in one coefficient per generator ({len(self.generators)}: {self.generators}), "
                f"got shape {tuple(eps.shape)}"
            )
        # matrix_exp needs at least single precision (no half kernels on CPU) and keeps float64 if given. Autocast
        # is off here: it would run the einsum in bf16/fp16, whose matrix exponential of wide ranges is NaN.
        dtype = torch.promote_types(eps.dtype, torch.float32)
        with torch.autocast(eps.device.type, enabled=False):
            coefficients = eps.to(dtype) * self.ranges.to(dtype)
            algebra = torch.einsum("...g,gij->...ij", coefficients, self.generator_matrices.to(dtype))
            # torch.linalg's functions come from torch._C._linalg, which has no stubs: the type is said here.
            exponential: torch.Tensor = torch.linalg.matrix_exp(algebra)
            return exponential[..., :2, :]

    def range_values(self) -> dict[str, float]:
        """{generator name: |range|} as plain floats; rotation in radians, the others in coefficient units."""
        values: list[float] = self.ranges.detach().abs().tolist()
        return dict(zip(self.generators, values))

    def hyperparameters(self) -> dict[str, float | list[float]]:
        """The :meth:`range_values`."""
        return {**self.range_values()}

    @torch.no_grad()
    def constrain_(self) -> None:
        """Clamp each range into [-max_range, max_range] (defaults in ``DEFAULT_MAX_RANGE``)."""
        limits = self.max_ranges.to(self.ranges.dtype)
        self.ranges.copy_(torch.clamp(self.ranges, -limits, limits))

    def extra_repr(self) -> str:
        draws = "" if self.draws == "uniform" else f", draws={self.draws!r}"
        return (
            f"num_samples={self.num_samples}, generators={self.generators}, "
            f"padding_mode={self.padding_mode!r}, align_corners={self.align_corners}{draws}"
        )


def apply_affine(x: torch.Tensor, theta: torch.Tensor, padding_mode: str, align_corners: bool) -> torch.Tensor:
    """Images ``x`` [B, C, H, W] under the affine matrices ``theta`` [S, B, 2, 3] (``F.affine_grid``'s), bilinear:
    [S * B, C, H, W], sample-major (index s * B + b). :meth:`AffineAugmentation.transform` and
    ``TestTimeAveraged`` both sample this way.

    >>> x = torch.rand(2, 1, 4, 4)
    >>> identity = torch.eye(2, 3).expand(3, 2, 2, 3)
    >>> torch.allclose(apply_affine(x, identity, "zeros", False), x.repeat(3, 1, 1, 1), atol=1e-6)
    True
    """
    s, b = theta.shape[:2]
    size = (s * b, *x.shape[1:])
    grid = F.affine_grid(theta.reshape(s * b, 2, 3).to(x.dtype), list(size), align_corners=align_corners)
    # expand + reshape lays the copies out sample-major (index s * B + b) without a Python loop.
    xs = x.unsqueeze(0).expand(s, *x.shape).reshape(size)
    # Bilinear, not nearest: nearest has zero gradient with respect to the grid, so ranges would not learn.
    return F.grid_sample(xs, grid, mode="bilinear", padding_mode=padding_mode, align_corners=align_corners)


def _check_images(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise PartitionArgumentError(
            f"AffineAugmentation needs images of shape [B, C, H, W], got {shape}; "
            f"add the missing batch/channel dimensions (e.g. x.unsqueeze(0))"
        )
    if not x.is_floating_point():
        raise PartitionArgumentError(
            f"AffineAugmentation needs floating-point images, got dtype {x.dtype}; convert with x.float()"
        )


def _check_num_samples(value: object) -> int:
    return check_int("num_samples", value, hint="; pass e.g. num_samples=8")
