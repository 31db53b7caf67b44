"""An Optuna search scored by the partitioned marginal likelihood, with no validation set.

The learning rate, the weight decay and the width of an MLP on scikit-learn's digits have no gradient for the LML
to follow, so Optuna searches them. Each trial trains one partitioned run on ALL the training data and is scored by
its conditional LML (``LMLObjective``). Every evaluation is reported to the trial, and Optuna's median pruner stops
the trials that trail. The best configuration is then trained with ``fit``, fine-tuning included, and its exported
model is scored on the test split, which the search never reads. ``pip install -e '.[optuna]'`` first.

    python examples/optuna_search.py          # 30 trials of 500 iterations
    python examples/optuna_search.py --quick  # a smoke run
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.datasets import load_dataset
from partition_fx.training import TrainConfig, fit

try:  # the optuna extra: one line naming its install, not a traceback
    from partition_fx.integrations.optuna import LMLObjective
except ImportError as missing:
    raise SystemExit(f"optuna_search.py: {missing}") from None

import optuna


def mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (3 short trials)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trials, steps = (3, 30) if args.quick else (30, 500)
    data = load_dataset("digits", size=8)

    def build(trial: optuna.Trial):
        torch.manual_seed(args.seed)
        pmodel = partitionify(mlp(trial.suggest_int("width", 8, 256, log=True)), 3, (0.8, 0.1, 0.1), seed=args.seed)
        keywords = {
            "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
            "weight_decay": trial.suggest_float("weight_decay", 1e-7, 1e-1, log=True),
        }
        return pmodel, keywords

    # the search: no fine-tuning (the LML is estimated before it), an evaluation every tenth of the run
    search = TrainConfig.recommended(steps=steps, finetune_steps=0, seed=args.seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=args.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5),
    )
    study.optimize(LMLObjective(build, data.train, search), n_trials=trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    print(f"{len(study.trials)} trials ({pruned} pruned); best conditional LML {study.best_value:.1f} with "
          f"{study.best_params}")  # fmt: skip

    # the final model: the best configuration, trained with fit's recipe (fine-tuning included) and exported
    best = study.best_params
    torch.manual_seed(args.seed)
    pmodel = partitionify(mlp(best["width"]), 3, (0.8, 0.1, 0.1), seed=args.seed)
    fit(pmodel, data.train, steps=steps, lr=best["lr"], weight_decay=best["weight_decay"], seed=args.seed,
        progress=False)  # fmt: skip
    final = export_subnetwork(pmodel).eval()
    x, y = data.test.tensors
    with torch.no_grad():
        accuracy = float((final(x).argmax(1) == y).float().mean())
    print(f"final model: test accuracy {accuracy:.3f}")
    return {"best_params": best, "test_accuracy": accuracy, "pruned": pruned, "trials": len(study.trials)}


if __name__ == "__main__":
    main()
