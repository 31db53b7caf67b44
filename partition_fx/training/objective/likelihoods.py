"""Per-example log-likelihoods log p(y | model output), averaged over augmentation samples.

An input transform such as ``AffineAugmentation`` turns a batch of B examples into S*B inputs, sample
major. The likelihood of an example is then that of the predictive averaged over its S samples,
log (1/S) sum_s p(y | f(T_s x)) (averaged probabilities, as in Benton et al. 2020 and Immer et al. 2022),
computed stably with ``logsumexp``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import PartitionArgumentError, PartitionNotImplementedError, PartitionTypeError
from ...transforms.base import HyperparameterModule


def _fields(outputs: object) -> list[str]:
    """The field names of a structured output (a dict's keys, a NamedTuple's or dataclass's fields)."""
    if isinstance(outputs, Mapping):
        return [str(key) for key in outputs]
    if hasattr(outputs, "_fields"):
        return list(outputs._fields)
    if dataclasses.is_dataclass(outputs):
        return [f.name for f in dataclasses.fields(outputs)]
    return []


def _field(outputs: object, name: str) -> object:
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None) if name in _fields(outputs) else None


def model_logits(outputs: object, what: str = "this likelihood") -> torch.Tensor:
    """The tensor a likelihood reads from a model's output: the output itself when it is a tensor, else its
    ``logits`` field (a dict key, such as a ``transformers`` ``ModelOutput``'s, or a NamedTuple's or dataclass's
    attribute); anything else is refused in one line naming what the output holds.

    >>> model_logits({"loss": torch.tensor(0.3), "logits": torch.zeros(2, 3)}).shape
    torch.Size([2, 3])
    >>> model_logits((torch.zeros(2, 3),))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: this likelihood needs the model's logits: a tensor, or an output ...
    """
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = _field(outputs, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    fields = _fields(outputs)
    holds = f"with fields {', '.join(fields)}" if fields else "with no named fields"
    raise PartitionArgumentError(
        f"{what} needs the model's logits: a tensor, or an output with a 'logits' field (a dict key or an "
        f"attribute); got {type(outputs).__name__} {holds}: return the logits from the model, or pass a likelihood "
        "callable that reads them"
    )


class Likelihood(nn.Module):
    """Base class: ``log_prob(outputs, targets) -> [B]`` per example; ``forward`` reads the model's output by
    :func:`model_logits` (a tensor, or its ``logits`` field) and adds sample averaging."""

    if TYPE_CHECKING:  # torch types nn.Module.__call__ (forward and its hooks) as returning Any: typed as forward

        def __call__(self, outputs: Any, targets: torch.Tensor, num_samples: int = 1) -> torch.Tensor: ...

    def log_prob(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise PartitionNotImplementedError(f"{type(self).__name__} must implement log_prob(outputs, targets)")

    def forward(self, outputs: Any, targets: torch.Tensor, num_samples: int = 1) -> torch.Tensor:
        """Per-example log-likelihood [B] of ``targets`` [B, ...] given ``outputs`` [S*B, ...] (sample major), or an
        output whose ``logits`` field is that (:func:`model_logits`)."""
        outputs = model_logits(outputs, type(self).__name__)
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
    """For a model that scores its targets itself: its forward takes ``(inputs, targets)`` and returns its losses.
    Training then calls ``pmodel(inputs, targets, subnetwork=k)`` (a Hugging Face model takes them as
    ``labels``), and the input transform, if any, transforms inputs and targets together
    (``transform(inputs, targets) -> (inputs, targets)``, e.g. ``transforms.BoxZoom``).

    What it reads, in this order:

    - an output with a ``loss`` field (a dict key, such as a ``transformers`` ``ModelOutput``'s, or an attribute):
      that loss alone, never the other fields (``logits``, ...). It must hold one value per example, shape [B]:
      a loss that is the batch's mean (``transformers``' classifiers return one) is refused, naming the output's
      fields and the likelihood that reads its logits instead;
    - a dict of scalar losses and nothing else (torchvision's detection models in training mode), or a scalar:
      their sum stands for the batch's negative log-likelihood, each example's the batch's mean.

    A detector returns its losses only in training mode: every step of partitioned training runs there; an
    evaluation in eval mode gets its predictions, which this refuses naming the fix.

    >>> losses = {"loss_classifier": torch.tensor(0.5), "loss_box_reg": torch.tensor(0.25)}
    >>> ModelLoss()(losses, [{"boxes": torch.zeros(0, 4)}] * 2)
    tensor([-0.7500, -0.7500])
    >>> ModelLoss()({"loss": torch.tensor([0.5, 0.25]), "logits": torch.zeros(2, 3)}, torch.tensor([0, 1]))
    tensor([-0.5000, -0.2500])
    """

    if TYPE_CHECKING:  # as Likelihood's, of what forward takes

        def __call__(self, outputs: object, targets: Sized, num_samples: int = 1) -> torch.Tensor: ...

    def forward(self, outputs: object, targets: Sized, num_samples: int = 1) -> torch.Tensor:
        batch = len(targets)
        loss = _field(outputs, "loss")
        if isinstance(loss, torch.Tensor):
            if loss.dim() == 1 and loss.shape[0] == batch:
                return -loss
            fields = ", ".join(_fields(outputs))
            shape = "a scalar, the batch's mean" if loss.dim() == 0 else f"shape {tuple(loss.shape)}"
            raise PartitionArgumentError(
                f"ModelLoss needs the model's loss per example, shape ({batch},); {type(outputs).__name__} (fields: "
                f"{fields}) holds a loss of {shape}: train with likelihood='classification' (or 'regression'), which "
                "reads its logits, or make the model return a loss per example"
            )
        if isinstance(outputs, dict) and outputs and all(isinstance(v, torch.Tensor) for v in outputs.values()):
            total = torch.stack([v.sum() for v in outputs.values()]).sum()
        elif isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
            total = outputs
        else:
            raise PartitionArgumentError(
                f"ModelLoss needs the model's losses (a 'loss' field with one per example, a scalar tensor or a dict "
                f"of them), got {type(outputs).__name__}: a detector returns its losses in training mode only "
                "(model.train()); evaluate its predictions in eval mode yourself"
            )
        return -total.expand(batch)


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
