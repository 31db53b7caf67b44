"""Training with fixed hyperparameters (appendix G's retraining): ``partition-fx train --fix NAME=VALUE`` and
``--fix-from RUN``, and ``AffineAugmentation.fixed`` in ``fit``. Nothing is learned, the values are exactly the
ones asked for (as float32, the ranges' dtype), and bad names are refused with the known ones listed. Also
``--init NAME=VALUE``: learned ranges that start there, and ``--max-range NAME=VALUE``: the bounds they are learned
within."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx import partitionify
from partition_fx.choices import AFFINE_GENERATORS, GENERATOR_SETS, RANGE_NAMES
from partition_fx.cli import main
from partition_fx.datasets import load_dataset
from partition_fx.errors import PartitionArgumentError, PartitionTypeError, RangeError
from partition_fx.job.checks import check_job
from partition_fx.job.spec import JobSpec
from partition_fx.models import build_model
from partition_fx.ranges import DEFAULT_MAX_RANGE, WIDE_START, float32
from partition_fx.training import fit
from partition_fx.transforms import AffineAugmentation
from partition_fx.transforms.affine import GENERATORS

TINY = ["--model", "fixup_resnet8", "--image-size", "12", "--steps", "6", "--batch-size", "16", "--eval-every", "2"]
TINY += ["--samples", "2", "--quiet"]


def _float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _exit_status(argv: list[str]) -> int:
    """``partition-fx ARGV``'s exit status (argparse's refusals exit, the package's return)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def _report(run) -> dict:
    return json.loads((run / "report.json").read_text())


def test_the_command_line_names_the_ranges_the_augmentation_has() -> None:
    assert tuple(GENERATORS) == RANGE_NAMES and AffineAugmentation().generators == AFFINE_GENERATORS
    for name, generators in GENERATOR_SETS.items():
        assert AffineAugmentation(generators=name).generators == generators and set(generators) <= set(RANGE_NAMES)


def test_fix_trains_with_the_values_given_and_learns_nothing(tmp_path) -> None:
    run = tmp_path / "fixed"
    assert main(["train", *TINY, "--partitions", "1", "--fix", "rotation=3.1416,scale_x=0.2", "--out", str(run)]) == 0
    report = _report(run)
    expected = {name: 0.0 for name in AFFINE_GENERATORS} | {"rotation": _float32(3.1416), "scale_x": _float32(0.2)}
    assert report["hyperparameters"] == expected  # every other range at 0, the values exact
    assert [record["hyperparameters"] for record in report["history"]] == [expected] * len(report["history"])
    assert report["config"]["fix"] == {"rotation": 3.1416, "scale_x": 0.2} and report["config"]["fix_from"] is None
    # the run exports (its augmentation rebuilt fixed) and reproduces its test accuracy
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "export")]) == 0
    exported = json.loads((tmp_path / "export" / "export.json").read_text())
    assert exported["test_accuracy"] == report["test_accuracy"]


def test_fix_from_fixes_every_value_a_run_learned(tmp_path) -> None:
    learned, fixed = tmp_path / "learned", tmp_path / "fixed"
    assert main(["train", *TINY, "--hyper-lr", "0.2", "--out", str(learned)]) == 0
    ranges = _report(learned)["hyperparameters"]
    assert any(value > 0 for value in ranges.values())  # it learned something to fix
    assert main(["train", *TINY, "--partitions", "1", "--fix-from", str(learned), "--out", str(fixed)]) == 0
    report = _report(fixed)
    assert report["hyperparameters"] == ranges  # float32 values read back exactly
    assert report["config"]["fix"] == ranges and report["config"]["fix_from"] == str(learned)
    # a run that learned nothing, or did not finish, has no ranges to fix
    plain = tmp_path / "plain"
    assert main(["train", *TINY, "--partitions", "1", "--augment", "none", "--out", str(plain)]) == 0
    assert main(["train", *TINY, "--fix-from", str(plain), "--out", str(tmp_path / "x")]) == 2
    report = _report(learned) | {"status": "interrupted"}
    (learned / "report.json").write_text(json.dumps(report))
    assert main(["train", *TINY, "--fix-from", str(learned), "--out", str(tmp_path / "y")]) == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fix", "rotaton=1"], "unknown range 'rotaton' (did you mean rotation?); the ranges are translation_x, "),
        (["--fix", "zoom=1"], "the ranges are translation_x, translation_y, rotation, scale_x, scale_y, shear"),
        (["--fix", "rotation"], "expected NAME=VALUE pairs"),
        (["--fix", "rotation=1,rotation=2"], "rotation is given twice"),
        (["--fix", "rotation=-1"], "must be a finite half-width >= 0"),
        (["--fix", "rotation=nan"], "rotation=nan must be a finite number"),
        (["--train-range-factors", "rotation=-1"], "--train-range-factors rotation=-1.0 must be a finite factor > 0"),
        (["--train-range-factors", "scale=1"], "--train-range-factors names scale, which --generators xy does not"),
        (["--train-range-factors", "rotation=1", "--augment", "none"], "--train-range-factors scales the ranges of"),
        (["--fix", "rotation=pi"], "rotation='pi' is not a number"),
        (["--fix", "rotation=1", "--fix-from", "runs/x"], "not allowed with argument --fix"),
        (["--fix", "rotation=1", "--augment", "none"], "--fix fixes the ranges of --augment affine; drop --augment"),
        (["--partitions", "1"], "fix the ranges with --fix NAME=VALUE (or --fix-from RUN), or pass --augment none"),
        (["--init", "rotaton=1"], "unknown range 'rotaton' (did you mean rotation?); the ranges are translation_x"),
        (["--init", "rotation=1", "--fix", "rotation=1"], "not allowed with argument --init"),
        (["--init", "rotation=1", "--augment", "none"], "--init starts the ranges of --augment affine; drop"),
        (["--init", "rotation=3.2"], "--init rotation=3.2 is outside the range it is learned in, [0, 3.14159]"),
        (["--init", "rotation=1.5", "--max-range", "rotation=1"], "pass rotation=1 or less, or raise its bound with"),
        (["--max-range", "rotaton=1"], "unknown range 'rotaton' (did you mean rotation?)"),
        (["--max-range", "scale=1"], "--max-range names scale, which --generators xy does not have"),
        (["--max-range", "shear=0"], "--max-range shear=0 must be > 0: a range bounded at 0 cannot be learned"),
        (["--max-range", "rotation=4", "--fix", "rotation=1"], "and --fix fixes them (a fixed range may exceed"),
        (["--max-range", "rotation=4", "--augment", "none"], "--max-range bounds the ranges --augment affine learns"),
    ],
)
def test_bad_fixes_are_refused_before_anything_runs(tmp_path, capsys, argv, message) -> None:
    assert _exit_status(["train", *TINY, *argv, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_fit_with_a_fixed_augmentation_learns_nothing_and_records_it(tmp_path) -> None:
    data = load_dataset("digits", size=12)
    torch.manual_seed(0)
    pmodel = partitionify(build_model("fixup_resnet8", 10, in_chans=1, img_size=12), 1, seed=3)
    hyper = AffineAugmentation.fixed({"rotation": math.pi}, num_samples=2)
    before = hyper.ranges.detach().clone()
    options = {"steps": 4, "batch_size": 8, "seed": 3, "checkpoint_dir": tmp_path, "progress": False}
    result = fit(pmodel, data.train, hyper=hyper, **options)
    assert torch.equal(hyper.ranges.detach(), before) and not hyper.ranges.requires_grad
    assert result.hyperparameters["rotation"] == _float32(math.pi)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["config"]["fix"] == result.hyperparameters and record["config"]["partitions"] == 1
    assert main(["export", "--run", str(tmp_path), "--out", str(tmp_path / "export")]) == 0


def test_a_fixed_range_may_exceed_its_learning_bound() -> None:
    aug = AffineAugmentation.fixed({"rotation": 3.1416})
    assert aug.hyperparameters()["rotation"] == _float32(3.1416) > math.pi
    aug.constrain_()  # its bound holds it
    assert aug.hyperparameters()["rotation"] == _float32(3.1416)
    with pytest.raises(Exception, match="outside the bound"):  # a learned one may not
        AffineAugmentation(init={"rotation": 3.1416})


def test_init_starts_the_learned_ranges_there_and_every_other_at_zero(tmp_path) -> None:
    from partition_fx.cli.train import train_job

    job = train_job([*TINY, "--init", "rotation=1.5,shear=0.25"])
    expected = {name: 0.0 for name in AFFINE_GENERATORS} | {"rotation": 1.5, "shear": 0.25}
    assert job.hyper.hyperparameters() == expected and job.hyper.ranges.requires_grad  # learned from there
    assert train_job([*TINY, "--init", "zero"]).hyper.hyperparameters() == dict.fromkeys(AFFINE_GENERATORS, 0.0)
    bounds = {name: _float32(DEFAULT_MAX_RANGE[name]) for name in AFFINE_GENERATORS}
    assert train_job([*TINY, "--init", "bounds"]).hyper.hyperparameters() == bounds
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "2", "--init", "rotation=1.5", "--out", str(run)]) == 0
    report = _report(run)
    assert report["config"]["init"] == {"rotation": 1.5}
    assert report["initial_hyperparameters"] == {name: 0.0 for name in AFFINE_GENERATORS} | {"rotation": 1.5}
    assert report["hyperparameters"]["rotation"] != _float32(1.5)  # learned: it moved from its start
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "export")]) == 0


def test_max_range_bounds_the_learned_ranges_and_reaches_the_report_fit_and_export(tmp_path) -> None:
    from partition_fx.cli.train import train_job
    from partition_fx.job.records import read_spec

    argv = ["--generators", "augerino", "--max-range", "scale=1.3863", "--init", "scale=1.3863"]
    job = train_job([*TINY, *argv])
    bounds = {name: DEFAULT_MAX_RANGE[name] for name in GENERATOR_SETS["augerino"]} | {"scale": 1.3863}
    assert job.hyper.max_range == bounds and job.hyper.hyperparameters()["scale"] == _float32(1.3863)
    lowered = train_job([*TINY, "--init", "bounds", "--max-range", "rotation=1"]).hyper.hyperparameters()
    assert lowered["rotation"] == 1.0 and lowered["shear"] == _float32(DEFAULT_MAX_RANGE["shear"])
    run = tmp_path / "run"
    argv[-1] = "scale=1"  # above the default bound, within the raised one
    assert main(["train", *TINY, *argv, "--out", str(run)]) == 0
    report = _report(run)
    assert report["config"]["max_range"] == {"scale": 1.3863}
    assert math.log(2) < report["hyperparameters"]["scale"] != 1.0  # learned above the default bound
    samples = str(report["config"]["test_time_samples"])  # averaged over the ranges learned past the default bound
    assert main(["export", "--run", str(run), "--test-time-samples", samples, "--out", str(tmp_path / "export")]) == 0
    exported = json.loads((tmp_path / "export" / "export.json").read_text())
    assert exported["averaged_test_accuracy"] == report["averaged_test_accuracy"] is not None
    older = {key: value for key, value in report["config"].items() if key != "max_range"}
    assert read_spec(older).max_range is None  # a report written before it existed: the default bounds
    # fit records the bounds it learned within as the command's --max-range (None: every one its default)
    data = load_dataset("digits", size=12)
    pmodel = partitionify(build_model("fixup_resnet8", 10, in_chans=1, img_size=12), 2, seed=3)
    options = {"steps": 2, "batch_size": 8, "seed": 3, "progress": False}
    fit(
        pmodel,
        data.train,
        hyper=AffineAugmentation(max_range={"rotation": 1.0}),
        checkpoint_dir=tmp_path / "a",
        **options,
    )
    assert json.loads((tmp_path / "a" / "run.json").read_text())["config"]["max_range"] == {"rotation": 1.0}
    fit(pmodel, data.train, hyper=AffineAugmentation(), checkpoint_dir=tmp_path / "b", **options)
    assert json.loads((tmp_path / "b" / "run.json").read_text())["config"]["max_range"] is None


def test_generators_and_draws_reach_the_augmentation_the_report_and_export(tmp_path) -> None:
    from partition_fx.cli.train import train_job

    job = train_job([*TINY, "--generators", "augerino", "--draws", "stratified", "--init", "scale=0.3"])
    assert job.hyper.generators == GENERATOR_SETS["augerino"] and job.hyper.draws == "stratified"
    assert job.hyper.hyperparameters()["scale"] == _float32(0.3)
    with pytest.raises(Exception, match=r"--init names scale, which --generators xy does not have .* augerino"):
        train_job([*TINY, "--init", "scale=0.3"])
    run = tmp_path / "fixed"
    argv = ["--partitions", "1", "--generators", "augerino", "--fix", "stretch=0.2", "--out", str(run)]
    assert main(["train", *TINY, *argv]) == 0
    report = _report(run)
    assert report["config"]["generators"] == "augerino" and report["config"]["draws"] == "stratified"
    assert report["hyperparameters"] == dict.fromkeys(GENERATOR_SETS["augerino"], 0.0) | {"stretch": _float32(0.2)}
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "export")]) == 0
    # its checkpoint names its generators: the xy set, also six ranges, is refused with the fix
    from partition_fx.training import load_checkpoint

    pmodel = train_job([*TINY, *argv[:-2]]).pmodel
    load_checkpoint(pmodel, run / "checkpoint" / "last.safetensors", hyper=AffineAugmentation(generators="augerino"))
    with pytest.raises(Exception, match=r"of the generators .*scale, stretch.* build the augmentation with generators"):
        load_checkpoint(pmodel, run / "checkpoint" / "last.safetensors", hyper=AffineAugmentation())


def test_a_report_written_before_generators_and_draws_existed_reads_as_the_xy_set_drawn_uniformly() -> None:
    from partition_fx.cli.commands.train import job_spec
    from partition_fx.cli.parser import parse_train
    from partition_fx.job.records import read_spec

    config = job_spec(parse_train([])).to_dict()
    older = {key: value for key, value in config.items() if key not in ("generators", "draws")}
    spec = read_spec(older)
    assert (spec.generators, spec.draws) == ("xy", "uniform") and spec.to_dict() == {**config, "draws": "uniform"}
    without_steps = {**config, "train": {**config["train"], "optimization": {}}}
    with pytest.raises(Exception, match="earlier development version"):  # any other missing key is still refused
        read_spec(without_steps)


@pytest.mark.parametrize("generators", list(GENERATOR_SETS))
def test_the_wide_start_puts_every_range_at_its_wide_value_within_its_bound(generators) -> None:
    from partition_fx.cli.train import train_job

    augmentation = AffineAugmentation(generators=generators, init="wide", max_range={"translation_x": 0.1})
    expected = {name: _float32(WIDE_START[name]) for name in GENERATOR_SETS[generators]}
    assert augmentation.hyperparameters() == expected | {"translation_x": _float32(0.1)}  # the bound is lower
    assert augmentation.ranges.requires_grad and all(value > 0 for value in expected.values())  # none at 0
    job = train_job([*TINY, "--generators", generators, "--init", "wide"])
    assert job.hyper.hyperparameters() == expected and job.spec.init == "wide"
    default = train_job([*TINY, "--generators", generators])  # the default start
    assert default.hyper.hyperparameters() == expected and default.spec.init is None
    zero = train_job([*TINY, "--generators", generators, "--init", "zero"])  # the paper's
    assert zero.hyper.hyperparameters() == dict.fromkeys(expected, 0.0)


AGREE = settings(max_examples=60, deadline=None)


def _refusal(build) -> Exception | None:
    """What ``build()`` is refused with, or None when it is not."""
    try:
        build()
    except (PartitionArgumentError, PartitionTypeError) as e:
        return e
    return None


@AGREE
@given(generators=st.sampled_from(list(GENERATOR_SETS)), data=st.data())
def test_a_bound_is_ruled_on_once_and_the_job_and_the_transform_agree(generators, data) -> None:
    """A learned range's bound must be > 0: written once (``ranges.learning_bounds``), so
    ``JobSpec.max_range`` (and with it ``--max-range``) refuses exactly what the transform refuses, 0 included, each
    naming the bound its own way."""
    name = data.draw(st.sampled_from(GENERATOR_SETS[generators]))
    bound = data.draw(st.one_of(st.sampled_from([0.0, -0.0, 1e-300, -1.0]), st.floats()), label="bound")
    spec = _refusal(lambda: JobSpec(generators=generators, max_range={name: bound}))
    transform = _refusal(lambda: AffineAugmentation(generators=generators, max_range={name: bound}))
    assert (spec is None) == (transform is None)
    if bound == 0:  # the rule itself (a negative or non-finite bound is refused before it, as not a half-width)
        assert isinstance(transform, RangeError) and (transform.keyword, transform.generator) == ("max_range", name)
        assert str(transform) == f"max_range[{name!r}] must be > 0, got {bound}"
        assert str(spec) == f"max_range {name}={bound:g} must be > 0: a range bounded at 0 cannot be learned"


@AGREE
@given(generators=st.sampled_from(list(GENERATOR_SETS)), data=st.data())
def test_a_start_is_ruled_on_once_and_the_command_line_and_the_transform_agree(generators, data) -> None:
    """An initial range must lie within its bound: written once (``ranges.learning_start``), so
    ``--init`` (``check_job``) refuses exactly the starts the transform refuses, at the edge too (the bound as
    float32 reads it back is within), and names the bound the transform would learn within."""
    name = data.draw(st.sampled_from(GENERATOR_SETS[generators]))
    raised = data.draw(st.none() | st.floats(1e-3, 10.0), label="max_range")
    bound = DEFAULT_MAX_RANGE[name] if raised is None else raised
    edges = [bound, _float32(bound), math.nextafter(bound, math.inf), math.nextafter(_float32(bound), math.inf)]
    start = data.draw(st.sampled_from(edges) | st.floats(0.0, 3 * bound), label="init")  # --init's are >= 0
    max_range = None if raised is None else {name: raised}
    spec = JobSpec(generators=generators, init={name: start}, max_range=max_range)
    command_line = _refusal(lambda: check_job(spec))
    transform = _refusal(lambda: AffineAugmentation(generators=generators, init={name: start}, max_range=max_range))
    assert (command_line is None) == (transform is None)
    if transform is not None:
        assert isinstance(transform, RangeError) and (transform.generator, transform.value) == (name, start)
        assert str(command_line) == (
            f"--init {name}={start} is outside the range it is learned in, [0, {bound:.6g}]; "
            f"pass {name}={bound:.6g} or less, or raise its bound with --max-range {name}=VALUE"
        )


def test_init_takes_back_a_range_learned_at_its_bound() -> None:
    """A range learned up to its bound reads back as the bound rounded to float32 (pi -> 3.1415927...): ``--init``
    takes it back as the transform does (it refused it while it kept its own copy of the rule)."""
    at_bound = _float32(math.pi)
    assert at_bound > math.pi and check_job(JobSpec(init={"rotation": at_bound})) is None
    assert AffineAugmentation(init={"rotation": at_bound}).hyperparameters()["rotation"] == at_bound


@pytest.mark.parametrize("name", RANGE_NAMES)
def test_the_torch_free_float32_rounds_every_bound_and_start_as_torch_stores_it(name) -> None:
    """``ranges.float32``, which the start rule reads a bound back with before torch loads (``--init``), is
    torch's float32: for every default bound (pi included) and wide start."""
    for value in (DEFAULT_MAX_RANGE[name], WIDE_START[name], math.pi):
        assert float32(value) == _float32(value) and float32(-value) == _float32(-value)
    assert float32(math.pi) == 3.1415927410125732 != math.pi


@AGREE
@given(value=st.floats(allow_nan=False))
def test_the_torch_free_float32_is_torchs_for_any_bound(value) -> None:
    """Also at the edges: subnormals, halfway cases and values past float32's largest (an infinity, as torch's)."""
    assert float32(value) == _float32(value)
