"""Models from the paper that timm and torchvision lack, registered with timm on import, the model factory, and
pretrained weights from local files.

``timm.create_model("fixup_resnet14")`` and ``timm.create_model("cifar_wrn16_4")`` work after
``import partition_fx``; :func:`build_model` builds any of timm's models (these included) by name, and
torchvision's classifiers by ``torchvision:NAME``; :func:`load_checkpoint_into` loads a pretrained checkpoint
into a model for other data (the classifier re-initialised for other classes, the stem adapted to other
input channels).
"""

from .checkpoints import LoadedCheckpoint, load_checkpoint_into, read_checkpoint
from .factory import build_model, check_model_name, similar_model_names
from .fixup import FixupResNet
from .torchvision_models import TORCHVISION_PREFIX, build_torchvision_model, torchvision_model_names
from .wrn import CifarWideResNet

__all__ = [
    "TORCHVISION_PREFIX",
    "CifarWideResNet",
    "FixupResNet",
    "LoadedCheckpoint",
    "build_model",
    "build_torchvision_model",
    "check_model_name",
    "load_checkpoint_into",
    "read_checkpoint",
    "similar_model_names",
    "torchvision_model_names",
]
