"""A converted model takes what its original takes and returns what it returns: forward arguments with defaults
(the input declared ``=None``, as Hugging Face models do; ``labels=None``), keyword inputs, and output types
(dataclass dicts as ``transformers``' ``ModelOutput``, ``OrderedDict``, NamedTuples, dataclasses). No
``transformers`` needed: tests/test_hf_models.py runs its models."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from partition_fx import export_subnetwork, partitionify
from partition_fx.errors import PartitionArgumentError
from partition_fx.testing import assert_subnetworks_match_exports, max_relative_difference, perturb_partitions


@dataclass
class Output(OrderedDict):  # type: ignore[type-arg]
    """A dict that is a dataclass holding its non-None fields, as ``transformers.utils.ModelOutput``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "logits"):
            if getattr(self, name) is not None:
                self[name] = getattr(self, name)

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - dataclass fields are attributes already
        raise AttributeError(name)


class LikeHuggingFace(nn.Module):
    """``forward(pixel_values=None, labels=None, return_dict=None)``: the input itself has a default, a loss only
    when labels are passed, and a dataclass-dict output (a tuple with ``return_dict=False``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(8, 3)

    def forward(self, pixel_values=None, labels=None, return_dict=None):  # type: ignore[no-untyped-def]
        logits = self.head(self.body(pixel_values))
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return Output(loss=loss, logits=logits)


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclass
class Plain:
    a: torch.Tensor
    b: torch.Tensor


class Returns(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.linear(x)
        if self.kind == "ordered":
            return OrderedDict(a=y, b=y * 2)
        if self.kind == "namedtuple":
            return Pair(y, y * 2)
        if self.kind == "dataclass":
            return Plain(y, y * 2)
        return Output(logits=y)


def _x() -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(0))


def test_the_input_declared_none_is_never_bound_to_its_default_and_the_model_traces() -> None:
    model = LikeHuggingFace().eval()
    pmodel = partitionify(model, 3)
    assert pmodel.untraced is None  # traced
    x = _x()
    with torch.no_grad():
        out = pmodel(x)
        assert type(out) is Output and set(out) == {"logits"}
        assert torch.equal(out.logits, model(x).logits)
        assert torch.equal(pmodel(pixel_values=x).logits, model(x).logits)  # by keyword too
    perturb_partitions(pmodel)
    assert_subnetworks_match_exports(pmodel, (x,))


def test_keyword_inputs_the_graph_is_specialised_to_reach_the_model() -> None:
    """``labels=`` (traced at its default None) runs the model's own forward: a loss, equal to the export's, with
    gradients to the partitions; ``return_dict=False`` gives the original's tuple."""
    model = LikeHuggingFace().eval()
    pmodel = partitionify(model, 3)
    perturb_partitions(pmodel)
    x, y = _x(), torch.tensor([0, 1, 2, 0, 1])
    for k in range(4):
        exported = export_subnetwork(pmodel, k).eval()
        with torch.no_grad():
            got, want = pmodel(x, labels=y, subnetwork=k), exported(x, labels=y)
        assert type(got) is Output and set(got) == {"loss", "logits"}
        assert max_relative_difference(got.loss, want.loss) <= 1e-6 and torch.equal(got.logits, want.logits)
        got_tuple = pmodel(x, y, False, subnetwork=k)
        assert type(got_tuple) is tuple and len(got_tuple) == 2
    pmodel(x, labels=y, subnetwork=2, grad_partition=2).loss.backward()
    stepped = [p for p in pmodel.partition_parameters(2) if p.grad is not None]
    assert stepped and all(p.grad is None for p in pmodel.partition_parameters(3))


def test_the_model_s_own_forward_follows_the_wrapper_s_mode() -> None:
    model = LikeHuggingFace().train()
    pmodel = partitionify(model, 2)
    x, y = _x(), torch.tensor([0, 1, 2, 0, 1])
    pmodel.eval()
    with torch.no_grad():
        want = export_subnetwork(pmodel).eval()(x, labels=y).loss
        assert torch.equal(pmodel(x, labels=y).loss, want)  # dropout off, BatchNorm's running statistics
        assert torch.equal(pmodel(x, labels=y).loss, want)


def test_trace_always_and_per_example_subnetworks_refuse_a_specialised_argument_by_name() -> None:
    x, y = _x(), torch.tensor([0, 1, 2, 0, 1])
    always = partitionify(LikeHuggingFace().eval(), 2, trace="always")
    assert torch.equal(always(x).logits, export_subnetwork(always).eval()(x).logits)
    with pytest.raises(PartitionArgumentError, match=r"labels= is not an input .*trace='auto'"):
        always(x, labels=y)
    auto = partitionify(LikeHuggingFace().eval(), 2)
    with pytest.raises(PartitionArgumentError, match=r"per-example subnetworks .* labels="):
        auto(x, labels=y, subnetwork=torch.tensor([0, 1, 2, 0, 1]))


def test_keywords_a_forward_takes_in_kwargs_reach_it() -> None:
    class TakesKwargs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return self.linear(x) * kwargs.get("scale", 1.0)

    model, x = TakesKwargs(), _x()
    pmodel = partitionify(model, 2)
    assert pmodel.untraced is None
    assert torch.equal(pmodel(x, scale=3.0), model(x, scale=3.0))
    assert torch.equal(pmodel(x), model(x))


@pytest.mark.parametrize("kind", ["ordered", "namedtuple", "dataclass", "model_output"])
def test_outputs_keep_their_type_traced_or_not(kind: str) -> None:
    model = Returns(kind)
    x = _x()
    for trace in ("always", "never"):
        pmodel = partitionify(model, 2, trace=trace)
        got, want = pmodel(x), model(x)
        assert type(got) is type(want), (trace, type(got))
        assert max_relative_difference(got, want) == 0.0


def test_an_untraced_model_s_partitions_follow_its_mode_from_conversion_on() -> None:
    model = LikeHuggingFace().eval()
    pmodel = partitionify(model, 2, trace="never")
    assert not any(m.training for m in pmodel.modules())
    pmodel = partitionify(LikeHuggingFace().train(), 2, trace="never")
    assert all(m.training for m in pmodel.modules())
