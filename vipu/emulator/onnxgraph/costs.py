"""What each heavy node costs: the ops a GEMM, convolution, pooling, recurrent cell, fused attention or
embedding lookup node becomes (element-wise nodes are costed by ``rules.element_ops`` and fused in
``fuse.py``).

``heavy_ops`` looks the node's role up in ``HEAVY_OPS``: one rule per role, grouped below by family. Every
size is per sample: the batch (bound to one, or the graph's fixed batch scaled away by ``Lowering.scale``)
sits in ``m`` or ``groups``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import onnx

from vipu.emulator.graph import Op, OpKind
from vipu.emulator.onnxgraph.classify import Lowering
from vipu.emulator.onnxgraph.load import _node_label
from vipu.emulator.onnxgraph.rules import RECURRENT_GATE_OPS, RECURRENT_GATES, element_ops

HeavyRule = Callable[[Lowering, int, onnx.NodeProto, str, float], list[Op]]
"""A role's rule: (lowering, node index, node, label, output elements per sample) to the node's ops."""


def heavy_ops(low: Lowering, i: int, node: onnx.NodeProto, role: str) -> list[Op]:
    """The ops of node ``i``, whose role (``classify``) is one of ``HEAVY_OPS``."""
    label = _node_label(node, i)
    # Every rule needs its output's shape known, even those that do not read out_n.
    out_n = low.numel(node.output[0], node, i) * low.scale
    return HEAVY_OPS[role](low, i, node, label, out_n)


# -- matmul family: MatMul (and its integer forms), Gemm, Einsum ---------------------------------------


def _gemm(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> list[Op]:
    if node.op_type == "Gemm":
        return [_gemm_node(low, i, node, label, out_n)]
    if node.op_type == "Einsum":
        return [_einsum(low, i, node, label, out_n)]
    return [_matmul(low, i, node, label, out_n)]


def _gemm_node(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> Op:
    ga = low.shape(node.input[0], node, i)
    gb = low.shape(node.input[1], node, i)
    attrs = {a_.name: a_.i for a_ in node.attribute}
    m, k = (ga[1], ga[0]) if attrs.get("transA") else (ga[0], ga[1])
    n = gb[0] if attrs.get("transB") else gb[1]
    return Op(label, OpKind.MATMUL, m=m * low.scale, k=k, n=n, saved=out_n)


def _matmul(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> Op:
    op = node.op_type
    a_name, b_name = (node.input[0], node.input[3]) if op == "QLinearMatMul" else node.input[:2]
    a = list(low.shape(a_name, node, i))
    b = list(low.shape(b_name, node, i))
    if len(a) == 1:
        a = [1, *a]
    if len(b) == 1:
        b = [*b, 1]
    m, k, n = a[-2], a[-1], b[-1]
    a_batch, b_batch = a[:-2], b[:-2]
    groups = 1.0
    if b_name in low.const and math.prod(b_batch) == 1:
        m *= math.prod(a_batch)
    elif a_name in low.const and math.prod(a_batch) == 1:
        n *= math.prod(b_batch)
    else:
        width = max(len(a_batch), len(b_batch))
        a_b = [1] * (width - len(a_batch)) + a_batch
        b_b = [1] * (width - len(b_batch)) + b_batch
        groups = float(math.prod(max(x, y) for x, y in zip(a_b, b_b, strict=True)))
    # Per sample: the batch (bound to one, or the graph's fixed batch scaled away) sits in m or groups.
    return Op(label, OpKind.MATMUL, m=m * low.scale, k=k, n=n, groups=max(1, round(groups)), saved=out_n)


def _einsum(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> Op:
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    shapes = [low.shape(t, node, i) for t in node.input if t]
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=False):
        letters = _expand_ellipsis(term, len(shape))
        for letter, size in zip(letters, shape, strict=False):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if len(terms) != 2 or not rhs:
        macs = math.prod(sizes.values()) if sizes else out_n
        return Op(label, OpKind.MATMUL, m=macs * low.scale, k=1, n=1, saved=out_n)
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
        m=extent(only_a) * low.scale,
        k=extent(contracted),
        n=extent(only_b),
        groups=extent(batch),
        saved=out_n,
    )


def _expand_ellipsis(term: str, rank: int) -> str:
    if "..." not in term:
        return term
    explicit = len(term) - 3
    fill = "".join(chr(0x100 + i) for i in range(max(0, rank - explicit)))
    return term.replace("...", fill)


# -- convolution and pooling -----------------------------------------------------------------------


def _conv(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> list[Op]:
    op = node.op_type
    x_name, w_name = (node.input[0], node.input[3]) if op == "QLinearConv" else node.input[:2]
    x = low.shape(x_name, node, i)
    w = low.shape(w_name, node, i)
    y = low.shape(node.output[0], node, i)
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
    return [
        Op(label, kind, m=m * low.scale, k=k, n=n, groups=group, in_channels_per_group=cin_g, saved=out_n)
    ]


def pool_ops(
    low: Lowering, i: int, node: onnx.NodeProto, label: str, ins: list[str], outs: list[str]
) -> list[Op]:
    """A pooling node: its own vector pass over its window (or, global, over its whole input)."""
    out_n = low.numel(outs[0], node, i) * low.scale
    if node.op_type.startswith("Global"):
        work = low.numel(ins[0], node, i) * low.scale
    else:
        kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1])
        work = out_n * math.prod(kernel)
    return [Op(label, OpKind.ELEMENTWISE, elements=work, saved=out_n)]


# -- recurrent cells, attention, embedding lookups ---------------------------------------------------


def _recurrent(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> list[Op]:
    x = low.shape(node.input[0], node, i)
    w = low.shape(node.input[1], node, i)
    attrs = {a.name: a for a in node.attribute}
    layout = attrs["layout"].i if "layout" in attrs else 0
    seq, batch = (x[1], x[0]) if layout == 1 else (x[0], x[1])
    dirs = w[0]
    gates = RECURRENT_GATES[node.op_type]
    hidden = attrs["hidden_size"].i if "hidden_size" in attrs else w[1] // gates
    fan_in = x[2]
    return [
        Op(
            label,
            OpKind.RECURRENT,
            m=batch * low.scale,
            k=fan_in + hidden,
            n=gates * hidden,
            groups=dirs,
            steps=seq,
            elements=gates * hidden * RECURRENT_GATE_OPS[node.op_type] * dirs * batch * low.scale,
            saved=seq * (gates + 2) * hidden * dirs * batch * low.scale,
        )
    ]


def _attention(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> list[Op]:
    q = low.shape(node.input[0], node, i)
    k = low.shape(node.input[1], node, i)
    v = low.shape(node.input[2], node, i)
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
    scores = g * sq * skv * low.scale
    return [
        Op(f"{label}: scores", OpKind.MATMUL, m=sq * low.scale, k=d, n=skv, groups=g, saved=scores),
        Op(
            f"{label}: softmax",
            OpKind.ELEMENTWISE,
            elements=scores * element_ops("Softmax", False, False),
            saved=scores,
        ),
        Op(
            f"{label}: context",
            OpKind.MATMUL,
            m=sq * low.scale,
            k=skv,
            n=dv,
            groups=g,
            saved=g * sq * dv * low.scale,
        ),
    ]


def _embedding(low: Lowering, i: int, node: onnx.NodeProto, label: str, out_n: float) -> list[Op]:
    return [Op(label, OpKind.EMBEDDING, elements=out_n, saved=out_n)]


HEAVY_OPS: dict[str, HeavyRule] = {
    "gemm": _gemm,
    "conv": _conv,
    "recurrent": _recurrent,
    "attention": _attention,
    "embedding": _embedding,
}
"""A rule per heavy role (``rules.HEAVY_ROLES``; a Gather of a weight table is an ``embedding``)."""
