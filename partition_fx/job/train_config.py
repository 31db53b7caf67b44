"""``TrainConfig``: everything that decides what a partitioned training run computes, in one serialisable,
frozen, torch-free configuration with one set of defaults.

``fit(pmodel, data, hyper=..., steps=N, seed=S)`` and ``partition-fx train --steps N --seed S`` train with the
same :meth:`TrainConfig.recommended` recipe; ``TrainConfig.paper()`` is the paper's exact hyperparameter step.
Each field is declared once below (default, help, choices, bounds, whether a resumed run must match it), and
from there come ``fit``'s keywords (``hyper_samples=6``), the command line's options (``--hyper-samples``),
the checks, ``to_dict``/``from_dict`` (what ``report.json``, a run's ``config.json`` and ``--resume`` hold)
and the fields of the resume fingerprint.

What is not a recipe stays out: the Python objects a run is given (the model, data, input transform,
likelihood, optimiser factories, hooks) and where it runs (device, checkpoint directory, process group).

>>> config = TrainConfig.recommended(steps=200, seed=3)
>>> config.optimization.steps, config.hyper.samples, config.finetune_steps, config.eval_every
(200, 6, 80, 20)
>>> TrainConfig.from_dict(config.to_dict()) == config
True
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..choices import COMPILE_MODES, PRECISIONS, RANGE_NAMES
from ..errors import PartitionArgumentError, PartitionTypeError
from .settings import SettingError, Settings, setting

HYPER_CHUNKS = ("one", "all")
"""How a hyperparameter step picks chunks: ``one`` drawn k (the paper's), or ``all`` chunks 2..C, weighted
(the estimators of ``training.objective.estimators``)."""
WEIGHT_DECAY_SCALINGS = ("reciprocal", "sqrt", "none")
"""How partition k's weight decay is scaled by |D_1:k| (``training.step.optim.weight_decay_scales``)."""
OPTIMIZERS = ("adam", "sgd")
"""The weights' optimiser: ``torch.optim.Adam``, or ``torch.optim.SGD`` with ``momentum`` (the paper's CIFAR runs)."""
LR_SCHEDULES = ("cosine", "constant")
"""The weights' learning rate over the run: cosine-annealed to 1/100 of its initial value, or constant."""
FINETUNE_SCHEDULES = ("continue", "restart")
"""The weights' learning rate when fine-tuning: the run's schedule carries on (the paper's single schedule), or
it restarts at ``lr`` and anneals over the fine-tuning steps alone (a warm restart)."""
ON_NONFINITE = ("raise", "skip")
HYPER_NORMS = ("batch", "detached", "running")
"""What BatchNorm normalises a hyperparameter step's batches with (``training.objective.lml.hyper_step_norms``): their
own statistics, through which the hyper-gradient also flows (the paper's networks have no BatchNorm); the same
statistics held constant in the backward pass; or the running statistics of the parameter steps."""
HYPER_GRADIENTS = ("fixed", "implicit")
"""What a hyperparameter step's gradient sees: the LML at the weights as they are (``fixed``, the paper's), or also
what the ranges do to the weights that training produces (``implicit``: ``training.objective.implicit``)."""
OCCAM_TERMS = ("none", "whole", "conditional")
"""What the hyperparameter step adds to the conditional LML: nothing, the whole network's Kronecker-factored Laplace
Occam term of all the data (LILA's), or its part for chunks 2..C given chunk 1 (``training.objective.occam``)."""
RUN_FILE = "run.json"
"""What ``fit(..., checkpoint_dir=DIR)`` writes in ``DIR``: the run in the command line's terms, so that
``partition-fx export --run DIR`` can rebuild it (``training.fit``)."""


def _range_factors(name: str, value: Any) -> dict[str, float]:
    """``train_range_factors``: a factor > 0 for each affine augmentation range it names (``choices.RANGE_NAMES``)."""
    if not isinstance(value, Mapping):
        raise PartitionTypeError(
            f"{name} must be a dict of factors by range name, e.g. {{'scale': 1.0}}, got {value!r}"
        )
    unknown = sorted(set(value) - set(RANGE_NAMES))
    if unknown:
        raise PartitionArgumentError(
            f"{name} has unknown range(s) {', '.join(unknown)}; the ranges are {', '.join(RANGE_NAMES)}"
        )
    for key, number in value.items():
        if isinstance(number, bool) or not isinstance(number, numbers.Real) or not 0 < float(number) < math.inf:
            raise PartitionArgumentError(f"{name} {key}={number!r} must be a finite factor > 0")
    return {key: float(number) for key, number in value.items()}


@dataclass(frozen=True)
class Optimization(Settings):
    """How the weights are trained: ``steps`` iterations, each a parameter step of partition k ~ Cat(u) on
    ``batch_size`` examples of D_1:k (plus a hyperparameter step when due), ``optimizer`` (Adam, or SGD with
    ``momentum``) at ``lr`` with ``weight_decay``
    scaled per partition (``weight_decay_scaling``: reciprocal/sqrt/none of N/|D_1:k|, see
    ``training.weight_decay_scales``), the learning rate following ``lr_schedule`` over the whole run."""

    section_help = "training"
    steps: int = setting(400, "iterations", minimum=1, metavar="N")
    batch_size: int = setting(64, "examples per parameter step", minimum=1, metavar="N", fingerprint=True)
    optimizer: str = setting("adam", "the weights' optimiser: Adam, or SGD with --momentum", choices=OPTIMIZERS,
                             keyword="weight_optimizer", fingerprint=True)  # fmt: skip
    momentum: float = setting(0.9, "SGD's momentum (with --weight-optimizer sgd)", metavar="M", fingerprint=True)
    lr: float = setting(1e-3, "the weights' learning rate", positive=True, metavar="LR")
    lr_schedule: str = setting(
        "cosine",
        "the weights' learning rate over --steps: cosine-annealed to 1/100 of --lr, or constant",
        choices=LR_SCHEDULES,
    )
    weight_decay: float = setting(0.0, "the weights' decay, scaled per partition by --weight-decay-scaling",
                                  metavar="WD")  # fmt: skip
    weight_decay_scaling: str = setting(
        "reciprocal",
        "partition k's weight decay times N/|D_1:k| (reciprocal), its square root (sqrt), or unscaled (none)",
        choices=WEIGHT_DECAY_SCALINGS,
    )


@dataclass(frozen=True)
class HyperStep(Settings):
    """How the hyperparameters are learned: Adam (``hyper_lr``) on the partitioned LML's hyper-gradient, a
    step every ``hyper_every`` iterations once ``warmup_steps`` have passed. ``hyper_chunks="one"`` (the
    paper's) scores one chunk k ~ Cat(u_2..C) through subnetwork k-1; ``"all"`` scores a minibatch of every
    chunk 2..C, weighted by the same probabilities: the same expected gradient without the variance of the
    draw of k, at C-1 times the cost. ``hyper_batch_size`` examples per chunk (None: ``batch_size``);
    ``hyper_samples`` augmentation samples per example (None: the transform's own ``num_samples``; ignored by
    a transform whose forward takes no ``num_samples``): more samples lower the hyper-gradient's variance.
    ``train_range_factor`` F: while hyperparameters are learned, partitioned training's parameter steps draw the
    augmentation from its ranges times F (for a transform with ``widened``, such as ``AffineAugmentation``;
    ignored by others and by fixed ranges), so the subnetworks that score psi were trained on augmentation
    narrower (F < 1, the default 0.5) or wider than psi: a range the data does not hold then costs evidence
    that the weights do not absorb, and shrinks. ``train_range_factors`` gives the ranges it names their own F
    (``{"scale": 1.0}``: the zoom trained at the range it is scored at, every other range at F)."""

    section_help = "learned hyperparameters"
    lr: float = setting(0.05, "Adam's learning rate on the hyperparameters", keyword="hyper_lr", positive=True,
                        metavar="LR")  # fmt: skip
    every: int = setting(2, "a hyperparameter step every N iterations", keyword="hyper_every", minimum=1,
                         metavar="N", fingerprint=True)  # fmt: skip
    chunks: str = setting(
        "all",
        "a hyperparameter step scores one drawn chunk (the paper's) or every chunk 2..C, weighted",
        keyword="hyper_chunks",
        choices=HYPER_CHUNKS,
        fingerprint=True,
    )
    samples: int | None = setting(
        6,
        "augmentation samples per example in hyperparameter steps, for an input transform that draws samples",
        keyword="hyper_samples",
        minimum=1,
        metavar="S",
        default_text="the transform's own",
        fingerprint=True,
    )
    batch_size: int | None = setting(16, "examples per chunk in a hyperparameter step", keyword="hyper_batch_size",
                                     minimum=1, metavar="N", default_text="--batch-size", fingerprint=True)  # fmt: skip
    warmup_steps: int = setting(0, "iterations before the first hyperparameter step", minimum=0, metavar="N",
                                fingerprint=True)  # fmt: skip
    train_range_factor: float = setting(
        0.5,
        "parameter steps of partitioned training draw the learned augmentation from its ranges times F (1: the "
        "ranges themselves, the paper's; fine-tuning always uses them; ignored by fixed ranges and by a transform "
        "that cannot scale them)",
        keyword="train_range_factor",
        positive=True,
        metavar="F",
        fingerprint=True,
    )
    train_range_factors: Mapping[str, float] | None = setting(
        None,
        "these ranges' own --train-range-factor, e.g. scale=1 (each one of the augmentation's generators; every other "
        "range takes --train-range-factor)",
        keyword="train_range_factors",
        metavar="NAME=F[,...]",
        default_text="none, every range takes --train-range-factor",
        validator=_range_factors,
        fingerprint=True,
        absent_means=None,  # configurations written before it existed widened every range alike
    )
    norm_statistics: str = setting(
        "batch",
        "what BatchNorm normalises a hyperparameter step's batches with: their own statistics, which the "
        "hyper-gradient also flows through; the same held constant in the backward pass (detached); or the running "
        "statistics of the parameter steps, which the step then leaves as they are (running)",
        keyword="hyper_norm",
        choices=HYPER_NORMS,
        absent_means="batch",  # configurations written before it existed all stepped this way
    )
    gradient: str = setting(
        "fixed",
        "the hyper-gradient: of the LML at the weights as they are, or also through the weights that training on "
        "the ranges produces (implicit differentiation, a Neumann series of --implicit-terms terms)",
        keyword="hyper_gradient",
        choices=HYPER_GRADIENTS,
        fingerprint=True,
        absent_means="fixed",
    )
    implicit_terms: int = setting(
        5,
        "terms K of the implicit hyper-gradient's Neumann series (0: one unrolled SGD step); each costs a "
        "Hessian-vector product",
        minimum=0,
        metavar="K",
        fingerprint=True,
        absent_means=5,
    )
    implicit_lr: float = setting(
        0.01,
        "the step alpha of the implicit hyper-gradient's Neumann series: the SGD step of the training it sees through",
        positive=True,
        metavar="ALPHA",
        fingerprint=True,
        absent_means=0.01,
    )
    occam_term: str = setting(
        "none",
        "what the hyperparameter step adds to the conditional LML, per example: nothing, the whole network's Occam "
        "term of all the data (LILA's: the Laplace log-determinant of every Conv2d's and Linear's curvature over the "
        "augmented views, Kronecker-factored, each layer's prior precision fitted), or its part for chunks 2..C given "
        "chunk 1 (the whole data's less chunk 1's); either also says when a range is too narrow",
        choices=OCCAM_TERMS,
        fingerprint=True,
        absent_means="none",
    )
    occam_every: int = setting(
        10,
        "--occam-term: refresh the Occam term's derivative every N hyperparameter steps (the steps between reuse it)",
        minimum=1,
        metavar="N",
        fingerprint=True,
        absent_means=10,
    )
    occam_examples: int = setting(
        64,
        "--occam-term: examples from all the data that each refresh factors the curvature on",
        minimum=1,
        metavar="M",
        fingerprint=True,
        absent_means=64,
    )


@dataclass(frozen=True)
class FineTuning(Settings):
    """The last ``finetune_steps`` of the ``steps`` iterations fine-tune the final model (the paper's Table 2):
    psi is frozen, every weight of subnetwork C (all partitions, as exported) trains on ALL the data with the
    learned augmentation, the optimiser carries on, the weight decay is no longer scaled, and the LR schedule
    restarts at ``lr`` over the fine-tuning steps (``finetune_schedule="restart"``, the default: the configured
    ``lr_schedule``, cosine to 1/100 of ``lr`` or constant) or carries on (``"continue"``, the paper's: one
    schedule spans both phases).
    No LML is estimated then (no subnetwork is unseen by a chunk any more): those evaluations record
    ``phase: "finetune"`` and the training loss. ``patience`` ends the partitioned phase
    early (fine-tuning then runs to ``steps``); ``restore_best`` restores the best state first. ``steps`` None:
    ``fraction`` of the run's steps; 0: partitioned training only."""

    section_help = "training"
    steps: int | None = setting(
        None,
        "the last N of --steps fine-tune the final model on all the data with the learned hyperparameters "
        "frozen; 0: none",
        keyword="finetune_steps",
        minimum=0,
        metavar="N",
        default_text="--finetune-fraction of --steps",
    )
    fraction: float = setting(
        0.4,
        "without --finetune-steps, this share of --steps fine-tunes the final model",
        keyword="finetune_fraction",
        maximum=1.0,
        metavar="F",
        # configurations written before the field existed fine-tuned a quarter of the run
        absent_means=0.25,
    )
    schedule: str = setting(
        "restart",
        "the learning rate when fine-tuning begins: --lr-schedule carries on over --steps (continue), or restarts "
        "at --lr and anneals over the fine-tuning steps alone (restart)",
        keyword="finetune_schedule",
        choices=FINETUNE_SCHEDULES,
    )


MIN_EVAL_EVERY = 20
"""The fewest iterations between two LML estimates by default (``TrainConfig.eval_every``)."""


@dataclass(frozen=True)
class Evaluation(Settings):
    """When the LML is estimated (every ``eval_every`` iterations and at the last; at most
    ``eval_examples_per_chunk`` examples per chunk, an unbiased estimate) and what is done with it:
    ``patience`` evaluations without a better conditional LML end partitioned training, ``restore_best``
    returns the best state (the highest conditional LML; see ``PartitionedTrainer.selection_score``), and
    ``recalibrate_norms`` recomputes BatchNorm running statistics for the final subnetwork over the training
    data at the end (they are shared by all subnetworks during training; the LML runs in training mode)."""

    section_help = "evaluation"
    every: int | None = setting(None, "estimate the LML and checkpoint every N iterations", keyword="eval_every",
                                minimum=1, metavar="N",
                                default_text="--steps/10, at least 20; a shorter run: at its end")  # fmt: skip
    batch_size: int = setting(256, "examples per forward when estimating the LML", keyword="eval_batch_size",
                              minimum=1, metavar="N")  # fmt: skip
    examples_per_chunk: int | None = setting(
        None,
        "score at most N examples per chunk (an unbiased estimate)",
        keyword="eval_examples_per_chunk",
        minimum=1,
        metavar="N",
        default_text="all of them",
    )
    patience: int | None = setting(
        None,
        "end partitioned training after N evaluations without a better conditional LML",
        minimum=1,
        metavar="N",
        default_text="never",
    )
    restore_best: bool = setting(False, "restore the state of the best conditional LML when partitioned training ends")
    recalibrate_norms: bool = setting(
        True,
        "recompute BatchNorm running statistics for the final subnetwork at the end of the run",
        command_line=False,
    )


@dataclass(frozen=True)
class Runtime(Settings):
    """How the iterations are computed.

    ``seed`` (0..2**63-1) seeds the chunks, the sampler and torch's global RNG (augmentation and dropout
    noise). ``precision`` ``bf16``/``fp16`` runs the forwards under ``torch.autocast`` (partitions, gradients
    and optimiser state stay fp32; fp16 adds a ``GradScaler``, whose skipped overflowing steps are not faults).
    ``compile`` (True or a mode) compiles the model in place first (``PartitionedModel.compile``). ``fused``:
    the parameter and hyperparameter steps of an iteration in one forward and one backward (not yet with
    hyperparameter modules inside the model); ``every_partition``: each example of a parameter batch draws its
    own partition, so every partition is updated every iteration. ``on_nonfinite``: ``raise`` (name the step
    and partition) or ``skip`` the step; ``check_every``: steps between reads of the device for that check
    (1 on the CPU, 50 on an accelerator, which runs ahead of Python between reads: a fault is then found at the
    next read, at the latest before any state is saved; ``skip`` reads every step). ``workers`` processes
    decode a map-style dataset's batches ``prefetch`` ahead of the steps (``training.sampling.chunks``); they never
    change what is computed."""

    section_help = "running"
    seed: int = setting(0, "seeds the partition layout, data chunks, sampler and augmentation noise", seed=True,
                        metavar="N")  # fmt: skip
    precision: str = setting(
        "fp32",
        "the dtype forwards run in under torch.autocast; weights and optimiser state stay fp32 (fp16 is many "
        "times slower on a CPU, where bf16 is not: warned)",
        choices=PRECISIONS,
    )
    compile: str | None = setting(
        None,
        "torch.compile the model first: MODE default, reduce-overhead (CUDA graphs) or max-autotune",
        choices=COMPILE_MODES,
        const="default",
        bool_values=(None, "default"),
        metavar="MODE",
        default_text="off; --compile alone: default",
    )
    fused: bool = setting(False, "the parameter and hyperparameter steps in one forward and backward",
                          fingerprint=True)  # fmt: skip
    every_partition: bool = setting(
        False, "every example draws its own partition, so each iteration trains them all", fingerprint=True
    )
    check_every: int | None = setting(
        None,
        "steps between reads of the device for the non-finite check",
        minimum=1,
        metavar="N",
        default_text="1 on the CPU, 50 on an accelerator",
    )
    on_nonfinite: str = setting("raise", "a non-finite loss or gradient stops the run (raise) or skips the step",
                                choices=ON_NONFINITE)  # fmt: skip
    workers: int | None = setting(
        None,
        "worker processes that decode the examples ahead of the steps (data read from disk; the run is the same "
        "for any number)",
        minimum=0,
        metavar="N",
        default_text="min(4, CPUs - 1) for images read from disk, 0 for other datasets and tensors",
    )
    prefetch: int = setting(2, "batches each worker decodes ahead", minimum=1, metavar="N")


@dataclass(frozen=True)
class Checkpointing(Settings):
    """What checkpoints hold: ``checkpoint_defaults=False`` leaves the partitions' default values out (with
    ``init`` defaults a copy of every partitioned weight, a large share of a checkpoint: docs/benchmarks.md),
    for runs whose model is rebuilt the same way before loading (same seed and weights, as ``partition-fx``
    does); a model that rebuilds them differently is refused. Layouts are always left out: ``partitionify``
    rebuilds them from its seed."""

    section_help = "output"
    defaults: bool = setting(
        True,
        "store the partitions' default values in checkpoints (False: a model rebuilt the same way restores them)",
        keyword="checkpoint_defaults",
        command_line=False,
    )


@dataclass(frozen=True)
class Population(Settings):
    """Population-based training (Jaderberg et al. 2017; for augmentation, Ho et al. 2019) over the partitioned
    phase, with the conditional LML as its fitness, so still without a validation set: ``population`` runs of the
    same job train side by side, each learning its ranges by the hyper-gradient; every ``population_interval``
    iterations each is scored by its conditional LML and the worst ``population_exploit`` share takes the whole
    training state of the best, then moves each of its affine ranges by e^(+-``population_delta``) (a range below
    ``population_floor`` of its bound moves from there). The members start from the run's ranges, all but the first
    moved once. When partitioned training ends, the fittest fine-tunes as a single run does. A population of 4
    reached the full rotation from every start where single runs given as many images did not
    (docs/research.md); it costs ``population`` times the partitioned phase. 1: a single run."""

    section_help = "training"
    members: int = setting(
        1,
        "train N runs of the partitioned phase side by side, the worst copying the fittest (by the conditional "
        "LML) every --population-interval iterations, then fine-tune the fittest; 1: a single run",
        keyword="population",
        minimum=1,
        metavar="N",
        fingerprint=True,
        absent_means=1,  # configurations written before populations were single runs
    )
    interval: int = setting(
        20, "iterations between two comparisons of the population", keyword="population_interval", minimum=1,
        metavar="N", fingerprint=True, absent_means=20,
    )  # fmt: skip
    exploit: float = setting(
        0.5, "the worst share of the population (at most half) that takes the fittest's state at a comparison",
        keyword="population_exploit", positive=True, maximum=0.5, metavar="F", fingerprint=True, absent_means=0.5,
    )  # fmt: skip
    delta: float = setting(
        0.5, "a copied member's ranges move by e^(+-DELTA), each sign drawn", keyword="population_delta",
        positive=True, metavar="DELTA", fingerprint=True, absent_means=0.5,
    )  # fmt: skip
    floor: float = setting(
        0.05, "a range below this share of its bound moves from there (a range at 0 is not stuck)",
        keyword="population_floor", maximum=1.0, metavar="F", fingerprint=True, absent_means=0.05,
    )  # fmt: skip


@dataclass(frozen=True)
class TrainConfig(Settings):
    """A training run's recipe: :class:`Optimization`, :class:`HyperStep`, :class:`FineTuning`,
    :class:`Evaluation`, :class:`Runtime`, :class:`Checkpointing` and :class:`Population` (see each field's help, or
    ``partition-fx train --help``). Built with the recommended defaults; ``replace(**keywords)`` and the named
    constructors take the flat keywords ``fit`` takes.

    >>> TrainConfig.paper().hyper.chunks, TrainConfig().hyper.chunks
    ('one', 'all')
    >>> TrainConfig.from_dict({"optimization": {"stepz": 3}})
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: TrainConfig.optimization has unknown key(s) 'stepz'; it takes ...
    """

    optimization: Optimization = field(default_factory=Optimization)
    hyper: HyperStep = field(default_factory=HyperStep)
    finetuning: FineTuning = field(default_factory=FineTuning)
    evaluation: Evaluation = field(default_factory=Evaluation)
    runtime: Runtime = field(default_factory=Runtime)
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    population: Population = field(default_factory=Population)

    def check(self) -> None:
        if self.runtime.fused and self.hyper.norm_statistics != "batch":
            raise SettingError(
                self.keywords()["hyper_norm"],
                f"must be batch with --fused (one forward normalises the parameter and hyperparameter batches "
                f"together), got {self.hyper.norm_statistics!r}",
                f"must be 'batch' with fused=True (one forward normalises both steps' batches together), got "
                f"{self.hyper.norm_statistics!r}",
            )
        if self.hyper.gradient == "implicit" and (self.runtime.fused or self.runtime.precision == "fp16"):
            # Second derivatives in a backward of its own: neither inside the fused one, nor under fp16's loss scale.
            fused = self.runtime.fused
            flag, keyword = ("--fused", "fused=True") if fused else ("--precision fp16", "precision='fp16'")
            why = "(the implicit hyper-gradient takes second derivatives in a backward of its own, unscaled)"
            raise SettingError(
                self.keywords()["hyper_gradient"],
                f"must be fixed with {flag} {why}, got 'implicit'",
                f"must be 'fixed' with {keyword} {why}, got 'implicit'",
            )
        if self.population.members > 1 and self.evaluation.patience is not None:
            raise SettingError(
                self.keywords()["patience"],
                "must be left out with --population (the population's comparisons decide, not one run's patience)",
                "must be None with population >= 2 (the population's comparisons decide, not one run's patience)",
            )
        if self.population.members == 1:
            single = Population()
            for field in Population.fields():
                attribute = field.path[-1]
                if field.keyword != "population" and getattr(self.population, attribute) != getattr(single, attribute):
                    raise SettingError(
                        self.keywords()[field.keyword],
                        "sets a population's comparisons, and this run is a single one; pass --population N (2 or "
                        "more) or drop it",
                        "sets a population's comparisons, and this run is a single one; pass population=N (2 or "
                        "more) or leave it out",
                    )
        steps, finetune = self.optimization.steps, self.finetuning.steps
        if finetune is not None and finetune >= steps:
            fields = self.keywords()
            raise SettingError(
                fields["finetune_steps"],
                f"must be less than --steps {steps} (they are its last iterations, after partitioned training has "
                f"learned the hyperparameters), got {finetune}",
                f"({finetune}) must be less than steps ({steps}): they are the last iterations of the run, after "
                "partitioned training (at least one iteration) has learned the hyperparameters",
            )

    @classmethod
    def recommended(cls, **keywords: Any) -> TrainConfig:
        """The recipe ``fit`` and ``partition-fx train`` default to (the defaults of every field), with
        ``keywords`` changed: every chunk scored with 6 augmentation samples of 16 examples every 2nd
        iteration, Adam 0.05 on the hyperparameters, parameter steps on half the learned ranges, Adam 1e-3 on
        the weights cosine-annealed to 1e-5, the last 0.4 of the steps fine-tuning with the rate restarted.
        The project's measurements chose it
        (``docs/benchmarks.md``)."""
        return cls().replace(**keywords)

    @classmethod
    def paper(cls, **keywords: Any) -> TrainConfig:
        """The paper's hyperparameter step (appendix I.1): one chunk k ~ Cat(u_2..C) on a minibatch as large as
        the parameter step's, every iteration, with the input transform's own samples, parameter steps on the
        ranges themselves; Adam 1e-3 on weights and hyperparameters at a constant rate, batches of 128, no
        fine-tuning (and one schedule over both phases when ``finetune_steps`` adds some); with ``keywords``
        changed. (The paper's ranges also start at 0 and its samples are drawn
        independently: ``AffineAugmentation(init="zero", draws="uniform")``.)

        >>> TrainConfig.paper(steps=10).hyper.every
        1
        """
        paper = {
            "batch_size": 128,
            "lr_schedule": "constant",
            "hyper_lr": 1e-3,
            "hyper_every": 1,
            "hyper_chunks": "one",
            "hyper_samples": None,
            "hyper_batch_size": None,
            "train_range_factor": 1.0,
            "finetune_steps": 0,
            "finetune_schedule": "continue",
        }
        return cls().replace(**{**paper, **keywords})

    @property
    def finetune_steps(self) -> int:
        """The iterations that fine-tune: ``finetuning.steps``, or ``finetuning.fraction`` of the steps."""
        steps = self.finetuning.steps
        return steps if steps is not None else int(self.optimization.steps * self.finetuning.fraction)

    @property
    def eval_every(self) -> int:
        """Iterations between LML estimates: ``evaluation.every``, or a tenth of the steps but at least
        :data:`MIN_EVAL_EVERY` apart (a shorter run estimates it at its end alone: one estimate passes every scored
        example forward, which on CIFAR-10 costs more than such a run's training).

        >>> TrainConfig.recommended(steps=400).eval_every, TrainConfig.recommended(steps=100).eval_every
        (40, 20)
        >>> TrainConfig.recommended(steps=10).eval_every, TrainConfig.recommended(steps=10, eval_every=1).eval_every
        (10, 1)
        """
        steps = self.optimization.steps
        return self.evaluation.every or max(steps // 10, min(steps, MIN_EVAL_EVERY))


__all__ = [
    "Checkpointing",
    "Evaluation",
    "FineTuning",
    "HyperStep",
    "Optimization",
    "Population",
    "Runtime",
    "TrainConfig",
]
