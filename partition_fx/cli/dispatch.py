"""``partition-fx``'s entry point: parse, run the command, print its summary, and report every refusal as one
line on stderr with exit status 2 (130 when interrupted); a ``PartitionWarning`` (a checkpoint's classifier not
loaded, say) is one ``partition-fx: warning:`` line on stderr.

The commands (and with them torch) are imported only once the arguments are parsed: ``--help`` and argument
errors answer without them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import PartitionError, PartitionWarning, first_line, is_out_of_memory
from .checks import check_arguments
from .parser import build_parser

OUT_OF_MEMORY_HINTS = {
    "train": "lower --image-size, --batch-size or --samples, or choose a smaller --model",
    "convert": "lower --input-size or --num-classes, or choose a smaller --model",
    "describe": "lower --num-classes or choose a smaller --model",
    "export": "export on a machine with more memory",
    "federated": "lower --image-size or --clients",
    "predict": "predict on a machine with more memory",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``partition-fx ARGV`` (default: ``sys.argv[1:]``); returns the exit status.

    >>> main(["convert", "--model", "no_such_net", "--out", "never"])
    2
    """
    args = build_parser().parse_args(None if argv is None else list(argv))
    try:
        check_arguments(args)  # before torch is imported: a refused value answers at once
        with warnings.catch_warnings(), _terminate_as_interrupt():
            warnings.showwarning = _show_warning(warnings.showwarning)
            _run(args)
    except KeyboardInterrupt as e:
        how = " by SIGTERM" if isinstance(e, Terminated) else ""
        print(f"partition-fx: interrupted{how}{_how_to_continue(args)}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
    except (PartitionError, NotImplementedError) as e:
        print(f"partition-fx: error: {e}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        print(
            f"partition-fx: error: out of memory ({first_line(e)}); {OUT_OF_MEMORY_HINTS[args.command]}",
            file=sys.stderr,
        )
        return 2
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``kill``, ``timeout``, Slurm and Kubernetes send to stop a job), raised where the command is, so
    that it ends as an interrupt does: the last checkpoint kept, the report ``interrupted``, the way to continue
    printed."""


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in this process while the command runs (a worker process forked
    meanwhile ends as SIGTERM asks); the previous handler comes back after. Only the main thread can set one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    command = os.getpid()

    def terminate(signum: int, frame: Any) -> None:
        if os.getpid() != command:  # a forked worker inherited the handler: end it the default way
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _how_to_continue(args: Any) -> str:
    """For an interrupted ``train``, what its report says can be done next: resume from its last evaluation,
    export a run whose training had finished, or run again when nothing was saved.

    >>> import argparse, tempfile
    >>> _how_to_continue(argparse.Namespace(command="train", resume=None, out=Path(tempfile.mkdtemp())))
    '; it stopped before anything was saved: run it again'
    """
    if args.command != "train":
        return ""
    run = args.resume if args.resume is not None else args.out
    try:
        report = json.loads((Path(run) / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        report = None
    if not isinstance(report, dict) or report.get("status") != "interrupted":  # not this run's report
        return "; it stopped before anything was saved: run it again"
    try:  # the run's iterations, as its configuration records them (a JobSpec's to_dict)
        steps = report["config"]["train"]["optimization"]["steps"]
    except (KeyError, TypeError):
        steps = None
    step = report.get("last_checkpoint_step")
    if step is None:
        return "; it stopped before its first evaluation, so there is nothing to resume: run it again (--overwrite)"
    if step == steps:
        return f"; its training had finished: `partition-fx export --run {run}` writes its model"
    return f"; the last checkpoint and report.json are kept: continue with `partition-fx train --resume {run}`"


def _show_warning(show: Any) -> Any:
    """``warnings.showwarning`` printing a :class:`PartitionWarning` as one line; other warnings as ``show`` does."""

    def show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None):
        if issubclass(category, PartitionWarning):
            print(f"partition-fx: warning: {message}", file=sys.stderr if file is None else file)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def _run(args: Any) -> None:
    """Run the parsed command and print its summary (its module imported now: torch comes with it)."""
    if args.command == "describe":
        from .convert import run_describe

        print(run_describe(args))
    elif args.command == "train" and args.print_config:  # the job, as --config reads it; nothing trained
        from ..models import check_model_name
        from .config_files import config_text
        from .runs import job_spec, resumed_spec

        spec = resumed_spec(args)[0] if args.resume is not None else job_spec(args)
        check_model_name(spec.model)  # a job that training would refuse is not printed as one
        print(config_text(spec), end="")
    elif args.command == "train":
        from .train import run_train

        report = run_train(args)
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the launch
            _print_train(report, args.resume if args.resume is not None else args.out)
    elif args.command == "federated" and args.print_config:  # the run, as --config reads it; nothing trained
        from .checks import check_federated_options, federated_config
        from .config_files import federated_config_text

        print(federated_config_text(federated_config(args, check_federated_options(args))), end="")
    elif args.command == "federated":
        from .federated import run_federated_command

        _print_federated(run_federated_command(args), args.out)
    elif args.command == "export":
        from .export import export_directory, run_export

        _print_export(run_export(args), export_directory(args))
    elif args.command == "predict":
        from .predict import prediction_lines, run_predict, unlike_lines

        predictor, predictions = run_predict(args)
        print(f"partition-fx: predicting with {predictor}", file=sys.stderr)
        for line in unlike_lines(predictions):  # a warning, never a change of the answer
            print(f"partition-fx: warning: {line}", file=sys.stderr)
        print(json.dumps(predictions, indent=2) if args.json else "\n".join(prediction_lines(predictions)))
    else:
        from .convert import run_convert

        _print_convert(run_convert(args), args.out)


def _print_train(report: dict[str, Any], out: Path) -> None:
    hyper = report["hyperparameters"]
    learned = ", ".join(f"{k}={v:.3f}" for k, v in hyper.items() if isinstance(v, float)) or "none"
    print(
        f"trained {report['config']['model']} on {report['data']['name']} for {report['steps']} iterations in "
        f"{report['seconds']:.0f}s: {_accuracy(report, report['config'])}"
    )
    print(_evidence(report))
    how = "fixed" if report["config"]["fix"] is not None else "learned"  # --fix, --fix-from: nothing learned
    print(f"{how} hyperparameters (ranges; rotation in radians): {learned}")
    logged = ", ".join(report["files"].get("trackers", []))  # what --log wrote under the run
    print(
        f"wrote {out}/: report.json, lml.png, hyperparameters.png, model.safetensors, model.onnx, checkpoint/"
        + (f", {logged}" if logged else "")
    )


def _evidence(report: dict[str, Any]) -> str:
    """The run's evidence, the conditional LML (``training.lml.evidence``; ``report.json``'s ``lml_explained`` says
    more), or, with one partition, that there is none (``training.lml.NO_EVIDENCE``).

    >>> print(_evidence({"conditional_lml": -29.3, "conditional_lml_per_example": -0.081, "lml": -2772.1,
    ...                  "lml_per_chunk": [-2742.8, -15.0, -14.3]}))
    evidence: conditional LML -29.3 nats (-0.081/example): chunks 2..3, each scored by a subnetwork not trained on it
    full LML -2772.1 nats, of which -2742.8 is chunk 1 scored by the untrained defaults (see report.json)
    >>> print(_evidence({"conditional_lml": None, "lml": -2742.8}))
    no evidence with one partition: its LML scores chunk 1 by the untrained defaults, which says nothing about ...
    """
    from ..training.lml import NO_EVIDENCE, evidence

    score = evidence(report)
    if score is None:
        return NO_EVIDENCE
    return (
        f"evidence: conditional LML {score:.1f} nats "
        f"({report['conditional_lml_per_example']:.3f}/example): chunks 2..{len(report['lml_per_chunk'])}, each "
        f"scored by a subnetwork not trained on it\nfull LML {report['lml']:.1f} nats, of which "
        f"{report['lml_per_chunk'][0]:.1f} is chunk 1 scored by the untrained defaults (see report.json)"
    )


def _print_export(summary: dict[str, Any], out: Path) -> None:
    print(
        f"exported subnetwork {summary['subnetwork']} of {summary['run']} (step {summary['checkpoint_step']}): "
        f"{_accuracy(summary, summary)}"
    )
    averaged = " (averaged)" if summary["averaged_test_accuracy"] is not None else ""
    print(f"wrote {out}/: model.safetensors, model.onnx{averaged}, export.json")


def _accuracy(scores: dict[str, Any], options: dict[str, Any]) -> str:
    """The test accuracy as a summary line says it: averaged over the learned augmentation first, where there
    is such a score (the predictor the LML scores, as the paper reports it), then the plain one.

    >>> _accuracy({"test_accuracy": 0.9651, "averaged_test_accuracy": 0.97123}, {"test_time_samples": 8})
    'test accuracy 0.9712 averaged over 8 transforms of the augmentation, 0.9651 plain'
    >>> _accuracy({"test_accuracy": 0.9651, "averaged_test_accuracy": None}, {"test_time_samples": 8})
    'test accuracy 0.9651'
    """
    if scores.get("averaged_test_accuracy") is None:
        return f"test accuracy {scores['test_accuracy']:.4f}"
    return (
        f"test accuracy {scores['averaged_test_accuracy']:.4f} averaged over {options['test_time_samples']} "
        f"transforms of the augmentation, {scores['test_accuracy']:.4f} plain"
    )


def _print_convert(report: dict[str, Any], out: Path) -> None:
    diffs = report["max_relative_difference_to_original"]
    print(
        f"converted {report['model']} ({report['original_parameters']:,} parameters) into "
        f"{report['num_partitions']} partitions {report['trainable_entries_per_partition']} "
        f"in {report['conversion_seconds']:.2f}s"
    )
    print(
        f"subnetworks 0..{report['num_partitions']} vs original on digits: max relative difference "
        f"{max(diffs.values()):.1e}"
    )
    print(f"wrote {out}/: model.safetensors, model.onnx (checked in onnxruntime), describe.txt, report.json")


def _print_federated(report: dict[str, Any], out: Path) -> None:
    base, last = report["baseline"], report["last_evaluations"]
    print(
        f"federated, {report['rounds']} rounds: test accuracy {report['test_accuracy_averaged']:.4f} averaged over "
        f"{report['config']['test-samples']} augmentations, {report['test_accuracy']:.4f} without (FedAdam baseline "
        f"{base['test_accuracy']:.4f}); mean of the last {last} evaluations "
        f"{report['mean_last_accuracy_averaged']:.4f} (baseline {base['mean_last_accuracy_averaged']:.4f})"
    )
    print(
        f"upload {report['bytes_up'] / 1e6:.1f} MB = {100 * report['upload_share']:.0f}% of the baseline's, traffic "
        f"{100 * report['traffic_share']:.0f}%; {report['seconds_per_round']:.2f} s per round"
    )
    learned = ", ".join(f"{k}={v:.3f}" for k, v in report["hyperparameters"].items() if isinstance(v, float)) or "none"
    print(f"learned hyperparameters (augmentation ranges, rotation in radians; dropout rates): {learned}")
    print(f"wrote {out}/: report.json, history.json, curves.png, model.safetensors")
