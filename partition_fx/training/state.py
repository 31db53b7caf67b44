"""The part of ``PartitionedTrainer`` that saves and restores it: module states, the fingerprint of a
configuration, ``state_dict()``/``load_state_dict()`` for resuming, and single-file checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PartitionCheckpointError
from .checkpoint import (
    buffers_digest,
    checkpoint_identity,
    cpu_copy,
    differences,
    load_checkpoint,
    restore_module_states,
    write_checkpoint,
)
from .lml import recalibrate_norm_statistics, running_norms


class TrainerState:
    """Mixed into ``PartitionedTrainer``: everything about its state, none of its steps. It reads the
    trainer's own attributes (``pmodel``, ``hyper``, ``likelihood``, the optimisers, sampler, history)."""

    def _modules(self) -> dict[str, nn.Module]:
        found = {"model": self.pmodel, "hyper": self.hyper, "likelihood": self.likelihood}
        return {name: m for name, m in found.items() if m is not None}

    def _omitted_buffers(self) -> dict[str, torch.Tensor]:
        """The model's buffers that checkpoints leave out: the layouts, and the defaults unless
        ``checkpoint_defaults`` (see ``PartitionedModel.rebuilt_buffers``)."""
        return self.pmodel.rebuilt_buffers(defaults=not self.config.checkpointing.defaults)

    def module_states(self, copy_values: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """The modules' state (``model``, ``hyper``, ``likelihood``) without the buffers checkpoints leave out
        (they never change); detached, and copied with ``copy_values``."""
        rebuilt = self._omitted_buffers().keys()
        states = {
            name: {k: v.detach() for k, v in m.state_dict().items() if name != "model" or k not in rebuilt}
            for name, m in self._modules().items()
        }
        return copy.deepcopy(states) if copy_values else states

    def omitted(self) -> dict[str, Any]:
        """What checkpoints of this trainer leave out of the model and the digest that recognises it:
        ``{"omitted": "layouts" or "layouts+defaults", "omitted_sha256": ...}``."""
        if self._omitted is None:
            kinds = "layouts" if self.config.checkpointing.defaults else "layouts+defaults"
            self._omitted = {"omitted": kinds, "omitted_sha256": buffers_digest(self._omitted_buffers())}
        return self._omitted

    def identity(self) -> dict[str, Any]:
        """The partitioning a checkpoint belongs to: model class, C, proportions and scheme
        (``checkpoint.checkpoint_identity``)."""
        return checkpoint_identity(self.pmodel)

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved state to resume this trainer: the partitioning, the data chunks, the
        configuration fields that change the iteration (``Option.fingerprint``), and the names and shapes of
        everything trained."""
        return {
            **self.identity(),
            **self.omitted(),
            "default": self.pmodel.default,
            "chunk_sizes": self.chunks.sizes,
            "num_examples": len(self.examples),
            **self.config.flat(fingerprint=True),
            "parameters": {name: list(p.shape) for name, p in self.pmodel.named_parameters()},
            "hyperparameters": [list(p.shape) for p in self.hyperparameters_list],
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit: the modules, both optimisers, the LR
        scheduler, the step, history and best state, and every random generator (see
        ``partition_fx.training.save_training_state`` for its form on disk)."""
        self.check_nonfinite()  # never save weights a non-finite step has updated
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        losses, hyper_losses = self.pending_losses()
        return {
            "step": self.step,
            "history": self.history,
            "best": None if self.best is None else {"score": self.best[0], "step": self.best[1]},
            "best_modules": None if self.best is None else self.best[2],
            "skipped_steps": self.skipped_steps,
            "pending_losses": losses,
            "pending_hyper_losses": hyper_losses,
            "grad_scaler": self.precision.state_dict(),
            "modules": self.module_states(),
            "optimizer": self.optimizer.state_dict(),
            "hyper_optimizer": self.hyper_optimizer.state_dict() if self.hyper_optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "hyper_scheduler": self.hyper_scheduler.state_dict() if self.hyper_scheduler is not None else None,
            "finetune_start": self.finetune_start,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if cuda else [],
                "sampler": self.sampler.state_dict(),
                "lml": self._lml_generator.get_state(),
            },
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "the state") -> None:
        """Restore what :meth:`state_dict` returned; a state from another configuration is refused, naming
        ``source`` and every field that differs, before anything changes."""
        differ = differences(state["fingerprint"], self.fingerprint())
        if differ:
            raise PartitionCheckpointError(f"{source} is from a different configuration ({differ})")
        self.restore_modules(state["modules"], source)
        if self.hyper_optimizer is not None and state["hyper_optimizer"] is not None:
            self.hyper_optimizer.load_state_dict(state["hyper_optimizer"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.hyper_scheduler is not None and state["hyper_scheduler"] is not None:
            self.hyper_scheduler.load_state_dict(state["hyper_scheduler"])
        self.finetune_start = state["finetune_start"]
        self.step = state["step"]
        self.history = state["history"]
        self.skipped_steps = state["skipped_steps"]
        self._losses = [torch.tensor(v) for v in state["pending_losses"]]
        self._hyper_losses = [torch.tensor(v) for v in state["pending_hyper_losses"]]
        self.precision.load_state_dict(state["grad_scaler"])
        if state["best"] is not None:
            self.best = (state["best"]["score"], state["best"]["step"], state["best_modules"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.sampler.load_state_dict(state["rng"]["sampler"])
        self._lml_generator.set_state(state["rng"]["lml"])

    def save_checkpoint(
        self,
        path: str | Path,
        *,
        final: bool = False,
        norm_statistics: str | None = None,
        best: tuple[float, int, dict[str, Any]] | None = None,
    ) -> None:
        """Model, hyperparameter modules and likelihood in one safetensors file (atomic replace), with the
        step, the latest LML, the configuration, ``final`` (the state a finished run returned) and
        ``norm_statistics`` (what the model's BatchNorm running statistics are calibrated for; default
        ``"training"``, or ``"none"`` for a model without them: see ``checkpoint.NORM_STATISTICS``) in its
        metadata. ``best``: a ``(score, step, module states)`` to write instead of the current state (as kept in
        ``self.best``). The model's rebuilt buffers are left out (see :meth:`omitted`)."""
        if best is not None:
            _, step, states = best  # kept without the rebuilt buffers, as module_states() gives them
            record = next((r for r in self.history if r["step"] == step), {})
        else:
            step, states = self.step, self.module_states()
            record = self.history[-1] if self.history else {}
        if norm_statistics is None:
            norm_statistics = "training" if running_norms(self.pmodel) else "none"
        tensors = {f"{name}.{k}": cpu_copy(v) for name, state in states.items() for k, v in state.items()}
        lml = {"lml": record.get("lml"), "conditional_lml": record.get("conditional_lml")}  # the step's estimates
        meta = {"step": step, **lml, "final": final, "norm_statistics": norm_statistics, "storage": "flat"}
        write_checkpoint(path, tensors, {**meta, **self.identity(), **self.omitted()})

    def best_is_current(self) -> bool:
        """Whether the best evaluation's state is the current one (BatchNorm running statistics aside, which
        the end of a run recalibrates): the same weights in every module."""
        assert self.best is not None
        norms = {id(m) for m in running_norms(self.pmodel)}
        statistics = {
            f"{name}.{key}" if name else key
            for name, m in self.pmodel.named_modules()
            if id(m) in norms
            for key, _ in m.named_buffers(recurse=False)
        }
        current = self.module_states()
        return all(
            torch.equal(value, current[name][key])
            for name, state in self.best[2].items()
            for key, value in state.items()
            if name != "model" or key not in statistics
        )

    def recalibrated_best(self) -> dict[str, dict[str, torch.Tensor]]:
        """The best evaluation's module states with the model's BatchNorm running statistics recalibrated for
        the final subnetwork over the training data, as the end of a run does (``recalibrate_norm_statistics``
        with the evaluation batch size), computed on a copy of the model: the trainer's model, and torch's
        random generators, stay as they are."""
        assert self.best is not None
        states = self.best[2]
        pmodel = copy.deepcopy(self.pmodel)
        pmodel.load_state_dict({**pmodel.state_dict(), **states["model"]})
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            recalibrate_norm_statistics(pmodel, self.examples, batch_size=self.eval_batch_size, device=self.device)
        recalibrated = pmodel.state_dict()
        return {**states, "model": {k: recalibrated[k].detach() for k in states["model"]}}

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Load the model/hyper/likelihood tensors written by ``save_checkpoint``; returns its metadata
        (``partition_fx.training.load_checkpoint`` with this trainer's modules)."""
        return load_checkpoint(self.pmodel, path, hyper=self.hyper, likelihood=self.likelihood)

    def restore_modules(self, states: dict[str, dict[str, torch.Tensor]], source: str = "the best state") -> None:
        """Load module states as kept in ``best`` (``model``, ``hyper``, ``likelihood``; a missing one: empty);
        one that does not fit is refused naming ``source``."""
        restore_module_states(self.pmodel, self._modules(), states, source)
