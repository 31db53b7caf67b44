"""The hyper-gradient through training (``hyper_gradient="implicit"``): what the hyperparameters psi do to the
LML through the weights that training on them produces, which the paper's step (at fixed weights) leaves out.

Partition p is trained on chunks D_1:p through subnetwork p, under the augmentation psi: its weights w_p are a
best response w_p*(psi) to its training loss L_p(w, psi). A hyperparameter step's loss L (chunks k >= 2 through
subnetworks k-1) depends on psi directly and through every w_p it reads, so by the implicit function theorem

    dL/dpsi = dL/dpsi|_w - sum_p  v_p^T H_p^-1 d2L_p/dw_p dpsi,     v_p = dL/dw_p,  H_p = d2L_p/dw_p^2,

with H_p^-1 approximated by the Neumann series alpha sum_{j=0..K} (I - alpha H_p)^j (Lorraine, Vicol & Duvenaud,
2020): K Hessian-vector products per partition, on a minibatch of D_1:p; K = 0 is one unrolled SGD step of step
alpha. Each partition's best response is taken with the other partitions held (a block-diagonal inverse), which
is what the partitioned training steps do: partition p's step moves w_p alone.

The term is returned as a tensor of value 0 whose gradient with respect to psi is the implicit part, to be added
to the hyperparameter loss: the stepper's one backward, data-parallel average, non-finite checks and reported
loss then stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ...fx.partitioned_model import PartitionedModel
from .likelihoods import Likelihood
from .lml import forward_log_likelihood

InnerBatch = tuple[int, torch.Tensor, torch.Tensor]
"""``(p, x, y)``: examples of D_1:p on which partition p's training loss is taken."""


def neumann_inverse(
    gradient: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    vector: Sequence[torch.Tensor],
    terms: int,
    lr: float,
) -> list[torch.Tensor]:
    """``sum_{j=0..terms} (I - lr H)^j vector`` with H the Jacobian of ``gradient`` (a loss's gradient with respect
    to ``params``, taken with ``create_graph=True``): lr times it approximates H^-1 ``vector`` when the
    eigenvalues of lr H lie in (0, 2), exactly as ``terms`` grows.

    >>> w = torch.zeros(2, requires_grad=True)
    >>> h = torch.tensor([[2.0, 0.0], [0.0, 4.0]])
    >>> (g,) = torch.autograd.grad(0.5 * w @ h @ w + w.sum(), [w], create_graph=True)
    >>> [round(0.1 * v, 4) for v in neumann_inverse([g], [w], [torch.ones(2)], 200, 0.1)[0].tolist()]
    [0.5, 0.25]
    """
    term = [v.detach() for v in vector]
    total = list(term)
    for _ in range(terms):
        products = torch.autograd.grad(gradient, params, grad_outputs=term, retain_graph=True, allow_unused=True)
        term = [t - lr * (h if h is not None else torch.zeros_like(t)) for t, h in zip(term, products)]
        total = [a + t for a, t in zip(total, term)]
    return total


def through_training(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    loss: torch.Tensor,
    inner: Sequence[InnerBatch],
    *,
    terms: int,
    lr: float,
    widen: float | Mapping[str, float] = 1.0,
) -> torch.Tensor:
    """A zero-valued tensor whose gradient with respect to psi is the implicit part of ``loss``'s hyper-gradient
    through the partitions of ``inner``: for each ``(p, x, y)``, partition p's training loss on those examples
    (through subnetwork p, the augmentation drawn from its ranges times ``widen``, as its parameter steps draw
    it), a Neumann series of ``terms`` terms of step ``lr``. ``loss`` is the hyperparameter step's loss, its
    graph retained. The training losses' forwards update running statistics as any forward in training mode
    does; the caller puts them back once the backward is done (``lml.buffers_restored``: not before, the
    backward reads them).

    Example (psi shifts the input; the one-step unroll, K = 0)::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical
        >>> from partition_fx.transforms.base import HyperparameterModule
        >>> class Shift(HyperparameterModule):
        ...     def __init__(self):
        ...         super().__init__(); self.shift = nn.Parameter(torch.tensor(0.5))
        ...     def forward(self, x):
        ...         return x + self.shift
        >>> _ = torch.manual_seed(0)
        >>> pmodel, shift = partitionify(nn.Linear(3, 2), 2), Shift()
        >>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
        >>> loss = -Categorical()(pmodel(shift(x[4:]), subnetwork=1), y[4:]).mean()
        >>> extra = through_training(pmodel, Categorical(), shift, loss, [(1, x[:4], y[:4])], terms=0, lr=0.1)
        >>> float(extra), extra.requires_grad
        (0.0, True)
    """
    total = loss.new_zeros(())
    partitions = {p: list(pmodel.partition_parameters(p)) for p, _, _ in inner}
    every = [w for params in partitions.values() for w in params]
    found = torch.autograd.grad(loss, every, retain_graph=True, allow_unused=True)  # v_p, every p in one backward
    v_of = {id(w): g if g is not None else torch.zeros_like(w) for w, g in zip(every, found)}
    for p, x, y in inner:
        params = partitions[p]
        v = [v_of[id(w)] for w in params]
        training_loss = -forward_log_likelihood(pmodel, likelihood, x, y, p, hyper, widen=widen).mean()
        gradient = torch.autograd.grad(training_loss, params, create_graph=True, allow_unused=True)
        used = [(g, w, vi) for g, w, vi in zip(gradient, params, v) if g is not None]
        if not used:
            continue
        u = neumann_inverse([g for g, _, _ in used], [w for _, w, _ in used], [vi for _, _, vi in used], terms, lr)
        # d/dpsi of -lr <u, dL_p/dw_p(psi)> with u held: -lr u^T d2L_p/dw_p dpsi, the implicit term
        dot = sum((ui * g).sum() for ui, (g, _, _) in zip(u, used))
        assert isinstance(dot, torch.Tensor)  # used is not empty: a sum of tensors, not sum's 0
        total = total - lr * (dot - dot.detach())
    return total
