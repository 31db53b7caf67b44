"""``JobSpec``: what a ``partition-fx train`` run trains, typed: the model, its data, its partitioning, its
augmentation, the device it asks for, and its :class:`~partition_fx.job.train_config.TrainConfig`.

It is declared with :func:`~partition_fx.job.settings.setting` as ``TrainConfig`` is, and from that one declaration
come the command's options for these fields (``cli.parser``; ``--image-size`` for ``image_size``), their checks,
and ``to_dict``/``from_dict``: the ``config`` that ``report.json`` records, that ``fit(..., checkpoint_dir=DIR)``
records in ``run.json`` for a model and data built by name, and that ``export --run`` and ``--resume`` read back.
A new field here is a new option, recorded and read back, with nothing else to edit. How to run and where to
write (``--out``, ``--quiet``, ``--resume``, ...) are not part of it: no report records them.

Every field but ``proportions`` is the option as given. ``proportions`` is None on the command line when
``--proportions`` is not given (the default shares, :data:`DEFAULT_PROPORTIONS` with 3 partitions and equal shares
with any other) and the shares the model was partitioned with once a run records it. ``fix`` holds the ranges that
``--fix-from`` read, once a run records it, so a recorded job needs no other run to be rebuilt.

No torch here: the command line checks a job before torch loads. A ``max_range``'s bounds are ruled on as the
transform rules on them (``ranges.learning_bounds``: the rule is written there once, without torch).

>>> spec = JobSpec(model="fixup_resnet8", image_size=12, train=TrainConfig.recommended(steps=8))
>>> spec.model, spec.train.optimization.steps, spec.value("steps"), list(spec.to_dict())[:3]
('fixup_resnet8', 8, 8, ['model', 'checkpoint', 'data'])
>>> JobSpec.from_dict(spec.to_dict()) == spec
True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..choices import ASSIGNMENTS, AUGMENTATION_DRAWS, DEFAULTS, GENERATOR_SETS, RANGE_NAMES, RANGE_STARTS
from ..datasets.registry import dataset_names
from ..errors import PartitionArgumentError, PartitionTypeError, RangeError
from ..fx.kinds import partition_kinds
from ..ranges import learning_bounds
from .settings import Settings, setting
from .train_config import TrainConfig

DEFAULT_MODEL = "resnet10t"
"""``--model`` of ``train``, ``convert`` and ``describe``."""
DEFAULT_PROPORTIONS = (0.8, 0.1, 0.1)
"""``--proportions`` when it is not given and ``--partitions`` is 3 (the default); other counts get equal shares."""
DEVICES = ("auto", "cpu", "cuda")
"""``--device`` of ``train``: ``auto`` is CUDA when it is available here, else the CPU."""
AUGMENTATIONS = ("affine", "none")
"""``--augment``: learn (or fix) the ranges of an affine augmentation, or no input transform."""
DATASETS = dataset_names(task="images", on_disk=False)
"""The bundled datasets ``train`` accepts by name (besides an image folder's path and ``NAME:DIR``): the image
datasets registered (``partition_fx.datasets.registry``) when this module was imported."""
DISK_DATASETS = dataset_names(task="images", on_disk=True)
"""The datasets ``train`` reads from a copy on the user's disk, as ``--data NAME:DIR``."""


def default_shares_text(default: tuple[float, ...]) -> str:
    """What ``--proportions`` is when it is not given, as a command's help says it: ``default`` with its number
    of partitions, equal shares with any other (every command's convention).

    >>> default_shares_text((0.7, 0.2, 0.1))
    '0.7,0.2,0.1 with 3 partitions, equal shares with any other --partitions'
    """
    shares = ",".join(str(p) for p in default)
    return f"{shares} with {len(default)} partitions, equal shares with any other --partitions"


def partitions_help(counted: str, default: tuple[float, ...]) -> str:
    """``--partitions``' help, for a command whose partitions are ``counted`` and whose default shares are
    ``default`` (``federated``'s are the paper's appendix J chunks).

    >>> partitions_help("partitions", (0.5, 0.5))
    'number of partitions C, 1..255; without --proportions, any C but 2 gets equal shares'
    """
    return f"number of {counted} C, 1..255; without --proportions, any C but {len(default)} gets equal shares"


def _shares(name: str, value: Any) -> tuple[float, ...]:
    """``proportions``: finite numbers (how many, and their sum, are checked against ``partitions`` by the
    command, whose refusals name both options)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise PartitionTypeError(f"{name} must be a list of numbers, got {value!r}")
    if not all(isinstance(p, numbers.Real) and not isinstance(p, bool) and math.isfinite(p) for p in value):
        raise PartitionArgumentError(f"{name} must be finite numbers, got {list(value)!r}")
    return tuple(float(p) for p in value)


def _ranges(name: str, value: Any) -> dict[str, float]:
    """Affine augmentation ranges by name (``choices.RANGE_NAMES``), each a finite half-width >= 0."""
    if not isinstance(value, dict):
        raise PartitionTypeError(f"{name} must be a dict of ranges by name, got {value!r}")
    unknown = sorted(set(value) - set(RANGE_NAMES))
    if unknown:
        raise PartitionArgumentError(
            f"{name} has unknown range(s) {', '.join(unknown)}; the ranges are {', '.join(RANGE_NAMES)}"
        )
    for key, number in value.items():
        # Real orders by < (no >=): negative, or not below infinity (inf, NaN).
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or number < 0 or not number < math.inf:
            raise PartitionArgumentError(f"{name} {key}={number!r} must be a finite half-width >= 0")
    return {key: float(number) for key, number in value.items()}


def _bounds(name: str, value: Any) -> dict[str, float]:
    """``max_range``: :func:`_ranges`, each a bound the transform can learn a range within, as
    :func:`~partition_fx.ranges.learning_bounds` rules (> 0), its refusal said with this field's name (the command
    line's ``--max-range``)."""
    bounds = _ranges(name, value)
    try:
        learning_bounds(bounds, RANGE_NAMES)
    except RangeError as e:
        raise PartitionArgumentError(
            f"{name} {e.generator}={e.value:g} must be > 0: a range bounded at 0 cannot be learned"
        ) from None
    return bounds


def _range_start(name: str, value: Any) -> dict[str, float] | str:
    """``init``: a named start (``choices.RANGE_STARTS``: ``"wide"``, ``"zero"``, ``"bounds"``) or :func:`_ranges`."""
    return value if isinstance(value, str) and value in RANGE_STARTS else _ranges(name, value)


def schemes() -> dict[str, str]:
    """The registered partition schemes (``partition_fx.fx.kinds``), each with its description.

    >>> list(schemes())[:2]
    ['random', 'node']
    """
    return {kind.name: kind.description for kind in partition_kinds() if kind.scheme}


def _scheme(name: str, value: Any) -> str:
    """``scheme``: a registered partition scheme."""
    if value not in schemes():
        raise PartitionArgumentError(f"{name} must be one of {', '.join(map(repr, schemes()))}, got {value!r}")
    return value


def _recommended() -> TrainConfig:
    """The command's training configuration: the recommended one, with the defaults kept out of checkpoints (the
    command rebuilds its model to load them)."""
    return TrainConfig.recommended(checkpoint_defaults=False)


@dataclass(frozen=True)
class JobSpec(Settings):
    """What ``partition-fx train`` trains (see the module's docstring); ``train`` is its training
    configuration, whose fields are options too (``--steps``), reached by keyword with :meth:`value` and
    :meth:`replace` like this spec's own.

    >>> JobSpec(partitions=2, proportions=[0.5, 0.5]).proportions
    (0.5, 0.5)
    >>> JobSpec(image_size=0)
    Traceback (most recent call last):
    ...
    partition_fx.job.settings.SettingError: image_size must be an int >= 1, got 0
    """

    model: str = setting(
        DEFAULT_MODEL,
        "a timm model name (the shipped FixUp/WRN models included; a plain name such as resnet18 is timm's), or "
        "torchvision:NAME for one of torchvision's classifiers, e.g. torchvision:mobilenet_v3_small, or hf:DIR for a "
        "transformers image classifier that save_pretrained wrote to DIR (with its weights; the 'hf' extra)",
        metavar="NAME",
    )
    checkpoint: str | None = setting(
        None,
        "local weights file (a safetensors or torch state dict) to start from; nothing is downloaded. A "
        "classifier for another number of classes is re-initialised and the stem adapted to other input channels "
        "(one warning line names the tensors); a checkpoint of another architecture is refused",
        metavar="FILE",
        default_text="none, the model's own initialisation",
    )
    data: str = setting(
        "rotdigits",
        f"{' or '.join(DATASETS)} (bundled); NAME:DIR for your copy of {', '.join(DISK_DATASETS)} in DIR "
        "(read by torchvision; rot*: each image turned by a fixed random angle); or an image folder laid out as "
        "FOLDER/<class>/<image> or FOLDER/{train,test}/<class>/<image>. Nothing is downloaded",
        metavar="NAME|NAME:DIR|FOLDER",
    )
    image_size: int | None = setting(
        None,
        "images are resized to this square",
        minimum=1,
        metavar="PIXELS",
        default_text="the data's own size: 28 for digits, rotdigits, MNIST and Fashion-MNIST, 32 for CIFAR and SVHN; "
        "an image folder's images must then share one size",
    )
    channels: int | None = setting(None, "image channels", minimum=1, metavar="N", default_text="the data's own")
    partitions: int = setting(
        len(DEFAULT_PROPORTIONS), partitions_help("partitions", DEFAULT_PROPORTIONS), metavar="C"
    )  # its range is checked with --proportions, by the job's checks (job.checks), to name both
    proportions: tuple[float, ...] | None = setting(
        None,
        "each partition's share of the parameters and the data, C numbers summing to 1",
        metavar="P1,P2,...",
        default_text=default_shares_text(DEFAULT_PROPORTIONS),
        validator=_shares,
    )
    scheme: str = setting(
        "random", "how each tensor's entries are assigned to partitions (a registered scheme)", validator=_scheme
    )  # its choices are the schemes registered when it is read (partition_fx.fx.kinds): a plugin's too
    default: str = setting(
        "init",
        "the values a subnetwork uses for partitions it does not train: the initial weights, zeros, or values "
        "regenerated from the seed",
        choices=DEFAULTS,
    )
    assignments: str = setting(
        "stored", "store each tensor's partition layout index or regenerate it from the seed", choices=ASSIGNMENTS
    )
    recipe: str | None = setting(
        None,
        "start from one of the paper's experiments; a --config file's values and the options given override it",
        metavar="NAME",
        default_text="none",
    )  # its choices and their values are the command line's (cli.recipes: YAML files read as its defaults)
    augment: str = setting(
        "affine", "learn the ranges of an affine augmentation, or learn nothing", choices=AUGMENTATIONS
    )
    generators: str = setting(
        "xy",
        "the affine augmentation's ranges: xy = translation_x/y, rotation, scale_x, scale_y, shear; augerino = "
        "translation_x/y, rotation, scale (both axes alike), stretch (the aspect ratio), shear",
        choices=tuple(GENERATOR_SETS),
        absent_means="xy",  # reports written before it existed all had these
    )
    draws: str = setting(
        "stratified",
        "how each example's augmentation samples are drawn: stratified (each range's S samples one in each of S "
        "equal strata, a Latin hypercube: the same distribution, less variance), or uniform (independently, the "
        "paper's)",
        choices=AUGMENTATION_DRAWS,
        absent_means="uniform",
    )
    samples: int = setting(4, "augmentation samples per example", minimum=1, metavar="S")
    test_time_samples: int = setting(
        8,
        "also report the exported model's test scores averaged over K fixed transforms of the learned "
        "augmentation (test-time averaging, the predictor the LML scores; report.json: averaged_test_accuracy); "
        "0: not",
        minimum=0,
        metavar="K",
    )
    fix: Mapping[str, float] | None = setting(
        None,
        "fix the augmentation's ranges at these values, every other at 0, and learn nothing: training with a "
        "chosen augmentation, e.g. --partitions 1 --fix rotation=3.1416",
        metavar="NAME=VALUE[,...]",
        default_text="none, the ranges are learned",
        validator=_ranges,
    )
    init: Mapping[str, float] | str | None = setting(
        None,
        "start the learned ranges at these values, every other at 0 (within the learning bounds: rotation pi, "
        "translations 1, scales and shear log 2), every range at 0 (--init zero, the paper's start), at its bound "
        "(--init bounds), or at a wide start that keeps the image (--init wide: rotation pi, translations 0.25, "
        "the others 0.2)",
        metavar="NAME=VALUE[,...]",
        default_text="wide",  # None: the transform's own start, so that --augment none can refuse a given --init
        validator=_range_start,
    )
    max_range: Mapping[str, float] | None = setting(
        None,
        "learn these ranges within these bounds instead of the default ones (rotation pi, translations 1, scales, "
        "stretch and shear log 2), every other within its default: e.g. --max-range scale=1.3863 for zooms of 1/4 "
        "to 4",
        metavar="NAME=VALUE[,...]",
        default_text="the default bounds",
        validator=_bounds,
        absent_means=None,  # reports written before it existed learned within the default bounds
    )
    fix_from: str | None = setting(
        None,
        "--fix every range that the finished `partition-fx train` run RUN learned",
        metavar="RUN",
        default_text="none",
    )
    device: str = setting("auto", "auto: CUDA when it is available, else the CPU", choices=DEVICES)
    train: TrainConfig = field(default_factory=_recommended)

    @classmethod
    def job_fields(cls) -> list[str]:
        """The spec's own fields (not its training configuration's), in the order reports record them.

        >>> JobSpec.job_fields()[:4]
        ['model', 'checkpoint', 'data', 'image_size']
        """
        return [f.keyword for f in cls.fields(recurse=False)]

    @classmethod
    def from_keywords(cls, **keywords: Any) -> JobSpec:
        """The spec the flat ``keywords`` give (the spec's own fields and the training configuration's, as the
        command line names them without ``--``), every other at the command's default.

        >>> JobSpec.from_keywords(model="fixup_resnet8", hyper_lr=0.1).train.hyper.lr
        0.1
        """
        own = set(cls.job_fields())
        train = _recommended().replace(**{k: v for k, v in keywords.items() if k not in own})
        return cls(**{k: v for k, v in keywords.items() if k in own}, train=train)
