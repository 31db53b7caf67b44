"""Input selection: the partitioned LML against the post-hoc Laplace marginal likelihood (laplace-torch).

Synthetic regression (``partition_fx.datasets.input_selection``): only the first ``informative`` of ``inputs``
inputs matter. For each size and seed, every nested candidate subset {x0}, {x0, x1}, ..., {x0..x(D-1)} is
scored two ways, with no validation set:

* ``partitioned``: a C=8 partitioned MLP (equal chunks, the paper's choice) trained by ``fit`` with a
  learned Gaussian noise scale; the score is the conditional LML log p(D_2:C | D_1) (what its
  hyperparameter steps climb; see ``examples/input_selection.py`` for why not the full LML);
* ``laplace``: the same MLP trained plainly (C=1, same steps, batches and optimiser), then laplace-torch's
  diagonal-GGN Laplace approximation (``Laplace(..., "regression", hessian_structure="diag")``, as in the
  paper) with prior precision and noise scale fitted by maximising its marginal likelihood; the score is
  that log marginal likelihood.

Each method picks the subset it scores highest; the table says how often that is the true one and what
each costs (seconds, and forward/backward passes for training). The test split is used only for the RMSE
columns. Also learns an ``InputMask`` over all inputs with a C=4 partitioned model (masks above 0.5 count
as selected). Prints a table and writes ``benchmarks/results/model_selection.{json,md}``.

    python -m benchmarks.model_selection [--seeds 0,1,2] [--steps 1500] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import tables
from benchmarks.common import RESULTS, header, results, write_results, write_text
from benchmarks.methods import PassCounter
from partition_fx import export_subnetwork, partitionify
from partition_fx.datasets import input_selection
from partition_fx.training import Gaussian, fit
from partition_fx.transforms import InputMask

SIZES = [(4, 1), (6, 3), (8, 3)]  # (inputs, informative)
QUICK = {"steps": 20, "num_train": 200, "sizes": [(3, 1)]}


def mlp(inputs: int, width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


def _fit(x: torch.Tensor, y: torch.Tensor, partitions: int, steps: int, seed: int, hyper: nn.Module | None = None):
    """``fit`` with the example's recipe; C=1 with a fixed unit noise scale is plain least squares."""
    torch.manual_seed(seed)
    pmodel = partitionify(mlp(x.shape[1]), partitions, seed=seed)
    counter = PassCounter(pmodel)
    started = time.perf_counter()
    result = fit(
        pmodel,
        (x, y),
        hyper=hyper,
        likelihood=Gaussian(scale=1.0, learn_scale=partitions > 1),
        steps=steps,
        batch_size=128,
        optimizer=partial(torch.optim.Adam, lr=3e-3),
        hyper_optimizer=partial(torch.optim.Adam, lr=1e-2),
        scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps, eta_min=3e-5),
        eval_every=max(1, steps // 5),
        seed=seed,
        progress=False,
    )
    return export_subnetwork(pmodel).eval(), result, time.perf_counter() - started, counter.as_dict()


def laplace_evidence(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 100) -> float:
    """laplace-torch's log marginal likelihood of a trained regression ``model``: diagonal GGN, prior
    precision and noise scale fitted by gradient ascent on the marginal likelihood (laplace-torch's recipe)."""
    from laplace import Laplace

    with torch.no_grad():
        residual = float((model(x) - y).square().mean().sqrt())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256)
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag", sigma_noise=residual)
    la.fit(loader)
    log_prior = torch.zeros(1, requires_grad=True)
    log_sigma = torch.tensor([residual]).log().requires_grad_(True)
    optimizer = torch.optim.Adam([log_prior, log_sigma], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        (-la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())).backward()
        optimizer.step()
    with torch.no_grad():
        return float(la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp()))


def rmse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x) - y).square().mean().sqrt())


def run_size(inputs: int, informative: int, seed: int, steps: int, num_train: int) -> dict[str, Any]:
    data = input_selection(
        num_train=num_train, num_test=1000, num_inputs=inputs, num_informative=informative, seed=seed
    )
    x, y = data.train.tensors
    xt, yt = data.test.tensors
    candidates = []
    for count in range(1, inputs + 1):
        subset = list(range(count))
        final, result, seconds, passes = _fit(x[:, subset], y, 8, steps, seed)
        plain, _, plain_seconds, plain_passes = _fit(x[:, subset], y, 1, steps, seed)
        started = time.perf_counter()
        evidence = laplace_evidence(plain, x[:, subset], y)
        laplace_seconds = time.perf_counter() - started
        candidates.append(
            {
                "inputs": subset,
                "partitioned_conditional_lml": result.conditional_lml,
                "partitioned_seconds": seconds,
                "partitioned_passes": passes,
                "partitioned_test_rmse": rmse(final, xt[:, subset], yt),
                "laplace_lml": evidence,
                "laplace_seconds": plain_seconds + laplace_seconds,
                "laplace_fit_seconds": laplace_seconds,
                "plain_passes": plain_passes,
                "plain_test_rmse": rmse(plain, xt[:, subset], yt),
            }
        )
    mask = InputMask(inputs, init=0.9)
    final, result, seconds, passes = _fit(x, y, 4, steps, seed, hyper=mask)
    values = mask.hyperparameters()["mask"]

    def chosen(score: str) -> list[int]:
        return max(candidates, key=lambda c: c[score])["inputs"]

    return {
        "inputs": inputs,
        "informative": informative,
        "seed": seed,
        "candidates": candidates,
        "partitioned_choice": chosen("partitioned_conditional_lml"),
        "laplace_choice": chosen("laplace_lml"),
        "best_test_rmse_choice": min(candidates, key=lambda c: c["plain_test_rmse"])["inputs"],
        "mask": values,
        "mask_selected": [i for i, v in enumerate(values) if v > 0.5],
        "mask_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=1500, help="iterations per model (both methods)")
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS / "model_selection.json")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    steps, num_train, sizes = (
        (QUICK["steps"], QUICK["num_train"], QUICK["sizes"]) if args.quick else (args.steps, args.num_train, SIZES)
    )
    started = time.perf_counter()
    runs = [run_size(inputs, informative, seed, steps, num_train) for inputs, informative in sizes for seed in seeds]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, 1 thread"
    result = results(
        header("model_selection", quick=args.quick, machine=machine),
        {"steps": steps, "num_train": num_train},
        runs,
        summary={"wall_seconds": round(time.perf_counter() - started, 1)},
    )
    print(tables.model_selection(result) + "\n\n" + tables.model_selection_candidates(result))
    if not args.quick:
        write_results(args.out, result)
        write_text(
            args.out.with_suffix(".md"),
            tables.results_markdown(result, tables.model_selection, tables.model_selection_candidates),
        )
    return result


if __name__ == "__main__":
    main()
