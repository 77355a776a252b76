"""Bind an ONNX graph's dynamic dimensions and infer every tensor's shape at those sizes.

The batch dimension is bound to one sample (costs are per sample) and the other dynamic dimensions to the
job's sizes; ONNX shape inference then runs strict, with data propagation, so shapes computed through
Shape/Gather/Concat chains resolve. What ONNX's propagation does not follow (integer arithmetic on shapes,
as PyTorch's exporters write it) is folded here first. The first step of ``lower.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.load import OnnxGraph
from vipu.emulator.onnxgraph.rules import is_declared

_CUSTOM_PASSES = 64


def bind(graph: OnnxGraph, bindings: dict[str, int]) -> tuple[onnx.ModelProto, int]:
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    g = model.graph
    del g.value_info[:]
    for out in g.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    weights = set(graph.weights)
    static_batch = graph.batch_dim if isinstance(graph.batch_dim, int) else 1
    for vi in g.input:
        if vi.name in weights or not vi.type.HasField("tensor_type"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                continue
            name = d.dim_param if d.HasField("dim_param") else ""
            if (name and name == graph.batch_dim) or (not name and axis == 0):
                d.dim_value = 1
            elif name in bindings:
                d.dim_value = bindings[name]
            else:
                label = f"dimension {name!r}" if name else f"axis {axis}"
                raise GraphError(
                    "unknown-shape",
                    f"{label} of input {vi.name!r} has no size: bind it"
                    + (
                        f' with dims, e.g. "dims": {{"{name}": 128}}'
                        if name
                        else "; this axis has no name, so export the model with a fixed size or a named "
                        "dynamic axis"
                    ),
                    (name or f"{vi.name}[{axis}]",),
                )
    return model, max(1, static_batch)


def infer(model: onnx.ModelProto, graph: OnnxGraph) -> onnx.ModelProto:
    custom = [n for n in model.graph.node if is_declared(n.domain, n.op_type, graph.declared_elementwise)]
    try:
        inferred = onnx.shape_inference.infer_shapes(
            model, check_type=False, strict_mode=True, data_prop=True
        )
        # Shape arithmetic ONNX's data propagation does not follow (``Div``, ``Mod``, ...): evaluate it at
        # the bound sizes, make it constant, infer again, until nothing more resolves.
        for _ in range(_FOLD_PASSES):
            if not _fold_shape_arithmetic(model, inferred):
                break
            inferred = onnx.shape_inference.infer_shapes(
                model, check_type=False, strict_mode=True, data_prop=True
            )
    except GraphError:
        raise
    except Exception as exc:
        raise GraphError("shape-inference", f"ONNX shape inference failed: {_short(str(exc))}")
    # Declared element-wise operators have no shape function: give each the type of its first input,
    # then infer again past it, until every one is known.
    for _ in range(_CUSTOM_PASSES if custom else 0):
        known = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.input)}
        added = False
        for node in custom:
            if not node.input or node.input[0] not in known:
                continue
            for out in node.output:
                if out and out not in known:
                    vi = onnx.ValueInfoProto()
                    vi.CopyFrom(known[node.input[0]])
                    vi.name = out
                    model.graph.value_info.append(vi)
                    added = True
        if not added:
            break
        try:
            inferred = onnx.shape_inference.infer_shapes(
                model, check_type=False, strict_mode=True, data_prop=True
            )
        except Exception as exc:
            raise GraphError("shape-inference", f"ONNX shape inference failed: {_short(str(exc))}")
    return inferred


# ------------------------------------------------------------------------------------ shape arithmetic

_FOLD_PASSES = 16
_FOLD_MAX_ELEMENTS = 1024
# What ONNX's data propagation follows (onnx/defs: ``PartialDataPropagationFunction``); an integer tensor
# computed by anything else from shapes has no value for shape inference, so a Reshape fed by it has no
# shape. PyTorch's TorchScript exporter writes ``head_dim = embed_dim // num_heads`` as a ``Div``, so every
# ``nn.MultiheadAttention`` export has one.
_PROPAGATED = frozenset(
    {
        "Constant",
        "Shape",
        "Size",
        "Gather",
        "Slice",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Cast",
        "Add",
        "Sub",
        "Mul",
    }
)
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Max": np.maximum,
    "Min": np.minimum,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Pow": np.power,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "Identity": lambda a: a,
    "Neg": np.negative,
    "Abs": np.abs,
    "Not": np.logical_not,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Sqrt": np.sqrt,
    "Sign": np.sign,
}


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _tensor_value(t: onnx.TensorProto) -> Any:
    """The value of a tensor that kept its data (a stripped weight has none), else None."""
    if t.data_location == onnx.TensorProto.EXTERNAL or math.prod(t.dims) > _FOLD_MAX_ELEMENTS:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def _evaluate(node: onnx.NodeProto, ins: list[Any], shapes: dict[str, tuple[int, ...]]) -> Any:
    """The value of ``node``'s first output from its inputs' values (or its input's shape), else None."""
    op = node.op_type
    if op == "Constant":
        if node.attribute and node.attribute[0].name in ("value", "value_int", "value_ints"):
            a = node.attribute[0]
            if a.name == "value":
                return _tensor_value(a.t)
            return np.array(onnx.helper.get_attribute_value(a), dtype=np.int64)
        return None
    if op in ("Shape", "Size"):
        shape = shapes.get(node.input[0])
        if shape is None:
            return None
        if op == "Size":
            return np.array(math.prod(shape), dtype=np.int64)
        rank = len(shape)
        start, end = _attr(node, "start", 0), _attr(node, "end", rank)
        return np.array(shape[slice(start, end)], dtype=np.int64)
    if not ins or any(v is None for v in ins):
        return None
    if op in _UNARY:
        return _UNARY[op](ins[0])
    if op == "Cast":
        return ins[0].astype(onnx.helper.tensor_dtype_to_np_dtype(_attr(node, "to")))
    if op in _BINARY:
        return _BINARY[op](ins[0], ins[1])
    if op == "Div":
        a, b = ins
        if np.issubdtype(a.dtype, np.integer):
            return np.trunc(np.true_divide(a, b)).astype(a.dtype)  # C's integer division, as ONNX Runtime
        return np.true_divide(a, b).astype(a.dtype)
    if op == "Mod":
        a, b = ins
        return (np.fmod(a, b) if _attr(node, "fmod", 0) else np.mod(a, b)).astype(a.dtype)
    if op == "Where":
        return np.where(ins[0], ins[1], ins[2])
    if op == "Gather":
        return np.take(ins[0], ins[1], axis=_attr(node, "axis", 0))
    if op == "Concat":
        return np.concatenate([np.atleast_1d(v) for v in ins], axis=_attr(node, "axis", 0))
    if op == "Unsqueeze":
        out = ins[0]
        axes = ins[1] if len(ins) > 1 else _attr(node, "axes", [])
        rank = out.ndim + len(axes)
        for axis in sorted(int(a) % rank for a in axes):
            out = np.expand_dims(out, axis)
        return out
    if op == "Squeeze":
        axes = ins[1] if len(ins) > 1 else _attr(node, "axes", None)
        return np.squeeze(ins[0], axis=None if axes is None else tuple(int(a) for a in axes))
    if op == "Slice":
        data, starts, ends = ins[:3]
        axes = ins[3] if len(ins) > 3 else range(len(starts))
        steps = ins[4] if len(ins) > 4 else [1] * len(starts)
        index = [slice(None)] * data.ndim
        for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
            index[int(a)] = slice(int(s), int(e), int(st))
        return data[tuple(index)]
    if op == "Reshape":
        target = [int(d) for d in ins[1]]
        target = [ins[0].shape[i] if d == 0 else d for i, d in enumerate(target)]
        return ins[0].reshape(target)
    if op == "Range":
        return np.arange(ins[0], ins[1], ins[2])
    if op == "ReduceProd" and len(ins) == 1 and _attr(node, "axes") is None:
        return np.prod(ins[0], keepdims=bool(_attr(node, "keepdims", 1)))
    return None


def _fold_shape_arithmetic(model: onnx.ModelProto, inferred: onnx.ModelProto) -> int:
    """Replace, in ``model``, integer tensors computed from shapes and constants by ``Constant`` nodes
    when some of them come from an operator ONNX's data propagation does not follow. Returns how many of
    those were replaced (0: nothing to do, shape inference already saw every value it can)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tt = vi.type.tensor_type
        known = vi.type.HasField("tensor_type") and tt.HasField("shape")
        if known and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    values: dict[str, Any] = {}
    for t in model.graph.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
        value = _tensor_value(t)
        if value is not None:
            values[t.name] = value
    found: dict[int, Any] = {}
    unpropagated = 0
    for i, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        ins = [values.get(t) if t else None for t in node.input]
        try:
            value = _evaluate(node, ins, shapes)
        except Exception:
            value = None
        if value is None:
            continue
        value = np.asarray(value)
        if value.size > _FOLD_MAX_ELEMENTS:
            continue
        values[node.output[0]] = value
        if node.op_type != "Constant" and (value.dtype == np.bool_ or np.issubdtype(value.dtype, np.integer)):
            found[i] = value
            unpropagated += node.op_type not in _PROPAGATED
    if not unpropagated:
        return 0
    for i, value in found.items():
        node = model.graph.node[i]
        constant = onnx.helper.make_node(
            "Constant",
            [],
            [node.output[0]],
            name=node.name,
            value=numpy_helper.from_array(value, node.output[0]),
        )
        node.CopyFrom(constant)
    return unpropagated


def _short(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= 600 else text[:600] + " ..."
