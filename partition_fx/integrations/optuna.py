"""Optuna searches scored by the partitioned marginal likelihood, with no validation set (the ``optuna`` extra).

The LML learns what has a gradient (augmentation ranges, dropout, input masks). What has none (learning rate,
weight decay, width, the number of partitions, the architecture) is searched: each trial trains one partitioned
run on all the training data and is scored by its conditional LML, log p(D_2..D_C | D_1), the evidence
``partition-fx`` ranks its own states by. :class:`LMLObjective` is the objective, and :class:`LMLPruning` reports
every evaluation to the trial and prunes it when Optuna's pruner says so.

``benchmarks/search_by_lml.py`` compares, at equal trials, this search with the same search scored on a held-out
validation split (``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import PartitionArgumentError
from ..extras import import_extra
from ..fx.partitioned_model import PartitionedModel
from ..job.train_config import TrainConfig
from ..training.loop.fit import fit
from ..training.objective.lml import NO_EVIDENCE, EvaluationRecord, evidence

if TYPE_CHECKING:  # the test extra installs optuna: mypy reads its types
    import optuna
else:
    optuna = import_extra("partition_fx.integrations.optuna", "optuna")  # one line naming the install, if missing

Build = Callable[["optuna.Trial"], tuple[PartitionedModel, Mapping[str, Any]]]
"""``build(trial) -> (pmodel, keywords)``: the trial's partitioned model and ``fit``'s keywords for it (``lr=``,
``weight_decay=``, ``hyper=``, any ``TrainConfig`` field), from ``trial.suggest_*``."""


class LMLPruning:
    """A ``fit`` callback that reports each evaluation's evidence (the conditional LML; ``training.evidence``) to
    ``trial`` at its step, and raises ``optuna.TrialPruned`` when the study's pruner prunes the trial. Fine-tuning
    evaluations, which estimate no LML, report nothing.

    >>> study = optuna.create_study(direction="maximize")
    >>> trial = study.ask()
    >>> LMLPruning(trial)(None, {"step": 10, "conditional_lml": -40.0, "lml": -90.0})
    >>> trial.storage.get_trial(trial._trial_id).intermediate_values
    {10: -40.0}
    """

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial

    def __call__(self, trainer: Any, record: EvaluationRecord) -> None:
        score = evidence(record)
        if score is None:
            return
        self.trial.report(score, record["step"])
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {record['step']}: conditional LML {score:.2f}")


class LMLObjective:
    """An Optuna objective: each trial ``build``s a partitioned model and ``fit``'s keywords from the trial's
    suggestions, trains it on ``dataset`` as ``config`` says (default ``TrainConfig.recommended(finetune_steps=0)``:
    the LML is estimated before fine-tuning, which a search need not pay for), and returns the evidence of the
    state ``fit`` returns (its conditional LML; higher is better: ``direction="maximize"``). With ``pruning``,
    every evaluation is reported to the trial (:class:`LMLPruning`). The trial's user attributes keep the full
    LML, the learned hyperparameters and the best step.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> x = torch.randn(200, 4); y = (x[:, 0] > 0).long()
        >>> def build(trial):
        ...     width = trial.suggest_int("width", 4, 16)
        ...     model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
        ...     return partitionify(model, 2, (0.7, 0.3)), {"lr": trial.suggest_float("lr", 1e-3, 1e-1, log=True)}
        >>> objective = LMLObjective(build, (x, y), TrainConfig.recommended(steps=20, finetune_steps=0))
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
        >>> study.optimize(objective, n_trials=3)
        >>> sorted(study.best_params), study.best_value < 0
        (['lr', 'width'], True)
    """

    def __init__(self, build: Build, dataset: Any, config: TrainConfig | None = None, *, pruning: bool = True) -> None:
        if not callable(build):
            raise PartitionArgumentError(
                f"build must be a callable trial -> (pmodel, fit keywords), got {type(build).__name__}"
            )
        self.build = build
        self.dataset = dataset
        self.config = config if config is not None else TrainConfig.recommended(finetune_steps=0)
        self.pruning = pruning

    def __call__(self, trial: optuna.Trial) -> float:
        built = self.build(trial)
        if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], Mapping)):
            raise PartitionArgumentError(
                f"build(trial) must return (pmodel, fit keywords as a dict), got {type(built).__name__}"
            )
        pmodel, keywords = built
        if isinstance(pmodel, PartitionedModel) and pmodel.num_partitions < 2:
            raise PartitionArgumentError(f"LMLObjective scores a trial by its evidence; {NO_EVIDENCE}: build(trial) "
                                         "must partition the model into 2 or more")  # fmt: skip
        callbacks = [LMLPruning(trial)] if self.pruning else []
        result = fit(pmodel, self.dataset, self.config, callbacks=callbacks, progress=False, **keywords)
        score = evidence({"conditional_lml": result.conditional_lml, "lml": result.lml})
        trial.set_user_attr("lml", result.lml)
        trial.set_user_attr("hyperparameters", result.hyperparameters)
        trial.set_user_attr("best_step", result.best_step)
        if score is None:  # refused above: only a model of one partition has no conditional LML
            raise PartitionArgumentError(f"LMLObjective scores a trial by its evidence; {NO_EVIDENCE}")
        return float(score)
