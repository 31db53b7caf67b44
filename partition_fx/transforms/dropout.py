"""``ConcreteDropout``: dropout whose rate is a learnable hyperparameter (concrete relaxation)."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .._validation import check_open_unit
from ..errors import PartitionArgumentError
from .base import HyperparameterModule

P_MIN = 1e-4
P_MAX = 0.95


class ConcreteDropout(HyperparameterModule):
    """Element-wise dropout with a learnable rate p = sigmoid(logit_p) (Gal, Hron & Kendall 2017).

    In training mode each element gets a relaxed drop indicator
    z = sigmoid((logit(p) + log u - log(1 - u)) / temperature) with u ~ U(0, 1), and the output is
    x * (1 - z) / (1 - p). As temperature -> 0, z becomes Bernoulli(p) and this is ordinary inverted
    dropout; for temperature > 0 it is differentiable in p (and only approximately mean-preserving:
    within about 1% for the default temperature 0.1 and p <= 0.9). In eval mode it is the identity, so an
    exported model contains no trace of it. No dropout regulariser is added: with partitioning, the
    marginal-likelihood estimate itself is what p is learned from.

    ``constrain_`` keeps p in [p_min, p_max] (default [1e-4, 0.95]): the rescaling 1 / (1 - p) blows up
    as p -> 1, and logit_p would saturate (zero gradient) as p -> 0.

    Example::

        >>> import torch
        >>> from partition_fx.transforms import ConcreteDropout
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), ConcreteDropout(p=0.2), torch.nn.Linear(8, 2))
        >>> model(torch.randn(3, 4)).shape
        torch.Size([3, 2])
        >>> round(model[1].hyperparameters()["p"], 6)
        0.2
        >>> x = torch.randn(3, 8)
        >>> model[1].eval()(x) is x
        True
    """

    def __init__(self, p: float = 0.1, temperature: float = 0.1, p_min: float = P_MIN, p_max: float = P_MAX) -> None:
        super().__init__()
        p_min = check_open_unit("p_min", p_min)
        p_max = check_open_unit("p_max", p_max)
        if p_min > p_max:
            raise PartitionArgumentError(f"p_min must be <= p_max, got p_min={p_min}, p_max={p_max}; swap them")
        p = check_open_unit("p", p)
        if not p_min <= p <= p_max:
            raise PartitionArgumentError(
                f"p must be in [p_min, p_max] = [{p_min}, {p_max}], got {p}; change p or widen p_min/p_max"
            )
        # Two messages, not check_positive's one: an infinite temperature is a different mistake from a zero one.
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature > 0:
            raise PartitionArgumentError(
                f"temperature must be a number > 0, got {temperature!r}; 0.1 is the usual choice"
            )
        if not math.isfinite(temperature):
            raise PartitionArgumentError(f"temperature must be finite, got {temperature!r}; 0.1 is the usual choice")
        self.temperature: float = float(temperature)
        self.p_min: float = p_min
        self.p_max: float = p_max
        self.logit_p: nn.Parameter = nn.Parameter(torch.tensor(math.log(p) - math.log1p(-p), dtype=torch.float32))

    @property
    def p(self) -> torch.Tensor:
        """The dropout rate sigmoid(logit_p), differentiable."""
        return torch.sigmoid(self.logit_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        if not x.is_floating_point():
            raise PartitionArgumentError(f"ConcreteDropout needs a floating-point input, got dtype {x.dtype}")
        # Keep u away from 0 and 1 so logit(u) is finite; finfo.eps covers half precision.
        eps = max(1e-6, torch.finfo(x.dtype).eps)
        u = torch.rand_like(x) * (1 - 2 * eps) + eps
        logit_p = self.logit_p.to(x.dtype)
        # 1 - sigmoid(a) = sigmoid(-a): computing the keep factor and 1 - p this way avoids cancellation
        # when z or p is close to 1.
        keep = torch.sigmoid(-(logit_p + torch.logit(u)) / self.temperature)
        return x * keep / torch.sigmoid(-logit_p)

    def hyperparameters(self) -> dict[str, float | list[float]]:
        """{"p": the current dropout rate} as a plain float."""
        return {"p": float(self.p.detach())}

    @torch.no_grad()
    def constrain_(self) -> None:
        """Clamp logit_p so that p stays in [p_min, p_max]."""
        low = math.log(self.p_min) - math.log1p(-self.p_min)
        high = math.log(self.p_max) - math.log1p(-self.p_max)
        self.logit_p.clamp_(low, high)

    def extra_repr(self) -> str:
        return (
            f"p={self.hyperparameters()['p']:.4g}, temperature={self.temperature}, bounds=[{self.p_min}, {self.p_max}]"
        )
