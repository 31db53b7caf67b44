"""Property-based tests over random small architectures, each property checked against its definition.

Hypothesis draws a network spec (an MLP or a CNN: layer widths, conv kernel sizes, strides, padding and
groups, BatchNorm/LayerNorm/GroupNorm or no norm, activations as modules or functions, residual blocks
``x + gain * f(x) + shift`` with optional scalar gain and shift parameters, dropout, bias=False, a pooling,
mean or flatten head) and the conversion settings (C, proportions, scheme, default, assignments, seed).
Widths of 32 and 40 make some tensors large enough (a divisor pair both >= 32) for regenerated layouts.

Properties: subnetworks equal the original at conversion (default "init") and their exports after perturbing
(eval and train mode); exports keep the original class and state layout; state dicts round-trip bit for bit;
partition sizes, kinds and per-entry values follow the definitions; gradients reach exactly the partitions
of the subnetwork; per-example subnetworks and gradient routing equal running each subnetwork.
"""

from __future__ import annotations

import copy
import io
import math
from dataclasses import dataclass

import safetensors.torch
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from partition_fx import export_subnetwork, partitionify
from partition_fx.fx.assign import partition_sizes
from partition_fx.fx.params import RandomPartitionedTensor, ScalePartitionedTensor
from partition_fx.testing import assert_subnetworks_match_exports, max_relative_difference, perturb_partitions

NORMS = ("none", "batch", "layer", "group")
ACTIVATIONS = ("identity", "relu", "relu_inplace", "gelu", "tanh", "silu", "F.relu", "F.gelu")
BATCH = 3


@dataclass(frozen=True)
class LayerSpec:
    residual: bool  # x + gain * f(x) + shift, f keeping the shape
    width: int  # output features or channels
    kernel: int
    stride: int
    padding: int
    groups: int
    bias: bool  # of the linear/conv layer and of a LayerNorm
    norm: str
    norm_groups: int  # GroupNorm
    norm_affine: bool
    norm_size: int  # CNN LayerNorm: spatial size it normalises over, (width, size, size)
    activation: str
    dropout: float
    gain: bool
    shift: bool


@dataclass(frozen=True)
class NetSpec:
    conv: bool
    channels: int  # input features (MLP) or channels (CNN)
    size: int  # CNN input height and width
    layers: tuple[LayerSpec, ...]
    head: str  # none, linear (MLP); none, avgpool, maxpool, mean, flatten (CNN)
    head_features: int  # input features of the head's Linear
    outputs: int


@dataclass(frozen=True)
class Case:
    spec: NetSpec
    num_partitions: int
    proportions: tuple[float, ...]
    scheme: str
    default: str
    assignments: str
    seed: int
    init_seed: int

    def convert(self, model: nn.Module, seed: int | None = None):
        return partitionify(
            model,
            self.num_partitions,
            self.proportions,
            scheme=self.scheme,
            default=self.default,
            seed=self.seed if seed is None else seed,
            assignments=self.assignments,
        )


class Block(nn.Module):
    """layer -> norm -> activation -> dropout."""

    def __init__(self, spec: LayerSpec, channels: int, conv: bool) -> None:
        super().__init__()
        if conv:
            self.layer: nn.Module = nn.Conv2d(
                channels, spec.width, spec.kernel, spec.stride, spec.padding, groups=spec.groups, bias=spec.bias
            )
        else:
            self.layer = nn.Linear(channels, spec.width, bias=spec.bias)
        if spec.norm == "batch":
            self.norm: nn.Module = (nn.BatchNorm2d if conv else nn.BatchNorm1d)(spec.width, affine=spec.norm_affine)
        elif spec.norm == "layer":
            shape = (spec.width, spec.norm_size, spec.norm_size) if conv else (spec.width,)
            self.norm = nn.LayerNorm(shape, elementwise_affine=spec.norm_affine, bias=spec.bias)
        elif spec.norm == "group":
            self.norm = nn.GroupNorm(spec.norm_groups, spec.width, affine=spec.norm_affine)
        else:
            self.norm = nn.Identity()
        modules = {"relu": nn.ReLU(), "relu_inplace": nn.ReLU(inplace=True), "gelu": nn.GELU()}
        modules.update(tanh=nn.Tanh(), silu=nn.SiLU())
        self.act = modules.get(spec.activation, nn.Identity())
        self.functional = spec.activation  # F.relu / F.gelu are called in forward (call_function nodes)
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.norm(self.layer(x)))
        if self.functional == "F.relu":
            h = F.relu(h)
        elif self.functional == "F.gelu":
            h = F.gelu(h)
        return self.drop(h)


class Residual(nn.Module):
    """x + gain * f(x) + shift, with FixUp-style scalar parameters (found by their use: product / sum)."""

    def __init__(self, spec: LayerSpec, channels: int, conv: bool) -> None:
        super().__init__()
        self.body = Block(spec, channels, conv)
        self.gain = nn.Parameter(torch.rand(1) + 0.5) if spec.gain else None
        self.shift = nn.Parameter(0.1 * torch.randn(1)) if spec.shift else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.gain is not None:
            h = h * self.gain
        if self.shift is not None:
            h = h + self.shift
        return x + h


class SpecNet(nn.Module):
    def __init__(self, spec: NetSpec) -> None:
        super().__init__()
        self.head_kind = spec.head
        blocks: list[nn.Module] = []
        channels = spec.channels
        for layer in spec.layers:
            blocks.append((Residual if layer.residual else Block)(layer, channels, spec.conv))
            channels = layer.width
        self.blocks = nn.ModuleList(blocks)
        pools = {"avgpool": nn.AdaptiveAvgPool2d(1), "maxpool": nn.AdaptiveMaxPool2d(1)}
        self.pool = pools.get(spec.head, nn.Identity())
        self.head = nn.Linear(spec.head_features, spec.outputs) if spec.head != "none" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        if self.head_kind == "mean":
            x = x.mean((2, 3))
        elif self.head_kind in ("avgpool", "maxpool", "flatten"):
            x = torch.flatten(self.pool(x), 1)
        if self.head is not None:
            x = self.head(x)
        return x


def build(spec: NetSpec, init_seed: int) -> SpecNet:
    """The model of ``spec``, with random norm affines and BatchNorm statistics (so they matter)."""
    torch.manual_seed(init_seed)
    model = SpecNet(spec)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.uniform_(0.5, 1.5)
                if getattr(m, "bias", None) is not None:
                    m.bias.normal_(0.0, 0.2)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def inputs(case: Case) -> torch.Tensor:
    spec = case.spec
    shape = (BATCH, spec.channels, spec.size, spec.size) if spec.conv else (BATCH, spec.channels)
    return torch.randn(shape, generator=torch.Generator().manual_seed(case.init_seed + 1))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


WIDTHS = st.one_of(st.integers(1, 6), st.sampled_from([32, 40]))


@st.composite
def net_specs(draw, wide: bool = False) -> NetSpec:
    """``wide``: the input and the first layer are 32 or 40 wide, so a tensor of the first layer (of an MLP, or of
    an ungrouped CNN) has a divisor pair >= 32 and regenerates its layout."""
    conv = draw(st.booleans())
    fixup = draw(st.booleans())  # residual blocks may have scalar gains and shifts (without: the one-pass forward)
    channels = draw(st.sampled_from([32, 40]) if wide else WIDTHS)
    size = draw(st.integers(1, 6)) if conv else 1
    in_channels, in_size = channels, size
    layers = []
    for _ in range(draw(st.integers(1, 3))):
        residual = draw(st.booleans())
        width = channels if residual else draw(st.sampled_from([32, 40]) if wide and not layers else WIDTHS)
        kernel, stride, padding, groups = 1, 1, 0, 1
        if conv:
            if residual:  # same shape out: odd kernel, same padding, stride 1
                kernel = draw(st.sampled_from([1, 3]))
                padding = kernel // 2
            else:
                padding = draw(st.integers(0, 1))
                kernel = draw(st.integers(1, min(3, size + 2 * padding)))
                stride = draw(st.integers(1, 2))
            groups = draw(st.sampled_from([g for g in divisors(channels) if width % g == 0]))
            size = (size + 2 * padding - kernel) // stride + 1
        norm = draw(st.sampled_from(NORMS))
        layers.append(
            LayerSpec(
                residual=residual,
                width=width,
                kernel=kernel,
                stride=stride,
                padding=padding,
                groups=groups,
                bias=draw(st.booleans()),
                norm=norm,
                norm_groups=draw(st.sampled_from(divisors(width))) if norm == "group" else 1,
                norm_affine=draw(st.booleans()),
                norm_size=size,
                activation=draw(st.sampled_from(ACTIVATIONS)),
                dropout=draw(st.sampled_from([0.0, 0.0, 0.5])),
                gain=residual and fixup and draw(st.booleans()),
                shift=residual and fixup and draw(st.booleans()),
            )
        )
        channels = width
    head = draw(st.sampled_from(["none", "avgpool", "maxpool", "mean", "flatten"] if conv else ["none", "linear"]))
    head_features = channels * size * size if head == "flatten" else channels
    return NetSpec(conv, in_channels, in_size, tuple(layers), head, head_features, draw(st.integers(1, 5)))


@st.composite
def cases(draw, default: str | None = None) -> Case:
    c = draw(st.integers(1, 5))
    weights = draw(st.lists(st.integers(1, 20), min_size=c, max_size=c))
    scheme = draw(st.sampled_from(["random", "node"]))
    assignments = draw(st.sampled_from(["stored", "regenerated"]))
    return Case(
        spec=draw(net_specs(wide=scheme == "random" and assignments == "regenerated")),
        num_partitions=c,
        proportions=tuple(w / sum(weights) for w in weights),
        scheme=scheme,
        default=default or draw(st.sampled_from(["init", "zero", "seed"])),
        assignments=assignments,
        seed=draw(st.integers(0, 2**63 - 1)),
        init_seed=draw(st.integers(0, 2**31)),
    )


def run(module: nn.Module, x: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """One forward without gradients; dropout masks come from a fixed seed, the same for every module."""
    torch.manual_seed(1234)
    with torch.no_grad():
        return module(x) if k is None else module(x, subnetwork=k)


def assert_same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        assert (got[name].shape, got[name].dtype) == (value.shape, value.dtype), name
        assert torch.equal(got[name], value), name


def has_feistel_pair(numel: int) -> bool:
    """numel = a * b with both a, b >= 32: the tensors whose layout can be regenerated (README)."""
    return any(numel % a == 0 and numel // a >= 32 for a in range(32, math.isqrt(numel) + 1))


def is_rounding_of(sizes: list[int], total: int, proportions: tuple[float, ...]) -> bool:
    """Independently of ``partition_sizes``: the sizes add up to ``total`` and each is its quota rounded down or
    up (largest-remainder rounding has both properties)."""
    quotas = [p * total for p in proportions]
    return sum(sizes) == total and all(math.floor(q) <= n <= math.ceil(q) for n, q in zip(sizes, quotas))


def expected_kind(model: nn.Module, name: str, scheme: str) -> str:
    """README "What gets partitioned", for the module types these specs use."""
    owner_name, _, local = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    param = model.get_parameter(name)
    if isinstance(owner, (nn.Linear, nn.Conv2d)):
        return "node" if scheme == "node" else "random"
    if isinstance(owner, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
        if param.dim() > 1:  # a CNN LayerNorm's (C, H, W) affine is a weight like any other
            return "random"
        return "product" if local == "weight" else "sum"
    assert isinstance(owner, Residual), name
    return {"gain": "product", "shift": "sum"}[local]


def seed_moments(pt: RandomPartitionedTensor) -> torch.Tensor:
    """(mean, std) of default="seed" from the ``moments`` buffer (float64 bits in int64, immune to casts)."""
    return pt.moments.view(torch.float64)


def flat_trained(pt: RandomPartitionedTensor) -> torch.Tensor:
    """The trained value of every entry: part i lists the entries of partition i in flat order."""
    assignment = pt.assignment().flatten().long()
    flat = torch.empty(assignment.numel())
    for i, part in enumerate(pt.parts()):
        flat[assignment == i] = part.detach()
    return flat


@settings(max_examples=20, deadline=None)
@given(case=cases(default="init"), train=st.booleans())
def test_init_default_every_subnetwork_is_the_original(case: Case, train: bool) -> None:
    """Definition of default="init": right after conversion every subnetwork k = 0..C is the original model.
    Eval mode: bit-identical outputs. Train mode (fresh copies per k, the same dropout seed): bit-identical
    outputs and, afterwards, the same state (BatchNorm running statistics updated alike)."""
    model = build(case.spec, case.init_seed)
    pmodel = case.convert(model).eval()
    x = inputs(case)
    for k in range(case.num_partitions + 1):
        original, partitioned = (
            (copy.deepcopy(model).train(), copy.deepcopy(pmodel).train()) if train else (model, pmodel)
        )
        assert torch.equal(run(partitioned, x, k), run(original, x)), k
        assert_same_state(export_subnetwork(partitioned, k).state_dict(), original.state_dict())


@settings(max_examples=25, deadline=None)
@given(case=cases(), train=st.booleans())
def test_perturbed_subnetworks_match_their_exports(case: Case, train: bool) -> None:
    """Invariant 1: after perturbing every trainable partition, pmodel(x, subnetwork=k) equals
    export_subnetwork(pmodel, k)(x) for every k (relative difference <= 1e-5). Eval mode through
    ``assert_subnetworks_match_exports``; train mode on fresh copies per k with the same dropout seed, where
    the BatchNorm running statistics that the forward updates must also match the export's. Forward and export
    read the same ``flat_value``, so this is consistency; the definition is checked by
    ``test_subnetwork_tensors_follow_the_definition`` and, in eval mode, by the helper's per-tensor check."""
    pmodel = case.convert(build(case.spec, case.init_seed))
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    x = inputs(case)
    if not train:
        assert_subnetworks_match_exports(pmodel.eval(), (x,))
        return
    for k in range(case.num_partitions + 1):
        partitioned = copy.deepcopy(pmodel).train()
        exported = export_subnetwork(partitioned, k)
        assert exported.training
        assert max_relative_difference(run(partitioned, x, k), run(exported, x)) <= 1e-5, k
        after = export_subnetwork(partitioned, k).state_dict()
        for name, buffer in exported.named_buffers():
            assert max_relative_difference(after[name], buffer) <= 1e-5, (k, name)


@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_export_has_the_original_class_layout_and_values(case: Case) -> None:
    """Definition of export: a module of the original class with the original state_dict keys, shapes and
    dtypes. Right after conversion it holds the subnetwork's values: the original's for every k (default
    "init"); for "zero" the original's at k = C and at k = 0 zeros for random/node tensors, 1 and 0 for
    product and sum scales; for "seed" the same re-initialised values for every k, whose random/node
    tensors keep the original's mean and std (the ``moments`` buffer) and whose scales keep their values."""
    model = build(case.spec, case.init_seed)
    pmodel = case.convert(model).eval()
    original = model.state_dict()
    exports = [export_subnetwork(pmodel, k).state_dict() for k in range(case.num_partitions + 1)]
    exported = export_subnetwork(pmodel, 1)
    assert type(exported) is type(model) and not exported.training
    for state in exports:
        assert list(state) == list(original)
        assert all((state[n].shape, state[n].dtype) == (v.shape, v.dtype) for n, v in original.items())
    if case.default == "init":
        for state in exports:
            assert_same_state(state, original)
        return
    tensors = dict(pmodel.partitioned_tensors())
    if case.default == "zero":
        assert_same_state(exports[-1], original)
        for name, value in original.items():
            pt = tensors.get(name)
            if pt is None:  # a buffer
                want = value
            elif pt.kind == "product":
                want = torch.ones_like(value)
            else:
                want = torch.zeros_like(value)
            assert torch.equal(exports[0][name], want), name
        return
    for state in exports:
        assert_same_state(state, exports[0])
    for name, pt in tensors.items():
        if isinstance(pt, ScalePartitionedTensor):
            assert torch.equal(exports[0][name], original[name]), name
        else:
            std, mean = torch.std_mean(original[name].double(), correction=0)
            torch.testing.assert_close(seed_moments(pt), torch.stack([mean, std]), rtol=1e-6, atol=0)
            if original[name].numel() == 1:  # std 0: the re-initialised value is the mean, the original
                assert torch.equal(exports[0][name], original[name]), name


@settings(max_examples=20, deadline=None)
@given(case=cases(), fmt=st.sampled_from(["safetensors", "torch"]))
def test_state_dict_round_trips_bit_for_bit(case: Case, fmt: str) -> None:
    """Definition of a checkpoint: ``pmodel.state_dict()`` (after perturbing, and after a train-mode forward
    that moves BatchNorm statistics) saved as safetensors bytes or with torch.save, and loaded into a fresh
    partitionify of a differently initialised model of the same architecture and settings but another seed
    (seeds and salts are buffers: the checkpoint alone decides), gives every subnetwork's outputs (eval and
    train mode) and every state tensor bit for bit."""
    pmodel = case.convert(build(case.spec, case.init_seed))
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    x = inputs(case)
    run(pmodel.train(), x)
    state = pmodel.state_dict()
    if fmt == "safetensors":
        loaded = safetensors.torch.load(safetensors.torch.save(state))
    else:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
    fresh = case.convert(build(case.spec, case.init_seed + 7), seed=case.seed ^ 1)
    fresh.load_state_dict(loaded)
    assert_same_state(fresh.state_dict(), state)
    for train in (False, True):  # in train mode both update their BatchNorm statistics alike
        pmodel.train(train), fresh.train(train)
        for k in range(case.num_partitions + 1):
            assert torch.equal(run(fresh, x, k), run(pmodel, x, k)), (train, k)
    assert_same_state(fresh.state_dict(), pmodel.state_dict())


@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_partition_sizes_and_kinds_follow_the_definition(case: Case) -> None:
    """Definition of the split (README "What gets partitioned"): every parameter is partitioned, with the kind
    its module implies; a random-weight tensor's partitions hold ``partition_sizes(numel, proportions)``
    entries and its ``assignment()`` counts agree; a node-partitioned tensor splits its output units by
    ``partition_sizes(units, proportions)``, whole rows per unit, weight and bias of a layer alike; product
    and sum tensors hold C full copies; layouts are regenerated exactly for random tensors with a divisor
    pair >= 32 under assignments="regenerated"; partition_parameters(1..C) list every part once."""
    model = build(case.spec, case.init_seed)
    pmodel = case.convert(model)
    props, c = case.proportions, case.num_partitions
    tensors = dict(pmodel.partitioned_tensors())
    assert sorted(tensors) == sorted(name for name, _ in model.named_parameters())
    for name, pt in tensors.items():
        param = model.get_parameter(name)
        numel = param.numel()
        assert pt.kind == expected_kind(model, name, case.scheme), name
        if isinstance(pt, ScalePartitionedTensor):
            assert pt.partition_sizes() == [numel] * c, name
            continue
        assert isinstance(pt, RandomPartitionedTensor)
        assert pt.regenerated == (case.assignments == "regenerated" and pt.kind == "random" and has_feistel_pair(numel))
        assignment = pt.assignment()
        assert assignment.shape == param.shape
        counts = torch.bincount(assignment.flatten().long(), minlength=c).tolist()
        assert counts == pt.partition_sizes() and sum(counts) == numel, name
        if pt.kind == "random":
            assert counts == partition_sizes(numel, props) and is_rounding_of(counts, numel, props), name
            continue
        units = param.shape[0]
        rows = assignment.reshape(units, -1)
        assert torch.equal(rows, rows[:, :1].expand_as(rows)), name  # a unit's whole row is in one partition
        unit_counts = [n // (numel // units) for n in counts]
        assert unit_counts == partition_sizes(units, props) and is_rounding_of(unit_counts, units, props), name
        if name.endswith(".bias"):
            weight = tensors[name[: -len("bias")] + "weight"]
            assert torch.equal(weight.assignment().reshape(units, -1)[:, 0], assignment), name
    parts = [id(p) for k in range(1, c + 1) for p in pmodel.partition_parameters(k)]
    storage = {id(pt.storage(k)): pt.storage(k) for pt in tensors.values() for k in range(1, c + 1)}
    trainable = [key for key, p in storage.items() if p.numel() > 0]
    assert sorted(parts) == sorted(trainable) and len(set(parts)) == len(parts)
    # every parameter holds exactly the parts viewed by the tensors stored in it
    held: dict[int, int] = {}
    for pt in tensors.values():
        for k in range(1, c + 1):
            held[id(pt.storage(k))] = held.get(id(pt.storage(k)), 0) + pt.part(k).numel()
    assert held == {key: p.numel() for key, p in storage.items()}


@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_subnetwork_tensors_follow_the_definition(case: Case) -> None:
    """Definition of subnetwork k (README): after perturbing, each random/node tensor of
    export_subnetwork(pmodel, k) has part i's values at the entries assigned to partition i <= k (a part
    lists its entries in flat order) and the default (subnetwork 0 at conversion) elsewhere; a product/sum
    tensor is the product/sum of parts 1..k, and its default at k = 0."""
    pmodel = case.convert(build(case.spec, case.init_seed))
    defaults = export_subnetwork(pmodel, 0).state_dict()
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    tensors = dict(pmodel.partitioned_tensors())
    for k in range(case.num_partitions + 1):
        state = export_subnetwork(pmodel, k).state_dict()
        for name, pt in tensors.items():
            if isinstance(pt, ScalePartitionedTensor):
                want = defaults[name]
                if k > 0:
                    want = pt.part(1).detach()
                    for part in pt.parts()[1:k]:
                        want = want * part.detach() if pt.kind == "product" else want + part.detach()
            else:
                assignment = pt.assignment().flatten()
                want = torch.where(assignment < k, flat_trained(pt), defaults[name].flatten()).view(pt.shape)
            assert torch.equal(state[name], want), (k, name)


@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_gradients_reach_the_partitions_of_the_subnetwork_as_defined(case: Case) -> None:
    """Definition of training through subnetwork k: subnetwork 0 has nothing to train; for k >= 1 the
    gradient of a loss w.r.t. part i is None for i > k and, for i <= k, the exported subnetwork's gradient of
    the same loss at the entries of partition i (random/node), that whole gradient (sum scales), or that
    gradient times the other parts 1..k (product scales)."""
    # A LayerNorm or GroupNorm over single values outputs its bias whatever its input, so every gradient that
    # reaches a layer before it is 0 plus float32 rounding of size ~1e-5 that differs between the two graphs
    # (CI found one: 3.7e-5 against 0 at width 1): no tolerance on the gradient's scale separates that from a
    # routing error, so such networks are left to the other tests of this file.
    assume(not any(layer.norm in ("layer", "group") and single_value_groups(layer, case) for layer in case.spec.layers))
    pmodel = case.convert(build(case.spec, case.init_seed)).eval()
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    x = inputs(case)
    tensors = dict(pmodel.partitioned_tensors())
    assert not pmodel(x, subnetwork=0).requires_grad
    for k in range(1, case.num_partitions + 1):
        pmodel.zero_grad(set_to_none=True)
        out = pmodel(x, subnetwork=k)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(k))
        (out * weights).sum().backward()
        exported = export_subnetwork(pmodel, k)
        (exported(x) * weights).sum().backward()
        for name, pt in tensors.items():
            grad = exported.get_parameter(name).grad
            for i, part in enumerate(pt.parts(), start=1):
                part_grad = pt.part_grad(i)
                if i > k:
                    assert part_grad is None, (k, name, i)
                    continue
                if part.numel() == 0:
                    continue
                if pt.kind == "sum":
                    want = grad
                elif pt.kind == "product":
                    want = grad
                    for j in range(1, k + 1):
                        want = want * pt.part(j).detach() if j != i else want
                else:
                    want = grad.flatten()[pt.assignment().flatten() == i - 1]
                assert part_grad is not None, (k, name, i)
                # float32 sums in another order: absolute error on the scale of the tensor's whole gradient
                # (an entry where large terms cancel differed by 4e-5 of a gradient of scale 2 at 1e-5 atol)
                atol = 1e-5 * max(1.0, float(grad.abs().max()))
                torch.testing.assert_close(
                    part_grad, want, rtol=1.3e-6, atol=atol, msg=lambda m, k=k, n=name, i=i: f"{k} {n} part{i}: {m}"
                )


def single_value_groups(layer: LayerSpec, case: Case) -> bool:
    """A GroupNorm whose groups hold one value per example (one channel, no spatial extent)."""
    return layer.norm_groups == layer.width and (not case.spec.conv or layer.norm_size == 1)


@settings(max_examples=30, deadline=None)
@given(case=cases(), data=st.data())
def test_per_example_subnetworks_and_gradient_routing_follow_the_definition(case: Case, data) -> None:
    """Definition of per-example subnetworks (README ``forward``), eval mode: ``pmodel(x, subnetwork=ks,
    grad_partition=gs)`` gives example i row i of ``pmodel(x, subnetwork=ks[i])``, and one backward of the summed
    loss gives partition j's parts the gradient of the loss of the examples with gs[i] = j, each through its
    subnetwork ks[i] (gs[i] = 0: the example trains nothing). Under node partitioning this is the one-pass
    forward. In float64: float32 rounding differs between batch sizes, and ill-conditioned layers (a GroupNorm
    over two values) amplify that to ~1e-4 in gradients."""
    pmodel = case.convert(build(case.spec, case.init_seed)).eval()
    perturb_partitions(pmodel, seed=case.init_seed % 1000)
    pmodel.double()
    grouping = pmodel.per_example == "grouped" or not pmodel.supports_one_pass()
    # Grouping runs each subnetwork's examples as a sub-batch, possibly of one; torch's group_norm refuses a
    # single value per group (a GroupNorm with one channel per group on features), so such a model cannot.
    assume(
        not (grouping and any(layer.norm == "group" and single_value_groups(layer, case) for layer in case.spec.layers))
    )
    c = case.num_partitions
    x = inputs(case).double()
    ks = data.draw(st.lists(st.integers(0, c), min_size=BATCH, max_size=BATCH), label="ks")
    gs = [data.draw(st.integers(0, k), label=f"gs[{i}]") for i, k in enumerate(ks)]
    out = pmodel(x, subnetwork=torch.tensor(ks), grad_partition=torch.tensor(gs))
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    each = {k: pmodel(x, subnetwork=k) for k in set(ks)}
    for i, k in enumerate(ks):
        assert max_relative_difference(out[i], each[k][i]) <= 1e-9, (i, k)
    params = {j: pmodel.partition_parameters(j) for j in range(1, c + 1)}
    pmodel.zero_grad(set_to_none=True)
    if out.requires_grad:
        (out * weights).sum().backward()
    for j in range(1, c + 1):
        losses = [(each[ks[i]][i] * weights[i]).sum() for i in range(BATCH) if gs[i] == j]
        want = [None] * len(params[j])
        if losses and params[j]:
            want = list(torch.autograd.grad(sum(losses), params[j], allow_unused=True, retain_graph=True))
        for p, w in zip(params[j], want):
            got = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.testing.assert_close(got, w if w is not None else torch.zeros_like(p))
