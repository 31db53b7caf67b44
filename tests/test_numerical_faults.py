"""Numerical faults: exploding hyperparameters stay inside their documented bounds; a non-finite gradient
(with a finite loss) stops the run, or skips the step, naming the step and the tensors involved."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionTrainingError
from partition_fx.job.train_config import TrainConfig
from partition_fx.ranges import DEFAULT_MAX_RANGE
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.transforms import AffineAugmentation, ConcreteDropout, InputMask

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _images(n: int = 48):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _pmodel(dropout: ConcreteDropout | None = None):
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten()]
    layers += [dropout] if dropout is not None else []
    layers += [nn.Linear(256, 3)]
    return partitionify(nn.Sequential(*layers), 3, seed=0)


def test_exploding_hyperparameter_steps_stay_within_the_documented_bounds() -> None:
    """A hyperparameter learning rate of 1e3 throws every value against its bound after each step."""
    dropout = ConcreteDropout(p=0.2)
    augment = AffineAugmentation(num_samples=2)
    pmodel = _pmodel(dropout)
    seen = []

    def record(trainer, _):
        seen.append((augment.ranges.detach().clone(), float(dropout.p.detach())))

    fit(
        pmodel,
        _images(),
        PAPER,
        hyper=augment,
        steps=12,
        batch_size=8,
        eval_every=2,
        hyper_optimizer=partial(torch.optim.SGD, lr=1e3),
        callbacks=[record],
        progress=False,
    )
    limits = torch.tensor([DEFAULT_MAX_RANGE[name] for name in augment.generators])
    for ranges, p in seen:
        assert torch.isfinite(ranges).all() and (ranges.abs() <= limits.to(ranges.dtype) + 1e-6).all()
        assert dropout.p_min <= p <= dropout.p_max
    assert any((ranges.abs() >= limits - 1e-6).any() for ranges, _ in seen)  # the bounds were reached


def test_an_input_mask_under_exploding_steps_keeps_its_logits_bounded() -> None:
    torch.manual_seed(0)
    x = torch.randn(48, 6)
    y = (x[:, 0] > 0).long()
    pmodel = partitionify(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)), 2)
    mask = InputMask(6)
    fit(pmodel, (x, y), PAPER, hyper=mask, steps=10, batch_size=8, hyper_optimizer=partial(torch.optim.SGD, lr=1e4))
    assert torch.isfinite(mask.logits).all() and float(mask.logits.detach().abs().max()) <= mask.max_logit


class _SqrtAtZero(nn.Module):
    """sqrt(|x|) is finite at 0, its gradient there is inf * 0 = nan: a finite loss, a non-finite gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x.abs())


def test_a_nonfinite_gradient_with_a_finite_loss_stops_naming_the_step_partition_and_tensor(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), _SqrtAtZero(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].weight.zero_()  # every pre-activation is the bias; zero it too: sqrt'(0) = inf
        model[0].bias.zero_()
    pmodel = partitionify(model, 3)
    x, y = torch.randn(48, 6), torch.randint(0, 3, (48,))
    trainer = PartitionedTrainer(pmodel, (x, y), PAPER, batch_size=8)
    with pytest.raises(PartitionTrainingError) as info:
        trainer.parameter_step(2)
    message = str(info.value)
    assert "step 0" in message and "partition 2" in message and "gradient" in message
    assert "0.weight partition" in message  # the tensor whose gradient is not finite

    skipping = PartitionedTrainer(partitionify(model, 3), (x, y), PAPER, batch_size=8, on_nonfinite="skip")
    before = [p.detach().clone() for p in skipping.pmodel.parameters()]
    skipping.parameter_step(2)
    assert skipping.steps.stepper.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, skipping.pmodel.parameters()))
    assert all(p.grad is None for p in skipping.pmodel.parameters())
    # Subnetwork 1 meets sqrt'(0) too: the second step is skipped as well, and nothing moves. (This was
    # ``isfinite(loss) or skipped_steps == 2``: the loss is computed before the step and always finite here, so
    # it held even with the non-finite gradients applied: a trainer that skipped only the first such step passed.)
    _, loss = skipping.parameter_step(1)
    assert math.isfinite(loss) and skipping.steps.stepper.skipped_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, skipping.pmodel.parameters()))
    assert all(p.grad is None for p in skipping.pmodel.parameters())


def test_a_nonfinite_hyperparameter_gradient_names_the_hyperparameter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), _SqrtAtZero(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].bias.zero_()
        model[0].weight.zero_()
    x, y = torch.randn(48, 6), torch.randint(0, 3, (48,))
    trainer = PartitionedTrainer(partitionify(model, 3), (x, y), PAPER, hyper=InputMask(6), batch_size=8)
    with pytest.raises(
        PartitionTrainingError,
        match=r"step 0: non-finite gradient norm nan \(in hyper.logits\) in the "
        r"hyperparameter step \(chunk D_2 through subnetwork 1\)",
    ):
        trainer.hyper_step(2)


def test_a_gradient_norm_that_overflows_names_the_largest_gradient() -> None:
    """Every gradient finite, their norm not (a bf16 explosion): the message names the tensor with the largest
    entry instead of an empty list, and the fix is said for Python and the command line."""
    from partition_fx.training.step.stepping import nonfinite_problem

    big, small = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    big.grad, small.grad = torch.full((2,), 3e19), torch.ones(2)
    problem = nonfinite_problem(0.5, [small, big], lambda: {id(big): "layer4.weight", id(small): "fc.bias"})
    assert problem == "gradient norm inf (every gradient finite, the largest 3e+19 in layer4.weight)"
