"""Where the variance of the hyper-gradient comes from, and what each estimator does to it.

The `partition-fx train` job (resnet10t, rotdigits, C=3, 0.8/0.1/0.1) is trained with the paper's scheme for
``--at`` iterations; then, at those fixed weights and ranges, the gradient of one hyperparameter step's loss
with respect to the rotation range is drawn ``--draws`` times per estimator, each draw with fresh randomness
in some parts and fixed randomness in the others:

* ``paper``: chunk k ~ Cat(u_2..C), 64 examples of D_k, 4 augmentation samples each (appendix I.1);
* ``fixed_chunk``: k = 2 always (the draw of k removed);
* ``fixed_batch``: one k and minibatch for every draw (only the augmentation noise left);
* ``fixed_noise``: the augmentation noise fixed (torch seed), k and minibatch drawn (only the data left);
* ``all``: every chunk 2..C (``hyper_chunks="all"``), 64 examples each, weighted;
* ``s16``: the paper's with 16 augmentation samples;
* ``all_s16_b16``: every chunk, 16 examples each, 16 samples (512 images, the cost of ``all``'s half): the
  recommended step (``TrainConfig.recommended()``);
* ``all_s16_b16_stratified``: the same with stratified augmentation draws (``draws="stratified"``: a Latin
  hypercube over the 16 samples);
* ``all_s16_b16_detached`` and ``all_s16_b16_running``: the recommended step with BatchNorm's batch statistics
  held constant in the backward pass, or with its running statistics (``hyper_norm``): these two change the
  gradient itself, not only its noise.

For each: the mean and standard deviation of the rotation component over the draws, the signal-to-noise
ratio |mean| / sd of ONE draw, and the images one draw puts through the network. The weights are those of
the paper's scheme at ``--at``; every estimator has the same expected gradient except ``s16`` (more samples
change the objective: log of a mean of more probabilities). Prints a table and writes
``research/results/hyper_gradient_variance.json``.

    python -m research.hyper_gradient_variance [--at 200] [--draws 48] [--seed 0] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.common import header, paper_scheme, results, write_results
from research import RESULTS, tables

ESTIMATORS = (
    "paper", "fixed_chunk", "fixed_batch", "fixed_noise", "all", "s16", "all_s16_b16", "all_s16_b16_stratified",
    "all_s16_b16_detached", "all_s16_b16_running",
)  # fmt: skip
RECOMMENDED = "all_s16_b16"
"""The estimator of the recommended step; those named ``RECOMMENDED_<variant>`` change one thing of it."""


def _rotation_gradient(
    trainer: Any, batches: list[tuple[float, int, torch.Tensor]], samples: int | None, norms: str = "batch"
) -> float:
    """d/d(rotation range) of sum_k weight_k * mean NLL of chunk k's batch through subnetwork k-1, BatchNorm
    normalising as ``norms`` says (``hyper_norm``)."""
    from partition_fx.training.objective.lml import forward_log_likelihood, hyper_step_norms

    ranges = trainer.steps.hyper.ranges
    loss = 0.0
    with hyper_step_norms(trainer.pmodel, norms):
        for weight, k, indices in batches:
            x, y = trainer.examples.batch(indices, trainer.steps.device)
            log_likelihood = forward_log_likelihood(
                trainer.pmodel, trainer.steps.likelihood, x, y, k - 1, trainer.steps.hyper, samples=samples
            )
            loss = loss + weight * -log_likelihood.mean()
    (grad,) = torch.autograd.grad(loss, ranges)
    return float(grad[trainer.steps.hyper.generators.index("rotation")])


def draw(trainer: Any, estimator: str, fixed: dict[str, Any], generator: torch.Generator) -> tuple[float, int]:
    """One gradient draw of ``estimator`` and the images it put through the network."""
    sampler = trainer.sampler
    recommended = estimator.startswith(RECOMMENDED)
    variant = estimator.removeprefix(RECOMMENDED).lstrip("_")
    batch = 16 if recommended else 64
    samples = 16 if estimator == "s16" or recommended else None

    def chunk_batch(k: int) -> torch.Tensor:
        pool = trainer.chunks.chunk(k)
        return pool[torch.randint(pool.numel(), (batch,), generator=generator)]

    if estimator == "all" or recommended:
        batches = [(w, k, chunk_batch(k)) for w, k, _ in sampler.hyper_batches()]
    elif estimator == "fixed_batch":
        batches = [fixed["batch"]]
    else:
        k = (
            2
            if estimator == "fixed_chunk"
            else 2 + int(torch.multinomial(sampler.hyper_chunk_probabilities, 1, generator=generator))
        )
        batches = [(1.0, k, chunk_batch(k))]
    if estimator == "fixed_noise":
        torch.manual_seed(fixed["noise_seed"])
    images = sum(int(i.numel()) for _, _, i in batches) * (samples or trainer.steps.hyper.num_samples)
    trainer.steps.hyper.draws = "stratified" if variant == "stratified" else "uniform"
    norms = variant if variant in ("detached", "running") else "batch"
    return _rotation_gradient(trainer, batches, samples, norms), images


def main(argv: list[str] | None = None) -> dict:
    from partition_fx.cli.train import train_job
    from partition_fx.training import PartitionedTrainer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, default=200, help="paper-scheme iterations before measuring")
    parser.add_argument("--draws", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=RESULTS / "hyper_gradient_variance.json")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    args = parser.parse_args(argv)
    argv_job = ["--seed", str(args.seed), "--device", args.device, "--steps", str(max(args.at, 1))]
    argv_job += ["--quiet", *paper_scheme(*((2, 64) if args.quick else (4, 64)))]
    if args.quick:
        argv_job += ["--model", "fixup_resnet8", "--image-size", "12", "--samples", "2"]
    job = train_job(argv_job)
    config = job.config.replace(finetune_steps=0, recalibrate_norms=False)
    torch.manual_seed(args.seed)
    trainer = PartitionedTrainer(job.pmodel, job.data.train, config, hyper=job.hyper)
    started = time.perf_counter()
    if args.at:
        trainer.run(progress=False)
    trained_seconds = time.perf_counter() - started
    trainer.pmodel.train()
    trainer.steps.hyper.train()
    generator = torch.Generator().manual_seed(args.seed + 100)
    fixed = {"batch": (1.0, 2, trainer.chunks.chunk(2)[:64]), "noise_seed": args.seed + 7}
    rows = []
    for estimator in ESTIMATORS:
        torch.manual_seed(args.seed + 1000)
        values, images = [], 0
        for _ in range(args.draws):
            value, images = draw(trainer, estimator, fixed, generator)
            values.append(value)
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        rows.append(
            {
                "estimator": estimator,
                "mean": mean,
                "sd": sd,
                "snr": abs(mean) / sd if sd > 0 else float("inf"),
                "images_per_draw": images,
                "draws": values,
            }
        )
    rotation = trainer.steps.objective.hyperparameter_values()["rotation"]
    config = {"at": args.at, "draws": args.draws, "seed": args.seed, "rotation_at": rotation}
    payload = results(header("hyper_gradient_variance", quick=args.quick, device=args.device), config, rows)
    payload["config"]["trained_seconds"] = round(trained_seconds, 1)
    print(f"rotation range at iteration {args.at}: {rotation:.3f} rad")
    print(tables.hyper_gradient_variance(payload))
    if not args.quick:
        write_results(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
