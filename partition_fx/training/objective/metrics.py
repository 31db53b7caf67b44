"""Test-set metrics of an exported (plain) classifier, alone or averaged over fixed augmentations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ...errors import PartitionArgumentError
from ...transforms import AffineAugmentation, TestTimeAveraged
from ..sampling.chunks import Examples
from .likelihoods import model_logits


def _batches(
    x: torch.Tensor | Dataset[Any], y: torch.Tensor | None, batch_size: int, workers: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, targets)`` in batches of ``batch_size``: of tensors ``x`` and ``y``, or of a dataset ``x``
    (``y`` None) read by ``workers`` processes."""
    if isinstance(x, torch.Tensor):
        if y is None:
            raise PartitionArgumentError("targets y are needed with input tensors x (or pass a dataset as x)")
        return zip(x.split(batch_size), y.split(batch_size))
    examples = Examples(x, workers=workers)
    return examples.batches(torch.arange(len(examples)).split(batch_size))


@torch.no_grad()
def evaluate_classifier(
    model: torch.nn.Module,
    x: torch.Tensor | Dataset[Any],
    y: torch.Tensor | None = None,
    batch_size: int = 512,
    workers: int = 0,
) -> tuple[float, float]:
    """(accuracy, mean log-likelihood in nats) of a plain classifier in eval mode, on inputs ``x`` with targets
    ``y``, or on a map-style dataset ``x`` of (input, target) pairs read in batches (by ``workers`` processes),
    never whole, so a test split larger than memory is scored.

    Example::

        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> accuracy, loglik = evaluate_classifier(model, torch.randn(10, 2), torch.zeros(10, dtype=torch.long))
        >>> 0.0 <= accuracy <= 1.0 and loglik < 0
        True
        >>> from torch.utils.data import TensorDataset
        >>> x, y = torch.randn(10, 2), torch.zeros(10, dtype=torch.long)
        >>> evaluate_classifier(model, TensorDataset(x, y)) == evaluate_classifier(model, x, y)
        True
    """
    model.eval()
    correct, loglik, count = 0, 0.0, 0
    for xb, yb in _batches(x, y, batch_size, workers):
        logits = model_logits(model(xb), "evaluate_classifier")
        correct += int((logits.argmax(1) == yb).sum())
        loglik += float(torch.log_softmax(logits.double(), 1).gather(1, yb[:, None]).sum())
        count += len(yb)
    return correct / count, loglik / count


def evaluate_averaged(
    model: nn.Module,
    augmentation: nn.Module | None,
    samples: int,
    x: torch.Tensor | Dataset[Any],
    y: torch.Tensor | None = None,
    workers: int = 0,
) -> tuple[float | None, float | None]:
    """(accuracy, mean log-likelihood) of ``model`` averaged over ``samples`` fixed transforms of
    ``augmentation`` (:class:`~partition_fx.transforms.TestTimeAveraged`), or (None, None) when there is nothing
    to average: no affine augmentation, or ``samples`` 0. Batches of 512 transformed images.

    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    >>> x, y = torch.randn(6, 1, 4, 4), torch.zeros(6, dtype=torch.long)
    >>> evaluate_averaged(model, AffineAugmentation(init={"rotation": 1.0}), 4, x, y)[0] <= 1.0
    True
    >>> evaluate_averaged(model, None, 4, x, y)
    (None, None)
    """
    if not isinstance(augmentation, AffineAugmentation) or samples == 0:
        return None, None
    averaged = TestTimeAveraged(model, augmentation, samples)
    return evaluate_classifier(averaged, x, y, batch_size=max(1, 512 // samples), workers=workers)
