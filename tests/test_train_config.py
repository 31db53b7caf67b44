"""The training configuration is the single source of truth of a run: it round-trips, refuses what it does not
know, generates the command line's options, and ``fit``'s defaults are the command's recipe."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from partition_fx import partitionify
from partition_fx.choices import RANGE_NAMES
from partition_fx.cli.commands.train import RUN_CONTROL, job_spec
from partition_fx.cli.parser import build_parser, parse_train, train_defaults
from partition_fx.errors import PartitionArgumentError, PartitionTypeError
from partition_fx.job.records import read_spec
from partition_fx.job.settings import Field
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit


def _value(field: Field) -> st.SearchStrategy:
    """Any value ``field`` takes."""
    option = field.option
    if option.choices is not None:
        values = st.sampled_from(option.choices)
    elif field.kind is bool:
        values = st.booleans()
    elif field.kind is int:
        values = st.integers(min_value=int(option.minimum or 0), max_value=2**63 - 1 if option.seed else 10_000)
    elif field.kind is Mapping:  # a factor per affine range (train_range_factors)
        factors = st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False)
        values = st.dictionaries(st.sampled_from(RANGE_NAMES), factors, max_size=3)
    else:
        low = 1e-12 if option.positive else 0.0
        high = option.maximum if option.maximum is not None else 1e6
        values = st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)
    return st.one_of(st.none(), values) if field.optional else values


@st.composite
def configs(draw: st.DrawFn) -> TrainConfig:
    keywords = {f.keyword: draw(_value(f)) for f in TrainConfig.fields()}
    keywords["steps"] = max(keywords["steps"], 1)
    if keywords["finetune_steps"] is not None:
        keywords["finetune_steps"] = min(keywords["finetune_steps"], keywords["steps"] - 1)
    if keywords["fused"]:  # one forward normalises both steps' batches: only with their own statistics
        keywords["hyper_norm"] = "batch"
    if keywords["fused"] or keywords["precision"] == "fp16":  # second derivatives: a backward of their own
        keywords["hyper_gradient"] = "fixed"
    if keywords["population"] > 1:  # the population's comparisons decide, not one run's patience
        keywords["patience"] = None
    else:  # a single run takes no population settings
        single = TrainConfig.recommended().flat()
        keywords.update({k: single[k] for k in keywords if k.startswith("population_")})
    return TrainConfig.recommended(**keywords)


@settings(max_examples=200, deadline=None)
@given(configs())
def test_a_configuration_round_trips_through_a_dict_and_json(config):
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert TrainConfig.recommended(**config.flat()) == config


@pytest.mark.parametrize(
    "values",
    [{"optimisation": {}}, {"optimization": {"stepz": 3}}, {"hyper": {"samples": 4, "sample": 2}}],
)
def test_unknown_keys_are_refused_with_the_known_ones_listed(values):
    with pytest.raises(PartitionArgumentError, match="unknown key") as caught:
        TrainConfig.from_dict(values)
    assert "it takes" in str(caught.value)
    with pytest.raises(PartitionTypeError, match=r"unknown argument\(s\) hyper_sample; it takes .*hyper_samples"):
        TrainConfig.recommended(hyper_sample=3)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"steps": 0}, "steps must be an int >= 1, got 0"),
        ({"hyper_lr": -1.0}, "hyper_lr must be positive"),
        ({"weight_decay": float("nan")}, "weight_decay must be finite and >= 0"),
        ({"hyper_chunks": "both"}, "hyper_chunks must be one of 'one', 'all'"),
        ({"steps": 10, "finetune_steps": 10}, r"finetune_steps \(10\) must be less than steps \(10\)"),
        ({"fused": "yes"}, "fused must be True or False"),
        ({"population": 2, "patience": 3}, "patience must be None with population >= 2"),
        ({"population_exploit": 0.75}, "population_exploit must be"),
        ({"seed": -1}, r"seed must be an int in 0..2\*\*63-1"),
    ],
)
def test_each_field_checks_its_value_where_it_is_declared(keywords, message):
    with pytest.raises((PartitionArgumentError, PartitionTypeError), match=message):
        TrainConfig.recommended(**keywords)


def test_the_generated_parser_s_defaults_are_the_configuration_s():
    defaults = train_defaults()
    config = TrainConfig()
    on_command_line = [f for f in TrainConfig.fields() if f.option.command_line]
    assert {f.keyword for f in on_command_line} <= set(defaults)
    for field in on_command_line:
        assert defaults[field.keyword] == config.value(field.keyword), field.keyword
    assert job_spec(parse_train([])).train == config.replace(checkpoint_defaults=False)


def test_every_configuration_field_is_an_option_of_train_or_says_why_not():
    options = {
        o for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions for o in a.option_strings
    }
    for field in TrainConfig.fields():
        assert (field.flag in options) == field.option.command_line, field.keyword
    left_out = sorted(f.keyword for f in TrainConfig.fields() if not f.option.command_line)
    assert left_out == ["checkpoint_defaults", "recalibrate_norms"]  # the command always sets these


def test_a_report_s_configuration_reads_back_as_the_options_that_wrote_it():
    argv = ["--steps", "30", "--hyper-samples", "4", "--compile", "--partitions", "2", "--seed", "9"]
    args = parse_train(argv)
    back = read_spec(json.loads(json.dumps(job_spec(args).replace(proportions=(0.5, 0.5)).to_dict())))
    for key, value in vars(args).items():
        if key in RUN_CONTROL:  # how to run and where to write: no report records them
            continue
        expected = (0.5, 0.5) if key == "proportions" else value
        assert back.value(key) == expected, key


def _data(n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    return x, (x.mean((1, 2, 3)) > 0).long()


def _pmodel() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return partitionify(net, 3, (0.8, 0.1, 0.1))


def test_fit_with_defaults_trains_what_the_command_s_recipe_trains():
    """``fit(pmodel, data, hyper=..., steps=N, seed=S)`` and the configuration ``partition-fx train --steps N
    --seed S`` gives (the command's checkpoint_defaults aside, which changes no weight) end in the same bits,
    fine-tuning, cosine schedule and all-chunk hyperparameter steps included."""
    from partition_fx.transforms import AffineAugmentation

    def train(config: TrainConfig | None, **keywords) -> tuple[dict, dict, list]:
        torch.manual_seed(1)
        pmodel, hyper = _pmodel(), AffineAugmentation(num_samples=2)
        result = fit(pmodel, _data(), config, hyper=hyper, progress=False, **keywords)
        return pmodel.state_dict(), hyper.state_dict(), result.history

    command = job_spec(parse_train(["--steps", "12", "--seed", "5"])).train
    model, hyper, history = train(None, steps=12, seed=5)
    model_cli, hyper_cli, history_cli = train(command)
    assert [r["phase"] for r in history][-1] == "finetune"  # the recipe fine-tunes the last quarter
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in history] == [
        {k: v for k, v in r.items() if k != "seconds"} for r in history_cli
    ]
    for mine, theirs in ((model, model_cli), (hyper, hyper_cli)):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_the_trainer_built_from_keywords_equals_the_one_built_from_a_configuration():
    config = TrainConfig.paper(batch_size=16, hyper_every=3)
    by_keywords = PartitionedTrainer(_pmodel(), _data(), batch_size=16, hyper_every=3, **_paper_rest())
    by_config = PartitionedTrainer(_pmodel(), _data(), config)
    assert by_keywords.config == by_config.config
    assert by_keywords.fingerprint() == by_config.fingerprint()


def test_the_paper_s_step_trains_on_the_ranges_themselves() -> None:
    assert TrainConfig.paper().hyper.train_range_factor == 1.0 and TrainConfig().hyper.train_range_factor == 0.5


def test_fine_tuning_takes_its_fraction_of_the_run_and_an_older_configuration_a_quarter() -> None:
    config = TrainConfig.recommended(steps=400)
    assert config.finetune_steps == 160 and config.replace(finetune_fraction=0.0).finetune_steps == 0
    assert config.replace(finetune_steps=7, finetune_fraction=0.9).finetune_steps == 7  # steps win
    written_before = config.to_dict()
    del written_before["finetuning"]["fraction"]
    assert TrainConfig.from_dict(written_before).finetune_steps == 100
    with pytest.raises(PartitionArgumentError, match="finetune_fraction"):
        TrainConfig.recommended(finetune_fraction=1.5)


def _paper_rest() -> dict:
    paper = TrainConfig.paper().flat()
    return {k: v for k, v in paper.items() if k not in ("batch_size", "hyper_every")}


def test_a_job_from_an_unknown_or_older_report_is_refused():
    spec = job_spec(parse_train([])).replace(proportions=(0.8, 0.1, 0.1))
    config = spec.to_dict()
    with pytest.raises(Exception, match="earlier development version"):
        read_spec({k: v for k, v in config.items() if k != "train"})
    with pytest.raises(Exception, match="unknown key"):
        read_spec({**config, "colour": "red"})
    assert read_spec(json.loads(json.dumps(config))) == spec
