"""Test-time averaging: a classifier's prediction averaged over K fixed transforms of its input.

The LML scores the augmentation-averaged predictor p(y | x) = E_eps p(y | T_eps(x)) (appendix G and J.2 average
predictions over augmentation samples at inference too), while a plain exported model predicts from x alone.
:class:`TestTimeAveraged` is that predictor made deterministic and exportable: the expectation becomes a mean
over K transforms fixed when it is built (a Latin hypercube over the augmentation's ranges,
:func:`averaging_coefficients`), whose affine matrices are a buffer, so the forward is ``affine_grid``,
``grid_sample`` and the model: ONNX-exportable (``export_onnx(..., wrap=...)``), and the same on every call.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._validation import check_int
from ..errors import PartitionTypeError
from .affine import AffineAugmentation, apply_affine


def averaging_coefficients(samples: int, generators: int, seed: int = 0) -> torch.Tensor:
    """K = ``samples`` fixed coefficient vectors [K, G] in (-1, 1): a Latin hypercube of the midpoints
    -1 + (2i + 1) / K, each generator's column a fixed permutation of them (the first in order). Every range is
    then covered by an even grid, whichever generators are non-zero, and the set depends on nothing but the
    arguments.

    >>> averaging_coefficients(4, 1).flatten().tolist()
    [-0.75, -0.25, 0.25, 0.75]
    >>> averaging_coefficients(1, 3).tolist()  # one sample: the input itself
    [[0.0, 0.0, 0.0]]
    """
    check_int("samples", samples, minimum=1)
    check_int("generators", generators, minimum=1)
    midpoints = (torch.arange(samples, dtype=torch.float64) * 2 + 1) / samples - 1
    generator = torch.Generator().manual_seed(seed)
    columns = [midpoints] + [midpoints[torch.randperm(samples, generator=generator)] for _ in range(generators - 1)]
    return torch.stack(columns, dim=1).float()


class TestTimeAveraged(nn.Module):
    """``model`` predicting log p(y | x) = log mean_k softmax(model(T_k(x))) over ``samples`` fixed transforms
    T_k drawn evenly from ``augmentation``'s ranges as they are now (:func:`averaging_coefficients`; later
    changes to the augmentation do not change them). Returns log-probabilities [B, classes], which are also
    logits: their argmax and softmax are the averaged prediction's. ``samples=1`` is ``model``'s own
    prediction (the one transform is the identity).

    Example::

        >>> import torch
        >>> from partition_fx.transforms import AffineAugmentation
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> averaged = TestTimeAveraged(model, AffineAugmentation(init={"rotation": 3.14}), samples=8).eval()
        >>> x = torch.randn(2, 1, 8, 8)
        >>> averaged(x).shape, bool(torch.equal(averaged(x), averaged(x)))
        (torch.Size([2, 10]), True)
    """

    __test__ = False  # not a pytest test class, whatever its name
    theta: torch.Tensor  # a buffer: the K fixed transforms [K, 2, 3]

    def __init__(self, model: nn.Module, augmentation: AffineAugmentation, samples: int = 8, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(augmentation, AffineAugmentation):
            raise PartitionTypeError(f"augmentation must be an AffineAugmentation, got {type(augmentation).__name__}")
        self.model = model
        self.samples = check_int("samples", samples, minimum=1)
        self.padding_mode = augmentation.padding_mode
        self.align_corners = augmentation.align_corners
        eps = averaging_coefficients(samples, len(augmentation.generators), seed)
        with torch.no_grad():
            theta = augmentation.transform_matrices(eps.to(augmentation.ranges.device)).float().cpu()
        self.register_buffer("theta", theta)  # [K, 2, 3]: the fixed transforms, saved with the module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..training.objective.likelihoods import model_logits  # training imports transforms

        k, b = self.samples, x.shape[0]
        theta = self.theta.unsqueeze(1).expand(k, b, 2, 3)  # every example under each of the K transforms
        transformed = apply_affine(x, theta, self.padding_mode, self.align_corners)
        logits = model_logits(self.model(transformed), type(self).__name__)  # a tensor, or a ModelOutput's logits
        log_probs = torch.log_softmax(logits, dim=-1).reshape(k, b, -1)
        return torch.logsumexp(log_probs, dim=0) - math.log(k)


__all__ = ["TestTimeAveraged", "averaging_coefficients"]
