"""A training job before any training: its :class:`~partition_fx.job.spec.JobSpec` checked, the data loaded and
the model built and converted (:func:`build_job`), and what using the model it trains needs
(:func:`model_record`, :func:`write_onnx`).

Everything that can fail on bad input fails here, before an output directory is touched. The commands
(``partition-fx train``, ``export``, ``convert``), the benchmarks and Python scripts build their runs with these
same functions, so a script trains exactly what the command trains::

    job = build_job(JobSpec.from_keywords(steps=100))   # TrainJob(spec, data, model, pmodel, hyper, device)
    fit(job.pmodel, job.data.train, job.config, hyper=job.hyper, device=job.device)

The library never imports the command line: the checks of a job's options together are ``job.checks``' (torch-free,
so the command refuses bad options before torch loads), a model record's keys ``job.records``'; the command line's
own ``train_job(argv)`` parses its options into the spec this module builds.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import torch

from .._validation import batch_pools, check_batches_fit, check_fits_in_memory
from ..datasets import DatasetSplits, load_dataset, named_dataset
from ..datasets.images import InputStatistics
from ..datasets.splits import Split
from ..errors import PartitionArgumentError, PartitionError, PartitionWarning
from ..export import export_onnx
from ..fx.partitioned_model import PartitionedModel
from ..fx.rewrite import partitionify
from ..models import build_model
from ..training import Examples, evaluate_averaged, evaluate_classifier, split_into_chunks, weight_decay_scales
from ..training.sampling.chunks import default_workers, hyper_step_batch_size
from ..transforms import AffineAugmentation
from .checks import check_job, checked_proportions, proportions_text, with_fixed_ranges
from .records import CHECKS_RECORD, MODEL_RECORD, ONNX_INPUT, ONNX_OUTPUTS
from .spec import JobSpec
from .train_config import TrainConfig


@dataclass
class TrainJob:
    """What ``partition-fx train`` trains: its job spec, data, model and conversion, and learnable augmentation.

    ``spec`` is the job (``spec.device`` as asked, e.g. ``"auto"``; ``spec.proportions`` the shares the model was
    partitioned with); ``device`` is the device it resolved to here (``"cpu"`` or ``"cuda"``); ``hyper`` is None
    with ``--augment none``. ``fit(job.pmodel, job.data.train, job.config, hyper=job.hyper)`` trains what the
    command trains.
    """

    spec: JobSpec
    data: DatasetSplits
    model: torch.nn.Module
    pmodel: PartitionedModel
    hyper: AffineAugmentation | None
    device: str

    @property
    def config(self) -> TrainConfig:
        """The job's training configuration (``spec.train``)."""
        return self.spec.train

    @property
    def workers(self) -> int:
        """The input pipeline's worker processes for this job's data (``--workers``, or its default)."""
        return default_workers(self.config.runtime.workers, self.data.test)

    def test_scores(self, model: torch.nn.Module) -> tuple[float, float]:
        """``evaluate_classifier`` of ``model`` on the test split (read in batches by :attr:`workers` processes
        when it is read from disk)."""
        return evaluate_classifier(model, self.data.test, workers=self.workers)

    def averaged_test_scores(self, model: torch.nn.Module, samples: int) -> tuple[float | None, float | None]:
        """``evaluate_averaged`` of ``model`` over ``samples`` fixed transforms of the job's augmentation."""
        return evaluate_averaged(model, self.hyper, samples, self.data.test, workers=self.workers)

    def sample_inputs(self, count: int = 4) -> torch.Tensor:
        """The first ``count`` test inputs: the example ONNX is traced with."""
        examples = Examples(self.data.test)
        return examples.batch(torch.arange(min(count, len(examples))))[0]


def model_record(job: TrainJob, averaged: bool = False, statistics: dict[str, Any] | None = None) -> dict[str, Any]:
    """What using the model ``job`` trains needs, beyond its weights: the ``classes`` in label order (its output i
    is ``classes[i]``), the ``preprocessing`` that makes an image one of its inputs (the data's
    :class:`~partition_fx.datasets.images.ImagePreprocessing`; None for a registered dataset without one), the
    ``architecture`` that rebuilds the module of ``model.safetensors`` (``partition_fx.models.build_model(model,
    num_classes, in_chans=in_chans, img_size=img_size)``, then ``safetensors.torch.load_model``), and the ONNX
    file's ``onnx_names`` (its output ``log_probs`` when it is the test-time-``averaged`` model), and the
    ``input_statistics`` of the images it trains on (``datasets.images.InputStatistics``; ``statistics``, where the
    training run recorded them already), which ``predict`` warns of an image unlike.

    >>> spec = JobSpec.from_keywords(model="fixup_resnet8", data="digits", image_size=8)
    >>> record = model_record(build_job(spec))
    >>> record["classes"][:3], record["preprocessing"]["mode"], record["onnx_names"]
    (['0', '1', '2'], 'L', {'input': 'images', 'output': 'logits'})
    >>> record["architecture"]
    {'model': 'fixup_resnet8', 'num_classes': 10, 'in_chans': 1, 'img_size': 8}
    """
    data = job.data
    classes = data.classes if data.classes is not None else [str(i) for i in range(data.num_classes or 0)]
    return {
        "classes": list(classes),
        "preprocessing": data.preprocessing.to_dict() if data.preprocessing is not None else None,
        "architecture": {  # as build_job builds it (its --checkpoint aside: the weights are the exported ones)
            "model": job.spec.model,
            "num_classes": data.num_classes,
            "in_chans": data.input_shape[0],
            "img_size": data.input_shape[-1],
        },
        "onnx_names": {"input": ONNX_INPUT, "output": ONNX_OUTPUTS[averaged]},
        "input_statistics": statistics if statistics is not None else _input_statistics(data),
    }


def _input_statistics(data: DatasetSplits) -> dict[str, Any] | None:
    """The statistics of the images a model trains on (``InputStatistics``; ``predict`` warns of an image unlike
    them), from the training split, or from the test split where only that one is loaded (``export``: the same
    distribution); None for data that are not images."""
    if data.preprocessing is None:
        return None
    split, dataset = ("train", data.train) if len(data.train) else ("test", data.test)
    return InputStatistics.of(dataset, split).to_dict()


def write_onnx(pmodel: PartitionedModel, path: Path, job: TrainJob, record: dict[str, Any], **kwargs: Any) -> Path:
    """``export_onnx`` of ``pmodel`` traced on the job's test inputs, its input and output named as ``record``
    (:func:`model_record`, or a report holding it) says, and the record in its metadata (each entry as JSON)."""
    names = record["onnx_names"]
    return export_onnx(
        pmodel,
        path,
        (job.sample_inputs(),),
        input_names=[names["input"]],
        output_names=[names["output"]],
        metadata={key: record[key] for key in (*MODEL_RECORD, *CHECKS_RECORD) if record.get(key) is not None},
        **kwargs,
    )


def resolve_device(requested: str) -> str:
    """The device ``--device`` names here: ``auto`` is ``cuda`` when CUDA is available, else ``cpu``.

    >>> resolve_device("cpu")
    'cpu'
    >>> resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    True
    """
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise PartitionError("--device cuda: no CUDA device is available here; use --device cpu")
    return requested


class PartitionOptions(Protocol):
    """The conversion's options, as a :class:`~partition_fx.job.spec.JobSpec` or ``convert``'s parsed command
    line holds them."""

    # Read-only (properties): the frozen dataclasses that hold them (``JobSpec``, ``ConversionOptions``) match.
    @property
    def partitions(self) -> int: ...
    @property
    def proportions(self) -> tuple[float, ...] | None: ...
    @property
    def scheme(self) -> str: ...
    @property
    def default(self) -> str: ...
    @property
    def assignments(self) -> str: ...


def partitionify_with(model: torch.nn.Module, options: PartitionOptions, seed: int) -> PartitionedModel:
    """``partitionify`` with the command line's conversion options (``--partitions``, ``--proportions``,
    ``--scheme``, ``--default``, ``--assignments``) and ``--seed``, refusals naming those options.

    >>> from partition_fx.job.spec import JobSpec
    >>> partitionify_with(torch.nn.Linear(3, 2), JobSpec(partitions=2), seed=0).proportions
    (0.5, 0.5)
    >>> partitionify_with(torch.nn.Linear(3, 2), JobSpec(proportions=(0.5, 0.5)), seed=0)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --partitions 3 --proportions 0.5,0.5: proportions has 2 entries ...
    """
    num_partitions, proportions = checked_proportions(options.partitions, options.proportions)
    return partitionify(
        model,
        num_partitions,
        proportions,
        scheme=options.scheme,
        default=options.default,
        seed=seed,
        assignments=options.assignments,
    )


def build_job(spec: JobSpec, *, split: Split | None = None) -> TrainJob:
    """The job ``spec`` describes, built: its data loaded, its model built and converted, its augmentation.

    A job to train (``split`` None) is checked first (:func:`~partition_fx.job.checks.check_job`), its
    ``--fix-from`` ranges read, and its batch sizes checked against the chunks of its data (a default one lowered
    to fit a small data set). ``split="test"`` builds a recorded job to export and evaluate: the test split alone
    (``load_dataset``'s ``split``; ``job.data.train`` is empty) and nothing refused that its run was not.

    >>> from partition_fx.job.spec import JobSpec
    >>> build_job(JobSpec(partitions=1))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --augment affine learns its ranges, which needs --partitions 2 ...
    """
    if split is None:
        check_job(spec)
        spec = with_fixed_ranges(spec)
    device = resolve_device(spec.device)  # refuses --device cuda where there is none
    data = load_job_data(spec, split)
    assert data.num_classes is not None  # load_job_data refuses regression data
    torch.manual_seed(spec.train.runtime.seed)
    model = build_model(spec.model, data.num_classes, spec.checkpoint, data.input_shape[0], data.input_shape[-1])
    pmodel = partitionify_with(model, spec, spec.train.runtime.seed)
    if split is None:
        spec = _check_chunks(spec, len(data.train), pmodel)
    spec = spec.replace(proportions=pmodel.proportions)  # as the run records them
    hyper = build_augmentation(spec)
    return TrainJob(spec=spec, data=data, model=model, pmodel=pmodel, hyper=hyper, device=device)


class _AugmentationOptions(TypedDict, total=False):
    """The ``AffineAugmentation`` keywords :func:`build_augmentation` passes; one left out is the transform's own."""

    num_samples: int
    generators: Sequence[str] | str
    draws: str
    init: float | Mapping[str, float] | str
    max_range: Mapping[str, float] | None


def build_augmentation(spec: JobSpec) -> AffineAugmentation | None:
    """``--augment``'s input transform: learned ranges from ``--init``'s start (the transform's own, wide, without
    one) within ``--max-range``'s bounds (the transform's own for the ranges it does not name), or those ``--fix``
    fixes (``--fix-from``'s once they are read: :func:`~partition_fx.job.checks.with_fixed_ranges`); None for
    ``--augment none``.

    >>> from partition_fx.job.spec import JobSpec
    >>> build_augmentation(JobSpec(init={"rotation": 1.5})).hyperparameters()["rotation"]
    1.5
    >>> build_augmentation(JobSpec(max_range={"scale_x": 1.3863})).max_range["scale_x"]
    1.3863
    >>> build_augmentation(JobSpec(augment="none")) is None
    True
    """
    if spec.augment != "affine":
        return None
    options: _AugmentationOptions = {"num_samples": spec.samples, "generators": spec.generators, "draws": spec.draws}
    if spec.fix is not None:
        return AffineAugmentation.fixed(spec.fix, **options)
    if spec.init is not None:
        options["init"] = spec.init
    if spec.max_range is not None:
        options["max_range"] = dict(spec.max_range)
    return AffineAugmentation(**options)


def initial_hyperparameters(hyper: AffineAugmentation | None) -> dict[str, Any]:
    """Where ``hyper``'s values start, by name (``{}`` without one): what ``report.json`` records as
    ``initial_hyperparameters``, since the config records ``--init`` as given and an unnamed start is whatever
    this version's default is.

    >>> from partition_fx.job.spec import JobSpec
    >>> initial_hyperparameters(build_augmentation(JobSpec(init={"rotation": 1.5})))["rotation"]
    1.5
    >>> initial_hyperparameters(None)
    {}
    """
    return hyper.hyperparameters() if hyper is not None else {}


def load_job_data(spec: JobSpec, split: Split | None = None) -> DatasetSplits:
    """``--data`` at ``--image-size``/``--channels`` (``split``: that split alone, as ``load_dataset``), refused
    if it or one batch of it cannot fit in memory.

    >>> from partition_fx.job.spec import JobSpec
    >>> data = load_job_data(JobSpec(image_size=12), "train")
    >>> len(data.train), len(data.test)
    (1438, 0)
    """
    sizes = " ".join(
        f"--{name.replace('_', '-')} {spec.value(name)}"
        for name in ("image_size", "channels")
        if spec.value(name) is not None
    )
    named = named_dataset(spec.data)
    if spec.image_size is not None and named is not None and not named.on_disk:
        # bundled data is decoded whole; data on disk stays there unless it fits (datasets.images.DEFAULT_MEMORY_BUDGET)
        count = named.images or 1
        check_fits_in_memory(sizes, f"{count} image(s)", count * (spec.channels or 1) * spec.image_size**2 * 4)
    kwargs: dict[str, Any] = {}
    if spec.image_size is not None:
        kwargs["size"] = spec.image_size
    if spec.channels is not None:
        kwargs["channels"] = spec.channels
    try:
        data = load_dataset(spec.data, split=split, **kwargs)
    except PartitionArgumentError as e:  # the loader names its own arguments (size, channels): name the options
        raise PartitionArgumentError(f"--data {spec.data!r}{' ' + sizes if sizes else ''}: {e}") from None
    except PartitionError as e:  # an unknown name, or a folder that is not a dataset
        raise PartitionError(f"--data {spec.data!r}: {e}") from None
    batch_size, samples, partitions = spec.train.optimization.batch_size, spec.samples, spec.partitions
    batch = batch_size * samples * math.prod(data.input_shape) * 4
    check_fits_in_memory(f"--batch-size {batch_size} --samples {samples}", "one batch of inputs", batch)
    step = spec.train.hyper  # samples None: the transform's own
    hyper_batch, hyper_samples = hyper_step_batch_size(batch_size, step.batch_size), step.samples or samples
    chunks = max(1, partitions - 1)  # a hyperparameter step takes a batch from each chunk 2..C
    hyper = chunks * hyper_batch * hyper_samples * math.prod(data.input_shape) * 4
    check_fits_in_memory(
        f"--partitions {partitions} --hyper-batch-size {hyper_batch} --hyper-samples {hyper_samples}",
        "one hyperparameter batch of inputs",
        hyper,
    )
    if data.num_classes is None:
        raise PartitionArgumentError(f"--data {spec.data!r} is a regression task; `partition-fx train` classifies")
    if len(data.input_shape) != 3:
        raise PartitionArgumentError(f"--data {spec.data!r} is not images (example shape {data.input_shape})")
    return data


def _check_chunks(spec: JobSpec, num_train: int, pmodel: PartitionedModel) -> JobSpec:
    """Refuse now what ``fit`` would refuse later, an empty data chunk or a non-finite scaled weight decay, and a
    batch larger than the chunk it is drawn from; a batch size left at its default is lowered to that chunk's
    size instead, with one warning. Returns the job the run trains."""
    try:
        chunks = split_into_chunks(num_train, pmodel.proportions, spec.train.runtime.seed)
    except PartitionArgumentError as e:
        given = proportions_text(spec.partitions, spec.proportions)
        raise PartitionArgumentError(f"--proportions {given} of {num_train} examples: {e}") from None
    spec = _default_batches_fitted(spec, chunks.sizes)
    batch_size = spec.train.optimization.batch_size
    hyper_batch = hyper_step_batch_size(batch_size, spec.train.hyper.batch_size)
    check_batches_fit(chunks.sizes, batch_size, hyper_batch, ("--batch-size", "--hyper-batch-size"))
    scale = max(weight_decay_scales(chunks.sizes))
    weight_decay = spec.train.optimization.weight_decay
    if not math.isfinite(weight_decay * scale):
        raise PartitionArgumentError(
            f"--weight-decay {weight_decay} times partition 1's scale {scale:.3g} (N/|D_1|) is not finite; "
            "choose a smaller --weight-decay"
        )
    return spec


def _default_batches_fitted(spec: JobSpec, chunk_sizes: list[int]) -> JobSpec:
    """``spec`` with ``--batch-size`` / ``--hyper-batch-size`` lowered to the examples they are drawn from where
    they were left at defaults larger than that (a small folder), one warning each; ``spec`` itself if none was.
    The defaults are ``JobSpec``'s, which the command's options are generated from."""
    defaults = JobSpec()
    parameter, hyper = batch_pools(chunk_sizes)
    pools = {"batch_size": (parameter, "partition 1's parameter steps draw from")}
    if hyper is not None and spec.train.hyper.batch_size is not None:
        pools["hyper_batch_size"] = (hyper, "hyperparameter steps draw from")
    lowered = {}
    for name, ((k, examples), what) in pools.items():
        value = spec.value(name)
        if value == defaults.value(name) and value > examples:
            option = "--" + name.replace("_", "-")
            warnings.warn(
                f"{option} {value} (the default) is larger than the {examples} examples of chunk {k}, which {what}: "
                f"this run uses {option} {examples}",
                PartitionWarning,
                stacklevel=2,
            )
            lowered[name] = examples
    return spec.replace(**lowered) if lowered else spec
