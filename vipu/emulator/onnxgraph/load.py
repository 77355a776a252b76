"""Read a (stripped) ONNX model: parse it, check it is a graph the emulator can plan, put its nodes in
topological order and describe its inputs and dynamic dimensions.

Everything here depends only on the graph's structure, not on the dimensions a job binds, so it is done
once per graph (``load_graph`` is cached by content digest by its callers).
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx
import onnx.inliner
from google.protobuf.message import DecodeError

from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.rules import DEFAULT_DOMAINS, qualified, role_of

MAX_NODES = 200_000
MAX_LISTED = 10
# Dimension names a sequence length binds when the job gives seq_len (lower-case match anywhere).
SEQ_NAME = re.compile(r"seq|sequence|length|len$|token|time|step|^s$|^t$|^l$")
BATCH_NAME = re.compile(r"batch|^n$|^b$|^bs$|^bsz$")

Dim = int | str | None
"""A dimension: a size, a symbolic name (a dynamic dimension), or None (unknown, unnamed)."""

_FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
        *(
            getattr(onnx.TensorProto, n)
            for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
            if hasattr(onnx.TensorProto, n)
        ),
    }
)


def dtype_name(elem_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "unknown"


def dtype_bytes(elem_type: int) -> float:
    try:
        return float(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except Exception:
        return 4.0


def is_float(elem_type: int) -> bool:
    return elem_type in _FLOAT_TYPES


@dataclass(frozen=True, slots=True)
class GraphInput:
    name: str
    dtype: str
    elem_type: int
    shape: tuple[Dim, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "dynamic": [i for i, d in enumerate(self.shape) if not isinstance(d, int)],
        }


@dataclass(frozen=True, eq=False)
class OnnxGraph:
    """A parsed, checked ONNX graph with its nodes in topological order. Immutable by convention."""

    digest: str
    model: onnx.ModelProto
    inputs: tuple[GraphInput, ...]
    outputs: tuple[str, ...]
    opset: int
    declared_elementwise: frozenset[str]
    op_counts: dict[str, int]
    weights: dict[str, tuple[int, tuple[int, ...]]]
    """Initializer name -> (element type, dimensions): the constants the graph was exported with."""
    batch_dim: str | int | None
    """The batch dimension: its symbolic name, or its fixed size, or None when the inputs have no axis 0."""
    dynamic_dims: tuple[str, ...]
    """Symbolic dimensions of the inputs other than the batch: a job binds them (seq_len or dims)."""
    unnamed_dims: tuple[str, ...] = field(default=())
    """Input axes with neither a size nor a name, as ``input[axis]``."""
    producer: str = ""

    @property
    def parameters(self) -> int:
        """Elements of the floating-point weights with more than one element."""
        total = 0
        for elem_type, dims in self.weights.values():
            n = _numel(dims)
            if is_float(elem_type) and n > 1:
                total += n
        total += _constant_node_params(self.model.graph)
        return total

    @property
    def nodes(self) -> int:
        return len(self.model.graph.node)


def _numel(dims: tuple[int, ...] | list[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _constant_node_params(graph: onnx.GraphProto) -> int:
    total = 0
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    n = _numel(attr.t.dims)
                    if is_float(attr.t.data_type) and n > 1:
                        total += n
    return total


def _shape_of(vi: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


MAX_DIM = 2**31 - 1
"""The largest dimension a tensor of the graph may declare."""
MAX_ELEMENTS = 2**40
"""The most elements one weight may have (about a trillion: five times GPT-3's 175 billion in all)."""


def _check_dims(graph: onnx.GraphProto, weights: Mapping[str, tuple[int, tuple[int, ...]]]) -> None:
    """Every declared dimension from 0 to ``MAX_DIM``, every weight at most ``MAX_ELEMENTS`` elements:
    a negative or 2**62 dimension would be stored, then break every estimate naming the model."""
    constants = {
        f"{_node_label(n, i)}.value": (attr.t.data_type, tuple(int(d) for d in attr.t.dims))
        for i, n in enumerate(graph.node)
        for attr in n.attribute
        if attr.type == onnx.AttributeProto.TENSOR
    }
    for name, (_, dims) in {**weights, **constants}.items():
        if any(not 0 <= d <= MAX_DIM for d in dims) or _numel(dims) > MAX_ELEMENTS:
            raise GraphError(
                "corrupt",
                f"the tensor {name!r} declares dimensions {list(dims)[:8]}: each must be from 0 to "
                f"{MAX_DIM:,} and a tensor at most {MAX_ELEMENTS:,} elements",
                (name,),
            )
    for vi in (*graph.input, *graph.output, *graph.value_info):
        shape = _shape_of(vi) or ()
        if any(isinstance(d, int) and not 0 <= d <= MAX_DIM for d in shape):
            raise GraphError(
                "corrupt",
                f"the tensor {vi.name!r} declares the shape {list(shape)[:8]}: a dimension must be from 0 "
                f"to {MAX_DIM:,}",
                (vi.name,),
            )


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def parse(data: bytes) -> onnx.ModelProto:
    try:
        model = onnx.ModelProto.FromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise GraphError("corrupt", f"the file is not a readable ONNX protobuf: {exc}")
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise GraphError("not-onnx", "not an ONNX model: it has no graph with nodes")
    if model.ir_version < 3 or not any(o.domain in DEFAULT_DOMAINS for o in model.opset_import):
        raise GraphError(
            "not-onnx",
            f"not an ONNX model the emulator reads: IR version {model.ir_version} without an opset of the "
            "default domain (export with opset 7 or later)",
        )
    return model


def load_graph(data: bytes, elementwise: tuple[str, ...] | frozenset[str] = ()) -> OnnxGraph:
    """Parse and check a stripped model. Raises ``GraphError`` for anything it cannot plan."""
    model = parse(data)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:
            raise GraphError("corrupt", f"the model's local functions cannot be inlined: {exc}")
    graph = model.graph
    if len(graph.node) > MAX_NODES:
        raise GraphError("too-large", f"the graph has {len(graph.node):,} nodes; the limit is {MAX_NODES:,}")
    declared = frozenset(elementwise)
    _check_operators(graph, declared)
    order = _topological_order(graph)
    sorted_nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)

    weights = {t.name: (t.data_type, tuple(int(d) for d in t.dims)) for t in graph.initializer}
    for sparse in graph.sparse_initializer:
        weights[sparse.values.name] = (sparse.values.data_type, tuple(int(d) for d in sparse.dims))
    _check_dims(graph, weights)
    inputs = tuple(
        GraphInput(
            vi.name,
            dtype_name(vi.type.tensor_type.elem_type),
            vi.type.tensor_type.elem_type,
            _shape_of(vi) or (),
        )
        for vi in graph.input
        if vi.name not in weights
    )
    batch, dynamic, unnamed = _dimensions(inputs)
    counts = Counter(qualified(n.domain, n.op_type) for n in graph.node)
    opset = max((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), default=0)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return OnnxGraph(
        digest=hashlib.sha256(data).hexdigest(),
        model=model,
        inputs=inputs,
        outputs=tuple(o.name for o in graph.output),
        opset=opset,
        declared_elementwise=declared,
        op_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        weights=weights,
        batch_dim=batch,
        dynamic_dims=dynamic,
        unnamed_dims=unnamed,
        producer=producer[:200],
    )


def _check_operators(graph: onnx.GraphProto, declared: frozenset[str]) -> None:
    unknown: Counter[str] = Counter()
    control: Counter[str] = Counter()
    for node in graph.node:
        role = role_of(node.domain, node.op_type, declared)
        name = qualified(node.domain, node.op_type)
        if role is None:
            unknown[name] += 1
        elif role == "control":
            control[name] += 1
    if control:
        names = sorted(control)
        raise GraphError(
            "unsupported-operators",
            f"control flow cannot be planned ahead of running it: {_listed(names)}; export the model with "
            "its loops unrolled and its conditionals resolved (torch.onnx.export traces them away)",
            tuple(names),
        )
    if unknown:
        names = sorted(unknown)
        raise GraphError(
            "unknown-operators",
            f"the emulator does not know these operators: {_listed(names)}; declare the ones that act "
            "element by element (output shaped like the first input) as elementwise, or export with "
            "standard ONNX operators",
            tuple(names),
        )


def _topological_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices in an order where every input is produced before it is used (Kahn's algorithm,
    keeping the file's order where it is free to), after checking every input has a producer."""
    available = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    available |= {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in available:
                raise GraphError(
                    "corrupt",
                    f"tensor {out!r} is produced twice (by {_node_label(node, i)} and another node or the "
                    "graph's inputs): not a valid ONNX graph",
                    (out,),
                )
            producer[out] = i
    dangling: list[str] = []
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in producer and name not in available:
                dangling.append(f"{name!r} (input of {_node_label(node, i)})")
    for out in graph.output:
        if out.name not in producer and out.name not in available:
            dangling.append(f"{out.name!r} (a graph output)")
    if dangling:
        raise GraphError(
            "dangling-input",
            f"the graph uses tensors that nothing produces and that are not graph inputs or initializers: "
            f"{_listed(dangling)}",
            tuple(dangling),
        )
    waiting = [0] * len(graph.node)
    consumers: dict[int, list[int]] = {}
    for i, node in enumerate(graph.node):
        deps = {producer[name] for name in node.input if name in producer}
        waiting[i] = len(deps)
        for d in deps:
            consumers.setdefault(d, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for c in consumers.get(i, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, c)
    if len(order) < len(graph.node):
        stuck = [i for i, w in enumerate(waiting) if w > 0]
        names = [_node_label(graph.node[i], i) for i in _cycle(stuck, graph, producer)]
        raise GraphError(
            "cycle",
            f"the graph has a cycle (a node depends on its own output): {' -> '.join(names)}",
            tuple(names),
        )
    return order


def _cycle(stuck: list[int], graph: onnx.GraphProto, producer: dict[str, int]) -> list[int]:
    """One cycle among the nodes Kahn's algorithm could not order, walking back through producers."""
    stuck_set = set(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    node = stuck[0]
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(
            producer[name]
            for name in graph.node[node].input
            if name in producer and producer[name] in stuck_set
        )
    loop = path[seen[node] :]
    loop.reverse()
    return [*loop, loop[0]]


def _dimensions(inputs: tuple[GraphInput, ...]) -> tuple[str | int | None, tuple[str, ...], tuple[str, ...]]:
    symbols: list[str] = []
    unnamed: list[str] = []
    for gi in inputs:
        for axis, d in enumerate(gi.shape):
            if isinstance(d, str) and d not in symbols:
                symbols.append(d)
            elif d is None:
                unnamed.append(f"{gi.name}[{axis}]")
    batch: str | int | None = None
    named = [s for s in symbols if BATCH_NAME.search(s.lower())]
    if named:
        batch = named[0]
    else:
        for gi in inputs:
            if gi.shape:
                batch = gi.shape[0]
                break
    dynamic = tuple(s for s in symbols if s != batch) if isinstance(batch, str) else tuple(symbols)
    return batch, dynamic, tuple(unnamed)
