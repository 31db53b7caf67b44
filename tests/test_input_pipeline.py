"""The streaming input pipeline against its definition: a run reading a folder from disk through worker
processes equals the same run reading every batch in the training process, bit for bit; a resumed streaming run
equals the uninterrupted one; a folder larger than the memory budget trains without being loaded whole."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import torch
from disk_formats import write_image_folder
from torch import nn

from partition_fx import partitionify
from partition_fx.datasets import image_folder
from partition_fx.datasets.images import DecodedImages
from partition_fx.errors import PartitionError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.training.sampling.chunks import StepInputs, planned_batches
from partition_fx.training.sampling.schedule import draw_iteration
from partition_fx.transforms import AffineAugmentation

CONFIG = TrainConfig.recommended(
    steps=8,
    batch_size=6,
    hyper_batch_size=4,
    hyper_samples=2,
    eval_every=4,
    eval_examples_per_chunk=6,
    finetune_steps=2,
    seed=5,
)  # fmt: skip  -- hyperparameter steps, evaluations and the switch to fine-tuning, in 8 iterations


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    write_image_folder(root, per_class=10, size=12)
    return root


def _pmodel():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(400, 3))
    return partitionify(model, 3, seed=0)


def _trainer(data, workers: int, **keywords) -> PartitionedTrainer:
    config = CONFIG.replace(workers=workers, **keywords)
    return PartitionedTrainer(_pmodel(), data, config, hyper=AffineAugmentation(num_samples=2))


def _same_runs(a: PartitionedTrainer, b: PartitionedTrainer) -> None:
    for (name, x), (_, y) in zip(a.pmodel.state_dict().items(), b.pmodel.state_dict().items()):
        assert torch.equal(x, y), name
    assert a.steps.objective.hyperparameter_values() == b.steps.objective.hyperparameter_values()
    drop = lambda history: [{k: v for k, v in r.items() if k != "seconds"} for r in history]  # noqa: E731
    assert drop(a.history) == drop(b.history)


def test_a_run_reading_ahead_in_workers_equals_reading_in_the_training_process(folder) -> None:
    data = image_folder(folder, in_memory=False, seed=1)
    assert isinstance(data.train, DecodedImages)
    runs = {}
    for workers in (0, 1, 2):
        trainer = _trainer(data.train, workers)
        trainer.run(progress=False)
        runs[workers] = trainer
    assert runs[0].steps.examples.read_ahead_batches == 0
    for workers in (1, 2):
        _same_runs(runs[0], runs[workers])
        # every iteration's batch (its parameter and hyperparameter rows, read together) but the first after the
        # switch to fine-tuning came read ahead
        assert runs[workers].steps.examples.read_ahead_batches >= 8 - 1
    in_memory = _trainer(image_folder(folder, in_memory=True, seed=1).train, 0)
    in_memory.run(progress=False)
    _same_runs(runs[0], in_memory)  # decoded whole or one at a time: the same examples


def _fit(data, workers: int, every_partition: bool, **kwargs):
    pmodel = _pmodel()
    config = CONFIG.replace(workers=workers, every_partition=every_partition)
    result = fit(pmodel, data, config, hyper=AffineAugmentation(num_samples=2), progress=False, **kwargs)
    return pmodel, result


@pytest.mark.parametrize("every_partition", [False, True])
def test_a_resumed_streaming_run_continues_the_same_stream(folder, tmp_path, every_partition) -> None:
    data = image_folder(folder, in_memory=False, seed=1).train
    expected, expected_result = _fit(data, 2, every_partition)
    stop_at_4 = lambda trainer, record: record["step"] == 4  # noqa: E731
    _fit(data, 2, every_partition, checkpoint_dir=tmp_path, callbacks=[stop_at_4])
    assert json.loads((tmp_path / "resume" / "state.json").read_text())["step"] == 4
    resumed, result = _fit(data, 1, every_partition, resume=tmp_path / "resume")  # another number of workers
    assert result.hyperparameters == expected_result.hyperparameters and result.steps == 8
    for (name, x), (_, y) in zip(expected.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(x, y), name


def test_the_plan_is_what_the_sampler_then_draws_and_a_batch_asked_otherwise_is_read_directly(folder) -> None:
    trainer = _trainer(image_folder(folder, in_memory=False).train, 1)
    upcoming = lambda sampler, step: draw_iteration(  # noqa: E731
        trainer.scheme, trainer.estimator, trainer.schedule, sampler, step, finetuning=False
    ).reads()
    plan = planned_batches(upcoming, trainer.sampler, trainer.step)
    _, indices = trainer.sampler.copy().parameter_batch()
    assert torch.equal(next(plan), indices)  # the sampler itself has drawn nothing
    inputs = StepInputs(trainer.examples)
    inputs.start(lambda: iter([torch.tensor([0, 1]), torch.tensor([2])]))
    assert torch.equal(inputs.batch(torch.tensor([0, 1]))[0], trainer.examples.batch(torch.tensor([0, 1]))[0])
    x, _ = inputs.batch(torch.tensor([5]))  # not the planned [2]: read now, the read-ahead dropped
    assert torch.equal(x, trainer.examples.batch(torch.tensor([5]))[0]) and inputs.read_ahead_batches == 1
    assert not inputs.pending
    inputs.close()


def _traced_peak(run) -> int:
    """The peak of Python's and numpy's traced allocations (decoded images among them) while ``run()`` runs."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_folder_larger_than_the_memory_budget_trains_without_being_loaded_whole(tmp_path) -> None:
    # 64x64 images: what the pipeline holds per file (its path, its label) is ~100x smaller than an image, and what
    # training allocates besides varies by ~0.15 MB between runs: both well under large / 8 (at 32x32 they were not)
    sizes = {"small": 40, "large": 160}  # images per class, 3 classes of 64x64 RGB
    for name, per_class in sizes.items():
        write_image_folder(tmp_path / name, per_class=per_class, size=64)
    large = 3 * sizes["large"] * 64 * 64 * 3  # 5.9 MB as uint8

    def train(name: str) -> None:
        data = image_folder(tmp_path / name, memory_budget=large // 8)  # over budget: read as training asks
        assert isinstance(data.train, DecodedImages) and data.info["streamed"]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.Flatten(), nn.Linear(1024, 3))
        fit(partitionify(model, 3), data.train, CONFIG.replace(workers=0), progress=False, recalibrate_norms=False)

    loaded = _traced_peak(lambda: image_folder(tmp_path / "large", in_memory=True))  # every image at once
    small, streamed = _traced_peak(lambda: train("small")), _traced_peak(lambda: train("large"))
    # 4x the images: decoded whole it would hold 3/4 * large more; streamed, what it holds does not grow with them
    assert loaded > large and streamed - small < large / 8, (loaded, small, streamed)


def test_an_unreadable_image_is_named_when_the_folder_is_listed_or_when_its_body_is_decoded(tmp_path) -> None:
    bad = tmp_path / "bad"
    write_image_folder(bad, per_class=4, size=8)
    (bad / "c1" / "2.png").write_bytes(b"not a png")
    with pytest.raises(PartitionError, match=r"cannot read image .*c1.2\.png"):
        image_folder(bad, in_memory=False)
    truncated = tmp_path / "truncated"
    write_image_folder(truncated, per_class=4, size=64, fmt="jpg")
    path = truncated / "c0" / "1.jpg"
    path.write_bytes(path.read_bytes()[:-1500])  # a valid header, a cut body: found when decoded
    data = image_folder(truncated, in_memory=False)
    with pytest.raises(PartitionError, match=r"cannot read image .*c0.1\.jpg"):
        for i in range(len(data.train)):
            data.train[i]
        for i in range(len(data.test)):
            data.test[i]


def test_sizes_must_match_when_a_streamed_folder_is_not_resized(tmp_path) -> None:
    write_image_folder(tmp_path, per_class=3, size=8)
    from PIL import Image

    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(tmp_path / "c2" / "9.png")
    with pytest.raises(PartitionError, match=r"images differ in size: .* is 8x8 but .*9\.png is 9x9"):
        image_folder(tmp_path, in_memory=False)
    assert image_folder(tmp_path, in_memory=False, size=8).input_shape == (3, 8, 8)
    json.dumps(image_folder(tmp_path, in_memory=False, size=8).description)
