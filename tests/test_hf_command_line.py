"""``partition-fx train --model hf:DIR``: a tiny ViT that ``save_pretrained`` wrote trains on the bundled rotdigits,
its export is a folder that ``AutoModelForImageClassification.from_pretrained`` loads, whose predictions give the
run's test accuracy, as ``predict`` does; a folder that is missing or not a ``save_pretrained`` one, or a missing
``transformers``, is refused in one line before ``--out`` is written."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from partition_fx.cli import main
from partition_fx.datasets import load_dataset

transformers = pytest.importorskip("transformers")

TINY = ["--data", "rotdigits", "--image-size", "32", "--steps", "4", "--batch-size", "8", "--samples", "2"]
TINY += ["--eval-every", "2", "--quiet"]


def _vit_folder(folder: Path, **config: object) -> Path:
    """A tiny ViT image classifier (3 channels, 3 classes, 32-px images) written by ``save_pretrained``."""
    torch.manual_seed(0)
    sizes = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    options = {"image_size": 32, "patch_size": 8, "num_labels": 3, **sizes, **config}
    transformers.ViTForImageClassification(transformers.ViTConfig(**options)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    vit = _vit_folder(root / "vit")
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        assert main(["train", "--model", f"hf:{vit}", *TINY, "--out", str(root / "run")]) == 0
    # one line: a new head for 10 classes, the patch projection summed over its 3 channels for greyscale
    (warned,) = [line for line in said.getvalue().splitlines() if f"hf:{vit}" in line]
    assert "(the classifier, re-initialised for this model): classifier.weight, classifier.bias; adapted" in warned
    assert main(["export", "--run", str(root / "run")]) == 0
    return root / "run" / "export"


def _test_split() -> tuple[torch.Tensor, torch.Tensor]:
    test = load_dataset("rotdigits", size=32, split="test").test
    return torch.stack([x for x, _ in test]), torch.tensor([y for _, y in test])


def test_the_export_loads_with_from_pretrained_and_scores_the_run_s_test_accuracy(exported: Path) -> None:
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["config.json", "export.json", "model.onnx", "model.safetensors"]
    model = transformers.AutoModelForImageClassification.from_pretrained(exported).eval()
    assert model.config.num_labels == 10 and model.config.num_channels == 1 and model.config.id2label[3] == "3"
    x, y = _test_split()
    with torch.no_grad():
        correct = int((model(x).logits.argmax(dim=1) == y).sum())
    report = json.loads((exported.parent / "report.json").read_text())
    summary = json.loads((exported / "export.json").read_text())
    assert summary["files"]["config"] == "config.json" and report["architecture"]["model"].startswith("hf:")
    assert correct == round(summary["test_accuracy"] * len(y)) == round(report["test_accuracy"] * len(y))


def test_predict_on_the_export_answers_as_from_pretrained_does_without_the_original_folder(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, _ = _test_split()
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"digit{i}.png")
        Image.fromarray((x[i, 0].numpy() * 255).round().astype(np.uint8), mode="L").save(paths[-1])
    model = transformers.AutoModelForImageClassification.from_pretrained(exported).eval()
    decoded = torch.stack([torch.from_numpy(np.asarray(Image.open(p), dtype=np.float32) / 255)[None] for p in paths])
    with torch.no_grad():
        expected = torch.softmax(model(decoded).logits, dim=1)
    original = exported.parent.parent / "vit"
    original.rename(original.with_name("moved"))  # the export is a folder of its own
    try:
        capsys.readouterr()
        assert main(["predict", "--run", str(exported), "--json", *map(str, paths)]) == 0
    finally:
        original.with_name("moved").rename(original)
    answers = json.loads(capsys.readouterr().out)
    assert [a["top"][0]["index"] for a in answers] == expected.argmax(dim=1).tolist()
    got = torch.tensor([a["top"][0]["probability"] for a in answers])
    torch.testing.assert_close(got, expected.max(dim=1).values, rtol=1e-4, atol=1e-5)


def test_an_image_size_the_config_fixes_is_refused_naming_the_option(tmp_path, capsys) -> None:
    vit = _vit_folder(tmp_path / "vit")
    argv = ["train", "--model", f"hf:{vit}", *TINY[:2], "--steps", "2", "--out", str(tmp_path / "run")]
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "was saved for 32x32 images" in err and err.endswith("pass --image-size 32")
    assert not (tmp_path / "run").exists()


def test_a_folder_of_another_kind_of_model_is_refused(tmp_path, capsys) -> None:
    folder = tmp_path / "bert"
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    transformers.BertModel(config).save_pretrained(folder)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["train", "--model", f"hf:{folder}", *TINY, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a 'bert' model, which AutoModelForImageClassification does not build" in err
    assert not (tmp_path / "run").exists()


def test_a_missing_or_foreign_folder_or_missing_transformers_is_refused_before_torch(tmp_path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "weightless").mkdir()
    (tmp_path / "weightless" / "config.json").write_text('{"model_type": "vit"}')
    vit = _vit_folder(tmp_path / "vit")
    cases = {
        "missing": (f"hf:{tmp_path / 'missing'}", "is not a folder; pass hf:DIR, DIR a folder that save_pretrained"),
        "foreign": (f"hf:{tmp_path / 'notes'}", "is not a Hugging Face save_pretrained folder (no config.json)"),
        "weightless": (f"hf:{tmp_path / 'weightless'}", "has a config.json but no weights"),
        "no transformers": (
            f"hf:{vit}",
            "--model hf:DIR needs transformers, which is not installed: pip install 'partition-fx[hf]'",
        ),
    }
    script = (
        "import contextlib, io, json, sys\n"
        "if sys.argv[3] == 'block': sys.modules['transformers'] = None\n"
        "from partition_fx.cli import main\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        "    code = main(['train', '--model', sys.argv[1], '--out', sys.argv[2]])\n"
        "print(json.dumps([code, err.getvalue(), 'torch' in sys.modules]))\n"
    )
    for case, (model, fragment) in cases.items():
        block = "block" if case == "no transformers" else "-"
        argv = [sys.executable, "-c", script, model, str(tmp_path / "run"), block]
        code, err, torch_imported = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        assert code == 2 and fragment in err and err.count("\n") == 1 and not torch_imported, (case, err)
    assert not (tmp_path / "run").exists()
