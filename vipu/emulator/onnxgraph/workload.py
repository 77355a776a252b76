"""A tenant's ONNX graph as a workload the planner takes wherever it takes a catalogue name."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import onnx

from vipu.emulator.errors import WorkloadError
from vipu.emulator.graph import ModelGraph, Precision, Task
from vipu.emulator.memory import dtype_bytes
from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.load import SEQ_NAME, OnnxGraph
from vipu.emulator.onnxgraph.lower import Lowered, lower
from vipu.emulator.onnxgraph.rules import APPROXIMATIONS
from vipu.emulator.spec import DEFAULT_OPTIMIZER, Dims

MAX_IPUS_PER_REPLICA = 64
# ONNX element types as the Open Inference Protocol (KServe v2) names its tensor datatypes; BF16 is
# Triton's addition to the protocol's list. Strings (BYTES) have no fixed size to time a transfer by.
V2_DATATYPES: dict[int, str] = {
    onnx.TensorProto.BOOL: "BOOL",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.UINT16: "UINT16",
    onnx.TensorProto.UINT32: "UINT32",
    onnx.TensorProto.UINT64: "UINT64",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.INT16: "INT16",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.BFLOAT16: "BF16",
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.DOUBLE: "FP64",
}
Tensor = tuple[str, str, tuple[int, ...]]
"""A served tensor: name, KServe v2 datatype, shape with the batch axis written -1."""
_CACHE_SIZE = 256
# Bounded memo caches (`_CACHE_SIZE` entries) of pure functions of their keys (a graph's content
# digest and the bindings): nothing here depends on a database or settings, so they stay module-level
# rather than in a runtime object (vipu imports none of the cloud).
_lock = threading.Lock()
_lowered: OrderedDict[tuple[object, ...], Lowered] = OrderedDict()
_graphs: OrderedDict[tuple[object, ...], ModelGraph] = OrderedDict()


def lowered(graph: OnnxGraph, bindings: Dims, train: bool) -> Lowered:
    """``lower`` cached by graph content, declarations and bindings (a graph is lowered once per size)."""
    key = (graph.digest, graph.declared_elementwise, bindings, train)
    with _lock:
        hit = _lowered.get(key)
        if hit is not None:
            _lowered.move_to_end(key)
            return hit
    result = lower(graph, dict(bindings), train)
    with _lock:
        _lowered[key] = result
        while len(_lowered) > _CACHE_SIZE:
            _lowered.popitem(last=False)
    return result


def _field_of(exc: GraphError) -> str:
    return "dims" if exc.code in ("unknown-shape", "shape-inference") else "model"


class OnnxWorkload:
    """An uploaded graph with the defaults a job falls back on (``spec.GraphSource``).

    ``scope`` keeps executables apart between tenants: two tenants who upload the same graph do not
    learn of each other through a cache hit. Within a scope, the executable key is the graph's content,
    so the same graph uploaded twice (or under two names) shares its compiled executables.
    """

    tasks: tuple[Task, ...]
    default_batch_size = 256
    min_batch_size = 1
    max_batch_size = 65_536
    default_steps = 100
    default_precision: Precision = "fp16"
    precisions: tuple[Precision, ...] = ("fp16", "fp32")

    def __init__(
        self,
        graph: OnnxGraph,
        label: str,
        *,
        scope: str = "",
        default_dims: Mapping[str, int] | None = None,
        model_id: str = "",
    ) -> None:
        self.onnx_graph = graph
        self.label = label
        self.model_id = model_id or label
        self.scope = scope
        self.default_dims: Dims = tuple(sorted((default_dims or {}).items()))
        self.tasks = ("train", "infer") if graph.parameters > 0 else ("infer",)
        scope_tag = hashlib.sha256(scope.encode()).hexdigest()[:16] if scope else ""
        declared = ",".join(sorted(graph.declared_elementwise))
        self.executable_identity = f"onnx:{graph.digest}:{declared}:{scope_tag}"
        self._key = (graph.digest, graph.declared_elementwise, self.default_dims, scope, label)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OnnxWorkload) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"OnnxWorkload({self.label!r}, {self.onnx_graph.digest[:12]})"

    def bindings(self, seq_len: int | None, dims: Mapping[str, int]) -> Dims:
        g = self.onnx_graph
        for name in dims:
            if isinstance(g.batch_dim, str) and name == g.batch_dim:
                raise WorkloadError("dims", f"{name!r} is the graph's batch dimension: batch_size sets it")
            if name not in g.dynamic_dims:
                have = ", ".join(repr(d) for d in g.dynamic_dims) or "none besides the batch"
                raise WorkloadError(
                    "dims", f"the graph has no dynamic dimension {name!r}; its dynamic dimensions: {have}"
                )
        out = dict(self.default_dims)
        if seq_len is not None:
            targets = [d for d in g.dynamic_dims if SEQ_NAME.search(d.lower())]
            if not targets and len(g.dynamic_dims) == 1:
                targets = list(g.dynamic_dims)
            if not targets:
                have = ", ".join(repr(d) for d in g.dynamic_dims)
                raise WorkloadError(
                    "seq_len",
                    "the graph has no dynamic sequence dimension for seq_len to set"
                    + (
                        f"; bind its dynamic dimensions ({have}) with dims"
                        if have
                        else "; its shapes are fixed"
                    ),
                )
            for t in targets:
                out[t] = seq_len
        out.update(dims)
        missing = [d for d in g.dynamic_dims if d not in out]
        if missing:
            example = ", ".join(f'"{d}": 128' for d in missing)
            raise WorkloadError(
                "dims" if len(missing) > 1 or seq_len is not None else "seq_len",
                f"the graph's dynamic dimension(s) {', '.join(repr(d) for d in missing)} need a size: give "
                f"seq_len, or dims such as {{{example}}}",
            )
        return tuple(sorted(out.items()))

    def lowered(self, task: Task, bindings: Dims) -> Lowered:
        try:
            return lowered(self.onnx_graph, bindings, task == "train")
        except GraphError as exc:
            raise WorkloadError(_field_of(exc), exc.message)

    def graph(
        self, task: Task, bindings: Dims, seq_len: int | None, optimizer: str = DEFAULT_OPTIMIZER
    ) -> ModelGraph:
        key = (self._key, task, bindings, seq_len, optimizer)
        with _lock:
            hit = _graphs.get(key)
            if hit is not None:
                _graphs.move_to_end(key)
                return hit
        result = self.lowered(task, bindings).model_graph(self.label, task, seq_len, optimizer)
        with _lock:
            _graphs[key] = result
            while len(_graphs) > _CACHE_SIZE:
                _graphs.popitem(last=False)
        return result

    def max_ipus_per_replica(self, bindings: Dims) -> int:
        return MAX_IPUS_PER_REPLICA

    def io(self, bindings: Dims) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """The graph's own inputs and outputs at these sizes, as a served request carries them: the
        batch axis -1, every other dimension bound (the inputs' from ``bindings``, the outputs' from
        shape inference at them). Raises ``WorkloadError`` when a tensor cannot be served."""
        g = self.onnx_graph
        sizes = dict(bindings)
        inputs = []
        for gi in g.inputs:
            shape: list[int] = []
            for axis, d in enumerate(gi.shape):
                if d == g.batch_dim if isinstance(g.batch_dim, str) else axis == 0:
                    shape.append(-1)
                elif isinstance(d, int):
                    shape.append(d)
                elif isinstance(d, str) and d in sizes:
                    shape.append(sizes[d])
                else:
                    raise WorkloadError("dims", f"input {gi.name!r} axis {axis} has no size to serve it at")
            if -1 not in shape:
                shape.insert(0, -1)
            inputs.append((gi.name, _datatype(gi.name, gi.elem_type), tuple(shape)))
        declared = {vi.name: vi for vi in g.model.graph.output}
        per_run = self.lowered("infer", bindings).samples_per_graph_run
        outputs = []
        for name, elem, inferred in self.lowered("infer", bindings).outputs:
            batch_axis = _batch_axis(declared.get(name), g.batch_dim)
            if inferred is None or any(not isinstance(d, int) for d in inferred):
                raise WorkloadError("model", f"output {name!r} has no known shape at these sizes")
            dims = [int(d) for d in inferred]  # type: ignore[arg-type]
            if batch_axis is None and dims and dims[0] == per_run:
                batch_axis = 0
            if batch_axis is not None and batch_axis < len(dims):
                dims[batch_axis] = -1
            else:
                dims.insert(0, -1)  # one value per request row with no batch axis of its own
            outputs.append((name, _datatype(name, elem), tuple(dims)))
        return tuple(inputs), tuple(outputs)


def _datatype(name: str, elem_type: int) -> str:
    try:
        return V2_DATATYPES[elem_type]
    except KeyError:
        kind = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
        raise WorkloadError(
            "model",
            f"tensor {name!r} is of ONNX type {kind}, which the emulator cannot serve as a KServe v2 "
            "tensor of fixed-size elements",
        ) from None


def _batch_axis(vi: onnx.ValueInfoProto | None, batch: str | int | None) -> int | None:
    """The axis of a declared output that the graph's batch dimension names, if it names one."""
    if vi is None or not isinstance(batch, str) or not vi.type.HasField("tensor_type"):
        return None
    for axis, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_param") and d.dim_param == batch:
            return axis
    return None


def describe(graph: OnnxGraph, dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """What a user is told about an uploaded graph (``GET /models/{id}``), at the given bindings.

    Raises ``GraphError`` (or ``WorkloadError`` for a binding problem) if the graph cannot be planned.
    """
    source = OnnxWorkload(graph, "model", default_dims=dims)
    bindings = source.bindings(None, {})
    low = lowered(graph, bindings, False)
    low_train = lowered(graph, bindings, True) if "train" in source.tasks else None
    flops = low.flops_per_sample
    saved = low.activation_elements_per_sample
    unmodelled = []
    for op, count in low.approximations.items():
        how = (
            (
                "declared element-wise: one element-operation per element of its output, shaped like its "
                "first input"
            )
            if op in graph.declared_elementwise
            else APPROXIMATIONS.get(op, "")
        )
        unmodelled.append({"operator": op, "nodes": count, "treated_as": how})
    notes = []
    if isinstance(graph.batch_dim, int) and graph.batch_dim > 1:
        notes.append(
            f"the graph's batch is fixed at {graph.batch_dim}: its costs are divided by "
            f"{graph.batch_dim} to give them per sample; export with a dynamic batch axis"
        )
    if graph.batch_dim is None:
        notes.append("no batch dimension found: the whole graph is taken as one sample")
    notes.append("precision comes from the job (fp16 or fp32), not from the graph's own types")
    if low.nodes_free:
        notes.append(
            f"{low.nodes_free} reshape and layout nodes are free views; "
            f"{low.nodes_constant} nodes compute constants and are folded"
        )
    return {
        "format": "onnx",
        "ir_version": graph.model.ir_version,
        "opset": graph.opset,
        "producer": graph.producer,
        "inputs": [i.to_dict() for i in graph.inputs],
        "outputs": list(graph.outputs),
        "batch_dim": graph.batch_dim,
        "dynamic_dims": list(graph.dynamic_dims),
        "dims": dict(bindings),
        "nodes": graph.nodes,
        "operators": dict(graph.op_counts),
        "parameters": low.params,
        "layers": len(low.layers),
        "tasks": list(source.tasks),
        "forward_flops_per_sample": flops,
        "train_flops_per_sample": (3.0 * low_train.flops_per_sample) if low_train is not None else None,
        "activation_bytes_per_sample": {p: saved * dtype_bytes(p) for p in ("fp16", "fp32")},
        "host_bytes_per_sample": {
            "in": low.host_input_bytes_per_sample,
            "out": low.host_output_bytes_per_sample,
        },
        "by_kind": low.breakdown(),
        "declared_elementwise": sorted(graph.declared_elementwise),
        "unmodelled": unmodelled,
        "notes": notes,
    }
