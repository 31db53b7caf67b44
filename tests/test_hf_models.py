"""Hugging Face ``transformers`` vision models as their users hold them (``tests/hf_zoo.py``: every image-
classification family of the sweep, a semantic-segmentation and a detection model, tiny configs, random weights):
each converts by default and holds the zoo's invariants, keeps its output class and takes ``labels=``; with
``trace="always"`` each converts or is refused naming the module or the argument; ``fit`` trains a classifier on
its logits. Default run: ``hf_zoo.HF_DEFAULT_SUBSET``; the rest with ``pytest -m zoo``."""

from __future__ import annotations

import math
import os

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the Hugging Face tests need the 'hf' extra")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_zoo import HF_DEFAULT_SUBSET, HF_MODELS, HFModel  # noqa: E402

from partition_fx import export_subnetwork, partitionify  # noqa: E402
from partition_fx.errors import PartitionArgumentError, PartitionError  # noqa: E402
from partition_fx.testing import (  # noqa: E402
    assert_subnetworks_match_exports,
    max_relative_difference,
    perturb_partitions,
)
from partition_fx.training import ModelLoss  # noqa: E402


def _params() -> list[object]:
    return [
        pytest.param(spec, id=spec.id, marks=[] if spec.id in HF_DEFAULT_SUBSET else [pytest.mark.zoo])
        for spec in HF_MODELS
    ]


def _check(spec: HFModel, model: torch.nn.Module, pmodel: object) -> None:
    """The zoo's invariants, in eval mode: right after conversion every subnetwork is the original, with its
    output class; after perturbing every partition each subnetwork equals its export; the export is the original
    class with the original state-dict keys; ``labels=`` reaches the model (the original's loss); modes follow."""
    from partition_fx import PartitionedModel

    assert isinstance(pmodel, PartitionedModel)
    assert not any(m.training for m in pmodel.modules()), "a module left in training mode"
    x, labels = spec.example_input(), spec.example_labels()
    with torch.no_grad():
        reference = model(x)
        for k in range(pmodel.num_partitions + 1):
            out = pmodel(x, subnetwork=k)
            assert type(out) is type(reference), f"subnetwork {k} returns {type(out).__name__}"
            assert max_relative_difference(out, reference) <= 1e-6, k
        with_labels, want = pmodel(x, labels=labels), model(x, labels=labels)
        assert type(with_labels) is type(want) and list(with_labels) == list(want)
        assert max_relative_difference(with_labels, want) <= 1e-6
    perturb_partitions(pmodel, seed=0)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=1e-5)
    with torch.no_grad():
        assert max_relative_difference(pmodel(x), reference) > 1e-6, "the perturbation did not reach the model"
    exported = export_subnetwork(pmodel)
    assert type(exported) is type(model) and list(exported.state_dict()) == list(model.state_dict())
    pmodel.train()
    assert all(m.training for m in pmodel.modules())


@pytest.mark.parametrize("spec", _params())
def test_converts_by_default_and_holds_the_invariants(spec: HFModel) -> None:
    model = spec.build().eval()
    _check(spec, model, partitionify(model, 3, (0.8, 0.1, 0.1), seed=0))


@pytest.mark.parametrize("spec", _params())
def test_trace_always_converts_or_refuses_naming_the_module_or_the_argument(spec: HFModel) -> None:
    model = spec.build().eval()
    try:
        pmodel = partitionify(model, 3, (0.8, 0.1, 0.1), seed=0, trace="always")
    except PartitionError as e:
        assert "could not trace" in str(e) and "module '" in str(e) and "trace='auto'" in str(e), e
        return
    with pytest.raises(PartitionArgumentError, match=r"labels= is not an input .*trace='auto'"):
        pmodel(spec.example_input(), labels=spec.example_labels())
    x = spec.example_input()
    with torch.no_grad():
        assert max_relative_difference(pmodel(x), model(x)) <= 1e-6
    perturb_partitions(pmodel, seed=0)
    assert_subnetworks_match_exports(pmodel, (x,), rtol=1e-5)


def _classifier(name: str) -> HFModel:
    return next(spec for spec in HF_MODELS if spec.name == name)


@pytest.mark.parametrize("name", ["resnet", "vit", "convnext"])  # traced, untraced, untraced
def test_fit_trains_a_transformers_classifier_on_its_logits(name: str) -> None:
    from partition_fx.training import fit

    spec = _classifier(name)
    pmodel = partitionify(spec.build(), 2)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 3, 32, 32, generator=g), torch.randint(0, 3, (24,), generator=g)
    before = export_subnetwork(pmodel).state_dict()
    fit(pmodel, (x, y), steps=4, progress=False, record_run=False)
    after = export_subnetwork(pmodel).state_dict()
    assert any(not torch.equal(before[key], after[key]) for key in before)


def test_model_loss_refuses_a_batch_mean_naming_the_output_s_fields() -> None:
    spec = _classifier("resnet")
    pmodel = partitionify(spec.build().train(), 2)
    x, y = spec.example_input(), spec.example_labels()
    out = pmodel(x, y)  # labels as the second argument, as training with ModelLoss passes them
    assert set(out) == {"loss", "logits"}
    with pytest.raises(PartitionArgumentError, match=r"fields: loss, logits\) holds a loss of a scalar"):
        ModelLoss()(out, y)


def test_lightning_and_the_lml_train_a_transformers_classifier_with_learned_augmentation() -> None:
    """A stock ``lightning.Trainer`` fits a partitioned transformers ResNet with learned ranges, bit for bit as
    ``fit`` does (the own-loop steps ``fit`` is made of), and the LML estimate scores it."""
    lightning = pytest.importorskip("lightning", reason="the lightning extra: pip install 'partition-fx[lightning]'")
    from partition_fx.integrations.lightning import PartitionedLightningModule
    from partition_fx.training import Categorical, Examples, TrainConfig, estimate_lml, fit, split_into_chunks
    from partition_fx.transforms import AffineAugmentation

    spec = _classifier("resnet")
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.rand(24, 3, 32, 32, generator=g), torch.randint(0, 3, (24,), generator=g)
    )
    config = TrainConfig.recommended(steps=4, batch_size=8, hyper_batch_size=4, hyper_samples=2, eval_every=2,
                                     restore_best=False)  # fmt: skip

    def start():
        torch.manual_seed(0)
        return partitionify(spec.build(), 3, (0.5, 0.3, 0.2), seed=0), AffineAugmentation(num_samples=2)

    fitted, fitted_aug = start()
    fit(fitted, data, config, hyper=fitted_aug, progress=False, record_run=False)
    pmodel, hyper = start()
    module = PartitionedLightningModule(pmodel, data, hyper=hyper, config=config)
    trainer = lightning.Trainer(max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                                enable_checkpointing=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(module)
    for a, b in zip([*fitted.state_dict().values(), *fitted_aug.state_dict().values()],
                    [*pmodel.state_dict().values(), *hyper.state_dict().values()], strict=True):  # fmt: skip
        assert torch.equal(a, b)
    chunks = split_into_chunks(len(data), (0.5, 0.3, 0.2))
    estimate = estimate_lml(pmodel, Examples(data), chunks, Categorical(), hyper=hyper)
    assert math.isfinite(estimate.total) and math.isfinite(estimate.conditional)
