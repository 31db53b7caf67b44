"""Models that do unusual things: each converts exactly (checked against the original and against its
exported subnetworks) or is refused with a message naming the module and the way out."""

from __future__ import annotations

import copy
import itertools
import shutil
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_for_tests import (
    ConvBN,
    FunctionalWeights,
    InPlaceOps,
    MixedPrecision,
    SharedSubmodule,
    TiedLM,
    WeightClipping,
)
from safetensors.torch import load, save
from torch import nn
from torch.nn.utils import parametrizations

from partition_fx import PartitionConfig, PartitionedModel, PartitionError, export_subnetwork, partitionify
from partition_fx.errors import PartitionCheckpointError
from partition_fx.fx.regenerated import scatter_by_membership
from partition_fx.testing import assert_subnetworks_match_exports, perturb_partitions


def _weight_normed() -> nn.Module:
    return nn.Sequential(parametrizations.weight_norm(nn.Linear(4, 6)), nn.ReLU(), nn.Linear(6, 3))


ODD_MODELS = {
    "tied": (TiedLM, lambda: torch.randint(0, 11, (3, 7))),
    "in_place_ops": (InPlaceOps, lambda: torch.randn(5, 4)),
    "functional_weights_and_a_module_called_twice": (FunctionalWeights, lambda: torch.randn(5, 4)),
    "submodule_shared_under_many_paths": (SharedSubmodule, lambda: torch.randn(3, 6)),
    "parametrized_weight_norm": (_weight_normed, lambda: torch.randn(5, 4)),
    "float64_head_on_float32_body": (MixedPrecision, lambda: torch.randn(5, 4)),
}


@pytest.mark.parametrize("name", list(ODD_MODELS))
@pytest.mark.parametrize("scheme", ["random", "node"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_odd_models_convert_exactly(name, scheme, mode) -> None:
    """Definition: every subnetwork equals the original at conversion, equals its export after training
    moved the partitions, and sends gradients to partitions 1..k only."""
    factory, inputs = ODD_MODELS[name]
    torch.manual_seed(0)
    model = factory().train(mode == "train")
    x = inputs()
    pmodel = partitionify(model, 3, (0.5, 0.3, 0.2), scheme=scheme, seed=1).train(mode == "train")
    with torch.no_grad():
        want = model(x)
        for k in range(4):
            assert torch.equal(pmodel(x, subnetwork=k), want), k
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,))
    pmodel(x, subnetwork=2).float().square().sum().backward()
    for i in (1, 2, 3):
        for part in pmodel.partition_parameters(i):
            assert (part.grad is not None) == (i <= 2), (i, part.shape)


def test_spectral_norm_in_eval_mode() -> None:
    """Spectral norm's power iteration updates buffers in every training forward, so its check is in eval."""
    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(4, 6)), nn.ReLU(), nn.Linear(6, 3)).eval()
    pmodel = partitionify(model, 3).eval()
    assert "0.parametrizations.weight.original" in dict(pmodel.partitioned_tensors())
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (torch.randn(5, 4),))


def test_frozen_parameters_stay_frozen_and_are_partitioned_only_when_asked() -> None:
    model = ConvBN()
    model.conv.requires_grad_(False)
    x = torch.randn(2, 3, 5, 5)
    kept = partitionify(model, 3)
    assert not any(name.startswith("conv.") for name, _ in kept.partitioned_tensors())
    kept(x, subnetwork=3).sum().backward()
    assert kept.module.conv.weight.grad is None and not kept.module.conv.weight.requires_grad

    asked = partitionify(model, 3, config=PartitionConfig().set_name("conv.weight", partition=True))
    tensors = dict(asked.partitioned_tensors())
    assert "conv.weight" in tensors and "conv.bias" not in tensors
    assert "frozen, partitioned by config" in asked.describe()
    asked(x, subnetwork=3).sum().backward()
    weight = tensors["conv.weight"]
    assert all(not part.requires_grad for part in weight.parts())
    assert all(weight.part_grad(k) is None for k in (1, 2, 3))
    for k in (1, 2, 3):  # unfreezing the parts' storage trains them per partition
        weight.storage(k).requires_grad_(True)
    asked.zero_grad()
    asked(x, subnetwork=2).sum().backward()
    assert [weight.part_grad(k) is not None for k in (1, 2, 3)] == [True, True, False]
    perturb_partitions(asked)
    assert_subnetworks_match_exports(asked, (x,))
    assert not export_subnetwork(asked).conv.weight.requires_grad  # the export keeps the original's flags


def _conv_ln(dtype: torch.dtype) -> nn.Module:
    # 64x64 weights: large enough for regenerated layouts (no stored index)
    return nn.Sequential(
        nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 5),
    ).to(dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("default", ["init", "zero", "seed"])
@pytest.mark.parametrize("assignments", ["stored", "regenerated"])
def test_half_precision_models_stay_in_their_dtype_and_match_exports(dtype, default, assignments) -> None:
    torch.manual_seed(0)
    model = _conv_ln(dtype).eval()
    pmodel = partitionify(model, 3, (0.5, 0.3, 0.2), default=default, assignments=assignments).eval()
    assert all(p.dtype == dtype for p in pmodel.parameters())
    x = torch.randn(2, 3, 6, 6, dtype=dtype)
    if default == "init":
        with torch.no_grad():
            assert all(torch.equal(pmodel(x, subnetwork=k), model(x)) for k in range(4))
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=0.0)
    exported = export_subnetwork(pmodel, 1)
    assert {k: v.dtype for k, v in exported.state_dict().items()} == {k: v.dtype for k, v in model.state_dict().items()}
    pmodel.train()(x, subnetwork=2).float().sum().backward()
    assert all(p.grad.dtype == dtype for p in pmodel.partition_parameters(1))


@pytest.mark.parametrize("default", ["init", "zero", "seed"])
def test_casting_after_conversion_commutes_with_export_and_survives_a_state_dict(default) -> None:
    """Definition: ``export(pmodel.to(dtype), k) == export(pmodel, k).to(dtype)``, and a cast model's state
    dict loads back to the same subnetworks (seed defaults: the moments must not be rounded by the cast).
    Exact where an effective tensor selects entries; product/sum scales of k >= 2 combine their parts in
    the new dtype, so they agree to its rounding."""
    torch.manual_seed(0)
    model = _conv_ln(torch.float32).eval()
    pmodel = partitionify(model, 3, default=default, assignments="regenerated")
    perturb_partitions(pmodel)
    scales = {name for name, pt in pmodel.partitioned_tensors() if pt.kind in ("product", "sum")}
    half = copy.deepcopy(pmodel).to(torch.bfloat16)
    for k in range(4):
        want = export_subnetwork(pmodel, k).to(torch.bfloat16).state_dict()
        got = export_subnetwork(half, k).state_dict()
        for key, value in want.items():
            if key in scales and k >= 2:
                torch.testing.assert_close(got[key], value, rtol=2**-6, atol=2**-6 * float(value.abs().max()))
            else:
                assert torch.equal(got[key], value), (k, key)
    fresh = partitionify(model, 3, default=default, assignments="regenerated").to(torch.bfloat16)
    fresh.load_state_dict(load(save(half.state_dict())))
    x = torch.randn(2, 3, 6, 6, dtype=torch.bfloat16)
    with torch.no_grad():
        assert all(torch.equal(fresh.eval()(x, subnetwork=k), half.eval()(x, subnetwork=k)) for k in range(4))


def test_a_state_dict_with_float_moments_is_refused() -> None:
    """An earlier development version stored the moments as floats: loading them into the int64 bits would
    truncate them to integers (silently wrong regenerated defaults), so such a state is refused, naming it."""
    pmodel = partitionify(nn.Sequential(nn.Linear(64, 64)), 3, default="seed")
    state = pmodel.state_dict()
    key = next(k for k in state if k.endswith("moments"))
    old = state[key].view(torch.float64).float()
    fresh = partitionify(nn.Sequential(nn.Linear(64, 64)), 3, default="seed", seed=7)
    with pytest.raises(PartitionCheckpointError, match=rf"entry {key} was written by an earlier development version"):
        fresh.load_state_dict({**state, key: old})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("assignments", ["stored", "regenerated"])
def test_a_model_already_on_the_gpu_converts_there_with_the_cpu_layout(assignments) -> None:
    torch.manual_seed(0)
    model = _conv_ln(torch.float32).eval()
    on_cpu = partitionify(model, 3, default="seed", assignments=assignments)
    on_gpu = partitionify(copy.deepcopy(model).cuda(), 3, default="seed", assignments=assignments)
    assert all(t.is_cuda for t in [*on_gpu.parameters(), *on_gpu.buffers()])
    for k in range(4):  # integer layouts and regenerated defaults: bit-identical across devices
        cpu_state, gpu_state = export_subnetwork(on_cpu, k).state_dict(), export_subnetwork(on_gpu, k).state_dict()
        assert all(torch.equal(gpu_state[key].cpu(), value) for key, value in cpu_state.items()), k
    perturb_partitions(on_gpu)
    assert_subnetworks_match_exports(on_gpu.eval(), (torch.randn(2, 3, 6, 6, device="cuda"),))


@pytest.mark.parametrize(("assignments", "default"), [("stored", "init"), ("regenerated", "seed")])
def test_torch_compile_after_conversion_is_one_graph_with_the_eager_values(assignments, default) -> None:
    """Definition: the eager model. One graph: no graph break in forward or in the regenerated backward."""
    torch.manual_seed(0)
    pmodel = partitionify(_conv_ln(torch.float32), 3, (0.5, 0.3, 0.2), assignments=assignments, default=default)
    perturb_partitions(pmodel)
    eager = copy.deepcopy(pmodel).train()
    pmodel.train()
    x = torch.randn(4, 3, 8, 8)
    torch._dynamo.reset()
    assert torch._dynamo.explain(pmodel)(x, subnetwork=2).graph_break_count == 0
    compiled = torch.compile(pmodel, backend="aot_eager", fullgraph=True)
    for k in (1, 3):
        got, want = compiled(x, subnetwork=k), eager(x, subnetwork=k)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        got.square().sum().backward()
        want.square().sum().backward()
    for (name, p), q in zip(pmodel.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="inductor on CPU needs a C compiler")
def test_torch_compile_with_inductor_matches_eager() -> None:
    torch.manual_seed(0)
    pmodel = partitionify(_conv_ln(torch.float32), 3, assignments="regenerated", default="seed").train()
    perturb_partitions(pmodel)
    eager = copy.deepcopy(pmodel)
    compiled = torch.compile(pmodel, fullgraph=True)
    x = torch.randn(4, 3, 8, 8)
    got, want = compiled(x, subnetwork=2), eager(x, subnetwork=2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    for p, q in zip(pmodel.partition_parameters(2), eager.partition_parameters(2)):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(1, 300),
    c=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    compiling=st.booleans(),
)
def test_scatter_by_membership_places_and_selects_by_partition(numel, c, seed, compiling) -> None:
    """Definition: masked_scatter / masked_select per partition. Both ways of finding a partition's positions
    (nonzero on CPU; nonzero_static with the known size elsewhere and under torch.compile) agree with it."""
    generator = torch.Generator().manual_seed(seed)
    membership = torch.randint(0, c, (numel,), generator=generator, dtype=torch.uint8)
    sizes = [int((membership == p).sum()) for p in range(c)]
    owner = SimpleNamespace(membership=lambda: membership, offsets=[0, *itertools.accumulate(sizes)])
    given_sources = max(1, c - seed % 2)  # with and without zero-filled partitions
    sources = [torch.randn(n, generator=generator, requires_grad=True) for n in sizes[:given_sources]]
    want = torch.zeros(numel)
    for p, source in enumerate(sources):
        want.masked_scatter_(membership == p, source.detach())
    weight = torch.randn(numel, generator=generator)
    with mock.patch.object(torch.compiler, "is_compiling", lambda: compiling):
        got = scatter_by_membership(owner, sources)
        grads = torch.autograd.grad((got * weight).sum(), sources)
    assert torch.equal(got, want)
    for p, grad in enumerate(grads):
        assert torch.equal(grad, weight.masked_select(membership == p))


class _ClippedLinear(nn.Linear):
    """A subclass is traced (not a leaf), so its in-place update is found."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.data.clamp_(-0.1, 0.1)
        return super().forward(x)


def _lazy() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(5), nn.ReLU(), nn.Linear(5, 2))


def _old_weight_norm() -> nn.Module:
    with pytest.warns(FutureWarning):
        return nn.Sequential(torch.nn.utils.weight_norm(nn.Linear(4, 5)), nn.ReLU(), nn.Linear(5, 2))


def _scripted() -> nn.Module:
    with pytest.warns(FutureWarning):
        return torch.jit.script(nn.Sequential(nn.Linear(4, 5), nn.ReLU()))


@pytest.mark.parametrize(
    ("factory", "fragments"),
    [
        (
            WeightClipping,
            ["module '<root>' (WeightClipping)", "'fc.weight' in place (clamp_)", "set_name('fc.weight', partition="],
        ),
        (lambda: nn.Sequential(_ClippedLinear(3, 3)), ["module '0' (_ClippedLinear)", "'0.weight' in place"]),
        (_lazy, ["module '0' (LazyLinear)", "uninitialised parameter 'weight'", "forward pass"]),
        (_old_weight_norm, ["module '0' (Linear)", "parametrizations.weight_norm"]),
        (_scripted, ["TorchScript", "before torch.jit.script"]),
        (lambda: nn.DataParallel(nn.Linear(3, 3)), ["(DataParallel)", "its .module"]),
        (lambda: nn.Sequential(nn.DataParallel(nn.Linear(3, 3))), ["module '0' (DataParallel)"]),
    ],
    ids=[
        "in_place_parameter_update",
        "in_place_update_in_a_subclass",
        "lazy",
        "old_weight_norm",
        "torchscript",
        "data_parallel",
        "nested_parallel",
    ],
)
def test_unsupported_models_are_refused_with_the_module_and_the_way_out(factory, fragments) -> None:
    model = factory()
    with pytest.raises(PartitionError) as info:
        partitionify(model, 3)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_the_way_out_for_an_in_place_update_keeps_it() -> None:
    torch.manual_seed(0)
    model = WeightClipping()
    pmodel = partitionify(model, 3, config=PartitionConfig().set_name("fc.weight", partition=False))
    x = torch.randn(5, 4)
    with torch.no_grad():
        want = model(x)
        assert all(torch.equal(pmodel(x, subnetwork=k), want) for k in range(4))
    weight = pmodel.module.get_parameter("fc.weight")
    with torch.no_grad():
        weight.fill_(1.0)
        pmodel(x, subnetwork=1)
    assert float(weight.detach().abs().max()) == pytest.approx(0.1)  # the clipping persisted
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,))


class _KeepsLastOutput(nn.Module):
    """Keeps derived state in attributes deepcopy reaches only through containers and plain objects: its last
    output (a non-leaf tensor with a ``grad_fn`` after a forward with autograd on) in a list and in a namespace."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.history: list[torch.Tensor] = []
        self.last = SimpleNamespace(output=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.history = [y]
        self.last.output = y * 2
        return y


def _run_once_then_converts(model: nn.Module, x: torch.Tensor) -> PartitionedModel:
    """``model``, run once with autograd on (so it holds derived tensors with a grad_fn), converts: every
    subnetwork equals the original at conversion and its export after perturbation, and ``model`` is left as it
    was and still runs."""
    model(x)  # an ordinary evaluation, autograd on
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), seed=0).eval()
    with torch.no_grad():
        want = model(x)
        for k in range(4):
            assert torch.allclose(pmodel(x, subnetwork=k), want, rtol=0, atol=1e-6), k
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,))
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    assert torch.equal(model(x), want)  # the original still works (and its caches still carry their grad_fn)
    return pmodel


def test_a_model_run_once_with_autograd_converts_with_its_derived_state_detached() -> None:
    """State derived by a forward (tensors with a grad_fn, in lists and plain objects) does not stop a conversion:
    it is copied detached, as a forward under ``no_grad`` would have left it."""
    torch.manual_seed(0)
    model = _KeepsLastOutput().eval()
    _run_once_then_converts(model, torch.randn(5, 4))
    assert model.history[0].grad_fn is not None and model.last.output.grad_fn is not None  # the original's, kept
    copied = partitionify(model, 3).skeleton  # the copy exports are rebuilt from keeps the attributes
    assert copied.history[0].grad_fn is None and copied.last.output.grad_fn is None
    assert torch.equal(copied.last.output, model.last.output)


class _CachesInBothModes(nn.Module):
    """Caches a value derived from a parameter at its first forward, in train and eval mode alike."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.randn(3))
        self.scale_cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "scale" not in self.scale_cache:
            self.scale_cache["scale"] = self.scale * 2
        return self.fc(x) * self.scale_cache["scale"]


def test_a_cache_filled_by_an_earlier_forward_is_not_traced_as_a_constant() -> None:
    """Traced with its cache filled, the model would read the original's value in every subnetwork (a silent
    wrong answer once the partitions move): the copy's caches are emptied before tracing."""
    torch.manual_seed(0)
    _run_once_then_converts(_CachesInBothModes().eval(), torch.randn(5, 4))


# 32 px (the zoo's size for LeViT; timm accepts img_size for both) keeps each under a few seconds on one core.
@pytest.mark.parametrize(
    ("name", "kwargs"), [("levit_128s", {"img_size": 32}), ("tiny_vit_5m_224", {})], ids=["levit", "tiny_vit"]
)
def test_a_timm_model_with_an_attention_bias_cache_converts_after_an_evaluation(name, kwargs) -> None:
    """LeViT and TinyViT cache their attention biases (non-leaf tensors after a forward with autograd on) in a
    plain dict: a model that has been evaluated converts, and the cache does not leak into the conversion."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **kwargs).eval()
    x = torch.randn(2, 3, 32, 32)
    fresh = partitionify(copy.deepcopy(model), 3, (0.8, 0.1, 0.1), seed=0)
    run = _run_once_then_converts(model, x)
    caches = [m.attention_bias_cache for m in model.modules() if hasattr(m, "attention_bias_cache")]
    assert caches and all(c and all(v.grad_fn is not None for v in c.values()) for c in caches)
    assert run.module.code == fresh.module.code  # traced as a model never run (no cached constants)
