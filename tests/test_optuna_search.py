"""Optuna searches scored by the LML (``partition_fx.integrations.optuna``): a real study, its trials scored by
``fit``'s conditional LML, one pruned by Optuna's pruner from the evaluations reported to it."""

from __future__ import annotations

import pytest
import torch

optuna = pytest.importorskip("optuna", reason="the optuna extra: pip install 'partition-fx[optuna]'")

from partition_fx import partitionify  # noqa: E402
from partition_fx.errors import PartitionArgumentError  # noqa: E402
from partition_fx.integrations.optuna import LMLObjective  # noqa: E402
from partition_fx.training import TrainConfig, fit  # noqa: E402

CONFIG = TrainConfig.recommended(steps=40, batch_size=16, finetune_steps=0, eval_every=10, seed=0)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 4, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def _build(trial):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return partitionify(model, 2, (0.7, 0.3)), {"lr": trial.suggest_float("lr", 1e-6, 1e-1, log=True)}


def test_each_trial_is_scored_by_the_conditional_lml_of_fit():
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"lr": 1e-2})
    study.optimize(LMLObjective(_build, _data(), CONFIG, pruning=False), n_trials=1)
    (trial,) = study.trials
    pmodel, keywords = _build(trial)
    result = fit(pmodel, _data(), CONFIG, progress=False, **keywords)
    assert trial.value == result.conditional_lml and trial.user_attrs["lml"] == result.lml


def test_the_pruner_prunes_a_trial_from_the_evaluations_reported_to_it():
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    )
    for lr in (1e-2, 3e-2, 1e-6):  # the last learns nothing: its LML trails the others' from the first evaluation
        study.enqueue_trial({"lr": lr})
    study.optimize(LMLObjective(_build, _data(), CONFIG), n_trials=3)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED]
    assert sorted(study.trials[0].intermediate_values) == [10, 20, 30, 40]
    assert list(study.trials[2].intermediate_values) == [10]


def test_a_build_that_returns_something_else_is_refused():
    study = optuna.create_study(direction="maximize")
    with pytest.raises(PartitionArgumentError, match=r"build\(trial\) must return \(pmodel, fit keywords"):
        study.optimize(LMLObjective(lambda trial: _build(trial)[0], _data(), CONFIG), n_trials=1, catch=())
    with pytest.raises(PartitionArgumentError, match=r"build must be a callable"):
        LMLObjective("build", _data())
