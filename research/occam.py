"""Does an Occam term at fixed weights reward the range the data holds? The Laplace evidence against the conditional
LML, scored across ranges at weights trained at one range.

The conditional LML (the partitioned objective) at fixed weights can say "too wide" but not "too narrow": weights
trained at a range score best at about that range, and for the zoom on ``scaledigits`` it narrows even from the
truth (``branch_check --generator scale``). LILA (Immer, van der Ouderaa et al. 2022) learns that zoom from 0 by
the Laplace evidence of an invariant model, log p(D | w) + log p(w) - 1/2 log det(H / 2 pi): its log-determinant
is an Occam term that acts at fixed weights. This check measures whether such a term points the right way here:
the default job's partitioned model is trained ``--steps`` iterations with one range FIXED at r (every other 0;
``research.fixed_range``), and then, at those weights, scored at ranges r' = 0 and r e^g (g in ``--offsets``) by

* ``conditional_lml``: the partitioned objective (``research.probes.conditional_lml``: chunks 2..C through
  subnetworks 1..C-1, a midpoint rule over the range's coefficient);
* the **last-layer Laplace evidence** of the final subnetwork on the whole training split, LILA's objective with
  its Kronecker-factored (KFAC) curvature restricted to the classifier: the invariant model's logits are the mean
  over the midpoint views of the logits (the classifier is linear, so the mean of the views' features goes through
  it), ``loglik`` their log-likelihood, ``occam`` = log p(theta) - 1/2 log det(H / 2 pi) with H = delta I + B (x) A
  (A the features' second moment summed over examples with a 1 for the bias, B the mean softmax Hessian), the prior
  precision delta chosen at each r' to maximise the evidence (as LILA and laplace-torch fit it), ``evidence`` their
  sum.

BatchNorm normalises each batch of views by its own statistics (as the conditional LML and a hyperparameter step
see them); the weights are never changed. The rows give each seed and r'; the summary each score's secant at r
(nats per unit of range, over r e^+-``--step``) with its mean, standard error and count positive over seeds, and
the r' each score prefers.

``--network`` adds the **whole network's** Occam term, as LILA's: every Conv2d's and Linear's generalised
Gauss-Newton Kronecker-factored (:func:`kronecker_factors`: the views a weight-sharing dimension reduced, a
convolution's positions expanded), each layer's prior precision fitted (:func:`network_occam`): ``network_occam``,
and ``network_evidence`` = ``loglik`` + ``network_occam``. BatchNorm's scales and shifts are left out (KFAC factors
convolutions and Linears only).

``--follow`` asks what following each score does once the weights train at what it chooses: from ``r`` the run
trains ``--every`` iterations at the range, then scores r e^-step, r and r e^step at its weights and moves to the
best of them (one run per objective of ``--objectives``: the conditional LML, the Laplace evidence, or the
conditional LML plus the Occam part), and so on to the end of the run (a coordinate ascent with the weights
following, as LILA alternates). Rows are kept per run under ``--runs`` and reused with the same settings.

    python -m research.occam    # scaledigits' zoom at the truth and at 0.16, rotdigits at 1.0, digits at 0.5
    python -m research.occam --follow --configs scaledigits:scale:0.1:0+1 --objectives evidence --out FILE
    python -m research.occam --network --configs drawndigits:scale:0.347 --image-size 28 --offsets -0.4 0 0.4
    python -m research.occam --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import header, results, write_json, write_results
from partition_fx import export_subnetwork
from partition_fx.transforms import AffineAugmentation
from research import RESULTS
from research.fixed_range import FixedRangeRun, train_at_fixed_range
from research.probes import conditional_lml, midpoint_draws

PRIOR_PRECISIONS = torch.logspace(-4, 4, 801, dtype=torch.float64)
"""The prior precisions the evidence is maximised over at each range (a grid of 100 per decade)."""


@torch.no_grad()
def invariant_features(model: torch.nn.Module, aug: AffineAugmentation, x: torch.Tensor, batch: int) -> torch.Tensor:
    """The mean over the midpoint views of ``model``'s pre-logit features (timm's ``forward_head(pre_logits=True)``)
    of each example of ``x``, in float64; BatchNorm on each batch's views' statistics."""
    draws = midpoint_draws()
    samples = len(draws)
    model.train()
    out = []
    for start in range(0, len(x), batch):
        xb = x[start : start + batch]
        views = aug.transform(xb, draws[:, None, :].expand(samples, len(xb), 1))
        features = model.forward_head(model.forward_features(views), pre_logits=True)
        out.append(features.view(samples, len(xb), -1).mean(0).double())
    return torch.cat(out)


def last_layer_evidence(features: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> dict:
    """The Laplace evidence of a linear classifier (``weight`` [C, F], ``bias`` [C]) on ``features`` [N, F] with
    labels ``y``, its curvature Kronecker-factored (B (x) A) and its isotropic Gaussian prior's precision chosen to
    maximise it: ``loglik``, ``occam`` (log prior density - 1/2 log det(H / 2 pi)), ``evidence`` and
    ``prior_precision``."""
    theta = torch.cat([weight.double(), bias.double()[:, None]], 1)  # [C, F + 1]
    phi = torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], 1)
    logits = phi @ theta.T
    loglik = float(torch.log_softmax(logits, -1).gather(1, y[:, None]).sum())
    p = torch.softmax(logits, -1)
    hessians = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    a = torch.linalg.eigvalsh(phi.T @ phi).clamp_min(0)  # the features' summed second moment
    b = torch.linalg.eigvalsh(hessians.mean(0)).clamp_min(0)
    occam = _occam_over_precisions(a, b, theta.numel(), float(theta.pow(2).sum()))
    best = int(occam.argmax())
    return {
        "loglik": loglik,
        "occam": float(occam[best]),
        "evidence": loglik + float(occam[best]),
        "prior_precision": float(PRIOR_PRECISIONS[best]),
    }


@dataclass
class KroneckerFactors:
    """One layer's curvature B (x) A in the invariant model: ``a`` the inputs' second moment (the views' inputs
    averaged first, a convolution's patches then averaged over positions, a 1 appended for a bias), ``b`` the
    output gradients' second moment summed over examples (the views' gradients summed first), ``theta`` the layer's
    weights as one [out, in (+1)] matrix."""

    a: torch.Tensor
    b: torch.Tensor
    theta: torch.Tensor


def _patches(module: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """A layer's inputs as [examples, positions, features] (a convolution's unfolded patches, a Linear's one
    position), with a 1 appended where it has a bias."""
    if isinstance(module, torch.nn.Conv2d):
        unfolded = torch.nn.functional.unfold(inputs, module.kernel_size, module.dilation, module.padding,
                                              module.stride).transpose(1, 2)  # fmt: skip
    else:
        unfolded = inputs[:, None, :]
    if module.bias is not None:
        unfolded = torch.cat([unfolded, unfolded.new_ones(*unfolded.shape[:2], 1)], -1)
    return unfolded.double()


def kronecker_factors(
    model: torch.nn.Module, aug: AffineAugmentation, x: torch.Tensor, y: torch.Tensor, batch: int
) -> tuple[float, dict[str, KroneckerFactors]]:
    """The invariant model's log-likelihood of ``y`` (its logits the mean over the midpoint views of ``model``'s)
    and every Conv2d's and Linear's Kronecker-factored generalised Gauss-Newton, as LILA's KFAC: the loss
    Hessian's square root propagated back once per class, the views a weight-sharing dimension that is reduced
    (their inputs averaged, their output gradients summed: exact for the classifier, whose input the views share),
    a convolution's positions expanded (their patches' second moment averaged over positions, their gradients'
    summed). BatchNorm normalises each batch of views by its own statistics, as :func:`invariant_features`.

    curvlinops' KFAC (laplace-torch's backend) reduces or expands over a layer's own input dimensions only; here
    the views lie in a convolution's batch dimension, so the factors are collected by hooks (tested against
    laplace-torch's Kronecker factors at one view, and against the one-example-at-a-time definition)."""
    layers = {name: module for name, module in model.named_modules()
              if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))}  # fmt: skip
    for name, module in layers.items():
        if isinstance(module, torch.nn.Conv2d) and (module.groups != 1 or module.padding_mode != "zeros"):
            raise ValueError(f"kronecker_factors: {name} is a grouped or non-zero-padded convolution; only plain "
                             "convolutions are Kronecker-factored here")  # fmt: skip
    draws = midpoint_draws()
    samples = len(draws)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name: str):
        return lambda module, inputs, output: seen.__setitem__(name, (inputs[0], output))

    handles = [module.register_forward_hook(keep(name)) for name, module in layers.items()]
    a: dict[str, torch.Tensor] = {}  # summed over the batches
    b: dict[str, torch.Tensor] = {}
    loglik, positions = 0.0, {}
    model.train()
    try:
        for start in range(0, len(x), batch):
            xb, yb = x[start : start + batch], y[start : start + batch]
            views = aug.transform(xb, draws[:, None, :].expand(samples, len(xb), 1))
            logits = model(views).view(samples, len(xb), -1).mean(0)
            loglik += float(torch.log_softmax(logits.detach().double(), -1).gather(1, yb[:, None]).sum())
            names = list(seen)
            for name in names:  # the views' inputs averaged: unfolding is linear, so before it
                inputs = seen[name][0].detach()
                patches = _patches(layers[name], inputs.view(samples, len(xb), *inputs.shape[1:]).mean(0))
                positions[name] = patches.shape[1]
                moment = torch.einsum("npi,npj->ij", patches, patches)
                a[name] = a[name] + moment if name in a else moment
            # the softmax NLL's Hessian diag(p) - p p^T = L L^T with L = diag(sqrt p) - p sqrt(p)^T
            p = torch.softmax(logits.detach(), -1)
            root = torch.diag_embed(p.sqrt()) - p[:, :, None] * p.sqrt()[:, None, :]
            outputs = [seen[name][1] for name in names]
            for column in range(root.shape[-1]):
                grads = torch.autograd.grad(logits, outputs, root[:, :, column], retain_graph=True)
                for name, grad in zip(names, grads):
                    summed = grad.view(samples, len(xb), grad.shape[1], -1).sum(0).double()  # [n, out, positions]
                    moment = torch.einsum("nip,njp->ij", summed, summed)
                    b[name] = b[name] + moment if name in b else moment
            seen.clear()
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for name, module in layers.items():
        theta = module.weight.detach().flatten(1).double()
        if module.bias is not None:
            theta = torch.cat([theta, module.bias.detach().double()[:, None]], 1)
        found[name] = KroneckerFactors(a[name] / (len(x) * positions[name]), b[name], theta)
    return loglik, found


def network_occam(factors: dict[str, KroneckerFactors]) -> tuple[float, dict[str, float]]:
    """The whole network's Occam term, sum over layers of log N(theta; 0, I / delta) - 1/2 log det((delta I +
    B (x) A) / 2 pi), each layer's prior precision delta chosen on :data:`PRIOR_PRECISIONS` to maximise its part
    (LILA's layer-wise prior); the term and each layer's delta."""
    total, deltas = 0.0, {}
    for name, layer in factors.items():
        a = torch.linalg.eigvalsh(layer.a).clamp_min(0)
        b = torch.linalg.eigvalsh(layer.b).clamp_min(0)
        count, norm = layer.theta.numel(), float(layer.theta.pow(2).sum())
        # a layer has up to millions of eigenvalue products: every 10th precision first, then the grid around the
        # best of them (the part is unimodal in delta: its derivative P / delta - |theta|^2 - sum 1 / (delta + l)
        # changes sign once)
        coarse = _occam_over_precisions(a, b, count, norm, PRIOR_PRECISIONS[::10])
        best = 10 * int(coarse.argmax())
        around = slice(max(0, best - 10), best + 11)
        fine = _occam_over_precisions(a, b, count, norm, PRIOR_PRECISIONS[around])
        total += float(fine.max())
        deltas[name] = float(PRIOR_PRECISIONS[around][int(fine.argmax())])
    return total, deltas


def _occam_over_precisions(
    a: torch.Tensor, b: torch.Tensor, count: int, norm: float, deltas: torch.Tensor = PRIOR_PRECISIONS
) -> torch.Tensor:
    """log N(theta; 0, I / delta) - 1/2 log det((delta + B (x) A) / 2 pi) at each of ``deltas`` (the 2 pi terms
    cancel), from A's and B's eigenvalues."""
    occam = 0.5 * count * deltas.log() - 0.5 * deltas * norm
    products = (b[:, None] * a[None, :]).flatten()
    for chunk in products.split(1 << 16):  # [deltas, chunk] at a time, not [deltas, products]
        occam = occam - 0.5 * torch.log(deltas[:, None] + chunk[None, :]).sum(1)
    return occam


def scores(fixed: FixedRangeRun, ranges: list[float], batch: int, network: bool = False) -> list[dict[str, float]]:
    """At ``fixed``'s weights, with its generator's range at each of ``ranges``: the conditional LML and the final
    subnetwork's last-layer Laplace evidence on the training split (``loglik``, ``occam``, ``evidence``,
    ``prior_precision``); with ``network`` also the whole network's Occam term (:func:`network_occam`) and its
    evidence (``network_occam``, ``network_evidence``)."""
    final = export_subnetwork(fixed.pmodel)  # a copy: its BatchNorm buffers may move, the run's do not
    classifier = final.get_classifier()
    weight, bias = classifier.weight.detach(), classifier.bias.detach()
    found = []
    for scored in ranges:
        aug = AffineAugmentation.fixed({fixed.generator: scored}, generators=[fixed.generator])
        features = invariant_features(final, aug, fixed.x, batch)
        found.append({
            "conditional_lml": conditional_lml(fixed.pmodel, fixed.generator, scored, fixed.x, fixed.y, fixed.chunks),
            **last_layer_evidence(features, fixed.y, weight, bias),
        })  # fmt: skip
        if network:
            loglik, factors = kronecker_factors(final, aug, fixed.x, fixed.y, batch)
            occam, _ = network_occam(factors)
            found[-1].update(network_occam=occam, network_evidence=loglik + occam)
    return found


def run(data: str, generator: str, r: float, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    fixed = train_at_fixed_range(data, generator, r, seed, steps=args.steps, image_size=args.image_size)
    offsets = [None, *args.offsets]
    ranges = [0.0 if offset is None else r * math.exp(offset) for offset in offsets]
    started = time.perf_counter()
    found = scores(fixed, ranges, args.batch, args.network)
    each = round((time.perf_counter() - started) / len(ranges), 1)
    return [
        {"data": data, "generator": generator, "r": r, "seed": seed, "offset": offset, "scored_at": scored, **score,
         "train_seconds": round(fixed.seconds, 1), "score_seconds": each}
        for offset, scored, score in zip(offsets, ranges, found)
    ]  # fmt: skip


OBJECTIVES = {
    "conditional_lml": lambda s: s["conditional_lml"],
    "evidence": lambda s: s["evidence"],
    "conditional_lml+occam": lambda s: s["conditional_lml"] + s["occam"],
    "network_evidence": lambda s: s["network_evidence"],
    "conditional_lml+network_occam": lambda s: s["conditional_lml"] + s["network_occam"],
}
"""What ``--follow`` maximises at each decision, from a candidate range's :func:`scores`."""


def follow(
    data: str, generator: str, start: float, seed: int, objective: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Train at ``start``; every ``args.every`` iterations move the range to the best of r e^-step, r, r e^step by
    ``objective`` (one of :data:`OBJECTIVES`) at the weights trained so far; the range at each decision and the
    final one."""
    fixed = train_at_fixed_range(data, generator, start, seed, steps=0, image_size=args.image_size,
                                 total=args.steps)  # fmt: skip
    maximised = OBJECTIVES[objective]
    started = time.perf_counter()
    r, decisions = start, []
    for step in range(args.every, args.steps, args.every):
        fixed.train_to(step)
        candidates = [r * math.exp(sign * args.step) for sign in (-1, 0, 1)]
        scored = scores(fixed, candidates, args.batch, args.network or "network" in objective)
        chosen = max(range(3), key=lambda i: maximised(scored[i]))
        decisions.append({"step": step, "r": r, "chosen": candidates[chosen],
                          "scores": {f"{sign:+d}": value for sign, value in zip((-1, 0, 1), scored)}})  # fmt: skip
        r = candidates[chosen]
        fixed.set_range(r)
        print(f"{data} {generator} from {start:.3f} seed {seed} ({objective}) step {step}: "
              f"{decisions[-1]['r']:.3f} -> {r:.3f}", flush=True)  # fmt: skip
    fixed.train_to(args.steps)
    return {
        "data": data, "generator": generator, "start": start, "seed": seed, "objective": objective,
        "final": r, "decisions": decisions, "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


SCORES = ("conditional_lml", "loglik", "occam", "evidence", "network_occam", "network_evidence")
"""Every score a row may hold (the last two only with ``--network``)."""


def _case(row: dict[str, Any]) -> tuple[str, str, float]:
    return row["data"], row["generator"], row["r"]


def summary(rows: list[dict[str, Any]], step: float) -> list[dict[str, Any]]:
    """Per (data, generator, r): each score's secant at r over r e^+-``step`` (nats per unit of range; mean,
    standard error and count positive over seeds) and, per seed, the range each score is largest at."""
    out = []
    for case in dict.fromkeys(map(_case, rows)):
        group = [row for row in rows if _case(row) == case]
        seeds = list(dict.fromkeys(row["seed"] for row in group))
        entry: dict[str, Any] = {"data": case[0], "generator": case[1], "r": case[2], "n": len(seeds)}
        for score in (score for score in SCORES if score in group[0]):
            secants, preferred = [], []
            for seed in seeds:
                mine = [row for row in group if row["seed"] == seed]
                at = {row["offset"]: row for row in mine}
                if -step in at and step in at:
                    width = at[step]["scored_at"] - at[-step]["scored_at"]
                    secants.append((at[step][score] - at[-step][score]) / width)
                preferred.append(max(mine, key=lambda row: row[score])["scored_at"])
            se = statistics.stdev(secants) / math.sqrt(len(secants)) if len(secants) > 1 else float("nan")
            entry[score] = {
                "secant": statistics.fmean(secants) if secants else float("nan"), "se": se,
                "positive": sum(s > 0 for s in secants), "preferred": preferred,
            }  # fmt: skip
        out.append(entry)
    return out


def _config(entry: str, seeds: list[int]) -> tuple[str, str, float, list[int]]:
    """DATA:GENERATOR:R or DATA:GENERATOR:R:S1+S2 (its own seeds)."""
    data, generator, r, *own = entry.split(":")
    return data, generator, float(r), [int(s) for s in own[0].split("+")] if own else seeds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument(
        "--configs", nargs="+",
        default=["scaledigits:scale:0.693", "scaledigits:scale:0.16", "rotdigits:rotation:1.0", "digits:rotation:0.5"],
        help="DATA:GENERATOR:R[:S1+S2]: the data, the range fixed while training and its value r (with --follow: "
        "its start), with its own seeds",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=360, help="training iterations (default: 360)")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--offsets", nargs="+", type=float, default=[-0.8, -0.4, 0.0, 0.4, 0.8],
                        help="the log-offsets g of the ranges r e^g scored, besides 0")  # fmt: skip
    parser.add_argument("--step", type=float, default=0.4, help="the secant's log-offset (one of --offsets)")
    parser.add_argument("--batch", type=int, default=128, help="examples per batch of views (default: 128)")
    parser.add_argument(
        "--network",
        action="store_true",
        help="also score the whole network's Kronecker-factored Occam term (see above)",
    )
    parser.add_argument("--follow", action="store_true", help="follow --objective from r instead (see above)")
    parser.add_argument("--objectives", nargs="+", choices=sorted(OBJECTIVES), default=["evidence"],
                        help="--follow: what each run maximises (one run per objective)")  # fmt: skip
    parser.add_argument("--every", type=int, default=40, help="--follow: iterations between decisions")
    parser.add_argument("--runs", type=Path, default=Path("runs/occam"), help="--follow: rows kept here, reused")
    parser.add_argument("--out", default=str(RESULTS / "occam.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.configs, args.seeds, args.steps, args.image_size, args.every = (
            ["rotdigits:rotation:0.5"], [0], 3 if not args.follow else 4, 8, 2,
        )  # fmt: skip
    rows = []
    for entry in args.configs:
        data, generator, r, seeds = _config(entry, args.seeds)
        for seed in seeds:
            if args.follow:
                rows.extend(_followed(data, generator, r, seed, objective, args) for objective in args.objectives)
                continue
            for row in run(data, generator, r, seed, args):
                rows.append(row)
                shown = ", ".join(f"{k} {row[k]:.1f}" for k in SCORES if k in row)
                print(f"{data} {generator} trained at {r:.3f} seed {seed}, scored at {row['scored_at']:.3f}: "
                      f"{shown}", flush=True)  # fmt: skip
    config = {**vars(args), "runs": str(args.runs)}
    extra = {} if args.follow else {"summary": {"secants": summary(rows, args.step)}}
    result = results(header("occam", quick=args.quick), config, rows, **extra)
    if not args.quick:
        write_results(args.out, result)
    return result


def _followed(
    data: str, generator: str, start: float, seed: int, objective: str, args: argparse.Namespace
) -> dict[str, Any]:
    """:func:`follow`'s row, kept under ``args.runs`` and reused when its settings are the same."""
    settings = {key: getattr(args, key) for key in ("steps", "every", "step", "image_size", "batch")}
    done = None if args.quick else args.runs / f"{data}_{generator}_{start}_{objective}_s{seed}.json"
    kept = json.loads(done.read_text()) if done is not None and done.is_file() else {}
    if kept.get("settings") == settings:
        return kept["row"]
    row = follow(data, generator, start, seed, objective, args)
    if done is not None:
        write_json(done, {"settings": settings, "row": row})
    print(f"{data} {generator} from {start:.3f} seed {seed} ({objective}): {row['final']:.3f}", flush=True)
    return row


if __name__ == "__main__":
    main()
