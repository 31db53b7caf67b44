"""The training step without a read of the device per step (lazy non-finite check, losses kept on the
device) and in mixed precision (autocast to bf16/fp16, a GradScaler for fp16), each against its definition:
the step-by-step check, the fp32 run, the exported subnetwork, an uninterrupted run."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from models_for_tests import small_cnn, small_images
from safetensors.torch import load_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from partition_fx import PartitionedModel, export_subnetwork, partitionify
from partition_fx.errors import PartitionArgumentError, PartitionTrainingError, PartitionWarning
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.transforms import AffineAugmentation

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


class _NanFrom:
    """A forward hook (on a ReLU of a partitioned model) that turns its ``at``-th output with gradients
    (0-based; the LML's forwards run without) into NaN: a fault at a known step."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at + 1:
                return output * float("nan")
        return output


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _faulty(at: int) -> PartitionedModel:
    pmodel = partitionify(_model(), 3, seed=0)
    pmodel.module.get_submodule("1").register_forward_hook(_NanFrom(at))
    return pmodel


def _images(n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    return small_images(n, seed=1)


# --- the lazy non-finite check ---------------------------------------------------------------------------


@pytest.mark.parametrize("check_every", [3, 50])
def test_a_lazy_check_names_the_faulty_step_and_never_checkpoints_after_it(tmp_path, check_every) -> None:
    """The fault is at step 5 (0-based); evaluations and checkpoints every 2 steps. The run stops at the next
    read (after step 5 when reading every 3 steps, at the evaluation after step 5 otherwise), names step 5
    and its partition, and the last checkpoint is step 4's: finite weights."""
    with pytest.raises(PartitionTrainingError) as info:
        fit(
            _faulty(at=5),
            _data(),
            PAPER,
            steps=12,
            eval_every=2,
            batch_size=8,
            check_every=check_every,
            checkpoint_dir=tmp_path,
            progress=False,
        )
    message = str(info.value)
    assert message.startswith("step 5: non-finite loss in the parameter step of partition "), message
    assert "the last checkpoint (step 4)" in message
    weights = load_file(tmp_path / "last.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_a_lazy_check_names_the_tensors_whose_gradient_was_not_finite() -> None:
    """sqrt(|x|) at 0: a finite loss, a NaN gradient; the flat storage is named by its members."""

    class SqrtAtZero(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(x.abs())

    model = nn.Sequential(nn.Linear(6, 8), SqrtAtZero(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
    trainer = PartitionedTrainer(partitionify(model, 3), _data(), PAPER, batch_size=8, check_every=4)
    for _ in range(3):
        trainer.parameter_step(2)  # recorded, not read
    with pytest.raises(PartitionTrainingError, match=r"^step 0: non-finite gradient \(in 0.weight, 0.bias and "):
        trainer.parameter_step(2)  # the 4th recorded step reads the flags


def test_the_check_interval_does_not_change_a_run() -> None:
    """Reading the device every step or every 7 steps: the same history and weights, bit for bit."""
    runs = []
    for check_every in (1, 7):
        pmodel = partitionify(small_cnn(), 3, seed=0)
        result = fit(
            pmodel,
            _images(),
            PAPER,
            hyper=AffineAugmentation(num_samples=2),
            steps=10,
            eval_every=5,
            batch_size=8,
            check_every=check_every,
            progress=False,
        )
        runs.append((result.history, pmodel.state_dict()))
    (history_a, state_a), (history_b, state_b) = runs
    drop_time = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert drop_time(history_a) == drop_time(history_b)
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


class _ValueReads(TorchDispatchMode):
    """Keeps every float or bool tensor whose value is read into Python (``float(t)``, ``bool(t)``,
    ``t.item()``): on an accelerator each such read waits for the device. Integer reads are the sampler's and
    the routing's bookkeeping, done on the host where they live by design."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default and (
            args[0].is_floating_point() or args[0].dtype == torch.bool
        ):
            self.read.append(args[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fused", [False, True])
def test_iterations_read_nothing_from_the_device_between_checks(fused) -> None:
    """Besides the optimisers' step counts (host tensors in torch.optim unless capturable), nothing is read."""

    def reads(check_every: int) -> int:
        trainer = PartitionedTrainer(
            partitionify(small_cnn(), 3, seed=0),
            _images(),
            PAPER,
            hyper=AffineAugmentation(num_samples=2),
            batch_size=8,
            check_every=check_every,
            fused=fused,
        )
        trainer.iteration()  # warm-up: lazily built state
        with _ValueReads() as counter:
            for _ in range(4):
                trainer.iteration()
        optimizers = (trainer.optimizer, trainer.steps.stepper.hyper_optimizer)
        counts = {id(state["step"]) for o in optimizers for state in o.state.values() if "step" in state}
        return sum(id(t) not in counts for t in counter.read)

    assert reads(check_every=100) == 0
    assert reads(check_every=1) >= 4  # the step-by-step check reads every step: the counter sees reads


def test_check_every_is_checked() -> None:
    with pytest.raises(PartitionArgumentError, match="check_every must be an int >= 1, got 0"):
        PartitionedTrainer(partitionify(_model(), 2), _data(), PAPER, check_every=0)


# --- mixed precision -------------------------------------------------------------------------------------


def test_precision_is_checked() -> None:
    with pytest.raises(PartitionArgumentError, match="precision must be one of"):
        PartitionedTrainer(partitionify(_model(), 2), _data(), PAPER, precision="fp64")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_keeps_weights_and_optimiser_state_fp32_and_trains(precision) -> None:
    pmodel = partitionify(small_cnn(), 3, seed=0)
    trainer = PartitionedTrainer(
        pmodel, _images(), PAPER, hyper=AffineAugmentation(num_samples=2), batch_size=16, precision=precision
    )
    first = float(trainer.parameter_step(3, torch.arange(16))[1])
    for _ in range(30):
        trainer.iteration()
    assert all(p.dtype == torch.float32 for p in pmodel.parameters())
    states = [s for s in trainer.optimizer.state.values() if s]
    assert states and all(v.dtype == torch.float32 for s in states for k, v in s.items() if k != "step")
    later = float(trainer.parameter_step(3, torch.arange(16))[1])
    assert later < first
    if precision == "fp16":
        assert 0 < trainer.steps.stepper.precision.scaler.get_scale() <= 2.0**16


def test_a_subnetwork_under_bf16_autocast_matches_its_export() -> None:
    """Under autocast subnetwork k runs the export's bf16 ops on the same weights: equal to the export under
    autocast, and to the fp32 export to bf16 tolerance."""
    pmodel = partitionify(small_cnn(), 3, seed=0).eval()
    x = _images(8)[0]
    for k in range(1, 4):
        exported = export_subnetwork(pmodel, k).eval()
        with torch.no_grad():
            fp32 = exported(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                partitioned, reference = pmodel(x, subnetwork=k), exported(x)
        assert partitioned.dtype == torch.bfloat16
        torch.testing.assert_close(partitioned, reference, rtol=0, atol=0)
        torch.testing.assert_close(partitioned.float(), fp32, rtol=2e-2, atol=2e-2)


def test_the_lml_under_bf16_is_the_fp32_lml_to_bf16_tolerance() -> None:
    estimates = []
    for precision in ("fp32", "bf16"):
        trainer = PartitionedTrainer(
            partitionify(small_cnn(), 3, seed=0), _images(), PAPER, batch_size=8, precision=precision
        )
        estimates.append(trainer.estimate_lml().total)
    fp32, bf16 = estimates
    assert bf16 != fp32 and abs(bf16 - fp32) <= 2e-2 * abs(fp32)


def test_an_fp16_run_resumes_exactly_with_its_loss_scale(tmp_path) -> None:
    """6 iterations against 3, a saved state (the GradScaler's scale with it) loaded into a new trainer, and 3
    more: the same weights and the same loss scale."""

    def trainer() -> PartitionedTrainer:
        torch.manual_seed(0)
        return PartitionedTrainer(
            partitionify(small_cnn(), 3, seed=0),
            _images(),
            PAPER,
            hyper=AffineAugmentation(num_samples=2),
            batch_size=8,
            precision="fp16",
        )

    whole = trainer()
    for _ in range(6):
        whole.iteration()
    first = trainer()
    for _ in range(3):
        first.iteration()
    state = copy.deepcopy(first.state_dict())
    assert state["grad_scaler"]["scale"] == first.steps.stepper.precision.scaler.get_scale()
    second = trainer()
    second.load_state_dict(state)
    for _ in range(3):
        second.iteration()
    assert second.steps.stepper.precision.scaler.get_scale() == whole.steps.stepper.precision.scaler.get_scale()
    a, b = whole.pmodel.state_dict(), second.pmodel.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fp16_on_a_cpu_warns_once_naming_bf16() -> None:
    """fp16 on a CPU was about 19x slower than fp32, silently: it is warned (not refused: it trains correctly, as the
    tests above check), naming the faster choice; bf16 and fp32 say nothing."""
    for precision in ("fp32", "bf16"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", PartitionWarning)
            PartitionedTrainer(partitionify(small_cnn(), 2, seed=0), _images(), PAPER, precision=precision)
    with pytest.warns(PartitionWarning, match=r"precision 'fp16' on a CPU runs many times slower.*'bf16'") as caught:
        PartitionedTrainer(partitionify(small_cnn(), 2, seed=0), _images(), PAPER, precision="fp16")
    assert len([w for w in caught if issubclass(w.category, PartitionWarning)]) == 1
