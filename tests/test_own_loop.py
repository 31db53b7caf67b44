"""Partitioned training in your own loop (``docs/loops.md``): a ``DataLoader`` on a ``PartitionedBatchSampler`` and
``TrainingSteps.take`` train exactly what ``fit`` trains with the same configuration, bit for bit, whichever
scheme, fine-tuning phase and number of loader workers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.training import (
    Examples,
    PartitionedBatchSampler,
    TrainConfig,
    TrainingSteps,
    estimate_lml,
    fit,
    recalibrate_norm_statistics,
    split_into_chunks,
)
from partition_fx.transforms import AffineAugmentation


def _images(n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _pmodel():
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)]
    return partitionify(nn.Sequential(*layers), 3, (0.5, 0.3, 0.2), seed=0)


class _Pairs(Dataset):
    """A map-style dataset, as a user's own is (read item by item, collated by the loader)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _config(**changes) -> TrainConfig:
    base = dict(steps=10, batch_size=8, hyper_batch_size=4, hyper_samples=2, finetune_steps=4, seed=3)
    # fit's end-of-run choices, which a loop of your own makes itself: the last state, not the best one
    return TrainConfig.recommended(**{**base, "restore_best": False, **changes})


def _states(*modules: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for m in modules for t in m.state_dict().values()]


@pytest.mark.parametrize(
    "changes, workers",
    [
        ({}, 0),
        ({"hyper_chunks": "one", "finetune_schedule": "continue", "lr_schedule": "constant"}, 0),
        ({"fused": True, "every_partition": True}, 0),
        ({"every_partition": True, "weight_decay": 1e-2}, 2),
        ({"hyper_gradient": "implicit", "implicit_terms": 2, "hyper_every": 1}, 0),
        ({"occam_term": "whole", "occam_every": 2, "occam_examples": 6, "hyper_every": 1}, 0),
        ({"occam_term": "conditional", "occam_every": 2, "occam_examples": 6, "fused": True}, 0),
    ],
    ids=["default", "paper-estimator", "fused-every-partition", "workers", "through-training", "occam", "fused-occam"],
)
def test_your_own_loop_trains_what_fit_trains(changes, workers):
    x, y = _images()
    config = _config(**changes)

    fitted, fitted_aug = _pmodel(), AffineAugmentation(num_samples=2)
    fit(fitted, (x, y), config, hyper=fitted_aug, progress=False, record_run=False)

    pmodel, augment = _pmodel(), AffineAugmentation(num_samples=2)
    torch.manual_seed(config.runtime.seed)  # as fit seeds torch's generator: the augmentation's draws
    dataset = _Pairs(x, y)
    chunks = split_into_chunks(len(dataset), pmodel.proportions, seed=config.runtime.seed)
    batches = PartitionedBatchSampler(chunks, config)
    # the loader's own generator for its workers' seed, so that torch's draws the augmentation alone, as in fit
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=workers, generator=torch.Generator())
    steps = TrainingSteps.create(pmodel, chunks, hyper=augment, config=config)
    for draw, (inputs, targets) in zip(batches.draws(), loader, strict=True):
        steps.take(draw, inputs, targets)
    recalibrate_norm_statistics(pmodel, Examples(dataset))

    assert steps.step == config.optimization.steps and steps.finetuning
    for a, b in zip(_states(fitted, fitted_aug), _states(pmodel, augment), strict=True):
        assert torch.equal(a, b)


def test_the_loop_resumes_from_start_and_estimates_the_lml_as_fit_does():
    x, y = _images()
    config = _config(finetune_steps=0)
    dataset = TensorDataset(x, y)
    chunks = split_into_chunks(len(dataset), (0.5, 0.3, 0.2), seed=3)

    def train(pmodel, augment, start, stop):
        batches = PartitionedBatchSampler(chunks, config, start=start)
        steps = TrainingSteps.create(pmodel, chunks, hyper=augment, config=config)
        steps.step = start
        for draw, (inputs, targets) in zip(
            batches.draws(), DataLoader(dataset, batch_sampler=batches, generator=torch.Generator())
        ):
            if steps.step == stop:
                break
            steps.take(draw, inputs, targets)
        return steps

    whole, whole_aug = _pmodel(), AffineAugmentation(num_samples=2)
    torch.manual_seed(1)
    train(whole, whole_aug, 0, 10)
    parts, parts_aug = _pmodel(), AffineAugmentation(num_samples=2)
    torch.manual_seed(1)
    first = train(parts, parts_aug, 0, 6)
    # a resumed loop restores its optimisers' states as a checkpoint of its own would hold them
    optimizers = (first.stepper.optimizer.state_dict(), first.stepper.hyper_optimizer.state_dict())
    scheduler = first.stepper.scheduler.state_dict()
    second_batches = PartitionedBatchSampler(chunks, config, start=6)
    second = TrainingSteps.create(parts, chunks, hyper=parts_aug, config=config)
    second.stepper.optimizer.load_state_dict(optimizers[0])
    second.stepper.hyper_optimizer.load_state_dict(optimizers[1])
    second.stepper.scheduler.load_state_dict(scheduler)
    second.step = 6
    for draw, (inputs, targets) in zip(
        second_batches.draws(), DataLoader(dataset, batch_sampler=second_batches, generator=torch.Generator())
    ):
        second.take(draw, inputs, targets)
    for a, b in zip(_states(whole, whole_aug), _states(parts, parts_aug), strict=True):
        assert torch.equal(a, b)
    estimate = estimate_lml(parts, Examples(dataset), chunks, second.likelihood, parts_aug)
    assert len(estimate.per_chunk) == 3 and estimate.total == sum(estimate.per_chunk)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(8, 60),
    proportions=st.lists(st.floats(0.1, 1.0), min_size=2, max_size=4),
    batch_size=st.integers(1, 9),
    hyper_batch_size=st.integers(1, 5),
    steps=st.integers(2, 12),
    finetune=st.integers(0, 11),
    every=st.integers(1, 3),
    chunks_mode=st.sampled_from(["one", "all"]),
)
def test_each_batch_is_its_draws_reads_from_the_right_chunks(
    n, proportions, batch_size, hyper_batch_size, steps, finetune, every, chunks_mode
):
    total = sum(proportions)
    proportions = [p / total for p in proportions]
    assume(min(proportions) * n >= 1)  # every chunk gets an example (an empty one is refused: tests/test_data.py)
    chunks = split_into_chunks(n, proportions, seed=0)
    finetune = min(finetune, steps - 1)
    config = TrainConfig.recommended(
        steps=steps,
        batch_size=batch_size,
        hyper_batch_size=hyper_batch_size,
        hyper_every=every,
        hyper_chunks=chunks_mode,
        finetune_steps=finetune,
    )
    sampler = PartitionedBatchSampler(chunks, config)
    batches, draws = list(sampler), list(sampler.draws())
    assert len(batches) == len(draws) == len(sampler) == steps
    assert batches == list(sampler)  # every pass draws the same run
    for step, (batch, draw) in enumerate(zip(batches, draws), start=1):
        assert batch == torch.cat(draw.reads()).tolist()
        if step > steps - finetune:
            assert draw.partitions is None and not draw.hyper and len(batch) == batch_size
            continue
        k = draw.partitions
        assert set(draw.indices.tolist()) <= set(chunks.prefix(k).tolist())
        assert bool(draw.hyper) == (step % every == 0)
        for _, j, indices in draw.hyper:
            assert 2 <= j <= chunks.num_chunks and set(indices.tolist()) <= set(chunks.chunk(j).tolist())
        assert len(batch) == batch_size + hyper_batch_size * len(draw.hyper)


def test_a_batch_that_does_not_match_its_draw_is_refused_naming_the_fix():
    x, y = _images()
    pmodel = _pmodel()
    chunks = split_into_chunks(len(y), pmodel.proportions)
    config = _config()
    steps = TrainingSteps.create(pmodel, chunks, config=config)
    draw = next(PartitionedBatchSampler(chunks, config, hyperparameters=False).draws())
    with pytest.raises(PartitionArgumentError, match=r"batch_sampler=PartitionedBatchSampler"):
        steps.take(draw, x[:3], y[:3])
    with pytest.raises(PartitionArgumentError, match=r"split_into_chunks\(len\(dataset\), pmodel.proportions\)"):
        TrainingSteps.create(pmodel, split_into_chunks(len(y), (0.5, 0.5)))
    with pytest.raises(PartitionArgumentError, match=r"start must be the iterations done"):
        PartitionedBatchSampler(chunks, config, start=11)


def test_a_hyperparameter_step_without_hyperparameters_to_learn_is_refused_naming_the_fix():
    x, y = _images()
    pmodel = _pmodel()
    chunks = split_into_chunks(len(y), pmodel.proportions)
    config = _config()
    fixed = AffineAugmentation.fixed({"rotation": 0.5}, num_samples=2)
    steps = TrainingSteps.create(pmodel, chunks, hyper=fixed, config=config)
    draw = next(d for d in PartitionedBatchSampler(chunks, config).draws() if d.hyper)
    rows = torch.cat(draw.reads())
    with pytest.raises(PartitionArgumentError, match=r"learn no hyperparameters.*hyperparameters=False"):
        steps.take(draw, x[rows], y[rows])
