"""Pass 1 of lowering (``lower.py``, step 2): what every tensor is and what every node does.

``Lowering`` holds the bound, shape-inferred graph's tensor types and shapes. ``classify`` walks the nodes in
order: Shape/Size and nodes computed from constants only are folded (their outputs are constants that
remember the weights they derive from, so ``new_params`` counts each weight once, for the first costed node
that reads it); reshapes and layout views are free (their outputs alias the activations of their inputs);
every other node keeps the role ``rules.role_of`` gives it (a Gather refined to an embedding lookup, a
constant gather or a view) and is costed by the later passes.
"""

from __future__ import annotations

import math

import onnx

from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.load import OnnxGraph, _node_label, dtype_bytes, is_float
from vipu.emulator.onnxgraph.rules import APPROXIMATIONS, is_declared, qualified, role_of


class Lowering:
    """One graph being lowered: every tensor's type and shape, which tensors are constants (and the weights
    they derive from), which activations each free view aliases, and what the passes count on the way.

    ``classify`` is pass 1 and fills the constants, roles and aliases; ``fuse.fuse`` and ``layers.layers``
    read them. Sizes are per sample: ``scale`` divides out a graph's fixed batch.
    """

    def __init__(self, graph: OnnxGraph, model: onnx.ModelProto, train: bool, per_run: int) -> None:
        self.graph = graph
        self.model = model
        self.g = model.graph
        self.train = train
        self.scale = 1.0 / per_run
        self.types: dict[str, tuple[int, tuple[int | str | None, ...] | None]] = {}
        for vi in (*self.g.input, *self.g.value_info, *self.g.output):
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None:
                continue
            shape = None
            if tt.HasField("shape"):
                shape = tuple(
                    int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                    for d in tt.shape.dim
                )
            self.types[vi.name] = (tt.elem_type, shape)
        for t in self.g.initializer:
            self.types[t.name] = (t.data_type, tuple(int(d) for d in t.dims))
        self.weights = {t.name for t in self.g.initializer} | {
            s.values.name for s in self.g.sparse_initializer
        }
        self.const: set[str] = set(self.weights)
        # Which weights (initializers, Constant tensors) each constant tensor is derived from.
        self.origin: dict[str, frozenset[str]] = {}
        self.weight_size: dict[str, int] = {}
        for t in self.g.initializer:
            n = math.prod(int(d) for d in t.dims)
            if is_float(t.data_type) and n > 1:
                self.origin[t.name] = frozenset({t.name})
                self.weight_size[t.name] = n
        self.roots: dict[str, frozenset[str]] = {}
        self.counted: set[str] = set()
        self.approx: dict[str, int] = {}
        self.free = 0
        self.folded = 0

    # -- shapes -------------------------------------------------------------------------------------

    def shape(self, name: str, node: onnx.NodeProto, index: int) -> tuple[int, ...]:
        entry = self.types.get(name)
        shape = entry[1] if entry is not None else None
        if shape is None or any(not isinstance(d, int) for d in shape):
            where = f"{_node_label(node, index)} ({node.op_type})"
            unknown = (
                ""
                if shape is None
                else " (dimensions "
                + ", ".join(str(d) for d in shape if not isinstance(d, int))
                + " unresolved)"
            )
            raise GraphError(
                "unknown-shape",
                f"the shape of {name!r} at {where} is unknown after shape inference{unknown}: it depends on "
                "values the emulator does not have; export that part of the graph with static shapes",
                (name,),
            )
        return shape  # type: ignore[return-value]

    def numel(self, name: str, node: onnx.NodeProto, index: int) -> float:
        return float(math.prod(self.shape(name, node, index)))

    def elem_type(self, name: str) -> int:
        entry = self.types.get(name)
        return entry[0] if entry is not None else onnx.TensorProto.FLOAT

    def root_numel(self, name: str) -> float:
        """An activation's element count, where no single node is to blame if its shape is unknown."""
        entry = self.types.get(name)
        shape = entry[1] if entry else None
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise GraphError(
                "unknown-shape",
                f"the shape of {name!r} is unknown after shape inference: it depends on values the emulator "
                "does not have; export that part of the graph with static shapes",
                (name,),
            )
        return float(math.prod(shape))  # type: ignore[arg-type]

    # -- pass 1: constants, roles, aliases ----------------------------------------------------------

    def classify(self) -> list[tuple[int, onnx.NodeProto, str]]:
        costed: list[tuple[int, onnx.NodeProto, str]] = []
        inputs = {vi.name for vi in self.g.input if vi.name not in self.weights}
        for name in inputs:
            self.roots[name] = frozenset({name})
        for i, node in enumerate(self.g.node):
            role: str | None = role_of(node.domain, node.op_type, self.graph.declared_elementwise)
            assert role is not None and role != "control", "load_graph refuses these"
            ins = [t for t in node.input if t]
            if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
                self.const.update(o for o in node.output if o)
                self.folded += 1
                continue
            if all(t in self.const for t in ins):
                self._constant_node(node, ins)
                self.folded += 1
                continue
            if node.op_type == "Reshape" and node.domain in ("", "ai.onnx"):
                self._check_reshape(i, node)
            if role == "data_dependent":
                raise GraphError(
                    "unsupported-operators",
                    f"{_node_label(node, i)} ({node.op_type}) has an output whose size depends on the values "
                    "of its input, which the emulator does not have",
                    (node.op_type,),
                )
            if role == "gather":
                data, indices = [*ins, "", ""][:2]
                if data in self.const and indices not in self.const and is_float(self.elem_type(data)):
                    role = "embedding"
                elif data in self.const:
                    role = "elementwise"
                else:
                    role = "free"
            if role == "elementwise" and node.op_type == "Dropout" and not self.train:
                role = "free"
            if role == "free":
                self.free += 1
                act = frozenset().union(*(self.roots.get(t, frozenset()) for t in ins if t not in self.const))
                for out in node.output:
                    if out:
                        self.roots[out] = act
                continue
            for out in node.output:
                if out:
                    self.roots[out] = frozenset({out})
            costed.append((i, node, role))
            name = qualified(node.domain, node.op_type)
            if is_declared(node.domain, node.op_type, self.graph.declared_elementwise):
                self.approx[name] = self.approx.get(name, 0) + 1
            elif node.op_type in APPROXIMATIONS:
                self.approx[node.op_type] = self.approx.get(node.op_type, 0) + 1
        return costed

    def _check_reshape(self, i: int, node: onnx.NodeProto) -> None:
        """A Reshape must keep its element count. One that does not at these sizes has a target the exporter
        fixed at the sizes it traced (PyTorch's TorchScript exporter does this in ``nn.MultiheadAttention``):
        the graph runs only at those sizes, and planned at others it would be costed with wrong shapes."""
        shapes: list[list[int]] = []
        for name in (node.input[0], node.output[0]):
            shape = self.types.get(name, (0, None))[1]
            if shape is None or not all(isinstance(d, int) for d in shape):
                return
            shapes.append([int(d) for d in shape if d is not None])
        before, after = math.prod(shapes[0]), math.prod(shapes[1])
        if before != after:
            raise GraphError(
                "shape-inference",
                f"{_node_label(node, i)} (Reshape) turns a tensor of shape {shapes[0]} ({before:,} "
                f"elements) into {shapes[1]} ({after:,}) at these sizes: the export fixed a size the "
                "graph should compute from a dynamic dimension (tracing recorded it as a constant), so the "
                "graph runs only at the sizes it was exported at; run it at those, or export it again with "
                "the size left dynamic (with PyTorch: torch.onnx.export(..., dynamo=True))",
                (node.output[0],),
            )

    def _constant_node(self, node: onnx.NodeProto, ins: list[str]) -> None:
        origin: frozenset[str] = frozenset().union(*(self.origin.get(t, frozenset()) for t in ins))
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    n = math.prod(int(d) for d in attr.t.dims)
                    if is_float(attr.t.data_type) and n > 1 and node.output:
                        origin = frozenset({node.output[0]})
                        self.weight_size[node.output[0]] = n
        for out in node.output:
            if out:
                self.const.add(out)
                if origin:
                    self.origin[out] = origin

    def new_params(self, node: onnx.NodeProto) -> int:
        """The weight elements ``node`` reads that no node before it has read (each weight counts once)."""
        total = 0
        for t in node.input:
            for w in self.origin.get(t, ()):
                if w not in self.counted:
                    self.counted.add(w)
                    total += self.weight_size[w]
        return total

    # -- what lower() reports besides the layers ------------------------------------------------------

    def host_bytes(self) -> tuple[float, float]:
        ins = sum(
            self.root_numel(vi.name) * dtype_bytes(vi.type.tensor_type.elem_type)
            for vi in self.g.input
            if vi.name not in self.weights
        )
        outs = 0.0
        for vi in self.g.output:
            if vi.name in self.const:
                continue
            entry = self.types.get(vi.name)
            if entry and entry[1] is not None and all(isinstance(d, int) for d in entry[1]):
                outs += math.prod(entry[1]) * dtype_bytes(entry[0])  # type: ignore[arg-type]
        return ins * self.scale, outs * self.scale

    def output_types(self) -> tuple[tuple[str, int, tuple[int | str | None, ...] | None], ...]:
        out = []
        for vi in self.g.output:
            elem, shape = self.types.get(vi.name, (vi.type.tensor_type.elem_type, None))
            out.append((vi.name, elem, shape))
        return tuple(out)
