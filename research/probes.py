"""What the diagnostics measure at a partitioned model's weights, without sampling noise: the conditional LML at a
range (:func:`conditional_lml`) and its derivative with respect to the range, at fixed weights and through training
(:func:`derivatives`).

Every score uses the same fixed augmentation coefficients, the midpoints of :data:`SAMPLES` equal parts of [-1, 1]
(``transforms.averaging_coefficients``, the draws ``TestTimeAveraged`` averages over): common random numbers, so two
ranges or two weights are compared on the same draws, and a difference is theirs alone.
"""

from __future__ import annotations

import torch

from partition_fx import PartitionedModel
from partition_fx.training import (
    DataChunks,
    buffers_restored,
    conditional_lml_of_draws,
    log_likelihood_of_draws,
)
from partition_fx.training.objective.implicit import neumann_inverse
from partition_fx.transforms import AffineAugmentation, averaging_coefficients

SAMPLES = 8
"""Coefficients of the midpoint rule over one range (common random numbers)."""


def midpoint_draws(samples: int = SAMPLES) -> torch.Tensor:
    """The coefficients [samples, 1] of the midpoint rule over one generator: the midpoints of ``samples`` equal
    parts of [-1, 1].

    >>> midpoint_draws(4).flatten().tolist()
    [-0.75, -0.25, 0.25, 0.75]
    """
    return averaging_coefficients(samples, 1)


def conditional_lml(
    pmodel: PartitionedModel,
    generator: str,
    r: float,
    x: torch.Tensor,
    y: torch.Tensor,
    chunks: DataChunks,
    samples: int = SAMPLES,
) -> float:
    """The conditional LML of ``pmodel`` with ``generator``'s range at ``r`` (every other range 0) on the midpoint
    draws of ``samples`` views: ``training.conditional_lml_of_draws``, chunks 2..C each through subnetwork k-1 on its
    own batch statistics, the running statistics left as they were."""
    augmentation = AffineAugmentation.fixed({generator: r}, generators=[generator])
    return conditional_lml_of_draws(pmodel, augmentation, midpoint_draws(samples), x, y, chunks)


def derivatives(
    pmodel: PartitionedModel,
    augmentation: AffineAugmentation,
    x: torch.Tensor,
    y: torch.Tensor,
    chunks: DataChunks,
    alpha: float,
    ks: list[int],
    inner_size: int,
    seed: int,
) -> dict[str, float]:
    """d LML_cond / d range at ``pmodel``'s weights, for ``augmentation``'s one generator (its range a leaf that
    requires grad): at fixed weights (``fixed``), and with the implicit term through partition k-1's training for
    each number of Neumann terms K in ``ks`` (``implicit_K``: - alpha v^T sum_{j<=K} (I - alpha H)^j d2L/dw dr, v =
    dLML/dw, L partition k-1's training loss on ``inner_size`` examples of chunks 1..k-1 drawn with ``seed``; K = 0
    is the one-step unroll). Every term on the midpoint draws; the model's buffers are left as they were."""
    draws = midpoint_draws()
    generator = torch.Generator().manual_seed(seed)
    fixed = 0.0
    implicit = {k_: 0.0 for k_ in ks}
    pmodel.train()
    with buffers_restored(pmodel):
        for k in range(2, pmodel.num_partitions + 1):
            params = list(pmodel.partition_parameters(k - 1))
            earlier = torch.cat([chunks.chunk(j) for j in range(1, k)])
            inner = earlier[torch.randperm(len(earlier), generator=generator)[:inner_size]]
            scored = chunks.chunk(k)
            lml = log_likelihood_of_draws(pmodel, augmentation, draws, x[scored], y[scored], k - 1).sum()
            loss = -log_likelihood_of_draws(pmodel, augmentation, draws, x[inner], y[inner], k - 1).mean()
            (direct,) = torch.autograd.grad(lml, augmentation.ranges, retain_graph=True)
            v = torch.autograd.grad(lml, params)
            grads = torch.autograd.grad(loss, params, create_graph=True)

            fixed += float(direct)
            for K in ks:
                total = neumann_inverse(grads, params, v, K, alpha)  # training.objective.implicit's series
                # - alpha * total^T d2L/dw dr
                (mixed,) = torch.autograd.grad(grads, augmentation.ranges, grad_outputs=total, retain_graph=True)
                implicit[K] += float(direct) - alpha * float(mixed)
    return {"fixed": fixed, **{f"implicit_{K}": value for K, value in implicit.items()}}
