"""Hugging Face ``transformers`` image classifiers from a local ``save_pretrained`` folder, by ``hf:DIR``: built
for the data's number of classes and input channels from the folder's ``config.json`` and weights (nothing is
downloaded), with every failure a :class:`~partition_fx.errors.PartitionError` in one line.

The folder's weights load as ``--checkpoint`` loads a file (``load_checkpoint_into``): a classifier for another
number of classes is re-initialised (the config's ``num_labels`` becomes the data's), and the stem (the first
convolution, a ViT's patch projection) is adapted to other input channels (the config's ``num_channels`` becomes
the data's; summed for greyscale, as timm's ``in_chans``); one warning line names what was not loaded as it is. A
config that fixes its image size (a ViT's ``image_size``) is refused for data of another size, naming the
``--image-size`` that fits it.

``hf_folders.check_hf_folder`` is the torch-free part, which the command line runs before it loads torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import PartitionCheckpointError, PartitionError, PartitionWarning, first_line, is_out_of_memory, shortened
from ..extras import import_extra
from ..hf_folders import HF_PREFIX, SAVE_PRETRAINED, check_hf_folder, hf_folder


def build_hf_model(name: str, num_classes: int, in_chans: int = 3, img_size: int | None = None) -> torch.nn.Module:
    """The image classifier in the ``save_pretrained`` folder ``name`` names (``hf:DIR``), with its weights, for
    ``num_classes`` classes, ``in_chans`` input channels and (where its config fixes one) ``img_size`` images: see
    the module's docstring for what is adapted and what is refused.
    """
    check_hf_folder(name)
    folder = hf_folder(name)
    assert folder is not None  # check_hf_folder refuses any other name
    transformers = import_extra(f"--model {HF_PREFIX}DIR", "transformers")
    where = f"--model {name!r}"
    config = _config(transformers, folder, where)
    size = getattr(config, "image_size", None)
    if img_size is not None and isinstance(size, int) and size != img_size:
        raise PartitionError(
            f"{where} was saved for {size}x{size} images (its config.json's image_size) and the data are "
            f"{img_size}x{img_size}: pass --image-size {size}"
        )
    channels = getattr(config, "num_channels", None)
    if channels is None and in_chans != 3:
        raise PartitionError(
            f"{where}: its config.json has no num_channels to adapt to the data's {in_chans} channel(s): "
            "pass --channels 3"
        )
    try:
        with quiet(transformers):
            original, info = transformers.AutoModelForImageClassification.from_pretrained(
                folder, local_files_only=True, output_loading_info=True
            )
    except Exception as e:
        if is_out_of_memory(e):
            raise
        raise PartitionError(f"{where}: its weights cannot be loaded ({_short(e)}); pass {SAVE_PRETRAINED}") from e
    lacking = [key for key in info.get("missing_keys", ()) if not key.startswith("classifier.")]
    if lacking:  # a backbone's folder lacks the classifier alone, which is initialised like another class count's
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        raise PartitionCheckpointError(
            f"{where}: its weights lack the model's tensor {sorted(lacking)[0]!r}{more}; pass {SAVE_PRETRAINED}"
        )
    config.num_labels = num_classes  # id2label and label2id follow (LABEL_0, ...); an export names the classes
    if channels is not None:
        config.num_channels = in_chans
    model = transformers.AutoModelForImageClassification.from_config(config)
    classifier = "classifier" if isinstance(getattr(model, "classifier", None), torch.nn.Module) else None
    from .checkpoints import load_checkpoint_into

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", PartitionWarning)
        try:
            load_checkpoint_into(model, original.state_dict(), classifier=classifier)
        except PartitionCheckpointError as e:  # "state dict does not fit ...": name the option
            raise PartitionCheckpointError(f"{where}: its {e}") from None
    for warning in said:  # "state dict: not loaded ...": name the folder
        message = str(warning.message).replace("state dict", where, 1)
        warnings.warn(message, warning.category, stacklevel=3)
    return model


@contextmanager
def quiet(transformers: Any) -> Iterator[None]:
    """``transformers`` without its progress bars (loading and writing weights) and info messages, as the
    command line's output stays one line per event; its settings are restored after."""
    logging = transformers.utils.logging
    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _config(transformers: Any, folder: Path, where: str) -> Any:
    """The config of the image classifier in ``folder``; a folder of another kind of model is refused."""
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:
        if is_out_of_memory(e):
            raise
        raise PartitionError(f"{where}: its config.json cannot be read ({_short(e)}); pass {SAVE_PRETRAINED}") from e
    mapping = transformers.models.auto.modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
    if config.model_type not in mapping:
        raise PartitionError(
            f"{where} is a {config.model_type!r} model, which AutoModelForImageClassification does not build; pass "
            "the folder of an image classifier (ViT, ResNet, ConvNeXt, ...)"
        )
    return config


def label_config(classes: list[str]) -> dict[str, Any]:
    """The ``id2label`` and ``label2id`` of a config whose output i is ``classes[i]``.

    >>> label_config(["cat", "dog"])
    {'id2label': {0: 'cat', 1: 'dog'}, 'label2id': {'cat': 0, 'dog': 1}}
    """
    return {"id2label": dict(enumerate(classes)), "label2id": {c: i for i, c in enumerate(classes)}}


def save_hf_folder(model: torch.nn.Module, folder: Path, classes: list[str]) -> None:
    """``model.save_pretrained(folder)`` (a ``transformers`` model: ``config.json`` and ``model.safetensors``), its
    config naming ``classes`` (output i is ``classes[i]``)."""
    transformers = import_extra(f"--model {HF_PREFIX}DIR", "transformers")
    config = getattr(model, "config", None)
    save = getattr(model, "save_pretrained", None)
    if config is None or save is None:
        raise PartitionError(f"{type(model).__name__} is not a transformers model: it has no save_pretrained")
    config.update(label_config(classes))
    with quiet(transformers):
        save(folder)


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {shortened(first_line(error), 200)}"
