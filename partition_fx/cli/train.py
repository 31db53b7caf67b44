"""``partition-fx train``: the main job.

It builds a timm or torchvision model (the shipped FixUp/WRN included), converts it, learns its hyperparameters
with ``fit`` and writes to ``--out``:

* ``report.json``: ``status``, ``test_accuracy`` and ``test_log_likelihood`` of the exported final
  model (fine-tuned for the last ``--finetune-steps``), ``partitioned_test_accuracy`` (its final subnetwork
  before fine-tuning), ``highest_lml_state`` (the partitioned state with the highest conditional LML, as
  ``export --which best`` exports it: its step, score and test accuracy; never the fine-tuned model),
  ``conditional_lml`` (the evidence) and the full ``lml``, both explained under ``lml_explained``,
  ``hyperparameters`` (``rotation`` etc. in radians), ``history`` (both phases), ``config`` and the ``device`` it
  ran on;
* ``lml.png`` (LML and loss curves) and ``hyperparameters.png`` (trajectories);
* ``model.safetensors`` (the exported plain model) and ``model.onnx`` (checked in onnxruntime; input ``images``,
  output ``logits``), with what using them needs in ``report.json`` and the ONNX file's metadata: ``classes``,
  ``preprocessing``, ``architecture``, ``onnx_names`` (``job.build.model_record``; ``partition-fx predict``);
* ``checkpoint/last.safetensors`` and ``checkpoint/best.safetensors`` (partitioned model and hyperparameters).

Everything is validated before ``--out`` is touched. During training, the checkpoint and a report with
``"status": "running"`` are replaced atomically at each evaluation, so an interrupted or failed run keeps
its last checkpoint and a readable report (``"interrupted"`` / ``"failed"`` with the error). Under
``torchrun --nproc_per_node=N`` every process trains on its share of each minibatch and rank 0 alone writes
(``cli.launch``).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from safetensors.torch import save_model

from .._io import remove_directory, replace_file, write_json
from ..choices import RunStatus
from ..errors import PartitionCheckpointError
from ..export import export_subnetwork
from ..job.build import TrainJob, build_job, initial_hyperparameters, model_record, resolve_device, write_onnx
from ..job.checks import with_fixed_ranges
from ..job.records import read_run, starting_report
from ..job.spec import JobSpec
from ..models import check_model_name
from ..training import (
    FitResult,
    PartitionedTrainer,
    Schedule,
    TrainingHook,
    fit,
    recalibrate_norm_statistics,
    resume_directory,
)
from ..training.objective.lml import EvaluationRecord, load_for_export
from ..training.tracking import check_trackers, tracker_files, trackers_for
from .commands.train import RunOptions, TrainRequest, job_spec
from .config_files import config_text
from .launch import barrier, processes, torchrun_group
from .parser import parse_train
from .plots import plot_curves, plot_hyperparameters
from .runs import CHECKPOINT_STATES, check_out, prepare_out


def train_spec(argv: Sequence[str]) -> JobSpec:
    """The job ``partition-fx train ARGV`` asks for (``argv`` without the word ``train``), with the command's own
    defaults, before anything is loaded or built: as its report records it, but for ``proportions``, which the
    report records as the model was partitioned (None here when ``--proportions`` is not given).

    >>> spec = train_spec(["--data", "digits", "--steps", "40"])
    >>> spec.data, spec.train.optimization.steps, spec.proportions
    ('digits', 40, None)
    """
    return job_spec(parse_train(list(argv)))


def train_job(argv: Sequence[str]) -> TrainJob:
    """The job ``partition-fx train ARGV`` would run (``argv`` without the word ``train``), with the command's
    own defaults and checks; nothing is trained or written.

    >>> job = train_job(["--model", "fixup_resnet8", "--image-size", "12", "--data", "digits"])
    >>> job.config.optimization.steps, job.data.name, job.pmodel.num_partitions, type(job.hyper).__name__
    (400, 'digits', 3, 'AffineAugmentation')
    """
    return build_job(train_spec(argv))


LML_EXPLAINED = {
    "conditional_lml": "the evidence to compare hyperparameters and models by (nats, higher is better): "
    "log p(D_2..D_C | D_1, psi), the sum over chunks k = 2..C of chunk k scored by subnetwork k-1, which "
    "trained on chunks 1..k-1 only. Partitioned training climbs it; the best state is chosen by it",
    "lml": "the full partitioned LML: conditional_lml plus chunk 1 scored by subnetwork 0, the untrained "
    "defaults. That term is near -log(classes) per example whatever was learned, and dominates the sum, so "
    "the full LML ranks models by their untrained output; it bounds log p(D | psi) from below (appendix A)",
    "lml_per_chunk": "chunk k's term log p(D_k | D_1..D_k-1, psi), k = 1..C (the first is the untrained one)",
    "per_example": "each LML divided by the examples it scores (chunks 2..C for the conditional one), "
    "comparable with the training loss in nats",
    "lml_step": "the iteration of the estimate: the last one of partitioned training (fine-tuning trains "
    "every weight on every chunk, so no subnetwork is left unseen by a chunk and no LML is estimated)",
}
"""How ``report.json`` explains its LML fields (written into every report, as ``lml_explained``)."""

TEST_METRICS = (
    "test_accuracy",
    "averaged_test_accuracy",
    "test_log_likelihood",
    "averaged_test_log_likelihood",
    "partitioned_test_accuracy",
)
"""What the trackers of ``--log`` get of the exported model's test results, at the run's last step."""

FILES: dict[str, Any] = {  # a file's name, or a list of names
    "model": "model.safetensors",
    "onnx": "model.onnx",
    "plots": ["lml.png", "hyperparameters.png"],
    "checkpoints": ["checkpoint/last.safetensors", "checkpoint/best.safetensors"],
}


def run_train(request: TrainRequest) -> dict[str, Any] | str:
    """The ``train`` command (its ``request``: ``cli.commands.train``); returns the final report (also written to
    ``--out/report.json``), or, with ``print_config``, the job as the YAML ``--config`` reads (nothing trained).

    A ``resume`` request continues the run in ``out`` from its last evaluation, with the run's configuration, bit
    for bit as if it had not stopped (CPU).

    >>> import tempfile
    >>> from partition_fx.cli.parser import build_parser
    >>> from partition_fx.cli.commands import commands
    >>> out = Path(tempfile.mkdtemp()) / "run"
    >>> argv = ["--model", "fixup_resnet8", "--image-size", "8", "--steps", "2", "--batch-size", "4", "--quiet"]
    >>> request = commands()["train"].options(build_parser().parse_args(["train", *argv, "--out", str(out)]))
    >>> report = run_train(request)
    >>> report["status"], report["steps"], sorted(p.name for p in out.iterdir())[:2]
    ('completed', 2, ['checkpoint', 'hyperparameters.png'])
    """
    if request.print_config:
        check_model_name(request.spec.model)  # a job that training would refuse is not printed as one
        return config_text(request.spec)
    spec = with_fixed_ranges(request.spec)  # the report records the values --fix-from read
    with torchrun_group(resolve_device(spec.device)) as rank:
        return _run(spec, request.run, writes=rank in (None, 0), rank=rank)


def _run(spec: JobSpec, options: RunOptions, writes: bool, rank: int | None) -> dict[str, Any]:
    """``run_train`` in one process of the launch: every process trains, the one that ``writes`` writes."""
    out = options.out
    resume_from = out / "checkpoint" / "resume" if options.resume else None
    inputs = {"--data": spec.data, "--checkpoint": spec.checkpoint}
    check_trackers(options.log)  # a missing extra or a store MLflow refuses: refused now, before anything is written
    if resume_from is None:
        check_out(out, options.overwrite, inputs)  # now, not after minutes of loading
    barrier(rank)  # every process has checked --out before rank 0 empties it
    job = build_job(spec)  # the job it trains (a default batch size may fit a small data set)
    if writes and not options.quiet:  # said before the first evaluation, which may be a minute away
        print(f"partition-fx: {plan_text(job, resumed=resume_from is not None)}", file=sys.stderr, flush=True)
    if resume_from is None and writes:
        prepare_out(out, options.overwrite, inputs)
    elif resume_from is not None and not resume_directory(resume_from).is_dir():  # as the trainer will find it
        raise PartitionCheckpointError(
            f"--resume {str(out)!r}: no checkpoint/resume/ there (the run stopped before its first evaluation, or "
            "completed without --keep-resume); train it again"
        )
    barrier(rank)
    starting = starting_report(job.spec, job.data, job.device, options.keep_resume, options.log)
    report = RunReport(out / "report.json", starting, writes)
    fields = report.fields
    fields["processes"] = processes(rank)
    initial = fields["initial_hyperparameters"] = initial_hyperparameters(job.hyper)  # also the plots' iteration 0
    # the trackers start with the run (a resumed run's continue where its last checkpoint was) and log the job's
    # fields as parameters (the training configuration is the trainer's own); only the process that writes logs
    job_fields = {key: value for key, value in job.spec.to_dict().items() if key != "train"}  # as the report's
    trackers = trackers_for(list(options.log), out, {"job": job_fields}) if writes else []
    if resume_from is None:
        report.begin()
    else:  # the run's record so far stays as it is until the resumed run is under way
        report.carry(read_run(out, "--resume")[0])
    started = time.perf_counter()
    try:  # training and what follows it: a failure in either is recorded, and the report says how far it got
        partitioned = PartitionedAccuracy(job)
        result = _fit(job, out, resume_from, (partitioned, report, *trackers), options.quiet)
        fields.update(_results(job, result, partitioned))
        test = {key: fields[key] for key in TEST_METRICS if fields.get(key) is not None}
        for tracker in trackers:
            tracker.log_metrics(result.steps, test)
        best = out / "checkpoint" / "best.safetensors" if writes else None
        fields["highest_lml_state"] = highest_lml_state(job, result, best)
        if writes:
            _write_files(job, result, out, initial, fields)
    except BaseException as e:
        report.end(e, seconds=round(time.perf_counter() - started, 1))
        for tracker in trackers:
            tracker.close(RunStatus.of(e))
        raise
    for tracker in trackers:
        tracker.close(RunStatus.COMPLETED)
    kept = {"resume": "checkpoint/resume/"} if options.keep_resume else {}
    logged = {"trackers": tracker_files(options.log, out)} if options.log else {}
    fields.update(
        status=RunStatus.COMPLETED.value,
        seconds=round(time.perf_counter() - started, 1),
        files={**FILES, **kept, **logged},
    )
    report.save()
    if writes and not options.keep_resume:  # a completed run cannot be resumed: its optimiser state is dead weight
        remove_directory(out / "checkpoint" / "resume")
    barrier(rank)  # the others return once rank 0's files are complete
    return fields


class RunReport(TrainingHook):
    """``report.json`` of a training run as it goes: its ``fields``, written (by the process that ``writes``) when
    the run starts, after each evaluation's checkpoint, and at its end. A resumed run writes nothing until it is
    under way (:meth:`before_run`, after its state loaded), so a refused resume leaves the report as it was."""

    CARRIED = ("history", "hyperparameters", "conditional_lml", "lml", "last_checkpoint_step")
    """What a resumed run's report keeps of the report it continues, until its own evaluations replace them."""

    def __init__(self, path: Path, fields: dict[str, Any], writes: bool) -> None:
        self.path, self.fields, self.writes, self.under_way = path, fields, writes, False

    def carry(self, previous: dict[str, Any]) -> None:
        """Continue ``previous``, the report of the run being resumed."""
        self.fields.update({key: previous[key] for key in self.CARRIED if key in previous})

    def begin(self) -> None:
        self.under_way = True
        self.save()

    def save(self) -> None:
        if self.writes and self.under_way:
            write_json(self.path, self.fields)

    def before_run(self, trainer: PartitionedTrainer) -> None:
        if not self.under_way:  # a resumed run: its state loaded, the history restored
            self.fields["history"] = trainer.history
            self.begin()

    def after_checkpoint(self, trainer: PartitionedTrainer, record: EvaluationRecord) -> None:
        """The run's callback: after each evaluation, once the trainer's hooks wrote its checkpoint."""
        self.fields.update(history=trainer.history, hyperparameters=record["hyperparameters"])
        if record["lml"] is not None:  # fine-tuning estimates none; the report keeps partitioned training's last
            self.fields.update(conditional_lml=record["conditional_lml"], lml=record["lml"])
        self.fields["last_checkpoint_step"] = record["step"]
        self.save()

    def end(self, error: BaseException, seconds: float) -> None:
        """The run ended with ``error``: recorded if the run was under way; otherwise nothing is written."""
        status = RunStatus.of(error)
        self.fields.update(status=status.value, seconds=seconds)
        if status is RunStatus.FAILED:
            self.fields["error"] = str(error)
        self.save()


def plan_text(job: TrainJob, resumed: bool = False) -> str:
    """What a run is about to do, in one line: the model, the data's sizes (and the files of an image folder that
    were skipped, not being images), the steps of each phase and how often progress is said.

    >>> from partition_fx.job.build import build_job
    >>> from partition_fx.job.spec import JobSpec
    >>> print(plan_text(build_job(JobSpec.from_keywords(model="fixup_resnet8", image_size=8, steps=20))))
    train fixup_resnet8 on rotdigits (1438 training images, 359 test) for 20 steps: 12 partitioned, then 8 ...
    """
    config, data = job.config, job.data
    schedule = Schedule.configured(config)
    steps, switch = schedule.end, schedule.finetune_from
    finetune = steps - switch if switch is not None else 0
    phases = f"{switch} partitioned, then {finetune} fine-tuning" if switch is not None else "all partitioned"
    population = config.population
    if population.members > 1:
        phases = phases.replace(
            "partitioned",
            f"partitioned by a population of {population.members} (compared every {population.interval})",
            1,
        )
    if job.pmodel.num_partitions == 1:
        phases = "one partition: plain training" + (f", the last {finetune} fine-tuning" if finetune else "")
    line = (
        f"{'resume' if resumed else 'train'} {job.spec.model} on {data.name} ({len(data.train)} training images, "
        f"{len(data.test)} test) for {steps} steps: {phases}; evaluated every {schedule.eval_every} steps"
    )
    skipped = data.info.get("skipped_files") or []
    if skipped:
        from ..datasets.folder import describe_skipped

        line += f"; skipped {describe_skipped(skipped)}"
    return line


def _fit(job: TrainJob, out: Path, resume_from: Path | None, hooks: tuple[TrainingHook, ...], quiet: bool) -> FitResult:
    report = next(hook for hook in hooks if isinstance(hook, RunReport))
    return fit(
        job.pmodel,
        job.data.train,
        job.config,  # without the defaults in checkpoints: export and --resume rebuild the model as this run did
        hyper=job.hyper,
        callbacks=[report.after_checkpoint],  # after the trainer's hooks, which write the checkpoint
        checkpoint_dir=out / "checkpoint",
        progress=False if quiet else None,
        device=job.device,
        resume=resume_from,
        record_run=False,  # report.json records the run
        hooks=hooks,
    )


class PartitionedAccuracy(TrainingHook):
    """When fine-tuning begins, the test :attr:`accuracy` of the partitioned model's final subnetwork as it stands
    (its BatchNorm statistics recalibrated on a copy, as at the end of a run). It is the hook's state, so it
    reaches the resume directory with the run's next checkpoint; a run resumed from before that repeats this
    hook for the same weights."""

    def __init__(self, job: TrainJob) -> None:
        self.job = job
        self.accuracy: float | None = None

    def before_finetuning(self, trainer: PartitionedTrainer) -> None:
        pmodel = copy.deepcopy(trainer.pmodel)
        batch_size = trainer.config.evaluation.batch_size
        recalibrate_norm_statistics(pmodel, trainer.examples, batch_size=batch_size, device=trainer.steps.device)
        self.accuracy, _ = self.job.test_scores(export_subnetwork(pmodel.cpu()).eval())

    def state_dict(self) -> dict[str, Any]:
        return {} if self.accuracy is None else {"accuracy": self.accuracy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accuracy = state["accuracy"]


def _results(job: TrainJob, result: FitResult, partitioned: PartitionedAccuracy) -> dict[str, Any]:
    """The report's results: the exported final model's test scores (and, from ``partitioned``, its final
    subnetwork's before fine-tuning: the same model when the run did not fine-tune) and the run's history."""
    exported = export_subnetwork(job.pmodel.cpu()).eval()
    accuracy, loglik = job.test_scores(exported)
    averaged, averaged_loglik = job.averaged_test_scores(exported, job.spec.test_time_samples)
    scored = next(r for r in reversed(result.history) if r["lml"] is not None)  # the last LML estimate
    return {
        "test_accuracy": accuracy,
        "test_log_likelihood": loglik,
        "averaged_test_accuracy": averaged,
        "averaged_test_log_likelihood": averaged_loglik,
        "partitioned_test_accuracy": accuracy if result.finetune_start is None else partitioned.accuracy,
        "finetune_start": result.finetune_start,
        "conditional_lml": scored["conditional_lml"],
        "conditional_lml_per_example": scored["conditional_lml_per_example"],
        "lml": scored["lml"],
        "lml_per_example": scored["lml_per_example"],
        "lml_per_chunk": scored["lml_per_chunk"],
        "lml_step": scored["step"],
        "lml_explained": LML_EXPLAINED,
        "hyperparameters": result.hyperparameters,
        "history": result.history,
        "chunk_sizes": result.chunk_sizes,
        "steps": result.steps,
        # a population's comparisons (training.loop.population), only where one ran
        **({"population": result.population} if result.population is not None else {}),
        **model_record(job),  # the classes, preprocessing and architecture of model.safetensors and model.onnx
    }


def highest_lml_state(job: TrainJob, result: FitResult, checkpoint: Path | None) -> dict[str, Any]:
    """The report's account of the state with the highest conditional LML: its step, score and, given its
    ``checkpoint`` (the run's ``best.safetensors``, its BatchNorm statistics recalibrated for the final
    subnetwork at the end of the run), its test accuracy as ``export --which best`` reports it, from the
    checkpoint loaded into a copy of the model and exported."""
    accuracy = None
    if checkpoint is not None:
        pmodel, hyper = copy.deepcopy(job.pmodel).cpu(), copy.deepcopy(job.hyper)
        load_for_export(pmodel, hyper, lambda: job.data.train, checkpoint, job.config)
        accuracy, _ = job.test_scores(export_subnetwork(pmodel).eval())
    return {
        "step": result.best_step,
        "conditional_lml": result.best_conditional_lml,
        "lml": result.best_lml,
        "test_accuracy": accuracy,
        # without fine-tuning, the final model is this state when it was the last one or was restored at the end
        "is_final_model": result.finetune_start is None
        and (result.best_step == result.steps or job.config.evaluation.restore_best),
        "explained": CHECKPOINT_STATES["best"],
    }


def _write_files(job: TrainJob, result: FitResult, out: Path, initial: dict[str, Any], record: dict[str, Any]) -> None:
    """The exported model, its ONNX twin (``record``: the report, whose ``model_record`` goes into its metadata) and
    the plots in ``out`` (``initial``: the hyperparameters before training, plotted at iteration 0)."""
    pmodel = job.pmodel.cpu()
    exported = export_subnetwork(pmodel).eval()
    replace_file(out / FILES["model"], lambda tmp: save_model(exported, str(tmp)))
    write_onnx(pmodel, out / FILES["onnx"], job, record)  # the report's classes, preprocessing, ... (model_record)
    plot_curves(result.history, out / "lml.png")
    bounds = job.hyper.max_range if job.hyper is not None else {}
    plot_hyperparameters(result.history, out / "hyperparameters.png", initial, bounds)
