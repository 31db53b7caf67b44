"""What a partitioned training run returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class FitResult:
    """What ``fit`` returns; ``to_dict()`` is plain JSON."""

    lml: float
    """The final LML estimate (nats, summed over the training set), of the returned model."""
    history: list[dict[str, Any]]
    """Per evaluation: ``step``, ``phase`` (``partitioned`` or ``finetune``; no LML in the latter), ``lml``,
    ``lml_per_chunk``, ``lml_per_example``, ``conditional_lml`` (the sum over chunks 2..C, see
    ``LMLEstimate.conditional``), ``conditional_lml_per_example`` (over the examples of chunks 2..C),
    ``train_loss`` (mean
    parameter-step loss since the last evaluation), ``hyper_loss``, ``hyperparameters``, ``seconds``."""
    conditional_lml: float | None
    """The final estimate of log p(D_2:C | D_1, psi): the LML without its chunk-1 term (None when C = 1)."""
    hyperparameters: dict[str, Any]
    """Name -> value (plain floats/lists), e.g. ``{"rotation": 2.9, ...}`` (radians)."""
    steps: int
    best_step: int
    """The iteration of the best evaluation: the highest conditional LML (the full LML when C = 1; see
    ``PartitionedTrainer.selection_score``)."""
    best_lml: float
    """The full LML of the best evaluation."""
    stopped_early: bool
    chunk_sizes: list[int]
    seconds: float
    skipped_steps: int = 0
    recalibrated_norms: int = 0
    """BatchNorm modules whose running statistics were recomputed for the final subnetwork at the end."""
    best_conditional_lml: float | None = None
    """The conditional LML of the best evaluation, which chose it."""
    finetune_start: int | None = None
    """The iteration fine-tuning began at (``fit(..., finetune_steps=...)``), or None: no fine-tuning. The
    ``lml``s are then those of partitioned training (its last or, with ``restore_best``, best evaluation)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
