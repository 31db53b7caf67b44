"""Models from the paper that timm and torchvision lack, registered with timm on import, and the model factory.

``timm.create_model("fixup_resnet14")`` and ``timm.create_model("cifar_wrn16_4")`` work after
``import partition_fx``; :func:`build_model` builds any of timm's models (these included) by name.
"""

from .factory import build_model
from .fixup import FixupResNet
from .wrn import CifarWideResNet

__all__ = ["CifarWideResNet", "FixupResNet", "build_model"]
