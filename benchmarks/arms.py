"""The arms of the default job: each a set of `partition-fx train` options added to the job's, by name, as
``learned_augmentation`` runs them on the command line and ``research/population.py`` builds them with
``partition_fx.cli.train.train_job``; the ``DATA:ARM[:SEEDS]`` entries that name runs; and the training images a run
costs, read from its recorded configuration.

An oracle fixes the truth of its data (``partition_fx.datasets``' ``true_ranges`` and
:func:`~partition_fx.datasets.scattered_digits_ranges`) and learns nothing. The arms' names and their grouping say
when each was tried; docs/history.md says what each measured.
"""

from __future__ import annotations

from typing import Any

from partition_fx.datasets import named_dataset, scattered_digits_ranges
from partition_fx.training import hyper_step_batch_size


def _fixed(ranges: dict[str, float]) -> str:
    """``--fix``'s value for ``ranges``, each to 4 decimals as the arms have always written it (3.1416 for pi)."""
    return ",".join(f"{name}={value:.4f}".rstrip("0").rstrip(".") for name, value in ranges.items())


ROTDIGITS_TRUTH = _fixed(named_dataset("rotdigits").true_ranges or {})
"""rotdigits' truth, every angle: ``rotation=3.1416``."""
SCALEDIGITS_TRUTH = _fixed(named_dataset("scaledigits").true_ranges or {})
"""scaledigits' truth, an isotropic log-scale range of log 2 (Augerino's ``scale``): ``scale=0.6931``."""
_SCATTERED = scattered_digits_ranges()
SCATTERED_TRUTH = _fixed({name: _SCATTERED[name] for name in ("translation_x", "translation_y", "scale")})
"""How ``write_scattered_digits``' folder was made, in Augerino's generators: shifts of 3 of 20 pixels, sides of
7 to 14 pixels (isotropic zoom over log 2 / 2): ``translation_x=0.3,translation_y=0.3,scale=0.3466``."""
SCATTERED_SHIFTS = _fixed({name: _SCATTERED[name] for name in ("translation_x", "translation_y")})
"""``scattered``'s truth without its zoom: ``translation_x=0.3,translation_y=0.3``."""
_SCALE = (named_dataset("scaledigits").true_ranges or {})["scale"]
DRAWNDIGITS_TRUTH = _fixed(named_dataset("drawndigits").true_ranges or {})
"""drawndigits' truth, an isotropic log-scale range of log sqrt 2, drawn rather than resampled: ``scale=0.3466``."""
_DRAWN = (named_dataset("drawndigits").true_ranges or {})["scale"]

NEAR_BOUNDS = "translation_x=1,translation_y=1,rotation=3.1415,scale_x=0.6931,scale_y=0.6931,shear=0.6931"
"""Every range 1e-4 or less below its bound (``--init bounds`` is the same start, to float32 rounding)."""
HALF_BOUNDS = "translation_x=0.5,translation_y=0.5,rotation=1.5708,scale_x=0.3466,scale_y=0.3466,shear=0.3466"
"""Every range at (to 1e-4) half its bound."""
WIDE = "rotation=3.14159,translation_x=0.25,translation_y=0.25,scale_x=0.2,scale_y=0.2,shear=0.2"
"""Every range started away from 0 and none where it destroys the image: every angle (rotation keeps the content),
an eighth of the image's width of shift, zooms and shear of about 20%."""
SINGLE_COSINE = ["--finetune-fraction", "0.25", "--finetune-schedule", "continue"]
"""Fine-tuning as every arm before the third round of default tuning had it: the last quarter of the run, on the
run's one cosine. The oracle and the other plain arms keep it (plain training's one schedule, as they were
measured)."""
SECOND_DEFAULT = SINGLE_COSINE
"""The second default, the options that the third round of default tuning (``affine``) changed: fine-tuning the
last 0.4 of the run at a restarted learning rate."""
PREVIOUS_DEFAULT = ["--train-range-factor", "0.75", "--hyper-samples", "16", "--draws", "uniform", *SECOND_DEFAULT]
"""The default tuning's first default, the options that the second one changed: parameter steps on 0.75 of the
ranges, 16 augmentation samples per example drawn independently in the hyperparameter step."""
WIDE_SCALE_0_35 = "translation_x=0.25,translation_y=0.25,rotation=3.14159,scale_x=0.35,scale_y=0.35,shear=0.2"
ARMS = {
    "affine": ["--augment", "affine"],
    "none": ["--augment", "none", *SINGLE_COSINE],
    "oracle": ["--partitions", "1", "--fix", ROTDIGITS_TRUTH, *SINGLE_COSINE],  # rotdigits' truth: full rotation
    # the leads tried one at a time, each one change of the default job (docs/history.md: what each did)
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
        ROTDIGITS_TRUTH,
        *SINGLE_COSINE,
        "--finetune-schedule",
        "restart",
    ],
    # the default tuning's first pilots: BatchNorm in the hyperparameter step, and every range started wide but
    # content-keeping
    "hyper_norm_detached": ["--hyper-norm", "detached"],
    "hyper_norm_running": ["--hyper-norm", "running"],
    "wide_narrow": ["--init", WIDE, "--train-range-factor", "0.75"],
    # the default tuning's first default (every range wide, parameter steps on 0.75 of them, 16 uniform hyper
    # samples), and the default before it (every range from 0, parameter steps on the ranges themselves)
    "wide_0.75": PREVIOUS_DEFAULT,
    "zero_start": [*PREVIOUS_DEFAULT, "--init", "zero", "--train-range-factor", "1"],
    # the default tuning's second round, each one change of wide_0.75 (`affine`, the default since, is factor_0.5 with 6
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
    # the default tuning's third round: fine-tuning's share of the run and its schedule (``affine``, the default
    # since, is finetune_0.4 restarted), every partition at once, plain training without augmentation, and on
    # `scattered` the truth (with and without its zoom) and the zoom started at the truth
    "second_default": SECOND_DEFAULT,
    "finetune_restart": [*SECOND_DEFAULT, "--finetune-schedule", "restart"],
    "finetune_0.4": [*SECOND_DEFAULT, "--finetune-fraction", "0.4"],
    "every_partition": [*SECOND_DEFAULT, "--every-partition"],
    "plain": ["--partitions", "1", "--augment", "none", *SINGLE_COSINE],
    "oracle_scattered": ["--partitions", "1", "--generators", "augerino", "--fix", SCATTERED_TRUTH, *SINGLE_COSINE],
    "oracle_scattered_no_scale": [
        *("--partitions", "1", "--generators", "augerino", "--fix", SCATTERED_SHIFTS),
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
    "augerino_scale_truth": ["--generators", "augerino", "--init", SCALEDIGITS_TRUTH],
    "augerino_scale_half": ["--generators", "augerino", "--init", _fixed({"scale": _SCALE / 2})],
    "augerino_scale_twice": [
        *("--generators", "augerino"),
        *("--max-range", _fixed({"scale": 2 * _SCALE}), "--init", _fixed({"scale": 2 * _SCALE})),
    ],
    "oracle_scaledigits": ["--partitions", "1", "--generators", "augerino", "--fix", SCALEDIGITS_TRUTH, *SINGLE_COSINE],
    # scaledigits' zoom with the measured confounds out (research/zoom_profile.py): the zoom trained at the range it
    # is scored at (its own train_range_factor 1, the other ranges at the default 0.5), no hyperparameter step for
    # the first third of the partitioned phase, a smaller hyperparameter learning rate and 16 views per example;
    # from 0, half the truth and the truth
    **{
        f"zoom_confounds_out_{start}": [
            *("--generators", "augerino", "--init", init, "--train-range-factors", "scale=1"),
            *("--warmup-steps", "80", "--hyper-lr", "0.02", "--hyper-samples", "16"),
        ]
        for start, init in (("zero", "zero"), ("half", _fixed({"scale": _SCALE / 2})), ("truth", SCALEDIGITS_TRUTH))
    },
    # drawndigits (truth: log sqrt 2, every zoom drawn rather than resampled, the views at the truth uncut) in
    # Augerino's generators: from the wide start (augerino) and 0 (augerino_zero) as on scaledigits, from half the
    # truth, the truth and twice it (log 2, the default bound), and its oracle (the truth fixed, C=1)
    **{
        f"drawn_scale_{start}": ["--generators", "augerino", "--init", _fixed({"scale": factor * _DRAWN})]
        for start, factor in (("half", 0.5), ("truth", 1.0), ("twice", 2.0))
    },
    "oracle_drawndigits": ["--partitions", "1", "--generators", "augerino", "--fix", DRAWNDIGITS_TRUTH, *SINGLE_COSINE],
    # equal compute: the default job given the training images of research/population.py's population of 4
    # (378,880, 3.0x the default job's 125,440): 1,208 iterations instead of 400, the same fractions, so the ranges
    # learn for 725 iterations instead of 240; from the start-independence targets' 0, 0.5 and pi/2
    **{
        f"equal_compute_{start}": ["--init", init, "--steps", "1208"]
        for start, init in (("zero", "zero"), ("0.5", "rotation=0.5"), ("half_pi", "rotation=1.5708"))
    },
}
"""The command-line options of each arm (``augment`` in ``learned_augmentation``'s rows), added to the default
job's."""
OCCAM_STARTS = (
    "affine", "zero", "init_0.5", "init_half_pi", "augerino", "augerino_zero", "augerino_scale_half",
    "augerino_scale_truth", "drawn_scale_half", "drawn_scale_truth", "drawn_scale_twice",
)  # fmt: skip
"""The arms run again with an Occam term in the hyperparameter step: the whole network's of all the data
(``occam_<arm>``) and its part for chunks 2..C given chunk 1 (``occam_conditional_<arm>``). The rotation from pi (the
default's wide start), 0, 0.5 and pi/2; the zoom in Augerino's generators from the wide start, 0, half the truth,
the truth and twice it (drawndigits; scaledigits' twice needs a raised bound, left out)."""
ARMS.update({f"occam_{arm}": [*ARMS[arm], "--occam-term", "whole"] for arm in OCCAM_STARTS})
ARMS.update({f"occam_conditional_{arm}": [*ARMS[arm], "--occam-term", "conditional"] for arm in OCCAM_STARTS})


def data_arm_seeds(entry: str, seeds: list[int]) -> tuple[str, str, list[int]]:
    """``DATA:ARM`` (run with ``seeds``) or ``DATA:ARM:S1+S2`` (with those seeds) as (data, arm, seeds).

    >>> data_arm_seeds("rotdigits:oracle", [0, 1]), data_arm_seeds("digits:affine:3+4", [0])
    (('rotdigits', 'oracle', [0, 1]), ('digits', 'affine', [3, 4]))
    """
    data, arm, *own = entry.rsplit(":", 2) if entry.count(":") >= 2 else entry.split(":")
    return data, arm, [int(s) for s in own[0].split("+")] if own else seeds


def training_images(train: dict[str, Any], partitions: int, samples: int, finetune_start: int | None) -> int:
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
        per_chunk = hyper_step_batch_size(optimization["batch_size"], hyper["batch_size"]) * (
            hyper["samples"] or samples
        )
        images += hyper_steps * chunks * per_chunk
    return images
