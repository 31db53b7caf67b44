"""The standard datasets read by torchvision's own classes from generated files in their real on-disk formats
(CIFAR's pickled batches, MNIST's idx files, SVHN's .mat), their rotated variants, the clear refusals of a
missing or malformed copy, and every paper recipe run for a few steps on such files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from disk_formats import TRAIN_SIZES, WRITERS, skip_checksums, write_cifar10

from partition_fx.cli import main
from partition_fx.cli.parser import parse_train
from partition_fx.cli.recipes import RECIPES
from partition_fx.datasets import STANDARD_DATASETS, load_dataset, named_dataset
from partition_fx.datasets.images import DecodedImages, rotate_images
from partition_fx.errors import PartitionArgumentError, PartitionError


@pytest.fixture
def copies(tmp_path, monkeypatch):
    skip_checksums(monkeypatch)  # generated files cannot match the published MD5s; the package never skips it
    for name, write in WRITERS.items():
        write(tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", list(STANDARD_DATASETS))
def test_each_standard_dataset_is_read_from_its_on_disk_format_by_torchvision(copies, name) -> None:
    spec = STANDARD_DATASETS[name]
    streamed = load_dataset(f"{name}:{copies / name}", in_memory=False)
    decoded = load_dataset(name, root=str(copies / name))  # small: decoded whole into memory
    assert isinstance(streamed.train, DecodedImages) and not decoded.info["streamed"]
    assert len(streamed.train) == TRAIN_SIZES[name] and len(streamed.test) == 8
    assert streamed.input_shape == (spec.channels, spec.size, spec.size) and streamed.num_classes == spec.classes
    assert named_dataset(name).images is not None and named_dataset(name).on_disk
    x, y = streamed.train[3]
    assert torch.equal(x, decoded.train.tensors[0][3]) and y == int(decoded.train.tensors[1][3])
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    raw = streamed.train.read.dataset  # torchvision's dataset: the pixels are its own
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(np.array(raw[3][0])).reshape(
        spec.size, spec.size, -1).permute(2, 0, 1))  # fmt: skip
    small = load_dataset(f"{name}:{copies / name}", size=16, channels=1, split="test")
    assert small.input_shape == (1, 16, 16) and len(small.train) == 0 and len(small.test) == 8
    assert small.test.partition_fx_source == {"data": f"{name}:{copies / name}", "image_size": 16, "channels": 1}


def test_the_rotated_variants_turn_each_image_by_its_own_fixed_angle(copies) -> None:
    plain = load_dataset(f"cifar10:{copies / 'cifar10'}")
    rotated = load_dataset(f"rotcifar10:{copies / 'cifar10'}")
    again = load_dataset(f"rotcifar10:{copies / 'cifar10'}", in_memory=False)
    assert rotated.name == "rotcifar10" and "rotated" in rotated.description
    x, xr = plain.train.tensors[0], rotated.train.tensors[0]
    assert torch.equal(xr[5], again.train[5][0])  # the same angle whether decoded whole or one at a time
    angles = again.train.angles
    assert torch.allclose(rotate_images(x, angles), xr) and float(angles.abs().max()) <= torch.pi
    assert not torch.equal(again.train.angles[:8], again.test if isinstance(again.test, torch.Tensor) else angles[8:16])
    with pytest.raises(PartitionArgumentError, match="rotcifar10 fixes rotate"):
        load_dataset(f"rotcifar10:{copies / 'cifar10'}", rotate=False)


def test_a_missing_or_malformed_copy_is_refused_naming_the_layout_and_class(tmp_path, monkeypatch) -> None:
    with pytest.raises(PartitionError, match=r"cifar10: .*nowhere does not exist; pass the folder holding "):
        load_dataset(f"cifar10:{tmp_path / 'nowhere'}")
    with pytest.raises(PartitionError, match=r"no readable train split .*torchvision.datasets.CIFAR10 expects "
                       r"ROOT/cifar-10-batches-py.*Nothing is downloaded"):  # fmt: skip
        load_dataset("cifar10", root=str(tmp_path))  # an empty folder
    with pytest.raises(PartitionError, match=r"torchvision.datasets.MNIST expects ROOT/MNIST/raw"):
        load_dataset(f"mnist:{tmp_path}")
    write_cifar10(tmp_path / "real")  # the published checksums are checked: generated files fail them
    with pytest.raises(PartitionError, match="Dataset not found or corrupted"):
        load_dataset(f"cifar10:{tmp_path / 'real'}")
    skip_checksums(monkeypatch)
    (tmp_path / "real" / "cifar-10-batches-py" / "data_batch_2").write_bytes(b"\x80\x04truncated")
    with pytest.raises(PartitionError, match=r"no readable train split .*cifar-10-batches-py"):
        load_dataset(f"cifar10:{tmp_path / 'real'}")


def test_the_command_refuses_bad_data_before_writing_anything(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    for data in ("cifar10", f"cifar10:{tmp_path / 'nowhere'}", f"svhn:{tmp_path}", "cifar11:/x"):
        assert main(["train", "--data", data, "--steps", "2", "--out", str(out), "--device", "cpu"]) == 2
        assert not out.exists()
    err = capsys.readouterr().err
    assert "--data cifar10:DIR" in err and "nothing is downloaded" in err.lower() and "did you mean cifar10" in err


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_each_paper_recipe_runs_a_few_steps_on_files_in_the_real_format(copies, tmp_path, recipe) -> None:
    data = "rotcifar10" if "rotcifar10" in recipe else "cifar10"
    out = tmp_path / "run"
    small = ["--steps", "3", "--batch-size", "4", "--hyper-batch-size", "3", "--samples", "2", "--hyper-samples", "2",
             "--eval-every", "3", "--test-time-samples", "0", "--workers", "1"]  # fmt: skip
    if "finetune" in recipe:
        small += ["--finetune-steps", "1"]
    argv = ["train", "--recipe", recipe, "--data", f"{data}:{copies / 'cifar10'}", *small, "--quiet", "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    config, train = report["config"], report["config"]["train"]
    expected = parse_train([*argv[1:]])
    assert expected.weight_optimizer == "sgd" and expected.lr == 0.1 and expected.image_size == 32
    assert config["recipe"] == recipe and config["image_size"] == 32 and config["proportions"] == [0.8, 0.1, 0.1]
    assert train["optimization"]["optimizer"] == "sgd" and train["optimization"]["momentum"] == 0.9
    assert train["optimization"]["steps"] == 3 and train["hyper"]["chunks"] == "one"
    assert config["init"] == "zero" and train["hyper"]["train_range_factor"] == 1.0  # the paper's, not the defaults
    assert report["steps"] == 3 and 0.0 <= report["test_accuracy"] <= 1.0
    assert (out / "model.onnx").is_file()


def test_the_data_page_lists_every_dataset_and_every_recipe_with_its_settings() -> None:
    """Each recipe file is the page's appendix I.4 options plus its model, iterations and fine-tuning: the job it
    runs is the job those options give on the command line."""
    import re
    from pathlib import Path

    from partition_fx.cli.commands.train import job_spec

    page = (Path(__file__).parents[1] / "docs" / "data.md").read_text()
    for name, spec in STANDARD_DATASETS.items():
        assert f"`{name}:DIR`, `rot{name}:DIR`" in page and f"torchvision.datasets.{spec.torchvision_class}" in page
    cifar = re.search(r"As options: `([^`]*)`", page, re.S)[1].split()
    for recipe in RECIPES.values():
        assert f"| `{recipe.name}` | {recipe.description} | [`partition_fx/{recipe.file}`]" in page
        train = recipe.values["train"]
        own = ["--model", recipe.values["model"], "--data", recipe.values["data"]]
        own += ["--steps", str(train["optimization"]["steps"])]
        own += ["--finetune-steps", str(train["finetuning"]["steps"])]
        own += ["--finetune-schedule", train["finetuning"]["schedule"]] if "schedule" in train["finetuning"] else []
        from_flags = job_spec(parse_train([*cifar, *own])).to_dict()
        assert job_spec(parse_train(["--recipe", recipe.name])).to_dict() == {**from_flags, "recipe": recipe.name}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_recipe_alone_names_the_data_it_was_written_for(recipe, tmp_path, capsys) -> None:
    data = RECIPES[recipe].values["data"]
    assert data in ("cifar10", "rotcifar10") and data in RECIPES[recipe].description
    assert main(["train", "--recipe", recipe, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"partition-fx: error: --recipe {recipe} was written for --data {data}, which reads your copy of the "
        f"dataset: pass its folder as --data {data}:DIR (nothing is downloaded)"
    )
    assert not (tmp_path / "run").exists()
