"""Hooks: code the trainer runs after each evaluation, when fine-tuning begins and at the end of a run
(checkpoints, reports)."""

from __future__ import annotations

from typing import Any


class TrainingHook:
    """Override any method; the trainer calls them in the order the hooks were added to ``trainer.hooks``.

    Example::

        >>> class Count(TrainingHook):
        ...     evaluations = 0
        ...     def after_evaluation(self, trainer, record, improved):
        ...         self.evaluations += 1
        >>> Count().after_run(None, None)  # the other methods do nothing
    """

    def after_evaluation(self, trainer: Any, record: dict[str, Any], improved: bool) -> None:
        """After an evaluation's ``record`` joined ``trainer.history``; ``improved``: a new best LML."""

    def before_finetuning(self, trainer: Any) -> None:
        """When partitioned training ends and fine-tuning begins (``trainer.history[-1]`` is the last
        partitioned evaluation); on a resumed run it may run again for the same state."""

    def after_run(self, trainer: Any, result: Any) -> None:
        """After a run ended (``result``: its ``FitResult``), with the model in the state the run returns:
        the best state restored if asked, BatchNorm statistics recalibrated."""
