"""Models torch.fx cannot trace (``partitionify(trace=...)``): run untraced, their own forward fed each
subnetwork's tensors; what that path refuses; and training such a model on its own losses (a detector, with a
zoom of its images and boxes learned). Every torchvision family's models: tests/test_zoo.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader

from partition_fx import PartitionConfig, export_onnx, export_subnetwork, partitionify
from partition_fx.errors import PartitionArgumentError, PartitionError
from partition_fx.testing import assert_subnetworks_match_exports, perturb_partitions
from partition_fx.training import ModelLoss, PartitionedBatchSampler, TrainConfig, TrainingSteps, split_into_chunks
from partition_fx.transforms import BoxZoom


class Branchy(nn.Module):
    """A model whose own forward branches on its input's values: fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.head(h) if float(h.sum()) > 0 else -self.head(h)


class TracesInEvalOnly(nn.Module):
    """A model whose forward fx traces in eval mode only: in training mode it branches on its values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h * 2 if self.training and float(h.sum()) > 0 else h


def _tiny_detector() -> nn.Module:
    """A Faster R-CNN of a few thousand parameters on 32-px images (one conv as its backbone): fast to convert and
    to try to export."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
    backbone.out_channels = 8
    return FasterRCNN(
        backbone,
        min_size=32,
        max_size=32,
        rpn_anchor_generator=AnchorGenerator(sizes=((8,),), aspect_ratios=((1.0,),)),
        box_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
        box_head=TwoMLPHead(8 * 49, 16),
        box_predictor=FastRCNNPredictor(16, 2),
    )


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if float(x.mean()) > -10 else x * 0  # untraceable, inside a submodule


class WithGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.gate, self.last = nn.Linear(4, 8), Gate(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.gate(self.first(x)))


@pytest.mark.parametrize(
    "conversion",
    [{}, {"scheme": "node"}, {"default": "seed", "assignments": "regenerated"}, {"default": "zero"}],
    ids=["random", "node", "seed-regenerated", "zero"],
)
def test_a_model_fx_cannot_trace_runs_untraced_and_its_subnetworks_equal_their_exports(conversion) -> None:
    """Every scheme and default of the traced path, and the norm scales (BatchNorm's affine: product/sum)."""
    torch.manual_seed(0)
    model, x = Branchy().eval(), torch.randn(5, 4)
    pmodel = partitionify(model, 3, **conversion)
    assert pmodel.untraced is not None and "could not trace Branchy" in pmodel.untraced
    assert "untraced" in pmodel.describe()
    kinds = {name: pt.kind for name, pt in pmodel.partitioned_tensors()}
    assert kinds["body.1.weight"] == "product" and kinds["body.1.bias"] == "sum"
    with torch.no_grad():
        reference = model(x) if conversion.get("default", "init") == "init" else export_subnetwork(pmodel, 0)(x)
        assert torch.equal(pmodel(x, subnetwork=0), reference)
    perturb_partitions(pmodel, seed=0)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=0)
    assert type(export_subnetwork(pmodel)) is Branchy


def test_trace_always_refuses_what_fx_cannot_trace_and_never_skips_tracing() -> None:
    with pytest.raises(
        PartitionError, match=r"(?s)could not trace Branchy: module '<root>'.*trace='auto'\) runs the model untraced"
    ):
        partitionify(Branchy(), 2, trace="always")
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 3), nn.Tanh()), torch.randn(2, 4)
    traced, untraced = partitionify(model, 2), partitionify(model, 2, trace="never")
    assert traced.untraced is None and "trace='never'" in untraced.untraced
    assert list(traced.state_dict()) == list(untraced.state_dict())
    assert torch.equal(traced(x, subnetwork=1), untraced(x, subnetwork=1))
    with pytest.raises(PartitionArgumentError, match="trace must be one of"):
        partitionify(model, 2, trace="sometimes")


def test_auto_calls_a_submodule_fx_cannot_trace_whole_and_traces_the_rest() -> None:
    torch.manual_seed(0)
    model, x = WithGate(), torch.randn(3, 4)
    with pytest.raises(PartitionError, match=r"(?s)module 'gate' \(Gate\).*trace='auto'\) does.*add_leaf_module"):
        partitionify(model, 2, trace="always")
    pmodel = partitionify(model, 2)
    assert pmodel.untraced is None and pmodel.promoted_leaves == ["gate"]
    assert isinstance(pmodel.module, torch.fx.GraphModule)
    with torch.no_grad():
        assert torch.equal(pmodel(x), model(x))
    # the fix the refusal names gives the same model
    named = partitionify(model, 2, config=PartitionConfig().add_leaf_module("gate"), trace="always")
    assert named.state_dict().keys() == pmodel.state_dict().keys()


def test_an_untraced_model_refuses_per_example_subnetworks_and_the_fused_iterations_in_one_line() -> None:
    pmodel = partitionify(Branchy(), 3)
    with pytest.raises(PartitionArgumentError, match=r"per-example subnetworks .* runs untraced \(could not trace"):
        pmodel(torch.randn(4, 4), subnetwork=torch.tensor([1, 2, 3, 1]))
    chunks = split_into_chunks(30, pmodel.proportions)
    for keywords in ({"fused": True}, {"every_partition": True}):
        with pytest.raises(PartitionArgumentError, match=r"needs a model torch.fx traced.*fused=False"):
            TrainingSteps.create(pmodel, chunks, config=TrainConfig.recommended(**keywords))


def test_the_reason_a_model_runs_untraced_is_fx_s_failure_in_the_mode_it_was_given_in() -> None:
    """fx traces a model in training mode first; a detector given in eval mode is told what fails in eval mode, not
    torchvision's "targets should not be none when in training mode" (fx binds targets to its default, None)."""
    pmodel = partitionify(_tiny_detector().eval(), 2)
    reason = pmodel.untraced
    assert reason is not None and "training mode" not in reason, reason
    assert "generalized_rcnn.py:88 in forward: for img in images:" in reason.splitlines()[0]
    assert "TraceError: Proxy object cannot be iterated" in reason
    with pytest.raises(PartitionError, match="Proxy object cannot be iterated") as refused:
        partitionify(_tiny_detector().eval(), 2, trace="always")
    assert "training mode" not in str(refused.value)
    # in training mode, what fx reports there
    assert "targets should not be none" in partitionify(_tiny_detector().train(), 2).untraced
    # a model fx traces in the mode it was given in, but not in the other: the reason names that mode
    given_in_eval = partitionify(TracesInEvalOnly().eval(), 2)
    assert given_in_eval.untraced.startswith(
        "could not trace TracesInEvalOnly in training mode (it traces in eval mode, as given, but partitionify "
        "traces both, so that .train() and .eval() keep working): module '<root>'"
    )
    assert partitionify(TracesInEvalOnly().train(), 2).untraced.startswith("could not trace TracesInEvalOnly: ")


def test_export_onnx_of_a_detector_says_in_two_lines_that_it_cannot_and_what_exports_it(tmp_path, capfd) -> None:
    """torch.export cannot capture a torchvision detector: export_onnx says why in one line, without torch's
    terminal colours, never suggests dynamic_batch=False (which fails the same way), prints nothing of the partial
    graph torch.export prints on failing (840 lines for the tiny detector), and the route it names works."""
    import onnxruntime as ort

    torch.manual_seed(0)
    pmodel = partitionify(_tiny_detector().eval(), 2)
    images = [torch.rand(3, 32, 32)]
    for dynamic_batch in (True, False):
        with pytest.raises(PartitionError) as failed:
            export_onnx(pmodel, tmp_path / "detector.onnx", (images,), dynamic_batch=dynamic_batch)
        message = str(failed.value)
        assert "\x1b" not in message and "dynamic_batch" not in message, message
        what, route = message.splitlines()
        assert what.startswith("torch.onnx.export failed for FasterRCNN: GuardOnDataDependentSymNode: Could not guard ")
        assert what.endswith("(at torchvision/ops/boxes.py:103 in _batched_nms_coordinate_trick)"), what
        assert route.startswith("  FasterRCNN runs untraced (fx could not trace it) and export_onnx cannot export it")
        assert "torch.onnx.export(model, example_inputs, path, dynamo=False)" in route
        assert not (tmp_path / "detector.onnx").exists()
    printed = capfd.readouterr().err
    assert "def forward" not in printed and len(printed.splitlines()) < 20, printed[:2000]
    # the route the message names: the plain detector through torch's TorchScript exporter, checked in onnxruntime
    plain = export_subnetwork(pmodel).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation, torchvision's tracer warnings
        torch.onnx.export(plain, (images,), str(tmp_path / "plain.onnx"), dynamo=False)
    session = ort.InferenceSession(str(tmp_path / "plain.onnx"), providers=["CPUExecutionProvider"])
    boxes = session.run(None, {session.get_inputs()[0].name: images[0].numpy()})[0]
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(boxes), plain(images)[0]["boxes"], atol=1e-4)


class WithMixing(nn.Module):
    """Its second input's first dimension is not a batch: a dynamic batch ties it to the first's."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, mixing: torch.Tensor) -> torch.Tensor:
        return self.linear(mixing @ x)


def test_export_onnx_suggests_dynamic_batch_false_only_when_torch_export_refuses_the_batch_dimension(tmp_path) -> None:
    pmodel = partitionify(WithMixing(), 2)
    inputs = (torch.randn(4, 3), torch.randn(5, 4))
    with pytest.raises(PartitionError) as failed:
        export_onnx(pmodel, tmp_path / "m.onnx", inputs)
    assert str(failed.value) == (
        "torch.onnx.export failed for WithMixing: UserError: L['mixing'].size()[0] = 5 is not equal to "
        "L['x'].size()[0] = 4\n  The model fixes the batch size (or an input's first dimension is not a batch): "
        "dynamic_batch=False exports it for the example's batch size only."
    )
    assert export_onnx(pmodel, tmp_path / "m.onnx", inputs, dynamic_batch=False).exists()


def test_box_zoom_moves_boxes_with_the_image_and_passes_a_gradient_to_its_range() -> None:
    zoom = BoxZoom(init=0.3)
    image = torch.zeros(1, 32, 32)
    image[:, 12:20, 12:20] = 1.0  # an 8-pixel square at the centre
    boxes = torch.tensor([[12.0, 12.0, 20.0, 20.0], [0.0, 0.0, 3.0, 3.0]])
    target = {"boxes": boxes, "labels": torch.tensor([1, 2])}
    out, (moved,) = zoom.transform([image], [target], torch.tensor([1.0]))
    factor = float(torch.exp(torch.tensor(0.3)))
    assert torch.allclose(moved["boxes"][0], 16 + (boxes[0] - 16) * factor)
    ink = out[0][0] > 0.5  # the zoomed square lies inside its moved box
    _, cols = ink.nonzero().T
    assert moved["boxes"][0][0] - 1 <= cols.min() and cols.max() <= moved["boxes"][0][2]
    (grad,) = torch.autograd.grad(out[0].sum(), [zoom.range])
    assert float(grad) != 0
    _, (shrunk,) = zoom.transform([image], [target], torch.tensor([-1.0]))  # the corner box, zoomed out: 2.2 px
    assert shrunk["labels"].tolist() == [1, 2]
    _, (dropped,) = BoxZoom(init=0.3, min_size=2.5).transform([image], [target], torch.tensor([-1.0]))
    assert dropped["labels"].tolist() == [1] and dropped["boxes"].shape == (1, 4)
    zoom.eval()
    assert zoom([image], [target])[0][0] is image


def _detection_data(count: int) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        image = 0.2 * torch.rand(3, 48, 48, generator=g)
        x0, y0 = (torch.rand(2, generator=g) * 30).tolist()
        image[:, int(y0) : int(y0) + 12, int(x0) : int(x0) + 12] = 0.9
        out.append((image, {"boxes": torch.tensor([[x0, y0, x0 + 12, y0 + 12]]), "labels": torch.tensor([1])}))
    return out


def test_a_detector_trains_partitioned_on_its_own_losses_learning_a_zoom() -> None:
    """Faster R-CNN (untraced) in your own loop: parameter steps move one partition, hyperparameter steps the
    zoom range (scored by ModelLoss through subnetwork k-1 on chunk k), fine-tuning every partition; the final
    model exports to a plain FasterRCNN equal to subnetwork C in eval mode."""
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=2, min_size=48, max_size=48, box_score_thresh=0.0
    )
    pmodel = partitionify(model, 2, (0.7, 0.3))
    assert pmodel.untraced is not None
    data = _detection_data(20)
    zoom = BoxZoom(init=0.2)
    config = TrainConfig.recommended(steps=5, batch_size=2, hyper_batch_size=2, hyper_every=1, seed=0)
    chunks = split_into_chunks(len(data), pmodel.proportions, seed=0)
    steps = TrainingSteps.create(pmodel, chunks, hyper=zoom, likelihood=ModelLoss(), config=config)
    batches = PartitionedBatchSampler(chunks, config)
    loader = DataLoader(data, batch_sampler=batches, collate_fn=lambda b: tuple(map(list, zip(*b))))
    before = [p.detach().clone() for p in pmodel.partition_parameters(2)]
    draws = list(batches.draws())
    for draw, (images, targets) in zip(draws, loader, strict=True):
        steps.take(draw, images, targets)
    assert steps.step == 5 and steps.finetuning and len(steps.stepper.hyper_losses) >= 1
    assert float(zoom.range) != pytest.approx(0.2)
    trained_second = any(d.partitions == 2 for d in draws) or steps.finetuning
    assert trained_second and any(not torch.equal(a, b) for a, b in zip(before, pmodel.partition_parameters(2)))
    pmodel.eval()
    exported = export_subnetwork(pmodel).eval()
    images = [image for image, _ in data[:2]]
    with torch.no_grad():
        got, want = pmodel(images), exported(images)
    assert type(exported) is type(model)
    for a, b in zip(got, want):
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_model_loss_refuses_predictions_naming_the_fix() -> None:
    with pytest.raises(PartitionArgumentError, match=r"losses in training mode only \(model.train\(\)\)"):
        ModelLoss()([{"boxes": torch.zeros(0, 4)}], [{}])


def test_fit_refuses_a_model_loss_naming_your_own_loop() -> None:
    """fit reads (input, target) tensors; a detector's lists of images and target dicts go through your own loop."""
    from partition_fx.training import fit

    data = _detection_data(6)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(data)

        def __getitem__(self, i: int):
            return data[i]

    pmodel = partitionify(Branchy(), 2)
    with pytest.raises(PartitionArgumentError, match=r"ModelLoss\) trains in your own loop.*steps.take"):
        fit(pmodel, Pairs(), likelihood=ModelLoss(), steps=2, progress=False)
