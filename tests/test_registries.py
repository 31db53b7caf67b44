"""The registries (issue 27, item 4): the partition kinds (``partition_fx.fx.kinds``), the named datasets
(``partition_fx.datasets.registry``) and the fixed choices (``partition_fx.choices``) are each written once, and
every consumer (conversion, flat storage, one-pass routing, the definition checks, ``load_dataset``, the
command line) reads them: a kind or dataset registered here is seen by all of them, and the command line offers
exactly what the library takes."""

from __future__ import annotations

import operator
import subprocess
import sys
import typing

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from partition_fx import PartitionConfig, partitionify
from partition_fx.choices import ASSIGNMENTS, COMPILE_MODES, DEFAULTS, PRECISIONS
from partition_fx.cli import build_parser
from partition_fx.datasets import NUM_DIGITS, digits, drawn_digits, load_dataset
from partition_fx.datasets.registry import NAMED_DATASETS, NamedDataset, dataset_names, named_dataset, register_dataset
from partition_fx.errors import PartitionArgumentError, PartitionError
from partition_fx.fx.config import Default
from partition_fx.fx.kinds import PARTITION_KINDS, PartitionKind, kind_names, partition_kind, register_kind
from partition_fx.job import spec as job_spec
from partition_fx.testing import assert_subnetworks_match_exports, perturb_partitions


def _option(command: str, dest: str) -> object:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    return next(action for action in sub._actions if action.dest == dest)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 3))


@pytest.mark.parametrize("command", ["train", "convert", "describe"])
def test_the_partition_options_offer_exactly_what_partitionify_takes(command) -> None:
    assert tuple(_option(command, "scheme").choices) == kind_names(scheme=True) == ("random", "node")
    assert tuple(_option(command, "default").choices) == DEFAULTS
    assert tuple(_option(command, "assignments").choices) == ASSIGNMENTS
    for scheme in kind_names(scheme=True):  # each one the command offers converts
        assert partitionify(_model(), 2, scheme=scheme).scheme == scheme


def test_train_and_the_library_share_precisions_compile_modes_and_datasets() -> None:
    from partition_fx.job import train_config
    from partition_fx.training.step import stepping

    assert tuple(_option("train", "precision").choices) == PRECISIONS == tuple(stepping.DTYPES)
    assert tuple(_option("train", "compile").choices) == COMPILE_MODES and train_config.COMPILE_MODES is COMPILE_MODES
    assert (
        job_spec.DATASETS
        == dataset_names(task="images", on_disk=False)
        == ("digits", "rotdigits", "scaledigits", "drawndigits")
    )
    assert job_spec.DISK_DATASETS == dataset_names(task="images", on_disk=True)
    assert {"cifar10", "rotcifar10", "cifar100", "mnist", "fashion_mnist", "svhn"} <= set(job_spec.DISK_DATASETS)
    assert tuple(_option("federated", "data").choices) == job_spec.DATASETS  # federated reads bundled data
    assert typing.get_args(Default) == DEFAULTS  # the static type names the same values


def test_the_registries_and_choices_import_no_torch() -> None:
    code = (
        "import sys\n"
        "from partition_fx.fx.kinds import kind_names\n"
        "from partition_fx.datasets import dataset_names, load_dataset\n"
        "from partition_fx import choices\n"
        "print(kind_names(scheme=True), dataset_names(), sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = "'digits', 'rotdigits', 'scaledigits', 'drawndigits', 'input_selection', 'cifar10', 'rotcifar10'"
    assert result.stdout.strip().startswith(f"('random', 'node') ({names}, ") and result.stdout.strip().endswith(" []")


def _convert_as(name: str, **kwargs):
    """A small model with a tensor of kind ``name``: as the scheme when it is one, else by a rule on the first
    Linear."""
    kind = partition_kind(name)
    if kind.scheme:
        return partitionify(_model(), 3, (0.5, 0.3, 0.2), scheme=name, seed=3, **kwargs)
    config = PartitionConfig().set_name("0", kind=name)
    return partitionify(_model(), 3, (0.5, 0.3, 0.2), seed=3, config=config, **kwargs)


@pytest.mark.parametrize("name", kind_names())
def test_every_registered_kind_converts_stores_exports_and_round_trips(name, tmp_path) -> None:
    kind = partition_kind(name)
    pmodel = _convert_as(name)
    tensors = [pt for _, pt in pmodel.partitioned_tensors() if pt.kind == name]
    assert tensors and all(isinstance(pt, kind.tensor_class()) for pt in tensors)
    assert all(pt.is_flat == (kind.storage is not None) for pt in tensors)  # flat storage by the kind's storage
    assert {g.kind for _, g in pmodel.flat_groups()} >= {name}
    x = torch.randn(5, 4)
    original = _model()
    for k in range(4):  # every subnetwork equals the original at conversion (default "init")
        torch.testing.assert_close(pmodel(x, subnetwork=k), original(x), rtol=0, atol=1e-6)
    perturb_partitions(pmodel, seed=1)
    assert_subnetworks_match_exports(pmodel, (x,))  # against the definition, tensor by tensor
    save_file(pmodel.state_dict(), tmp_path / "p.safetensors")
    fresh = _convert_as(name)
    fresh.load_state_dict(load_file(tmp_path / "p.safetensors"))
    for k in range(4):
        assert torch.equal(fresh(x, subnetwork=k), pmodel(x, subnetwork=k))
    if kind.scheme:  # one-pass routing takes the model when its scheme's kind is routed per layer
        assert pmodel.supports_one_pass() == (kind.one_pass == "layer")


@pytest.fixture
def difference_kind():
    """A toy copies kind: subnetwork k uses s_1 - s_2 - ... - s_k (copies 2..C start at 0)."""
    kind = register_kind(
        PartitionKind(
            "difference",
            "C copies, subnetwork k using s_1 minus the others",
            "partition_fx.fx.params:ScalePartitionedTensor",
            storage="copies",
            combine=operator.sub,
            identity=0.0,
            rule=True,
        )
    )
    yield kind
    del PARTITION_KINDS[kind.name]


def test_a_registered_kind_is_seen_by_config_conversion_flat_storage_one_pass_and_checks(difference_kind) -> None:
    assert "difference" in kind_names(rule=True)
    config = PartitionConfig().set_module_type(nn.LayerNorm, kind="difference")  # a rule kind now
    pmodel = partitionify(_model(), 3, scheme="node", config=config)
    kinds = {name: pt.kind for name, pt in pmodel.partitioned_tensors()}
    assert kinds["1.weight"] == kinds["1.bias"] == "difference" and kinds["0.weight"] == "node"
    assert "difference" in pmodel.describe()
    [group] = [g for _, g in pmodel.flat_groups() if g.kind == "difference"]
    assert group.combine is operator.sub and len(group.members) == 2
    x = torch.randn(5, 4)
    perturb_partitions(pmodel, seed=2)
    assert_subnetworks_match_exports(pmodel, (x,))
    norm = dict(pmodel.partitioned_tensors())["1.weight"]
    parts = norm.parts()
    assert torch.equal(norm.value(3), parts[0] - parts[1] - parts[2])
    # Its entry routes nothing per example: the node model falls back to grouping by subnetwork.
    assert not pmodel.supports_one_pass() and partitionify(_model(), 3, scheme="node").supports_one_pass()


def test_a_registered_scheme_is_offered_by_the_command_line() -> None:
    register_kind(
        PartitionKind("toy_units", "a toy scheme", "partition_fx.fx.params:RandomPartitionedTensor", scheme=True)
    )
    try:
        assert tuple(_option("convert", "scheme").choices) == ("random", "node", "toy_units")
        assert "toy_units: a toy scheme" in _option("describe", "scheme").help
    finally:
        del PARTITION_KINDS["toy_units"]


def test_kind_lookups_and_registration_refuse_clearly() -> None:
    with pytest.raises(PartitionArgumentError, match="unknown partition kind 'nodes'; registered: random, node"):
        partition_kind("nodes")
    with pytest.raises(PartitionArgumentError, match="'random' is registered already"):
        register_kind(partition_kind("random"))
    with pytest.raises(PartitionArgumentError, match="copies need a combine and an identity"):
        register_kind(PartitionKind("half", "no combine", "partition_fx.fx.params:ScalePartitionedTensor", "copies"))
    assert "half" not in PARTITION_KINDS
    with pytest.raises(PartitionArgumentError, match="rule kind must be one of \\('random', 'product', 'sum'\\)"):
        PartitionConfig().set_name("0", kind="node")  # node comes from the scheme, not from a rule


def _toy_images(size: int = 8, seed: int = 0):
    return digits(size=size, seed=seed)


def test_a_registered_dataset_is_loaded_by_name_and_offered_by_the_command_line() -> None:
    register_dataset(NamedDataset("toy_images", _toy_images, "the digits again", images=NUM_DIGITS))
    try:
        assert dataset_names(task="images")[-1] == "toy_images"
        assert load_dataset("toy_images", size=8).input_shape == (1, 8, 8)
        assert "toy_images" in _option("federated", "data").choices
        with pytest.raises(
            PartitionError, match=r"not one of digits, rotdigits, scaledigits, drawndigits, input_sel.*toy_images"
        ):
            load_dataset("toy_imagez")
        with pytest.raises(PartitionArgumentError, match="_toy_images does not take channels"):
            load_dataset("toy_images", channels=3)
    finally:
        del NAMED_DATASETS["toy_images"]
    with pytest.raises(PartitionArgumentError, match="'digits' is registered already"):
        register_dataset(NamedDataset("digits", _toy_images, "again"))


@pytest.mark.parametrize("name", dataset_names())
def test_every_named_dataset_resolves_to_its_public_loader_and_states_its_size(name) -> None:
    import partition_fx.datasets as datasets

    entry = named_dataset(name)
    if (
        entry.on_disk
    ):  # read from the user's copy: its size is checked on generated files in tests/test_standard_data.py
        assert entry.load_function() is datasets.standard_dataset and entry.keywords["name"] in name
        return
    assert entry.load_function() is getattr(datasets, name)
    if entry.images is not None:  # what the command line's memory check counts before loading
        data = load_dataset(name, size=8)
        assert entry.images == len(data.train) + len(data.test)
        assert entry.images == (10 * drawn_digits.PER_CLASS if name == "drawndigits" else NUM_DIGITS)
    assert named_dataset("./" + name) is None
