"""The torch-free part of ``--model hf:DIR`` (``models.hf_models``): what such a name means and the refusal of a
DIR that is not a ``save_pretrained`` folder, or of the name where ``transformers`` is missing, which the command
line runs before it loads torch."""

from __future__ import annotations

from pathlib import Path

from .errors import PartitionError
from .extras import require

HF_PREFIX = "hf:"
"""A ``--model`` with this prefix names a local ``save_pretrained`` folder of a ``transformers`` image classifier
(``hf:path/to/vit``)."""

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The weights a ``save_pretrained`` folder holds (one of these)."""

SAVE_PRETRAINED = "a folder that save_pretrained wrote (config.json and model.safetensors)"
"""What ``hf:DIR`` must name, as the refusals say."""


def hf_folder(name: str) -> Path | None:
    """The folder of an ``hf:DIR`` model name; None for any other name.

    >>> hf_folder("hf:runs/vit"), hf_folder("resnet18")
    (PosixPath('runs/vit'), None)
    """
    return Path(name[len(HF_PREFIX) :]) if name.startswith(HF_PREFIX) else None


def check_hf_folder(name: str) -> None:
    """Refuse an ``hf:DIR`` ``name`` whose DIR is not a ``save_pretrained`` folder (missing, no ``config.json``
    or no weights) or where ``transformers`` is not installed, in one line; no torch is imported. Any other
    name passes.

    >>> check_hf_folder("resnet18")
    >>> check_hf_folder("hf:no/such/folder")
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionError: --model 'hf:no/such/folder': no/such/folder is not a folder; pass ...
    """
    folder = hf_folder(name)
    if folder is None:
        return
    where = f"--model {name!r}"
    if not str(folder):
        raise PartitionError(f"{where} names no folder; pass hf:DIR, DIR {SAVE_PRETRAINED}")
    if not folder.is_dir():
        raise PartitionError(f"{where}: {folder} is not a folder; pass hf:DIR, DIR {SAVE_PRETRAINED}")
    if not (folder / "config.json").is_file():
        raise PartitionError(
            f"{where}: {folder} is not a Hugging Face save_pretrained folder (no config.json); pass {SAVE_PRETRAINED}"
        )
    if not any((folder / weights).is_file() for weights in WEIGHT_FILES):
        raise PartitionError(
            f"{where}: {folder} has a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])}); pass "
            f"{SAVE_PRETRAINED}"
        )
    require(f"--model {HF_PREFIX}DIR", "transformers")
