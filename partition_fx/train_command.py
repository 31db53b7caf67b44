"""``partition-fx train`` and ``partition-fx export``: the main job, and re-exporting a trained run.

``train`` builds a timm model (the shipped FixUp/WRN included), converts it, learns its hyperparameters
with ``fit`` and writes to ``--out``:

* ``report.json``: ``status``, ``test_accuracy`` and ``test_log_likelihood`` of the exported final
  subnetwork, ``lml``, ``hyperparameters`` (``rotation`` etc. in radians), ``history`` and ``config``;
* ``lml.png`` (LML and loss curves) and ``hyperparameters.png`` (trajectories);
* ``model.safetensors`` (the exported plain model) and ``model.onnx`` (checked in onnxruntime);
* ``checkpoint/last.safetensors`` and ``checkpoint/best.safetensors`` (partitioned model and hyperparameters).

Everything is validated before ``--out`` is touched. During training, the checkpoint and a report with
``"status": "running"`` are replaced atomically at each evaluation, so an interrupted or failed run keeps
its last checkpoint and a readable report (``"interrupted"`` / ``"failed"`` with the error).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ._validation import check_num_partitions, check_proportions
from .errors import PartitionArgumentError, PartitionError, PartitionTypeError
from .training.metrics import evaluate_classifier

RUN_CONFIG_KEYS = (
    "model", "checkpoint", "data", "image_size", "channels", "augment", "samples", "partitions", "proportions",
    "scheme", "default", "assignments", "steps", "batch_size", "lr", "hyper_lr", "weight_decay", "hyper_every",
    "warmup_steps", "eval_every", "fused", "every_partition", "seed", "device",
)  # fmt: skip


# Options added after the first runs were written: what a run's report means when it lacks them.
LATER_OPTION_DEFAULTS = {"fused": False, "every_partition": False, "assignments": "stored"}

DIGITS_EXAMPLES = 1797  # scikit-learn's bundled digits: the images of --data digits and rotdigits


def _proportions_text(args: argparse.Namespace) -> str:
    """``--proportions`` as the user wrote it (comma-separated), for messages."""
    return ",".join(str(p) for p in args.proportions)


def partitionify_from_args(model: torch.nn.Module, args: argparse.Namespace):
    """``partitionify`` with the command line's conversion options."""
    from .rewrite import partitionify

    try:
        check_proportions(args.proportions, check_num_partitions(args.partitions))
    except (PartitionArgumentError, PartitionTypeError) as e:
        raise PartitionArgumentError(
            f"--partitions {args.partitions} --proportions {_proportions_text(args)}: {e}"
        ) from None
    return partitionify(
        model,
        args.partitions,
        args.proportions,
        scheme=args.scheme,
        default=args.default,
        seed=args.seed,
        assignments=args.assignments,
    )


def training_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The ``fit`` options that make up the command's optimisation: iterations, batches, Adam on the weights
    (cosine-annealed to lr/100) and on the hyperparameters, and the hyperparameter-step schedule."""
    return {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "optimizer": partial(torch.optim.Adam, lr=args.lr, weight_decay=args.weight_decay),
        "hyper_optimizer": partial(torch.optim.Adam, lr=args.hyper_lr),
        "scheduler": partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=args.steps, eta_min=args.lr / 100),
        "hyper_every": args.hyper_every,
        "warmup_steps": args.warmup_steps,
    }


def build_model(name: str, num_classes: int, checkpoint: str | None, in_chans: int = 3, img_size: int | None = None):
    """A timm model by name (shipped models included), optionally with weights from a local file."""
    import timm

    from . import models  # noqa: F401  (registers the shipped models)

    if not timm.is_model(name):
        close = timm.list_models(f"*{name}*")[:5]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise PartitionError(f"unknown model {name!r} (not in timm's registry){hint}")
    kwargs: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_chans}
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            raise PartitionError(f"--checkpoint {checkpoint!r} is not a file")
        kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint), num_classes=num_classes))
    try:
        if img_size is not None:
            try:  # transformers need the image size; most CNNs do not take the argument
                return timm.create_model(name, img_size=img_size, **kwargs)
            except TypeError as e:
                if "img_size" not in str(e):
                    raise
        return timm.create_model(name, **kwargs)
    except Exception as e:
        if checkpoint is None or is_out_of_memory(e):
            raise
        # unreadable file, not a state dict, or weights of another architecture (a long multi-line list of keys)
        detail = " ".join(str(e).split())
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        raise PartitionError(
            f"--checkpoint {checkpoint!r} cannot be loaded into {name}: {type(e).__name__}: {detail}"
        ) from e


def is_out_of_memory(error: BaseException) -> bool:
    """A failed allocation: ``MemoryError``, ``torch.OutOfMemoryError``, or torch's CPU allocator refusing."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
    )


def check_fits_in_memory(options: str, what: str, nbytes: int) -> None:
    """Refuse sizes whose data alone exceed this machine's memory, before trying to allocate it."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): leave it to the allocator
        return
    if nbytes > memory:
        raise PartitionArgumentError(
            f"{options}: {what} alone would take {nbytes / 2**30:,.0f} GiB, more than this machine's "
            f"{memory / 2**30:,.0f} GiB of memory; choose smaller values"
        )


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    from ._io import write_json

    write_json(path, payload)


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can fail on bad input, before the output directory is touched."""
    from .datasets import load_dataset
    from .transforms import AffineAugmentation

    for name in ("steps", "batch_size", "samples", "hyper_every", "eval_every", "image_size", "channels"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise PartitionArgumentError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup_steps < 0:
        raise PartitionArgumentError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise PartitionArgumentError(f"--weight-decay must be finite and >= 0, got {args.weight_decay}")
    if not (args.lr > 0 and math.isfinite(args.lr) and args.hyper_lr > 0 and math.isfinite(args.hyper_lr)):
        raise PartitionArgumentError(f"--lr and --hyper-lr must be positive, got {args.lr} and {args.hyper_lr}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise PartitionError("--device cuda: no CUDA device is available here; use --device cpu")
    if args.augment == "affine" and args.partitions < 2:
        raise PartitionArgumentError(
            f"--augment affine learns its ranges, which needs --partitions 2 or more (chunk k is scored by "
            f"subnetwork k-1), got --partitions {args.partitions}; raise --partitions or pass --augment none"
        )
    if args.data == "input_selection":
        raise PartitionArgumentError(
            "--data 'input_selection' is a regression task; `partition-fx train` classifies images "
            "(see examples/input_selection.py for input selection)"
        )
    if not args.data:
        raise PartitionArgumentError("--data must be rotdigits, digits or an image folder's path, got ''")
    sizes = f"--image-size {args.image_size}" + (f" --channels {args.channels}" if args.channels is not None else "")
    count = DIGITS_EXAMPLES if args.data in ("digits", "rotdigits") else 1
    check_fits_in_memory(sizes, f"{count} image(s)", count * (args.channels or 1) * args.image_size**2 * 4)
    kwargs: dict[str, Any] = {"size": args.image_size}
    if args.channels is not None:
        kwargs["channels"] = args.channels
    try:
        data = load_dataset(args.data, **kwargs)
    except PartitionArgumentError as e:  # the loader names its own arguments (size, channels): name the options
        raise PartitionArgumentError(f"--data {args.data!r} {sizes}: {e}") from None
    except PartitionError as e:  # an unknown name, or a folder that is not a dataset
        raise PartitionError(f"--data {args.data!r}: {e}") from None
    batch = args.batch_size * args.samples * math.prod(data.input_shape) * 4
    check_fits_in_memory(f"--batch-size {args.batch_size} --samples {args.samples}", "one batch of inputs", batch)
    if data.num_classes is None:
        raise PartitionArgumentError(f"--data {args.data!r} is a regression task; `partition-fx train` classifies")
    if len(data.input_shape) != 3:
        raise PartitionArgumentError(f"--data {args.data!r} is not images (example shape {data.input_shape})")
    torch.manual_seed(args.seed)
    model = build_model(args.model, data.num_classes, args.checkpoint, data.input_shape[0], data.input_shape[-1])
    pmodel = partitionify_from_args(model, args)
    from .training.chunks import split_into_chunks
    from .training.optim import weight_decay_scales

    try:
        chunks = split_into_chunks(len(data.train), pmodel.proportions, args.seed)  # refuse empty chunks now
    except PartitionArgumentError as e:
        raise PartitionArgumentError(
            f"--proportions {_proportions_text(args)} of {len(data.train)} examples: {e}"
        ) from None
    scale = max(weight_decay_scales(chunks.sizes))
    if not math.isfinite(args.weight_decay * scale):
        raise PartitionArgumentError(
            f"--weight-decay {args.weight_decay} times partition 1's scale {scale:.3g} (N/|D_1|) is not finite; "
            "choose a smaller --weight-decay"
        )
    hyper = AffineAugmentation(num_samples=args.samples) if args.augment == "affine" else None
    return {"data": data, "model": model, "pmodel": pmodel, "hyper": hyper}


def check_out(out: Path, overwrite: bool, inputs: dict[str, Any]) -> bool:
    """Refuse an ``--out`` that is or holds the current directory or one of the ``inputs`` (option -> path or
    None), and one that holds anything unless ``--overwrite``; returns whether there is something to replace."""
    outside = out.resolve()
    cwd = Path.cwd().resolve()
    if cwd == outside or outside in cwd.parents:
        raise PartitionArgumentError(
            f"--out {str(out)!r} is or holds the current directory; pass a directory below it, e.g. --out runs/new"
        )
    for option, path in inputs.items():
        inside = Path(path).resolve() if path is not None and Path(path).exists() else None
        if inside is not None and (inside == outside or outside in inside.parents):
            raise PartitionArgumentError(
                f"--out {str(out)!r} holds {option} {str(path)!r}, which --overwrite would delete; choose another --out"
            )
    occupied = out.exists() and (not out.is_dir() or any(out.iterdir()))
    if occupied and not overwrite:
        what = "is not a directory" if not out.is_dir() else "is not empty"
        raise PartitionError(f"--out {str(out)!r} exists and {what}; pass --overwrite or choose another directory")
    return occupied


def _prepare_out(out: Path, overwrite: bool, inputs: dict[str, Any]) -> None:
    if check_out(out, overwrite, inputs):
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PartitionError(f"--out {str(out)!r} cannot be created: {e.strerror or e}") from None


def _run_config(run: Path, option: str) -> dict[str, Any]:
    """The report of the training run in ``run``, refusing one that ``partition-fx train`` did not write. Its
    ``config`` holds every option (``LATER_OPTION_DEFAULTS`` for older runs), with proportions as a tuple."""
    try:
        report = json.loads((run / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PartitionError(f"{option} {str(run)!r}: report.json cannot be read ({e})") from None
    config = report.get("config") if isinstance(report, dict) else None
    needed = [k for k in RUN_CONFIG_KEYS if k not in LATER_OPTION_DEFAULTS]
    missing = [k for k in needed if k not in config] if isinstance(config, dict) else []
    if not isinstance(config, dict) or missing:
        raise PartitionError(
            f"{option} {str(run)!r}: report.json holds no training configuration"
            + (f" (no {', '.join(missing)})" if missing else "")
            + "; pass the --out directory of `partition-fx train`"
        )
    report["config"] = {**LATER_OPTION_DEFAULTS, **config, "proportions": tuple(config["proportions"])}
    return report


def _resumed(args: argparse.Namespace) -> argparse.Namespace:
    """``--resume RUN``: the run's own configuration (from its report), refusing options that contradict it."""
    from .cli import _parser

    run: Path = args.resume
    report_path = run / "report.json"
    if not report_path.is_file():
        raise PartitionError(
            f"--resume {str(run)!r}: no report.json there; pass the --out directory of an earlier `partition-fx train`"
        )
    report = _run_config(run, "--resume")
    if report.get("status") == "completed":
        raise PartitionError(f"--resume {str(run)!r}: that run completed; nothing to resume (export it, or train anew)")
    config = report["config"]
    defaults = vars(_parser().parse_args(["train"]))
    given = {key: getattr(args, key) for key in RUN_CONFIG_KEYS if getattr(args, key) != defaults[key]}
    if args.out != defaults["out"] and args.out != run:
        given["out"] = args.out
    saved = {**config, "out": run}
    conflicts = [key for key, value in given.items() if value != saved.get(key)]
    if conflicts:
        options = ", ".join(
            f"--{key.replace('_', '-')} {given[key]} (the run has {saved.get(key)})" for key in conflicts
        )
        raise PartitionArgumentError(f"--resume continues {str(run)!r} with its own configuration; drop {options}")
    return argparse.Namespace(**{**vars(args), **saved, "overwrite": False})


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    """The ``train`` command; returns the final report (also written to ``--out/report.json``).

    With ``args.resume`` (a run directory) it continues that run from its last evaluation, with the run's
    configuration, bit for bit as if it had not stopped (CPU).
    """
    from safetensors.torch import save_model

    from .export import export_onnx, export_subnetwork
    from .plots import plot_curves, plot_hyperparameters
    from .training import fit
    from .training.resume import PartitionCheckpointError, resume_directory

    resume_from = None
    if getattr(args, "resume", None) is not None:
        args = _resumed(args)
        resume_from = args.out / "checkpoint" / "resume"
    out: Path = args.out
    inputs = {"--data": args.data, "--checkpoint": args.checkpoint}
    if resume_from is None:
        check_out(out, args.overwrite, inputs)  # now, not after minutes of loading
    parts = _prepare(args)
    data, pmodel, hyper = parts["data"], parts["pmodel"], parts["hyper"]
    if resume_from is None:
        _prepare_out(out, args.overwrite, inputs)
    elif not resume_directory(resume_from).is_dir():
        raise PartitionCheckpointError(
            f"--resume {str(out)!r}: no checkpoint/resume/ there (runs written before resuming existed cannot resume)"
        )
    config = {key: getattr(args, key) for key in RUN_CONFIG_KEYS}
    config["proportions"] = list(pmodel.proportions)
    report: dict[str, Any] = {
        "status": "running",
        "config": config,
        "data": {"name": data.name, "train": len(data.train), "test": len(data.test), "classes": data.num_classes},
        "history": [],
        "torch": torch.__version__,
    }
    report_path = out / "report.json"
    _write_json_atomically(report_path, report)

    def on_evaluation(trainer: Any, record: dict[str, Any]) -> None:
        report.update(history=trainer.history, lml=record["lml"], hyperparameters=record["hyperparameters"])
        report["last_checkpoint_step"] = record["step"]
        _write_json_atomically(report_path, report)

    started = time.perf_counter()
    try:
        result = fit(
            pmodel,
            data.train,
            hyper=hyper,
            **training_recipe(args),
            seed=args.seed,
            eval_every=args.eval_every,
            callbacks=[on_evaluation],
            checkpoint_dir=out / "checkpoint",
            fused=args.fused,
            every_partition=args.every_partition,
            progress=None if not args.quiet else False,
            device=args.device,
            resume=resume_from,
        )
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        report.update(
            status="interrupted" if interrupted else "failed", seconds=round(time.perf_counter() - started, 1)
        )
        if not interrupted:
            report["error"] = str(e)
        _write_json_atomically(report_path, report)
        raise
    pmodel.cpu()
    exported = export_subnetwork(pmodel).eval()
    x_test, y_test = data.test.tensors
    accuracy, loglik = evaluate_classifier(exported, x_test, y_test)
    save_model(exported, str(out / "model.safetensors"))
    export_onnx(pmodel, out / "model.onnx", (x_test[:4],))
    plot_curves(result.history, out / "lml.png")
    plot_hyperparameters(result.history, out / "hyperparameters.png")
    report.update(
        status="completed",
        test_accuracy=accuracy,
        test_log_likelihood=loglik,
        lml=result.lml,
        lml_per_example=result.history[-1]["lml_per_example"],
        best_lml=result.best_lml,
        best_step=result.best_step,
        hyperparameters=result.hyperparameters,
        history=result.history,
        chunk_sizes=result.chunk_sizes,
        steps=result.steps,
        seconds=round(time.perf_counter() - started, 1),
        files={
            "model": "model.safetensors",
            "onnx": "model.onnx",
            "plots": ["lml.png", "hyperparameters.png"],
            "checkpoints": ["checkpoint/last.safetensors", "checkpoint/best.safetensors"],
        },
    )
    _write_json_atomically(report_path, report)
    return report


def run_export(args: argparse.Namespace) -> dict[str, Any]:
    """The ``export`` command: a trained run's checkpoint -> plain safetensors model and ONNX."""
    from safetensors.torch import save_model

    from .export import export_onnx, export_subnetwork
    from .training import PartitionedTrainer

    run: Path = args.run
    report_path = run / "report.json"
    checkpoint = run / "checkpoint" / f"{args.which}.safetensors"
    if not report_path.is_file() or not checkpoint.is_file():
        raise PartitionError(
            f"{str(run)!r} is not a training run: it needs report.json and checkpoint/{args.which}.safetensors "
            "(written by `partition-fx train`)"
        )
    config = _run_config(run, "--run")["config"]
    out: Path = args.out if args.out is not None else run / "export"
    check_out(out, args.overwrite, {"--run": run})
    rebuilt = argparse.Namespace(**config)
    parts = _prepare(rebuilt)
    pmodel = parts["pmodel"]
    if args.subnetwork is not None:
        try:
            pmodel.check_subnetwork(args.subnetwork)
        except PartitionArgumentError as e:
            raise PartitionArgumentError(f"--subnetwork {args.subnetwork}: {e}") from None
    trainer = PartitionedTrainer(pmodel, parts["data"].train, hyper=parts["hyper"], device="cpu")
    meta = trainer.load_checkpoint(checkpoint)
    _prepare_out(out, args.overwrite, {"--run": run})
    exported = export_subnetwork(pmodel, args.subnetwork).eval()
    x_test, y_test = parts["data"].test.tensors
    accuracy, loglik = evaluate_classifier(exported, x_test, y_test)
    save_model(exported, str(out / "model.safetensors"))
    export_onnx(pmodel, out / "model.onnx", (x_test[:4],), subnetwork=args.subnetwork)
    summary = {
        "run": str(run),
        "checkpoint": str(checkpoint),
        "checkpoint_step": meta.get("step"),
        "subnetwork": args.subnetwork if args.subnetwork is not None else pmodel.num_partitions,
        "test_accuracy": accuracy,
        "test_log_likelihood": loglik,
        "files": {"model": "model.safetensors", "onnx": "model.onnx"},
    }
    _write_json_atomically(out / "export.json", summary)
    return summary
