"""Bad input gets a clear error from partition-fx naming what is wrong and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from partition_fx import (
    PartitionArgumentError,
    PartitionConfig,
    PartitionError,
    PartitionTypeError,
    export_onnx,
    export_subnetwork,
    partitionify,
)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        (dict(num_partitions=3, proportions=(0.5, 0.6, -0.1)), PartitionArgumentError, "proportions[2] = -0.1"),
        (dict(num_partitions=3, proportions=(0.5, 0.3, 0.1)), PartitionArgumentError, "must sum to 1"),
        (dict(num_partitions=3, proportions=(0.5, 0.5)), PartitionArgumentError, "has 2 entries but num_partitions=3"),
        (dict(num_partitions=2, proportions=(0.5, float("nan"))), PartitionArgumentError, "finite"),
        (dict(num_partitions=2, proportions="0.5,0.5"), PartitionTypeError, "sequence"),
        (dict(num_partitions=2, proportions=(0.5, "0.5")), PartitionTypeError, "proportions[1]"),
        (dict(num_partitions=0), PartitionArgumentError, "num_partitions must be >= 1"),
        (dict(num_partitions=-2), PartitionArgumentError, "num_partitions must be >= 1"),
        (dict(num_partitions=2.0), PartitionTypeError, "num_partitions must be an int"),
        (dict(num_partitions="3"), PartitionTypeError, "num_partitions must be an int"),
        (dict(num_partitions=True), PartitionTypeError, "num_partitions must be an int"),
        (dict(num_partitions=300), PartitionArgumentError, "<= 255"),
        (dict(scheme="blocks"), PartitionArgumentError, "scheme must be one of ('random', 'node')"),
        (dict(default="ones"), PartitionArgumentError, "default must be one of ('init', 'zero', 'seed')"),
        (dict(assignments="packed"), PartitionArgumentError, "assignments must be one of ('stored', 'regenerated')"),
        (dict(seed=-1), PartitionArgumentError, "seed must be an int in 0..2**63-1, got -1"),
        (dict(seed=2**63), PartitionArgumentError, "seed must be an int in 0..2**63-1"),
        (dict(seed="1"), PartitionTypeError, "seed must be an int"),
        (dict(config={"exclude": ["fc"]}), PartitionTypeError, "config must be a PartitionConfig"),
    ],
)
def test_bad_conversion_arguments(kwargs, error, fragment) -> None:
    with pytest.raises(error) as info:
        partitionify(model(), **kwargs)
    assert fragment in str(info.value)
    assert isinstance(info.value, PartitionError)


def test_proportions_within_tolerance_are_accepted() -> None:
    pmodel = partitionify(model(), 3, (0.8, 0.1, 0.1 + 5e-7))
    assert pmodel.proportions == (0.8, 0.1, 0.1 + 5e-7)


def test_not_a_module() -> None:
    with pytest.raises(PartitionTypeError, match=r"needs an nn\.Module, got function"):
        partitionify(lambda x: x, 3)  # type: ignore[arg-type]
    pmodel = partitionify(model(), 2)
    with pytest.raises(PartitionArgumentError, match="already a PartitionedModel"):
        partitionify(pmodel, 2)
    with pytest.raises(PartitionTypeError, match="needs a PartitionedModel"):
        export_subnetwork(model())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("subnetwork", "error", "fragment"),
    [
        (-1, PartitionArgumentError, "subnetwork must be in 0..3"),
        (4, PartitionArgumentError, "got 4"),
        (1.5, PartitionTypeError, "subnetwork must be an int in 0..3, got 1.5"),
        (True, PartitionTypeError, "got True"),
        ("1", PartitionTypeError, "got '1'"),
        (torch.tensor(0.5), PartitionTypeError, "subnetwork must be an int"),
    ],
)
def test_subnetwork_out_of_range(subnetwork, error, fragment) -> None:
    pmodel = partitionify(model(), 3)
    with pytest.raises(error) as info:
        pmodel(torch.randn(1, 3), subnetwork=subnetwork)
    assert fragment in str(info.value)
    with pytest.raises(error):
        export_subnetwork(pmodel, subnetwork)


def test_subnetwork_accepts_integer_like_values() -> None:
    pmodel = partitionify(model(), 3)
    x = torch.randn(2, 3)
    assert torch.equal(pmodel(x, subnetwork=torch.tensor(2)), pmodel(x, subnetwork=2))
    import numpy as np

    assert torch.equal(pmodel(x, subnetwork=np.int64(1)), pmodel(x, subnetwork=1))


def test_partition_parameters_range() -> None:
    pmodel = partitionify(model(), 3)
    for bad in (0, 4, 1.0):
        with pytest.raises(PartitionArgumentError, match=r"partition must be an int in 1\.\.3"):
            pmodel.partition_parameters(bad)  # type: ignore[arg-type]


def test_bad_config_rules() -> None:
    with pytest.raises(PartitionArgumentError, match="rule default must be one of"):
        PartitionConfig().set_name("fc", default="ones")
    with pytest.raises(PartitionArgumentError, match="rule kind must be one of"):
        PartitionConfig().set_name("fc", kind="node")
    with pytest.raises(PartitionArgumentError, match="invalid pattern"):
        PartitionConfig().set_name_regex("fc[")
    with pytest.raises(PartitionTypeError, match=r"nn\.Module subclass"):
        PartitionConfig().set_module_type(int)
    with pytest.raises(PartitionTypeError, match=r"nn\.Module subclass or a name"):
        PartitionConfig().add_leaf_module(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PartitionConfig().set_name("fc", exclude=True)
    with pytest.raises(PartitionArgumentError, match="leaf module 'nope' is not a submodule"):
        partitionify(model(), 2, config=PartitionConfig().add_leaf_module("nope"))


def test_onnx_mismatch_and_bad_inputs_are_reported(tmp_path) -> None:
    pmodel = partitionify(model(), 2)
    with pytest.raises(PartitionTypeError, match="example_inputs must be a tensor"):
        export_onnx(pmodel, tmp_path / "m.onnx", example_inputs="x")
    with pytest.raises(PartitionError, match=r"torch\.onnx\.export failed"):
        export_onnx(pmodel, tmp_path / "m.onnx", (torch.randn(2, 5),))  # wrong feature size
    assert not (tmp_path / "m.onnx").exists()  # nothing half-written
    assert list(tmp_path.iterdir()) == []
