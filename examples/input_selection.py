"""Input selection by the partitioned marginal likelihood (the paper's synthetic experiment, section 5).

Only the first 3 of 8 inputs matter (``partition_fx.datasets.input_selection``). For each nested candidate
subset {x0}, {x0, x1}, ..., {x0..x7}, train a partitioned MLP (C=8 equal chunks, as in the paper) on
those inputs and compare marginal likelihoods, with no validation set. Then learn an ``InputMask`` over all
8 inputs directly: the mask should stay open on the informative inputs and close on the others.

Two numbers per candidate: the LML, sum_k log p(D_k | w^(k-1)), and its part over chunks 2..C, the
conditional LML log p(D_2:C | D_1). The Gaussian noise scale is a hyperparameter fitted on chunks 2..C;
the LML's first term scores D_1 with subnetwork 0 (untrained defaults) under that noise scale, so the
better a model fits, the smaller the noise scale and the worse that one term: it swamps the total. The
conditional LML is the number to rank by here (it is what the hyperparameter steps climb).

    python examples/input_selection.py            # about 3 minutes on 2 CPU cores
    python examples/input_selection.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from torch import nn

from partition_fx import partitionify
from partition_fx.datasets import input_selection
from partition_fx.training import Gaussian, fit
from partition_fx.transforms import InputMask


def mlp(inputs: int, width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


def train(x: torch.Tensor, y: torch.Tensor, steps: int, partitions: int, hyper: nn.Module | None = None, seed: int = 0):
    torch.manual_seed(seed)
    pmodel = partitionify(mlp(x.shape[1]), partitions, seed=seed)
    result = fit(
        pmodel,
        (x, y),
        hyper=hyper,
        likelihood=Gaussian(scale=1.0),
        steps=steps,
        batch_size=128,
        optimizer=partial(torch.optim.Adam, lr=3e-3),
        hyper_optimizer=partial(torch.optim.Adam, lr=1e-2),
        scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps, eta_min=3e-5),
        eval_every=max(1, steps // 5),
        seed=seed,
        progress=False,
    )
    return pmodel, result


def rmse(pmodel: nn.Module, x: torch.Tensor, y: torch.Tensor, hyper: nn.Module | None = None) -> float:
    with torch.no_grad():
        if hyper is not None:
            x = hyper.eval()(x)
        return float((pmodel.eval()(x) - y).square().mean().sqrt())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (few steps, small data)")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (30 if args.quick else 4000)
    data = input_selection(num_train=500 if args.quick else 3000, num_test=1000, num_inputs=8, num_informative=3)
    x, y = data.train.tensors
    xt, yt = data.test.tensors
    informative = data.info["informative"]
    print(f"{len(x)} training examples, 8 inputs, informative: {informative}; {steps} steps per candidate")
    print(f"{'inputs':<26} {'LML (nats)':>11} {'conditional LML':>16} {'noise scale':>12} {'test RMSE':>10}")
    rows = []
    for count in range(1, 9):
        subset = list(range(count))
        pmodel, result = train(x[:, subset], y, steps, partitions=8)
        row = {
            "inputs": subset,
            "lml": result.lml,
            "conditional_lml": result.conditional_lml,
            "noise_scale": result.hyperparameters["noise_scale"],
            "test_rmse": rmse(pmodel, xt[:, subset], yt),
        }
        rows.append(row)
        print(
            f"{subset!s:<26} {result.lml:>11.1f} {result.conditional_lml:>16.1f} {row['noise_scale']:>12.3f} "
            f"{row['test_rmse']:>10.4f}"
        )
    best = max(rows, key=lambda r: r["conditional_lml"])
    best_total = max(rows, key=lambda r: r["lml"])
    print(f"highest conditional LML: inputs {best['inputs']} (true subset: {informative})")
    print(f"highest LML: inputs {best_total['inputs']}")

    mask = InputMask(8, init=0.9)
    pmodel, result = train(x, y, steps, partitions=4, hyper=mask)
    values = mask.hyperparameters()["mask"]
    print("learned InputMask:", " ".join(f"x{i}={v:.2f}" for i, v in enumerate(values)))
    print(f"  test RMSE with the mask: {rmse(pmodel, xt, yt, mask):.4f}")
    return {
        "candidates": rows,
        "best_inputs": best["inputs"],
        "best_inputs_by_lml": best_total["inputs"],
        "informative": informative,
        "mask": values,
    }


if __name__ == "__main__":
    main()
