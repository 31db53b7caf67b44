"""Population-based training with the conditional LML as its fitness: does comparing runs make the learned range
independent of its start?

The branch check (``research/branch_check.py``) found the conditional LML right over a whole run (it rewards the
wider rotation on rotdigits, the narrower on digits) but flat over the iterations a hyperparameter step sees ahead of
it. Population-based training (Jaderberg et al. 2017; PBA, Ho et al. 2019, for augmentation) compares runs instead
of following a gradient: ``--members`` copies of the default job's partitioned run train side by side, each still
learning its ranges by the configured hyper-gradient; every ``--interval`` iterations each is scored by its
conditional LML (the trainer's own evaluation: no validation set) and the worst ``--exploit`` share copies the
whole training state of the best (weights, ranges, optimisers, samplers and random generators) and then moves each
of its ranges by a factor e^(+-delta) (explore; a range below ``--floor`` of its bound moves from there). The
members start from the job's ranges, all but the first explored once. When partitioned training ends (the job's
fine-tuning step) the best member fine-tunes as the job does, and its final model is scored on the test split.

The members read the same examples and draw the same augmentations (each member's torch generator kept apart,
the same at the start; a copy takes its source's), and their evaluations draw the same noise (the evaluator's own
generator, advanced alike by every member), so a comparison differs in the ranges and what they trained.

    python -m research.population --configs rotdigits:zero digits:zero --seeds 0 1 2
    python -m research.population --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.arms import ARMS, data_arm_seeds, training_images
from benchmarks.common import header, results, write_json, write_results
from partition_fx import PartitionedTrainer, export_subnetwork
from partition_fx.jobs import TrainJob, train_job
from partition_fx.transforms import AffineAugmentation
from research import RESULTS

QUICK_JOB = ["--steps", "10", "--batch-size", "8", "--samples", "2", "--image-size", "8", "--eval-every", "5",
             "--hyper-batch-size", "8"]  # fmt: skip
"""The job of ``--quick``: 6 partitioned iterations, 4 fine-tuning, 8-pixel images."""


@dataclass
class Member:
    """One run of the population: its trainer and torch's generator state between its turns."""

    trainer: PartitionedTrainer
    rng: torch.Tensor
    fitness: float = -math.inf

    @property
    def hyper(self) -> AffineAugmentation:
        """Its ranges: the trainer's input transform."""
        return self.trainer.steps.objective.hyper

    def train_to(self, step: int) -> float:
        """Iterate to ``step`` and evaluate; returns the conditional LML (the fitness)."""
        torch.set_rng_state(self.rng)
        while self.trainer.step < step:
            self.trainer.iteration()
        record = self.trainer.evaluate(time.perf_counter())
        self.rng = torch.get_rng_state()
        self.fitness = float(record["conditional_lml"])
        return self.fitness

    def copy_from(self, source: Member) -> None:
        """Take ``source``'s whole training state: the trainer's (deep-copied: an optimiser loads its state's tensors
        as they are, and two members would then step the same ones) with its random generators."""
        torch.set_rng_state(source.rng)
        self.trainer.load_state_dict(copy.deepcopy(source.trainer.state_dict()))
        self.rng = source.rng.clone()


def explore(hyper: AffineAugmentation, delta: float, floor: float, generator: torch.Generator) -> None:
    """Move every range by e^(+-delta), each sign drawn from ``generator``; a range below ``floor`` of its bound
    moves from that floor (a range at 0 is not stuck there), and none goes past its bound."""
    signs = torch.randint(0, 2, (len(hyper.generators),), generator=generator) * 2 - 1
    with torch.no_grad():
        for i, name in enumerate(hyper.generators):
            bound = hyper.max_range[name]
            start = max(abs(float(hyper.ranges[i])), floor * bound)
            hyper.ranges[i] = min(start * math.exp(float(signs[i]) * delta), bound)


def members_of(job: TrainJob, count: int, delta: float, floor: float, explored: torch.Generator) -> list[Member]:
    """``count`` runs of ``job``: the first its own (its model and ranges), each other a copy of them with its ranges
    explored once; every member seeded as ``fit`` seeds a run."""
    starts = [(job.pmodel, job.hyper)]
    for _ in range(count - 1):
        pmodel, hyper = copy.deepcopy(starts[0])
        explore(hyper, delta, floor, explored)
        starts.append((pmodel, hyper))
    members = []
    for pmodel, hyper in starts:
        torch.manual_seed(job.config.runtime.seed)
        trainer = PartitionedTrainer(pmodel, job.data.train, job.config, hyper=hyper, device="cpu")
        members.append(Member(trainer, torch.get_rng_state()))
    return members


def ancestry(rounds: list[dict[str, Any]]) -> list[int]:
    """The member whose state the final model's descends from, at each round: the best of the last round, and
    before each copy its source.

    >>> ancestry([{"fitness": [1, 2], "copies": [[1, 0]]}, {"fitness": [3, 2], "copies": []}])
    [1, 0]
    """
    member = max(range(len(rounds[-1]["fitness"])), key=lambda i: rounds[-1]["fitness"][i])
    found = [member]
    for entry in reversed(rounds[:-1]):
        member = next((source for source, target in entry["copies"] if target == member), member)
        found.append(member)
    return found[::-1]


def run(data: str, arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    argv = ["--data", data, *ARMS[arm], "--seed", str(seed), "--device", "cpu", "--quiet", *args.job]
    job = train_job(argv)
    config = job.config
    end = config.optimization.steps
    partitioned_end = end - config.finetune_steps
    explored = torch.Generator().manual_seed(10_000 + seed)
    members = members_of(job, args.members, args.delta, args.floor, explored)
    initial = [m.hyper.hyperparameters() for m in members]
    started = time.perf_counter()
    rounds = []
    boundaries = [*range(args.interval, partitioned_end, args.interval), partitioned_end]
    for boundary in boundaries:
        scores = [member.train_to(boundary) for member in members]
        ranked = sorted(range(len(members)), key=lambda i: scores[i], reverse=True)
        entry = {
            "step": boundary,
            "fitness": scores,
            "ranges": [m.hyper.hyperparameters() for m in members],
            "copies": [],
        }
        if boundary < partitioned_end:
            count = max(1, int(args.exploit * len(members)))
            for source, target in zip(ranked[:count], reversed(ranked[-count:])):
                if scores[target] >= scores[source]:
                    continue
                members[target].copy_from(members[source])
                explore(members[target].hyper, args.delta, args.floor, explored)
                entry["copies"].append([source, target])
        rounds.append(entry)
        shown = " ".join(f"{s:.1f}@{m.hyper.hyperparameters().get(args.report, float('nan')):.2f}"
                         for s, m in zip(scores, members))  # fmt: skip
        print(f"{data}:{arm} seed {seed} step {boundary}: {shown}", flush=True)
    best = max(members, key=lambda m: m.fitness)
    torch.set_rng_state(best.rng)
    result = best.trainer.run(progress=False)  # fine-tunes the final subnetwork as the job does
    pmodel = best.trainer.pmodel
    exported = export_subnetwork(pmodel.cpu()).eval()
    accuracy, _ = job.test_scores(exported)
    averaged, _ = job.averaged_test_scores(exported, job.spec.test_time_samples)
    spec = job.spec.to_dict()
    train, samples = spec["train"], spec["samples"]
    per_iteration = train["optimization"]["batch_size"] * samples
    partitioned_phase = {**train, "optimization": {**train["optimization"], "steps": partitioned_end}}
    images = args.members * training_images(partitioned_phase, spec["partitions"], samples, None)
    images += (end - partitioned_end) * per_iteration  # the best member's fine-tuning
    return {
        "data": data, "arm": arm, "seed": seed, "members": args.members,
        "initial": initial, "rounds": rounds,
        "learned": result.hyperparameters, "ancestry": ancestry(rounds), "conditional_lml": best.fitness,
        "final_conditional_lml": result.conditional_lml,
        "test_accuracy": accuracy, "averaged_test_accuracy": averaged,
        "training_images": images, "plain_training_images": end * per_iteration,
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument(
        "--configs", nargs="+", default=["rotdigits:zero", "digits:zero"],
        help="DATA:ARM (DATA:ARM:S1+S2: with its own seeds), ARM one of learned_augmentation's",
    )  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--members", type=int, default=4, help="runs in the population (default: 4; quick: 3)")
    parser.add_argument("--interval", type=int, default=20, help="iterations between exploits (default: 20)")
    parser.add_argument("--exploit", type=float, default=0.5, help="the worst share copies the best (default: 0.5)")
    parser.add_argument("--delta", type=float, default=0.5, help="explore: ranges times e^+-delta (default: 0.5)")
    parser.add_argument("--floor", type=float, default=0.05, help="explore from at least this share of a bound")
    parser.add_argument("--report", default="rotation", help="the range the progress lines show")
    parser.add_argument("--job", nargs=argparse.REMAINDER, default=[], help="more options of the job (last)")
    parser.add_argument(
        "--runs", type=Path, default=Path("runs/population"), help="rows kept here, reused with the same settings"
    )
    parser.add_argument("--out", default=str(RESULTS / "population.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.configs, args.seeds, args.interval = ["rotdigits:zero"], [0], 2
        args.members = 3 if "--members" not in (argv or []) else args.members
        args.job = QUICK_JOB
    settings = {key: getattr(args, key) for key in ("members", "interval", "exploit", "delta", "floor", "job")}
    rows = []
    for entry in args.configs:
        data, arm, seeds = data_arm_seeds(entry, args.seeds)
        for seed in seeds:
            done = None if args.quick else args.runs / f"{data}_{arm}_s{seed}.json"
            kept = json.loads(done.read_text()) if done is not None and done.is_file() else {}
            if kept.get("settings") == settings:
                row = kept["row"]
            else:
                row = run(data, arm, seed, args)
                if done is not None:
                    write_json(done, {"settings": settings, "row": row})
            rows.append(row)
            print(
                f"{data}:{arm} seed {seed}: {args.report} {row['learned'].get(args.report, float('nan')):.3f}, "
                f"test {row['test_accuracy']:.4f} (averaged {row['averaged_test_accuracy']:.4f}), "
                f"{row['training_images'] / row['plain_training_images']:.2f}x the plain run's images",
                flush=True,
            )
    result = results(header("population", quick=args.quick), {**vars(args), "runs": str(args.runs)}, rows)
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
