"""``InputMask``: a learnable soft mask over input features, for input selection."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from .._validation import check_positive
from ..errors import PartitionArgumentError
from .base import HyperparameterModule

MAX_LOGIT = 10.0


class InputMask(HyperparameterModule):
    """Multiply the input by a learnable mask sigmoid(logits) of shape ``shape`` (one value per feature).

    ``x`` has shape [..., *shape] (usually [B, *shape]); the mask broadcasts over the leading dims. A
    mask value near 0 switches a feature off, so the learned mask ranks features by how much the
    marginal likelihood needs them. The mask is stored as logits so that gradient steps keep it in
    (0, 1); ``constrain_`` clamps the logits to [-max_logit, max_logit] (default 10, i.e. a mask in
    [4.5e-5, 0.99995]) because beyond that the sigmoid saturates and a feature could never come back.

    Example::

        >>> import torch
        >>> from partition_fx.transforms import InputMask
        >>> mask = InputMask(3, init=0.5)
        >>> mask(torch.ones(2, 3))
        tensor([[0.5000, 0.5000, 0.5000],
                [0.5000, 0.5000, 0.5000]], grad_fn=<MulBackward0>)
        >>> mask.hyperparameters()
        {'mask': [0.5, 0.5, 0.5]}
    """

    def __init__(self, shape: int | Sequence[int], init: float = 0.9, max_logit: float = MAX_LOGIT) -> None:
        super().__init__()
        self.shape: tuple[int, ...] = _check_shape(shape)
        self.max_logit = check_positive("max_logit", max_logit, hint="; e.g. 10.0")
        if isinstance(init, bool) or not isinstance(init, numbers.Real) or not 0 < init < 1:
            raise PartitionArgumentError(
                f"init is the initial mask value and must be strictly between 0 and 1, got {init!r}; e.g. init=0.9"
            )
        logit = math.log(init) - math.log1p(-init)
        if abs(logit) > self.max_logit:
            low, high = torch.sigmoid(torch.tensor([-self.max_logit, self.max_logit], dtype=torch.float64)).tolist()
            raise PartitionArgumentError(
                f"init={init} is outside the mask range [{low:.3g}, {high:.3g}] allowed by max_logit={self.max_logit}; "
                f"choose an init inside it or raise max_logit"
            )
        self.logits: nn.Parameter = nn.Parameter(torch.full(self.shape, logit, dtype=torch.float32))

    def mask(self) -> torch.Tensor:
        """The mask sigmoid(logits), shape ``shape``, differentiable."""
        return torch.sigmoid(self.logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.shape)
        if x.dim() < n or tuple(x.shape[x.dim() - n :]) != self.shape:
            raise PartitionArgumentError(
                f"InputMask of shape {self.shape} needs an input of shape [..., {', '.join(map(str, self.shape))}], "
                f"got {tuple(x.shape)}; build the mask with the input's per-example shape"
            )
        return x * self.mask().to(x.dtype)

    def hyperparameters(self) -> dict[str, float | list[float]]:
        """{"mask": the mask values, flattened in row-major order, as plain floats}."""
        return {"mask": self.mask().detach().flatten().tolist()}

    @torch.no_grad()
    def constrain_(self) -> None:
        """Clamp the logits into [-max_logit, max_logit]."""
        self.logits.clamp_(-self.max_logit, self.max_logit)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, max_logit={self.max_logit}"


def _check_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, numbers.Integral) and not isinstance(shape, bool) else shape
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or len(dims) == 0:
        raise PartitionArgumentError(
            f"shape must be an int or a non-empty sequence of ints (the per-example input shape), got {shape!r}"
        )
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
            raise PartitionArgumentError(f"shape entries must be ints >= 1, got {shape!r}; e.g. shape=(3, 32, 32)")
    return tuple(int(d) for d in dims)
