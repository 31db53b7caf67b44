"""Test-set metrics of an exported (plain) classifier, alone or averaged over fixed augmentations."""

from __future__ import annotations

import torch
from torch import nn

from ..transforms import AffineAugmentation, TestTimeAveraged


@torch.no_grad()
def evaluate_classifier(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512
) -> tuple[float, float]:
    """(accuracy, mean log-likelihood in nats) of a plain classifier in eval mode.

    Example::

        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> accuracy, loglik = evaluate_classifier(model, torch.randn(10, 2), torch.zeros(10, dtype=torch.long))
        >>> 0.0 <= accuracy <= 1.0 and loglik < 0
        True
    """
    model.eval()
    correct, loglik = 0, 0.0
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        logits = model(xb)
        correct += int((logits.argmax(1) == yb).sum())
        loglik += float(torch.log_softmax(logits.double(), 1).gather(1, yb[:, None]).sum())
    return correct / len(y), loglik / len(y)


def evaluate_averaged(
    model: nn.Module, augmentation: nn.Module | None, samples: int, x: torch.Tensor, y: torch.Tensor
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
    return evaluate_classifier(averaged, x, y, batch_size=max(1, 512 // samples))
