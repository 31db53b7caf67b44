"""``FederatedConfig``: every setting of a federated run in one place, with one set of defaults.

The same object configures ``partition-fx federated`` (built from its options), the Flower app of
``examples/flower_app`` (built from Flower's run config, whose keys are the field names with ``-`` for ``_``:
``num-rounds`` is ``rounds``... see :data:`RUN_CONFIG_KEYS`), and the framework-free loop
``partition_fx.federated.simulate``. Each field is declared once below with :func:`~partition_fx.job.settings.setting`
(default, help, bounds), as :class:`~partition_fx.job.train_config.TrainConfig`'s are, and from there come the
checks, ``to_dict``/``from_dict``, the run config's keys and the command's options (``--fraction-train``). It
imports no torch and no Flower: the command line's ``--help`` reads its defaults.

Defaults are a regime where federated training converges on one CPU thread in minutes (docs/federated.md has
the measurements): 20 clients, 200 rounds of one local epoch, server Adam 3e-3, one augmentation sample per
example; the paper's MNIST settings (appendix J.2) where they fit it: local SGD 0.05, chunk shares 0.7/0.2/0.1,
Dirichlet alpha 0.1, 10 test-time augmentations. The paper's own scale is a ``--config`` file away
(``examples/federated_paper.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._validation import check_concentration, check_int, check_proportions, check_real
from ..errors import PartitionArgumentError
from ..job.settings import SettingError, Settings, setting

PAPER_ROUNDS = 2000
"""The rounds of the paper's MNIST runs, the budget its psi learning rate (3e-3) was chosen for."""
PAPER_HYPER_LR = 3e-3


NO_PROGRESS_GATE = 100.0
"""A ``warmup_progress`` that admits any model (100 times chance's negative log-likelihood): runs recorded before
the rule had none."""

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


def _concentration(name: str, alpha: Any) -> float:
    """alpha's one check (``dirichlet_split``'s and the command line's too)."""
    return check_concentration(alpha, option=name)


def _shares(name: str, proportions: Any) -> tuple[float, ...]:
    """C positive shares summing to 1: every chunk needs clients."""
    shares = check_proportions(tuple(proportions), len(proportions))
    if any(p <= 0 for p in shares):
        raise PartitionArgumentError(f"{name} must all be > 0 (every chunk needs clients), got {shares}")
    return shares


@dataclass(frozen=True)
class FederatedConfig(Settings):
    """One federated run: data and clients, model and partitions, the rounds, the optimisers, evaluation.

    ``baseline()`` is the FedAdam baseline: the same model unpartitioned (``proportions=(1.0,)``: one chunk,
    every client uploads everything) with psi fixed (``learn_hyperparameters=False``: no augmentation,
    dropout at its initial rate), as the paper's.

    >>> config = FederatedConfig(rounds=100)
    >>> config.hyper_lr_value, config.proportions, config.baseline().partitioned
    (0.06, (0.7, 0.2, 0.1), False)
    >>> config.baseline().learn_hyperparameters, FederatedConfig.from_dict(config.to_dict()) == config
    (False, True)
    >>> FederatedConfig.from_run_config({"num-rounds": 3, "fraction-train": 0.5, "proportions": "0.9,0.1"}).rounds
    3
    >>> FederatedConfig(fraction_train=0)
    Traceback (most recent call last):
    ...
    partition_fx.job.settings.SettingError: fraction-train must be in (0, 1], got 0
    """

    hyphenated = True  # refusals name the run config's keys: fraction-train

    data: str = setting(
        "rotdigits",
        "a bundled image dataset (nothing downloaded); rotated digits are skewed over 10 rotation bins, others by "
        "label",
    )
    image_size: int = setting(
        16, "images are resized to this square, a multiple of 4", minimum=8, metavar="PIXELS"
    )  # at least 8: the data's own loaders take no smaller images
    """The paper's MNIST is 28; the bundled digits are 8x8."""
    model: str = setting(
        "cnn",
        "'cnn' (the paper's MNIST CNN with learned dropout) or a registry model without BatchNorm, e.g. "
        "cifar_wrn16_4_gn",
        metavar="NAME",
    )
    clients: int = setting(20, "clients", minimum=1, metavar="N")
    """The paper's 100 hold 600 MNIST images each; the 1438 bundled digits over 100 clients are 14 each, too few
    for a round of local work to point anywhere."""
    alpha: float = setting(
        0.1,
        "Dirichlet concentration of the clients' skew; 0.1: most hold one group",
        metavar="A",
        validator=_concentration,
    )
    proportions: tuple[float, ...] = setting(
        (0.7, 0.2, 0.1),
        "each partition's share of the parameters and of the clients (their chunks), C positive numbers summing to 1",
        validator=_shares,
        command_line=False,  # the command's --proportions goes with its --partitions
    )
    rounds: int = setting(200, "communication rounds", minimum=1, metavar="R")
    """Where FedAdam without augmentation has levelled off (rotated digits, seed 0, validation accuracy: 0.88 at
    100 rounds, 0.90 at 200) and augmentation pays (rotation fixed at pi: 0.88 at 100, 0.95 at 200)."""
    finetune_fraction: float = setting(
        0.4,
        "this last share of the rounds fine-tunes the final model: every client trains every partition at once "
        "on all its data, psi frozen (one FedAdam, as the baseline's); 0: none",
        maximum=1.0,
        metavar="F",
        absent_means=0.0,  # runs recorded before fine-tuning rounds existed had none
    )
    """As the central path's ``finetune_fraction`` (the paper's Table 2): partitioning trains 70% of the weights
    through subnetwork 1 only, on the chunk-1 clients' data; the final rounds train the final model on every
    client's."""
    validation: float = setting(
        0.0,
        "share of each client's training examples it keeps aside, untrained on, to choose settings by: the "
        "server's curve then records the accuracy on them (validation-accuracy); 0: none",
        maximum=0.5,
        metavar="F",
        absent_means=0.0,
    )
    """A federation's validation data is its clients' own: the accuracy on the union of their shares is the
    example-weighted mean of their local accuracies, what a federated evaluation reports. The benchmark
    chooses every arm's settings by it and reads the test split only for the chosen ones."""
    fraction_train: float = setting(
        1.0, "share of the clients sampled to train each round, as Flower's", positive=True, maximum=1.0, metavar="F"
    )
    fraction_evaluate: float = setting(
        0.0,
        "share of the clients sampled each round to evaluate the server's model on their own test share",
        maximum=1.0,
        metavar="F",
    )
    local_epochs: int = setting(1, "clients' epochs per round", minimum=1, metavar="E")
    lr: float = setting(0.05, "clients' SGD step", positive=True, metavar="LR")
    """The clients' SGD learning rate: the paper's."""
    batch_size: int = setting(32, "clients' minibatch", minimum=1, metavar="N")
    server_lr: float = setting(3e-3, "server FedAdam learning rate, both runs", positive=True, metavar="LR")
    """Of the partitions. Adam moves a weight by about its rate per round whatever the clients sent, so the rate
    sets how far a run can travel: the paper's 1e-3 was chosen for 2000 rounds; 3e-3 is the baseline's best on the
    clients' validation shares on 5 of 6 seeds of both data sets, from 1e-3, 3e-3 and 1e-2 widened past any edge
    that wins (benchmarks/federated.py); 1e-2 diverged to chance on 3 of 6."""
    hyper_lr: float | None = setting(
        None,
        "server Adam learning rate of psi",
        positive=True,
        metavar="LR",
        default_text="the paper's 3e-3 x 2000 / --rounds, between 3e-3 and 0.06",
    )
    """None: :func:`scaled_hyper_lr` of ``rounds``."""
    warmup_fraction: float = setting(
        0.2,
        "this first share of the rounds takes no psi step: the model learns first (psi's gradient through an "
        "untrained model is noise, which Adam turns into full steps)",
        maximum=1.0,
        metavar="F",
        absent_means=0.0,
    )
    """The central path's ``warmup_steps``, in rounds; the clients send no psi gradient in them. Without it, on
    digits, the translation ranges ran to their bound (half the image) in 20 rounds and held the model at chance.
    It is the warm-up's least length: psi starts only once the model has learned (``warmup_progress``)."""
    warmup_progress: float = setting(
        0.5,
        "psi takes its first step only once the model has learned: the negative log-likelihood per example of the "
        "psi-sending clients' own images, unaugmented, through the subnetworks that never trained on them, at most "
        "this share of chance's (the log of the classes); a large value (100) admits any model, as runs without "
        "this rule",
        positive=True,
        metavar="F",
        absent_means=NO_PROGRESS_GATE,
    )
    """A fixed share of the rounds is no measure of progress: at 40 rounds (warm-up 8) the model was at 0.145
    when psi began, the ranges ran to their bounds on the gradients of a model that had learned nothing, and the
    final model ended at chance (digits, seed 0). The measure is the model's, not the augmented evidence's: on upright
    digits the evidence under psi's start (a rotation of pi/2) stays above chance's for 200 rounds, though it is
    exactly what tells psi to narrow the rotation."""
    min_psi_fraction: float = setting(
        0.2,
        "psi needs this share of the rounds to learn in: if the model has still not learned that many rounds "
        "before fine-tuning would begin, fine-tuning begins there, with psi as the baseline's (no augmentation), "
        "and the run says so; 0: psi may start until fine-tuning",
        maximum=1.0,
        metavar="F",
        absent_means=0.0,
    )
    """A range psi never moved is its start, which no evidence chose (the rotation's pi/2 is a start to learn from,
    not a guess of the truth): a run too short to learn anything fine-tunes as the baseline trains."""
    rotation_init: float = setting(
        math.pi / 2,
        "where the learned rotation range starts (or stays, psi fixed), in radians; at 0 it cannot move, so the "
        "default is pi/2",
        metavar="RAD",
        validator=check_real,
    )
    """Not the paper's 0: with symmetric noise 0 is a stationary point of the rotation's gradient, and a start at
    0.5 fell to 0.04 in 20 rounds on rotdigits while a start at pi/2 rose; docs/federated.md has the
    measurements."""
    samples: int = setting(1, "augmentation samples per example in training (the paper's 10)", minimum=1, metavar="S")
    """One, as the central path draws: each local epoch draws new ones; 10 cost 10 times the compute."""
    test_samples: int = setting(
        10, "fixed augmentations the test evaluation averages over, 1 for none, the paper's", minimum=1, metavar="S"
    )
    learn_hyperparameters: bool = setting(
        True,
        "False: psi fixed (the rotation range at --rotation-init, no other augmentation, dropout at 0.1), "
        "partitioned or not",
        command_line=False,
    )
    evaluate_every: int = setting(10, "rounds between test evaluations of the learning curve", minimum=1, metavar="R")
    """The server evaluates every this many rounds, and after the last."""
    out: str = setting(
        "",
        "where the Flower server app writes history.json and model.safetensors ('': nowhere)",
        command_line=False,  # the command's --out is its own report's
    )
    seed: int = setting(
        0, "seeds the clients' data and chunks, the partition layout and the model", seed=True, metavar="N"
    )
    """Client-side too (every client computes the same split), and each client's noise per round."""

    def check(self) -> None:
        fields = self.keywords()
        if self.image_size % 4:
            raise SettingError(fields["image_size"], f"must be a multiple of 4, got {self.image_size}")
        if not self.model:
            raise SettingError(fields["model"], f"must be 'cnn' or a model name, got {self.model!r}")

    @property
    def hyper_lr_value(self) -> float:
        """psi's learning rate: ``hyper_lr``, or the rule's for these rounds."""
        return scaled_hyper_lr(self.rounds) if self.hyper_lr is None else self.hyper_lr

    def baseline(self, rotation: float = 0.0) -> FederatedConfig:
        """The FedAdam baseline of this run: unpartitioned, psi fixed (dropout at its initial rate, the rotation
        range at ``rotation``: 0, no augmentation; pi, every angle, the oracle on rotated digits), everything else
        the same.

        >>> FederatedConfig().baseline(rotation=3.0).rotation_init, FederatedConfig().baseline().partitioned
        (3.0, False)
        """
        return self.replace(learn_hyperparameters=False, proportions=(1.0,), rotation_init=rotation)

    @property
    def finetune_rounds(self) -> int:
        """The last rounds that fine-tune: ``finetune_fraction`` of ``rounds``, rounded down.

        >>> FederatedConfig(rounds=50, finetune_fraction=0.4).finetune_rounds
        20
        """
        return int(self.rounds * self.finetune_fraction)

    @property
    def warmup_rounds(self) -> int:
        """The first rounds that take no psi step: ``warmup_fraction`` of ``rounds``, rounded down."""
        return int(self.rounds * self.warmup_fraction)

    @property
    def psi_deadline(self) -> int | None:
        """The last round psi may begin at and still step ``min_psi_fraction`` of the rounds before fine-tuning
        begins (None without fine-tuning rounds: nothing to end early into).

        >>> FederatedConfig(rounds=40).psi_deadline  # rounds 17..24 are psi's 8; fine-tuning from round 25
        17
        """
        if not self.finetune_rounds:
            return None
        return self.rounds - self.finetune_rounds - int(self.rounds * self.min_psi_fraction) + 1

    @property
    def partitioned(self) -> bool:
        """Whether the model has more than one partition (the baseline has one)."""
        return len(self.proportions) > 1

    def run_config(self) -> dict[str, Any]:
        """As Flower's run config (``[tool.flwr.app.config]``): scalar values, proportions as text, no None, no
        ``clients`` (a federation's clients are its SuperNodes)."""
        config: dict[str, Any] = {}
        for field in self.fields():
            value = getattr(self, field.keyword)
            if value is None or field.keyword == "clients":  # the federation's size, not the app's
                continue
            config[field.key] = ",".join(map(str, value)) if field.keyword == "proportions" else value
        return config

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FederatedConfig:
        """The run's config from Flower's run config: keys as :meth:`run_config`'s (``num-rounds`` also names
        ``rounds``, as Flower's templates do; TOML's 1 for 1.0 is read as the float); unknown keys are refused,
        naming the known ones."""
        fields = {field.key: field for field in cls.fields()}
        values: dict[str, Any] = {}
        for key, value in run_config.items():
            key = "rounds" if key == "num-rounds" else key
            if key == "clients":
                raise PartitionArgumentError(
                    "run config key 'clients': the number of clients is the federation's; set num-supernodes "
                    '(flwr run ... --federation-config "num-supernodes=50")'
                )
            if key not in fields:
                raise PartitionArgumentError(f"unknown run config key {key!r}; known: {', '.join(sorted(fields))}")
            if key == "proportions":
                value = tuple(float(p) for p in str(value).split(","))
            values[fields[key].keyword] = value
        return cls(**values)


RUN_CONFIG_KEYS = tuple(f.key for f in FederatedConfig.fields() if f.keyword != "clients")
"""Flower run config keys (``flwr run --run-config "rounds=5 data='digits'"``)."""


__all__ = ["NO_PROGRESS_GATE", "RUN_CONFIG_KEYS", "FederatedConfig", "scaled_hyper_lr"]
