"""The fixed choices that options of the package take, each list written once.

The library checks its arguments against these lists and the command line offers them as ``choices=``;
this module imports nothing, so ``partition-fx --help`` lists them without loading torch. The open-ended
lists, which other code may extend, are registries: the partition kinds and schemes (``partition_fx.fx.kinds``)
and the named datasets (``partition_fx.datasets.registry``).

>>> "seed" in DEFAULTS and "regenerated" in ASSIGNMENTS
True
"""

from __future__ import annotations

from enum import Enum

DEFAULTS = ("init", "zero", "seed")
"""What ``partitionify(default=)`` and ``--default`` take: the values of partitions a subnetwork does not train
(the initial values, zeros, or values regenerated from the seed)."""

ASSIGNMENTS = ("stored", "regenerated")
"""What ``partitionify(assignments=)`` and ``--assignments`` take: store each tensor's layout index, or
regenerate it from the seed."""

PRECISIONS = ("fp32", "bf16", "fp16")
"""What ``precision=`` and ``--precision`` take (``training.step.stepping.DTYPES`` maps each to its dtype)."""

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile``'s modes, which ``compile=`` and ``--compile`` also take (True: ``"default"``)."""

AFFINE_GENERATORS = ("translation_x", "translation_y", "rotation", "scale_x", "scale_y", "shear")
"""The ranges of ``transforms.AffineAugmentation`` (its default generators), by name: what ``--fix NAME=VALUE``
names."""

AUGERINO_GENERATORS = ("translation_x", "translation_y", "rotation", "scale", "stretch", "shear")
"""Augerino's generators (Benton et al. 2020): an isotropic ``scale`` and an aspect-ratio ``stretch`` instead of
independent x and y zooms, so that a range of sizes can be learned without stretching every draw."""

GENERATOR_SETS = {"xy": AFFINE_GENERATORS, "augerino": AUGERINO_GENERATORS}
"""The named generator sets ``AffineAugmentation(generators=NAME)`` and ``--generators`` take."""


def generator_set_name(generators: tuple[str, ...] | list[str]) -> str | None:
    """The name in ``GENERATOR_SETS`` of the set ``generators`` is, in its order; None for any other.

    >>> generator_set_name(AUGERINO_GENERATORS), generator_set_name(["rotation"])
    ('augerino', None)
    """
    return next((name for name, members in GENERATOR_SETS.items() if tuple(generators) == members), None)


RANGE_NAMES = tuple(dict.fromkeys(AFFINE_GENERATORS + AUGERINO_GENERATORS))
"""Every range an ``AffineAugmentation`` may have, by name (``transforms.affine.GENERATORS``)."""

RANGE_STARTS = ("wide", "zero", "bounds")
"""The named starts of learned ranges (``AffineAugmentation(init=NAME)``, ``--init NAME``): every range at a wide
start that keeps the image (``ranges.WIDE_START``, the default), at 0 (the paper's start), or at its
bound."""

AUGMENTATION_DRAWS = ("uniform", "stratified")
"""How ``AffineAugmentation`` draws its S samples' coefficients: independently uniform, or stratified (each
generator's S coefficients of an example fall one in each of S equal strata of [-1, 1]: a Latin hypercube)."""

TRACKERS = ("tensorboard", "mlflow", "csv")
"""The experiment trackers ``--log`` names (``training.tracking``)."""

TRACKER_FILES = {
    "tensorboard": ("tensorboard/",),
    "mlflow": ("mlflow.db", "mlartifacts/"),
    "csv": ("metrics.csv", "params.csv"),
}
"""What each tracker writes under a run directory (MLflow's local store only while ``MLFLOW_TRACKING_URI`` is not
set); a directory ends in ``/``."""


class Phase(str, Enum):
    """The phase of a run an evaluation belongs to (a ``str``: records hold it as its value)."""

    PARTITIONED = "partitioned"
    """Partitioned training: the hyperparameters are learned and the LML is estimated."""
    FINETUNE = "finetune"
    """Fine-tuning the final subnetwork on all the data: every subnetwork has seen every chunk, no LML."""


class RunStatus(str, Enum):
    """How far a run got, as its ``report.json`` says (``status``) and its trackers end it (a ``str``: reports
    hold it as its value)."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    """Stopped by Ctrl-C or SIGTERM: the last checkpoint kept; ``--resume`` continues it."""
    FAILED = "failed"

    @classmethod
    def of(cls, error: BaseException | None) -> RunStatus:
        """How a run that ended with ``error`` (None: none) ended.

        >>> RunStatus.of(None).value, RunStatus.of(KeyboardInterrupt()).value, RunStatus.of(ValueError()).value
        ('completed', 'interrupted', 'failed')
        """
        if error is None:
            return cls.COMPLETED
        return cls.INTERRUPTED if isinstance(error, KeyboardInterrupt) else cls.FAILED
