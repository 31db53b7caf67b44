"""Per-example log-likelihoods log p(y | model output), averaged over augmentation samples.

An input transform such as ``AffineAugmentation`` turns a batch of B examples into S*B inputs, sample
major. The likelihood of an example is then that of the predictive averaged over its S samples,
log (1/S) sum_s p(y | f(T_s x)) (averaged probabilities, as in Benton et al. 2020 and Immer et al. 2022),
computed stably with ``logsumexp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import PartitionArgumentError, PartitionNotImplementedError, PartitionTypeError
from ..transforms.base import HyperparameterModule


class Likelihood(nn.Module):
    """Base class: ``log_prob(outputs, targets) -> [B]`` per example; ``forward`` adds sample averaging."""

    if TYPE_CHECKING:  # torch types nn.Module.__call__ (forward and its hooks) as returning Any: typed as forward

        def __call__(self, outputs: torch.Tensor, targets: torch.Tensor, num_samples: int = 1) -> torch.Tensor: ...

    def log_prob(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise PartitionNotImplementedError(f"{type(self).__name__} must implement log_prob(outputs, targets)")

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor, num_samples: int = 1) -> torch.Tensor:
        """Per-example log-likelihood [B] of ``targets`` [B, ...] given ``outputs`` [S*B, ...] (sample major)."""
        if num_samples == 1:
            return self.log_prob(outputs, targets)
        batch = targets.shape[0]
        repeated = targets.repeat(num_samples, *([1] * (targets.dim() - 1)))
        per_sample = self.log_prob(outputs, repeated).view(num_samples, batch)
        return torch.logsumexp(per_sample, dim=0) - math.log(num_samples)


class Categorical(Likelihood):
    """Classification: outputs are logits [B, classes], targets class indices [B].

    >>> Categorical()(torch.zeros(2, 4), torch.tensor([0, 3]))
    tensor([-1.3863, -1.3863])
    """

    def log_prob(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if outputs.dim() != 2:
            raise PartitionArgumentError(
                f"classification needs logits of shape [batch, classes], got {tuple(outputs.shape)}"
            )
        return -F.cross_entropy(outputs, targets.long(), reduction="none")


class Gaussian(Likelihood, HyperparameterModule):
    """Regression: N(y | output, sigma^2) per output dimension (summed), with the noise scale sigma a
    learnable hyperparameter (``learn_scale=False`` keeps it fixed). Bounded to [1e-4, 1e4].

    >>> g = Gaussian(scale=1.0)
    >>> round(g(torch.zeros(1, 1), torch.zeros(1)).item(), 4)  # -0.5 log(2 pi)
    -0.9189
    >>> g.hyperparameters()
    {'noise_scale': 1.0}
    """

    def __init__(self, scale: float = 1.0, learn_scale: bool = True) -> None:
        super().__init__()
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise PartitionArgumentError(f"Gaussian scale must be a positive finite number, got {scale!r}")
        self.log_scale = nn.Parameter(torch.tensor(math.log(scale)), requires_grad=learn_scale)

    def log_prob(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if outputs.shape != targets.shape and outputs.shape[:-1] == targets.shape and outputs.shape[-1] == 1:
            outputs = outputs.squeeze(-1)  # a [B, 1] head for [B] targets
        if outputs.shape != targets.shape:
            raise PartitionArgumentError(
                f"Gaussian likelihood: outputs {tuple(outputs.shape)} and targets {tuple(targets.shape)} differ"
            )
        log_scale = self.log_scale.to(outputs.dtype)
        z = (targets.to(outputs.dtype) - outputs) * torch.exp(-log_scale)
        per_entry = -0.5 * z.square() - log_scale - 0.5 * math.log(2 * math.pi)
        return per_entry.reshape(per_entry.shape[0], -1).sum(dim=1)

    def hyperparameters(self) -> dict[str, float | list[float]]:
        return {"noise_scale": float(self.log_scale.detach().exp())}

    def constrain_(self) -> None:
        with torch.no_grad():
            self.log_scale.clamp_(math.log(1e-4), math.log(1e4))


class CallableLikelihood(Likelihood):
    """A user's ``fn(outputs, targets) -> per-example log-likelihood [B]``."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def log_prob(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        value = self.fn(outputs, targets)
        if not isinstance(value, torch.Tensor) or value.shape != (targets.shape[0],):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise PartitionArgumentError(
                f"the log-likelihood callable must return one value per example, shape ({targets.shape[0]},); "
                f"got {shape}"
            )
        return value


class ModelLoss(Likelihood):
    """For a model that scores its targets itself: its forward takes ``(inputs, targets)`` and returns its losses
    (a tensor, or a dict of them, summed), as torchvision's detection models do in training mode. Training then
    calls ``pmodel(inputs, targets, subnetwork=k)``, and the input transform, if any, transforms inputs and
    targets together (``transform(inputs, targets) -> (inputs, targets)``, e.g. ``transforms.BoxZoom``): the
    model's losses stand for the batch's negative log-likelihood, each example's the batch's mean (the losses
    are means over the batch, not per example).

    Such a model returns its losses only in training mode: every step of partitioned training runs there; an
    evaluation in eval mode gets its predictions, which this refuses naming the fix.

    >>> losses = {"loss_classifier": torch.tensor(0.5), "loss_box_reg": torch.tensor(0.25)}
    >>> ModelLoss()(losses, [{"boxes": torch.zeros(0, 4)}] * 2)
    tensor([-0.7500, -0.7500])
    """

    if TYPE_CHECKING:  # as Likelihood's, of what forward takes

        def __call__(self, outputs: object, targets: Sized, num_samples: int = 1) -> torch.Tensor: ...

    def forward(self, outputs: object, targets: Sized, num_samples: int = 1) -> torch.Tensor:
        if isinstance(outputs, dict) and outputs and all(isinstance(v, torch.Tensor) for v in outputs.values()):
            total = torch.stack([v.sum() for v in outputs.values()]).sum()
        elif isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
            total = outputs
        else:
            raise PartitionArgumentError(
                f"ModelLoss needs the model's losses (a scalar tensor or a dict of them), got "
                f"{type(outputs).__name__}: the model returns its losses in training mode only (model.train()); "
                "evaluate its predictions in eval mode yourself"
            )
        return -total.expand(len(targets))


def resolve_likelihood(spec: str | Likelihood | Callable[..., torch.Tensor]) -> Likelihood:
    """``"classification"`` -> ``Categorical()``, ``"regression"`` -> ``Gaussian()``, a ``Likelihood`` as is,
    any other callable -> ``CallableLikelihood``.

    >>> type(resolve_likelihood("regression")).__name__
    'Gaussian'
    """
    if isinstance(spec, Likelihood):
        return spec
    if isinstance(spec, str):
        if spec == "classification":
            return Categorical()
        if spec == "regression":
            return Gaussian()
        raise PartitionArgumentError(
            f"likelihood must be 'classification', 'regression', a Likelihood or a callable, got {spec!r}"
        )
    if callable(spec):
        return CallableLikelihood(spec)
    raise PartitionTypeError(f"likelihood must be a string, a Likelihood or a callable, got {type(spec).__name__}")
