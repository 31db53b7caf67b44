"""Population-based training (``fit(..., population=N)``, ``training.loop.population``) against its definition: members
that are never compared are single runs from their starts, and the fittest's is the run's result; a population is
the one-at-a-time algorithm written out here with plain trainers (train each member to the comparison, copy the best
into the worst, move its ranges); a resumed population finishes as an uninterrupted one, from its partitioned phase
and from its fine-tuning; the move of a range follows its rule for any range, bound and step; and what it cannot do
is refused in one line naming the fix."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError, PartitionCheckpointError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.training.loop.components import resolve
from partition_fx.training.loop.population import POPULATION_FILE, Population, explore
from partition_fx.training.tracking import CSVTracker
from partition_fx.transforms import AffineAugmentation, HyperparameterModule, LearnedRanges

SEED = 0
RUN = {"steps": 20, "batch_size": 16, "hyper_batch_size": 8, "hyper_samples": 2, "progress": False}
"""A small run: 12 partitioned iterations, 8 fine-tuning (the recommended 0.4), evaluated every 12 and at 20."""
PARTITIONED_END = 12


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(120, 1, 8, 8, generator=generator)
    return x, (x[:, 0, :4].sum((1, 2)) > 0).long()


def _start() -> tuple[nn.Module, AffineAugmentation]:
    """The run's model and input transform, the same at every call."""
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return partitionify(model, 2, (0.6, 0.4), seed=SEED), AffineAugmentation(generators=("rotation", "scale"))


def _same_result(a, b) -> None:
    """Two FitResults equal but for wall-clock time."""
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("seconds")
        for record in d["history"]:
            record.pop("seconds")
    assert da == db


def _same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_members_never_compared_are_single_runs_and_the_fittest_is_the_result() -> None:
    """With one comparison, at the end of the partitioned phase, nothing is copied: each member is a single run from
    its start (the first the run's, the second the run's moved once), and the population's result is the fittest
    one's, fine-tuned, in the model ``fit`` was given."""
    data = _data()
    pmodel, hyper = _start()
    result = fit(pmodel, data, hyper=hyper, population=2, population_interval=100, eval_every=PARTITIONED_END, **RUN)
    rounds = result.population["rounds"]
    assert [r["step"] for r in rounds] == [PARTITIONED_END] and rounds[0]["copies"] == []
    singles = []
    for member in range(2):
        single_model, single_hyper = _start()
        if member == 1:
            explore(single_hyper, 0.5, 0.05, torch.Generator().manual_seed(10_000 + SEED))
        assert single_hyper.hyperparameters() == pytest.approx(result.population["initial"][member])
        single = fit(single_model, data, hyper=single_hyper, eval_every=PARTITIONED_END, **RUN)
        partitioned = next(r for r in single.history if r["step"] == PARTITIONED_END)
        assert partitioned["conditional_lml"] == rounds[0]["fitness"][member]
        assert partitioned["hyperparameters"] == rounds[0]["ranges"][member]
        singles.append((single, single_model, single_hyper))
    fittest = max(range(2), key=lambda i: rounds[0]["fitness"][i])
    assert result.population["ancestry"] == [fittest]
    single, single_model, single_hyper = singles[fittest]
    _same_result(result, _with_population(single, result.population))
    _same_state(pmodel, single_model)
    _same_state(hyper, single_hyper)


def _with_population(result, population):
    result = copy.copy(result)
    result.population = population
    return result


def _reference(data, members: int, interval: int, delta: float = 0.5, floor: float = 0.05):
    """The population written out one member at a time with plain trainers: every member trains to each comparison
    on its own torch generator and is scored by its conditional LML; the worst half takes the best's state (a deep
    copy) and generators, then moves its ranges; the fittest at the end fine-tunes."""
    explored = torch.Generator().manual_seed(10_000 + SEED)
    starts = [_start()]
    for _ in range(members - 1):
        pmodel, hyper = copy.deepcopy(starts[0])
        explore(hyper, delta, floor, explored)
        starts.append((pmodel, hyper))
    trainers, rngs = [], []
    config = {k: v for k, v in RUN.items() if k != "progress"}
    for pmodel, hyper in starts:
        torch.manual_seed(SEED)
        trainers.append(PartitionedTrainer(pmodel, data, hyper=hyper, **config))
        rngs.append(torch.get_rng_state())
    fitness = [0.0] * members
    for boundary in [*range(interval, PARTITIONED_END, interval), PARTITIONED_END]:
        for i, trainer in enumerate(trainers):
            torch.set_rng_state(rngs[i])
            while trainer.step < boundary:
                trainer.iteration()
            fitness[i] = trainer.evaluate(0.0)["conditional_lml"]
            rngs[i] = torch.get_rng_state()
        if boundary < PARTITIONED_END:
            ranked = sorted(range(members), key=lambda i: fitness[i], reverse=True)
            count = max(1, members // 2)
            for source, target in zip(ranked[:count], reversed(ranked[-count:])):
                if fitness[target] < fitness[source]:
                    trainers[target].load_state_dict(copy.deepcopy(trainers[source].state_dict()))
                    rngs[target] = rngs[source].clone()
                    explore(trainers[target].steps.hyper, delta, floor, explored)
    best = max(range(members), key=lambda i: fitness[i])
    torch.set_rng_state(rngs[best])
    return trainers[best].run(progress=False), trainers[best]


def test_a_population_is_the_one_at_a_time_algorithm() -> None:
    """Three members compared every 4 iterations (copies at 4 and 8) end bit for bit where the algorithm run by hand
    with plain trainers ends: the same comparisons, the same fine-tuned model and ranges."""
    data = _data()
    pmodel, hyper = _start()
    result = fit(pmodel, data, hyper=hyper, population=3, population_interval=4, **RUN)
    assert [r["step"] for r in result.population["rounds"]] == [4, 8, 12]
    assert any(r["copies"] for r in result.population["rounds"])  # the test compares copies, not only runs
    clock = [r["seconds"] for r in result.history]  # the fittest's clock goes on from comparison to comparison
    assert clock == sorted(clock) and result.seconds >= clock[-1]
    expected, trainer = _reference(data, 3, 4)
    _same_result(result, _with_population(expected, result.population))
    _same_state(pmodel, trainer.pmodel)
    _same_state(hyper, trainer.steps.hyper)


def test_a_copied_member_continues_as_its_source() -> None:
    """After ``copy_from`` a member trains exactly as the member it copied (weights, ranges, optimisers, samplers and
    draws); members at different ranges are scored with the same draws."""
    pmodel, hyper = _start()
    run = {k: v for k, v in RUN.items() if k != "progress"}
    config, components = resolve("fit", None, {"hyper": hyper, "population": 2, **run})
    first, second = Population(pmodel, _data(), config, components).members
    assert first.trainer.steps.hyper.hyperparameters() != second.trainer.steps.hyper.hyperparameters()
    first.train_to(2, 0.0), second.train_to(2, 0.0)
    scored = [m.trainer.steps.evaluator.generator.get_state() for m in (first, second)]
    assert torch.equal(*scored)
    second.copy_from(first)
    assert second.fitness == -math.inf  # not evaluated since
    first.train_to(4, 0.0), second.train_to(4, 0.0)
    assert first.fitness == second.fitness
    _same_state(first.trainer.pmodel, second.trainer.pmodel)
    _same_state(first.trainer.steps.hyper, second.trainer.steps.hyper)


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("stop_at", [8, 16], ids=["in the population", "in fine-tuning"])
def test_a_resumed_population_finishes_as_an_uninterrupted_one(tmp_path: Path, stop_at: int) -> None:
    """A population stopped at a comparison (8) or in its fine-tuning (16) and resumed from its ``resume/`` ends with
    the result, comparisons, model and ranges of the one that ran through; the trackers' rows after the checkpoint
    are logged once."""
    data = _data()
    settings = {"population": 3, "population_interval": 4, "eval_every": 4, **RUN}
    pmodel, hyper = _start()
    through = fit(pmodel, data, hyper=hyper, checkpoint_dir=tmp_path / "through", **settings)

    def crash(trainer, record) -> None:
        if record["step"] == stop_at:
            raise Interrupted

    stopped_model, stopped_hyper = _start()
    tracked = CSVTracker(tmp_path / "csv")
    with pytest.raises(Interrupted):
        fit(stopped_model, data, hyper=stopped_hyper, checkpoint_dir=tmp_path / "run", callbacks=[crash], **settings)
    resume = tmp_path / "run" / "resume"
    assert (resume / POPULATION_FILE).is_file() == (stop_at < PARTITIONED_END)
    resumed_model, resumed_hyper = _start()
    tracked = CSVTracker(tmp_path / "csv")
    resumed = fit(
        resumed_model, data, hyper=resumed_hyper, checkpoint_dir=tmp_path / "run", resume=resume, hooks=[tracked],
        **settings,
    )  # fmt: skip
    tracked.close()
    _same_result(resumed, through)
    _same_state(resumed_model, pmodel)
    _same_state(resumed_hyper, hyper)
    if stop_at < PARTITIONED_END:
        rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
        assert any("population/2/conditional_lml" in row for row in rows)


def test_a_callback_that_stops_a_population_ends_the_run_at_that_comparison() -> None:
    """As a single run's, a stop ends the run where it is asked for, with no fine-tuning: at the second comparison,
    the fittest member's state there, its ranges the comparison's."""
    pmodel, hyper = _start()
    seen = []

    def stop(trainer, record) -> bool:
        seen.append(record["step"])
        return record["step"] == 8

    result = fit(pmodel, _data(), hyper=hyper, population=3, population_interval=4, callbacks=[stop], **RUN)
    assert seen == [4, 8] and result.steps == 8 and result.stopped_early and result.finetune_start is None
    last = result.population["rounds"][-1]
    fittest = max(range(3), key=lambda i: last["fitness"][i])
    assert result.hyperparameters == last["ranges"][fittest] and result.conditional_lml == last["fitness"][fittest]


@settings(max_examples=60, deadline=None)
@given(
    ranges=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    delta=st.floats(0.01, 2.0),
    floor=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_explore_moves_every_range_by_its_rule(ranges: list[float], delta: float, floor: float, seed: int) -> None:
    """Each range, as a share of its bound, becomes max(range, floor) times e^(+-delta), the signs drawn in order
    from the generator, and never passes its bound."""
    names = ("rotation", "scale", "shear", "translation_x")[: len(ranges)]
    hyper = AffineAugmentation(generators=names)
    bounds = [hyper.max_range[name] for name in names]
    with torch.no_grad():
        hyper.ranges.copy_(torch.tensor([r * b for r, b in zip(ranges, bounds)]))
    before = hyper.ranges.detach().clone()
    explore(hyper, delta, floor, torch.Generator().manual_seed(seed))
    signs = torch.randint(0, 2, (len(names),), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    after = hyper.ranges.detach()
    for i, bound in enumerate(bounds):
        start = max(abs(float(before[i])), floor * bound)
        expected = min(start * math.exp(float(signs[i]) * delta), bound)
        assert float(after[i]) == pytest.approx(expected, rel=1e-6, abs=1e-7)
        assert 0 <= float(after[i]) <= bound * (1 + 1e-6)


def test_a_population_without_learned_ranges_is_refused() -> None:
    pmodel, _ = _start()
    run = {k: v for k, v in RUN.items() if k != "hyper_samples"}
    with pytest.raises(PartitionArgumentError, match="learns none: pass hyper=AffineAugmentation"):
        fit(pmodel, _data(), population=2, **run)
    fixed = AffineAugmentation.fixed({"rotation": 1.0}, num_samples=2)
    with pytest.raises(PartitionArgumentError, match="learns none"):
        fit(pmodel, _data(), hyper=fixed, population=2, **run)


def test_patience_with_a_population_is_refused() -> None:
    pmodel, hyper = _start()
    with pytest.raises(PartitionArgumentError, match="patience must be None with population >= 2"):
        fit(pmodel, _data(), hyper=hyper, population=2, patience=2, **RUN)


@pytest.mark.parametrize("keyword", ["population_interval", "population_exploit", "population_delta"])
def test_a_populations_setting_without_a_population_is_refused(keyword: str) -> None:
    """A population's comparison settings do nothing in a single run: refused by name, not silently ignored."""
    value = {"population_interval": 5, "population_exploit": 0.25, "population_delta": 0.3}[keyword]
    with pytest.raises(PartitionArgumentError, match=f"{keyword} sets a population's comparisons.*population=N"):
        TrainConfig.recommended(**{keyword: value})
    assert TrainConfig.recommended(population=2, **{keyword: value}).population.members == 2


def test_a_resume_directory_of_another_population_is_refused(tmp_path: Path) -> None:
    data = _data()

    def crash(trainer, record) -> None:
        if record["step"] == 4:
            raise Interrupted

    pmodel, hyper = _start()
    settings = {"population_interval": 4, "checkpoint_dir": tmp_path, **RUN}
    with pytest.raises(Interrupted):
        fit(pmodel, data, hyper=hyper, population=3, callbacks=[crash], **settings)
    pmodel, hyper = _start()
    single = {key: value for key, value in settings.items() if key != "population_interval"}  # a single run's
    with pytest.raises(PartitionArgumentError, match="population of 3: resume it with population=3"):
        fit(pmodel, data, hyper=hyper, resume=tmp_path / "resume", **single)
    with pytest.raises(PartitionCheckpointError, match="holds a population of 3, this run has population=2"):
        fit(pmodel, data, hyper=hyper, population=2, resume=tmp_path / "resume", **settings)


def test_the_lightning_module_refuses_a_population() -> None:
    pytest.importorskip("lightning")
    from partition_fx.integrations.lightning import PartitionedLightningModule
    from partition_fx.job.train_config import TrainConfig

    pmodel, hyper = _start()
    with pytest.raises(PartitionArgumentError, match="train a population with fit"):
        PartitionedLightningModule(pmodel, _data(), hyper=hyper, config=TrainConfig.recommended(population=2))


def test_the_command_trains_a_population_and_reports_it(tmp_path: Path) -> None:
    """``partition-fx train --population 2``: the plan says so, the report holds the comparisons, and the final
    model's ranges are the last comparison's fittest."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "partition_fx.cli", "train", "--model", "fixup_resnet8", "--image-size", "8",
               "--steps", "20", "--batch-size", "16", "--population", "2", "--population-interval", "6",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "12 partitioned by a population of 2 (compared every 6)" in done.stderr
    report = json.loads((out / "report.json").read_text())
    population = report["population"]
    assert [r["step"] for r in population["rounds"]] == [6, 12] and population["members"] == 2
    last = population["rounds"][-1]
    fittest = max(range(2), key=lambda i: last["fitness"][i])
    assert report["hyperparameters"] == last["ranges"][fittest]
    assert report["config"]["train"]["population"]["members"] == 2
    refused = subprocess.run([*command[:-2], "--augment", "none", "--out", str(tmp_path / "none")],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode != 0
    assert "--population 2 compares runs and moves their learned ranges, and --augment none leaves none to learn" in (
        refused.stderr
    )


class BrightnessJitter(HyperparameterModule):
    """A user's own input transform with a learned range (not the package's): a brightness shift of each image
    drawn from U[-r, r], r learned within [0, 1]; it has the attributes of ``LearnedRanges``."""

    generators = ("brightness",)
    max_range = {"brightness": 1.0}

    def __init__(self, init: float = 0.3) -> None:
        super().__init__()
        self.ranges = nn.Parameter(torch.tensor([init]))

    @property
    def is_fixed(self) -> bool:
        return not self.ranges.requires_grad

    def range_values(self) -> dict[str, float]:
        return {"brightness": abs(float(self.ranges.detach()[0]))}

    def hyperparameters(self) -> dict[str, float | list[float]]:
        return {**self.range_values()}

    def constrain_(self) -> None:
        with torch.no_grad():
            self.ranges.clamp_(0.0, 1.0)

    def forward(self, x: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
        if not self.training:
            return x
        views = x.repeat(num_samples or 1, 1, 1, 1)  # [S * B, ...], sample major
        eps = torch.rand(views.shape[0], 1, 1, 1, device=x.device) * 2 - 1
        return views + eps * self.ranges[0]


def test_a_population_moves_the_learned_ranges_of_a_users_own_transform() -> None:
    """The population asks the input transform for the ``LearnedRanges`` protocol, not for the package's class: a
    module of the user's own with those attributes is explored and trained like an ``AffineAugmentation``."""
    assert isinstance(BrightnessJitter(), LearnedRanges)
    hyper = BrightnessJitter()
    moved = copy.deepcopy(hyper)
    explore(moved, 0.5, 0.05, torch.Generator().manual_seed(0))
    assert moved.range_values()["brightness"] in (pytest.approx(0.3 * math.e**0.5), pytest.approx(0.3 * math.e**-0.5))
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    pmodel = partitionify(model, 2, (0.6, 0.4), seed=SEED)
    result = fit(pmodel, _data(), hyper=hyper, population=2, population_interval=4, **RUN)
    assert result.population is not None and set(result.hyperparameters) == {"brightness"}
    assert 0.0 <= result.hyperparameters["brightness"] <= 1.0
