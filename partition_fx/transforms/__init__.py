"""Learnable-hyperparameter modules: put them in a model and ``fit`` learns their parameters psi.

Each is a :class:`HyperparameterModule`: ``partitionify`` leaves it unpartitioned, ``hyperparameters()``
reports its values as plain floats and ``constrain_()`` clamps it into documented bounds after each step.

- :class:`AffineAugmentation`: affine augmentation with learnable ranges (Augerino); [B, ...] -> [S * B, ...].
- :class:`BoxZoom`: a learnable zoom of detection images and their boxes alike (with ``training.ModelLoss``).
- :class:`ConcreteDropout`: dropout with a learnable rate (concrete relaxation).
- :class:`InputMask`: a learnable soft mask over input features.

The training layer asks of an input transform only protocols: :class:`WidensRanges` (its parameter steps may draw
from wider ranges) and :class:`LearnedRanges` (named ranges within bounds, which a population moves), so a module
of your own that has their attributes takes part as the shipped ones do.

:class:`TestTimeAveraged` wraps a classifier to predict the augmentation-averaged way the LML scores it, over K
fixed transforms (exportable to ONNX).

All three are the identity (or a fixed mask) in eval mode, so exported models need none of this package.
"""

from .affine import AffineAugmentation
from .averaging import TestTimeAveraged, averaging_coefficients
from .base import HyperparameterModule, LearnedRanges, WidensRanges
from .boxes import BoxZoom
from .dropout import ConcreteDropout
from .mask import InputMask

__all__ = [
    "AffineAugmentation",
    "BoxZoom",
    "ConcreteDropout",
    "HyperparameterModule",
    "InputMask",
    "LearnedRanges",
    "TestTimeAveraged",
    "WidensRanges",
    "averaging_coefficients",
]
