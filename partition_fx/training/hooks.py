"""Hooks: code the trainer runs after each evaluation, when fine-tuning begins and at the end of a run
(checkpoints, reports), and that may end a run early. The one extension mechanism of the training loop:
a run's ``callbacks=`` are a :class:`CallbackHook`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class TrainingHook:
    """Override any method; the trainer calls them in the order the hooks were added to ``trainer.hooks``.

    Example::

        >>> class Count(TrainingHook):
        ...     evaluations = 0
        ...     def after_evaluation(self, trainer, record, improved):
        ...         self.evaluations += 1
        >>> Count().before_run(None); Count().after_run(None, None)  # the other methods do nothing
        >>> Count().should_stop(None, {})
        False
    """

    def before_run(self, trainer: Any) -> None:
        """When the training loop starts, after a resumed run's state was loaded: from here on the run is under
        way (what failed before it, such as a refused resume, changed nothing)."""

    def after_evaluation(self, trainer: Any, record: dict[str, Any], improved: bool) -> None:
        """After an evaluation's ``record`` joined ``trainer.history``; ``improved``: a new best LML."""

    def should_stop(self, trainer: Any, record: dict[str, Any]) -> bool:
        """Asked by the training loop after each evaluation (after every hook's ``after_evaluation`` and the
        progress output), in order until one says True: whether to end the run now."""
        return False

    def before_finetuning(self, trainer: Any) -> None:
        """When partitioned training ends and fine-tuning begins (``trainer.history[-1]`` is the last
        partitioned evaluation); on a resumed run it may run again for the same state."""

    def after_run(self, trainer: Any, result: Any) -> None:
        """After a run ended (``result``: its ``FitResult``), with the model in the state the run returns:
        the best state restored if asked, BatchNorm statistics recalibrated."""


class CallbackHook(TrainingHook):
    """A run's ``callbacks=`` as a hook: after each evaluation each ``cb(trainer, record)`` is called in order,
    and the first one to return True ends the run (the later ones are not called for that evaluation). The
    training loop asks it last, after the trainer's own hooks.

    Example::

        >>> calls = []
        >>> hook = CallbackHook([lambda trainer, record: calls.append(record["step"]), lambda t, r: r["step"] >= 4])
        >>> hook.should_stop(None, {"step": 2}), hook.should_stop(None, {"step": 4}), calls
        (False, True, [2, 4])
    """

    def __init__(self, callbacks: Sequence[Callable[[Any, dict[str, Any]], bool | None]]) -> None:
        self.callbacks = tuple(callbacks)

    def should_stop(self, trainer: Any, record: dict[str, Any]) -> bool:
        return any(bool(cb(trainer, record)) for cb in self.callbacks)
