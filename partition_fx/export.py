"""Export a subnetwork as a plain module of the original class, or as an ONNX file checked in onnxruntime."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypedDict

import torch
from torch import nn

from ._io import replace_file
from .errors import PartitionError, PartitionTypeError, first_line
from .fx.partitioned_model import PartitionedModel


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
    for name, meta_buffer in buffers:
        new_buffers.setdefault(id(meta_buffer), state[name])
        _assign(exported, name, new_buffers[id(meta_buffer)], buffer=True)
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
    names: _OnnxNames = {
        "input_names": _names(input_names, "input_names"),
        "output_names": _names(output_names, "output_names"),
    }
    properties = _metadata_props(metadata)
    model = export_subnetwork(pmodel, subnetwork)
    model = (wrap(model) if wrap is not None else model).eval()
    path = Path(path)
    try:
        replace_file(
            path, lambda tmp: _write_verified_onnx(model, inputs, tmp, dynamic_batch, atol, rtol, names, properties)
        )
    except _ExportFailed as failed:
        raise PartitionError(_export_failure(failed.error, pmodel, model, inputs, dynamic_batch)) from failed.error
    return path


class _OnnxNames(TypedDict):
    """``torch.onnx.export``'s keywords that name the graph's inputs and outputs."""

    input_names: list[str] | None
    output_names: list[str] | None


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
    names: _OnnxNames,
    metadata: Mapping[str, str],
) -> None:
    """Export ``model`` to ``path`` (its inputs and outputs ``names``, ``metadata`` in its ``metadata_props``),
    check the file, and compare onnxruntime's outputs with PyTorch's."""
    import onnx
    import onnxruntime as ort

    try:
        with _without_partial_graphs():
            torch.onnx.export(
                model,
                inputs,
                str(path),
                dynamo=True,
                dynamic_shapes=_batch_shapes(inputs) if dynamic_batch else None,
                external_data=False,
                verbose=False,
                **names,
            )
    except Exception as e:
        raise _ExportFailed(e) from e
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
    for i, (want, g) in enumerate(zip(expected, got)):
        e_np = want.detach().cpu().float().numpy()
        diff = float(abs(e_np - g).max()) if e_np.size else 0.0
        bound = atol + rtol * float(abs(e_np).max()) if e_np.size else atol
        if e_np.shape != g.shape or diff > bound:
            raise PartitionError(
                f"ONNX output {i} disagrees with PyTorch: max abs difference {diff:.3g} "
                f"(allowed {bound:.3g}), shapes {tuple(e_np.shape)} vs {tuple(g.shape)}"
            )


class _ExportFailed(Exception):
    """torch.onnx.export raised ``error``: ``export_onnx`` words it, knowing the partitioned model."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _batch_shapes(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """torch.export's ``dynamic_shapes`` making dimension 0 of every tensor argument one ``batch`` dimension; any
    other argument (a list of images, a dict) mirrors its structure with None, since torch refuses a bare None
    for it. None when no argument is a tensor with a batch dimension.

    >>> _batch_shapes((torch.zeros(2, 3), [torch.zeros(3)], 1.0))
    ({0: Dim('batch', min=0)}, [None], None)
    >>> _batch_shapes(([torch.zeros(3, 8, 8)],)) is None
    True
    """
    from torch.utils._pytree import tree_map

    if not any(isinstance(t, torch.Tensor) and t.dim() > 0 for t in inputs):
        return None
    batch = torch.export.Dim("batch")
    return tuple(
        {0: batch} if isinstance(t, torch.Tensor) and t.dim() > 0 else tree_map(lambda _: None, t) for t in inputs
    )


class _WithoutPartialGraphs:
    """``stream`` less what torch.export prints from ``torch/export/_trace.py``: on a failed capture, the partial
    graph it built (hundreds of lines of generated code; its exception says what failed)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        caller = sys._getframe(1).f_code.co_filename.replace(os.sep, "/")
        return len(text) if caller.endswith("torch/export/_trace.py") else self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _without_partial_graphs() -> contextlib.AbstractContextManager[Any]:
    return contextlib.redirect_stderr(_WithoutPartialGraphs(sys.stderr))


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or while handling, outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return chain


def _fixes_the_batch(error: BaseException) -> bool:
    """torch.export refused the dynamic batch dimension: a constraint violation, which only the ``batch`` dimension
    of :func:`_batch_shapes` (the one dimension export_onnx makes dynamic) can raise. By name: the classes are
    private to torch."""
    return any(
        type(e).__name__ == "ConstraintViolationError"
        or (
            type(e).__name__ == "UserError"
            and getattr(getattr(e, "error_type", None), "name", "") == "CONSTRAINT_VIOLATION"
        )
        for e in _causes(error)
    )


_CAUSED_BY = re.compile(r"^Caused by: \((.+)\)\s*$", re.MULTILINE)


def _gist(error: BaseException) -> str:
    """What torch.onnx.export's ``error`` says failed, on one line: the exception it was raised from (its own
    first line is "Failed to export the model with torch.export. This is step 1/3 ..."), and where torch says
    it happened.

    >>> try:
    ...     raise RuntimeError("step 1 failed") from ValueError("no\\nCaused by: (ops/boxes.py:103 in nms)")
    ... except RuntimeError as e:
    ...     _gist(e)
    'ValueError: no (at ops/boxes.py:103 in nms)'
    """
    cause = error.__cause__ or error
    where = _CAUSED_BY.search(str(cause))
    said = " ".join(first_line(cause).split())
    return f"{type(cause).__name__}: {said}" + (f" (at {where.group(1)})" if where else "")


def _export_failure(
    error: Exception, pmodel: PartitionedModel, model: nn.Module, inputs: tuple[Any, ...], dynamic_batch: bool
) -> str:
    """export_onnx's message for torch.onnx.export's ``error`` exporting ``model`` (subnetwork k of ``pmodel``, or
    ``wrap`` of it) on ``inputs``: what failed, then what to do, on two lines."""
    name, original = type(model).__name__, pmodel.original_class.__name__
    what = f"torch.onnx.export failed for {name}: {_gist(error)}"
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:
        return f"{what}\n  {name} does not run on example_inputs either ({type(e).__name__}: {first_line(e)})."
    if dynamic_batch and _fixes_the_batch(error):
        return (
            f"{what}\n  The model fixes the batch size (or an input's first dimension is not a batch): "
            "dynamic_batch=False exports it for the example's batch size only."
        )
    route = (
        f"export_subnetwork(pmodel) gives the plain {original}, which torch's TorchScript exporter, "
        "torch.onnx.export(model, example_inputs, path, dynamo=False), exports"
    )
    if pmodel.untraced is not None:
        return (
            f"{what}\n  {original} runs untraced (fx could not trace it) and export_onnx cannot export it: {route}, "
            "as it does torchvision's detection models."
        )
    return f"{what}\n  Change the code torch.export stops at, or: {route}."
