"""What BatchNorm normalises a hyperparameter step's batches with (``hyper_norm``, ``lml.hyper_step_norms``),
checked against definitions: ``detached`` is the step with ``F.batch_norm``'s batch statistics held constant in
the backward pass, ``running`` the step with the BatchNorm layers in eval mode, ``batch`` the plain step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.training import Categorical, PartitionedTrainer
from partition_fx.training.objective.lml import forward_log_likelihood, hyper_step_norms
from partition_fx.transforms import AffineAugmentation


def _pmodel():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3)
    )  # fmt: skip
    return partitionify(model, 3)


def _data(n: int = 48):
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _psi_gradient(pmodel, statistics: str) -> torch.Tensor:
    """The gradient of chunk 2's negative log-likelihood through subnetwork 1 with respect to the ranges."""
    hyper = AffineAugmentation(num_samples=4, init=0.3)
    x, y = _data(16)
    torch.manual_seed(1)  # the same augmentation draws for every treatment
    with hyper_step_norms(pmodel, statistics):
        loss = -forward_log_likelihood(pmodel, Categorical(), x, y, 1, hyper).mean()
    loss.backward()
    return hyper.ranges.grad


def _detached_batch_norm(original):
    def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        out = original(x, running_mean, running_var, weight, bias, training, momentum, eps)  # updates running stats
        if not training:
            return out
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        mean, var = x.mean(dims).detach().view(shape), x.var(dims, unbiased=False).detach().view(shape)
        return (x - mean) / torch.sqrt(var + eps) * weight.view(shape) + bias.view(shape)

    return batch_norm


def test_detached_is_the_hyper_gradient_with_the_batch_statistics_held_constant(monkeypatch) -> None:
    detached = _psi_gradient(_pmodel(), "detached")
    attached = _psi_gradient(_pmodel(), "batch")
    monkeypatch.setattr(nn.functional, "batch_norm", _detached_batch_norm(nn.functional.batch_norm))
    definition = _psi_gradient(_pmodel(), "batch")
    torch.testing.assert_close(detached, definition, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(detached, attached)  # the statistics do carry part of the plain step's gradient


def test_running_is_the_hyper_gradient_with_the_norms_in_eval_mode_and_leaves_their_statistics() -> None:
    pmodel = _pmodel()
    pmodel(torch.rand(32, 1, 8, 8), subnetwork=1)  # running statistics that are not the initial ones
    definition_model = _pmodel()
    definition_model.load_state_dict(pmodel.state_dict())
    before = {k: v.clone() for k, v in pmodel.state_dict().items() if "running" in k}
    running = _psi_gradient(pmodel, "running")
    assert all(torch.equal(pmodel.state_dict()[k], v) for k, v in before.items())  # the step changed none
    assert pmodel.training and all(m.training for m in pmodel.modules())  # the modes are restored
    for m in definition_model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    torch.testing.assert_close(running, _psi_gradient(definition_model, "batch"), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("statistics", ["batch", "detached", "running"])
def test_the_trainer_s_hyperparameter_step_normalises_as_hyper_norm_says(statistics) -> None:
    """A trainer's hyperparameter step with SGD at learning rate 1 moves psi by minus the gradient of the step's
    definition (chunk k's loss through subnetwork k-1, normalised as ``hyper_norm`` says)."""
    pmodel, hyper = _pmodel(), AffineAugmentation(num_samples=4, init=0.3)
    trainer = PartitionedTrainer(
        pmodel, _data(), hyper=hyper, hyper_norm=statistics, batch_size=8, hyper_batch_size=8, hyper_samples=None,
        hyper_optimizer=lambda params: torch.optim.SGD(params, lr=1.0),
    )  # fmt: skip
    indices = trainer.chunks.chunk(2)[:8]
    x, y = trainer.examples.batch(indices)
    copy = AffineAugmentation(num_samples=4, init=0.3)
    state = torch.get_rng_state()
    with hyper_step_norms(pmodel, statistics):
        (-forward_log_likelihood(pmodel, Categorical(), x, y, 1, copy).mean()).backward()
    torch.set_rng_state(state)
    before_stats = [b.clone() for name, b in pmodel.named_buffers() if "running_mean" in name]
    trainer.hyper_step(2, indices)
    torch.testing.assert_close(hyper.ranges.detach(), copy.ranges.detach() - copy.ranges.grad, rtol=1e-5, atol=1e-6)
    after_stats = [b for name, b in pmodel.named_buffers() if "running_mean" in name]
    assert all(torch.equal(a, b) for a, b in zip(before_stats, after_stats)) == (statistics == "running")


def test_hyper_norm_other_than_batch_is_refused_with_fused_steps() -> None:
    with pytest.raises(PartitionArgumentError, match="hyper_norm must be 'batch' with fused=True"):
        PartitionedTrainer(_pmodel(), _data(), hyper=AffineAugmentation(), hyper_norm="running", fused=True)
