"""Conversion against its definition: subnetworks vs exports, gradients, ties, modes, round trips.

A subnetwork's forward and its export read the same effective tensors (``FlatGroup.flat_value``), so their
equality alone shows consistency, not the definition: a ``flat_value`` giving subnetwork k the partitions
1..k-1 passed all of ``test_subnetworks_match_exports_in_both_modes``. The definition is checked entry by entry
in ``test_subnetwork_k_mixes_trained_and_default_entries_as_defined`` (and test_random_architectures'
``test_subnetwork_tensors_follow_the_definition``), and ``assert_subnetworks_match_exports`` now also checks
every exported tensor against the parts, defaults and layout.
"""

from __future__ import annotations

import io

import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_for_tests import (
    Branchy,
    ConvBN,
    DataDependent,
    FunctionalWeights,
    SharedSubmodule,
    TiedLM,
    TrainingDependentRoot,
    mlp,
)
from safetensors.torch import load_file, save_file
from torch import nn

from partition_fx import (
    PartitionConfig,
    PartitionError,
    RandomPartitionedTensor,
    ScalePartitionedTensor,
    export_subnetwork,
    partitionify,
)
from partition_fx.fx.assign import partition_sizes
from partition_fx.testing import assert_subnetworks_match_exports, max_relative_difference, perturb_partitions


def _all_subnetworks_equal_original(model: nn.Module, pmodel, inputs) -> None:
    with torch.no_grad():
        want = model(*inputs)
        for k in range(pmodel.num_partitions + 1):
            got = pmodel(*inputs, subnetwork=k)
            assert max_relative_difference(got, want) == 0.0, k


@pytest.mark.parametrize(
    ("factory", "inputs"),
    [
        (lambda: mlp([4, 16, 16, 3]), lambda: (torch.randn(5, 4),)),
        (TiedLM, lambda: (torch.randint(0, 11, (3, 7)),)),
        (FunctionalWeights, lambda: (torch.randn(5, 4),)),
        (ConvBN, lambda: (torch.randn(2, 3, 6, 6),)),
    ],
    ids=["mlp", "tied", "functional", "convbn"],
)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_subnetworks_match_exports_in_both_modes(factory, inputs, mode) -> None:
    """Forward equals export (consistency), and through ``assert_subnetworks_match_exports`` each exported
    tensor is subnetwork k's by the definition: without that check a ``flat_value`` giving subnetwork k the
    partitions 1..k-1 passed all 8 cases."""
    torch.manual_seed(0)
    model = factory().train(mode == "train")
    x = inputs()
    pmodel = partitionify(model, 4, (0.4, 0.3, 0.2, 0.1), seed=3).train(mode == "train")
    _all_subnetworks_equal_original(model, pmodel, x)
    perturb_partitions(pmodel, seed=1)
    assert_subnetworks_match_exports(pmodel, x)


def test_default_zero_subnetwork0_uses_zero_weights_and_identity_scales() -> None:
    model = ConvBN()
    pmodel = partitionify(model, 3, default="zero")
    state = export_subnetwork(pmodel, 0).state_dict()
    for name in ("conv.weight", "conv.bias", "fc.weight", "fc.bias"):
        assert torch.count_nonzero(state[name]) == 0, name
    assert torch.equal(state["bn.weight"], torch.ones(8)) and torch.equal(state["bn.bias"], torch.zeros(8))
    # partitions 1..k carry the values at conversion: the final subnetwork is still the original
    _ = [
        torch.testing.assert_close(export_subnetwork(pmodel).state_dict()[k], v) for k, v in model.state_dict().items()
    ]


def test_the_export_check_catches_a_subnetwork_consistently_wrong_in_forward_and_export(monkeypatch) -> None:
    """``assert_subnetworks_match_exports`` checks each exported tensor against the definition, not only the
    forward against the export: with ``flat_value`` giving subnetwork k the partitions 1..k-1 (both wrong
    alike) the outputs agree, and the helper must still refuse."""
    from partition_fx.fx.flat import FlatGroup

    torch.manual_seed(0)
    pmodel = partitionify(ConvBN(), 3, (0.5, 0.3, 0.2), seed=3).eval()
    perturb_partitions(pmodel, seed=1)
    x = torch.randn(2, 3, 6, 6)
    assert_subnetworks_match_exports(pmodel, (x,))
    flat_value = FlatGroup.flat_value
    monkeypatch.setattr(FlatGroup, "flat_value", lambda self, k: flat_value(self, max(k - 1, 0)))
    with torch.no_grad():
        assert max_relative_difference(pmodel(x, subnetwork=2), export_subnetwork(pmodel, 2)(x)) == 0.0
    with pytest.raises(AssertionError, match=r"subnetwork 1 of ConvBN: .* not subnetwork 1's by the definition"):
        assert_subnetworks_match_exports(pmodel, (x,))


def test_subnetwork_k_mixes_trained_and_default_entries_as_defined() -> None:
    torch.manual_seed(0)
    model = nn.Linear(7, 9)
    pmodel = partitionify(model, 3, (0.5, 0.3, 0.2), default="zero")
    perturb_partitions(pmodel, seed=2)
    pt = dict(pmodel.partitioned_tensors())["weight"]
    assert isinstance(pt, RandomPartitionedTensor)
    assignment = torch.empty(63, dtype=torch.long)
    offsets = [0, *torch.tensor(pt.partition_sizes()).cumsum(0).tolist()]
    index = pt.layout_index()
    for k in range(3):  # which partition each flat entry belongs to, recovered from the index
        assignment[(index >= offsets[k]) & (index < offsets[k + 1])] = k + 1
    full = torch.cat([p.detach() for p in pt.parts()])[index.long()].view(9, 7)
    for k in range(4):
        want = torch.where(assignment.view(9, 7) <= k, full, torch.zeros(()))
        assert torch.equal(export_subnetwork(pmodel, k).weight, want)
    assert pt.partition_sizes() == partition_sizes(63, (0.5, 0.3, 0.2))


def test_scale_tensors_use_product_and_sum_of_partitions() -> None:
    model = ConvBN()
    pmodel = partitionify(model, 3)
    tensors = dict(pmodel.partitioned_tensors())
    w, b = tensors["bn.weight"], tensors["bn.bias"]
    assert isinstance(w, ScalePartitionedTensor) and (w.kind, b.kind) == ("product", "sum")
    perturb_partitions(pmodel, seed=0)
    for k in range(1, 4):
        state = export_subnetwork(pmodel, k).state_dict()
        torch.testing.assert_close(state["bn.weight"], torch.stack([w.part(i) for i in range(1, k + 1)]).prod(0))
        torch.testing.assert_close(state["bn.bias"], torch.stack([b.part(i) for i in range(1, k + 1)]).sum(0))
    assert torch.equal(export_subnetwork(pmodel, 0).bn.weight, model.bn.weight)


def test_fixup_scalars_are_detected_from_their_use() -> None:
    pmodel = partitionify(FunctionalWeights(), 2)
    kinds = {name: pt.kind for name, pt in pmodel.partitioned_tensors()}
    assert kinds == {
        "weight": "random",
        "bias": "random",
        "pos": "random",
        "gain": "product",
        "shared.weight": "random",
        "shared.bias": "random",
    }


def test_partition_parameters_cover_every_trainable_tensor_once() -> None:
    model = TiedLM()
    pmodel = partitionify(model, 3, config=PartitionConfig().set_name("norm.bias", partition=False))
    seen = [id(p) for k in range(1, 4) for p in pmodel.partition_parameters(k)]
    trainable = [id(p) for p in pmodel.parameters() if p.requires_grad and p.numel() > 0]
    assert sorted(seen) == sorted(trainable) and len(seen) == len(set(seen))
    assert any(p is pmodel.module.norm.bias for p in pmodel.partition_parameters(1))  # shared -> partition 1


def test_every_part_of_a_trainable_tensor_is_trainable() -> None:
    model = FunctionalWeights()
    model.bias.requires_grad_(False)
    pmodel = partitionify(model, 3, config=PartitionConfig().set_name("bias", partition=True))
    for name, pt in pmodel.partitioned_tensors():
        assert all(p.requires_grad == (name != "bias") for p in pt.parts()), name
    assert {type(pt).__name__ for _, pt in pmodel.partitioned_tensors()} == {
        "RandomPartitionedTensor",
        "ScalePartitionedTensor",
    }


def test_gradients_reach_only_partitions_the_subnetwork_uses() -> None:
    torch.manual_seed(0)
    pmodel = partitionify(ConvBN(), 3)
    # flat storage: one parameter per group (conv and fc weights and biases; BN scales; BN shifts)
    assert len(pmodel.partition_parameters(2)) == 3
    assert not pmodel(torch.randn(2, 3, 5, 5), subnetwork=0).requires_grad  # all defaults: nothing to train
    tensors = dict(pmodel.partitioned_tensors())
    assert len(tensors) == 6
    for k in range(1, 4):
        pmodel.zero_grad(set_to_none=True)
        pmodel(torch.randn(2, 3, 5, 5), subnetwork=k).square().sum().backward()
        for i in range(1, 4):
            for p in pmodel.partition_parameters(i):
                assert (p.grad is not None) == (i <= k), (k, i)
            for name, pt in tensors.items():
                assert (pt.part_grad(i) is not None) == (i <= k), (k, i, name)


def test_tied_weights_stay_tied_in_model_and_export() -> None:
    model = TiedLM()
    pmodel = partitionify(model, 3)
    names = [name for name, _ in pmodel.partitioned_tensors()]
    assert "embed.weight" in names and "head.weight" not in names  # one tensor, two names
    perturb_partitions(pmodel)
    exported = export_subnetwork(pmodel)
    assert exported.head.weight is exported.embed.weight
    assert list(exported.state_dict()) == list(model.state_dict())


def test_repr_and_describe_work() -> None:
    pmodel = partitionify(ConvBN(), 3)
    text = repr(pmodel)
    assert "Conv2d(3, 8, kernel_size=(3, 3)" in text and "RandomPartitionedTensor(shape=(8, 3, 3, 3)" in text
    assert "Linear(in_features=8, out_features=4, bias=True)" in text


def test_submodule_shared_under_many_paths_exports_every_tensor_in_place() -> None:
    torch.manual_seed(0)
    model = SharedSubmodule()
    pmodel = partitionify(model, 3)
    assert len(list(pmodel.partitioned_tensors())) == 4 + 8  # shared Linear and LayerNorm (w, b each), 8 own
    perturb_partitions(pmodel)
    exported = export_subnetwork(pmodel, 2)
    for name, p in model.named_parameters(remove_duplicate=False):
        assert exported.get_parameter(name).shape == p.shape, name
    assert all(block.shared is exported.shared for block in exported.blocks)
    assert_subnetworks_match_exports(pmodel, (torch.randn(3, 6),))


def test_conversion_does_not_modify_the_model() -> None:
    model = ConvBN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    pmodel = partitionify(model, 3).train()
    perturb_partitions(pmodel)
    pmodel(torch.randn(4, 3, 5, 5)).sum().backward()  # also updates the pmodel's BN statistics
    assert list(model.parameters()) == params and all(p.grad is None for p in params)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_deepcopy_is_independent_and_equivalent() -> None:
    import copy

    torch.manual_seed(0)
    pmodel = partitionify(TiedLM(), 3)
    perturb_partitions(pmodel)
    clone = copy.deepcopy(pmodel)
    x = torch.randint(0, 11, (2, 5))
    for k in range(4):
        assert torch.equal(clone(x, subnetwork=k), pmodel(x, subnetwork=k))
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(1.0)
    assert not torch.equal(clone(x), pmodel(x))
    assert_subnetworks_match_exports(clone, (x,))  # the clone's records point at the clone's tensors


def test_export_is_a_copy() -> None:
    pmodel = partitionify(nn.Linear(3, 3), 2)
    exported = export_subnetwork(pmodel)
    with torch.no_grad():
        for p in pmodel.parameters():
            p.add_(1.0)
    assert not torch.equal(exported.weight, export_subnetwork(pmodel).weight)


def test_train_eval_switch_survives_conversion() -> None:
    torch.manual_seed(0)
    model = ConvBN(dropout=0.5)
    pmodel = partitionify(model, 2)
    x = torch.randn(8, 3, 5, 5)
    pmodel.train()
    assert not torch.equal(pmodel(x), pmodel(x))  # dropout active
    bn = pmodel.module.bn
    mean_before = bn.running_mean.clone()
    pmodel(x)
    assert not torch.equal(bn.running_mean, mean_before)  # BatchNorm updates statistics
    pmodel.eval()
    mean_eval = bn.running_mean.clone()
    assert torch.equal(pmodel(x), pmodel(x)) and torch.equal(bn.running_mean, mean_eval)


def test_train_mode_batchnorm_statistics_match_export() -> None:
    torch.manual_seed(0)
    pmodel = partitionify(ConvBN(), 3).train()
    perturb_partitions(pmodel)
    x = torch.randn(6, 3, 5, 5)
    exported = export_subnetwork(pmodel, 2).train()
    torch.testing.assert_close(pmodel(x, subnetwork=2), exported(x), rtol=0, atol=0)
    torch.testing.assert_close(pmodel.module.bn.running_var, exported.bn.running_var, rtol=0, atol=0)


def test_root_forward_depending_on_training_is_kept() -> None:
    torch.manual_seed(0)
    model = TrainingDependentRoot()
    pmodel = partitionify(model, 3)
    assert pmodel.promoted_leaves == [""]
    perturb_partitions(pmodel)
    x = torch.randn(4, 3)
    pmodel.train()
    assert isinstance(pmodel(x), tuple)
    pmodel.eval()
    assert isinstance(pmodel(x), torch.Tensor)
    for mode in (True, False):
        pmodel.train(mode)
        assert_subnetworks_match_exports(pmodel, (x,))
    assert "<whole model>" in pmodel.describe()


def test_data_dependent_control_flow_is_called_whole_or_with_trace_always_a_clear_error_with_a_way_out() -> None:
    with pytest.raises(PartitionError) as info:
        partitionify(DataDependent(), 3, trace="always")
    message = str(info.value)
    assert "'inner' (Branchy)" in message and "add_leaf_module(Branchy)" in message
    assert "x.sum() > 0" in message
    pmodel = partitionify(DataDependent(), 3)  # trace="auto": the module fx cannot trace is called whole
    assert pmodel.promoted_leaves == ["inner"] and pmodel.untraced is None
    perturb_partitions(pmodel)
    for sign in (1, -1):
        assert_subnetworks_match_exports(pmodel, (sign * torch.ones(2, 3),))
    pmodel = partitionify(DataDependent(), 3, config=PartitionConfig().add_leaf_module(Branchy))
    perturb_partitions(pmodel)
    for sign in (1, -1):
        assert_subnetworks_match_exports(pmodel, (sign * torch.ones(2, 3),))
    pmodel = partitionify(DataDependent(), 3, config=PartitionConfig().add_leaf_module("inner"))
    assert_subnetworks_match_exports(pmodel, (torch.ones(2, 3),))


def test_frozen_parameters_stay_frozen_and_unpartitioned() -> None:
    model = ConvBN()
    model.conv.weight.requires_grad_(False)
    pmodel = partitionify(model, 3)
    assert "conv.weight" not in dict(pmodel.partitioned_tensors())
    assert pmodel.module.conv.weight.requires_grad is False
    assert "frozen" in pmodel.describe()
    assert all(p is not pmodel.module.conv.weight for k in (1, 2, 3) for p in pmodel.partition_parameters(k))


def test_config_precedence() -> None:
    config = (
        PartitionConfig()
        .set_module_type(nn.Linear, default="zero")
        .set_module_type(nn.Module, default="init", kind="random")
        .set_name_regex(r"fc\..*", kind="random")
        .set_name("fc.bias", partition=False)
    )
    model = ConvBN()
    rule = config.rule_for("fc.weight", model.fc)
    assert (rule.default, rule.kind, rule.partition) == ("zero", "random", None)
    assert config.rule_for("fc.bias", model.fc).partition is False
    assert config.rule_for("bn.weight", model.bn).kind == "random"  # set by the nn.Module type rule
    pmodel = partitionify(model, 3, config=config)
    tensors = dict(pmodel.partitioned_tensors())
    assert "fc.bias" not in tensors and tensors["fc.weight"].default_mode == "zero"
    assert tensors["bn.weight"].kind == "random" and tensors["conv.weight"].default_mode == "init"


def test_describe_reports_sizes_kinds_and_reasons() -> None:
    model = ConvBN()
    model.conv.bias.requires_grad_(False)
    text = partitionify(model, 3, (0.8, 0.1, 0.1), config=PartitionConfig().set_name("fc", partition=False)).describe()
    assert "conv.weight" in text and "173" in text and "22" in text  # 216 entries -> 173/22/21
    assert "product" in text and "sum" in text and "shared" in text and "frozen" in text
    assert "buffers (not partitioned; shared by every subnetwork): 3 tensors, 17 entries" in text


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_state_dict_round_trips_exactly(fmt, tmp_path) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    pmodel = partitionify(model, 3, seed=5)
    perturb_partitions(pmodel, seed=9)
    state = pmodel.state_dict()
    if fmt == "safetensors":
        save_file(state, tmp_path / "p.safetensors")
        loaded = load_file(tmp_path / "p.safetensors")
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
    fresh = partitionify(TiedLM(), 3, seed=5)
    fresh.load_state_dict(loaded)
    x = torch.randint(0, 11, (2, 5))
    for k in range(4):
        assert torch.equal(fresh(x, subnetwork=k), pmodel(x, subnetwork=k))
    assert all(torch.equal(fresh.state_dict()[key], value) for key, value in state.items())


def test_pretrained_timm_model_from_a_local_file(tmp_path) -> None:
    import timm
    from safetensors.torch import save_file as save

    torch.manual_seed(0)
    source = timm.create_model("resnet18", num_classes=7)
    save(source.state_dict(), tmp_path / "resnet18.safetensors")
    # num_classes in the overlay too, or timm re-initialises a classifier whose size differs from its cfg
    overlay = dict(file=str(tmp_path / "resnet18.safetensors"), num_classes=7)
    model = timm.create_model("resnet18", pretrained=True, num_classes=7, pretrained_cfg_overlay=overlay).eval()
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1)).eval()
    x = torch.randn(2, 3, 32, 32)
    _all_subnetworks_equal_original(model, pmodel, (x,))
    exported = export_subnetwork(pmodel)
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(exported(x), model(x))


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=2, max_size=4),
    c=st.integers(1, 5),
    raw=st.lists(st.floats(0.05, 1.0), min_size=5, max_size=5),
    seed=st.integers(0, 2**31),
    default=st.sampled_from(["init", "zero"]),
)
def test_random_mlps_match_exports_and_proportions(sizes, c, raw, seed, default) -> None:
    props = tuple(r / sum(raw[:c]) for r in raw[:c])
    model = mlp(sizes)
    pmodel = partitionify(model, c, props, seed=seed, default=default)
    for name, pt in pmodel.partitioned_tensors():
        assert pt.partition_sizes() == partition_sizes(model.get_parameter(name).numel(), props)
    perturb_partitions(pmodel, seed=seed % 1000)
    assert_subnetworks_match_exports(pmodel, (torch.randn(3, sizes[0]),))


def test_timm_drop_path_still_switches_with_train_and_eval() -> None:
    import timm

    torch.manual_seed(0)
    # zero_init_last=False: with timm's zero-initialised block outputs, drop-path would change nothing
    model = timm.create_model("resnet18", num_classes=3, drop_path_rate=0.5, zero_init_last=False)
    pmodel = partitionify(model, 2)
    assert any("drop_path" in name for name in pmodel.promoted_leaves)
    x = torch.randn(2, 3, 32, 32)
    pmodel.train()
    with torch.no_grad():
        assert not torch.equal(pmodel(x), pmodel(x))  # stochastic depth active in training
    pmodel.eval()
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,))


def test_training_forward_leaves_the_module_tree_intact():
    """Regression: an effective tensor that was a Parameter got registered in the leaf by functional_call,
    leaving meta stand-ins as parameters after the call (``.to()`` then failed)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    pmodel = partitionify(model, 3).train()
    names = sorted(n for n, _ in pmodel.named_parameters())
    for k in range(4):
        out = pmodel(torch.randn(2, 1, 5, 5), subnetwork=k)
        if out.requires_grad:
            out.sum().backward()
    assert sorted(n for n, _ in pmodel.named_parameters()) == names
    assert not any(t.is_meta for t in [*pmodel.parameters(), *pmodel.buffers()])
    pmodel.to("cpu")


def test_partitionify_keeps_the_mode_it_is_given_submodules_included() -> None:
    """fx's GraphModule keeps the root's training flag; so does partitionify, and every module's own: a model
    converted for inference is in eval mode and, with default "init", its final subnetwork is the model."""
    import torchvision

    resnet = timm.create_model("resnet18", num_classes=10).eval()
    deeplab = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    for model, x in ((resnet, torch.randn(2, 3, 32, 32)), (deeplab, torch.randn(1, 3, 64, 64))):
        pmodel = partitionify(model, 3)
        assert not pmodel.training and not any(m.training for m in pmodel.modules())
        with torch.no_grad():
            got, want = pmodel(x), model(x)
        assert torch.equal(got["out"], want["out"]) if isinstance(got, dict) else torch.equal(got, want)
        assert not export_subnetwork(pmodel).training
    resnet.train()
    resnet.layer1.eval()  # a mixed model: each module keeps its own mode
    modes = dict(partitionify(resnet, 3).module.named_modules())
    assert modes["layer1"].training is False and modes["layer1.0.bn1"].training is False
    assert modes["layer2.0.bn1"].training is True and partitionify(resnet, 3).training is True
