"""The baselines of ``benchmarks/hyperparameter_methods.py`` (``benchmarks/methods.py``) against their definitions."""

from __future__ import annotations

import math

import pytest
import torch
from models_for_tests import small_images, small_partitioned_cnn

from benchmarks import methods
from benchmarks.arms import training_images
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import fit
from partition_fx.training.sampling.chunks import split_into_chunks
from partition_fx.transforms import AffineAugmentation


def test_pass_counter_counts_forwards_backwards_and_images():
    model = torch.nn.Linear(3, 2)
    counter = methods.PassCounter(model)
    model(torch.randn(5, 3)).sum().backward()
    with torch.no_grad():
        model(torch.randn(7, 3))
    assert counter.as_dict() == {"forward": 2, "backward": 1, "forward_images": 12, "backward_images": 5}
    model(torch.randn(1, 3))  # as_dict detached the hook
    assert counter.forward == 2


@pytest.mark.parametrize("n, seed", [(100, 0), (1437, 3), (31, 1)])
def test_validation_split_is_the_last_chunk(n, seed):
    train, validation = methods.validation_split(n, seed)
    chunks = split_into_chunks(n, methods.PROPORTIONS, seed)
    assert torch.equal(validation, chunks.chunk(3))
    assert sorted(torch.cat([train, validation]).tolist()) == list(range(n))


def test_augerino_loss_matches_its_definition():
    aug = AffineAugmentation(num_samples=2, init={"rotation": 0.3, "translation_x": 0.4})
    outputs, targets = torch.randn(6, 4), torch.tensor([0, 3, 1])
    for safe in (True, False):
        loss = methods.augerino_loss(outputs, targets, 2, aug, safe=safe, strength=0.5)
        nll = torch.nn.functional.cross_entropy(outputs, targets.repeat(2))
        assert float(loss.detach()) == pytest.approx(float(nll) - 0.5 * 0.5)  # ||(0.3, 0.4)|| = 0.5
        (grad,) = torch.autograd.grad(loss, aug.ranges)
        expected = torch.zeros(6)
        expected[aug.generators.index("rotation")], expected[aug.generators.index("translation_x")] = -0.3, -0.4
        torch.testing.assert_close(grad, expected)  # -strength * r / ||r||
    at_bound = AffineAugmentation(num_samples=2, init={"rotation": math.pi, "translation_x": 0.4})
    safe = methods.augerino_loss(outputs, targets, 2, at_bound, safe=True)
    unsafe = methods.augerino_loss(outputs, targets, 2, at_bound, safe=False)
    assert not safe.requires_grad and float(unsafe.detach()) < float(safe)


def test_unsafe_augerino_divergence_is_detected():
    aug = AffineAugmentation(num_samples=1, init=0.0, max_range={"rotation": 1e6})  # Augerino starts at 0
    assert not methods._diverged(torch.tensor(1.0), aug)
    with torch.no_grad():
        aug.ranges[aug.generators.index("rotation")] = 11 * math.pi
    assert methods._diverged(torch.tensor(1.0), aug)
    assert methods._diverged(torch.tensor(float("nan")), AffineAugmentation(num_samples=1))


def test_validation_baseline_steps_ranges_and_fixed_augmentation_stays():
    from partition_fx.datasets import rotdigits

    task = methods.Task("rotdigits", rotdigits(size=8), {"rotation": math.pi}, {})
    budget = methods.Budget(steps=3, batch_size=4, samples=2)
    learned = methods.train_plain(task, "test_resnet", 0, budget, learn="validation")
    assert any(v > 0 for v in learned["hyperparameters"].values())
    assert learned["passes"]["backward"] == 6  # a parameter and a hyperparameter backward per iteration
    fixed = methods.train_plain(task, "test_resnet", 0, budget, augmentation={"rotation": 1.0})
    assert fixed["hyperparameters"]["rotation"] == pytest.approx(1.0) and fixed["passes"]["backward"] == 3


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"hyper_chunks": "one", "hyper_samples": None, "hyper_batch_size": None, "hyper_every": 1},
        {"warmup_steps": 3, "hyper_every": 2, "finetune_steps": 0},
    ],
)
def test_training_images_counts_the_images_a_run_passes_backward(options):
    pmodel = small_partitioned_cnn()
    counter = methods.PassCounter(pmodel)
    config = {"steps": 9, "batch_size": 6, "hyper_samples": 3, "hyper_batch_size": 4, "eval_every": 3, **options}
    result = fit(pmodel, small_images(60), hyper=AffineAugmentation(num_samples=2), progress=False, **config)
    counted = counter.as_dict()
    train = TrainConfig.recommended(**config).to_dict()
    assert training_images(train, pmodel.num_partitions, 2, result.finetune_start) == counted["backward_images"]
    assert counted["forward_images"] > counted["backward_images"]  # evaluations pass images forward only


def test_lila_steps_the_ranges_on_the_laplace_evidence_after_its_burn_in_only(monkeypatch):
    from partition_fx.datasets import rotdigits

    monkeypatch.setattr(methods, "LILA_EXAMPLES", 16)  # the schedule is under test, not the subset's size

    task = methods.Task("rotdigits", rotdigits(size=8), {"rotation": math.pi}, {})
    steps = 2 * methods.LILA_EVERY
    budget = methods.Budget(steps=steps, batch_size=4, samples=2, init="zero")
    learned = methods.train_plain(task, "test_resnet", 0, budget, learn="lila", trajectory_every=1)
    moved = [any(v != 0 for k, v in point.items() if k != "step") for point in learned["trajectory"]]
    first = moved.index(True)
    assert first + 1 == methods.LILA_EVERY and first >= methods.LILA_BURN_IN * steps  # the first evidence step
    evidence = [point for point in learned["trajectory"] if point["step"] % methods.LILA_EVERY == 0]
    assert evidence[0] != evidence[1]  # and the second moved them again
