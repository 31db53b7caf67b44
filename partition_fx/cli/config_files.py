"""Configuration files of ``partition-fx train``: ``--print-config`` writes the whole resolved job as YAML, and
``--config FILE`` reads one back as the command's defaults, so that every option given on the command line
overrides the file. A ``--recipe`` (``cli.recipes``, itself such a file) is read the same way, under both.

A file holds the job as ``report.json`` records it under ``config`` (``JobSpec.to_dict()``): the job's own keys
(``model``, ``data``, ``partitions``, ...) and the training configuration nested under ``train`` by section
(``train: {optimization: {steps: 40}}``). It may hold any part of it: what it leaves out keeps the command's
default, or that of the ``recipe`` it names. A key this version does not know is refused, naming the keys known at
that level and, for a typo, the key it is closest to (``step``: did you mean ``steps``?).

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "run.yaml"
>>> _ = path.write_text("model: fixup_resnet8\\ntrain:\\n  optimization:\\n    steps: 40\\n")
>>> defaults = config_defaults(["--config", str(path), "--steps", "10"])
>>> defaults["model"], defaults["steps"], defaults["batch_size"]
('fixup_resnet8', 40, 64)
>>> config_defaults(["--steps", "10"])
{}
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from ..errors import PartitionError
from ..job.settings import SettingError, SettingTypeError
from ..job.spec import JobSpec
from .recipes import RECIPES, recipe_name

OPTION = "--config"


def config_path(argv: list[str]) -> Path | None:
    """The ``FILE`` of ``--config FILE`` (or ``--config=FILE``) in ``argv``; None without one (a ``--config``
    without its value is left for the parser to refuse).

    >>> config_path(["--steps", "3", "--config=run.yaml"]), config_path(["--steps", "3"])
    (PosixPath('run.yaml'), None)
    """
    for i, word in enumerate(argv):
        if word == OPTION and i + 1 < len(argv):
            return Path(argv[i + 1])
        if word.startswith(OPTION + "="):
            return Path(word.partition("=")[2])
    return None


def read_config(path: Path, recipe: str | None = None) -> JobSpec:
    """The job the configuration file ``path`` describes, every key it leaves out at the command's default (or at
    the ``recipe``'s: the one given on the command line, else the one the file names); one clear error for a
    missing or unreadable file, YAML that is not a mapping, an unknown key or a bad value."""
    where = f"{OPTION} {str(path)!r}"
    values = _read_mapping(path, where, "train")
    merged = _merged(_base(recipe or values.get("recipe"), where), values, where, (), _places())
    if recipe is not None:  # the command line's recipe, over the one the file names
        merged["recipe"] = recipe
    try:
        return JobSpec.from_dict(merged, where=where)
    except (SettingError, SettingTypeError) as e:  # named by its place in the file, and by its option
        field = JobSpec.keywords()[e.field.keyword]
        raise PartitionError(f"{where}: {'.'.join(field.path)} {e.problem} (the option {field.flag})") from None


def _read_mapping(path: Path, where: str, command: str) -> dict[str, Any]:
    """The YAML mapping in ``path``; one clear error for a missing or unreadable file, YAML that is not valid or
    not a mapping (named as ``where``, with the ``command`` that writes such a file)."""
    import yaml

    try:
        text = path.read_text()
    except OSError as e:
        raise PartitionError(
            f"{where}: cannot read it ({e.strerror}); pass a YAML file written by --print-config"
        ) from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise PartitionError(f"{where}: not valid YAML{line} ({getattr(e, 'problem', e)})") from None
    if values is None or values == {}:
        raise PartitionError(
            f"{where}: holds no settings (the file is empty); write one with `partition-fx {command} --print-config "
            "> FILE`, or drop --config to run the defaults"
        )
    if not isinstance(values, dict):
        raise PartitionError(
            f"{where}: holds a {type(values).__name__}, not a mapping of options; write it with `partition-fx "
            f"{command} --print-config > FILE`"
        )
    return values


def _base(recipe: Any, where: str) -> dict[str, Any]:
    """What a file's keys fill in: the command's defaults, or those of the ``--recipe`` named (so that a file
    holding only ``recipe: NAME`` and a few changes runs that recipe with them)."""
    defaults = JobSpec.from_keywords().to_dict()
    if recipe is None:
        return defaults
    if recipe not in RECIPES:
        raise PartitionError(f"{where}: recipe {recipe!r} is not one of {', '.join(RECIPES)}")
    where = f"--recipe {recipe} (partition_fx/{RECIPES[recipe].file})"
    merged = _merged(defaults, RECIPES[recipe].values, where, (), _places())
    merged["recipe"] = recipe
    try:
        return JobSpec.from_dict(merged, where=where).to_dict()
    except (SettingError, SettingTypeError) as e:
        raise PartitionError(f"{where}: {e.problem}") from None


def _merged(
    defaults: dict[str, Any],
    values: dict[str, Any],
    where: str,
    path: tuple[str, ...],
    places: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """``values`` over ``defaults``, section by section; a key ``defaults`` lacks is refused, saying where a key of
    the job that belongs elsewhere goes (``places``, :func:`_places`: ``steps`` is ``train.optimization.steps``), or
    the known key it is a typo of (``step``: did you mean ``steps``?).

    >>> _merged({"steps": 1, "seed": 0}, {"step": 40}, "f.yaml", ("train", "optimization"))
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: f.yaml: unknown key(s) step at train.optimization (did you mean steps?); ...
    """
    unknown = sorted(str(key) for key in values if key not in defaults)
    if unknown:
        at = ".".join(path) or "the top level"
        hints = [_hint(key, defaults, path, places or {}) for key in unknown]
        if len(unknown) > 1:
            hints = [f"{key}: {hint}" if hint.startswith("did you mean") else hint for key, hint in zip(unknown, hints)]
        shown = "; ".join(hint for hint in hints if hint)
        raise PartitionError(
            f"{where}: unknown key(s) {', '.join(unknown)} at {at}{f' ({shown})' if shown else ''}; it takes "
            f"{', '.join(defaults)}"
        )
    merged = dict(defaults)
    for key, value in values.items():
        section = defaults[key]
        if isinstance(section, dict) and (key == "train" or bool(path)):  # a section of the training configuration
            if not isinstance(value, dict):
                raise PartitionError(
                    f"{where}: {'.'.join((*path, key))} must be a mapping of its settings, got {value!r}"
                )
            merged[key] = _merged(section, value, where, (*path, key), places)
        else:
            merged[key] = value
    return merged


def _hint(key: str, known: dict[str, Any], path: tuple[str, ...], places: dict[str, tuple[str, ...]]) -> str:
    """What an unknown ``key`` at ``path`` (whose keys are ``known``) is likely meant to be: a key of the job that
    goes elsewhere (``steps is train.optimization.steps``), else the closest key by ``difflib``, as the command
    line suggests an option: one at this level by its name (``did you mean steps?``), one elsewhere by its place
    (``did you mean train.optimization.steps?``); "" when none is close.

    >>> places = {"steps": ("train", "optimization", "steps")}
    >>> _hint("steps", {"model": 0}, (), places), _hint("step", {"model": 0}, (), places)
    ('steps is train.optimization.steps', 'did you mean train.optimization.steps?')
    >>> _hint("step", {"steps": 0}, ("train", "optimization"), places), _hint("colour", {"model": 0}, (), places)
    ('did you mean steps?', '')
    """
    if key in places and places[key] != (*path, key):
        return f"{key} is {'.'.join(places[key])}"
    here = [str(k) for k in known]
    close = difflib.get_close_matches(key, [*here, *(name for name in places if name not in here)], n=1)
    if not close:
        return ""
    return f"did you mean {close[0] if close[0] in here else '.'.join(places[close[0]])}?"


def _places() -> dict[str, tuple[str, ...]]:
    """Where each setting of a ``train`` configuration file goes, by its name and by its option's keyword
    (``steps`` and ``lr``: ``train.optimization.*``; ``hyper_lr``: ``train.hyper.lr``).

    >>> _places()["steps"], _places()["hyper_lr"]
    (('train', 'optimization', 'steps'), ('train', 'hyper', 'lr'))
    """
    places: dict[str, tuple[str, ...]] = {}
    for field in JobSpec.fields():
        places.setdefault(field.path[-1], field.path)  # a name two sections share goes to the first
    return {**places, **{field.keyword: field.path for field in JobSpec.fields()}}


def config_defaults(argv: list[str]) -> dict[str, Any]:
    """What ``--recipe NAME`` and ``--config FILE`` in ``argv`` make the defaults of ``train``'s options: every
    command-line field of the job they describe (the file's values over the recipe's) by keyword (the parser's
    destination names); {} with neither (an unknown recipe is left for the parser to refuse)."""
    path, recipe = config_path(argv), recipe_name(argv)
    recipe = recipe if recipe in RECIPES else None
    if path is not None:
        spec = read_config(path, recipe)
    elif recipe is not None:
        spec = JobSpec.from_dict(_base(recipe, f"--recipe {recipe}"))
    else:
        return {}
    return {f.keyword: spec.value(f.keyword) for f in JobSpec.fields() if f.option.command_line}


def config_text(spec: JobSpec) -> str:
    """``spec`` as the YAML ``--config`` reads: the whole job, every setting at its value.

    >>> print(config_text(JobSpec.from_keywords(steps=40)).splitlines()[0])
    model: resnet10t
    """
    import yaml

    return yaml.safe_dump(spec.to_dict(), sort_keys=False, default_flow_style=False)


def federated_defaults(argv: list[str]) -> dict[str, Any]:
    """What ``--config FILE`` in ``argv`` makes the defaults of ``federated``'s options: the values the file
    gives (any part of what ``federated --print-config`` writes), checked as the ``FederatedConfig`` they make
    with the others at their defaults; {} without ``--config``. A key this version does not know is refused,
    naming the known ones and the closest (``round``: did you mean ``rounds``?).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "fed.yaml"
    >>> _ = path.write_text("rounds: 7\\nproportions: [0.5, 0.5]\\n")
    >>> federated_defaults(["--config", str(path)])
    {'rounds': 7, 'proportions': (0.5, 0.5), 'partitions': 2}
    """
    from ..federated.config import FederatedConfig

    path = config_path(argv)
    if path is None:
        return {}
    where = f"{OPTION} {str(path)!r}"
    values = _read_mapping(path, where, "federated")
    merged = _merged(FederatedConfig().to_dict(), values, where, ())
    try:
        config = FederatedConfig.from_dict(merged, where=where)
    except (SettingError, SettingTypeError) as e:
        raise PartitionError(f"{where}: {e.field.keyword} {e.problem} (the option {e.field.flag})") from None
    # --proportions and --partitions are the command's own options (cli.parser._add_proportions)
    options = {f.keyword for f in FederatedConfig.fields() if f.option.command_line} | {"proportions"}
    defaults = {key: getattr(config, key) for key in values if key in options}
    if "proportions" in defaults:
        defaults["partitions"] = len(config.proportions)
    return defaults


def federated_config_text(config: Any) -> str:
    """A ``FederatedConfig`` as the YAML ``federated --config`` reads: every setting at its value.

    >>> from partition_fx.federated.config import FederatedConfig
    >>> federated_config_text(FederatedConfig(rounds=4)).splitlines()[:2]
    ['data: rotdigits', 'image_size: 16']
    """
    import yaml

    values = {key: list(value) if isinstance(value, tuple) else value for key, value in config.to_dict().items()}
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=False)
