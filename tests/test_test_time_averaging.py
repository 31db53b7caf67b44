"""Test-time averaging (``transforms.TestTimeAveraged``) against its definition: the mean of the model's class
probabilities over K fixed transforms, which are an even Latin hypercube over the augmentation's ranges; one
sample is the model itself; the predictor is deterministic, exports to ONNX and matches in onnxruntime."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx import export_onnx, partitionify
from partition_fx.errors import PartitionArgumentError, PartitionTypeError
from partition_fx.models import build_model
from partition_fx.transforms import AffineAugmentation, InputMask, TestTimeAveraged, averaging_coefficients


@settings(max_examples=30, deadline=None)
@given(samples=st.integers(1, 40), generators=st.integers(1, 6), seed=st.integers(0, 3))
def test_coefficients_are_a_latin_hypercube_of_midpoints(samples, generators, seed):
    eps = averaging_coefficients(samples, generators, seed)
    midpoints = (torch.arange(samples, dtype=torch.float64) * 2 + 1) / samples - 1
    assert eps.shape == (samples, generators) and eps.dtype == torch.float32
    for column in eps.T:  # each generator's values: every stratum of (-1, 1) once
        assert torch.equal(column.sort().values, midpoints.float())
    assert torch.equal(eps[:, 0], midpoints.float())
    assert torch.equal(eps, averaging_coefficients(samples, generators, seed))  # fixed by its arguments


def _classifier():
    torch.manual_seed(0)
    return build_model("fixup_resnet8", 10, in_chans=1, img_size=12).eval()


def test_the_prediction_is_the_mean_probability_over_the_fixed_transforms():
    model = _classifier()
    augmentation = AffineAugmentation(init={"rotation": 2.0, "scale_x": 0.2, "translation_y": 0.1})
    averaged = TestTimeAveraged(model, augmentation, samples=6).eval()
    x = torch.randn(5, 1, 12, 12)
    eps = averaging_coefficients(6, len(augmentation.generators))
    with torch.no_grad():
        transformed = augmentation.transform(x, eps[:, None].expand(6, 5, -1))  # [K * B], sample-major
        probs = torch.softmax(model(transformed).double(), -1).reshape(6, 5, -1)
        expected = probs.mean(0).log()
        got = averaged(x)
    assert torch.allclose(got.double(), expected, atol=1e-5)
    assert torch.allclose(got.exp().sum(-1), torch.ones(5))  # log-probabilities
    assert torch.equal(got, averaged(x))  # deterministic


def test_one_sample_is_the_model_itself_and_the_transforms_are_fixed_when_built():
    model = _classifier()
    augmentation = AffineAugmentation(init={"rotation": 1.0})
    single = TestTimeAveraged(model, augmentation, samples=1).eval()
    x = torch.randn(4, 1, 12, 12)
    with torch.no_grad():
        assert torch.allclose(single(x), torch.log_softmax(model(x), -1), atol=1e-5)
        averaged = TestTimeAveraged(model, augmentation, samples=4).eval()
        before = averaged(x)
        augmentation.ranges.fill_(0.0)  # a later change of the augmentation
        assert torch.equal(averaged(x), before)
        rotations = torch.atan2(averaged.theta[:, 1, 0], averaged.theta[:, 0, 0])
    assert torch.allclose(rotations.sort().values, torch.tensor([-0.75, -0.25, 0.25, 0.75]), atol=1e-6)  # even grid


def test_bad_arguments_are_refused():
    with pytest.raises(PartitionArgumentError, match="samples must be an int >= 1"):
        TestTimeAveraged(_classifier(), AffineAugmentation(), samples=0)
    with pytest.raises(PartitionTypeError, match="augmentation must be an AffineAugmentation, got InputMask"):
        TestTimeAveraged(_classifier(), InputMask(4))


def test_the_averaged_predictor_exports_to_onnx_and_matches_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    pmodel = partitionify(build_model("fixup_resnet8", 10, in_chans=1, img_size=12), 2)
    augmentation = AffineAugmentation(init={"rotation": math.pi / 2, "scale_y": 0.1})
    path = export_onnx(  # export_onnx compares onnxruntime's outputs with PyTorch's
        pmodel,
        tmp_path / "averaged.onnx",
        (torch.randn(3, 1, 12, 12),),
        wrap=lambda m: TestTimeAveraged(m, augmentation, 4),
    )
    import onnxruntime as ort

    session = ort.InferenceSession(str(path))
    x = torch.randn(7, 1, 12, 12)  # another batch size
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    from partition_fx import export_subnetwork

    expected = TestTimeAveraged(export_subnetwork(pmodel), augmentation, 4).eval()(x).detach()
    assert torch.allclose(torch.from_numpy(out), expected, atol=1e-4)


TINY = ["--model", "fixup_resnet8", "--image-size", "12", "--steps", "4", "--batch-size", "16", "--eval-every", "2"]
TINY += ["--samples", "2", "--quiet"]


def test_train_reports_and_export_writes_the_averaged_predictor(tmp_path, capsys):
    import json

    from partition_fx.cli import main

    run, export = tmp_path / "run", tmp_path / "export"
    assert main(["train", *TINY, "--init", "rotation=1.0", "--test-time-samples", "4", "--out", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert main(["export", "--run", str(run), "--test-time-samples", "4", "--out", str(export)]) == 0
    summary = json.loads((export / "export.json").read_text())
    assert summary["averaged_test_accuracy"] == report["averaged_test_accuracy"] is not None
    assert summary["test_accuracy"] == report["test_accuracy"] and summary["test_time_samples"] == 4
    import onnxruntime as ort

    from partition_fx.datasets import load_dataset

    x, y = load_dataset("rotdigits", size=12, split="test").test.tensors
    session = ort.InferenceSession(str(export / "model.onnx"))
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert abs(float((torch.from_numpy(out).argmax(1) == y).float().mean()) - summary["averaged_test_accuracy"]) < 1e-2
    plain = tmp_path / "plain"
    assert main(["train", *TINY, "--augment", "none", "--out", str(plain)]) == 0
    assert json.loads((plain / "report.json").read_text())["averaged_test_accuracy"] is None  # nothing to average
    assert main(["export", "--run", str(plain), "--test-time-samples", "4", "--out", str(tmp_path / "x")]) == 2
    assert "--test-time-samples 4 averages over the run's learned augmentation" in capsys.readouterr().err
