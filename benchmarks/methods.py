"""The hyperparameter-learning methods compared in ``hyperparameter_methods.py``, on one shared budget.

Every method trains the same timm model (same initial weights for a seed) for ``Budget.steps`` iterations
of ``Budget.batch_size`` examples with Adam (cosine-annealed to lr/100), ``Budget.samples`` augmentation
samples per example, and is scored the same way (:func:`evaluate`). The test split is used only there.

* :func:`train_plain`: plain training (one network, all training data) with a FIXED ``AffineAugmentation``
  (none, a hand-chosen one, or found by another method); or, with ``learn=``, one of the baselines that
  learn the ranges alongside: ``"augerino"`` / ``"augerino_unsafe"`` (Benton et al. 2020),
  ``"validation"`` (ranges stepped on a held-out chunk's loss through the model trained on the rest) and
  ``"lila"`` (Immer, van der Ouderaa et al. 2022: ranges stepped on the Laplace evidence, :func:`lila_evidence`).
* :func:`train_partitioned`: this project, ``fit`` on a C=3 partitioned model (paper's iteration scheme, or
  fused + every partition; with or without the whole network's Occam term).

Costs are counted by :class:`PassCounter`: forward and backward passes through the network and the
images they carried (augmentation samples included), LML estimates and BatchNorm recalibration included.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.choices import AFFINE_GENERATORS
from partition_fx.models import build_model
from partition_fx.training import Categorical, TrainConfig, evaluate_classifier, fit, split_into_chunks
from partition_fx.training import evaluate_averaged as evaluate_classifier_averaged
from partition_fx.training.objective.lml import apply_transform, buffers_restored
from partition_fx.training.objective.occam import kronecker_factors, laplace_occam
from partition_fx.training.step.optim import configured_factories
from partition_fx.transforms import AffineAugmentation
from partition_fx.transforms.affine import DEFAULT_MAX_RANGE

GENERATORS = AFFINE_GENERATORS  # AffineAugmentation's default ranges (DEFAULT_MAX_RANGE bounds every set's)
PROPORTIONS = (0.8, 0.1, 0.1)
# Augerino's published default regularisation strength (Benton et al. 2020, their training scripts); not
# tuned here: tuning it needs a validation set, which is what the method claims to avoid.
AUGERINO_STRENGTH = 0.01
# The unsafe variant counts as diverged once a range is this many times its bound (every sample is then
# mostly padding) or the loss is not finite.
DIVERGED_FACTOR = 10.0
# LILA's evidence step at this budget. The paper steps the ranges once per epoch after a burn-in, on the whole data
# with 31 views (MNIST, hundreds of epochs); 400 iterations of 32 are 9 epochs of 1,440 images, so here a step
# every LILA_EVERY iterations after the first LILA_BURN_IN of them, on LILA_EXAMPLES examples (the subsets of 100-150
# that Immer et al. 2023 show keep the optimum), with the views the partitioned run's hyperparameter step draws.
LILA_BURN_IN = 0.1
LILA_EVERY = 10
LILA_EXAMPLES = 128
LILA_SAMPLES = TrainConfig.recommended().hyper.samples


@dataclass(frozen=True)
class Budget:
    """What every method gets: iterations, batch, augmentation samples, learning rates, and where learned
    ranges start (``init``: ``AffineAugmentation``'s default, wide, or ``"zero"``, the paper's and Augerino's,
    with the parameter steps of partitioned training then on the ranges themselves)."""

    steps: int = 400
    batch_size: int = 32
    samples: int = 2
    lr: float = 1e-3
    hyper_lr: float = 0.05
    init: str = "wide"

    def recipe(self, finetune_steps: int = 0, **changes: Any) -> TrainConfig:
        """The recommended training configuration (what ``fit`` and `partition-fx train` default to, the
        hyper-step estimator included), with this budget's iterations, batch and learning rates, and the
        hyperparameter step's examples per chunk scaled with the batch as the default job's (16 of 64): its
        images then stay below the parameter steps' and the validation baseline's hyperparameter steps'."""
        default = TrainConfig.recommended()
        hyper_batch = self.batch_size * default.hyper.batch_size // default.optimization.batch_size
        factor = {"train_range_factor": 1.0} if self.init == "zero" else {}
        return TrainConfig.recommended(
            steps=self.steps, batch_size=self.batch_size, lr=self.lr, hyper_lr=self.hyper_lr,
            hyper_batch_size=max(1, hyper_batch), finetune_steps=finetune_steps, **factor, **changes,
        )  # fmt: skip

    def finetune_steps(self) -> int:
        """The iterations a fine-tuned method spends fine-tuning: the recommended share."""
        return TrainConfig.recommended(steps=self.steps).finetune_steps


class PassCounter:
    """Counts forward and backward passes through ``module`` and the examples they carried.

    A forward hook counts each call; when its output needs a gradient a hook on that output counts the
    backward pass that reaches it (once per backward through the call), so no-grad forwards (LML
    estimates, BatchNorm recalibration) count as forwards only.
    """

    def __init__(self, module: nn.Module) -> None:
        self.forward = self.forward_examples = self.backward = self.backward_examples = 0
        self._handle = module.register_forward_hook(self._on_forward)

    def _on_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        batch = output.shape[0]
        self.forward += 1
        self.forward_examples += batch
        if output.requires_grad:
            output.register_hook(self._on_backward)

    def _on_backward(self, grad: torch.Tensor) -> None:
        self.backward += 1
        self.backward_examples += grad.shape[0]

    def as_dict(self) -> dict[str, int]:
        self._handle.remove()
        return {
            "forward": self.forward,
            "backward": self.backward,
            "forward_images": self.forward_examples,
            "backward_images": self.backward_examples,
        }


@dataclass
class Task:
    """A dataset and the augmentation a practitioner would pick for it by hand (method 2)."""

    name: str
    data: Any
    hand_chosen: dict[str, float]
    truth: dict[str, float]
    """The data's true invariances in ``AffineAugmentation`` units (empty: not known)."""


@torch.no_grad()
def evaluate(model: nn.Module, data: Any, x: torch.Tensor | None = None, y: torch.Tensor | None = None):
    """(accuracy, mean log-likelihood) of a plain ``model`` on the test split (or on ``x``, ``y``), after
    recomputing BatchNorm statistics over the unaugmented training images, in eval mode."""
    x_train, _ = data.train.tensors
    torch.optim.swa_utils.update_bn(x_train.split(256), model)
    if x is None:
        x, y = data.test.tensors
    return evaluate_classifier(model, x, y)


@torch.no_grad()
def evaluate_averaged(
    model: nn.Module, data: Any, hyperparameters: dict[str, float], samples: int
) -> tuple[float | None, float | None]:
    """(accuracy, mean log-likelihood) on the test split of ``model``'s prediction averaged over ``samples``
    fixed transforms of the ranges ``hyperparameters`` (``partition-fx train``'s averaged_test_accuracy), with
    the BatchNorm statistics :func:`evaluate` left; (None, None) for ``samples`` 0. With every range 0 (plain
    training) the transforms are all the identity, so the average is the model's own prediction.

    >>> from types import SimpleNamespace
    >>> x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 0, 1])
    >>> model = nn.Sequential(nn.Flatten(), nn.Linear(64, 2)).eval()
    >>> data = SimpleNamespace(test=torch.utils.data.TensorDataset(x, y))
    >>> (accuracy, loglik), own = evaluate_averaged(model, data, {}, 8), evaluate_classifier(model, x, y)
    >>> accuracy == own[0], math.isclose(loglik, own[1], rel_tol=1e-5)
    (True, True)
    """
    x, y = data.test.tensors
    return evaluate_classifier_averaged(model, AffineAugmentation.fixed(hyperparameters), samples, x, y)


def _model(task: Task, model_name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    shape = task.data.input_shape
    return build_model(model_name, task.data.num_classes, None, shape[0], shape[-1])


def validation_split(num_examples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) indices: validation is the LAST chunk of the partitioned run with this seed."""
    chunks = split_into_chunks(num_examples, PROPORTIONS, seed)
    return chunks.prefix(len(PROPORTIONS) - 1), chunks.chunk(len(PROPORTIONS))


def augerino_loss(
    outputs: torch.Tensor,
    targets: torch.Tensor,
    samples: int,
    aug: AffineAugmentation,
    safe: bool,
    strength: float = AUGERINO_STRENGTH,
) -> torch.Tensor:
    """Augerino's objective (Benton et al. 2020, eq. 5): the expected cross-entropy over augmentation samples
    minus ``strength * ||ranges||``. ``safe`` switches the regulariser off (no gradient) while any
    range is at or beyond its bound, as in the authors' "safe" variant; unsafe, it always pulls ranges up.

    >>> aug = AffineAugmentation(num_samples=1, init={"rotation": math.pi})
    >>> loss = augerino_loss(torch.zeros(2, 3), torch.tensor([0, 1]), 1, aug, safe=True)
    >>> loss.requires_grad, round(float(loss), 4)  # the rotation is at its bound: no regulariser
    (False, 1.0986)
    """
    nll = F.cross_entropy(outputs, targets.repeat(samples))
    width = aug.ranges.abs().norm()
    if safe and bool((aug.ranges.detach().abs() >= aug.max_ranges * (1 - 1e-6)).any()):
        return nll
    return nll - strength * width


def lila_evidence(
    model: nn.Module, aug: AffineAugmentation, x: torch.Tensor, y: torch.Tensor, num_examples: int
) -> torch.Tensor:
    """LILA's objective per example, differentiable in ``aug``'s ranges at ``model``'s weights: the Laplace evidence
    of the invariant model (its logits the mean over :data:`LILA_SAMPLES` views) on ``num_examples`` examples,
    estimated on the subset ``x, y``, over ``num_examples``: the subset's mean log-likelihood plus the whole network's
    Kronecker-factored Occam term (``training.objective.occam``, each layer's prior precision fitted) over
    ``num_examples``. BatchNorm normalises the views by their own statistics; its running statistics move, and the
    caller puts them back once the backward is done (``buffers_restored``: not before, the backward reads them)."""
    loglik, factors = kronecker_factors(model, x, y, hyper=aug, samples=LILA_SAMPLES)
    occam = laplace_occam(factors, scale=num_examples / len(x))
    return loglik / len(x) + occam / num_examples


def train_plain(
    task: Task,
    model_name: str,
    seed: int,
    budget: Budget,
    augmentation: dict[str, float] | None = None,
    learn: str | None = None,
    train_indices: torch.Tensor | None = None,
    augerino_strength: float = AUGERINO_STRENGTH,
    finetune_steps: int = 0,
    trajectory_every: int | None = None,
) -> dict[str, Any]:
    """Plain training with a fixed augmentation (``learn=None``) or a baseline that learns it.

    ``learn``: ``"augerino"`` (safe), ``"augerino_unsafe"`` (unbounded ranges, regulariser always on; stops
    when it diverges), ``"validation"`` (a hyperparameter step per iteration on a batch of the held-out
    last chunk; the network trains on the rest) or ``"lila"`` (a step up :func:`lila_evidence` every
    :data:`LILA_EVERY` iterations after the first :data:`LILA_BURN_IN` of them, on :data:`LILA_EXAMPLES` examples of
    all the data); ``augerino_strength``: Augerino's regulariser weight.
    ``finetune_steps`` (``validation`` only): the last iterations train on ALL the training data (the
    held-out chunk too) with the ranges frozen, the LR schedule running on: the paper's fine-tuning of
    its validation-set baseline (Table 2). ``trajectory_every``: record the learned ranges this often.
    ``train_indices`` restricts the training examples (Optuna's trials). Returns the model, the ranges, the
    pass counts, seconds and (unsafe Augerino) ``diverged_at``.
    """
    if learn not in (None, "augerino", "augerino_unsafe", "validation", "lila"):
        raise ValueError(f"unknown baseline {learn!r}")
    if finetune_steps and learn != "validation":
        raise ValueError("finetune_steps applies to the validation baseline only")
    model = _model(task, model_name, seed)
    x_all, y_all = task.data.train.tensors
    indices = torch.arange(len(x_all)) if train_indices is None else train_indices
    validation = None
    if learn == "validation":
        indices, validation = validation_split(len(x_all), seed)
    aug = None
    if augmentation is not None or learn is not None:
        if learn is None:
            aug = AffineAugmentation.fixed(augmentation, num_samples=budget.samples)
        else:  # the baselines start where partitioned training starts
            unbounded = {name: 1e6 for name in GENERATORS} if learn == "augerino_unsafe" else None
            aug = AffineAugmentation(num_samples=budget.samples, max_range=unbounded, init=budget.init)
    model_optimizer, hyper_factory, schedule = configured_factories(budget.recipe())  # as fit builds them
    optimizer = model_optimizer(model.parameters())
    scheduler = schedule(optimizer)
    hyper_optimizer = hyper_factory([aug.ranges]) if learn is not None else None
    likelihood = Categorical()
    generator = torch.Generator().manual_seed(seed)
    counter = PassCounter(model)
    diverged_at = None
    started = time.perf_counter()
    augerino = learn is not None and learn.startswith("augerino")
    model.train()
    trajectory = []
    everything = torch.arange(len(x_all))
    for step in range(budget.steps):
        finetuning = step >= budget.steps - finetune_steps if finetune_steps else False
        pool = everything if finetuning else indices
        batch = pool[torch.randint(len(pool), (budget.batch_size,), generator=generator)]
        x, y = x_all[batch], y_all[batch]
        xs, samples = apply_transform(aug, x, grad=augerino)
        outputs = model(xs)
        if augerino:
            loss = augerino_loss(outputs, y, samples, aug, learn == "augerino", augerino_strength)
        else:
            loss = -likelihood(outputs, y, samples).mean()
        optimizer.zero_grad(set_to_none=True)
        if hyper_optimizer is not None:
            hyper_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if augerino:
            hyper_optimizer.step()
            aug.constrain_()
            if learn == "augerino_unsafe" and _diverged(loss, aug):
                diverged_at = step + 1
                break
        if learn == "lila" and step >= LILA_BURN_IN * budget.steps and (step + 1) % LILA_EVERY == 0:
            batch = everything[torch.randperm(len(everything), generator=generator)[:LILA_EXAMPLES]]
            hyper_optimizer.zero_grad(set_to_none=True)
            with buffers_restored(model):
                evidence = lila_evidence(model, aug, x_all[batch], y_all[batch], len(everything))
                (-evidence).backward(inputs=[aug.ranges])
            hyper_optimizer.step()
            aug.constrain_()
        if learn == "validation" and not finetuning:
            batch = validation[torch.randint(len(validation), (budget.batch_size,), generator=generator)]
            xs, samples = apply_transform(aug, x_all[batch])
            hyper_loss = -likelihood(model(xs), y_all[batch], samples).mean()
            hyper_optimizer.zero_grad(set_to_none=True)
            hyper_loss.backward()
            hyper_optimizer.step()
            aug.constrain_()
        if trajectory_every and aug is not None and (step + 1) % trajectory_every == 0:
            trajectory.append({"step": step + 1, **aug.hyperparameters()})
    seconds = time.perf_counter() - started
    return {
        "trajectory": trajectory,
        "model": model.eval(),
        "hyperparameters": aug.hyperparameters() if aug is not None else {},
        "passes": counter.as_dict(),
        "seconds": seconds,
        "diverged_at": diverged_at,
        "steps": budget.steps if diverged_at is None else diverged_at,
    }


def _diverged(loss: torch.Tensor, aug: AffineAugmentation) -> bool:
    bounds = torch.tensor([DEFAULT_MAX_RANGE[name] for name in aug.generators])
    return not math.isfinite(float(loss.detach())) or bool((aug.ranges.detach().abs() > DIVERGED_FACTOR * bounds).any())


def train_partitioned(
    task: Task,
    model_name: str,
    seed: int,
    budget: Budget,
    fused: bool = False,
    eval_every: int | None = None,
    on_evaluation: Callable[[nn.Module, dict[str, Any]], None] | None = None,
    finetune_steps: int = 0,
    occam: bool = False,
) -> dict[str, Any]:
    """This project: a C=3 (0.8/0.1/0.1) partitioned model learning the affine ranges by the LML, with
    `partition-fx train`'s hyper-step estimator; the last ``finetune_steps`` fine-tune the final model;
    ``occam``: the hyperparameter step adds the whole network's Occam term (``occam_term="whole"``).

    ``fused``: fused steps with every partition trained every iteration; else the paper's scheme.
    ``on_evaluation(final_model_copy, record)`` runs at each LML evaluation (not timed, not counted).
    """
    model = _model(task, model_name, seed)
    pmodel = partitionify(model, len(PROPORTIONS), PROPORTIONS, seed=seed)
    aug = AffineAugmentation(num_samples=budget.samples, init=budget.init)
    counter = PassCounter(pmodel)
    outside = [0.0]

    def callback(trainer: Any, record: dict[str, Any]) -> None:
        if on_evaluation is not None:
            start = time.perf_counter()
            on_evaluation(export_subnetwork(trainer.pmodel), record)
            outside[0] += time.perf_counter() - start

    started = time.perf_counter()
    result = fit(
        pmodel,
        task.data.train,
        budget.recipe(finetune_steps, occam_term="whole" if occam else "none"),
        hyper=aug,
        seed=seed,
        eval_every=eval_every,
        eval_examples_per_chunk=64,
        callbacks=[callback],
        progress=False,
        fused=fused,
        every_partition=fused,
    )
    seconds = time.perf_counter() - started - outside[0]
    passes = counter.as_dict()
    return {
        "model": export_subnetwork(pmodel).eval(),
        "hyperparameters": result.hyperparameters,
        "passes": passes,
        "seconds": seconds,
        "lml": result.lml,
        "steps": result.steps,
        "history": [
            {"step": r["step"], "lml": r["lml"], "hyperparameters": r["hyperparameters"]} for r in result.history
        ],
        "trajectory": [{"step": r["step"], **r["hyperparameters"]} for r in result.history],
    }
