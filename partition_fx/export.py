"""Export a subnetwork as a plain module of the original class, or as an ONNX file checked in onnxruntime."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._io import replace_file
from .errors import PartitionError, PartitionTypeError, first_line
from .partitioned_model import PartitionedModel


def export_subnetwork(pmodel: PartitionedModel, k: int | None = None) -> nn.Module:
    """Subnetwork k (default C, the final model) as a NEW module of the original class.

    The result has exactly the original state_dict keys, shapes and dtypes, shares no storage with
    ``pmodel``, needs nothing from partition-fx to run, and is in ``pmodel``'s train/eval mode.

    Example::

        >>> import torch
        >>> from partition_fx import partitionify, export_subnetwork
        >>> model = torch.nn.Linear(3, 2)
        >>> pmodel = partitionify(model, 2)
        >>> plain = export_subnetwork(pmodel)
        >>> type(plain).__name__, sorted(plain.state_dict()) == sorted(model.state_dict())
        ('Linear', True)
    """
    if not isinstance(pmodel, PartitionedModel):
        raise PartitionTypeError(
            f"export_subnetwork needs a PartitionedModel (from partitionify), got {type(pmodel).__name__}"
        )
    k = pmodel.check_subnetwork(k)
    with torch.no_grad():
        state = {name: t.detach().clone() for name, t in pmodel.original_state(k).items()}
    exported = copy.deepcopy(pmodel.skeleton)
    # Re-create parameters once per original tensor so tied weights stay tied. The lists keep every
    # meta tensor alive while they are replaced: a freed one's id() could be reused by the next.
    params = list(exported.named_parameters(remove_duplicate=False))
    buffers = list(exported.named_buffers(remove_duplicate=False))
    new_params: dict[int, nn.Parameter] = {}
    for name, meta in params:
        if id(meta) not in new_params:
            new_params[id(meta)] = nn.Parameter(state[name], requires_grad=meta.requires_grad)
        _assign(exported, name, new_params[id(meta)], buffer=False)
    new_buffers: dict[int, torch.Tensor] = {}
    for name, meta in buffers:
        new_buffers.setdefault(id(meta), state[name])
        _assign(exported, name, new_buffers[id(meta)], buffer=True)
    return exported.train(pmodel.training)


def _assign(root: nn.Module, name: str, value: torch.Tensor, *, buffer: bool) -> None:
    owner_name, _, local = name.rpartition(".")
    owner = root.get_submodule(owner_name)
    if buffer:
        owner._buffers[local] = value
    else:
        owner._parameters[local] = value  # type: ignore[assignment]


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, (str, bytes)):
        return tuple(example_inputs)
    raise PartitionTypeError(
        f"example_inputs must be a tensor or a tuple of tensors, got {type(example_inputs).__name__}"
    )


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a (nested tuple/list/dict) model output, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flat_tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in flat_tensors(v)]
    return []


def export_onnx(
    pmodel: PartitionedModel,
    path: str | os.PathLike[str],
    example_inputs: Any,
    *,
    subnetwork: int | None = None,
    dynamic_batch: bool = True,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Export subnetwork ``subnetwork`` (default C) to ONNX, check it, and verify it in onnxruntime.

    The plain module from :func:`export_subnetwork` (or ``wrap`` of it, e.g. a
    :class:`~partition_fx.transforms.TestTimeAveraged` predictor) is exported in eval mode; ``onnx.checker`` validates
    the file, and onnxruntime's outputs on ``example_inputs`` must match PyTorch's within
    ``atol + rtol * |expected|`` or a :class:`PartitionError` gives the max abs difference. The file is
    written atomically: on any failure nothing is left at ``path``.

    ``input_names``/``output_names`` name the graph's inputs and outputs (default: the exporter's own, such as
    ``x`` and ``linear``); ``metadata`` goes into the file's ``metadata_props`` (onnxruntime:
    ``session.get_modelmeta().custom_metadata_map``), a string value as it is and any other as JSON.

    Example::

        >>> import torch, tempfile, os
        >>> from partition_fx import partitionify, export_onnx
        >>> pmodel = partitionify(torch.nn.Sequential(torch.nn.Linear(4, 3)), 2)
        >>> path = export_onnx(pmodel, os.path.join(tempfile.mkdtemp(), "m.onnx"), (torch.randn(2, 4),))
        >>> path.name
        'm.onnx'
    """
    inputs = _as_tuple(example_inputs)
    names = {"input_names": _names(input_names, "input_names"), "output_names": _names(output_names, "output_names")}
    properties = _metadata_props(metadata)
    model = export_subnetwork(pmodel, subnetwork)
    model = (wrap(model) if wrap is not None else model).eval()
    path = Path(path)
    replace_file(
        path, lambda tmp: _write_verified_onnx(model, inputs, tmp, dynamic_batch, atol, rtol, names, properties)
    )
    return path


def _names(names: Sequence[str] | None, what: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise PartitionTypeError(f"{what} must be a list of non-empty strings, got {names!r}")
    return list(names)


def _metadata_props(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """``metadata`` as ONNX ``metadata_props`` (strings as they are, anything else as JSON).

    >>> _metadata_props({"classes": ["a", "b"], "output": "logits"})
    {'classes': '["a", "b"]', 'output': 'logits'}
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise PartitionTypeError(f"metadata must be a mapping with string keys, got {type(metadata).__name__}")
    try:
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    except (TypeError, ValueError) as e:
        raise PartitionTypeError(f"metadata values must be strings or JSON-serialisable: {e}") from None


def _write_verified_onnx(
    model: nn.Module,
    inputs: tuple[Any, ...],
    path: Path,
    dynamic_batch: bool,
    atol: float,
    rtol: float,
    names: Mapping[str, list[str] | None],
    metadata: Mapping[str, str],
) -> None:
    """Export ``model`` to ``path`` (its inputs and outputs ``names``, ``metadata`` in its ``metadata_props``),
    check the file, and compare onnxruntime's outputs with PyTorch's."""
    import onnx
    import onnxruntime as ort

    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch")
        dynamic_shapes = tuple({0: batch} if isinstance(t, torch.Tensor) and t.dim() > 0 else None for t in inputs)
    try:
        torch.onnx.export(
            model,
            inputs,
            str(path),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            verbose=False,
            **names,
        )
    except Exception as e:
        raise PartitionError(
            f"torch.onnx.export failed for {type(model).__name__}: {type(e).__name__}: {first_line(e)}"
            + ("\n  Try dynamic_batch=False if the model specialises on the batch size." if dynamic_batch else "")
        ) from e
    if metadata:
        proto = onnx.load(str(path))
        kept = {p.key: p.value for p in proto.metadata_props if p.key not in metadata}
        onnx.helper.set_model_props(proto, {**kept, **metadata})
        onnx.save(proto, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    with torch.no_grad():
        expected = flat_tensors(model(*inputs))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {
        i.name: t.detach().cpu().numpy()
        for i, t in zip(session.get_inputs(), [t for t in inputs if isinstance(t, torch.Tensor)])
    }
    got = session.run(None, feeds)
    if len(got) != len(expected):
        raise PartitionError(f"onnxruntime returned {len(got)} outputs, PyTorch {len(expected)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        e_np = e.detach().cpu().float().numpy()
        diff = float(abs(e_np - g).max()) if e_np.size else 0.0
        bound = atol + rtol * float(abs(e_np).max()) if e_np.size else atol
        if e_np.shape != g.shape or diff > bound:
            raise PartitionError(
                f"ONNX output {i} disagrees with PyTorch: max abs difference {diff:.3g} "
                f"(allowed {bound:.3g}), shapes {tuple(e_np.shape)} vs {tuple(g.shape)}"
            )
