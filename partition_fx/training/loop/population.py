"""Population-based training over the partitioned phase (``fit(..., population=N)``, ``partition-fx train
--population N``; the settings are :class:`~partition_fx.job.train_config.Population`'s).

A single run's ranges follow the hyper-gradient of the conditional LML at the weights as they are, which over
the iterations a step sees ahead is nearly flat: where a run ends depends on where it started
(docs/research.md). Population-based training (Jaderberg et al. 2017; for augmentation, Ho et al. 2019) compares
whole runs instead: N members of the run train side by side, each still learning its ranges by the hyper-gradient;
every ``population_interval`` iterations each is scored by its conditional LML (its own evaluation: no validation
set) and the worst ``population_exploit`` share takes the whole training state of the best (weights, ranges,
optimisers, schedulers, evaluations and random generators), then moves each of its affine ranges by a factor
e^(+-``population_delta``) (:func:`explore`). The members start from the run's ranges, all but the first moved
once. When partitioned training ends, the fittest member's state passes to the run's own trainer (the first
member: the model and input transform ``fit`` was given), which fine-tunes it as a single run does and returns
the run's :class:`~partition_fx.training.FitResult`, its ``population`` the comparisons.

The members read the same examples and draw the same augmentations (each member's torch generator kept apart, the
same at the start; a copy takes its source's), and their evaluations draw the same noise, so a comparison differs
in the ranges and what they trained. With one member per process and N of them, a population costs N times the
partitioned phase's time and memory.

What the run's hooks and callbacks see: at each comparison, the fittest member's trainer and evaluation, as a single
run's hooks see each evaluation (trackers also log every member's conditional LML and ranges, as
``population/<i>/<name>``); then the fine-tuning run's evaluations. On disk (``checkpoint_dir``): at each
comparison ``last.safetensors`` holds the fittest member's state, ``best.safetensors`` the fittest state so far,
and ``resume/`` the whole population: ``population.json`` (the comparisons, the explore generator, the hooks'
states) and one single run's resume directory per member (``member_<i>/``). From fine-tuning on the files are a
single run's, the comparisons kept as a hook's state (:class:`PopulationHistory`); ``fit(..., resume=...)``
continues either.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..._io import link_file, replace_directory
from ...errors import PartitionArgumentError, PartitionCheckpointError
from ...job.train_config import TrainConfig
from ...transforms import LearnedRanges
from ..checkpoint import load_training_state, resume_directory, save_training_state
from ..objective.lml import EvaluationRecord
from ..tracking import Tracker
from .components import Components
from .hooks import Callback, CallbackHook, CheckpointWriter, TrainingHook, hook_states, load_hook_states
from .progress import compact_hyperparameters, progress_outputs
from .trainer import FitResult, PartitionedTrainer

POPULATION_FILE = "population.json"
"""What marks a resume directory as a population's, beside its members' directories."""
FORMAT = 1
"""The version of ``population.json``."""


def explore(hyper: LearnedRanges, delta: float, floor: float, generator: torch.Generator) -> None:
    """Move every range of ``hyper`` by e^(+-delta), each sign drawn from ``generator``; a range below ``floor`` of
    its bound moves from that floor (a range at 0 is not stuck there), and none goes past its bound.

    >>> from partition_fx.transforms import AffineAugmentation
    >>> hyper = AffineAugmentation(generators=("rotation",), init="zero")
    >>> explore(hyper, 0.5, 0.05, torch.Generator().manual_seed(0))
    >>> 0 < hyper.hyperparameters()["rotation"] <= math.pi
    True
    """
    signs = torch.randint(0, 2, (len(hyper.generators),), generator=generator) * 2 - 1
    with torch.no_grad():
        for i, name in enumerate(hyper.generators):
            bound = hyper.max_range[name]
            start = max(abs(float(hyper.ranges[i])), floor * bound)
            hyper.ranges[i] = min(start * math.exp(float(signs[i]) * delta), bound)


def explored_transforms(hyper: nn.Module | None) -> list[LearnedRanges]:
    """The modules with learned ranges in ``hyper`` (itself or its submodules: each a
    :class:`~partition_fx.transforms.LearnedRanges`, such as an ``AffineAugmentation`` not fixed), whose ranges a
    population explores; refuses a run with none.

    >>> explored_transforms(None)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: population=N compares runs and moves their learned affine ranges, ...
    """
    found: list[LearnedRanges] = [] if hyper is None else [m for m in hyper.modules() if isinstance(m, LearnedRanges)]
    found = [m for m in found if not m.is_fixed]
    if not found:
        raise PartitionArgumentError(
            "population=N compares runs and moves their learned affine ranges, and this run learns none: pass "
            "hyper=AffineAugmentation(...) with learned ranges (partition-fx train: --augment affine without --fix), "
            "or leave population at 1"
        )
    return found


def fittest(scores: Sequence[float]) -> int:
    """The index of the highest score (the first of equals): the member a comparison ranks first.

    >>> fittest([-3.0, -1.0, -1.0])
    1
    """
    return max(range(len(scores)), key=lambda i: scores[i])


def ancestry(rounds: Sequence[dict[str, Any]]) -> list[int]:
    """The member whose state the final model descends from, at each comparison: the fittest of the last, and
    before each copy its source.

    >>> ancestry([{"fitness": [1, 2], "copies": [[1, 0]]}, {"fitness": [3, 2], "copies": []}])
    [1, 0]
    """
    member = fittest(rounds[-1]["fitness"])
    found = [member]
    for entry in reversed(rounds[:-1]):
        member = next((source for source, target in entry["copies"] if target == member), member)
        found.append(member)
    return found[::-1]


def population_size(directory: str | Path) -> int | None:
    """The members of the population whose resume directory ``directory`` is (written during its partitioned
    phase), or None: not a population's."""
    path = resume_directory(directory) / POPULATION_FILE
    return json.loads(path.read_text())["members"] if path.is_file() else None


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else []


def _set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
    torch.set_rng_state(state[0])
    if state[1]:
        torch.cuda.set_rng_state_all(state[1])


@dataclass
class Member:
    """One run of the population: its trainer, torch's generators between its turns, its last fitness."""

    trainer: PartitionedTrainer
    rng: tuple[torch.Tensor, list[torch.Tensor]]
    fitness: float = -math.inf

    def train_to(self, step: int, started: float) -> EvaluationRecord:
        """Iterate to ``step`` and evaluate; the fitness is the evaluation's conditional LML."""
        _set_rng_state(self.rng)
        while self.trainer.step < step:
            self.trainer.iteration()
        record = self.trainer.evaluate(started)
        self.rng = _rng_state()
        self.fitness = float(record["conditional_lml"])  # type: ignore[arg-type]  # partitioned: C >= 2
        return record

    def copy_from(self, source: Member) -> None:
        """Take ``source``'s whole training state (deep-copied: an optimiser loads its state's tensors as they are,
        and two members would then step the same ones) with its random generators."""
        _set_rng_state(source.rng)
        self.trainer.load_state_dict(copy.deepcopy(source.trainer.state_dict()))
        self.rng = (source.rng[0].clone(), [s.clone() for s in source.rng[1]])
        self.fitness = -math.inf  # not evaluated since: the state is the source's, its ranges are about to move


class PopulationHistory(TrainingHook):
    """The population's comparisons, carried by the run's trainer through fine-tuning: its state, so a run resumed
    after partitioned training still returns them (``FitResult.population``)."""

    state_key = "Population"  # a fixed name: the class may be renamed

    def __init__(self, members: int) -> None:
        self.members = members
        self.initial: list[dict[str, Any]] = []
        """Each member's ranges at the start."""
        self.rounds: list[dict[str, Any]] = []
        """Per comparison: ``step``, every member's ``fitness`` and ``ranges`` (the hyperparameters) and the
        ``copies`` made there (``[source, target]``)."""

    def summary(self) -> dict[str, Any]:
        """What ``FitResult.population`` holds: the members, their start, the comparisons and the ancestry of
        the final model."""
        return {
            "members": self.members,
            "initial": self.initial,
            "rounds": self.rounds,
            "ancestry": ancestry(self.rounds) if self.rounds else [],
        }

    def state_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial, self.rounds = state["initial"], state["rounds"]


class Population:
    """N members of one partitioned run compared by their conditional LML (see the module docstring); built and
    run by ``fit(..., population=N)``. ``members[0]`` is the run's own trainer, of ``pmodel`` and ``components``'s
    input transform and likelihood, which after the partitioned phase holds the fittest state and fine-tunes it.

    Example::

        >>> from partition_fx import partitionify
        >>> from partition_fx.training.loop.components import resolve
        >>> from partition_fx.transforms import AffineAugmentation
        >>> config, components = resolve("fit", None, {"hyper": AffineAugmentation(generators=("rotation",)),
        ...     "steps": 12, "batch_size": 8, "population": 2, "population_interval": 4, "eval_every": 4})
        >>> x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 2, (64,))
        >>> population = Population(partitionify(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2)), 2),
        ...     (x, y), config, components)
        >>> result = population.run(progress=False)
        >>> [r["step"] for r in result.population["rounds"]], result.steps
        ([4, 8], 12)
    """

    def __init__(self, pmodel: Any, dataset: Any, config: TrainConfig, components: Components) -> None:
        settings = config.population
        if settings.members < 2:
            raise PartitionArgumentError(f"a Population needs population >= 2, got {settings.members}")
        explored_transforms(components.hyper)  # refused before anything is built
        self.settings = settings
        self.checkpoint_dir: Path | None = components.checkpoint_dir  # type: ignore[assignment]  # stored resolved
        self.generator = torch.Generator().manual_seed(10_000 + config.runtime.seed)
        """Draws the signs of every move (:func:`explore`)."""
        starts = [(pmodel, components.hyper, components.likelihood)]
        for _ in range(settings.members - 1):
            start = copy.deepcopy(starts[0])
            for transform in explored_transforms(start[1]):
                explore(transform, settings.delta, settings.floor, self.generator)
            starts.append(start)
        self.members: list[Member] = []
        for i, (model, hyper, likelihood) in enumerate(starts):
            torch.manual_seed(config.runtime.seed)  # each member seeded as fit seeds a run
            own = components if i == 0 else dataclasses.replace(components, hooks=(), checkpoint_dir=None)
            own = dataclasses.replace(own, hyper=hyper, likelihood=likelihood)
            trainer = PartitionedTrainer(model, dataset, config, components=own)
            if trainer.data_parallel is not None:
                raise PartitionArgumentError(
                    "population=N trains its members in one process, and this one is in a process group of "
                    f"{trainer.data_parallel.world_size}: run it without torchrun, or pass data_parallel=False"
                )
            self.members.append(Member(trainer, _rng_state()))
        run = self.members[0].trainer
        self.hooks: list[TrainingHook] = run.hooks
        """The run's hooks (``fit``'s ``hooks`` and the checkpoint writer of ``checkpoint_dir``), held here while
        the members train: each comparison calls them (the population writes its own checkpoints), and the
        fine-tuning run's trainer gets them back."""
        run.hooks = []
        self.history = PopulationHistory(settings.members)
        self.history.initial = [m.trainer.steps.objective.hyperparameter_values() for m in self.members]
        self.best: float | None = None
        """The highest fitness of any comparison so far (what ``best.safetensors`` holds)."""
        self.finished = False
        """Whether the partitioned phase is over: a run resumed from its fine-tuning is the run's trainer alone."""

    @property
    def step(self) -> int:
        return self.members[0].trainer.step

    # --- the run -------------------------------------------------------------------------------------------------

    def run(self, callbacks: Sequence[Callback] = (), progress: bool | None = None) -> FitResult:
        """The partitioned phase as a population to its end (or until a hook or callback stops it), then the
        fittest member's state fine-tuned by the run's trainer; returns its result with ``population``."""
        run = self.members[0].trainer
        stopped = False
        if not self.finished:
            stopped = self._compare_to_end(callbacks, progress)
            self._hand_over()
        run.hooks = [*self.hooks, self.history]
        if stopped:  # as a single run a stop ends: no fine-tuning after it
            result = run.run(steps=0, finetune_steps=0, callbacks=callbacks, progress=False)
            result.stopped_early = True
        else:
            result = run.run(callbacks=callbacks, progress=progress)
        result.population = self.history.summary()
        return result

    def _compare_to_end(self, callbacks: Sequence[Callback], progress: bool | None) -> bool:
        """Train every member to each comparison of the partitioned phase and compare them there; returns
        whether a hook or callback stopped the run."""
        from tqdm.auto import tqdm

        run = self.members[0].trainer
        schedule = run.schedule
        end = schedule.finetune_from if schedule.finetune_from is not None else schedule.end
        interval = self.settings.interval
        boundaries = [b for b in [*range(interval, end, interval), end] if b > self.step]
        show, write_lines = progress_outputs(progress)
        asked = (*self.hooks, CallbackHook(callbacks))
        bar = tqdm(total=(end - self.step) * len(self.members), disable=not show, desc="population", unit="it")
        started = time.perf_counter()
        for hook in self.hooks:
            hook.before_run(run)
        try:
            for boundary in boundaries:
                records = []
                for member in self.members:
                    before = member.trainer.step
                    records.append(member.train_to(boundary, started))
                    bar.update(boundary - before)
                leader = fittest([m.fitness for m in self.members])
                improved = self.best is None or self.members[leader].fitness > self.best
                if improved:
                    self.best = self.members[leader].fitness
                self._compare(boundary, end)
                self._write(leader, improved)
                trainer, record = self.members[leader].trainer, records[leader]
                for hook in self.hooks:
                    if not isinstance(hook, CheckpointWriter):  # the population writes its own
                        hook.after_evaluation(trainer, record, improved)
                    if isinstance(hook, Tracker):
                        hook.log_metrics(boundary, self._metrics())
                if write_lines:
                    print(self._line(boundary, end, leader, started), file=sys.stderr, flush=True)
                if any(hook.should_stop(trainer, record) for hook in asked):
                    return True
        finally:
            bar.close()
        return False

    def _compare(self, step: int, end: int) -> None:
        """Record the members at ``step``; before the end of the partitioned phase, the worst share takes the
        state of the best (each pair once, best with worst) and moves its ranges."""
        scores = [m.fitness for m in self.members]
        entry: dict[str, Any] = {
            "step": step,
            "fitness": scores,
            "ranges": [m.trainer.steps.objective.hyperparameter_values() for m in self.members],
            "copies": [],
        }
        if step < end:
            ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
            count = max(1, int(self.settings.exploit * len(scores)))
            for source, target in zip(ranked[:count], reversed(ranked[-count:])):
                if scores[target] >= scores[source]:
                    continue
                self.members[target].copy_from(self.members[source])
                for hyper in explored_transforms(self.members[target].trainer.steps.hyper):
                    explore(hyper, self.settings.delta, self.settings.floor, self.generator)
                entry["copies"].append([source, target])
        self.history.rounds.append(entry)

    def _hand_over(self) -> None:
        """The fittest member's state to the run's trainer (whose model and transform ``fit`` was given); the other
        members are let go."""
        best = fittest([m.fitness for m in self.members])
        if best != 0:
            self.members[0].copy_from(self.members[best])
        _set_rng_state(self.members[0].rng)
        for member in self.members[1:]:
            member.trainer.steps.read_ahead.close()
        del self.members[1:]
        self.finished = True

    def _metrics(self) -> dict[str, float]:
        """Every member's fitness and ranges at the last comparison, for the trackers."""
        metrics: dict[str, float] = {}
        entry = self.history.rounds[-1]
        for i, fitness in enumerate(entry["fitness"]):
            metrics[f"population/{i}/conditional_lml"] = fitness
            for name, value in entry["ranges"][i].items():
                if isinstance(value, float):
                    metrics[f"population/{i}/{name}"] = value
        return metrics

    def _line(self, step: int, end: int, leader: int, started: float) -> str:
        """One progress line per comparison."""
        entry = self.history.rounds[-1]
        copies = ", ".join(f"{s}->{t}" for s, t in entry["copies"]) or "none"
        return (
            f"partition-fx: population at step {step}/{end}: fittest member {leader} (conditional LML "
            f"{entry['fitness'][leader]:.1f}; {compact_hyperparameters(entry['ranges'][leader])}), copies {copies}, "
            f"{time.perf_counter() - started:.0f} s"
        )

    # --- on disk -------------------------------------------------------------------------------------------------

    def _write(self, leader: int, improved: bool) -> None:
        """The fittest member's checkpoint files and the whole population's resume directory, when the run has a
        ``checkpoint_dir``."""
        if self.checkpoint_dir is None:
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        last = self.checkpoint_dir / "last.safetensors"
        self.members[leader].trainer.save_checkpoint(last)
        if improved:
            link_file(last, self.checkpoint_dir / "best.safetensors")
        self.save(self.checkpoint_dir / "resume")

    def save(self, directory: str | Path) -> None:
        """Write the population's state to ``directory`` (replaced atomically as a whole)."""
        plain = {
            "format": FORMAT,
            "members": len(self.members),
            "step": self.step,
            "best": self.best,
            "fitness": [m.fitness for m in self.members],
            "generator": self.generator.get_state().tolist(),
            "history": self.history.state_dict(),
            "hooks": hook_states(self.hooks),
        }
        current = _rng_state()

        def fill(staging: Path) -> None:
            for i, member in enumerate(self.members):
                _set_rng_state(member.rng)  # the member's own generators go into its state
                save_training_state(member.trainer, staging / f"member_{i}")
            (staging / POPULATION_FILE).write_text(json.dumps(plain, indent=1) + "\n")

        try:
            replace_directory(directory, fill, suffix="new-", fsync=True)
        finally:
            _set_rng_state(current)

    def load(self, directory: str | Path) -> None:
        """Continue from ``directory``: a population's resume directory, or (written during fine-tuning) the run's
        trainer's; refuses one from another configuration, naming what differs, before anything changes."""
        directory = resume_directory(directory)
        run = self.members[0].trainer
        if not (directory / POPULATION_FILE).is_file():  # fine-tuning: the run's trainer alone
            run.hooks = [*self.hooks, self.history]  # the comparisons come back as the history's state
            load_training_state(run, directory)  # a single run's state is refused: its fingerprint has population 1
            for member in self.members[1:]:
                member.trainer.steps.read_ahead.close()
            del self.members[1:]
            self.members[0].rng = _rng_state()
            self.finished = True
            return
        try:
            plain = json.loads((directory / POPULATION_FILE).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
            raise PartitionCheckpointError(f"{directory}/{POPULATION_FILE} is corrupted and was not loaded: {e}") from e
        if plain.get("format") != FORMAT:
            found = plain.get("format")
            raise PartitionCheckpointError(f"{directory} has format {found!r}; this version reads {FORMAT}")
        if plain["members"] != len(self.members):
            raise PartitionCheckpointError(
                f"{directory} holds a population of {plain['members']}, this run has population={len(self.members)}"
            )
        for i, member in enumerate(self.members):
            load_training_state(member.trainer, directory / f"member_{i}")
            member.rng = _rng_state()
            member.fitness = plain["fitness"][i]
        self.best = plain["best"]
        self.generator.set_state(torch.tensor(plain["generator"], dtype=torch.uint8))
        self.history.load_state_dict(plain["history"])
        load_hook_states(self.hooks, plain["hooks"])
