"""``PartitionedTrainer``: partitioned training with hyperparameters learned by the LML, one step at a time.

One iteration (appendix I.1): a parameter step of partition k ~ Cat(u) on a minibatch of D_1:k through
subnetwork k, then (every ``hyper_every`` iterations after ``warmup_steps``) a hyperparameter step on a
minibatch of D_k, k ~ Cat(u_2..u_C), through subnetwork k-1. The model optimiser holds the partitions,
the hyperparameter optimiser holds psi: the parameters of ``hyper`` (an input transform such as
``AffineAugmentation``), of ``HyperparameterModule`` s inside the model (``ConcreteDropout``), and of the
likelihood (a Gaussian's noise scale). ``fit`` (``partition_fx.training.fit``) is the one-call front.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import PartitionArgumentError, PartitionTypeError
from ..partitioned_model import PartitionedModel
from ..train_config import TrainConfig
from ..transforms.base import HyperparameterModule
from .checkpoint_writer import CheckpointWriter
from .chunks import Examples, resolve_chunks
from .data_parallel import DataParallel, running_statistics_modules
from .faults import warn_about_shared_parameters
from .hooks import TrainingHook
from .hyperparameters import collect_hyperparameters, hyperparameter_modules, hyperparameter_values
from .lml import LMLEstimate, estimate_lml, forward_log_likelihood, hyper_loss, lml_fields, routed_losses
from .loop import RunPlan, run_loop
from .optim import configured_factories, partition_optimizer
from .options import Callback, Components, build, check_optimizer, check_scheduler, resolve, takes_num_samples
from .result import FitResult
from .sampler import PartitionedSampler
from .state import TrainerState
from .stepping import LAZY_CHECK_EVERY, NonfiniteWatch, Precision, Stepping


class PartitionedTrainer(TrainerState, Stepping):
    """Partitioned training of ``pmodel`` on ``dataset`` with hyperparameters learned by the LML.

    Built from a :class:`~partition_fx.train_config.TrainConfig` (default the recommended one) and keywords, as
    :func:`~partition_fx.training.fit` is (or from ``components`` already resolved); exposes the single steps
    (``parameter_step``, ``hyper_step``, ``evaluate``) for custom loops and tests, and
    ``state_dict()``/``load_state_dict()`` for everything a resumed run needs.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify
        >>> x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
        >>> trainer = PartitionedTrainer(partitionify(torch.nn.Linear(4, 2), 2), (x, y), batch_size=16)
        >>> k, loss = trainer.parameter_step()  # loss: a 0-dim tensor, still on the device
        >>> k in (1, 2) and float(loss) > 0
        True
    """

    def __init__(
        self,
        pmodel: PartitionedModel,
        dataset: Any,
        config: TrainConfig | None = None,
        *,
        components: Components | None = None,
        **keywords: Any,
    ) -> None:
        if components is None:
            config, components = resolve("PartitionedTrainer", config, keywords)
        elif keywords or config is None:
            raise PartitionTypeError("pass a TrainConfig with components=, or keywords without them, not both")
        if not isinstance(pmodel, PartitionedModel):
            raise PartitionTypeError(
                f"fit needs a PartitionedModel (from partitionify(model)), got {type(pmodel).__name__}"
            )
        self.config: TrainConfig = config  # type: ignore[assignment]
        self.components = components
        runtime, step, evaluation = self.config.runtime, self.config.hyper, self.config.evaluation
        self.pmodel = pmodel
        self.hyper = components.hyper
        self.likelihood = components.likelihood
        self.fused = runtime.fused
        self.every_partition = runtime.every_partition
        self.seed = runtime.seed
        self.on_nonfinite = runtime.on_nonfinite
        self.hyper_every = step.every
        self.warmup_steps = step.warmup_steps
        self.hyper_samples = step.samples if takes_num_samples(self.hyper) else None
        """Augmentation samples per example in hyperparameter steps (None: the transform's own)."""
        self.eval_batch_size = evaluation.batch_size
        self.eval_examples_per_chunk = evaluation.examples_per_chunk
        self.checkpoint_dir: Path | None = components.checkpoint_dir  # type: ignore[assignment]
        self.examples = Examples(dataset)
        self.chunks = resolve_chunks(components.chunks, len(self.examples), pmodel.proportions, self.seed)
        batch_size = self.config.optimization.batch_size
        self.sampler = PartitionedSampler(self.chunks, batch_size, step.batch_size, self.seed)
        self.device = self._place(components.device)  # type: ignore[arg-type]
        self.data_parallel = DataParallel.from_environment(components.data_parallel)
        """The process group gradients are averaged over (``training.data_parallel``), or None."""
        if self.data_parallel is not None:
            self.data_parallel.check_batch_size("batch_size", batch_size)
            self.data_parallel.check_batch_size("hyper_batch_size", self.sampler.hyper_batch_size)
            self.data_parallel.broadcast([pmodel, self.hyper, self.likelihood])
        self._statistics_modules = running_statistics_modules(pmodel) if self.data_parallel is not None else []
        if runtime.compile is not None:
            pmodel.compile(mode=runtime.compile)
        self.precision = Precision(runtime.precision, self.device)
        on_cpu = self.device is None or self.device.type == "cpu"
        self.check_every = runtime.check_every or (1 if on_cpu else LAZY_CHECK_EVERY)
        """Steps between reads of the device for the non-finite check (see ``Stepping``): 1 on the CPU, where a
        read costs nothing, ``LAZY_CHECK_EVERY`` on an accelerator, unless ``check_every`` says."""
        self.watch = NonfiniteWatch()
        warn_about_shared_parameters(pmodel)
        self.hyperparameters_list = collect_hyperparameters(pmodel, self.hyper, self.likelihood)
        if self.hyperparameters_list and pmodel.num_partitions < 2:
            raise PartitionArgumentError(
                "learning hyperparameters needs num_partitions >= 2 (chunk k is scored by subnetwork k-1); "
                "partitionify the model with 2 or more partitions"
            )
        if self.fused and any(any(True for _ in m.parameters()) for _, m in pmodel.hyperparameter_modules()):
            raise PartitionArgumentError(
                "fused=True does not support hyperparameter modules inside the model (e.g. ConcreteDropout) yet: "
                "the parameter examples' loss would reach them; use fused=False"
            )
        self._build_optimizers()
        self.step = 0
        self.finetune_start: int | None = None
        """The step the fine-tuning phase began at (None while partitioned training goes on)."""
        self.history: list[dict[str, Any]] = []
        self.best: tuple[float, int, dict[str, Any]] | None = None
        """(score, step, state of the modules) of the best evaluation so far, by :meth:`selection_score`."""
        self.skipped_steps = 0
        self.last_checkpoint_step: int | None = None
        self.hooks: list[TrainingHook] = list(components.hooks)
        """Run after each evaluation, when fine-tuning begins and at the end of a run, in this order
        (``hooks``, then the ``CheckpointWriter`` of ``checkpoint_dir``)."""
        if self.checkpoint_dir is not None and (self.data_parallel is None or self.data_parallel.is_writer):
            self.hooks.append(CheckpointWriter(self.checkpoint_dir))
        self._omitted: dict[str, Any] | None = None
        self._losses: list[torch.Tensor] = []
        self._hyper_losses: list[torch.Tensor] = []
        self._lml_generator = torch.Generator().manual_seed(self.seed + 1)

    def _place(self, device: torch.device | None) -> torch.device | None:
        """Move the model, input transform and likelihood to ``device`` (default: where the model is)."""
        params = [p for p in self.pmodel.parameters() if p.requires_grad]
        first = params[0] if params else next(self.pmodel.buffers(), None)
        device = device if device is not None else (first.device if first is not None else None)
        if device is not None:
            for m in (self.pmodel, self.hyper, self.likelihood):
                if m is not None:
                    m.to(device)
        return device

    def _build_optimizers(self) -> None:
        """The optimisers and schedulers the configuration asks for, or the factories given in their place."""
        given = self.components
        optimizer, hyper_optimizer, scheduler = configured_factories(self.config)
        factory = partial(build, "optimizer", given.optimizer or optimizer)
        scaling = self.config.optimization.weight_decay_scaling
        self.optimizer = check_optimizer(
            "optimizer", partition_optimizer(self.pmodel, factory, self.chunks.sizes, scaling)
        )
        self.hyper_optimizer = None
        if self.hyperparameters_list:
            hyper_factory = given.hyper_optimizer or hyper_optimizer
            self.hyper_optimizer = check_optimizer(
                "hyper_optimizer", build("hyper_optimizer", hyper_factory, self.hyperparameters_list)
            )
        self.scheduler = None
        if (given.scheduler or scheduler) is not None:
            self.scheduler = check_scheduler(build("scheduler", given.scheduler or scheduler, self.optimizer))
        self.hyper_scheduler = None
        if given.hyper_scheduler is not None and self.hyper_optimizer is not None:
            self.hyper_scheduler = check_scheduler(
                build("hyper_scheduler", given.hyper_scheduler, self.hyper_optimizer), "hyper_scheduler"
            )

    # --- what is trained -------------------------------------------------------------------------

    def hyperparameter_modules(self) -> list[tuple[str, HyperparameterModule]]:
        """Every hyperparameter module with the prefix its values are reported under."""
        return hyperparameter_modules(self.pmodel, self.hyper, self.likelihood)

    def hyperparameter_values(self) -> dict[str, Any]:
        """Current hyperparameters as plain values, e.g. ``{"rotation": 1.2, "head.drop.p": 0.1}``."""
        return hyperparameter_values(self.hyperparameter_modules())

    # --- steps -------------------------------------------------------------------------------------

    def _train_mode(self) -> None:
        self.pmodel.train()
        if self.hyper is not None:
            self.hyper.train()
        self._same_running_statistics()

    def _same_running_statistics(self) -> None:
        """Data-parallel: rank 0's BatchNorm running statistics on every rank (as DDP's broadcast_buffers)."""
        if self.data_parallel is not None and self._statistics_modules:
            self.data_parallel.broadcast(self._statistics_modules, buffers_only=True)

    def _local(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This process's share of a global minibatch (all of it without data parallelism)."""
        return tensors if self.data_parallel is None else self.data_parallel.shard(*tensors)

    def parameter_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Train partition k (default: drawn by the sampler) on a minibatch of D_1:k; returns (k, loss)."""
        if k is None or indices is None:
            drawn_k, drawn = self.sampler.parameter_batch()
            k, indices = (drawn_k, drawn) if k is None else (k, indices if indices is not None else drawn)
        self._train_mode()
        x, y = self.examples.batch(*self._local(indices), self.device)
        with self.precision.autocast():
            loss = -forward_log_likelihood(
                self.pmodel, self.likelihood, x, y, k, self.hyper, transform_grad=False
            ).mean()
        what = f"parameter step of partition {k} (subnetwork {k}, data D_1:{k})"
        return k, self._step(loss, None, self.pmodel.partition_parameters(k), what)

    def hyper_step(self, k: int | None = None, indices: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
        """Step psi on a minibatch of D_k through subnetwork k-1 (k in 2..C); returns (k, loss)."""
        self._check_hyperparameters()
        if k is None or indices is None:
            drawn_k, drawn = self.sampler.hyper_batch()
            k, indices = (drawn_k, drawn) if k is None else (k, indices if indices is not None else drawn)
        loss = self._hyper_loss([(1.0, k, indices)])
        return k, self._step(None, loss, [], f"hyperparameter step (chunk D_{k} through subnetwork {k - 1})")

    def hyper_step_all_chunks(self) -> torch.Tensor:
        """Step psi on a minibatch of EVERY chunk D_k (k in 2..C) through its subnetwork k-1, the chunks'
        mean losses weighted by the probabilities ``hyper_step`` draws them with (``hyper_chunks="all"``):
        the expected gradient of ``hyper_step``, without the variance of drawing k; returns the loss."""
        self._check_hyperparameters()
        loss = self._hyper_loss(self.sampler.hyper_batches())
        return self._step(None, loss, [], "hyperparameter step (chunks D_2..D_C through subnetworks 1..C-1)")

    def _draw_hyper_batches(self) -> list[tuple[float, int, torch.Tensor]]:
        """The ``(weight, k, indices)`` batches of one hyperparameter step, as ``config.hyper.chunks`` asks."""
        if self.config.hyper.chunks == "all":
            return self.sampler.hyper_batches()
        return [(1.0, *self.sampler.hyper_batch())]

    def _check_hyperparameters(self) -> None:
        if self.hyper_optimizer is None:
            raise PartitionArgumentError("there are no hyperparameters to step (pass hyper=... or use ConcreteDropout)")

    def _hyper_loss(self, batches: list[tuple[float, int, torch.Tensor]]) -> torch.Tensor:
        self._train_mode()
        batches = [(weight, k, *self._local(indices)) for weight, k, indices in batches]
        with self.precision.autocast():
            return hyper_loss(
                self.pmodel,
                self.likelihood,
                self.hyper,
                self.examples,
                batches,
                self.device,
                self.hyper_samples,
            )

    def _hyper_due(self, step: int) -> bool:
        return self.hyper_optimizer is not None and step > self.warmup_steps and step % self.hyper_every == 0

    def iteration(self) -> None:
        """One iteration: the paper's parameter step then hyperparameter step (when due), or both in one
        forward and one backward (``fused=True``); in the fine-tuning phase, a ``finetune_step``."""
        if self.finetuning:
            self.finetune_step()
            self.step += 1
            return
        if self.fused:
            self.fused_iteration()
            return
        if self.every_partition:
            self.parameter_step_every_partition()
        else:
            self.parameter_step()
        self.step += 1
        if self._hyper_due(self.step):
            if self.config.hyper.chunks == "all":
                self.hyper_step_all_chunks()
            else:
                self.hyper_step()

    def _routed_losses(
        self, ks: torch.Tensor, indices: torch.Tensor, hyper: list[tuple[float, int, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The parameter loss and (if ``hyper`` lists ``(weight, k, indices)`` batches) the hyperparameter loss
        in one forward."""
        self._train_mode()
        ks, indices = self._local(ks, indices)
        batch = self.examples.batch(indices, self.device)
        hyper_batches = [(w, k, *self.examples.batch(*self._local(i), self.device)) for w, k, i in hyper]
        with self.precision.autocast():
            return routed_losses(self.pmodel, self.likelihood, self.hyper, ks, batch, hyper_batches, self.hyper_samples)

    def parameter_step_every_partition(self) -> torch.Tensor:
        """A parameter step in which each example trains its own partition (``sampler.parameter_examples``):
        one forward and one backward, every partition drawn at least once updated."""
        ks, indices = self.sampler.parameter_examples()
        loss, _ = self._routed_losses(ks, indices, [])
        params, drawn = self._parameters_of(ks)
        return self._step(loss, None, params, f"parameter step of partitions {drawn}")

    def _parameters_of(self, ks: torch.Tensor) -> tuple[list[nn.Parameter], list[int]]:
        """The parameters of the partitions drawn in ``ks``, and those partitions."""
        drawn = torch.unique(ks).tolist()
        return [p for k in drawn for p in self.pmodel.partition_parameters(int(k))], drawn

    def fused_iteration(self) -> None:
        """The parameter step and (when due) the hyperparameter step of one iteration in ONE forward and ONE
        backward. Both gradients are taken at the same weights: the same gradients as the two steps of
        appendix I.1, except that the paper's hyper step sees partition k already updated."""
        if self.every_partition:
            ks, indices = self.sampler.parameter_examples()
        else:
            k, indices = self.sampler.parameter_batch()
            ks = torch.full((indices.numel(),), k)
        hyper = self._draw_hyper_batches() if self._hyper_due(self.step + 1) else []
        loss, hyper_loss = self._routed_losses(ks, indices, hyper)
        params, drawn = self._parameters_of(ks)
        self._step(loss, hyper_loss, params, f"fused iteration (partitions {drawn})")
        self.step += 1

    # --- the fine-tuning phase ---------------------------------------------------------------------

    @property
    def finetuning(self) -> bool:
        """Whether partitioned training has ended and the final subnetwork is being fine-tuned."""
        return self.finetune_start is not None

    def begin_finetuning(self, restore_best: bool = False) -> None:
        """End partitioned training (paper, Table 2): from here psi is frozen and every weight of the final
        subnetwork (all partitions together, as ``export_subnetwork`` merges them) trains on ALL the data.

        The optimiser and LR scheduler carry on (the schedule spans both phases); each partition's weight
        decay returns to the unscaled one, since every weight now sees all N examples. With
        ``restore_best`` the state with the best LML is restored first. Then each hook's
        ``before_finetuning`` runs. Draws no random number, so a resumed run that repeats it stays exact."""
        if self.finetuning:
            return
        self.check_nonfinite()
        if restore_best and self.best is not None and self.best[1] != self.step:
            self.restore_modules(self.best[2])
        self.finetune_start = self.step
        for group in self.optimizer.param_groups:
            group["weight_decay"] = group["base_weight_decay"]
        for hook in self.hooks:
            hook.before_finetuning(self)

    def finetune_step(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Train every weight of the final subnetwork C on a minibatch of all the data (default: drawn by the
        sampler), with the input transform's psi fixed; returns the loss."""
        if indices is None:
            indices = self.sampler.finetune_batch()
        self._train_mode()
        x, y = self.examples.batch(*self._local(indices), self.device)
        final = self.pmodel.num_partitions
        with self.precision.autocast():
            loss = -forward_log_likelihood(
                self.pmodel, self.likelihood, x, y, final, self.hyper, transform_grad=False
            ).mean()
        params, _ = self._parameters_of(torch.arange(1, final + 1))
        return self._step(loss, None, params, f"fine-tuning step (subnetwork {final}, all data)")

    # --- evaluation ------------------------------------------------------------------------------

    def estimate_lml(self) -> LMLEstimate:
        """The LML of the current model and hyperparameters (see :func:`estimate_lml`).

        Its random draws (augmentation and dropout noise, subsampling) come from the trainer's own LML
        generator: torch's global generator is forked around it, so how often the LML is estimated
        (``eval_every``) does not change the training path."""
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            seed = int(torch.randint(0, 2**62, (1,), generator=self._lml_generator))
            torch.manual_seed(seed)
            with self.precision.autocast():
                return estimate_lml(
                    self.pmodel,
                    self.examples,
                    self.chunks,
                    self.likelihood,
                    self.hyper,
                    batch_size=self.eval_batch_size,
                    max_examples_per_chunk=self.eval_examples_per_chunk,
                    generator=self._lml_generator,
                    device=self.device,
                )

    def selection_score(self, estimate: LMLEstimate) -> float:
        """The evidence the best state is chosen by: the conditional LML (chunks 2..C), or the full LML when
        C = 1. The full one adds chunk 1 scored by the untrained subnetwork 0, which dominates it (-2743 of
        -2772 nats on the main job) whatever was learned.

        >>> from partition_fx import partitionify
        >>> trainer = PartitionedTrainer(partitionify(nn.Linear(2, 2), 3), (torch.randn(30, 2), torch.zeros(30).long()))
        >>> trainer.selection_score(LMLEstimate(-30.0, [-20.0, -6.0, -4.0], -1.0))
        -10.0
        """
        return estimate.conditional if self.pmodel.num_partitions > 1 else estimate.total

    def evaluate(self, started: float) -> dict[str, Any]:
        """Estimate the LML (not in the fine-tuning phase), append a history record, keep the best state, run
        the evaluation hooks (with ``checkpoint_dir``: write the checkpoints and the resume directory)."""
        self.check_nonfinite()  # before anything is recorded or written from these weights
        self._same_running_statistics()
        mean = lambda xs: float(sum(xs) / len(xs)) if xs else None  # noqa: E731
        losses, hyper_losses = self.pending_losses()
        # Once fine-tuning has trained every weight on every chunk, no subnetwork k-1 is unseen by chunk k:
        # there is no partitioned LML to estimate.
        estimate = None if self.finetuning else self.estimate_lml()
        record = {
            "step": self.step,
            "phase": "finetune" if self.finetuning else "partitioned",
            **lml_fields(estimate, scored=sum(self.chunks.sizes[1:])),
            "train_loss": mean(losses),
            "hyper_loss": mean(hyper_losses),
            "hyperparameters": self.hyperparameter_values(),
            "seconds": round(time.perf_counter() - started, 3),
        }
        self._losses, self._hyper_losses = [], []
        self.history.append(record)
        score = None if estimate is None else self.selection_score(estimate)
        improved = score is not None and (self.best is None or score > self.best[0])
        if improved:
            self.best = (score, self.step, self.module_states(copy_values=True))
        for hook in self.hooks:
            hook.after_evaluation(self, record, improved)
        return record

    # --- the loop ----------------------------------------------------------------------------------

    def run(
        self,
        steps: int | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        progress: bool | None = None,
        **overrides: Any,
    ) -> FitResult:
        """Train to the configuration's ``steps`` (a resumed trainer: from its step), evaluating, fine-tuning
        and stopping as the configuration says; ``overrides`` (``eval_every``, ``finetune_steps``, ``patience``,
        ... by their keywords) change it for this run. ``steps``: run that many iterations from the current step
        instead, as if the configuration's ``steps`` ended there (its evaluation interval and fine-tuning share
        are then of those); the LR schedule built with the trainer is not changed."""
        if steps is not None:
            overrides = {**overrides, "steps": self.step + steps}
        config = self.config.replace(**overrides) if overrides else self.config
        end = config.optimization.steps
        switch = end - config.finetune_steps if config.finetune_steps else None
        plan = RunPlan(end, switch, config, callbacks, progress)
        result = run_loop(self, plan)
        for hook in self.hooks:
            hook.after_run(self, result)
        return result


__all__ = ["PartitionedTrainer"]
