"""``partition-fx predict`` and what it reads: the class names, preprocessing and architecture that ``train`` and
``export`` record with a model (report.json, export.json, the ONNX file's metadata), and the ONNX files' names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import timm
import torch
import torchvision
from disk_formats import skip_checksums, write_cifar10, write_idx, write_image_folder
from PIL import Image
from safetensors.torch import load_file, load_model

from partition_fx import export_onnx, partitionify
from partition_fx.cli import main
from partition_fx.cli.commands.predict import prediction_lines
from partition_fx.cli.predict import read_image
from partition_fx.datasets import digits, image_folder, standard_dataset
from partition_fx.datasets.images import ImagePreprocessing
from partition_fx.models import build_model

TINY = ["--model", "resnet10t", "--image-size", "12", "--steps", "2", "--batch-size", "4", "--hyper-batch-size", "2"]
TINY += ["--samples", "2", "--test-time-samples", "0", "--proportions", "0.5,0.25,0.25", "--quiet"]
RECORD = ("classes", "preprocessing", "architecture", "onnx_names")


def _write_shapes(root: Path) -> None:
    """Two classes of grey 12x12 images, bright and dark."""
    rng = np.random.default_rng(0)
    for label, value in (("bright", 200), ("dark", 40)):
        (root / label).mkdir(parents=True)
        for i in range(10):
            pixels = (rng.random((12, 12)) * 30 + value).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(root / label / f"{i}.png")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``train`` run on an image folder; beside it ``new.jpg``, an RGB image of another size."""
    root = tmp_path_factory.mktemp("predict")
    _write_shapes(root / "shapes")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(root / "new.jpg")
    assert main(["train", *TINY, "--data", str(root / "shapes"), "--out", str(root / "run")]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def averaged(run: Path) -> Path:
    """The run exported with its ONNX file the test-time-averaged model."""
    out = run.parent / "averaged"
    assert main(["export", "--run", str(run), "--test-time-samples", "2", "--out", str(out)]) == 0
    return out


def _images(run: Path) -> list[Path]:
    shapes = run.parent / "shapes"
    return [shapes / "bright" / "0.png", shapes / "dark" / "3.png", shapes / "dark" / "7.png", run.parent / "new.jpg"]


def _predict(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _independent_inputs(images: list[Path]) -> torch.Tensor:
    """The images as the run's data were decoded, without partition-fx: grey, 12x12 (bilinear), / 255."""
    arrays = [np.asarray(Image.open(p).convert("L").resize((12, 12), Image.Resampling.BILINEAR)) for p in images]
    return torch.from_numpy(np.stack(arrays)[:, None].astype(np.float32) / 255.0)


def test_predict_names_the_class_the_exported_model_and_its_onnx_twin_choose(run, capsys):
    images = _images(run)
    x = _independent_inputs(images)
    model = timm.create_model("resnet10t", num_classes=2, in_chans=1).eval()  # built afresh, loaded by hand
    model.load_state_dict(load_file(run / "model.safetensors"))
    with torch.no_grad():
        expected = torch.softmax(model(x), dim=1)
    session = ort.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run(["logits"], {"images": x.numpy()})
    classes = ["bright", "dark"]
    assert [classes[i] for i in np.argmax(onnx_logits, 1)] == [classes[i] for i in expected.argmax(1)]

    by_run = _predict(capsys, "--run", str(run), *map(str, images), "--top", "2")
    by_onnx = _predict(capsys, "--model", str(run / "model.onnx"), *map(str, images), "--top", "2")
    for predictions in (by_run, by_onnx):
        assert [p["image"] for p in predictions] == [str(p) for p in images]
        assert [p["top"][0]["class"] for p in predictions] == [classes[i] for i in expected.argmax(1)]
        got = torch.tensor(
            [[c["probability"] for c in sorted(p["top"], key=lambda c: c["index"])] for p in predictions]
        )
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)

    assert main(["predict", "--run", str(run), *map(str, images[:2])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{images[i]}: {by_run[i]['top'][0]['class']} {by_run[i]['top'][0]['probability']:.4f}" for i in (0, 1)
    ]


def test_a_16_bit_image_gets_the_prediction_of_its_8_bit_twin(run, tmp_path, capsys):
    """PIL's own convert("L") clips 16-bit grey at 255: the dark image would read as a white blob."""
    eight = run.parent / "shapes" / "dark" / "3.png"
    sixteen = tmp_path / "dark16.png"
    Image.fromarray(np.asarray(Image.open(eight)).astype(np.uint16) * 257).save(sixteen)
    assert Image.open(sixteen).mode == "I;16"
    for option, model in (("--run", run), ("--model", run / "model.onnx")):
        first, second = _predict(capsys, option, str(model), str(eight), str(sixteen), "--top", "2")
        assert first["top"] == second["top"]


def test_onnx_files_name_their_input_images_and_their_output_logits_or_log_probs(run, averaged, capsys):
    for path, output in ((run / "model.onnx", "logits"), (averaged / "model.onnx", "log_probs")):
        graph = onnx.load(str(path)).graph
        assert ([i.name for i in graph.input], [o.name for o in graph.output]) == (["images"], [output])
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["images"]
        assert [o.name for o in session.get_outputs()] == [output]
        assert json.loads(session.get_modelmeta().custom_metadata_map["onnx_names"])["output"] == output
    images = _images(run)
    session = ort.InferenceSession(str(averaged / "model.onnx"), providers=["CPUExecutionProvider"])
    (log_probs,) = session.run(["log_probs"], {"images": _independent_inputs(images).numpy()})
    predictions = _predict(capsys, "--model", str(averaged / "model.onnx"), *map(str, images), "--top", "2")
    got = np.array([[c["probability"] for c in sorted(p["top"], key=lambda c: c["index"])] for p in predictions])
    np.testing.assert_allclose(got, np.exp(log_probs), rtol=1e-4, atol=1e-6)
    # --run of an export directory predicts with its plain model, as a train run does
    assert _predict(capsys, "--run", str(averaged), *map(str, images)) == _predict(
        capsys, "--run", str(run), *map(str, images)
    )


def test_report_export_and_onnx_metadata_record_classes_preprocessing_and_architecture(run, averaged, tmp_path):
    report = json.loads((run / "report.json").read_text())
    exported = json.loads((averaged / "export.json").read_text())
    splits = image_folder(run.parent / "shapes", size=12, split="test")
    assert report["classes"] == exported["classes"] == list(splits.classes) == ["bright", "dark"]
    assert report["preprocessing"] == exported["preprocessing"] == splits.preprocessing.to_dict()
    assert report["preprocessing"]["mode"] == "L" and report["preprocessing"]["layout"] == "NCHW"
    architecture = {"model": "resnet10t", "num_classes": 2, "in_chans": 1, "img_size": 12}
    assert report["architecture"] == exported["architecture"] == architecture
    assert report["onnx_names"] == {"input": "images", "output": "logits"}
    assert exported["onnx_names"] == {"input": "images", "output": "log_probs"}
    for directory, record in ((run, report), (averaged, exported)):
        metadata = {p.key: p.value for p in onnx.load(str(directory / "model.onnx")).metadata_props}
        assert {key: json.loads(metadata[key]) for key in RECORD} == {key: record[key] for key in RECORD}
    # the architecture rebuilds the module of model.safetensors, every tensor
    load_model(build_model(**{"name": architecture.pop("model"), **architecture}), str(run / "model.safetensors"))


@pytest.mark.parametrize(
    ("size", "channels", "in_memory", "fmt"),
    [(None, None, True, "png"), (None, 1, False, "png"), (10, None, True, "jpg"), (24, 3, False, "bmp")],
)
def test_the_recorded_preprocessing_reproduces_the_datasets_own_tensors(tmp_path, size, channels, in_memory, fmt):
    write_image_folder(tmp_path / "folder", per_class=3, size=16, classes=2, fmt=fmt)
    splits = image_folder(tmp_path / "folder", size=size, channels=channels, in_memory=in_memory)
    preprocessing = ImagePreprocessing.from_dict(json.loads(json.dumps(splits.preprocessing.to_dict())))
    assert preprocessing == splits.preprocessing and splits.classes == ("c0", "c1")
    for files, part in ((splits.info["train_files"], splits.train), (splits.info["test_files"], splits.test)):
        for i, path in enumerate(files):
            assert torch.equal(read_image(path, preprocessing), part[i][0]), path


def test_every_image_dataset_names_its_classes_and_preprocessing(tmp_path, monkeypatch):
    grey = digits(size=12, channels=3)
    assert grey.classes == tuple("0123456789") and grey.preprocessing == ImagePreprocessing("RGB", 3, 12, 12)
    # a digit saved as an 8-bit image comes back as the dataset's tensor, up to the 8-bit rounding
    x = grey.test[0][0]
    Image.fromarray((x[0].numpy() * 255).round().astype(np.uint8), mode="L").save(tmp_path / "digit.png")
    torch.testing.assert_close(read_image(tmp_path / "digit.png", grey.preprocessing), x, atol=0.5 / 255, rtol=0)
    assert digits(size=8, channels=2).preprocessing(Image.new("L", (8, 8))).shape == (2, 8, 8)
    skip_checksums(monkeypatch)
    write_cifar10(tmp_path / "cifar")
    cifar = standard_dataset("cifar10", tmp_path / "cifar", split="test")
    assert cifar.classes == tuple(f"class{c}" for c in range(10))  # the copy's own batches.meta
    image, _ = torchvision.datasets.CIFAR10(str(tmp_path / "cifar"), train=False)[0]
    assert torch.equal(cifar.preprocessing(image), cifar.test[0][0])
    write_idx(tmp_path / "mnist")
    mnist = standard_dataset("mnist", tmp_path / "mnist", size=16, split="test")
    assert mnist.classes[:2] == ("0 - zero", "1 - one") and mnist.preprocessing == ImagePreprocessing("L", 1, 16, 16)


def _tiny_onnx_without_metadata(path: Path) -> None:
    export_onnx(partitionify(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2)), 2), path, torch.ones(1, 4))


@pytest.mark.parametrize(
    "case",
    ["no exported model", "not a run", "earlier report", "onnx without metadata", "not onnx", "bad preprocessing"],
)  # fmt: skip
def test_each_refusal_is_one_line(run, tmp_path, capsys, case):
    image = str(_images(run)[0])
    if case == "no exported model":  # an interrupted run's report, without model.safetensors
        (tmp_path / "run").mkdir()
        report = {**json.loads((run / "report.json").read_text()), "status": "interrupted"}
        (tmp_path / "run" / "report.json").write_text(json.dumps(report))
        argv, fragment = (
            ["--run", str(tmp_path / "run"), image],
            "has no exported model (model.safetensors): the run is interrupted; `partition-fx export",
        )
    elif case == "not a run":
        argv, fragment = ["--run", str(tmp_path), image], "is not a `partition-fx train` run or `export` directory"
    elif case == "earlier report":  # a run that an earlier version wrote: no classes and preprocessing
        shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoint"))
        report = json.loads((run / "report.json").read_text())
        del report["classes"], report["preprocessing"]
        (tmp_path / "run" / "report.json").write_text(json.dumps(report))
        argv, fragment = (
            ["--run", str(tmp_path / "run"), image],
            "report.json lacks classes, preprocessing (written by an earlier version",
        )
    elif case == "onnx without metadata":
        _tiny_onnx_without_metadata(tmp_path / "old.onnx")
        argv, fragment = (
            ["--model", str(tmp_path / "old.onnx"), image],
            "has no classes, preprocessing, architecture, onnx_names in its metadata",
        )
    elif case == "not onnx":
        argv, fragment = ["--model", image, image], "onnxruntime cannot load it"
    else:
        shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoint"))
        report = json.loads((run / "report.json").read_text())
        report["preprocessing"]["divide_by"] = 1.0
        (tmp_path / "run" / "report.json").write_text(json.dumps(report))
        argv, fragment = (
            ["--run", str(tmp_path / "run"), image],
            "its preprocessing record is not this version's (divide_by differ",
        )
    capsys.readouterr()
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("partition-fx: error: ") and "\n" not in err and fragment in err, err


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ``train`` run on the bundled digits at 8x8 (its model need not be good: the images are what is
    checked), and beside it every test digit as an 8-bit PNG."""
    root = tmp_path_factory.mktemp("digits")
    argv = ["--model", "fixup_resnet8", "--data", "digits", "--image-size", "8", "--steps", "2", "--batch-size", "8"]
    assert main(["train", *argv, "--test-time-samples", "0", "--quiet", "--out", str(root / "run")]) == 0
    for i, (x, _) in enumerate(digits(size=8).test):
        Image.fromarray((x[0].numpy() * 255).round().astype(np.uint8)).save(root / f"test{i}.png")
    return root / "run"


def test_predict_warns_of_an_image_unlike_every_training_image_and_says_which_predictor_it_used(digits_run, capsys):
    """Statistics recorded from the training images flag an inverted background, noise, unscaled values and a blank
    page, which the model still answers with confidence; none of the held-out test digits is flagged."""
    root = digits_run.parent
    test_images = sorted(root.glob("test*.png"))
    digit = np.asarray(Image.open(test_images[0]))
    odd = {
        "inverted.png": 255 - digit,
        "noise.png": np.random.default_rng(0).integers(0, 256, digit.shape, dtype=np.uint8),
        "unscaled.png": np.rint(digit / 255 * 16).astype(np.uint8),  # the raw 0..16 values of sklearn's digits
        "blank.png": np.zeros_like(digit),
    }
    for name, pixels in odd.items():
        Image.fromarray(pixels).save(root / name)
    record = json.loads((digits_run / "report.json").read_text())["input_statistics"]
    assert record["split"] == "train" and record["images"] == 1438 and record["brightness"][0] < record["brightness"][1]
    for option, model in (("--run", digits_run), ("--model", digits_run / "model.onnx")):
        capsys.readouterr()
        assert main(["predict", option, str(model), *map(str, test_images), *(str(root / n) for n in odd)]) == 0
        out, err = capsys.readouterr()
        assert len(out.splitlines()) == len(test_images) + len(odd)  # every image still gets its answer
        warned = [line for line in err.splitlines() if "looks unlike the training images" in line]
        assert [line.split(" looks")[0].removeprefix("partition-fx: warning: ") for line in warned] == [
            str(root / n) for n in odd
        ]
        predictor = {
            "--run": f"{digits_run / 'model.safetensors'}, the plain exported model",
            "--model": f"{model} in onnxruntime, the plain model",
        }[option]
        assert err.splitlines()[0] == f"partition-fx: predicting with {predictor}"
    flagged = [
        p for p in _predict(capsys, "--run", str(digits_run), *map(str, test_images)) if p["unlike_training_images"]
    ]
    assert flagged == []


@pytest.mark.parametrize("reader", ["head -0", "head -30"])
def test_a_reader_that_stops_early_ends_predict_quietly_with_status_141(run, tmp_path, reader):
    """``predict ... | head -0`` (the reader gone before anything is written) and ``predict ... --json | head -30``
    (gone after 30 lines of far more than a pipe holds): no traceback, the status a shell gives a command killed
    by SIGPIPE (128 + 13), as this CLI's 143 for SIGTERM."""
    images = [str(p) for p in _images(run)[:3]]  # training images: no warning on stderr
    argv = [sys.executable, "-m", "partition_fx.cli", "predict", "--model", str(run / "model.onnx")]
    argv += images if reader == "head -0" else [*images * 700, "--top", "2", "--json"]  # about 0.5 MB of JSON
    with (tmp_path / "stderr").open("w+b") as stderr:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, cwd=run.parent) as process:
            if reader == "head -30":
                lines = [process.stdout.readline() for _ in range(30)]
                assert lines[0] == b"[\n" and all(lines)
            process.stdout.close()
            status = process.wait(timeout=300)
        err = (tmp_path / "stderr").read_text()
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipeError" not in err, err
    assert status == 141, err
    assert err.splitlines() == [f"partition-fx: predicting with {run / 'model.onnx'} in onnxruntime, the plain model"]


def _batch_with_failures(run: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """72 images (two batches of 64): in the first batch a text file named .png, a missing file and a text file
    named as such, in the second a truncated PNG; the failures by path, each with what its error says."""
    (tmp_path / "notes.png").write_text("not an image")
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "truncated.png").write_bytes((run.parent / "shapes" / "dark" / "3.png").read_bytes()[:40])
    bad = [str(tmp_path / name) for name in ("notes.png", "missing.png", "notes.txt", "truncated.png")]
    good = [str(p) for p in _images(run)] * 17  # 68
    images = [*good[:3], bad[0], bad[1], *good[3:10], bad[2], *good[10:], bad[3]]
    failures = {
        bad[0]: f"cannot read image {bad[0]}: cannot identify image file",
        bad[1]: f"image {bad[1]} does not exist",
        bad[2]: f"cannot read image {bad[2]}: cannot identify image file",
        bad[3]: f"image {bad[3]}",  # PIL reads its header: decoding it fails
    }
    assert len(images) == 72 and images.index(bad[3]) >= 64
    return images, failures


@pytest.mark.parametrize("option", ["--run", "--model"])
def test_an_unreadable_or_missing_image_is_reported_and_every_other_one_predicted(run, tmp_path, capsys, option):
    """As grep and ls: every readable image answered in order, one error line per failure, then status 2."""
    model = str(run if option == "--run" else run / "model.onnx")
    images, failures = _batch_with_failures(run, tmp_path)
    good = [p for p in images if p not in failures]
    expected = _predict(capsys, option, model, *good, "--top", "2")

    assert main(["predict", option, model, *images, "--top", "2"]) == 2
    out, err = capsys.readouterr()
    assert [line.split(": ")[0] for line in out.splitlines()] == good
    assert len(prediction_lines(expected)) == len(good)
    errors = [line for line in err.splitlines() if not line.startswith("partition-fx: warning: ")]
    assert errors[0].startswith("partition-fx: predicting with ")
    assert len(errors) == 1 + len(failures)
    for line, (path, fragment) in zip(errors[1:], failures.items()):
        assert line.startswith("partition-fx: error: ") and fragment in line and path in line, line

    assert main(["predict", option, model, *images, "--top", "2", "--json"]) == 2
    predictions = json.loads(capsys.readouterr().out)
    assert [p["image"] for p in predictions] == images
    answered = [p for p in predictions if p["image"] not in failures]  # batched otherwise: equal up to rounding
    assert [(p["image"], [c["class"] for c in p["top"]]) for p in answered] == [
        (p["image"], [c["class"] for c in p["top"]]) for p in expected
    ]
    probabilities = [[[c["probability"] for c in p["top"]] for p in ps] for ps in (answered, expected)]
    np.testing.assert_allclose(*probabilities, rtol=1e-5, atol=1e-6)
    for p in predictions:
        if p["image"] in failures:
            assert set(p) == {"image", "error"} and failures[p["image"]] in p["error"], p


def test_when_every_image_fails_each_is_reported_and_the_status_is_2(run, tmp_path, capsys):
    (tmp_path / "notes.png").write_text("not an image")
    images = [str(tmp_path / "notes.png"), str(tmp_path / "missing.png")]
    for extra in ([], ["--json"]):
        capsys.readouterr()
        assert main(["predict", "--model", str(run / "model.onnx"), *images, *extra]) == 2
        out, err = capsys.readouterr()
        assert err.splitlines()[1:] == [
            f"partition-fx: error: cannot read image {images[0]}: cannot identify image file {images[0]!r}; remove "
            "or replace the file",
            f"partition-fx: error: image {images[1]} does not exist",
        ]
        if extra:
            assert [set(p) for p in json.loads(out)] == [{"image", "error"}] * 2
        else:
            assert out == ""


def _folder_of_images(root: Path) -> list[Path]:
    """Class subfolders of images of every suffix training from a folder reads, with notes, a CSV, a file without
    a suffix and a hidden file among them; the images, sorted by path."""
    images = []
    for i, suffix in enumerate((".png", ".jpg", ".JPEG", ".bmp", ".tif", ".webp", ".ppm", ".pgm", ".tiff")):
        path = root / ("cats" if i % 2 else "dogs") / ("deep" if i % 3 == 0 else "") / f"{i}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((12, 12), 20 * i, dtype=np.uint8)).save(path, format=Image.registered_extensions()[
            suffix.lower()])  # fmt: skip
        images.append(path)
    (root / "notes.txt").write_text("notes")
    (root / "cats" / "labels.csv").write_text("a,b")
    (root / "dogs" / "README").write_text("readme")
    (root / "dogs" / ".DS_Store").write_bytes(b"\0")
    return sorted(images)


def test_a_folder_predicts_its_images_recursively_sorted_by_path_and_says_what_it_skipped(run, tmp_path, capsys):
    images = _folder_of_images(tmp_path / "photos")
    single = run.parent / "new.jpg"
    expected = _predict(capsys, "--model", str(run / "model.onnx"), *map(str, [single, *images]))
    capsys.readouterr()
    assert main(["predict", "--model", str(run / "model.onnx"), str(single), str(tmp_path / "photos"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == expected
    assert [line for line in err.splitlines()[1:] if " looks unlike the training images " not in line] == [
        f"partition-fx: skipped 3 files that are not images (labels.csv, README, notes.txt) in {tmp_path / 'photos'}"
    ]


def test_a_folder_without_images_is_refused_naming_it_and_the_suffixes_looked_for(run, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("a")
    for folder in (tmp_path / "notes", tmp_path):
        capsys.readouterr()
        assert main(["predict", "--model", str(run / "model.onnx"), str(_images(run)[0]), str(folder)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"partition-fx: error: folder {folder} has no images in it or its subfolders (looked for .jpg, .jpeg, "
            ".png, .ppm, .bmp, .pgm, .tif, .tiff, .webp); it holds 1 file that is not an image (a.txt); pass a "
            "folder that holds images, or the image files"
        ]


def test_a_folder_given_to_predict_holds_the_images_training_from_it_reads(tmp_path):
    """The same suffixes (``datasets.folder.image_extensions``), the same files skipped."""
    from partition_fx.cli.commands.predict import image_files

    _folder_of_images(tmp_path / "photos")
    splits = image_folder(tmp_path / "photos", size=12)
    images, skipped = image_files(tmp_path / "photos")
    assert images == sorted(Path(p) for p in [*splits.info["train_files"], *splits.info["test_files"]])
    in_class_folders = [p for p in skipped if p.parent != tmp_path / "photos"]  # training skips notes.txt, unread
    assert in_class_folders == sorted(Path(p) for p in splits.info["skipped_files"]) and len(skipped) == 3
