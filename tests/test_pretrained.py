"""Pretrained checkpoints for other data (issue 25): an ImageNet checkpoint fine-tuned to 10 classes on 1
channel (the classifier re-initialised, the stem adapted as timm's ``in_chans`` does, one line saying so), a
checkpoint of another architecture refused naming its first tensor that does not fit, and torchvision's
classifiers by ``torchvision:NAME`` in every command that takes ``--model``."""

from __future__ import annotations

import json
import warnings

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file
from timm.models import adapt_input_conv
from torch import nn

from partition_fx import partitionify
from partition_fx.cli import main
from partition_fx.errors import PartitionCheckpointError, PartitionError, PartitionWarning
from partition_fx.models import build_model, load_checkpoint_into
from partition_fx.training import fit

TRAIN = ["--data", "digits", "--steps", "2", "--image-size", "16", "--batch-size", "8", "--quiet"]


def _save(model: torch.nn.Module, path) -> str:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


@pytest.fixture(scope="module")
def imagenet_resnet18(tmp_path_factory) -> str:
    """timm's resnet18 as ``timm.create_model("resnet18", pretrained=True)`` gives it (random weights here):
    1000 classes, 3 channels."""
    torch.manual_seed(1)
    return _save(timm.create_model("resnet18"), tmp_path_factory.mktemp("weights") / "resnet18.safetensors")


def _assert_fine_tuned_from(model: torch.nn.Module, fresh: torch.nn.Module, checkpoint: dict, stem: str, head: str):
    """Every tensor as in ``checkpoint`` except the stem (adapted to 1 channel as ``adapt_input_conv`` defines)
    and the classifier (``fresh``'s initialisation, 10 outputs)."""
    state = model.state_dict()
    for key, value in state.items():
        if key.startswith(f"{head}."):
            assert value.shape[0] == 10
            torch.testing.assert_close(value, fresh.state_dict()[key], rtol=0, atol=0)
        elif key == f"{stem}.weight":
            assert value.shape[1] == 1
            torch.testing.assert_close(value, adapt_input_conv(1, checkpoint[key]), rtol=0, atol=0)
            torch.testing.assert_close(value, checkpoint[key].sum(1, keepdim=True))
        else:
            torch.testing.assert_close(value, checkpoint[key], rtol=0, atol=0, msg=key)


def test_an_imagenet_timm_checkpoint_fine_tunes_to_10_classes_on_1_channel(imagenet_resnet18):
    checkpoint = timm.models.load_state_dict(imagenet_resnet18)
    torch.manual_seed(0)
    with pytest.warns(PartitionWarning) as caught:
        model = build_model("resnet18", 10, imagenet_resnet18, in_chans=1)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "fc.weight, fc.bias" in message and "conv1.weight" in message and "\n" not in message
    torch.manual_seed(0)
    fresh = timm.create_model("resnet18", num_classes=10, in_chans=1)
    _assert_fine_tuned_from(model, fresh, checkpoint, "conv1", "fc")
    assert model(torch.zeros(2, 1, 16, 16)).shape == (2, 10)


def test_the_public_loader_reports_what_it_did(imagenet_resnet18):
    model = timm.create_model("resnet18", num_classes=10, in_chans=3)
    with pytest.warns(PartitionWarning, match=r"fc\.weight, fc\.bias"):
        result = load_checkpoint_into(model, imagenet_resnet18)
    assert result.reinitialised == ("fc.weight", "fc.bias") and result.adapted == () and result.skipped == ()
    assert set(result.loaded) == set(model.state_dict()) - {"fc.weight", "fc.bias"}
    with warnings.catch_warnings():  # a checkpoint that fits: loaded silently
        warnings.simplefilter("error")
        again = load_checkpoint_into(timm.create_model("resnet18", num_classes=10), model.state_dict())
    assert again.reinitialised == again.adapted == () and again.summary() == ""


def test_train_fine_tunes_an_imagenet_checkpoint_with_one_line_saying_so(imagenet_resnet18, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "resnet18", "--checkpoint", imagenet_resnet18, *TRAIN, "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("partition-fx: warning: checkpoint ") and "fc.weight, fc.bias" in err[0]
    assert json.loads((out / "report.json").read_text())["status"] == "completed"


@pytest.mark.parametrize(
    ("other", "fragment"),
    [
        ("resnet34", "(and 95 more) has no place in the model"),  # resnet18's tensors all fit: layer1.2... is extra
        ("resnet50", "its tensor 'layer1.0.conv1.weight' has shape [64, 64, 1, 1] where the model's is [64, 64, 3, 3]"),
    ],
)
def test_a_checkpoint_of_another_architecture_is_refused_naming_its_first_misfit(tmp_path, capsys, other, fragment):
    path = _save(timm.create_model(other), tmp_path / f"{other}.safetensors")
    with pytest.raises(PartitionCheckpointError, match="--checkpoint") as refused:
        build_model("resnet18", 10, path)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert other != "resnet34" or "its tensor 'layer1.2." in str(refused.value)
    out = tmp_path / "run"
    assert main(["train", "--model", "resnet18", "--checkpoint", path, *TRAIN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("partition-fx: error: --checkpoint") and fragment in err[0]
    assert "saved from this model's state_dict()" in err[0] and not out.exists()


def test_a_torchvision_classifier_through_every_command(tmp_path, capsys):
    name = "torchvision:mobilenet_v3_small"
    assert main(["describe", "--model", name]) == 0
    assert capsys.readouterr().out.startswith("PartitionedModel of MobileNetV3")
    converted = tmp_path / "converted"
    assert main(["convert", "--model", name, "--out", str(converted), "--input-size", "32"]) == 0
    assert json.loads((converted / "report.json").read_text())["model"] == name
    run = tmp_path / "run"
    assert main(["train", "--model", name, *TRAIN, "--out", str(run)]) == 0
    assert json.loads((run / "report.json").read_text())["config"]["model"] == name
    assert main(["export", "--run", str(run)]) == 0
    assert (run / "export" / "model.onnx").is_file()
    assert capsys.readouterr().err == ""


def test_a_misspelt_torchvision_name_gets_a_hint_and_a_plain_name_is_timms(capsys):
    assert main(["describe", "--model", "torchvision:mobilenet_v3_smal"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown model 'torchvision:mobilenet_v3_smal'" in err
    assert "did you mean torchvision:mobilenet_v3_small" in err
    assert main(["describe", "--model", "mobilenet_v3_small"]) == 2  # plain names are timm's
    assert "did you mean torchvision:mobilenet_v3_small, " in capsys.readouterr().err
    assert type(build_model("resnet18", 10)).__module__ == "timm.models.resnet"
    assert type(build_model("torchvision:resnet18", 10)).__module__ == "torchvision.models.resnet"


def test_a_torchvision_checkpoint_fine_tunes_to_10_classes_on_1_channel(tmp_path):
    torch.manual_seed(1)
    path = _save(torchvision.models.resnet18(), tmp_path / "tv_resnet18.safetensors")  # 1000 classes, 3 channels
    checkpoint = timm.models.load_state_dict(path)
    torch.manual_seed(0)
    with pytest.warns(PartitionWarning, match=r"fc\.weight, fc\.bias"):
        model = build_model("torchvision:resnet18", 10, path, in_chans=1, img_size=16)
    torch.manual_seed(0)
    fresh = build_model("torchvision:resnet18", 10, in_chans=1, img_size=16)
    _assert_fine_tuned_from(model, fresh, checkpoint, "conv1", "fc")
    assert model(torch.zeros(2, 1, 16, 16)).shape == (2, 10)


def test_a_torchvision_classifier_too_big_for_the_images_is_refused(tmp_path, capsys):
    expected = (
        r"inception_v3 cannot run on 16x16 images.*pass --image-size 96 \(the smallest multiple of 32 it runs on\)"
    )
    with pytest.raises(PartitionError, match=expected):
        build_model("torchvision:inception_v3", 10, in_chans=1, img_size=16)
    out = tmp_path / "run"
    assert main(["train", "--model", "torchvision:inception_v3", *TRAIN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run on 16x16 images" in err[0] and not out.exists()


PLAIN = (
    "pass a state dict saved with safetensors.torch.save_file(model.state_dict(), PATH) or "
    "torch.save(model.state_dict(), PATH)"
)


def _not_a_state_dict(kind: str, path) -> None:
    """Write a file of ``kind`` that is not a plain state dict at ``path``."""
    small = nn.Sequential(nn.Linear(3, 2))
    if kind == "text":
        path.write_text("learning rate 0.1, 10 epochs\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "whole_module":
        torch.save(small, path)
    elif kind == "object_beside_tensors":
        torch.save({"state_dict": small.state_dict(), "net": small}, path)
    elif kind == "torchscript":
        torch.jit.save(torch.jit.script(small), str(path))


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("text", "is neither a safetensors file nor a torch.save file of a state dict of tensors"),
        ("empty", "is neither a safetensors file nor a torch.save file of a state dict of tensors"),
        ("whole_module", "holding Python objects besides tensors (torch.nn.modules.container.Sequential, "),
        ("object_beside_tensors", "holding Python objects besides tensors (torch.nn.modules.container.Sequential"),
        ("torchscript", "is a TorchScript archive (torch.jit.save), not a state dict"),
    ],
    ids=lambda value: value if " " not in value else "",
)
def test_a_file_that_is_not_a_state_dict_is_refused_saying_what_to_pass(tmp_path, kind, fragment):
    """One line naming the file, what it is (or is not) and what to pass; never a hint to unpickle it."""
    path = tmp_path / f"{kind}.pt"
    _not_a_state_dict(kind, path)
    with pytest.raises(PartitionCheckpointError) as refused:
        load_checkpoint_into(nn.Linear(3, 2), path)
    message = str(refused.value)
    assert message.startswith(f"checkpoint {str(path)!r} ") and fragment in message, message
    assert message.endswith(PLAIN) and "\n" not in message and "weights_only" not in message


def test_the_command_line_refuses_a_text_file_as_checkpoint_in_one_line(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("learning rate 0.1, 10 epochs\n")
    assert main(["describe", "--model", "resnet10t", "--checkpoint", str(notes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"partition-fx: error: --checkpoint {str(notes)!r} is neither a safetensors file nor a torch.save file of a "
        f"state dict of tensors; {PLAIN}"
    ]


@pytest.fixture(scope="module")
def run_directory(tmp_path_factory):
    """A run's directory as `partition-fx train` lays it out: ``RUN/checkpoint/`` with ``last.safetensors``,
    ``best.safetensors`` and ``resume/tensors.safetensors`` (one step of a partitioned linear model)."""
    run = tmp_path_factory.mktemp("runs") / "run"
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    fit(partitionify(nn.Linear(4, 2), 2, seed=0), (x, y), steps=1, checkpoint_dir=run / "checkpoint", progress=False)
    return run


@pytest.mark.parametrize(
    ("file", "what"),
    [
        ("last.safetensors", "a partitioned training checkpoint of partition-fx"),
        ("best.safetensors", "a partitioned training checkpoint of partition-fx"),
        ("resume/tensors.safetensors", "the resume state of a partition-fx training run"),
    ],
    ids=["last", "best", "resume"],
)
def test_a_runs_partitioned_checkpoint_is_refused_naming_its_plain_model(run_directory, capsys, file, what):
    path = run_directory / "checkpoint" / file
    run = str(run_directory)
    said = (
        f"checkpoint {str(path)!r} is {what} (the model's partitions, not its tensors): the run's plain model is "
        f"{run}/model.safetensors, or the one `partition-fx export --run {run}` writes"
    )
    with pytest.raises(PartitionCheckpointError) as refused:
        load_checkpoint_into(nn.Linear(4, 2), path)
    assert str(refused.value) == said
    assert main(["describe", "--model", "resnet10t", "--checkpoint", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"partition-fx: error: --{said}"]


def test_a_safetensors_file_of_another_name_and_an_old_torch_file_still_load(tmp_path):
    """The kind of a file is told by its content: a safetensors file named .pt loads, as does a legacy
    (non-zip) torch.save of a state dict."""
    torch.manual_seed(0)
    source = nn.Linear(3, 2)
    state = source.state_dict()
    _save(source, tmp_path / "weights.pt")
    torch.save(state, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    for name in ("weights.pt", "legacy.pth"):
        model = nn.Linear(3, 2)
        assert set(load_checkpoint_into(model, tmp_path / name).loaded) == set(state)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
