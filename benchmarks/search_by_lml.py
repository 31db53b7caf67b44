"""Searching non-differentiable hyperparameters by the partitioned LML against searching them on a validation split.

Task: scikit-learn's digits (1438 training and 359 test images of 8 x 8), an MLP of two hidden layers. The search
space: the learning rate (1e-4..1e-1, log), the weight decay (1e-7..1e-1, log) and the hidden width (8..256, log).
Both arms run Optuna's TPE sampler with the same seed for the same number of trials, every trial the same recipe
(Adam, cosine-annealed to 1/100 of the rate, ``--steps`` iterations of 64):

* ``lml``: ``partition_fx.integrations.optuna.LMLObjective``. Each trial trains a C=3 partitioned MLP
  ((0.8, 0.1, 0.1)) on ALL the training data and is scored by its conditional LML. There is no validation set.
  Pruning is off, so that both arms pay for whole trials.
* ``validation``: each trial trains the plain MLP on 80% of the training data and is scored by the mean
  log-likelihood of the other 20%.

Each arm's pick is then retrained plainly on all the training data and scored on the test split, which nothing
else reads. ``--train-examples N`` uses a seeded random subset of N training examples instead (the validation
arm then holds out 20% of those). ``default`` is the same retraining with Adam's usual 1e-3, no weight decay and
width 64, as a reference. Prints a table and writes ``benchmarks/results/search_by_lml.{json,md}``.

    python -m benchmarks.search_by_lml [--seeds 0,1,2] [--trials 20] [--steps 500] [--train-examples N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import torch
from torch import nn

from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results, write_text
from partition_fx import partitionify
from partition_fx.datasets import load_dataset
from partition_fx.training import TrainConfig

QUICK = {"trials": 3, "steps": 30}
DEFAULT = {"lr": 1e-3, "weight_decay": 0.0, "width": 64}
"""The reference: what one would train with without a search."""
BATCH_SIZE = 64


def mlp(width: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def suggest(trial: Any) -> dict[str, Any]:
    return {
        "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
        "weight_decay": trial.suggest_float("weight_decay", 1e-7, 1e-1, log=True),
        "width": trial.suggest_int("width", 8, 256, log=True),
    }


def train_plain(params: dict[str, Any], x: torch.Tensor, y: torch.Tensor, steps: int, seed: int) -> nn.Module:
    """The MLP trained plainly with the search's recipe: Adam, cosine to 1/100 of the rate, batches of 64 drawn
    uniformly with replacement (as the partitioned sampler draws them)."""
    model = mlp(params["width"], seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=params["lr"], weight_decay=params["weight_decay"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=params["lr"] / 100)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(len(y), (BATCH_SIZE,), generator=generator)
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    return model.eval()


def scores(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean log-likelihood)."""
    with torch.no_grad():
        out = model(x)
    return float((out.argmax(1) == y).float().mean()), float(-nn.functional.cross_entropy(out, y))


def search(arm: str, x: torch.Tensor, y: torch.Tensor, seed: int, trials: int, steps: int) -> dict[str, Any]:
    """One arm's study; returns its trials and its pick."""
    import optuna

    from partition_fx.integrations.optuna import LMLObjective

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    history: list[dict[str, Any]] = []
    if arm == "lml":
        config = TrainConfig.recommended(steps=steps, batch_size=BATCH_SIZE, finetune_steps=0, seed=seed)

        def build(trial: Any) -> tuple[Any, dict[str, Any]]:
            params = suggest(trial)
            pmodel = partitionify(mlp(params["width"], seed), 3, (0.8, 0.1, 0.1), seed=seed)
            return pmodel, {"lr": params["lr"], "weight_decay": params["weight_decay"]}

        objective: Any = LMLObjective(build, (x, y), config, pruning=False)
    else:
        permutation = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        cut = int(0.8 * len(y))
        fit_rows, held_out = permutation[:cut], permutation[cut:]

        def objective(trial: Any) -> float:
            model = train_plain(suggest(trial), x[fit_rows], y[fit_rows], steps, seed)
            return scores(model, x[held_out], y[held_out])[1]

    def timed(trial: Any) -> float:
        started = time.perf_counter()
        value = objective(trial)
        history.append(
            {"params": dict(trial.params), "score": value, "seconds": round(time.perf_counter() - started, 2)}
        )
        return value

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(timed, n_trials=trials)
    return {"trials": history, "pick": dict(study.best_params), "best_score": study.best_value}


def run_seed(data: Any, seed: int, trials: int, steps: int, examples: int | None) -> list[dict[str, Any]]:
    x, y = data.train.tensors
    if examples is not None:
        subset = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 + seed))[:examples]
        x, y = x[subset], y[subset]
    x_test, y_test = data.test.tensors
    rows = []
    for arm in ("lml", "validation", "default"):
        started = time.perf_counter()
        found = search(arm, x, y, seed, trials, steps) if arm != "default" else {"trials": [], "pick": DEFAULT}
        searched = time.perf_counter() - started
        final = train_plain(found["pick"], x, y, steps, seed)
        accuracy, loglik = scores(final, x_test, y_test)
        rows.append(
            {"arm": arm, "seed": seed, "pick": found["pick"], "best_score": found.get("best_score")}
            | {"test_accuracy": accuracy, "test_log_likelihood": loglik, "search_seconds": round(searched, 1)}
            | {"trials": found["trials"]}
        )
        pick = ", ".join(f"{k}={v:.3g}" for k, v in found["pick"].items())
        print(f"seed {seed} {arm:>10}: {pick}  test accuracy {accuracy:.3f}  log-lik {loglik:.3f}  ({searched:.0f} s)")
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--trials", type=int, default=20, help="trials per search (both arms)")
    parser.add_argument("--steps", type=int, default=500, help="iterations per trial and per retraining")
    parser.add_argument("--train-examples", type=int, default=None, help="a random subset of the training data")
    parser.add_argument("--out", default=str(RESULTS / "search_by_lml.json"))
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    trials, steps = (QUICK["trials"], QUICK["steps"]) if args.quick else (args.trials, args.steps)
    data = load_dataset("digits", size=8)
    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = [row for seed in seeds for row in run_seed(data, seed, trials, steps, args.train_examples)]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, 1 thread"
    result = results(
        header("search_by_lml", quick=args.quick, machine=machine),
        {"trials": trials, "steps": steps, "batch_size": BATCH_SIZE, "partitions": [0.8, 0.1, 0.1], "default": DEFAULT}
        | {"train_examples": args.train_examples or len(data.train.tensors[1])},
        rows,
        summary={"wall_seconds": round(time.perf_counter() - started, 1)},
    )
    print(tables.search_by_lml(result))
    if not args.quick:
        write_results(args.out, result)
        write_text(args.out.replace(".json", ".md"), tables.results_markdown(result, tables.search_by_lml))
    return result


if __name__ == "__main__":
    main()
