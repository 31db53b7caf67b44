"""The hook that keeps a run recoverable and exportable: its checkpoint files and its resume directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._io import link_file
from .hooks import TrainingHook
from .resume import save_training_state


class CheckpointWriter(TrainingHook):
    """Keeps a run recoverable and exportable under ``directory`` (``trainer.hooks``; ``fit`` adds one for
    ``checkpoint_dir``).

    After each evaluation: ``last.safetensors``; ``best.safetensors`` when the LML improved (a hard link to
    ``last``, so no second copy on disk); the resume directory ``resume/``; ``trainer.last_checkpoint_step``.
    Their BatchNorm statistics are training's (``norm_statistics: "training"``).

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
        >>> trainer.last_checkpoint_step
        2
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def after_evaluation(self, trainer: Any, record: dict[str, Any], improved: bool) -> None:
        last = self.directory / "last.safetensors"
        trainer.save_checkpoint(last)
        if improved:
            link_file(last, self.directory / "best.safetensors")
        save_training_state(trainer, self.directory / "resume")
        trainer.last_checkpoint_step = trainer.step

    def after_run(self, trainer: Any, result: Any) -> None:
        last, best = self.directory / "last.safetensors", self.directory / "best.safetensors"
        calibrated = bool(result.recalibrated_norms)
        trainer.save_checkpoint(last, final=True, norm_statistics="final" if calibrated else None)
        if not calibrated or trainer.best is None:
            return  # no statistics to calibrate (or not asked to): the evaluation's best file is the best state
        score, step, _ = trainer.best
        if not trainer.best_is_current():
            trainer.save_checkpoint(best, best=(score, step, trainer.recalibrated_best()), norm_statistics="final")
        elif step == trainer.step:
            link_file(last, best)  # the same state: no second copy on disk
        else:  # the run restored the best state and recalibrated it: last's tensors with the best's step and LML
            trainer.save_checkpoint(
                best, final=True, norm_statistics="final", best=(score, step, trainer.module_states())
            )
