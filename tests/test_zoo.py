"""Invariant 1 and 2 on real models: every subnetwork equals its export, and exports are plain.

Default run: ``zoo.DEFAULT_SUBSET``. Full sweep (every torchvision classifier, one model per timm
family, the shipped models): ``pytest -m zoo``; one variant of it: ``-k node-`` (node partitioning) or
``-k seed-`` (seed-regenerated defaults and layout indices).

Each model is run once (eval mode, autograd on) before it is converted, as a model that has been evaluated
would be: state a forward leaves behind (e.g. LeViT's attention-bias cache, tensors with a grad_fn) must
not stop or change a conversion.
"""

from __future__ import annotations

import pytest
import torch
from zoo import (
    DEFAULT_SUBSET,
    EXCLUDED,
    ONNX_SUBSET,
    SHIPPED,
    TIMM,
    TORCHVISION,
    TORCHVISION_TASKS,
    UNTRACED_TASKS,
    ZooModel,
    check_conversion,
)

from partition_fx import PartitionConfig, export_onnx, export_subnetwork, partitionify
from partition_fx.testing import assert_subnetworks_match_exports, max_relative_difference, perturb_partitions

ALL = TORCHVISION + TIMM + SHIPPED


def _params(models: list[ZooModel]) -> list[object]:
    out = []
    for spec in models:
        marks = [] if spec.id in DEFAULT_SUBSET else [pytest.mark.zoo]
        if spec.id in EXCLUDED:
            marks.append(pytest.mark.skip(reason=EXCLUDED[spec.id]))
        out.append(pytest.param(spec, id=spec.id, marks=marks))
    return out


def _evaluated(spec: ZooModel) -> torch.nn.Module:
    """The model in eval mode after one forward with autograd on (an ordinary evaluation)."""
    model = spec.build().eval()
    model(spec.example_input())
    return model


def _config(spec: ZooModel) -> PartitionConfig:
    config = PartitionConfig()
    for name in spec.leaf_modules:
        config.add_leaf_module(name)
    return config


# Conversion settings of the sweep's variants (scheme "random", default "init", stored index unless named).
VARIANTS = {
    "random": {},
    "node": {"scheme": "node"},
    "seed": {"default": "seed", "assignments": "regenerated"},
}
SEED_DEFAULT_SUBSET = {"timm:resnet18", "timm:vit_tiny_patch16_224", "timm:fixup_resnet14"}


def _variant_params(models: list[ZooModel], variant: str, default_subset: set[str]) -> list[object]:
    """A variant's sweep: behind the zoo marker except ``default_subset`` (``tests/test_node.py`` and
    ``tests/test_regenerate.py`` cover the variants by default)."""
    return [
        pytest.param(
            spec, variant, id=f"{variant}-{spec.id}", marks=[] if spec.id in default_subset else [pytest.mark.zoo]
        )
        for spec in models
        if spec.id not in EXCLUDED
    ]


@pytest.mark.parametrize(
    ("spec", "variant"),
    [pytest.param(p.values[0], "random", id=p.id, marks=p.marks) for p in _params(ALL)]
    + _variant_params(ALL, "node", set())
    + _variant_params(ALL, "seed", SEED_DEFAULT_SUBSET),
)
def test_subnetworks_equal_exports(spec: ZooModel, variant: str) -> None:
    model = _evaluated(spec)
    x = spec.example_input()
    pmodel = partitionify(
        model, num_partitions=3, proportions=(0.8, 0.1, 0.1), seed=0, config=_config(spec), **VARIANTS[variant]
    ).eval()
    with torch.no_grad():
        # Right after conversion every subnetwork is the original (default="seed": the re-initialised model).
        reference = model(x) if variant != "seed" else export_subnetwork(pmodel).eval()(x)
        for k in range(4):
            assert max_relative_difference(pmodel(x, subnetwork=k), reference) <= 1e-6, k
    perturb_partitions(pmodel, seed=0)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=1e-5)
    with torch.no_grad():  # the perturbation reached the model: subnetworks differ from the original
        assert max_relative_difference(pmodel(x), reference) > 1e-6
    exported = export_subnetwork(pmodel)
    assert type(exported) is type(model)
    got, want = exported.state_dict(), model.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key


@pytest.mark.parametrize("spec", _params([m for m in ALL if m.id in ONNX_SUBSET]))
def test_onnx_round_trip(spec: ZooModel, tmp_path) -> None:
    model = _evaluated(spec)
    pmodel = partitionify(model, num_partitions=3, proportions=(0.8, 0.1, 0.1), config=_config(spec)).eval()
    perturb_partitions(pmodel, seed=1)
    x = spec.example_input(batch=2)
    path = export_onnx(pmodel, tmp_path / "model.onnx", (x,), subnetwork=2)
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x3 = spec.example_input(batch=3)  # another batch size: the batch axis is dynamic
    (out,) = session.run(None, {session.get_inputs()[0].name: x3.numpy()})
    with torch.no_grad():
        want = export_subnetwork(pmodel, 2).eval()(x3)
    assert max_relative_difference(torch.from_numpy(out), want) <= 1e-4


@pytest.mark.parametrize("spec", _params(TORCHVISION_TASKS))
def test_every_torchvision_family_converts_traced_or_not(spec: ZooModel) -> None:
    """Detection, segmentation, video, optical flow and quantizable models (``zoo.check_conversion``); detection
    and optical flow run untraced (their forward branches on its inputs), the others traced."""
    path = check_conversion(spec)
    assert path == ("untraced" if spec.task in UNTRACED_TASKS else "traced")
