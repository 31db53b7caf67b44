"""The partitioned log marginal likelihood LML = sum_k log p(D_k | w_s^(k-1), psi) (eq. 4 of the paper): the
losses through the subnetworks that its terms and the training steps are made of, its estimate
(:func:`estimate_lml`, the trainer's :class:`LMLEvaluator`), which of its numbers is the evidence a run is judged
by (:func:`evidence`), and the BatchNorm running statistics recalibrated for the final subnetwork
(:func:`recalibrate_norm_statistics`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import torch
from torch import nn

from ...choices import Phase
from ...errors import PartitionArgumentError
from ...fx.partitioned_model import PartitionedModel
from ...job.train_config import TrainConfig
from ...transforms.base import WidensRanges
from ..checkpoint import load_checkpoint, needs_recalibration
from ..sampling.chunks import DataChunks, Examples
from ..step.stepping import Precision
from .likelihoods import Categorical, Likelihood, ModelLoss, model_logits
from .objective import Objective, running_norms

if TYPE_CHECKING:
    from ...transforms import AffineAugmentation

# --- the losses through the subnetworks ------------------------------------------------------------------------------


def apply_transform(
    hyper: nn.Module | None,
    x: torch.Tensor,
    grad: bool = True,
    samples: int | None = None,
    widen: float | Mapping[str, float] = 1.0,
) -> tuple[torch.Tensor, int]:
    """``(hyper(x), S)``: the input transform's S samples per example, sample major (``(x, 1)`` without one).
    ``grad=False`` runs it without autograd (a parameter loss needs no gradient of psi); ``samples`` asks
    the transform for that many samples (``hyper(x, num_samples=samples)``) instead of its own number;
    ``widen`` != 1 draws them from its ranges times ``widen`` (``hyper.widened(widen)``)."""
    if hyper is None:
        return x, 1
    batch = x.shape[0]
    with _transforming(hyper, grad, widen):
        out = hyper(x) if samples is None else hyper(x, num_samples=samples)
    if out.shape[0] % batch:
        raise PartitionArgumentError(
            f"the input transform {type(hyper).__name__} returned {out.shape[0]} inputs for {batch} examples; "
            "it must return S * batch inputs, sample major"
        )
    return out, out.shape[0] // batch


@contextmanager
def _transforming(hyper: nn.Module, grad: bool, widen: float | Mapping[str, float]) -> Iterator[None]:
    """How an input transform runs in a loss: with autograd only when ``grad`` (and it is on), from its ranges
    times ``widen``."""
    # widen != 1 only where the transform widens its ranges (objective.widens, checked where the run is assembled)
    widened = cast(WidensRanges, hyper).widened(widen) if widen != 1.0 else nullcontext()
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()), widened:
        yield


def forward_log_likelihood(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    x: torch.Tensor,
    y: torch.Tensor,
    subnetwork: int,
    hyper: nn.Module | None = None,
    transform_grad: bool = True,
    samples: int | None = None,
    widen: float | Mapping[str, float] = 1.0,
) -> torch.Tensor:
    """Per-example log p(y | x) through ``subnetwork``, after the input transform ``hyper`` (whose S
    samples per example are averaged by the likelihood). ``transform_grad=False`` runs the transform
    without autograd (a parameter step needs no gradient of psi); ``samples`` overrides the transform's
    number of samples and ``widen`` widens its ranges (see :func:`apply_transform`). With a :class:`ModelLoss`
    the model scores the targets itself: ``pmodel(x, y, subnetwork=...)``, after the transform of both."""
    if isinstance(likelihood, ModelLoss):
        if hyper is not None:
            with _transforming(hyper, transform_grad, widen):
                x, y = hyper(x, y)
        return likelihood(pmodel(x, y, subnetwork=subnetwork), y)
    x, samples = apply_transform(hyper, x, transform_grad, samples, widen)
    return likelihood(pmodel(x, subnetwork=subnetwork), y, samples)


ScoredBatch = tuple[float, int, torch.Tensor, torch.Tensor]
"""``(weight, k, x, y)``: examples of chunk k, scored by subnetwork k-1, their mean loss weighted by ``weight``."""


def hyper_loss(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    batches: Sequence[ScoredBatch],
    samples: int | None = None,
) -> torch.Tensor:
    """A hyperparameter step's loss: the sum over ``(weight, k, x, y)`` of weight times the mean negative
    log-likelihood of those examples of chunk k through subnetwork k-1, each chunk in its own forward (so
    BatchNorm statistics are those of one subnetwork), with ``samples`` augmentation samples per example.

    >>> from partition_fx import partitionify
    >>> from partition_fx.training import Categorical
    >>> x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 0, 1])
    >>> pmodel, likelihood = partitionify(nn.Linear(3, 2), 3), Categorical()
    >>> total = hyper_loss(pmodel, likelihood, None, [(0.5, 2, x[2:4], y[2:4]), (0.5, 3, x[4:5], y[4:5])])
    >>> a = -likelihood(pmodel(x[2:4], subnetwork=1), y[2:4]).mean()
    >>> b = -likelihood(pmodel(x[4:5], subnetwork=2), y[4:5]).mean()
    >>> torch.allclose(total, 0.5 * a + 0.5 * b)
    True
    """
    total: torch.Tensor | None = None
    for weight, k, x, y in batches:
        term = -weight * forward_log_likelihood(pmodel, likelihood, x, y, k - 1, hyper, samples=samples).mean()
        total = term if total is None else total + term
    if total is None:
        raise PartitionArgumentError("a hyperparameter loss needs at least one chunk's batch")
    return total


def log_likelihood_of_draws(
    pmodel: PartitionedModel,
    augmentation: AffineAugmentation,
    draws: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    subnetwork: int,
    likelihood: Likelihood | None = None,
) -> torch.Tensor:
    """Per-example log (1/S) sum_s p(y_i | x_i transformed by ``draws[s]``) through ``subnetwork``: the S fixed
    coefficient vectors ``draws`` [S, G] of ``augmentation`` (its ``transform``), the same for every example
    (common random numbers: two ranges, or two weights, compared on the same draws), in one forward; ``likelihood``
    averages the S samples' predictive (default: :class:`Categorical`). Differentiable in the weights and in the
    augmentation's ranges: a hyper-gradient without sampling noise. The model runs in its current mode.

    >>> from partition_fx import partitionify
    >>> from partition_fx.transforms import AffineAugmentation, averaging_coefficients
    >>> pmodel = partitionify(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), 2, seed=0)
    >>> rotation = AffineAugmentation.fixed({"rotation": 1.0}, generators=["rotation"])
    >>> x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    >>> draws = averaging_coefficients(8, 1)  # the midpoints of 8 equal parts of [-1, 1]
    >>> log_likelihood_of_draws(pmodel, rotation, draws, x, y, subnetwork=1).shape
    torch.Size([4])
    """
    samples = draws.shape[0]
    inputs = augmentation.transform(x, draws[:, None, :].expand(samples, x.shape[0], draws.shape[1]))
    return (likelihood or Categorical())(pmodel(inputs, subnetwork=subnetwork), y, samples)


def hyper_step_norms(model: nn.Module, statistics: str) -> contextlib.AbstractContextManager[None]:
    """Inside the block, what ``model``'s BatchNorm layers normalise a hyperparameter step's batches with
    (``TrainConfig.hyper.norm_statistics``, ``train_config.HYPER_NORMS``): ``"batch"``, their own statistics as
    in training (nothing changes); ``"detached"``, the same statistics, held constant in the backward pass, so
    the hyper-gradient reaches psi through the predictions alone; ``"running"``, the running statistics
    (the layers in eval mode, which also leaves those statistics as they are).

    >>> bn = nn.BatchNorm1d(2)
    >>> x = torch.randn(8, 2, requires_grad=True)
    >>> with hyper_step_norms(bn, "detached"):
    ...     y = bn(x)
    >>> torch.allclose(y, nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, True), atol=1e-6)
    True
    >>> y.sum().backward()  # the batch mean no longer depends on x: every input's gradient is weight / std
    >>> torch.allclose(x.grad, (bn.weight / x.detach().var(0, unbiased=False).add(bn.eps).sqrt()).expand(8, 2))
    True
    """
    if statistics == "batch":  # the default: nothing to look up, every hyperparameter step
        return nullcontext()
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return nullcontext()
    if statistics == "running":
        return _in_eval_mode([m for m in norms if m.track_running_stats])
    return _hooked([*norms], _detached_batch_statistics)  # a list[nn.Module] (a list's item type is invariant)


@contextlib.contextmanager
def _in_eval_mode(modules: list[nn.Module]) -> Iterator[None]:
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


@contextlib.contextmanager
def _hooked(modules: list[nn.Module], hook: Callable[..., Any]) -> Iterator[None]:
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _detached_batch_statistics(module: nn.modules.batchnorm._BatchNorm, inputs: tuple[Any, ...], output: Any) -> Any:
    """A forward hook: BatchNorm's output normalised by the batch's statistics held constant (where the layer
    normalises by its batch, in training mode or without running statistics; otherwise its output as it is)."""
    if not (module.training or module.running_mean is None):
        return None
    x = inputs[0]
    dims = [0, *range(2, x.dim())]
    mean, var = x.mean(dims).detach(), x.var(dims, unbiased=False).detach()
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + module.eps)
    if module.affine:
        y = y * module.weight.view(shape) + module.bias.view(shape)
    return y


def _detached_likelihood(
    likelihood: Likelihood, outputs: torch.Tensor, targets: torch.Tensor, samples: int
) -> torch.Tensor:
    """The likelihood with its own hyperparameters (a noise scale) detached: a parameter loss."""
    detached = {name: p.detach() for name, p in likelihood.named_parameters()}
    scores: torch.Tensor = torch.func.functional_call(likelihood, detached, (outputs, targets, samples))  # Any
    return scores


def routed_losses(
    pmodel: PartitionedModel,
    likelihood: Likelihood,
    hyper: nn.Module | None,
    ks: torch.Tensor,
    batch: tuple[torch.Tensor, torch.Tensor],
    hyper_batches: Sequence[ScoredBatch] = (),
    samples: int | None = None,
    widen: float | Mapping[str, float] = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Parameter examples (example i through subnetwork ks[i], training partition ks[i]) and hyperparameter
    examples (each ``(weight, k, x, y)`` of ``hyper_batches``: chunk k through subnetwork k-1, training no
    partition) in ONE forward; returns (parameter loss, hyperparameter loss or None): the parameter
    examples' mean negative log-likelihood, and the weighted sum of each hyper batch's mean. The hyper
    examples draw ``samples`` augmentation samples each (default: the transform's own number); the parameter
    examples' are drawn from its ranges times ``widen``."""
    xp, yp = batch
    xp, samples_p = apply_transform(hyper, xp, grad=False, widen=widen)
    # The routing stays where the sampler drew it (the host): checking it and grouping examples by it then
    # read no value from the accelerator.
    ks = ks.repeat(samples_p)  # sample-major, like the inputs
    inputs, subnetworks, grads = [xp], [ks], [ks]
    hyper_parts = []
    for weight, k, xh, yh in hyper_batches:
        xh, samples_h = apply_transform(hyper, xh, grad=True, samples=samples)
        inputs.append(xh)
        subnetworks.append(torch.full((xh.shape[0],), k - 1, device=ks.device))
        grads.append(torch.zeros(xh.shape[0], dtype=torch.long, device=ks.device))
        hyper_parts.append((weight, xh.shape[0], yh, samples_h))
    out = model_logits(pmodel(torch.cat(inputs), subnetwork=torch.cat(subnetworks), grad_partition=torch.cat(grads)))
    n = xp.shape[0]
    parameter_loss = -_detached_likelihood(likelihood, out[:n], yp, samples_p).mean()
    hyper_loss = None
    for weight, rows, yh, samples_h in hyper_parts:
        term = -weight * likelihood(out[n : n + rows], yh, samples_h).mean()
        hyper_loss = term if hyper_loss is None else hyper_loss + term
        n += rows
    return parameter_loss, hyper_loss


# --- the estimate and the evidence -----------------------------------------------------------------------------------


@contextmanager
def buffers_restored(*modules: nn.Module | None) -> Iterator[None]:
    """Run a block and put every buffer (e.g. BatchNorm running statistics) back as it was."""
    saved = [(b, b.clone()) for m in modules if m is not None for b in m.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def conditional_lml_of_draws(
    pmodel: PartitionedModel,
    augmentation: AffineAugmentation,
    draws: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    chunks: DataChunks,
    likelihood: Likelihood | None = None,
) -> float:
    """The conditional LML of ``pmodel`` on the examples ``x``, ``y`` split into ``chunks``, under the fixed
    ``draws`` of ``augmentation``: the sum over k = 2..C of chunk k's :func:`log_likelihood_of_draws` through
    subnetwork k-1. Each chunk is one forward in training mode, BatchNorm on that chunk's batch statistics (as a
    hyperparameter step sees them); no gradients, and the model's buffers and mode are left as they were. Where
    :func:`estimate_lml` is a Monte Carlo estimate (fresh augmentation samples), this is a deterministic
    function of the weights and the ranges: scores of two weights or two ranges differ by them alone.

    >>> from partition_fx import partitionify
    >>> from partition_fx.training import split_into_chunks
    >>> from partition_fx.transforms import AffineAugmentation, averaging_coefficients
    >>> pmodel = partitionify(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), 3, seed=0)
    >>> x, y, chunks = torch.rand(30, 1, 8, 8), torch.arange(30) % 3, split_into_chunks(30, (0.6, 0.2, 0.2))
    >>> draws = averaging_coefficients(8, 1)
    >>> scores = [conditional_lml_of_draws(pmodel, AffineAugmentation.fixed({"rotation": r}, generators=["rotation"]),
    ...                                     draws, x, y, chunks) for r in (0.5, 0.5, 1.5)]
    >>> scores[0] == scores[1] != scores[2], scores[0] < 0
    (True, True)
    """
    was_training = pmodel.training
    total = 0.0
    pmodel.train()
    try:
        with torch.no_grad(), buffers_restored(pmodel):
            for k in range(2, chunks.num_chunks + 1):
                rows = chunks.chunk(k)
                total += float(
                    log_likelihood_of_draws(pmodel, augmentation, draws, x[rows], y[rows], k - 1, likelihood).sum()
                )
    finally:
        pmodel.train(was_training)
    return total


@dataclass(frozen=True)
class LMLEstimate:
    """``total`` = sum_k ``per_chunk[k-1]`` (nats); ``per_example`` = total / number of examples.

    ``conditional`` = sum over k >= 2 only: log p(D_2:C | D_1, psi), the part the hyperparameter steps
    climb. The k=1 term scores D_1 with subnetwork 0, the untrained defaults, so with a learned noise scale
    (fitted on later chunks) it can dominate the total; for comparing models it is the steadier number
    (compare the conditional marginal likelihood of Lotfi et al., 2022).
    """

    total: float
    per_chunk: list[float]
    per_example: float

    @property
    def conditional(self) -> float:
        return sum(self.per_chunk[1:])


class EvaluationRecord(TypedDict):
    """One evaluation of a run, as the trainer's ``history``, ``report.json``, every hook and callback and the
    Lightning module's loggers get it (built by :func:`evaluation_record`; a plain dict, so JSON as it is).

    The LML fields (:func:`lml_fields`) are None in fine-tuning; the conditional ones also with one partition.
    """

    step: int
    phase: str
    lml: float | None
    lml_per_chunk: list[float] | None
    lml_per_example: float | None
    conditional_lml: float | None
    conditional_lml_per_example: float | None
    train_loss: float | None
    """The mean parameter-step loss since the last evaluation (None: no step)."""
    hyper_loss: float | None
    """The mean hyperparameter-step loss since the last evaluation (None: no step)."""
    hyperparameters: dict[str, Any]
    seconds: float
    """Since the run (or this part of a resumed run) began."""


def evaluation_record(
    step: int,
    estimate: LMLEstimate | None,
    scored: int,
    losses: tuple[Sequence[float], Sequence[float]],
    hyperparameters: dict[str, Any],
    seconds: float,
) -> EvaluationRecord:
    """The record of the evaluation at ``step``: its phase (fine-tuning when there is no ``estimate``), the LML
    fields of ``estimate`` (:func:`lml_fields`, ``scored`` examples in chunks 2..C), the mean parameter and
    hyperparameter ``losses`` since the last one, the ``hyperparameters`` and the ``seconds`` elapsed.

    >>> record = evaluation_record(4, None, 10, ([1.0, 3.0], []), {"rotation": 1.5}, 2.0)
    >>> record["phase"], record["train_loss"], record["hyper_loss"], record["lml"]
    ('finetune', 2.0, None, None)
    """
    mean = lambda values: float(sum(values) / len(values)) if values else None  # noqa: E731
    return {
        "step": step,
        "phase": (Phase.PARTITIONED if estimate is not None else Phase.FINETUNE).value,  # a plain str, as JSON holds it
        **lml_fields(estimate, scored),  # type: ignore[typeddict-item]  # a plain dict of the record's LML fields
        "train_loss": mean(losses[0]),
        "hyper_loss": mean(losses[1]),
        "hyperparameters": hyperparameters,
        "seconds": round(seconds, 3),
    }


def lml_fields(estimate: LMLEstimate | None, scored: int) -> dict[str, Any]:
    """An evaluation record's LML fields: the full LML (total, per chunk, per example) and the conditional one
    (total, and per example over the ``scored`` examples of chunks 2..C). With one partition no chunk is scored
    by a subnetwork that trained on others: no conditional LML. All None in fine-tuning (``estimate`` None).

    >>> lml_fields(LMLEstimate(-30.0, [-20.0, -6.0, -4.0], -1.0), scored=10)["conditional_lml_per_example"]
    -1.0
    """
    conditional = estimate is not None and scored > 0
    return {
        "lml": None if estimate is None else estimate.total,
        "lml_per_chunk": None if estimate is None else estimate.per_chunk,
        "lml_per_example": None if estimate is None else estimate.per_example,
        "conditional_lml": estimate.conditional if conditional and estimate is not None else None,
        "conditional_lml_per_example": estimate.conditional / scored if conditional and estimate is not None else None,
    }


NO_EVIDENCE = (
    "no evidence with one partition: its LML scores chunk 1 by the untrained defaults, which says nothing about what "
    "was trained (compare such runs by test accuracy)"
)
"""What a run of one partition has instead of evidence (:func:`evidence` is None; the command line and the plots
say this)."""


def evidence(record: Mapping[str, Any]) -> float | None:
    """The number an evaluation ``record`` (or a ``FitResult``'s fields) is judged by, the one place this rule is
    written: the conditional LML, log p(D_2..D_C | D_1, psi), chunks 2..C each scored by a subnetwork that never
    saw it. None in fine-tuning, which estimates no LML, and with one partition (:data:`NO_EVIDENCE`): the full
    LML adds chunk 1 scored by the untrained subnetwork 0, which dominates it whatever was learned
    (docs/benchmarks.md), and with C = 1 it is nothing else. The best state is the record with the highest
    evidence (the latest partitioned one when no record has any); the progress shows it.

    >>> evidence({"lml": -30.0, "conditional_lml": -10.0}), evidence({"lml": -30.0, "conditional_lml": None})
    (-10.0, None)
    """
    return record.get("conditional_lml")


def estimate_lml(
    pmodel: PartitionedModel,
    examples: Examples,
    chunks: DataChunks,
    likelihood: Likelihood,
    hyper: nn.Module | None = None,
    batch_size: int = 256,
    max_examples_per_chunk: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> LMLEstimate:
    """Score chunk k with subnetwork k-1, for k = 1..C, and sum.

    The model and transforms run as in a hyperparameter step (training mode: augmentation and dropout
    sampled, BatchNorm on batch statistics), so with stochastic transforms this is a Monte Carlo
    estimate of the objective the hyperparameter steps climb; buffers are restored afterwards, so it has
    no side effects. With ``max_examples_per_chunk``, a chunk larger than that is scored on a uniform
    subsample without replacement, scaled by |D_k| / m: an unbiased estimate of its term.
    """
    modes = [(m, m.training) for m in (pmodel, hyper, likelihood) if m is not None]
    per_chunk = []
    try:
        for m, _ in modes:
            m.train(True)
        with torch.no_grad(), buffers_restored(pmodel, hyper, likelihood):
            for k in range(1, chunks.num_chunks + 1):
                indices = chunks.chunk(k)
                scale = 1.0
                if max_examples_per_chunk is not None and indices.numel() > max_examples_per_chunk:
                    pick = torch.randperm(indices.numel(), generator=generator)[:max_examples_per_chunk]
                    scale = indices.numel() / max_examples_per_chunk
                    indices = indices[pick]
                total = 0.0
                for x, y in examples.batches(indices.split(batch_size), device):
                    total += float(forward_log_likelihood(pmodel, likelihood, x, y, k - 1, hyper).double().sum())
                per_chunk.append(total * scale)
    finally:
        for m, mode in modes:
            m.train(mode)
    total = sum(per_chunk)
    return LMLEstimate(total, per_chunk, total / sum(chunks.sizes))


# --- BatchNorm running statistics recalibrated -----------------------------------------------------------------------


def forked_rng() -> contextlib.AbstractContextManager[Any]:
    """torch's random generators (the CPU's and every initialised CUDA device's) put back as they were after the
    block: an estimate or a recalibration drawn inside changes no later draw of the run."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=devices)


def recalibrated_states(
    pmodel: PartitionedModel,
    states: dict[str, dict[str, torch.Tensor]],
    examples: Examples,
    batch_size: int,
    device: torch.device | None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Module ``states`` (as ``Objective.states`` gives them) with the model's BatchNorm running statistics
    recalibrated for the final subnetwork over ``examples`` (:func:`recalibrate_norm_statistics`), computed on a
    copy of ``pmodel``: the model, and torch's random generators, stay as they are."""
    copied = copy.deepcopy(pmodel)
    copied.load_state_dict({**copied.state_dict(), **states["model"]})
    with forked_rng():
        recalibrate_norm_statistics(copied, examples, batch_size=batch_size, device=device)
    recalibrated = copied.state_dict()
    return {**states, "model": {k: recalibrated[k].detach() for k in states["model"]}}


def recalibrate_norm_statistics(
    pmodel: PartitionedModel,
    examples: Examples,
    subnetwork: int | None = None,
    batch_size: int = 256,
    device: torch.device | None = None,
) -> int:
    """Recompute every BatchNorm's running statistics for one subnetwork (default C) over the whole dataset.

    During partitioned training the running statistics are shared by all subnetworks and mostly follow
    the ones stepped most often (subnetwork 1 with the paper's proportions); the exported final model
    runs in eval mode on those statistics, so they are recomputed for it, as
    ``torch.optim.swa_utils.update_bn`` does for averaged weights: an equal-weight average over batches
    in training mode, without gradients. Returns how many BatchNorm modules were updated.

    Random layers (dropout, drop-path) draw as in training, from torch's global generator, which is forked
    around the pass: recalibrating (a copy, at any point of a run) changes no later draw of the run.

    >>> from partition_fx import partitionify
    >>> pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)), 2)
    >>> recalibrate_norm_statistics(pmodel, Examples((torch.randn(8, 2), torch.zeros(8))))
    1
    """
    norms = running_norms(pmodel)
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    was_training = pmodel.training
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches below
        pmodel.train()
        # Eager even for a compiled model: a cumulative average reads the batch count on the host per batch
        # (a graph break in BatchNorm's forward), and a one-off pass is not worth a graph.
        with forked_rng(), torch.no_grad(), torch.compiler.set_stance("force_eager"):
            for x, _ in examples.batches(torch.arange(len(examples)).split(batch_size), device):
                pmodel(x, subnetwork=subnetwork)
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        pmodel.train(was_training)
    return len(norms)


def load_for_export(
    pmodel: PartitionedModel,
    hyper: nn.Module | None,
    training_data: Callable[[], Any],
    checkpoint: Path,
    config: TrainConfig,
    subnetwork: int | None = None,
) -> tuple[dict[str, Any], int]:
    """Load ``checkpoint`` into ``pmodel`` and its input transform ``hyper`` (built as the run built them) with
    ``training.load_checkpoint``: no trainer. Where the model's BatchNorm statistics are not calibrated for
    ``subnetwork`` (default C; ``training.checkpoint.needs_recalibration``) they are recalibrated over the
    training examples that ``training_data()`` returns, as the end of a run does (the run's ``config``: its
    evaluation batch size; on the CPU). ``training_data`` is called only then: ``export`` loads the training
    split only for a recalibration. Returns the checkpoint's metadata and how many BatchNorm modules were
    recalibrated."""
    meta = load_checkpoint(pmodel, checkpoint, hyper=hyper)
    if not needs_recalibration(meta, pmodel.check_subnetwork(subnetwork), pmodel.num_partitions):
        return meta, 0
    batch_size = config.evaluation.batch_size  # as the end of the run recalibrated
    recalibrated = recalibrate_norm_statistics(
        pmodel, Examples(training_data()), subnetwork, batch_size=batch_size, device=torch.device("cpu")
    )
    return meta, recalibrated


# --- the trainer's evaluation ----------------------------------------------------------------------------------------


class LMLEvaluator:
    """Estimates the LML of ``objective`` (its model, input transform and likelihood) on the data ``chunks`` of
    ``examples`` (see :func:`~partition_fx.training.estimate_lml`: ``batch_size`` examples per forward, chunks
    larger than ``max_examples_per_chunk`` subsampled), under ``precision``.

    Its random draws (augmentation and dropout noise, subsampling) come from its own ``generator``, seeded with
    ``seed``: torch's global generator is forked around an estimate, so how often the LML is estimated
    (``eval_every``) does not change the training path.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training import Categorical, split_into_chunks
        >>> from partition_fx.training.objective.objective import Objective
        >>> examples, chunks = Examples((torch.randn(30, 2), torch.zeros(30).long())), split_into_chunks(30, (0.5, 0.5))
        >>> evaluator = LMLEvaluator(Objective(partitionify(nn.Linear(2, 2), 2), None, Categorical()), examples, chunks)
        >>> before = torch.get_rng_state()
        >>> estimate = evaluator.estimate()
        >>> len(estimate.per_chunk), torch.equal(torch.get_rng_state(), before)
        (2, True)
    """

    def __init__(
        self,
        objective: Objective,
        examples: Examples,
        chunks: DataChunks,
        *,
        batch_size: int = 256,
        max_examples_per_chunk: int | None = None,
        seed: int = 1,
        device: torch.device | None = None,
        precision: Precision | None = None,
    ) -> None:
        self.objective = objective
        self.examples = examples
        self.chunks = chunks
        self.batch_size = batch_size
        self.max_examples_per_chunk = max_examples_per_chunk
        self.device = device
        self.precision = precision if precision is not None else Precision("fp32", device)
        self.generator = torch.Generator().manual_seed(seed)

    def estimate(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters, its noise from :attr:`generator`."""
        with forked_rng():
            seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
            torch.manual_seed(seed)
            with self.precision.autocast():
                return estimate_lml(
                    self.objective.pmodel,
                    self.examples,
                    self.chunks,
                    self.objective.required_likelihood,
                    self.objective.hyper,
                    batch_size=self.batch_size,
                    max_examples_per_chunk=self.max_examples_per_chunk,
                    generator=self.generator,
                    device=self.device,
                )
