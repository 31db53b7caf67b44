"""``FederatedConfig``: every setting of a federated run in one place, with one set of defaults.

The same object configures ``partition-fx federated`` (built from its options), the Flower app of
``examples/flower_app`` (built from Flower's run config, whose keys are the field names with ``-`` for ``_``:
``num-rounds`` is ``rounds``... see :data:`RUN_CONFIG_KEYS`), and the framework-free loop
``partition_fx.federated.simulate``. It imports no torch and no Flower: the command line's ``--help`` reads its
defaults.

Defaults follow the paper's MNIST experiments (appendix J.2) except where a CPU budget needs otherwise, each
said at its field: local SGD 0.05, server Adam 1e-3, chunk shares 0.7/0.2/0.1, Dirichlet alpha 0.1, 10
augmentation samples in training and at evaluation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._validation import check_concentration, check_int, check_positive, check_proportions, check_seed
from ..errors import PartitionArgumentError


def _key(name: str) -> str:
    return name.replace("_", "-")


PAPER_ROUNDS = 2000
"""The rounds of the paper's MNIST runs, the budget its psi learning rate (3e-3) was chosen for."""
PAPER_HYPER_LR = 3e-3


MAX_HYPER_LR_SCALE = 20.0
"""The rule's largest scale: 0.06 at 100 rounds or fewer, the largest rate measured (docs/federated.md); a
rate of 1 or more would throw every range to its bound in one step."""


def scaled_hyper_lr(rounds: int) -> float:
    """psi's server learning rate for a run of ``rounds`` rounds: the paper's 3e-3 at its 2000 rounds, scaled by
    2000 / rounds so that psi can travel as far in a short run (Adam moves a parameter by at most about its
    learning rate per step, one step per round), never below the paper's and at most 20 times it.

    >>> scaled_hyper_lr(2000), scaled_hyper_lr(100), scaled_hyper_lr(5000), scaled_hyper_lr(2)
    (0.003, 0.06, 0.003, 0.06)
    """
    check_int("rounds", rounds)
    return PAPER_HYPER_LR * min(MAX_HYPER_LR_SCALE, max(1.0, PAPER_ROUNDS / rounds))


@dataclass(frozen=True)
class FederatedConfig:
    """One federated run: data and clients, model and partitions, the rounds, the optimisers, evaluation.

    ``baseline()`` is the FedAdam baseline: the same model unpartitioned (``proportions=(1.0,)``: one chunk,
    every client uploads everything) with psi fixed (``learn_hyperparameters=False``: no augmentation,
    dropout at its initial rate), as the paper's.

    >>> config = FederatedConfig(rounds=100)
    >>> config.hyper_lr_value, config.proportions, config.baseline().partitioned
    (0.06, (0.7, 0.2, 0.1), False)
    >>> config.baseline().learn_hyperparameters
    False
    >>> FederatedConfig.from_run_config({"num-rounds": 3, "fraction-train": 0.5, "proportions": "0.9,0.1"}).rounds
    3
    >>> FederatedConfig(fraction_train=0)
    Traceback (most recent call last):
    ...
    partition_fx.errors.PartitionArgumentError: fraction-train must be in (0, 1], got 0
    """

    data: str = "rotdigits"
    """A bundled image dataset (``partition_fx.datasets``); rotated digits are skewed over rotation bins."""
    image_size: int = 16
    """Images are resized to this square (the paper's MNIST is 28; the bundled digits are 8x8)."""
    model: str = "cnn"
    """``cnn``: the MNIST CNN of the paper's table 9 with learned dropout; or a model of the registry
    (``partition_fx.models.build_model``) without running statistics, e.g. ``cifar_wrn16_4_gn``."""
    clients: int = 100
    alpha: float = 0.1
    """Dirichlet concentration of the clients' skew (over labels, or 10 rotation bins for rotated data)."""
    proportions: tuple[float, ...] = (0.7, 0.2, 0.1)
    """Each partition's share of the parameters and of the clients (their chunks), appendix J.1."""
    rounds: int = 30
    fraction_train: float = 1.0
    """The share of the clients sampled for training each round (Flower's ``fraction_train``)."""
    fraction_evaluate: float = 0.0
    """The share of the clients sampled each round to evaluate the server's model on their own test share."""
    local_epochs: int = 1
    lr: float = 0.05
    """Clients' SGD learning rate (the paper's)."""
    batch_size: int = 64
    server_lr: float = 1e-3
    """Server FedAdam learning rate of the partitions (the paper's MNIST value)."""
    hyper_lr: float | None = None
    """Server Adam learning rate of psi; None: :func:`scaled_hyper_lr` of ``rounds``."""
    rotation_init: float = math.pi / 2
    """Where the learned rotation range starts (radians). Not the paper's 0: with symmetric noise 0 is a
    stationary point of the rotation's gradient, and a start at 0.5 fell to 0.04 in 20 rounds on rotdigits
    while a start at pi/2 rose; docs/federated.md has the measurements."""
    samples: int = 10
    """Augmentation samples per example in training (the paper's 10)."""
    test_samples: int = 10
    """Fixed transforms the server's test evaluation averages over (the paper's 10; 1: none)."""
    learn_hyperparameters: bool = True
    """False: psi fixed at the baseline's values (no augmentation, dropout at 0.1), partitioned or not."""
    evaluate_every: int = 5
    """Rounds between the server's test evaluations (and after the last)."""
    out: str = ""
    """Where the Flower server app writes ``history.json`` and ``model.safetensors`` ('': nowhere)."""
    seed: int = 0
    """Seeds the clients' split and chunks (client-side too: every client computes the same split), the
    partition layout, the model, and each client's noise per round."""

    def __post_init__(self) -> None:
        for name in ("image_size", "clients", "rounds", "local_epochs", "batch_size", "samples", "test_samples",
                     "evaluate_every"):  # fmt: skip
            check_int(_key(name), getattr(self, name))
        if self.image_size % 4:
            raise PartitionArgumentError(f"image-size must be a multiple of 4, got {self.image_size}")
        for name, lowest_open in (("fraction_train", True), ("fraction_evaluate", False)):
            value = getattr(self, name)
            low_ok = value > 0 if lowest_open else value >= 0
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and value <= 1):
                raise PartitionArgumentError(
                    f"{_key(name)} must be in {'(0' if lowest_open else '[0'}, 1], got {value}"
                )
        for name in ("lr", "server_lr"):
            check_positive(_key(name), getattr(self, name))
        if self.hyper_lr is not None:
            check_positive("hyper-lr", self.hyper_lr)
        if not (isinstance(self.rotation_init, (int, float)) and math.isfinite(self.rotation_init)):
            raise PartitionArgumentError(f"rotation-init must be a finite number, got {self.rotation_init!r}")
        check_concentration(self.alpha, option="alpha")
        object.__setattr__(self, "proportions", check_proportions(tuple(self.proportions), len(self.proportions)))
        if any(p <= 0 for p in self.proportions):
            raise PartitionArgumentError(
                f"proportions must all be > 0 (every chunk needs clients), got {self.proportions}"
            )
        check_seed("seed", self.seed)
        if not isinstance(self.model, str) or not self.model:
            raise PartitionArgumentError(f"model must be 'cnn' or a model name, got {self.model!r}")

    @property
    def hyper_lr_value(self) -> float:
        """psi's learning rate: ``hyper_lr``, or the rule's for these rounds."""
        return scaled_hyper_lr(self.rounds) if self.hyper_lr is None else self.hyper_lr

    def baseline(self) -> FederatedConfig:
        """The FedAdam baseline of this run: unpartitioned, psi fixed, everything else the same."""
        return dataclasses.replace(self, learn_hyperparameters=False, proportions=(1.0,))

    @property
    def partitioned(self) -> bool:
        """Whether the model has more than one partition (the baseline has one)."""
        return len(self.proportions) > 1

    def run_config(self) -> dict[str, Any]:
        """As Flower's run config (``[tool.flwr.app.config]``): scalar values, proportions as text, no None, no
        ``clients`` (a federation's clients are its SuperNodes)."""
        config: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or field.name == "clients":  # the federation's size, not the app's
                continue
            config[_key(field.name)] = ",".join(map(str, value)) if field.name == "proportions" else value
        return config

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FederatedConfig:
        """The run's config from Flower's run config: keys as :meth:`run_config`'s (``num-rounds`` also names
        ``rounds``, as Flower's templates do); unknown keys are refused, naming the known ones."""
        names = {_key(field.name): field for field in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in run_config.items():
            key = "rounds" if key == "num-rounds" else key
            if key == "clients":
                raise PartitionArgumentError(
                    "run config key 'clients': the number of clients is the federation's; set num-supernodes "
                    '(flwr run ... --federation-config "num-supernodes=50")'
                )
            if key not in names:
                raise PartitionArgumentError(f"unknown run config key {key!r}; known: {', '.join(sorted(names))}")
            if key == "proportions":
                value = tuple(float(p) for p in str(value).split(","))
            elif names[key].type.startswith("float") and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # TOML's 1 for 1.0 (field types are the annotations' text here)
            values[names[key].name] = value
        return cls(**values)


RUN_CONFIG_KEYS = tuple(_key(f.name) for f in dataclasses.fields(FederatedConfig) if f.name != "clients")
"""Flower run config keys (``flwr run --run-config "rounds=5 data='digits'"``)."""


__all__ = ["RUN_CONFIG_KEYS", "FederatedConfig", "scaled_hyper_lr"]
