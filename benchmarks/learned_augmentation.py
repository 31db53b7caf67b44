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
from pathlib import Path

from benchmarks import tables
from benchmarks._common import RESULTS, header, results, write_results
from partition_fx.cli import main as cli

CONFIGS = [("rotdigits", "affine"), ("rotdigits", "none"), ("rotdigits", "oracle"), ("digits", "affine")]
NEAR_BOUNDS = "translation_x=1,translation_y=1,rotation=3.1415,scale_x=0.6931,scale_y=0.6931,shear=0.6931"
"""Every range 1e-4 or less below its bound (``--init bounds`` is the same start, to float32 rounding)."""
HALF_BOUNDS = "translation_x=0.5,translation_y=0.5,rotation=1.5708,scale_x=0.3466,scale_y=0.3466,shear=0.3466"
"""Every range at (to 1e-4) half its bound."""
WIDE = "rotation=3.14159,translation_x=0.25,translation_y=0.25,scale_x=0.2,scale_y=0.2,shear=0.2"
"""Every range started away from 0 and none where it destroys the image: every angle (rotation keeps the content),
an eighth of the image's width of shift, zooms and shear of about 20%."""
SINGLE_COSINE = ["--finetune-fraction", "0.25", "--finetune-schedule", "continue"]
"""Fine-tuning as every arm before issue 43's third default had it: the last quarter of the run, on the run's one
cosine. The oracle and the other plain arms keep it (plain training's one schedule, as they were measured)."""
SECOND_DEFAULT = SINGLE_COSINE
"""Issue 43's second default, the options that the third one (``affine``) changed: fine-tuning the last 0.4 of the
run at a restarted learning rate."""
PREVIOUS_DEFAULT = ["--train-range-factor", "0.75", "--hyper-samples", "16", "--draws", "uniform", *SECOND_DEFAULT]
"""Issue 43's first default, the options that the second one changed: parameter steps on 0.75 of the ranges, 16
augmentation samples per example drawn independently in the hyperparameter step."""
SCATTERED_TRUTH = "translation_x=0.3,translation_y=0.3,scale=0.3466"
"""How ``write_scattered_digits``' folder was made, in Augerino's generators: shifts of 3 of 20 pixels, sides of
7 to 14 pixels (isotropic zoom over log 2 / 2)."""
WIDE_SCALE_0_35 = "translation_x=0.25,translation_y=0.25,rotation=3.14159,scale_x=0.35,scale_y=0.35,shear=0.2"
ARMS = {
    "affine": ["--augment", "affine"],
    "none": ["--augment", "none", *SINGLE_COSINE],
    "oracle": ["--partitions", "1", "--fix", "rotation=3.1416", *SINGLE_COSINE],  # rotdigits' truth: full rotation
    # issue 28's leads, each one change of the default job (docs/history.md: what each did)
    "hyper_lr_0.1": ["--hyper-lr", "0.1"],
    "init_pi": ["--init", "rotation=3.1415"],
    "init_half_pi": ["--init", "rotation=1.5708"],
    "init_half_pi_s6": ["--init", "rotation=1.5708", "--hyper-samples", "6"],  # at most 1.3x the oracle's images
    "init_quarter_pi": ["--init", "rotation=0.7854"],
    "widen_1.5": ["--train-range-factor", "1.5"],
    "blocks_4": ["--hyper-every", "4", "--hyper-batch-size", "32"],  # the same hyper images in 4x fewer steps
    "split_50": ["--proportions", "0.5,0.25,0.25"],
    "restart": ["--finetune-schedule", "restart"],
    # the ranges started at (just below) their bounds, parameter steps trained on 0.75 of them
    "half_bounds": ["--init", HALF_BOUNDS],
    "init_pi_narrow": ["--init", "rotation=3.1415", "--train-range-factor", "0.75"],
    "bounds_narrow": ["--init", NEAR_BOUNDS, "--train-range-factor", "0.75"],
    "bounds_narrow_restart": ["--init", NEAR_BOUNDS, "--train-range-factor", "0.75", "--finetune-schedule", "restart"],
    "bounds_narrow_s6": ["--init", NEAR_BOUNDS, "--train-range-factor", "0.75", "--hyper-samples", "6"],
    "oracle_restart": [
        "--partitions",
        "1",
        "--fix",
        "rotation=3.1416",
        *SINGLE_COSINE,
        "--finetune-schedule",
        "restart",
    ],
    # issue 43's first pilots: BatchNorm in the hyperparameter step, and every range started wide but content-keeping
    "hyper_norm_detached": ["--hyper-norm", "detached"],
    "hyper_norm_running": ["--hyper-norm", "running"],
    "wide_narrow": ["--init", WIDE, "--train-range-factor", "0.75"],
    # issue 43's first default (every range wide, parameter steps on 0.75 of them, 16 uniform hyper samples), and the
    # default before it (every range from 0, parameter steps on the ranges themselves)
    "wide_0.75": PREVIOUS_DEFAULT,
    "zero_start": [*PREVIOUS_DEFAULT, "--init", "zero", "--train-range-factor", "1"],
    # issue 43's second round, each one change of wide_0.75 (`affine`, the default since, is factor_0.5 with 6
    # stratified samples): a cheaper hyperparameter step (6 or 4 samples per example instead of 16, with or without
    # stratified draws), the parameter steps' share of the ranges, the hyperparameter learning rate, Augerino's
    # generator set, and combinations
    "s6": [*PREVIOUS_DEFAULT, "--hyper-samples", "6"],
    "s6_stratified": [*PREVIOUS_DEFAULT, "--hyper-samples", "6", "--draws", "stratified"],
    "s4_stratified": [*PREVIOUS_DEFAULT, "--hyper-samples", "4", "--draws", "stratified"],
    "factor_0.5": [*PREVIOUS_DEFAULT, "--train-range-factor", "0.5"],
    "factor_0.6": [*PREVIOUS_DEFAULT, "--train-range-factor", "0.6"],
    "factor_0.9": [*PREVIOUS_DEFAULT, "--train-range-factor", "0.9"],
    "hyper_lr_0.1_wide": [*PREVIOUS_DEFAULT, "--hyper-lr", "0.1"],
    "factor_0.5_s6": [*PREVIOUS_DEFAULT, "--train-range-factor", "0.5", "--hyper-samples", "6"],
    "factor_0.5_b8s12": [
        *PREVIOUS_DEFAULT,
        "--train-range-factor",
        "0.5",
        "--hyper-batch-size",
        "8",
        "--hyper-samples",
        "12",
    ],
    "augerino_generators": [*PREVIOUS_DEFAULT, "--generators", "augerino"],
    "augerino_s6_stratified": [
        *PREVIOUS_DEFAULT,
        "--generators",
        "augerino",
        "--hyper-samples",
        "6",
        "--draws",
        "stratified",
    ],
    "augerino_factor_0.5": [*PREVIOUS_DEFAULT, "--generators", "augerino", "--train-range-factor", "0.5"],
    "augerino_zero_start": [
        *PREVIOUS_DEFAULT,
        "--generators",
        "augerino",
        "--init",
        "zero",
        "--train-range-factor",
        "1",
    ],
    # issue 43's third round: fine-tuning's share of the run and its schedule (``affine``, the default since, is
    # finetune_0.4 restarted), every partition at once, plain training without augmentation, and on `scattered`
    # the truth (with and without its zoom) and the zoom started at the truth
    "second_default": SECOND_DEFAULT,
    "finetune_restart": [*SECOND_DEFAULT, "--finetune-schedule", "restart"],
    "finetune_0.4": [*SECOND_DEFAULT, "--finetune-fraction", "0.4"],
    "every_partition": [*SECOND_DEFAULT, "--every-partition"],
    "plain": ["--partitions", "1", "--augment", "none", *SINGLE_COSINE],
    "oracle_scattered": ["--partitions", "1", "--generators", "augerino", "--fix", SCATTERED_TRUTH, *SINGLE_COSINE],
    "oracle_scattered_no_scale": [
        *("--partitions", "1", "--generators", "augerino", "--fix", "translation_x=0.3,translation_y=0.3"),
        *SINGLE_COSINE,
    ],
    "scale_start_0.35": [*SECOND_DEFAULT, "--init", WIDE_SCALE_0_35],
    "augerino_scale_start_0.35": [
        *SECOND_DEFAULT,
        *("--generators", "augerino"),
        *("--init", "translation_x=0.25,translation_y=0.25,rotation=3.14159,scale=0.35,stretch=0.2,shear=0.2"),
    ],
    # the paper's start (every range at 0), the hyper-gradient at fixed weights (the default) and through training
    "zero": ["--init", "zero"],
    "zero_implicit": ["--init", "zero", "--hyper-gradient", "implicit"],
    # the start-independence targets' other starts (the rotation at 0.5; pi/2 is init_half_pi), every other range at 0
    "init_0.5": ["--init", "rotation=0.5"],
    # scaledigits (truth: an isotropic log-scale range of log 2, the scale's default bound) in Augerino's generators,
    # from the wide start, 0, half the truth, the truth and twice it (its bound raised to hold it), and its oracle (the
    # truth fixed, C=1)
    "augerino": ["--generators", "augerino"],
    "augerino_zero": ["--generators", "augerino", "--init", "zero"],
    "augerino_scale_truth": ["--generators", "augerino", "--init", "scale=0.6931"],
    "augerino_scale_half": ["--generators", "augerino", "--init", "scale=0.3466"],
    "augerino_scale_twice": ["--generators", "augerino", "--max-range", "scale=1.3863", "--init", "scale=1.3863"],
    "oracle_scaledigits": ["--partitions", "1", "--generators", "augerino", "--fix", "scale=0.6931", *SINGLE_COSINE],
}
"""The command-line options of each arm (``augment`` in the rows), added to the default job's."""
QUICK = ["--steps", "4", "--batch-size", "8", "--samples", "2", "--image-size", "16", "--eval-every", "2"]


def run(data: str, augment: str, seed: int, runs: Path, extra: list[str]) -> dict:
    out = runs / f"{Path(data).name}_{augment}_s{seed}"  # an image folder's runs by its name
    report_path = out / "report.json"
    argv = ["train", "--data", data, *ARMS[augment], "--seed", str(seed), *extra, "--quiet"]
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        if report.get("status") == "completed" and _same_run(report, argv[1:]):
            return report
    if cli([*argv, "--out", str(out), "--overwrite"]) != 0:
        raise SystemExit(f"run failed: partition-fx {' '.join(argv)}")
    return json.loads(report_path.read_text())


def _same_run(report: dict, argv: list[str]) -> bool:
    """Whether a report's ``config`` is the one ``partition-fx train ARGV`` records, and its ranges started
    where this version starts them: the config records ``--init`` as given, so without the second check a run
    of an earlier default start would pass. A setting added since the report was written reads as its absent
    meaning (``read_spec``). Reports written before they recorded ``initial_hyperparameters`` are judged by their
    config alone (every version until then started an unnamed ``--init`` at 0)."""
    from partition_fx.cli.commands.train import job_spec
    from partition_fx.cli.job import build_augmentation, initial_hyperparameters
    from partition_fx.cli.parser import parse_train
    from partition_fx.cli.runs import read_spec

    spec = job_spec(parse_train(argv)).replace(proportions=tuple(report["config"]["proportions"]))
    if read_spec(report["config"]) != spec:  # a setting added since reads as its absent meaning
        return False
    start = initial_hyperparameters(build_augmentation(spec))
    return report.get("initial_hyperparameters", start) == start


def data_arm_seeds(entry: str, seeds: list[int]) -> tuple[str, str, list[int]]:
    """``DATA:ARM`` (run with ``seeds``) or ``DATA:ARM:S1+S2`` (with those seeds) as (data, arm, seeds).

    >>> data_arm_seeds("rotdigits:oracle", [0, 1]), data_arm_seeds("digits:affine:3+4", [0])
    (('rotdigits', 'oracle', [0, 1]), ('digits', 'affine', [3, 4]))
    """
    data, arm, *own = entry.rsplit(":", 2) if entry.count(":") >= 2 else entry.split(":")
    return data, arm, [int(s) for s in own[0].split("+")] if own else seeds


def training_images(train: dict, partitions: int, samples: int, finetune_start: int | None) -> int:
    """The images a run's training steps pass forward and backward through the network, from its configuration
    (``report["config"]["train"]``, the paper's iteration scheme): ``batch_size`` x ``samples`` per parameter
    or fine-tuning iteration, and per hyperparameter step ``hyper_batch_size`` x ``hyper_samples`` for each
    chunk it scores (``all``: 2..C; ``one``: one). Evaluations and BatchNorm recalibration pass images forward
    only and are not counted (``tests/test_baselines.py`` checks this against a ``PassCounter``)."""
    optimization, hyper = train["optimization"], train["hyper"]
    if train["runtime"]["fused"] or train["runtime"]["every_partition"]:
        raise ValueError("training_images counts the paper's iteration scheme, not fused or every-partition ones")
    steps = optimization["steps"]
    partitioned = steps if finetune_start is None else finetune_start
    images = steps * optimization["batch_size"] * samples
    if partitions > 1:
        hyper_steps = sum(1 for s in range(1, partitioned + 1) if s > hyper["warmup_steps"] and s % hyper["every"] == 0)
        chunks = partitions - 1 if hyper["chunks"] == "all" else 1
        per_chunk = (hyper["batch_size"] or optimization["batch_size"]) * (hyper["samples"] or samples)
        images += hyper_steps * chunks * per_chunk
    return images


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
                "rotation_trajectory": [
                    [(e["step"], e["hyperparameters"].get("rotation")) for e in r["history"]] for r in reports
                ]
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
