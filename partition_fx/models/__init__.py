"""Models from the paper that timm and torchvision lack, registered with timm on import.

``timm.create_model("fixup_resnet14")`` and ``timm.create_model("cifar_wrn16_4")`` work after
``import partition_fx``.
"""

from .fixup import FixupResNet
from .wrn import CifarWideResNet

__all__ = ["CifarWideResNet", "FixupResNet"]
