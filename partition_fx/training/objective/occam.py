"""The whole network's Laplace Occam term in the hyperparameter step (``occam_term="whole"`` or
``"conditional"``): LILA's mechanism (Immer, van der Ouderaa et al. 2022) added to the partitioned conditional LML.

At fixed weights the conditional LML can say that a range is too wide but hardly that it is too narrow. The
Laplace evidence of the invariant model, log p(D | w) + log p(w) - 1/2 log det(H / 2 pi), has a term that acts at
fixed weights: its Occam term log p(w) - 1/2 log det(H / 2 pi), whose log-determinant depends on the ranges through
the curvature H of the views. Here H is every Conv2d's and Linear's generalised Gauss-Newton, Kronecker-factored
over the views (:func:`kronecker_factors`), plus each layer's prior precision, fitted (:func:`laplace_occam`); its
derivative with respect to psi flows through the factors' eigenvalues. Why it is added per example to the
conditional LML, and how it is amortised, is in ``docs/design.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import PartitionArgumentError
from ...fx.partitioned_model import PartitionedModel
from .likelihoods import Categorical, Likelihood, model_logits
from .lml import apply_transform, buffers_restored, hyper_step_norms

PRECISION_BOUNDS = (1e-8, 1e8)
"""The prior precisions a layer's fit searches between."""
PRECISION_ITERATIONS = 60
"""Bisections of log precision: the fit's relative error is below 2^-60 of the bounds' log ratio."""


@dataclass
class KroneckerFactors:
    """One layer's curvature, B (x) A per group of its convolution (one group for most layers): ``a`` [G, I, I]
    the inputs' second moment per example and position (the views' inputs averaged first; a 1 appended for a
    bias), or, where the examples have fewer patches R than the layer has inputs I, the same moment's [G, R, R]
    Gram form (:func:`input_moment`: its eigenvalues are A's nonzero ones, the other I - R are 0); ``b`` [G, O, O]
    the output gradients' second moment summed over examples and positions (the views' gradients summed first),
    ``theta`` [G, O, I] the layer's weights (and bias), detached."""

    a: torch.Tensor
    b: torch.Tensor
    theta: torch.Tensor


def factored_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The Conv2d and Linear modules of ``model`` by name, those whose curvature :func:`kronecker_factors`
    factors; a convolution that it cannot (padding other than zeros) is refused, naming it.

    >>> sorted(factored_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2))))
    ['0', '2']
    """
    layers: dict[str, nn.Module] = {
        name: m for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))
    }
    for name, module in layers.items():
        if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
            raise PartitionArgumentError(
                f"the Occam term Kronecker-factors every Conv2d and Linear, but {name} pads with "
                f"{module.padding_mode!r}, not zeros: train with occam_term='none'"
            )
    return layers


def _groups(module: nn.Module) -> int:
    """The blocks a layer's curvature is factored in: a convolution's groups, one for a Linear."""
    return module.groups if isinstance(module, nn.Conv2d) else 1


def _patches(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """A layer's inputs as [examples, positions, groups, features]: a convolution's unfolded patches (its
    positions), a Linear's leading dimensions after the first (a token's, for a transformer), a 1 appended
    where the layer has a bias."""
    if isinstance(module, nn.Conv2d):
        padding = module.padding
        if isinstance(padding, str):  # "valid" or "same" (odd kernels: the padding that keeps the size)
            padding = tuple(0 if padding == "valid" else (k - 1) * d // 2
                            for k, d in zip(module.kernel_size, module.dilation))  # fmt: skip
        unfolded = nn.functional.unfold(inputs, module.kernel_size, module.dilation, padding, module.stride)
        unfolded = unfolded.transpose(1, 2)  # [n, positions, in * kh * kw], channels major
    else:
        unfolded = inputs.reshape(inputs.shape[0], -1, inputs.shape[-1])
    unfolded = unfolded.reshape(*unfolded.shape[:2], _groups(module), -1)
    if getattr(module, "bias", None) is not None:
        unfolded = torch.cat([unfolded, unfolded.new_ones(*unfolded.shape[:3], 1)], -1)
    return unfolded


def _output_rows(module: nn.Module, output: torch.Tensor) -> torch.Tensor:
    """A layer's output (or its gradient) as [examples, groups, channels per group, positions]."""
    if isinstance(module, nn.Conv2d):
        rows = output.reshape(output.shape[0], output.shape[1], -1)
    else:
        rows = output.reshape(output.shape[0], -1, output.shape[-1]).transpose(1, 2)
    return rows.reshape(rows.shape[0], _groups(module), -1, rows.shape[-1])


def _weights(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The layer's weights (and bias) as [groups, out per group, in per group (+1)], detached, in float64."""
    groups = _groups(module)
    theta = weight.detach().double().reshape(groups, weight.shape[0] // groups, -1)
    if bias is not None:
        theta = torch.cat([theta, bias.detach().double().reshape(groups, -1, 1)], -1)
    return theta


def kronecker_factors(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    hyper: nn.Module | None = None,
    samples: int | None = None,
    subnetwork: int | None = None,
    full: bool = False,
) -> tuple[torch.Tensor, dict[str, KroneckerFactors]]:
    """The invariant model's log-likelihood of ``y`` (its logits the mean over the views ``hyper`` draws of ``x``,
    ``samples`` per example) and the Kronecker factors of every Conv2d's and Linear's generalised Gauss-Newton (LILA's
    KFAC): the softmax Hessian's square root propagated back once per class, the views a weight-sharing dimension
    that is reduced (their inputs averaged, their output gradients summed), a convolution's positions expanded
    (the patches' second moment averaged over positions, the gradients' summed), a grouped convolution's groups
    block-diagonal. Both are differentiable in psi (the transform's parameters): the factors carry their graph,
    the Hessian's root is held constant. ``subnetwork`` runs a ``PartitionedModel``'s (default: its last);
    ``full`` keeps every A as its [G, I, I] moment (:func:`input_moment`).

    Example (a linear model's factors: A the inputs' second moment, B p(1-p) summed)::

        >>> x, y = torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1])
        >>> _, factors = kronecker_factors(nn.Linear(1, 2, bias=False), x, y)
        >>> factors[""].a
        tensor([[[2.5000]]], dtype=torch.float64)
    """
    layers = factored_layers(model)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def keep(name: str) -> Any:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            weight, bias = module.weight, module.bias  # this call's: the subnetwork's effective tensors
            assert isinstance(weight, torch.Tensor) and (bias is None or isinstance(bias, torch.Tensor))
            seen[name] = (inputs[0], output, weight, bias)

        return hook

    handles = [module.register_forward_hook(keep(name)) for name, module in layers.items()]
    try:
        views, count = apply_transform(hyper, x, grad=True, samples=samples)
        if isinstance(model, PartitionedModel):
            k = model.num_partitions if subnetwork is None else subnetwork
            outputs = model(views, subnetwork=k)
        else:
            outputs = model(views)
    finally:
        for handle in handles:
            handle.remove()
    batch = len(x)
    logits = model_logits(outputs, "the Occam term").reshape(count, batch, -1).mean(0)
    loglik = torch.log_softmax(logits, -1).gather(1, y.long()[:, None]).sum()
    names = [name for name in layers if name in seen]  # the layers this forward ran
    factors: dict[str, KroneckerFactors] = {}
    for name in names:
        inputs = seen[name][0]
        averaged = inputs.reshape(count, batch, *inputs.shape[1:]).mean(0)  # unfolding is linear: before it
        patches = _patches(layers[name], averaged).double()
        a = input_moment(patches, full)
        factors[name] = KroneckerFactors(a, a.new_zeros(()), _weights(layers[name], *seen[name][2:]))
    # the softmax NLL's Hessian diag(p) - p p^T = L L^T with L = diag(sqrt p) - p sqrt(p)^T
    p = torch.softmax(logits.detach(), -1)
    root = torch.diag_embed(p.sqrt()) - p[:, :, None] * p.sqrt()[:, None, :]
    outputs_seen = [seen[name][1] for name in names]
    for column in range(root.shape[-1]):
        grads = torch.autograd.grad(
            logits, outputs_seen, root[:, :, column], retain_graph=True, create_graph=True, allow_unused=True
        )
        for name, grad in zip(names, grads):
            if grad is None:  # a layer whose output the logits do not read
                continue
            rows = _output_rows(layers[name], grad.reshape(count, batch, *grad.shape[1:]).sum(0)).double()
            factors[name].b = factors[name].b + torch.einsum("ngip,ngjp->gij", rows, rows)
    return loglik, factors


def input_moment(patches: torch.Tensor, full: bool = False) -> torch.Tensor:
    """The Kronecker factor A of ``patches`` [examples, positions, groups, inputs I]: their second moment per patch,
    sum_patches a a^T / patches, [G, I, I]; or where there are fewer patches R than inputs, its Gram form,
    sum over inputs of a_r a_s / patches, [G, R, R], which has the same nonzero eigenvalues at a fraction of the
    cost of decomposing it (a late layer's patches on a subset: a 4608-input convolution with 512 patches);
    ``full``: the moment always.

    >>> patches = torch.randn(2, 1, 1, 5, dtype=torch.float64)  # 2 patches of 5 inputs
    >>> gram = input_moment(patches)
    >>> moment = torch.einsum("npgi,npgj->gij", patches, patches) / 2
    >>> gram.shape, torch.allclose(torch.linalg.eigvalsh(gram), torch.linalg.eigvalsh(moment)[:, -2:])
    (torch.Size([1, 2, 2]), True)
    """
    count = patches.shape[0] * patches.shape[1]
    if full or count >= patches.shape[-1]:
        return torch.einsum("npgi,npgj->gij", patches, patches) / count
    rows = patches.reshape(count, *patches.shape[2:]).transpose(0, 1)  # [G, R, I]
    return rows @ rows.transpose(1, 2) / count


def fitted_precision(products: torch.Tensor, norm: float) -> float:
    """The prior precision delta that maximises a layer's Occam term 1/2 P log delta - 1/2 delta |theta|^2 -
    1/2 sum log(delta + lambda) over the curvature's eigenvalues ``products`` (one per parameter; |theta|^2 =
    ``norm``): the root of sum lambda / (delta (delta + lambda)) = |theta|^2, which is unique (the left side
    falls from infinity to 0), by bisection of log delta within :data:`PRECISION_BOUNDS`.

    >>> round(fitted_precision(torch.tensor([1.0]), 0.5), 6)  # 1 / (delta (delta + 1)) = 0.5
    1.0
    """
    lambdas = products.detach().double()
    low, high = (math.log(bound) for bound in PRECISION_BOUNDS)
    for _ in range(PRECISION_ITERATIONS):
        middle = 0.5 * (low + high)
        delta = math.exp(middle)
        if float((lambdas / (delta * (delta + lambdas))).sum()) > norm:
            low = middle
        else:
            high = middle
    return math.exp(0.5 * (low + high))


def laplace_occam(
    factors: dict[str, KroneckerFactors], scale: float = 1.0, precision: float | None = None, given: float = 0.0
) -> torch.Tensor:
    """The whole network's Occam term: the sum over layers of log N(theta; 0, I / delta) - 1/2 log det((delta I +
    ``scale`` B (x) A) / 2 pi) (the 2 pi terms cancel), each layer's delta fitted (:func:`fitted_precision`; at
    its optimum, so its own change with psi adds nothing to the derivative) unless ``precision`` gives one for
    all. ``scale`` is the data's size over the examples B was summed on. Differentiable in the factors, through
    their eigenvalues.

    ``given`` f > 0: the Occam part of log p(D | psi) - log p(D_1 | psi) instead, D_1 the share f of the data (the
    partitioned LML's first chunk, which its chunks 2..C are conditioned on): the same term less D_1's, whose
    curvature is f H at the same weights, -1/2 log det(delta + H) + 1/2 log det(delta + f H) (the priors cancel).
    Along an eigenvalue much larger than delta the two cancel; along a small one it is (1 - f) of the whole term.

    >>> layer = KroneckerFactors(torch.eye(1)[None].double(), torch.eye(1)[None].double(), torch.ones(1, 1, 1).double())
    >>> round(float(laplace_occam({"": layer})), 4)  # delta = 0.618 solves 1 / (delta (delta + 1)) = 1
    -0.7902
    """
    total = torch.zeros((), dtype=torch.float64)
    for layer in factors.values():
        a = _eigenvalues(layer.a).clamp_min(0)  # [G, I], or A's nonzero ones [G, R] (input_moment)
        a = torch.cat([a, a.new_zeros(a.shape[0], layer.theta.shape[-1] - a.shape[-1])], -1)
        b = _eigenvalues(layer.b * scale).clamp_min(0)  # [G, O]
        products = (b[:, :, None] * a[:, None, :]).flatten()
        count, norm = layer.theta.numel(), float(layer.theta.pow(2).sum())
        delta = fitted_precision(products, norm) if precision is None else precision
        if given:
            total = total - 0.5 * torch.log((delta + products) / (delta + given * products)).sum()
        else:
            prior = 0.5 * count * math.log(delta) - 0.5 * delta * norm
            total = total + prior - 0.5 * torch.log(delta + products).sum()
    return total


JITTER = 1e-9
"""A factor whose eigenvalues LAPACK fails on is nudged by this much of its largest diagonal entry."""


def _eigenvalues(matrix: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of the symmetric ``matrix`` [..., n, n], differentiable. LAPACK's divide and conquer can fail
    to converge on a factor with many equal eigenvalues (a layer with more inputs than the subset's patches) when
    it computes the eigenvectors the derivative needs, on some thread counts: such a factor is decomposed nudged
    by :data:`JITTER` of its largest diagonal entry, the nudge taken off the eigenvalues again."""
    values: torch.Tensor
    try:
        values = torch.linalg.eigvalsh(matrix)
    except torch.linalg.LinAlgError:
        nudge = JITTER * matrix.detach().diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(1e-300)
        eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        values = torch.linalg.eigvalsh(matrix + nudge[..., None, None] * eye) - nudge[..., None]
    return values


class OccamTerm:
    """The hyperparameter step's Occam term, amortised: every ``every``-th hyperparameter step refreshes it
    (:meth:`refresh`) on a batch of examples from all the data, through the last subnetwork, and keeps its
    derivative in psi; every step adds that derivative, over the examples its evidence is of (:attr:`scored`:
    the ``num_examples`` of the data, less the ``given`` ones it is conditioned on), to the step's per-example loss
    (:meth:`term`). Its state is what a resumed run needs to add the same until the next refresh.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.transforms import AffineAugmentation
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 3))
        >>> pmodel, aug = partitionify(model, 2), AffineAugmentation(generators=["rotation"], init=0.5)
        >>> occam = OccamTerm(num_examples=100, samples=4)
        >>> occam.refresh(pmodel, aug, list(aug.parameters()), torch.randn(8, 1, 8, 8), torch.randint(0, 3, (8,)))
        >>> term = occam.term(list(aug.parameters()))
        >>> float(term), term.requires_grad
        (0.0, True)
    """

    def __init__(
        self, num_examples: int, samples: int | None = None, norm_statistics: str = "batch", given: int = 0
    ) -> None:
        if not 0 <= given < num_examples:
            raise PartitionArgumentError(
                f"the Occam term's given examples must be in 0..{num_examples - 1}, got {given}"
            )
        self.num_examples = num_examples
        self.given = given
        """The examples the term is conditioned on (the first chunk's, ``occam_term="conditional"``; 0: none)."""
        self.samples = samples
        self.norm_statistics = norm_statistics
        self.gradient: list[torch.Tensor] | None = None
        """d Occam / d psi at the last refresh (None: none yet)."""
        self.value: float | None = None
        """The Occam term at the last refresh (nats, for the whole data)."""

    @staticmethod
    def check(likelihood: Likelihood) -> None:
        """Refuse a likelihood whose Hessian the term does not factor (it knows the softmax's)."""
        if type(likelihood) is not Categorical:
            raise PartitionArgumentError(
                f"the Occam term factors the curvature of classification's softmax likelihood, but this run's "
                f"likelihood is {type(likelihood).__name__}: train it with occam_term='none'"
            )

    def refresh(
        self,
        pmodel: PartitionedModel,
        hyper: nn.Module | None,
        hyperparameters: Sequence[torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        """Compute the term on ``x, y`` through the last subnetwork and keep its derivative in
        ``hyperparameters`` (the model's running statistics left as they were). The model's likelihood is the
        softmax's (:meth:`check`, where the term is built)."""
        with buffers_restored(pmodel), hyper_step_norms(pmodel, self.norm_statistics):
            _, factors = kronecker_factors(pmodel, x, y, hyper=hyper, samples=self.samples)
            occam = laplace_occam(factors, scale=self.num_examples / len(x), given=self.given / self.num_examples)
            found = torch.autograd.grad(occam, list(hyperparameters), allow_unused=True)
        self.gradient = [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(found, hyperparameters)]
        self.value = float(occam.detach())

    def term(self, hyperparameters: Sequence[torch.Tensor]) -> torch.Tensor:
        """A zero-valued tensor whose derivative in psi is minus the last refresh's derivative of the Occam term
        over :attr:`num_examples`: what the step's per-example loss adds (nothing before the first refresh)."""
        total = hyperparameters[0].new_zeros(()) if hyperparameters else torch.zeros(())
        if self.gradient is None:
            return total
        for gradient, p in zip(self.gradient, hyperparameters):
            total = total - (gradient * (p - p.detach())).sum() / self.scored
        return total

    @property
    def scored(self) -> int:
        """The examples the term's evidence is of, which its per-example value divides by: the data's, less the
        given ones'."""
        return self.num_examples - self.given

    def state_dict(self) -> dict[str, Any]:
        """The derivative and value of the last refresh, as plain lists (exact: float32 values in JSON)."""
        gradient = None if self.gradient is None else [g.tolist() for g in self.gradient]
        return {"gradient": gradient, "value": self.value}

    def load_state_dict(self, state: dict[str, Any], like: Sequence[torch.Tensor]) -> None:
        """Restore :meth:`state_dict`'s; ``like`` the hyperparameters (dtypes and devices)."""
        saved = state.get("gradient")
        self.gradient = None if saved is None else [torch.tensor(g, dtype=p.dtype, device=p.device)
                                                    for g, p in zip(saved, like)]  # fmt: skip
        self.value = state.get("value")
