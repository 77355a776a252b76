"""Lower an ONNX graph to the emulator's layers and ops, for one binding of its dynamic dimensions.

1. Bind (``bind.py``): the batch dimension to one sample (everything below is per sample), the other
   dynamic dimensions to the job's sizes; run ONNX shape inference (``onnx.shape_inference``, strict,
   with data propagation, so shapes computed through Shape/Gather/Concat chains resolve).
2. Classify each node by its role (``rules.py``). Tensors computed only from constants and shapes are
   constants: folded at compile time, never activations. Reshapes and layout views are free: their output
   aliases the storage of their input.
3. Fuse: element-wise nodes working on the same tensor join one vector pass (a "region"), as the
   catalogue counts "residual + layernorm + dropout" or a GELU as one op. A node joins the open region
   that produced its full-size inputs; an input smaller than the output (a bias, a mask, a gate) never
   splits a region, and a small region only that node reads is folded into it. A region closes once
   anything outside it reads it, which keeps the fused graph acyclic. A bias Add straight after a GEMM or
   convolution is part of it, as Poplar adds it in the same pass.
4. Cut into layers, the units a pipeline boundary may fall between (``_boundary``): after a unit whose
   own output carries nearly all (95%) of what crosses to later units, where no more crosses than at the
   neighbouring cuts (the residual stream of a transformer, the output of a ResNet or MBConv block), or
   after a dense layer or recurrent cell and its activation (MLPs, RNNs). A segment with no GEMM,
   convolution, recurrent cell or embedding joins its neighbour, and sub-blocks that repeat as a group
   (a transformer layer's attention and feed-forward halves) become one layer. Each layer's
   ``input_elements`` is what crosses its start: its recomputation checkpoint and what travels over
   IPU-Links when a stage starts there.

The result is a ``graph.ModelGraph``, so planner, memory and timing treat an uploaded graph exactly as
a catalogue workload.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from vipu.emulator.graph import Layer, ModelGraph, Op, OpKind, Task
from vipu.emulator.onnxgraph.bind import bind, infer
from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.load import OnnxGraph, _node_label, dtype_bytes, is_float
from vipu.emulator.onnxgraph.rules import (
    APPROXIMATIONS,
    RECURRENT_GATE_OPS,
    RECURRENT_GATES,
    element_ops,
    is_declared,
    qualified,
    role_of,
)
from vipu.emulator.spec import OPTIMIZERS

WAIST_SHARE = 0.95
"""A cut is a layer boundary when one activation carries at least this share of what crosses it."""
PLATEAU = 0.05
"""Crossing sizes within this share of each other count as equal when looking for a block boundary."""
MAX_BOUND_DIM = 1_048_576
_LIGHT = frozenset({"Dropout", "Cast", "CastLike"})


@dataclass(frozen=True)
class Lowered:
    """An ONNX graph lowered for one binding: the emulator's layers and what the description reports."""

    layers: tuple[Layer, ...]
    host_input_bytes_per_sample: float
    host_output_bytes_per_sample: float
    samples_per_graph_run: int
    """The graph's fixed batch size (1 when its batch dimension is dynamic): costs are divided by it."""
    approximations: dict[str, int]
    """Operators timed by an approximation (``rules.APPROXIMATIONS`` or declared element-wise): count."""
    nodes_free: int
    nodes_constant: int
    outputs: tuple[tuple[str, int, tuple[int | str | None, ...] | None], ...] = ()
    """The graph's outputs as inferred at these sizes: name, ONNX element type, shape (the batch axis at
    the size the lowering binds it to: 1, or the graph's fixed batch). What a serving signature reads."""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def activation_elements_per_sample(self) -> float:
        return sum(layer.saved for layer in self.layers)

    def breakdown(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for layer in self.layers:
            for op in layer.ops:
                row = out.setdefault(op.kind.value, {"flops": 0.0, "params": 0.0, "ops": 0.0})
                row["flops"] += op.flops
                row["params"] += op.params
                row["ops"] += 1
        return out

    def model_graph(self, name: str, task: Task, seq_len: int | None, optimizer: str) -> ModelGraph:
        train = task == "train"
        ops_per_param, state_per_param = OPTIMIZERS[optimizer]
        host = self.host_input_bytes_per_sample + (0.0 if train else self.host_output_bytes_per_sample)
        trainable = self.params > 0
        return ModelGraph(
            workload=name,
            task=task,
            seq_len=seq_len,
            image_size=None,
            objective="own ONNX graph",
            layers=self.layers,
            host_bytes_per_sample=host,
            optimizer=optimizer if train and trainable else "none",
            optimizer_ops_per_param=ops_per_param,
            optimizer_state_per_param=state_per_param,
            trainable=trainable,
        )


# --------------------------------------------------------------------------------------------- lowering


@dataclass
class _Unit:
    kind: str  # "heavy", "region" or "pool"
    first: int
    last: int
    nodes: list[str]
    members: list[int] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    op_types: set[str] = field(default_factory=set)
    produced: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)
    elements: float = 0.0
    params: int = 0
    closed: bool = False
    merged_into: _Unit | None = None
    biased: bool = False

    def live(self) -> _Unit:
        u = self
        while u.merged_into is not None:
            u = u.merged_into
        return u


class _Lowering:
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
        total = 0
        for t in node.input:
            for w in self.origin.get(t, ()):
                if w not in self.counted:
                    self.counted.add(w)
                    total += self.weight_size[w]
        return total

    # -- ops of the heavy roles ---------------------------------------------------------------------

    def heavy_ops(self, i: int, node: onnx.NodeProto, role: str) -> list[Op]:
        label = _node_label(node, i)
        s = self.scale
        out = node.output[0]
        out_n = self.numel(out, node, i) * s
        op = node.op_type
        if role == "embedding":
            return [Op(label, OpKind.EMBEDDING, elements=out_n, saved=out_n)]
        if role == "recurrent":
            return [self._recurrent(i, node, label)]
        if role == "attention":
            return self._attention(i, node, label)
        if role == "conv":
            return [self._conv(i, node, label, out_n)]
        if op == "Gemm":
            ga = self.shape(node.input[0], node, i)
            gb = self.shape(node.input[1], node, i)
            attrs = {a_.name: a_.i for a_ in node.attribute}
            m, k = (ga[1], ga[0]) if attrs.get("transA") else (ga[0], ga[1])
            n = gb[0] if attrs.get("transB") else gb[1]
            return [Op(label, OpKind.MATMUL, m=m * s, k=k, n=n, saved=out_n)]
        if op == "Einsum":
            return [self._einsum(i, node, label, out_n)]
        a_name, b_name = (node.input[0], node.input[3]) if op == "QLinearMatMul" else node.input[:2]
        a = list(self.shape(a_name, node, i))
        b = list(self.shape(b_name, node, i))
        if len(a) == 1:
            a = [1, *a]
        if len(b) == 1:
            b = [*b, 1]
        m, k, n = a[-2], a[-1], b[-1]
        a_batch, b_batch = a[:-2], b[:-2]
        groups = 1.0
        if b_name in self.const and math.prod(b_batch) == 1:
            m *= math.prod(a_batch)
        elif a_name in self.const and math.prod(a_batch) == 1:
            n *= math.prod(b_batch)
        else:
            width = max(len(a_batch), len(b_batch))
            a_b = [1] * (width - len(a_batch)) + a_batch
            b_b = [1] * (width - len(b_batch)) + b_batch
            groups = float(math.prod(max(x, y) for x, y in zip(a_b, b_b, strict=True)))
        # Per sample: the batch (bound to one, or the graph's fixed batch scaled away) sits in m or groups.
        return [Op(label, OpKind.MATMUL, m=m * s, k=k, n=n, groups=max(1, round(groups)), saved=out_n)]

    def _conv(self, i: int, node: onnx.NodeProto, label: str, out_n: float) -> Op:
        op = node.op_type
        x_name, w_name = (node.input[0], node.input[3]) if op == "QLinearConv" else node.input[:2]
        x = self.shape(x_name, node, i)
        w = self.shape(w_name, node, i)
        y = self.shape(node.output[0], node, i)
        group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
        cin = x[1]
        cin_g = max(1, cin // group)
        if op == "ConvTranspose":
            cout_g = w[1]
            m = math.prod(x[2:]) * x[0]
            k = cin_g
            n = cout_g * math.prod(w[2:])
        else:
            cout_g = max(1, y[1] // group)
            m = math.prod(y[2:]) * y[0]
            k = cin_g * math.prod(w[2:])
            n = cout_g
        if group == 1:
            kind = OpKind.CONV
        elif cin_g == 1:
            kind = OpKind.DEPTHWISE_CONV
        else:
            kind = OpKind.GROUPED_CONV
        return Op(
            label, kind, m=m * self.scale, k=k, n=n, groups=group, in_channels_per_group=cin_g, saved=out_n
        )

    def _recurrent(self, i: int, node: onnx.NodeProto, label: str) -> Op:
        x = self.shape(node.input[0], node, i)
        w = self.shape(node.input[1], node, i)
        attrs = {a.name: a for a in node.attribute}
        layout = attrs["layout"].i if "layout" in attrs else 0
        seq, batch = (x[1], x[0]) if layout == 1 else (x[0], x[1])
        dirs = w[0]
        gates = RECURRENT_GATES[node.op_type]
        hidden = attrs["hidden_size"].i if "hidden_size" in attrs else w[1] // gates
        fan_in = x[2]
        return Op(
            label,
            OpKind.RECURRENT,
            m=batch * self.scale,
            k=fan_in + hidden,
            n=gates * hidden,
            groups=dirs,
            steps=seq,
            elements=gates * hidden * RECURRENT_GATE_OPS[node.op_type] * dirs * batch * self.scale,
            saved=seq * (gates + 2) * hidden * dirs * batch * self.scale,
        )

    def _attention(self, i: int, node: onnx.NodeProto, label: str) -> list[Op]:
        q = self.shape(node.input[0], node, i)
        k = self.shape(node.input[1], node, i)
        v = self.shape(node.input[2], node, i)
        attrs = {a.name: a.i for a in node.attribute}
        if len(q) == 4:
            batch, heads, sq, d = q
            skv, dv = k[2], v[3]
        else:
            heads = attrs.get("q_num_heads", 1) or 1
            batch, sq, hidden = q
            d = hidden // heads
            kv_heads = attrs.get("kv_num_heads", heads) or heads
            skv, dv = k[1], v[2] // kv_heads
        g = batch * heads
        scores = g * sq * skv * self.scale
        return [
            Op(f"{label}: scores", OpKind.MATMUL, m=sq * self.scale, k=d, n=skv, groups=g, saved=scores),
            Op(
                f"{label}: softmax",
                OpKind.ELEMENTWISE,
                elements=scores * element_ops("Softmax", False, False),
                saved=scores,
            ),
            Op(
                f"{label}: context",
                OpKind.MATMUL,
                m=sq * self.scale,
                k=skv,
                n=dv,
                groups=g,
                saved=g * sq * dv * self.scale,
            ),
        ]

    def _einsum(self, i: int, node: onnx.NodeProto, label: str, out_n: float) -> Op:
        equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        lhs, _, rhs = equation.replace(" ", "").partition("->")
        terms = lhs.split(",")
        shapes = [self.shape(t, node, i) for t in node.input if t]
        sizes: dict[str, int] = {}
        for term, shape in zip(terms, shapes, strict=False):
            letters = _expand_ellipsis(term, len(shape))
            for letter, size in zip(letters, shape, strict=False):
                sizes[letter] = max(sizes.get(letter, 1), size)
        if len(terms) != 2 or not rhs:
            macs = math.prod(sizes.values()) if sizes else out_n
            return Op(label, OpKind.MATMUL, m=macs * self.scale, k=1, n=1, saved=out_n)
        a, b = (_expand_ellipsis(t, len(s)) for t, s in zip(terms, shapes, strict=False))
        out = _expand_ellipsis(rhs, max(len(a), len(b)))
        batch = [c for c in out if c in a and c in b]
        contracted = [c for c in set(a) | set(b) if c not in out]
        only_a = [c for c in out if c in a and c not in b]
        only_b = [c for c in out if c in b and c not in a]

        def extent(letters: Iterable[str]) -> int:
            return math.prod(sizes[c] for c in letters)

        return Op(
            label,
            OpKind.MATMUL,
            m=extent(only_a) * self.scale,
            k=extent(contracted),
            n=extent(only_b),
            groups=extent(batch),
            saved=out_n,
        )

    # -- pass 2: fusion ---------------------------------------------------------------------------

    def fuse(self, costed: list[tuple[int, onnx.NodeProto, str]]) -> list[_Unit]:
        consumers: dict[str, set[int]] = {}
        for i, node, _ in costed:
            for t in node.input:
                if t and t not in self.const:
                    for r in self.roots.get(t, ()):
                        consumers.setdefault(r, set()).add(i)
        producer: dict[str, _Unit] = {}
        units: list[_Unit] = []
        for i, node, role in costed:
            label = _node_label(node, i)
            ins = [t for t in node.input if t and t not in self.const]
            outs = [o for o in node.output if o]
            in_roots = frozenset().union(*(self.roots.get(t, frozenset()) for t in ins))
            params = self.new_params(node)
            if role in ("gemm", "conv", "recurrent", "attention", "embedding"):
                unit = _Unit(
                    "heavy",
                    i,
                    i,
                    [label],
                    [i],
                    ops=self.heavy_ops(i, node, role),
                    produced=set(outs),
                    params=params,
                )
                units.append(unit)
            elif role == "pool":
                out_n = self.numel(outs[0], node, i) * self.scale
                if node.op_type.startswith("Global"):
                    work = self.numel(ins[0], node, i) * self.scale
                else:
                    kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1])
                    work = out_n * math.prod(kernel)
                unit = _Unit(
                    "pool",
                    i,
                    i,
                    [label],
                    [i],
                    ops=[Op(label, OpKind.ELEMENTWISE, elements=work, saved=out_n)],
                    produced=set(outs),
                    params=params,
                )
                units.append(unit)
            else:
                unit = self._elementwise(i, node, label, ins, outs, params, producer, consumers, units)
            for r in in_roots:
                u = producer.get(r)
                if u is not None and u.live() is not unit:
                    u.live().closed = True
            for o in outs:
                producer[o] = unit
        return [u for u in units if u.merged_into is None]

    def _elementwise(
        self,
        i: int,
        node: onnx.NodeProto,
        label: str,
        ins: list[str],
        outs: list[str],
        params: int,
        producer: dict[str, _Unit],
        consumers: dict[str, set[int]],
        units: list[_Unit],
    ) -> _Unit:
        declared = is_declared(node.domain, node.op_type, self.graph.declared_elementwise)
        out_n = self.numel(outs[0], node, i)
        sizes = {t: self.numel(t, node, i) for t in ins}
        work = max([out_n, *sizes.values()]) * self.scale * element_ops(node.op_type, declared, self.train)
        full = [t for t in ins if sizes[t] >= out_n]
        side = [t for t in ins if sizes[t] < out_n]
        full_roots = frozenset().union(*(self.roots.get(t, frozenset()) for t in full))
        side_roots = frozenset().union(*(self.roots.get(t, frozenset()) for t in side))
        # A bias added to a GEMM or convolution's output belongs to that op's pass.
        if (
            node.op_type in ("Add", "Sub")
            and len(full) == 1
            and not side
            and len(full_roots) == 1
            and len(ins) == 1
        ):
            (r,) = tuple(full_roots)
            h = producer.get(r)
            if (
                h is not None
                and h.kind == "heavy"
                and not h.biased
                and consumers.get(r) == {i}
                and h.ops[-1].kind in (OpKind.MATMUL, OpKind.CONV, OpKind.GROUPED_CONV, OpKind.DEPTHWISE_CONV)
            ):
                h.biased = True
                h.params += params
                h.produced.update(outs)
                h.last = i
                h.nodes.append(label)
                h.members.append(i)
                return h
        target: _Unit | None = None
        for r in full_roots:
            u = producer.get(r)
            if u is None:
                continue
            u = u.live()
            if (
                u.kind == "region"
                and not u.closed
                and all(fr in u.produced or fr in u.sources for fr in full_roots)
            ):
                target = u
                break
        if target is None:
            target = _Unit("region", i, i, [], [], sources=set(full_roots))
            units.append(target)
        target.nodes.append(label)
        target.members.append(i)
        target.op_types.add(node.op_type)
        target.last = i
        target.elements += work
        target.params += params
        target.produced.update(outs)
        # Fold in what only this node reads: a small operand's own region (a gate, a mask), and a
        # full-size operand's region of dropout or casts (Poplar applies a dropout mask in the pass of
        # the residual add that follows it, as the catalogue's "residual + layernorm + dropout").
        light = {r for r in full_roots if (u := producer.get(r)) is not None and u.live().op_types <= _LIGHT}
        for r in side_roots | light:
            p = producer.get(r)
            if p is None:
                continue
            p = p.live()
            if p is target or p.kind != "region" or p.closed:
                continue
            if all(consumers.get(pr, set()) <= {i} for pr in p.produced):
                p.merged_into = target
                target.first = min(target.first, p.first)
                target.nodes[:0] = p.nodes
                target.members[:0] = p.members
                target.elements += p.elements
                target.params += p.params
                target.produced |= p.produced
                target.sources |= p.sources - target.produced
                target.op_types |= p.op_types
        return target

    # -- pass 3: layers ------------------------------------------------------------------------------

    def layers(self, units: list[_Unit]) -> tuple[Layer, ...]:
        units.sort(key=lambda u: u.last)
        n = len(units)
        where: dict[str, int] = {}
        node_unit: dict[int, int] = {}
        for p, u in enumerate(units):
            for t in u.produced:
                where[t] = p
            for i in u.members:
                node_unit[i] = p
        outputs = {vi.name for vi in self.g.output}
        last_use: dict[str, int] = {}
        users: dict[str, set[int]] = {}
        for i, node in enumerate(self.g.node):
            unit = node_unit.get(i)
            if unit is None:
                continue
            for t in node.input:
                if t and t not in self.const:
                    for r in self.roots.get(t, ()):
                        if where.get(r, -1) != unit:
                            last_use[r] = max(last_use.get(r, -1), unit)
                            users.setdefault(r, set()).add(unit)
        # cut_total[p]: activation elements crossing the cut after unit p.
        diff = [0.0] * (n + 1)
        for r, end in last_use.items():
            start = max(0, where.get(r, -1))
            if end > start:
                size = self._root_numel(r) * self.scale
                diff[start] += size
                diff[end] -= size
        cut_total = [0.0] * n
        running = 0.0
        for p in range(n):
            running += diff[p]
            cut_total[p] = running
        graph_inputs = (
            sum(
                self._root_numel(vi.name)
                for vi in self.g.input
                if vi.name not in self.weights and vi.name in last_use
            )
            * self.scale
        )
        cuts = [p for p in range(n - 1) if self._boundary(p, units, cut_total, graph_inputs, last_use, users)]
        segments: list[list[int]] = []
        start = 0
        for c in [*cuts, n - 1]:
            if c >= start:
                segments.append(list(range(start, c + 1)))
            start = c + 1
        # A segment without a GEMM, convolution, recurrent cell or embedding joins its neighbour.
        merged: list[list[int]] = []
        for seg in segments:
            if merged and (not _heavy(units, seg) or not _heavy(units, merged[-1])):
                merged[-1].extend(seg)
            else:
                merged.append(list(seg))
        layers: list[Layer] = []
        for seg in _group_repeats(merged, units):
            ops: list[Op] = []
            for p in seg:
                u = units[p]
                if u.kind == "region":
                    kept = [t for t in u.produced if t in outputs or last_use.get(t, p) > p]
                    saved = sum(self._root_numel(t) for t in (kept or u.produced)) * self.scale
                    if not kept:
                        saved = max(self._root_numel(t) for t in u.produced) * self.scale
                    ops.append(
                        Op(
                            _span(u.nodes),
                            OpKind.ELEMENTWISE,
                            elements=u.elements,
                            params=u.params,
                            saved=saved,
                        )
                    )
                else:
                    ops.extend([_with_params(u.ops[0], u.params), *u.ops[1:]])
            entering = graph_inputs if seg[0] == 0 else cut_total[seg[0] - 1]
            name = _span([units[seg[0]].nodes[0], units[seg[-1]].nodes[-1]])
            layers.append(Layer(name, tuple(ops), input_elements=max(entering, 1.0)))
        return tuple(layers)

    def _boundary(
        self,
        p: int,
        units: list[_Unit],
        cut_total: list[float],
        entering: float,
        last_use: dict[str, int],
        users: dict[str, set[int]],
    ) -> bool:
        """Whether a layer may end after unit ``p``: the rules of step 4 in the module docstring.

        - One activation just produced by unit p carries (nearly) all that crosses: no block input waits
          across the cut for a residual add or a gate.
        - The unit is not a GEMM or convolution whose only reader is the next unit, a normalisation or
          activation: those stay with their op, as the catalogue keeps "conv" and "batchnorm + relu".
        - A recurrent cell or a dense layer ends a layer (RNNs, MLPs). Otherwise no more crosses here than
          at the neighbouring cuts (within 5%): a block boundary, not an expansion inside an inverted
          bottleneck; and a tensor read again later is not cut while it waits through a side trip that
          leaves what crosses unchanged before it shrinks (a squeeze-and-excite inside a block).
        """
        here = cut_total[p]
        unit = units[p]
        crossing = [t for t in unit.produced if last_use.get(t, -1) > p]
        fresh = max((self._root_numel(t) * self.scale for t in crossing), default=0.0)
        if here <= 0 or fresh < WAIST_SHARE * here:
            return False
        readers = set().union(*(users.get(t, set()) for t in crossing))
        if unit.kind == "heavy" and readers == {p + 1} and units[p + 1].kind == "region":
            return False
        if _ends_layer(unit):
            return True
        if unit.kind == "region" and p > 0 and _ends_layer(units[p - 1]):
            before = units[p - 1]
            if set().union(*(users.get(t, set()) for t in before.produced)) == {p}:
                return True  # a dense layer or recurrent cell and its activation
        profile = [entering, *cut_total]
        q = p + 1  # this cut's index in profile
        if here > (1 + PLATEAU) * profile[q - 1] or (
            q + 1 < len(profile) and here > (1 + PLATEAU) * profile[q + 1]
        ):
            return False
        if len(readers) > 1:
            after = next((v for v in profile[q + 1 :] if abs(v - here) > PLATEAU * here), here)
            if after < here:
                return False
        return True

    def _root_numel(self, name: str) -> float:
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

    def host_bytes(self) -> tuple[float, float]:
        ins = sum(
            self._root_numel(vi.name) * dtype_bytes(vi.type.tensor_type.elem_type)
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


REPEAT_PERIODS = (2, 3, 4)
MIN_REPEATS = 4


def _signature(units: list[_Unit], seg: list[int]) -> tuple[str, ...]:
    # The GEMMs, convolutions, cells and lookups of a segment: what makes a block what it is (a mask or
    # cast computed at the start of the first block does not).
    return tuple(units[p].ops[0].kind.value for p in seg if units[p].kind == "heavy")


def _group_repeats(segments: list[list[int]], units: list[_Unit]) -> list[list[int]]:
    """Merge the sub-blocks of a repeated block into one layer.

    A transformer layer has two residual sub-blocks (attention, feed-forward), each ending where only the
    residual stream crosses; the model repeats the pair. Where segments repeat with a period of 2 to 4
    (at least ``MIN_REPEATS`` times) and differ within the period, each period becomes one layer: the
    block the model's author wrote, where Graphcore's recipes split transformers between IPUs.
    """
    sigs = [_signature(units, seg) for seg in segments]
    n = len(segments)
    for k in REPEAT_PERIODS:
        out: list[list[int]] = []
        i = 0
        grouped = False
        while i < n:
            j = i
            while j + k < n and sigs[j] == sigs[j + k]:
                j += 1
            # Segments i .. j + k - 1 repeat with period k.
            periods = (j + k - i) // k
            if periods >= MIN_REPEATS and len(set(sigs[i : i + k])) > 1:
                for g in range(periods):
                    out.append([p for seg in segments[i + g * k : i + (g + 1) * k] for p in seg])
                i += periods * k
                grouped = True
            else:
                out.append(segments[i])
                i += 1
        if grouped:
            return out
    return segments


def _ends_layer(unit: _Unit) -> bool:
    """A recurrent cell, or a dense layer (a GEMM with weights): a layer of an RNN or an MLP."""
    if unit.kind != "heavy" or len(unit.ops) != 1:
        return False
    op = unit.ops[0]
    return op.kind is OpKind.RECURRENT or (op.kind is OpKind.MATMUL and unit.params > 0)


def _heavy(units: list[_Unit], positions: list[int]) -> bool:
    return any(units[p].kind == "heavy" for p in positions)


def _span(names: list[str]) -> str:
    first, last = names[0], names[-1]
    return first if first == last else f"{first} .. {last}"


def _with_params(op: Op, params: int) -> Op:
    if not params:
        return op
    return Op(
        op.name,
        op.kind,
        m=op.m,
        k=op.k,
        n=op.n,
        groups=op.groups,
        steps=op.steps,
        in_channels_per_group=op.in_channels_per_group,
        elements=op.elements,
        params=op.params + params,
        saved=op.saved,
    )


def _expand_ellipsis(term: str, rank: int) -> str:
    if "..." not in term:
        return term
    explicit = len(term) - 3
    fill = "".join(chr(0x100 + i) for i in range(max(0, rank - explicit)))
    return term.replace("...", fill)


def lower(graph: OnnxGraph, bindings: dict[str, int], train: bool) -> Lowered:
    """Lower ``graph`` with its dynamic dimensions bound. Raises ``GraphError`` if shapes stay unknown."""
    for name, value in bindings.items():
        if not 1 <= value <= MAX_BOUND_DIM:
            raise GraphError(
                "unknown-shape", f"dimension {name!r} = {value} is outside 1..{MAX_BOUND_DIM:,}", (name,)
            )
    model, per_run = bind(graph, bindings)
    inferred = infer(model, graph)
    low = _Lowering(graph, inferred, train, per_run)
    costed = low.classify()
    if not costed:
        raise GraphError(
            "unsupported-operators",
            "the graph does no work on its inputs: every node is a "
            "reshape or is computed from constants only",
        )
    units = low.fuse(costed)
    layers = low.layers(units)
    host_in, host_out = low.host_bytes()
    return Lowered(
        layers=layers,
        host_input_bytes_per_sample=host_in,
        host_output_bytes_per_sample=host_out,
        samples_per_graph_run=per_run,
        approximations=dict(sorted(low.approx.items())),
        nodes_free=low.free,
        nodes_constant=low.folded,
        outputs=low.output_types(),
    )
