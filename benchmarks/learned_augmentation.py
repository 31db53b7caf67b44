"""What partitioned training learns: `partition-fx train` runs on rotdigits/digits, with and without
learned affine augmentation, and the oracle, over several seeds.

Each run is the `partition-fx train` default (resnet10t, C=3, 0.8/0.1/0.1, 400 iterations) with the
data, augmentation and seed changed; ``oracle`` is the same job with the truth fixed and nothing learned
(``--partitions 1 --fix rotation=3.1416``: plain training with full rotation, the same recipe). A run
directory that already holds a completed run of the same configuration is reused. Prints a table and writes
``benchmarks/results/learned_augmentation.json``.

    python -m benchmarks.learned_augmentation [--seeds 0,1,2] [--configs rotdigits:affine,...]
        [--runs runs/learned_augmentation] [--image-size N] [--device cuda] [--machine TEXT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks import tables
from benchmarks.arms import ARMS, data_arm_seeds, training_images
from benchmarks.common import RESULTS, header, results, write_results
from partition_fx.cli.train import train_spec
from partition_fx.job.build import build_augmentation, initial_hyperparameters
from partition_fx.job.spec import JobSpec

CONFIGS = [("rotdigits", "affine"), ("rotdigits", "none"), ("rotdigits", "oracle"), ("digits", "affine")]
COMMAND = Path(sys.executable).with_name("partition-fx")
"""What it measures: the command, run as users run it (the console script installed beside this Python)."""
QUICK = ["--steps", "4", "--batch-size", "8", "--samples", "2", "--image-size", "16", "--eval-every", "2"]


def run(data: str, augment: str, seed: int, runs: Path, extra: list[str]) -> dict:
    out = runs / f"{Path(data).name}_{augment}_s{seed}"  # an image folder's runs by its name
    report_path = out / "report.json"
    argv = ["train", "--data", data, *ARMS[augment], "--seed", str(seed), *extra, "--quiet"]
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        if report.get("status") == "completed" and _same_run(report, argv[1:]):
            return report
    if not COMMAND.is_file():
        raise SystemExit(f"{COMMAND} not found: install the package in this environment (pip install -e .)")
    if subprocess.run([str(COMMAND), *argv, "--out", str(out), "--overwrite"]).returncode != 0:
        raise SystemExit(f"run failed: partition-fx {' '.join(argv)}")
    return json.loads(report_path.read_text())


def _same_run(report: dict, argv: list[str]) -> bool:
    """Whether a report's ``config`` is the one ``partition-fx train ARGV`` records, and its ranges started
    where this version starts them: the config records ``--init`` as given, so without the second check a run
    of an earlier default start would pass. A setting added since the report was written reads as its absent
    meaning (``JobSpec.from_dict``). Reports written before they recorded ``initial_hyperparameters`` are judged by
    their config alone (every version until then started an unnamed ``--init`` at 0)."""
    spec = train_spec(argv).replace(proportions=tuple(report["config"]["proportions"]))
    if JobSpec.from_dict(report["config"]) != spec:  # a setting added since reads as its absent meaning
        return False
    start = initial_hyperparameters(build_augmentation(spec))
    return report.get("initial_hyperparameters", start) == start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--configs",
        default=",".join(f"{data}:{arm}" for data, arm in CONFIGS),
        help="DATA:ARM pairs to run (DATA:ARM:S1+S2 with their own seeds), ARM one of " + ", ".join(ARMS),
    )
    parser.add_argument("--runs", type=Path, default=Path("runs/learned_augmentation"))
    parser.add_argument("--out", type=Path, default=RESULTS / "learned_augmentation.json")
    parser.add_argument("--quick", action="store_true", help="tiny runs (a smoke test, numbers meaningless)")
    parser.add_argument(
        "--image-size",
        type=int,
        help="train at this size (default: the data's own); `scattered` was measured at 28, the default before "
        "image folders kept their own size (20 for write_scattered_digits' folder)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="train there (default: `partition-fx train`'s)")
    parser.add_argument(
        "--machine", help="where the runs under --runs were made, when not here (recorded as the results' machine)"
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = QUICK if args.quick else []
    if args.image_size is not None:
        extra = [*extra, "--image-size", str(args.image_size)]
    if args.device is not None:
        extra = [*extra, "--device", args.device]
    configs = [data_arm_seeds(entry, seeds) for entry in args.configs.split(",")]
    rows, made = [], set()
    for data, augment, config_seeds in configs:
        reports = [run(data, augment, seed, args.runs, extra) for seed in config_seeds]
        learned = bool(reports[0]["hyperparameters"])  # not an arm of --augment none
        made.update((r["device"], r["torch"]) for r in reports)
        rotation = [r["hyperparameters"].get("rotation") for r in reports]
        rows.append(
            {
                "data": Path(data).name,  # an image folder by its name
                "augment": augment,
                "seeds": config_seeds,
                "ranges": [r["hyperparameters"] for r in reports],
                "test_accuracy": [r["test_accuracy"] for r in reports],
                "averaged_test_accuracy": [r["averaged_test_accuracy"] for r in reports],  # over 8 fixed transforms
                "partitioned_test_accuracy": [r["partitioned_test_accuracy"] for r in reports],
                # every learned range at each evaluated step, per seed (results before 2026-12-06 kept only the
                # rotation's, as "rotation_trajectory"): a zoom that falls early is seen falling
                "ranges_trajectories": [[(e["step"], e["hyperparameters"]) for e in r["history"]] for r in reports]
                if learned
                else None,
                "lml": [r["lml"] for r in reports],
                "rotation": rotation if learned else None,
                "other_ranges_max": [
                    max(v for k, v in r["hyperparameters"].items() if k != "rotation") for r in reports
                ]
                if learned
                else None,
                "seconds": [r["seconds"] for r in reports],
                "training_images": [
                    training_images(
                        r["config"]["train"], r["config"]["partitions"], r["config"]["samples"], r["finetune_start"]
                    )
                    for r in reports
                ],
            }
        )

    meta = header("learned_augmentation", quick=args.quick, machine=args.machine)
    if args.machine is not None:  # the runs were made elsewhere: their reports say on what
        meta["device"] = ", ".join(sorted({device for device, _ in made}))
        meta["torch"] = ", ".join(sorted({torch for _, torch in made}))
    result = results(meta, {"configs": configs}, rows)
    print(tables.learned_augmentation(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
