"""Compiled training (``PartitionedModel.compile``, ``fit(compile=...)``): one graph per (subnetwork, gradient
partition, mode) with no graph break and no recompilation storm up to C=8, and the eager run's values."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
import torch
import torch._dynamo
from models_for_tests import small_cnn, small_images
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from partition_fx import partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.job.train_config import TrainConfig
from partition_fx.training import PartitionedTrainer, fit
from partition_fx.transforms import AffineAugmentation

PAPER = TrainConfig.paper()  # the defaults these tests were written against: the paper's step, no fine-tuning


def _images(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return small_images(n, seed=0)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _trainer(num_partitions: int, backend: object, **options: object) -> PartitionedTrainer:
    pmodel = partitionify(small_cnn(), num_partitions, seed=0)
    if backend is not None:
        pmodel.compile(backend=backend)
    return PartitionedTrainer(
        pmodel, _images(), PAPER, hyper=AffineAugmentation(num_samples=2), batch_size=8, **options
    )


_ROUTINGS = [{}, {"fused": True}, {"every_partition": True, "fused": True}]


@pytest.mark.parametrize(
    ("num_partitions", "options"),
    [(3, options) for options in _ROUTINGS]
    + [(8, {})]
    + [pytest.param(8, options, marks=pytest.mark.slow) for options in _ROUTINGS[1:]],  # 15 s each on 2 cores
)
def test_a_run_compiles_each_subnetwork_once_without_graph_breaks(num_partitions, options) -> None:
    """A run uses one graph per (subnetwork, gradient partition, grad mode, input needing a gradient): its
    parameter steps C, its hyperparameter steps C-1 and its LML estimates C. 12C iterations and two
    estimates compile at most those 3C graphs, and no graph breaks. With ``every_partition`` the groups of
    examples change size from step to step: each graph may compile once more, with a dynamic batch size."""
    counter = CompileCounter()
    trainer = _trainer(num_partitions, counter, **options)
    for _ in range(4 * num_partitions):
        trainer.iteration()
    trainer.estimate_lml()
    first = counter.frame_count
    for _ in range(8 * num_partitions):
        trainer.iteration()
    trainer.estimate_lml()
    per_graph = 2 if options.get("every_partition") else 1
    assert first <= counter.frame_count <= 3 * num_partitions * per_graph
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_compiled_training_has_the_eager_values() -> None:
    """aot_eager: the compiled graphs (forward and backward through AOTAutograd) against eager, 6 iterations."""
    eager, compiled = _trainer(3, None), _trainer(3, "aot_eager")
    torch.manual_seed(1)
    for _ in range(6):
        eager.iteration()
    torch.manual_seed(1)
    for _ in range(6):
        compiled.iteration()
    for (name, a), b in zip(eager.pmodel.named_parameters(), compiled.pmodel.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(compiled.estimate_lml().total, eager.estimate_lml().total, rtol=1e-5, atol=1e-4)


def test_a_compiled_model_keeps_its_keys_and_refuses_one_pass_routing() -> None:
    pmodel = partitionify(small_cnn(), 3, seed=0, scheme="node")
    keys = list(pmodel.state_dict())
    pmodel.compile(backend="eager")
    assert list(pmodel.state_dict()) == keys
    pmodel.per_example = "one_pass"
    with pytest.raises(PartitionArgumentError, match="compiled model groups examples by subnetwork"):
        pmodel(_images(4)[0], subnetwork=torch.tensor([1, 1, 2, 2]))


def test_compile_is_checked() -> None:
    with pytest.raises(PartitionArgumentError, match="compile must be one of"):
        PartitionedTrainer(partitionify(small_cnn(), 2), _images(), PAPER, compile="fast")


def test_the_command_offers_the_modes_fit_takes() -> None:
    from partition_fx.cli.parser import build_parser
    from partition_fx.job.train_config import COMPILE_MODES

    train = next(
        a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions if a.dest == "compile"
    )
    assert tuple(train.choices) == COMPILE_MODES


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="inductor on CPU needs a C compiler")
def test_fit_with_compile_matches_eager_under_inductor() -> None:
    """SGD, whose step is linear in the gradient (Adam's normalisation would magnify the last-bit differences
    of inductor's fused reductions in near-zero gradients to the size of the learning rate)."""
    results = []
    for compile_mode in (False, True):
        pmodel = partitionify(small_cnn(), 3, seed=0)
        result = fit(
            pmodel,
            _images(),
            PAPER,
            hyper=AffineAugmentation(num_samples=2),
            steps=8,
            eval_every=4,
            batch_size=8,
            optimizer=partial(torch.optim.SGD, lr=0.1),
            hyper_optimizer=partial(torch.optim.SGD, lr=0.1),
            compile=compile_mode,
            progress=False,
        )
        results.append((result.lml, pmodel.state_dict()))
    (lml_a, state_a), (lml_b, state_b) = results
    assert lml_b == pytest.approx(lml_a, rel=1e-4)
    for key in state_a:
        torch.testing.assert_close(state_a[key], state_b[key], rtol=1e-4, atol=1e-5, msg=key)
