"""Models torch.fx cannot trace (``partitionify(trace=...)``): run untraced, their own forward fed each
subnetwork's tensors; what that path refuses; and training such a model on its own losses (a detector, with a
zoom of its images and boxes learned). Every torchvision family's models: tests/test_zoo.py."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader

from partition_fx import PartitionConfig, export_subnetwork, partitionify
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
