"""What a run calls around its evaluations: the hook protocol (:class:`TrainingHook`), a run's ``callbacks=`` as a
hook, and the policies that come with the package, each holding its own rule and state: writing checkpoints
(:class:`CheckpointWriter`), the best state by its evidence (:class:`BestState`) and the early stopping rule
(:class:`Patience`, whose decision the run's schedule applies).

Every hook and callback takes the run's :class:`~partition_fx.training.objective.lml.EvaluationRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._io import link_file
from ...errors import PartitionArgumentError
from ..checkpoint import save_training_state
from ..objective.lml import EvaluationRecord, evidence, recalibrated_states
from ..objective.objective import ModuleStates

if TYPE_CHECKING:
    from .trainer import FitResult, PartitionedTrainer

Callback = Callable[["PartitionedTrainer", EvaluationRecord], "bool | None"]
"""``cb(trainer, record)`` after each evaluation (``trainer``: the ``PartitionedTrainer``); True stops training."""


class TrainingHook:
    """Override any method; the trainer calls them in the order the hooks were added to ``trainer.hooks``.

    A hook that holds state a resumed run needs keeps it itself: :meth:`state_dict` goes into the run's resume
    directory with the trainer's own state, under the hook's :attr:`state_key`, and :meth:`load_state_dict`
    gets it back when the run resumes, before :meth:`before_run`.

    Example::

        >>> class Count(TrainingHook):
        ...     def __init__(self):
        ...         self.evaluations = 0
        ...     def after_evaluation(self, trainer, record, improved):
        ...         self.evaluations += 1
        ...     def state_dict(self):
        ...         return {"evaluations": self.evaluations}
        ...     def load_state_dict(self, state):
        ...         self.evaluations = state["evaluations"]
        >>> Count().before_run(None); Count().after_run(None, None)  # the other methods do nothing
        >>> Count().should_stop(None, {}), Count().state_key
        (False, 'Count')
    """

    @property
    def state_key(self) -> str:
        """The name the hook's state is saved under: its class's name (override it to give two hooks of one
        class that both hold state their own)."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this hook, as JSON-ready values; ``{}`` (the default): nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, when a run resumes from a state saved with it."""

    def before_run(self, trainer: PartitionedTrainer) -> None:
        """When the training loop starts, after a resumed run's state was loaded: from here on the run is under
        way (what failed before it, such as a refused resume, changed nothing)."""

    def after_evaluation(self, trainer: PartitionedTrainer, record: EvaluationRecord, improved: bool) -> None:
        """After an evaluation's ``record`` joined ``trainer.history``; ``improved``: a new best state
        (:class:`BestState`)."""

    def should_stop(self, trainer: PartitionedTrainer, record: EvaluationRecord) -> bool:
        """Asked by the training loop after each evaluation (after every hook's ``after_evaluation`` and the
        progress output), in order until one says True: whether to end the run now."""
        return False

    def before_finetuning(self, trainer: PartitionedTrainer) -> None:
        """When partitioned training ends and fine-tuning begins (``trainer.history[-1]`` is the last
        partitioned evaluation); on a resumed run it may run again for the same state."""

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        """After a run ended (``result``: its ``FitResult``), with the model in the state the run returns:
        the best state restored if asked, BatchNorm statistics recalibrated."""


def hook_states(hooks: Sequence[TrainingHook]) -> dict[str, dict[str, Any]]:
    """The states of the ``hooks`` that hold one, by :attr:`TrainingHook.state_key` (what a resume directory keeps
    of them); two hooks holding state under one key are refused.

    >>> class Seen(TrainingHook):
    ...     def state_dict(self):
    ...         return {"seen": 1}
    >>> hook_states([Seen(), TrainingHook()])
    {'Seen': {'seen': 1}}
    """
    states: dict[str, dict[str, Any]] = {}
    for hook in hooks:
        state = hook.state_dict()
        if not state:
            continue
        if hook.state_key in states:
            raise PartitionArgumentError(
                f"two hooks hold state under the state_key {hook.state_key!r}; give each its own (override "
                "TrainingHook.state_key)"
            )
        states[hook.state_key] = state
    return states


def load_hook_states(hooks: Sequence[TrainingHook], saved: dict[str, dict[str, Any]]) -> None:
    """Give each of ``hooks`` its state in ``saved`` (:func:`hook_states`' form), if it has one there."""
    for hook in hooks:
        if hook.state_key in saved:
            hook.load_state_dict(saved[hook.state_key])


class CallbackHook(TrainingHook):
    """A run's ``callbacks=`` as a hook: after each evaluation each ``cb(trainer, record)`` is called in order,
    and the first one to return True ends the run (the later ones are not called for that evaluation). The
    training loop asks it after the trainer's own hooks.

    Example::

        >>> calls = []
        >>> hook = CallbackHook([lambda trainer, record: calls.append(record["step"]), lambda t, r: r["step"] >= 4])
        >>> hook.should_stop(None, {"step": 2}), hook.should_stop(None, {"step": 4}), calls
        (False, True, [2, 4])
    """

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = tuple(callbacks)

    def should_stop(self, trainer: PartitionedTrainer, record: EvaluationRecord) -> bool:
        return any(bool(cb(trainer, record)) for cb in self.callbacks)


class BestState:
    """The best evaluation of a run and the module states it had: the rule that picks it and what it keeps, in
    one place (as timm's ``CheckpointSaver`` holds its own). The best is the partitioned evaluation with the
    highest evidence (``training.objective.lml.evidence``); with one partition, which has none, the latest. The trainer
    asks it at each evaluation (:meth:`consider`), before its hooks, which get whether it improved; it restores it
    (``restore_best``), and saves and loads it with its own state.

    >>> best = BestState()
    >>> record = {"step": 2, "lml": -9.0, "conditional_lml": -3.0}
    >>> best.consider(record, lambda: {}), best.consider({**record, "step": 4, "conditional_lml": -4.0}, dict)
    (True, False)
    >>> best.step, best.score
    (2, -3.0)
    """

    def __init__(self) -> None:
        self.score: float | None = None
        """The evidence of the best evaluation (None: none yet, or one partition)."""
        self.step: int | None = None
        """Its step (None: no partitioned evaluation yet)."""
        self.states: ModuleStates | None = None
        """The modules' states it had (copies)."""

    def consider(self, record: EvaluationRecord, states: Callable[[], ModuleStates]) -> bool:
        """Whether ``record`` is the best so far; if so, it keeps its step, score and ``states()``."""
        if record.get("lml") is None:  # fine-tuning estimates no LML
            return False
        score = evidence(record)
        if score is None:  # one partition: no evidence, the latest state stands
            improved = True
        else:
            improved = self.step is None or self.score is None or score > self.score
        if improved:
            self.score, self.step, self.states = score, record["step"], states()
        return improved

    def state_dict(self) -> dict[str, Any]:
        """Its score and step, and (``modules``) the states, as a trainer's state holds them."""
        found = self.step is not None
        return {
            "best": {"score": self.score, "step": self.step} if found else None,
            "best_modules": self.states if found else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["best"] is not None:
            self.score, self.step, self.states = state["best"]["score"], state["best"]["step"], state["best_modules"]


class Patience:
    """The run's early stopping rule: partitioned training has run out of patience once ``patience`` evaluations
    have passed without a better state (:class:`BestState`; None: never). It decides and the run's schedule
    applies the decision (``Schedule.end_partitioned_training``): the fine-tuning the run plans begins now and
    runs to the end, or a run that plans none ends here. The trainer asks it at each partitioned evaluation,
    before its hooks, so that the checkpoint written there holds the decision.

    >>> history = [{"step": s} for s in (2, 4, 6)]
    >>> Patience(2).exhausted(history, best_step=2), Patience(3).exhausted(history, best_step=2)
    (True, False)
    >>> Patience(None).exhausted(history, best_step=2)
    False
    """

    def __init__(self, patience: int | None) -> None:
        self.patience = patience

    def exhausted(self, history: Sequence[EvaluationRecord], best_step: int | None) -> bool:
        """Whether the evaluations in ``history`` after the best one (at ``best_step``) number ``patience``."""
        if self.patience is None or best_step is None:
            return False
        best = next(i for i, r in enumerate(history) if r["step"] == best_step)
        return len(history) - 1 - best >= self.patience


class CheckpointWriter(TrainingHook):
    """Keeps a run recoverable and exportable under ``directory`` (``trainer.hooks``; ``fit`` adds one for
    ``checkpoint_dir``).

    After each evaluation: ``last.safetensors``; ``best.safetensors`` when the state improved (a hard link to
    ``last``, so no second copy on disk); the resume directory ``resume/``; the stepper's
    ``last_checkpoint_step``. Their BatchNorm statistics are training's (``norm_statistics: "training"``).

    At the end of a run: ``last.safetensors`` again, with the state the run returns (BatchNorm statistics
    recalibrated for the final subnetwork, the best state if restored), so an export of it reproduces the
    run's reported test accuracy; and, when the run recalibrated its statistics, ``best.safetensors`` again
    with the best evaluation's state recalibrated the same way (``norm_statistics: "final"``): a hard link to
    ``last`` when that is the same state, else one more recalibration pass, on a copy of the model.

    Example::

        >>> import tempfile, torch
        >>> from partition_fx import partitionify
        >>> from partition_fx.training import PartitionedTrainer
        >>> x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (x, y), batch_size=8)
        >>> trainer.hooks.append(CheckpointWriter(tempfile.mkdtemp()))
        >>> _ = trainer.run(2, progress=False)
        >>> trainer.steps.stepper.last_checkpoint_step
        2
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def after_evaluation(self, trainer: PartitionedTrainer, record: EvaluationRecord, improved: bool) -> None:
        last = self.directory / "last.safetensors"
        trainer.save_checkpoint(last)
        if improved:
            link_file(last, self.directory / "best.safetensors")
        save_training_state(trainer, self.directory / "resume")
        trainer.steps.stepper.last_checkpoint_step = trainer.step  # a non-finite error says it is kept

    def after_run(self, trainer: PartitionedTrainer, result: FitResult) -> None:
        last, best = self.directory / "last.safetensors", self.directory / "best.safetensors"
        calibrated = bool(result.recalibrated_norms)
        trainer.save_checkpoint(last, final=True, norm_statistics="final" if calibrated else None)
        kept = trainer.best
        if not calibrated or kept.states is None:
            return  # no statistics to calibrate (or not asked to): the evaluation's best file is the best state
        objective = trainer.steps.objective
        if not objective.is_current(kept.states):
            recalibrated = recalibrated_states(
                trainer.pmodel,
                kept.states,
                trainer.examples,
                trainer.config.evaluation.batch_size,
                trainer.steps.device,
            )
            trainer.save_checkpoint(best, best=(kept.score, kept.step, recalibrated), norm_statistics="final")
        elif kept.step == trainer.step:
            link_file(last, best)  # the same state: no second copy on disk
        else:  # the run restored the best state and recalibrated it: last's tensors with the best's step and LML
            trainer.save_checkpoint(
                best, final=True, norm_statistics="final", best=(kept.score, kept.step, objective.states())
            )
