"""The learnable-hyperparameter modules: shapes, identities, gradients, bounds and argument errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from partition_fx.choices import RANGE_NAMES
from partition_fx.errors import PartitionArgumentError, PartitionCheckpointError
from partition_fx.ranges import DEFAULT_MAX_RANGE
from partition_fx.transforms import AffineAugmentation, ConcreteDropout, HyperparameterModule, InputMask

ALL = AffineAugmentation().generators  # the default set (choices.GENERATOR_SETS["xy"])
FAST = settings(max_examples=15, deadline=None)


# ---------------------------------------------------------------- AffineAugmentation


@FAST
@given(
    b=st.integers(1, 3),
    c=st.integers(1, 3),
    h=st.integers(2, 7),
    w=st.integers(2, 7),
    s=st.integers(1, 4),
    align=st.booleans(),
)
def test_affine_shape_and_sample_major_identity_at_zero_ranges(b, c, h, w, s, align) -> None:
    aug = AffineAugmentation(num_samples=s, init=0.0, align_corners=align)
    x = torch.randn(b, c, h, w)
    out = aug(x)
    assert out.shape == (s * b, c, h, w)
    per_sample = out.view(s, b, c, h, w)
    for k in range(s):
        torch.testing.assert_close(per_sample[k], x, atol=1e-5, rtol=0)


def test_affine_sample_major_layout() -> None:
    # Each example is a constant image with its own value and padding "border" keeps it constant under
    # any transform, so the layout is visible: out[s * B + b] must hold example b's value.
    aug = AffineAugmentation(num_samples=3, init=0.5, padding_mode="border")
    x = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 2, 5, 5).contiguous()
    out = aug(x).view(3, 4, 2, 5, 5)
    for k in range(3):
        torch.testing.assert_close(out[k], x)


def test_affine_samples_differ_across_samples() -> None:
    torch.manual_seed(0)
    aug = AffineAugmentation(num_samples=2, generators=("rotation",), init=1.0)
    out = aug(torch.randn(1, 1, 8, 8)).view(2, 1, 1, 8, 8)
    assert not torch.allclose(out[0], out[1])


def test_affine_eval_is_identity() -> None:
    aug = AffineAugmentation(num_samples=4, init=0.5).eval()
    x = torch.randn(2, 3, 6, 6)
    assert aug(x) is x
    assert aug(x, num_samples=5) is x


def test_affine_num_samples_override() -> None:
    aug = AffineAugmentation(num_samples=2)
    assert aug(torch.randn(3, 1, 4, 4), num_samples=5).shape == (15, 1, 4, 4)


@pytest.mark.parametrize("theta", [0.3, -1.1, math.pi / 2, 2.5])
def test_rotation_matrix_is_the_explicit_rotation(theta) -> None:
    aug = AffineAugmentation(generators=("rotation",), init=theta)
    matrix = aug.transform_matrices(torch.ones(1))
    c, s = math.cos(theta), math.sin(theta)
    expected = torch.tensor([[c, -s, 0.0], [s, c, 0.0]])
    # float32 matrix_exp is accurate to about 1e-5, not to float32 epsilon
    torch.testing.assert_close(matrix.detach(), expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("generators", ["xy", "augerino"])
def test_other_generator_matrices(generators) -> None:
    r = 0.4
    aug = AffineAugmentation(init=r, generators=generators)
    expected = {
        "translation_x": [[1, 0, r], [0, 1, 0]],
        "translation_y": [[1, 0, 0], [0, 1, r]],
        "scale_x": [[math.exp(r), 0, 0], [0, 1, 0]],
        "scale_y": [[1, 0, 0], [0, math.exp(r), 0]],
        "shear": [[math.cosh(r), math.sinh(r), 0], [math.sinh(r), math.cosh(r), 0]],
        "scale": [[math.exp(r), 0, 0], [0, math.exp(r), 0]],  # both axes alike
        "stretch": [[math.exp(r), 0, 0], [0, math.exp(-r), 0]],  # the aspect ratio alone: the area is kept
        "rotation": [[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0]],
    }
    assert set(aug.generators) <= set(expected)
    for name in aug.generators:
        eps = torch.tensor([1.0 if g == name else 0.0 for g in aug.generators])
        matrix = torch.tensor(expected[name], dtype=torch.float32)
        torch.testing.assert_close(aug.transform_matrices(eps).detach(), matrix, atol=2e-5, rtol=0)


def test_augerino_s_scale_and_stretch_span_the_independent_zooms_with_the_aspect_ratio_apart() -> None:
    """exp(a scale + b stretch) = exp((a + b) scale_x + (a - b) scale_y): the same maps, other coordinates."""
    a, b = 0.3, -0.2
    augerino = AffineAugmentation(generators=["scale", "stretch"], init={"scale": a, "stretch": b})
    xy = AffineAugmentation(generators=["scale_x", "scale_y"], init={"scale_x": a + b, "scale_y": a - b})
    ones = torch.ones(2)
    torch.testing.assert_close(augerino.transform_matrices(ones), xy.transform_matrices(ones), atol=1e-6, rtol=0)


@pytest.mark.parametrize("samples", [1, 3, 8])
def test_stratified_draws_put_one_coefficient_in_each_stratum_and_are_uniform(samples) -> None:
    torch.manual_seed(0)
    aug = AffineAugmentation(num_samples=samples, generators="augerino", draws="stratified")
    eps = aug.draw(samples, 500, torch.zeros(1))
    assert eps.shape == (samples, 500, 6) and bool(((eps >= -1) & (eps < 1)).all())
    strata = ((eps + 1) / 2 * samples).floor().long()  # which of the S equal strata of [-1, 1]
    assert torch.equal(strata.sort(dim=0).values, torch.arange(samples).view(-1, 1, 1).expand_as(strata))
    # each coefficient alone is U[-1, 1]: deciles of the 500 * 6 * S values within sampling error
    deciles = torch.histc(eps.flatten(), bins=10, min=-1, max=1) / eps.numel()
    assert bool(((deciles - 0.1).abs() < 0.02).all()), deciles
    # the order of the strata is random: over examples, each sample index falls in every stratum
    assert samples == 1 or len(set(strata[0, :, 0].tolist())) == samples


def test_stratified_samples_average_closer_to_the_expectation_than_uniform_ones() -> None:
    """The mean over S samples of a smooth function of eps: Latin hypercube draws vary less than independent
    ones (the variance reduction the hyperparameter step uses them for)."""
    torch.manual_seed(0)
    spreads = {}
    for draws in ("uniform", "stratified"):
        eps = AffineAugmentation(num_samples=8, generators=["rotation"], draws=draws).draw(8, 2000, torch.zeros(1))
        spreads[draws] = float(torch.cos(eps * 2).mean(0).std())
    assert spreads["stratified"] < spreads["uniform"] / 4, spreads


@pytest.mark.parametrize("k", [1, -1, 2])
@pytest.mark.parametrize("size", [5, 8])
def test_rotation_by_quarter_turns_equals_rot90(k, size) -> None:
    # Sign convention: a positive rotation coefficient turns the image counter-clockwise as displayed,
    # the same direction as torch.rot90(x, 1, dims=(-2, -1)).
    aug = AffineAugmentation(generators=("rotation",), init=k * math.pi / 2)
    x = torch.randn(2, 3, size, size)
    out = aug.transform(x, torch.ones(1, 2, 1))
    torch.testing.assert_close(out, torch.rot90(x, k, dims=(-2, -1)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("init", [0.0, 0.1])
def test_gradient_reaches_every_range(init) -> None:
    torch.manual_seed(0)
    aug = AffineAugmentation(num_samples=2, init=init)
    x = torch.randn(2, 2, 9, 9)
    weights = torch.randn(4, 2, 9, 9)
    (aug(x) * weights).sum().backward()
    assert aug.ranges.grad is not None
    assert bool((aug.ranges.grad.abs() > 0).all()), aug.ranges.grad


def test_affine_init_from_learned_ranges_at_their_bounds() -> None:
    learned = AffineAugmentation(num_samples=1, init=10.0, max_range={name: 1e3 for name in ALL})
    clamped = AffineAugmentation(num_samples=1)
    with torch.no_grad():
        clamped.ranges.copy_(learned.ranges)
    clamped.constrain_()  # every range at its bound, as float32 (rotation reads back as 3.1415927 > pi)
    again = AffineAugmentation(num_samples=1, init=clamped.hyperparameters())
    assert torch.equal(again.ranges, clamped.ranges)


def test_affine_constrain_clamps_to_documented_bounds() -> None:
    aug = AffineAugmentation(max_range={"shear": 0.2})
    with torch.no_grad():
        aug.ranges.copy_(torch.tensor([5.0, -5.0, 10.0, -3.0, 0.1, 1.0]))
    aug.constrain_()
    hp = aug.hyperparameters()
    assert hp["translation_x"] == pytest.approx(DEFAULT_MAX_RANGE["translation_x"])
    assert hp["translation_y"] == pytest.approx(1.0)
    assert hp["rotation"] == pytest.approx(math.pi)
    assert hp["scale_x"] == pytest.approx(math.log(2))
    assert hp["scale_y"] == pytest.approx(0.1)  # inside the bound: untouched
    assert hp["shear"] == pytest.approx(0.2)
    assert aug.ranges[1].item() == pytest.approx(-1.0)  # the sign is kept


def test_affine_hyperparameters_are_plain_floats() -> None:
    aug = AffineAugmentation(generators=("rotation", "translation_x"), init={"rotation": -0.25})
    hp = aug.hyperparameters()
    assert list(hp) == ["rotation", "translation_x"]
    assert all(type(v) is float for v in hp.values())
    assert hp == {"rotation": 0.25, "translation_x": 0.0}
    assert isinstance(aug, HyperparameterModule)


def test_affine_is_deterministic_under_manual_seed() -> None:
    aug = AffineAugmentation(num_samples=3, init=0.3)
    x = torch.randn(2, 1, 6, 6)
    torch.manual_seed(7)
    first = aug(x)
    torch.manual_seed(7)
    torch.testing.assert_close(aug(x), first, atol=0, rtol=0)


def test_affine_float64_input() -> None:
    out = AffineAugmentation(num_samples=2, init=0.2)(torch.randn(1, 1, 4, 4, dtype=torch.float64))
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(num_samples=0), "num_samples must be an int >= 1, got 0"),
        (dict(num_samples=2.0), "num_samples must be an int >= 1, got 2.0"),
        (dict(num_samples=True), "num_samples"),
        (dict(generators=("rotation", "zoom")), "unknown names ['zoom']"),
        (dict(generators=("rotation", "rotation")), "['rotation'] more than once"),
        (dict(generators=()), "non-empty"),
        (dict(generators="rotation"), "sequence of names"),
        (dict(init={"rotaton": 0.1}), "init has key 'rotaton'"),
        (dict(generators=("shear",), init={"rotation": 0.1}), "init has key 'rotation'"),
        (dict(init=float("nan")), "init must be a finite number"),
        (dict(generators=("rotation",), init=4.0), "init for 'rotation' is 4.0, outside the bound"),
        (dict(max_range={"rotation": -1.0}), "max_range['rotation'] must be > 0, got -1.0"),
        (dict(max_range={"zoom": 1.0}), "max_range has key 'zoom'"),
        (dict(padding_mode="circular"), "padding_mode must be one of ('zeros', 'border', 'reflection')"),
    ],
)
def test_affine_bad_arguments(kwargs, fragment) -> None:
    with pytest.raises(PartitionArgumentError) as info:
        AffineAugmentation(**kwargs)
    assert fragment in str(info.value)


def test_affine_bad_inputs() -> None:
    aug = AffineAugmentation()
    with pytest.raises(PartitionArgumentError, match=r"\[B, C, H, W\], got \(3, 8, 8\)"):
        aug(torch.randn(3, 8, 8))
    with pytest.raises(PartitionArgumentError, match="floating-point"):
        aug(torch.zeros(1, 1, 4, 4, dtype=torch.uint8))
    with pytest.raises(PartitionArgumentError, match="num_samples"):
        aug(torch.randn(1, 1, 4, 4), num_samples=0)
    with pytest.raises(PartitionArgumentError, match=r"eps must have shape \[S, 1, 6\]"):
        aug.transform(torch.randn(1, 1, 4, 4), torch.ones(2, 1, 5))


# ---------------------------------------------------------------- ConcreteDropout


@FAST
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), training=st.booleans())
def test_dropout_keeps_shape_and_eval_is_identity(shape, training) -> None:
    drop = ConcreteDropout(p=0.3).train(training)
    x = torch.randn(*shape)
    out = drop(x)
    assert out.shape == x.shape
    if not training:
        assert out is x


def test_dropout_is_unbiased_in_expectation() -> None:
    torch.manual_seed(0)
    drop = ConcreteDropout(p=0.2, temperature=0.1)
    x = torch.full((400_000,), 3.0)
    assert drop(x).mean().item() == pytest.approx(3.0, rel=0.01)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.7])
def test_dropout_low_temperature_drops_fraction_p(p) -> None:
    torch.manual_seed(0)
    drop = ConcreteDropout(p=p, temperature=1e-3)
    out = drop(torch.ones(100_000))
    # Nearly every element is hard: 0 (dropped) or 1 / (1 - p) (kept and rescaled).
    dropped = (out < 1e-3).float().mean().item()
    kept = ((out - 1 / (1 - p)).abs() < 1e-3).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.01)
    assert kept == pytest.approx(1 - p, abs=0.01)


def test_dropout_gradient_reaches_logit_p() -> None:
    torch.manual_seed(0)
    drop = ConcreteDropout(p=0.3)
    (drop(torch.randn(64, 8)) ** 2).sum().backward()
    assert drop.logit_p.grad is not None and drop.logit_p.grad.abs().item() > 0


def test_dropout_hyperparameters_and_constrain() -> None:
    drop = ConcreteDropout(p=0.25)
    hp = drop.hyperparameters()
    assert type(hp["p"]) is float and hp["p"] == pytest.approx(0.25)
    with torch.no_grad():
        drop.logit_p.fill_(20.0)
    drop.constrain_()
    assert drop.hyperparameters()["p"] == pytest.approx(0.95)
    with torch.no_grad():
        drop.logit_p.fill_(-30.0)
    drop.constrain_()
    assert drop.hyperparameters()["p"] == pytest.approx(1e-4)


def test_dropout_inside_a_model_and_deterministic() -> None:
    model = nn.Sequential(nn.Linear(4, 8), ConcreteDropout(), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    torch.manual_seed(3)
    first = model(x)
    torch.manual_seed(3)
    torch.testing.assert_close(model(x), first, atol=0, rtol=0)
    model.eval()
    torch.testing.assert_close(model(x), model[3](model[2](model[0](x))))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(p=0.0), "p must be a number strictly between 0 and 1, got 0.0"),
        (dict(p=1.5), "got 1.5"),
        (dict(p=0.99), "p must be in [p_min, p_max] = [0.0001, 0.95], got 0.99"),
        (dict(temperature=0.0), "temperature must be a number > 0, got 0.0"),
        (dict(temperature=float("inf")), "temperature must be finite"),
        (dict(p_min=0.5, p_max=0.2), "p_min must be <= p_max"),
    ],
)
def test_dropout_bad_arguments(kwargs, fragment) -> None:
    with pytest.raises(PartitionArgumentError) as info:
        ConcreteDropout(**kwargs)
    assert fragment in str(info.value)


# ---------------------------------------------------------------- InputMask


@FAST
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    init=st.floats(0.01, 0.99),
)
def test_mask_forward_is_x_times_mask(shape, batch, init) -> None:
    mask = InputMask(shape, init=init)
    x = torch.randn(*batch, *shape)
    out = mask(x)
    torch.testing.assert_close(out, x * mask.mask())
    torch.testing.assert_close(mask.mask(), torch.full(shape, init), atol=1e-6, rtol=0)
    values = mask.hyperparameters()["mask"]
    assert len(values) == math.prod(shape) and all(type(v) is float for v in values)


def test_mask_gradient_reaches_every_logit() -> None:
    mask = InputMask((2, 3))
    (mask(torch.randn(4, 2, 3) + 5) ** 2).sum().backward()
    assert bool((mask.logits.grad.abs() > 0).all())


def test_mask_shape_error() -> None:
    mask = InputMask((3, 4))
    with pytest.raises(PartitionArgumentError, match=r"\[\.\.\., 3, 4\], got \(2, 4, 3\)"):
        mask(torch.randn(2, 4, 3))
    with pytest.raises(PartitionArgumentError, match="got \\(4,\\)"):
        mask(torch.randn(4))


def test_mask_constrain() -> None:
    mask = InputMask(3)
    with torch.no_grad():
        mask.logits.copy_(torch.tensor([-50.0, 0.0, 50.0]))
    mask.constrain_()
    assert mask.logits.tolist() == [-10.0, 0.0, 10.0]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(shape=0), "shape entries must be ints >= 1, got 0"),
        (dict(shape=()), "non-empty sequence"),
        (dict(shape="3"), "shape must be an int"),
        (dict(shape=3, init=1.0), "init is the initial mask value and must be strictly between 0 and 1, got 1.0"),
        (dict(shape=3, init=0.9999999), "outside the mask range"),
        (dict(shape=3, max_logit=0), "max_logit must be a finite number > 0, got 0"),
    ],
)
def test_mask_bad_arguments(kwargs, fragment) -> None:
    with pytest.raises(PartitionArgumentError) as info:
        InputMask(**kwargs)
    assert fragment in str(info.value)


# ---------------------------------------------------------------- export


def test_eval_mode_exports_without_a_trace_of_the_hyperparameters() -> None:
    # What torch.onnx.export traces (torch.export): in eval mode dropout and augmentation vanish.
    model = nn.Sequential(AffineAugmentation(), nn.Flatten(), nn.Linear(16, 8), ConcreteDropout(), nn.Linear(8, 2))
    program = torch.export.export(model.eval(), (torch.randn(2, 1, 4, 4),))
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any(name in op for op in ops for name in ("sigmoid", "rand", "grid_sampler", "matrix_exp")), ops
    x = torch.randn(2, 1, 4, 4)
    torch.testing.assert_close(program.module()(x), model(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_ranges_under_autocast_give_the_fp32_transforms(dtype):
    """The transform matrices are computed in fp32 even under autocast: in bf16/fp16 the matrix exponential of
    ranges at their bounds was NaN (found when the ranges began to start there)."""
    aug = AffineAugmentation(num_samples=3, init="bounds")
    x, eps = torch.rand(4, 1, 8, 8), torch.rand(3, 4, len(aug.generators)) * 2 - 1
    with torch.autocast("cpu", dtype=dtype):
        mixed = aug.transform(x, eps)
    assert torch.isfinite(mixed).all() and torch.allclose(
        mixed.float(), aug.transform(x, eps), atol=0.05
    )  # grid in bf16


def test_a_state_of_other_generators_is_refused_and_one_written_before_they_were_saved_loads():
    xy, augerino = AffineAugmentation(init=0.1), AffineAugmentation(generators="augerino", init=0.3)
    assert xy.state_dict()["generator_ids"].tolist() == [RANGE_NAMES.index(name) for name in xy.generators]
    expected = r"rotation, scale, stretch, shear: build the augmentation with generators='xy' \(--generators xy\)"
    with pytest.raises(PartitionCheckpointError, match=expected):
        augerino.load_state_dict(xy.state_dict())
    assert augerino.hyperparameters()["scale"] == float(torch.tensor(0.3))  # nothing loaded
    augerino.load_state_dict({"ranges": xy.ranges.detach()})  # an earlier checkpoint: ranges alone
    assert augerino.hyperparameters()["scale"] == float(torch.tensor(0.1))
    assert list(augerino.state_dict()) == ["ranges", "generator_ids"]


def test_named_starts_put_every_range_at_its_bound_or_0_and_a_bad_name_is_refused():
    aug = AffineAugmentation(init="bounds", max_range={"rotation": 1.0})
    expected = {name: float(torch.tensor(DEFAULT_MAX_RANGE[name])) for name in aug.generators} | {"rotation": 1.0}
    assert aug.hyperparameters() == expected
    zero = AffineAugmentation(init="zero")
    assert zero.hyperparameters() == AffineAugmentation(init=0.0).hyperparameters() == dict.fromkeys(expected, 0.0)
    assert AffineAugmentation().hyperparameters() == AffineAugmentation(init="wide").hyperparameters()  # the default
    with pytest.raises(PartitionArgumentError, match=r"init must be one of \('wide', 'zero', 'bounds'\), got 'bound'"):
        AffineAugmentation(init="bound")
