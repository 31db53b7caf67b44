"""The paper's image experiments as presets of ``partition-fx train`` (``--recipe NAME``): each is the options it
stands for, written as on the command line, which the user's own options then override.

Values from the paper's appendix I.4 (CIFAR-10 and RotCIFAR-10 with FixUp ResNets) and the fine-tuning run of its
Table 2; where the appendix gives no value, the option keeps this package's default (``docs/data.md`` lists
each). No torch here: ``partition-fx train --help`` shows them at once.

>>> RECIPES["paper-cifar10-fixup14"].options[:4]
('--model', 'fixup_resnet14', '--steps', '40000')
>>> expand(["--recipe", "paper-cifar10-fixup8", "--steps", "10"])[:2], expand(["--steps", "10"])
(['--model', 'fixup_resnet8'], ['--steps', '10'])
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """A preset: its ``name``, what it reproduces (``description``, with the data it expects) and its
    ``options`` (command-line words)."""

    name: str
    description: str
    options: tuple[str, ...]

    @property
    def text(self) -> str:
        """The options as one would type them."""
        return " ".join(self.options)


CIFAR_OPTIONS = (
    "--image-size", "32", "--channels", "3", "--partitions", "3", "--proportions", "0.8,0.1,0.1",
    "--scheme", "random", "--default", "init", "--augment", "affine", "--samples", "20", "--hyper-samples", "20",
    "--weight-optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--lr-schedule", "cosine",
    "--weight-decay", "0.0001", "--weight-decay-scaling", "sqrt", "--batch-size", "250",
    "--hyper-lr", "0.001", "--hyper-every", "1", "--hyper-chunks", "one", "--hyper-batch-size", "250",
    "--init", "zero", "--train-range-factor", "1", "--draws", "uniform",
)  # fmt: skip
"""Appendix I.4's CIFAR settings: SGD 0.1 with momentum 0.9 cosine-annealed 100-fold, weight decay 1e-4 scaled by
the square root, batches of 250, Adam 1e-3 on the augmentation every iteration on one chunk, 20 samples,
chunks 80/10/10 %, the ranges learned from 0 with parameter steps on the ranges themselves, samples drawn
independently."""

_PAPER_RUNS = {  # data: (its name, its --data, the iterations in words, --steps)
    "cifar10": ("CIFAR-10", "cifar10:DIR", "40,000 iterations", "40000"),
    "rotcifar10": ("RotCIFAR-10", "rotcifar10:DIR", "twice the iterations: 80,000", "80000"),
}
RECIPES = {
    r.name: r
    for r in (
        *(
            Recipe(
                f"paper-{data}-fixup{depth}",
                f"{title} (--data {spec}), FixUp ResNet-{depth}, {iterations}",
                ("--model", f"fixup_resnet{depth}", "--steps", steps, "--finetune-steps", "0", *CIFAR_OPTIONS),
            )
            for data, (title, spec, iterations, steps) in _PAPER_RUNS.items()
            for depth in (14, 8)
        ),
        Recipe(
            "paper-cifar10-fixup14-finetune",
            "Table 2: CIFAR-10 (--data cifar10:DIR), FixUp ResNet-14, 80,000 iterations, the last 20,000 "
            "fine-tuning the final subnetwork on all the data",
            (
                "--model",
                "fixup_resnet14",
                "--steps",
                "80000",
                "--finetune-steps",
                "20000",
                "--finetune-schedule",
                "continue",
                *CIFAR_OPTIONS,
            ),
        ),
    )
}
"""Every recipe by name."""


def expand(argv: list[str]) -> list[str]:
    """``argv`` with the options of the ``--recipe`` it names put first, so that every option the user gives
    overrides the recipe's (an unknown name is left for the parser to refuse)."""
    for i, word in enumerate(argv):
        name = argv[i + 1] if word == "--recipe" and i + 1 < len(argv) else None
        if word.startswith("--recipe="):
            name = word.partition("=")[2]
        if name in RECIPES:
            return [*RECIPES[name].options, *argv]
    return list(argv)
