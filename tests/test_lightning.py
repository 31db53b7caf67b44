"""Partitioned training under a stock ``lightning.Trainer`` (``partition_fx.integrations.lightning``): it trains what
``fit`` trains, bit for bit; Lightning's logger and checkpoint get the run; what it cannot do is refused."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

lightning = pytest.importorskip("lightning", reason="the lightning extra: pip install 'partition-fx[lightning]'")

from partition_fx import partitionify  # noqa: E402
from partition_fx.errors import PartitionArgumentError  # noqa: E402
from partition_fx.integrations.lightning import PartitionedLightningModule  # noqa: E402
from partition_fx.training import TrainConfig, fit  # noqa: E402
from partition_fx.transforms import AffineAugmentation  # noqa: E402

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def _data(n: int = 48):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _pmodel():
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3)]
    return partitionify(nn.Sequential(*layers), 3, (0.5, 0.3, 0.2), seed=0)


CONFIG = TrainConfig.recommended(
    steps=10, batch_size=8, hyper_batch_size=4, hyper_samples=2, finetune_steps=4, eval_every=2, seed=3,
    restore_best=False,  # fit's choice of the best state; the module returns the last one
)  # fmt: skip


def _module(**keywords):
    return PartitionedLightningModule(_pmodel(), _data(), hyper=AffineAugmentation(num_samples=2), config=CONFIG,
                                      **keywords)  # fmt: skip


def test_a_lightning_trainer_fits_what_fit_fits_and_logs_it(tmp_path):
    fitted, fitted_aug = _pmodel(), AffineAugmentation(num_samples=2)
    result = fit(fitted, _data(), CONFIG, hyper=fitted_aug, progress=False)

    module = _module()
    logger = lightning.pytorch.loggers.CSVLogger(tmp_path, name="run")
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = lightning.Trainer(max_epochs=1, logger=logger, callbacks=[checkpoints], **QUIET)
    trainer.fit(module)

    assert trainer.global_step == CONFIG.optimization.steps
    ours = [*module.pmodel.state_dict().values(), *module.hyper.state_dict().values()]
    for a, b in zip([*fitted.state_dict().values(), *fitted_aug.state_dict().values()], ours, strict=True):
        assert torch.equal(a, b)
    final = module.export().eval()
    x, y = _data().tensors
    with torch.no_grad():
        accuracy = float((final(x).argmax(1) == y).float().mean())
    assert type(final) is nn.Sequential and 0.0 <= accuracy <= 1.0

    # the logger has fit's evaluations: the LML at each partitioned one, the hyperparameters at each
    with open(logger.log_dir + "/metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    logged = {int(r["step"]): r for r in rows}
    for record in result.history:
        row = logged[record["step"]]
        if record["conditional_lml"] is not None:
            assert float(row["conditional_lml"]) == pytest.approx(record["conditional_lml"], rel=1e-6)
        assert float(row["hyper/rotation"]) == pytest.approx(record["hyperparameters"]["rotation"])

    # the checkpoint holds the weights: loaded into a module built alike, the export is the same model
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["state_dict"]
    loaded = _module()
    loaded.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(loaded.export().eval()(x), final(x))
    # ... and a run is not resumed from it
    with pytest.raises(PartitionArgumentError, match=r"cannot resume a run"):
        lightning.Trainer(max_epochs=2, logger=False, **QUIET).fit(_module(), ckpt_path=tmp_path / "ckpt" / "last.ckpt")


def test_what_lightning_cannot_train_is_refused_naming_what_works():
    with pytest.raises(PartitionArgumentError, match=r"fp32, not Lightning's precision 'bf16-mixed'"):
        lightning.Trainer(max_epochs=1, precision="bf16-mixed", logger=False, **QUIET).fit(_module())
    with pytest.raises(PartitionArgumentError, match=r"needs a PartitionedModel"):
        PartitionedLightningModule(nn.Linear(2, 2), _data())


def test_two_processes_are_refused_naming_what_works():
    """A trainer of 2 devices, before it launches them (each launched process would refuse the same way)."""
    module = _module()
    module.trainer = lightning.Trainer(
        max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False, **QUIET
    )
    with pytest.raises(PartitionArgumentError, match=r"trains in one process, not 2: .* or fit\(\) under torchrun"):
        module.setup("fit")


class _Digits(lightning.LightningDataModule):
    def setup(self, stage):
        self.train_set = _data()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_set, batch_size=5, shuffle=True)


def test_a_datamodules_training_set_trains_what_the_dataset_trains():
    """A LightningDataModule gives its training set; handing it (or a loader) to trainer.fit instead is refused:
    its own sampling would replace the partitioned one."""
    modules = []
    for data in (_data(), _Digits()):
        module = PartitionedLightningModule(_pmodel(), data, hyper=AffineAugmentation(num_samples=2), config=CONFIG)
        lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, **QUIET).fit(module)
        modules.append(module)
    for a, b in zip(modules[0].pmodel.state_dict().values(), modules[1].pmodel.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, **QUIET)
    with pytest.raises(PartitionArgumentError, match=r"without train_dataloaders= or datamodule="):
        trainer.fit(_module(), datamodule=_Digits())
