"""``partition-fx describe``, declared: how each tensor of a model would be partitioned, printed; nothing is
written. It runs as ``cli.convert.run_describe``."""

from __future__ import annotations

from . import Command
from .convert import ConversionOptions, add_conversion_options

COMMAND = Command(
    name="describe",
    summary="print how each tensor of a model would be partitioned",
    description="Print, for each parameter tensor of a timm or torchvision model, how it would be partitioned "
    "(treatment, entries per partition, why). Nothing is written.",
    order=2,
    add_options=add_conversion_options,
    options=ConversionOptions.parsed,
    run="partition_fx.cli.convert:run_describe",
    show=lambda text, options: print(text),
    out_of_memory="lower --num-classes or choose a smaller --model",
)
