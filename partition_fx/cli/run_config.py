"""A ``train`` run's configuration and the command line, both ways: the :class:`TrainConfig` its options give
(:func:`train_config`), the ``config`` its report records (:func:`run_config`: the command's own options for
the model, data, conversion and augmentation, and ``"train"``: ``TrainConfig.to_dict()``), and the options a
recorded configuration reads back as (:func:`args_from_config`, for ``export`` and ``--resume``).

No torch here: the command line checks options and reads reports before it loads torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import PartitionArgumentError, PartitionError, PartitionTypeError, earlier_version
from ..settings import MissingSettings, SettingError, SettingTypeError
from ..train_config import TrainConfig
from .parser import train_defaults

RUN_CONTROL = ("command", "out", "overwrite", "quiet", "keep_resume", "resume")
"""``train``'s options that say how to run and where to write, not what is trained: no report records them."""


def command_line_keywords() -> list[str]:
    """The training configuration's keywords that are ``train`` options (all but those the command sets)."""
    return [f.keyword for f in TrainConfig.fields() if f.option.command_line]


def job_keys() -> list[str]:
    """``train``'s options that are neither the training configuration's nor :data:`RUN_CONTROL`: what the
    command builds the model, data and augmentation from.

    >>> job_keys()[:4]
    ['model', 'checkpoint', 'data', 'image_size']
    """
    train = set(TrainConfig.keywords())
    return [key for key in train_defaults() if key not in train and key not in RUN_CONTROL]


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The training configuration ``train``'s options ask for (the recommended one with the options given, and
    the defaults kept out of checkpoints: the command rebuilds its model to load them); a value it refuses is
    named by its option.

    >>> from partition_fx.cli.parser import parse_train
    >>> train_config(parse_train(["--hyper-samples", "4"])).hyper.samples
    4
    >>> train_config(parse_train(["--finetune-steps", "9", "--steps", "9"]))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: --finetune-steps must be less than --steps 9 (they are its last ...
    """
    keywords = {keyword: getattr(args, keyword) for keyword in command_line_keywords()}
    try:
        return TrainConfig.recommended(**keywords, checkpoint_defaults=False)
    except (SettingError, SettingTypeError) as e:
        kind = PartitionTypeError if isinstance(e, SettingTypeError) else PartitionArgumentError
        raise kind(f"{e.field.flag} {e.problem}") from None


def run_config(args: argparse.Namespace, proportions: tuple[float, ...]) -> dict[str, Any]:
    """The ``config`` a report records: the job's options (``proportions`` as resolved, ``device`` as asked)
    and ``"train"``, the training configuration's ``to_dict()``.

    >>> from partition_fx.cli.parser import parse_train
    >>> config = run_config(parse_train(["--steps", "8"]), (0.8, 0.1, 0.1))
    >>> config["model"], config["train"]["optimization"]["steps"], config["train"]["runtime"]["seed"]
    ('resnet10t', 8, 0)
    """
    job = {key: getattr(args, key) for key in job_keys()}
    return {**job, "proportions": list(proportions), "train": train_config(args).to_dict()}


def args_from_config(config: dict[str, Any], source: str = "the run's config") -> argparse.Namespace:
    """The ``train`` options a recorded ``config`` (:func:`run_config`) reads back as, every other option at its
    default; a configuration without a key this version records, or with one it does not know, is refused.

    >>> from partition_fx.cli.parser import parse_train
    >>> args = args_from_config(run_config(parse_train(["--hyper-lr", "0.1"]), (0.8, 0.1, 0.1)))
    >>> args.hyper_lr, args.proportions, args.out
    (0.1, (0.8, 0.1, 0.1), PosixPath('runs/train'))
    """
    keys = job_keys()
    missing = [f"config.{key}" for key in [*keys, "train"] if key not in config]
    if missing:
        raise PartitionError(earlier_version(source, ", ".join(missing)))
    unknown = sorted(set(config) - {*keys, "train"})
    if unknown:
        raise PartitionError(f"{source} has unknown key(s) {', '.join(unknown)}; it takes {', '.join(keys)}, train")
    try:
        train = TrainConfig.from_dict(config["train"], where=f"{source}: train")
    except MissingSettings as e:
        raise PartitionError(earlier_version(source, ", ".join(f"config.train.{m}" for m in e.missing))) from None
    except PartitionError as e:
        raise PartitionError(earlier_version(source, f"a training configuration this version reads: {e}")) from None
    flat = {keyword: train.value(keyword) for keyword in command_line_keywords()}
    job = {key: config[key] for key in keys}
    return argparse.Namespace(**{**train_defaults(), **job, **flat, "proportions": tuple(config["proportions"])})
