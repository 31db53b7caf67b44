"""Every target learned ranges and the final model are held to, read from the results they were measured in:
each run's value, the mean and its standard error over seeds, and how many runs meet the target.

It trains nothing. Each target names a results file of ``research/results/`` or ``benchmarks/results/`` and the
rows it reads (written by ``learned_augmentation``, ``population`` or ``hyperparameter_methods``); the table says
where each was measured. A truth is the data's own (``partition_fx.datasets``' ``true_ranges``).
Ranges are judged run by run (a start-independence target holds on every seed or not at all); the final model
by paired differences over the seeds both arms ran (same seed, same data order), at or above the reference
within one standard error, or ahead of it by more than one. Writes
``research/results/targets.json``.

    python -m research.targets [--results DIR ...] [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS as BENCHMARK_RESULTS
from benchmarks.common import header, load_results, results, summary, write_results
from benchmarks.tables import zoom
from partition_fx.datasets import named_dataset
from research import RESULTS, tables

Ranges = dict[str, float]
SCALE_TRUTH = (named_dataset("scaledigits").true_ranges or {})["scale"]
"""scaledigits' truth: an isotropic log-scale range of log 2 (Augerino's ``scale``)."""
DRAWN_TRUTH = (named_dataset("drawndigits").true_ranges or {})["scale"]
"""drawndigits' truth: log sqrt 2."""
FOLDERS = (RESULTS, BENCHMARK_RESULTS)
"""Where the results the targets read are: the diagnostics' and the benchmarks'."""


@dataclass(frozen=True)
class RangeTarget:
    """Learned ranges of one arm, each run judged by ``meets``: ``value`` gives the numbers shown per run."""

    target: str
    file: str  # several joined by "+": the seeds of one arm run at different times
    data: str
    arm: str
    start: str
    value: Callable[[Ranges], tuple[float, ...]]
    meets: Callable[[tuple[float, ...]], bool]


@dataclass(frozen=True)
class ModelTarget:
    """The final model of ``arm`` (in ``file``) against ``reference``'s (in ``reference_file``), paired by seed:
    ``within`` (at or above within one standard error) or ``ahead`` (by more than one standard error: a lead the
    seeds show)."""

    target: str
    data: str
    file: str
    arm: str
    reference_file: str
    reference: str
    how: str


def _rotation(ranges: Ranges) -> tuple[float, ...]:
    return (ranges["rotation"],)


def _scale_to(truth: float) -> Callable[[Ranges], tuple[float, ...]]:
    """The learned zoom as a share of ``truth``."""
    return lambda ranges: (ranges["scale"] / truth,)


_scale_to_truth, _drawn_scale_to_truth = _scale_to(SCALE_TRUTH), _scale_to(DRAWN_TRUTH)


def _scattered(ranges: Ranges) -> tuple[float, ...]:
    return ranges["translation_x"], ranges["translation_y"], zoom(ranges)


def _at_least(low: float) -> Callable[[tuple[float, ...]], bool]:
    return lambda values: values[0] >= low


def _at_most(high: float) -> Callable[[tuple[float, ...]], bool]:
    return lambda values: values[0] <= high


def _within(low: float, high: float) -> Callable[[tuple[float, ...]], bool]:
    return lambda values: low <= values[0] <= high


def _scattered_meets(values: tuple[float, ...]) -> bool:
    return all(0.15 <= v <= 0.45 for v in values[:2]) and values[2] >= 0.17


ROTATION = "rotation >= 2.5 rad"
DIGITS = "rotation <= 0.3 rad"
SCALE = "zoom / truth in 0.8-1.25"
SCATTERED = "translation x, y in 0.15-0.45, zoom >= 0.17"
GPU, CPU = "default_tuning_round3_gpu.json", "start_independence_cpu.json"
EQUAL, CONFOUNDS = "equal_compute.json+equal_compute_s34.json", "zoom_confounds.json"
DRAWN = "drawn_digits.json"
RANGE_TARGETS = [
    RangeTarget(
        ROTATION,
        "start_independence.json+start_independence_s34.json",
        "rotdigits",
        "zero",
        "0",
        _rotation,
        _at_least(2.5),
    ),
    RangeTarget(ROTATION, "start_independence.json", "rotdigits", "init_0.5", "0.5", _rotation, _at_least(2.5)),
    RangeTarget(ROTATION, "start_independence.json", "rotdigits", "init_half_pi", "pi/2", _rotation, _at_least(2.5)),
    RangeTarget(ROTATION, GPU, "rotdigits", "affine", "pi (the default)", _rotation, _at_least(2.5)),
    RangeTarget(ROTATION, "population.json", "rotdigits", "zero", "0, population", _rotation, _at_least(2.5)),
    RangeTarget(ROTATION, "population.json", "rotdigits", "init_0.5", "0.5, population", _rotation, _at_least(2.5)),
    RangeTarget(
        ROTATION, "population.json", "rotdigits", "init_half_pi", "pi/2, population", _rotation, _at_least(2.5)
    ),
    *(
        RangeTarget(
            ROTATION,
            EQUAL,
            "rotdigits",
            f"equal_compute_{arm}",
            f"{start}, 3x the iterations",
            _rotation,
            _at_least(2.5),
        )
        for arm, start in (("zero", "0"), ("0.5", "0.5"), ("half_pi", "pi/2"))
    ),
    RangeTarget(DIGITS, CPU, "digits", "zero", "0", _rotation, _at_most(0.3)),
    RangeTarget(DIGITS, GPU, "digits", "affine", "pi (the default)", _rotation, _at_most(0.3)),
    RangeTarget(DIGITS, "population.json", "digits", "zero", "0, population", _rotation, _at_most(0.3)),
    RangeTarget(SCALE, CPU, "scaledigits", "augerino_zero", "0", _scale_to_truth, _within(0.8, 1.25)),
    RangeTarget(
        SCALE, CPU, "scaledigits", "augerino_scale_half", "half the truth", _scale_to_truth, _within(0.8, 1.25)
    ),
    RangeTarget(SCALE, CPU, "scaledigits", "augerino_scale_truth", "the truth", _scale_to_truth, _within(0.8, 1.25)),
    RangeTarget(
        SCALE, CPU, "scaledigits", "augerino_scale_twice", "twice the truth", _scale_to_truth, _within(0.8, 1.25)
    ),
    RangeTarget(
        SCALE, "population.json", "scaledigits", "augerino_zero", "0, population", _scale_to_truth, _within(0.8, 1.25)
    ),
    *(
        RangeTarget(
            SCALE,
            CONFOUNDS,
            "scaledigits",
            f"zoom_confounds_out_{arm}",
            f"{start}, confounds out",
            _scale_to_truth,
            _within(0.8, 1.25),
        )
        for arm, start in (("zero", "0"), ("half", "half the truth"), ("truth", "the truth"))
    ),
    *(
        RangeTarget(SCALE, DRAWN, "drawndigits", arm, start, _drawn_scale_to_truth, _within(0.8, 1.25))
        for arm, start in (
            ("augerino", "wide (the default)"),
            ("augerino_zero", "0"),
            ("drawn_scale_half", "half the truth"),
            ("drawn_scale_truth", "the truth"),
            ("drawn_scale_twice", "twice the truth"),
        )
    ),
    RangeTarget(
        SCATTERED,
        "default_tuning_round3_gpu_scattered.json",
        "scattered",
        "affine",
        "wide (the default)",
        _scattered,
        _scattered_meets,
    ),
]
"""The learned ranges' targets: the rotation wherever it starts on data that holds every angle (rotdigits) and none
(digits), the zoom on scaledigits from 0, half the truth, the truth and twice it (and on drawndigits, where every zoom
is drawn rather than resampled, from the wide start too), the translations and zoom on
``scattered``; single runs of the default job with only the start changed, the same given a population's training
images (3x the iterations), the zoom with its measured confounds out, and populations of the default job."""
ORACLE = "at or above the oracle within one SE"
AHEAD = "ahead by more than one SE"
SCATTERED_GPU = "default_tuning_round3_gpu_scattered.json"
METHODS_WIDE, METHODS_ZERO = "hyperparameter_methods_round3.json", "hyperparameter_methods_round3_zero.json"
AUGERINO_WIDE, AUGERINO_ZERO = "hyperparameter_methods_wide.json", "hyperparameter_methods_zero.json"
PARTITIONED, VALIDATION = "partitioned_finetuned", "validation_finetuned"
MODEL_TARGETS = [
    ModelTarget(ORACLE, "rotdigits", GPU, "affine", GPU, "oracle", "within"),
    ModelTarget(ORACLE, "scattered", SCATTERED_GPU, "affine", SCATTERED_GPU, "oracle_scattered", "within"),
    ModelTarget(ORACLE, "scaledigits", CPU, "affine", CPU, "oracle_scaledigits", "within"),
    ModelTarget(ORACLE, "drawndigits", DRAWN, "augerino", DRAWN, "oracle_drawndigits", "within"),
    ModelTarget(AHEAD, "rotdigits", METHODS_WIDE, PARTITIONED, METHODS_WIDE, VALIDATION, "ahead"),
    ModelTarget(AHEAD, "rotdigits", METHODS_WIDE, PARTITIONED, AUGERINO_WIDE, "augerino", "ahead"),
    *(
        ModelTarget(AHEAD, data, METHODS_ZERO, PARTITIONED, reference_file, reference, "ahead")
        for data in ("digits", "scattered")
        for reference_file, reference in ((METHODS_ZERO, VALIDATION), (AUGERINO_ZERO, "augerino"))
    ),
]
"""The final model's targets: the default job against the oracle (the truth fixed, plain training), and partitioned
training with fine-tuning against the validation split with fine-tuning and Augerino on ``hyperparameter_methods``'
budget (its ``test_resnet`` runs, seeds 0-4: the same initial weights and data order for every method), each
method at its better start (wide on rotdigits, 0 on digits and ``scattered``)."""
METHODS_MODEL = "test_resnet"
"""The model ``hyperparameter_methods``' comparisons are read for (its other model did not learn at that budget)."""


def _runs(result: dict, data: str, arm: str) -> dict[int, dict]:
    """Each seed's run of ``arm`` on ``data`` in ``result`` (learned_augmentation's rows hold every seed of an arm,
    population's one seed each, hyperparameter_methods' every seed of a method): its ranges and accuracies."""
    runs: dict[int, dict] = {}
    for row in result["rows"]:
        if row.get("data", row.get("task")) != data or row.get("augment", row.get("arm", row.get("method"))) != arm:
            continue
        if row.get("model", METHODS_MODEL) != METHODS_MODEL:
            continue
        if "seed" in row:  # population: one row per seed
            runs[row["seed"]] = {
                "ranges": row["learned"],
                "test_accuracy": row["test_accuracy"],
                "averaged_test_accuracy": row["averaged_test_accuracy"],
            }
            continue
        for i, seed in enumerate(row["seeds"]):
            ranges = row.get("ranges", row.get("hyperparameters"))
            runs[seed] = {
                "ranges": ranges[i] if ranges else {},
                "test_accuracy": row["test_accuracy"][i],
                "averaged_test_accuracy": row["averaged_test_accuracy"][i],
            }
    if not runs:
        raise ValueError(f"no runs of {arm!r} on {data!r} in the results {result['meta'].get('benchmark')!r}")
    return dict(sorted(runs.items()))


def _where(result: dict) -> str:
    """'CPU' or the GPU's name: the device the results were measured on (runs made elsewhere and read back
    record it as their machine)."""
    meta = result["meta"]
    if not meta["device"].startswith("cuda"):
        return "CPU"
    gpu = meta["device"].partition("(")[2].rstrip(")") or meta["machine"].split(",")[0]
    return gpu.replace("NVIDIA ", "").split(" ")[0]


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean, sd = summary(values)
    return mean, sd / math.sqrt(len(values))


def range_row(target: RangeTarget, results_read: list[dict]) -> dict:
    """One range target's row, from the results of each of its files: each run's values, their means and standard
    errors, and how many runs meet it."""
    runs = dict(sorted(kv for result in results_read for kv in _runs(result, target.data, target.arm).items()))
    result = results_read[0]
    values = [target.value(run["ranges"]) for run in runs.values()]
    stats = [_mean_se(list(column)) for column in zip(*values)]
    return {
        "kind": "ranges",
        "target": target.target,
        "data": target.data,
        "start": target.start,
        "arm": target.arm,
        "file": target.file,
        "measured_on": _where(result),
        "seeds": list(runs),
        "values": [list(v) for v in values],
        "mean": [mean for mean, _ in stats],
        "standard_error": [se for _, se in stats],
        "met": sum(target.meets(v) for v in values),
        "runs": len(values),
    }


def model_rows(target: ModelTarget, result: dict, reference_result: dict) -> list[dict]:
    """One model target's rows, plain and averaged over 8 transforms: the paired differences in points."""
    runs = _runs(result, target.data, target.arm)
    reference = _runs(reference_result, target.data, target.reference)
    seeds = [seed for seed in runs if seed in reference]
    rows = []
    for accuracy in ("test_accuracy", "averaged_test_accuracy"):
        differences = [100 * (runs[s][accuracy] - reference[s][accuracy]) for s in seeds]
        mean, se = _mean_se(differences)
        rows.append(
            {
                "kind": "model",
                "target": target.target,
                "data": target.data,
                "arm": target.arm,
                "reference": target.reference,
                "accuracy": accuracy,
                "file": target.file,
                "reference_file": target.reference_file,
                "measured_on": _where(result),
                "seeds": seeds,
                "values": differences,
                "arm_mean": statistics.mean(runs[s][accuracy] for s in seeds),
                "reference_mean": statistics.mean(reference[s][accuracy] for s in seeds),
                "mean": mean,
                "standard_error": se,
                "met": mean + se >= 0 if target.how == "within" else mean > se,
            }
        )
    return rows


def _files(target: RangeTarget | ModelTarget) -> list[str]:
    """The results files a target reads."""
    if isinstance(target, ModelTarget):
        return [target.file, target.reference_file]
    return target.file.split("+")


def gather(*folders: Path) -> list[dict]:
    """Every target's rows, from the results files in ``folders`` (the first that holds a file; default
    :data:`FOLDERS`)."""
    loaded: dict[str, dict] = {}

    def load(file: str) -> dict:
        if file not in loaded:
            where = next((folder for folder in folders or FOLDERS if (folder / file).is_file()), None)
            if where is None:
                raise FileNotFoundError(f"{file}: in none of {', '.join(map(str, folders or FOLDERS))}")
            loaded[file] = load_results(where / file)
        return loaded[file]

    rows = [range_row(target, [load(file) for file in _files(target)]) for target in RANGE_TARGETS]
    for target in MODEL_TARGETS:
        rows += model_rows(target, load(target.file), load(target.reference_file))
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, nargs="+", default=list(FOLDERS), help="the folders of the results read, in order"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "targets.json")
    parser.add_argument("--quick", action="store_true", help="print the table and write nothing")
    args = parser.parse_args(argv)
    rows = gather(*args.results)
    meta = header("targets", quick=args.quick, machine="each row's own machine (read from its results, column on)")
    files = sorted({file for target in [*RANGE_TARGETS, *MODEL_TARGETS] for file in _files(target)})
    result = results(meta, {"files": files}, rows)
    print(tables.targets(result))
    if not args.quick:
        write_results(args.out, result)
    return result


if __name__ == "__main__":
    main()
