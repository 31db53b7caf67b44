"""Test-set metrics of an exported (plain) classifier."""

from __future__ import annotations

import torch


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
