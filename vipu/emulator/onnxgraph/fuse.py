"""Pass 2 of lowering (``lower.py``, step 3): group the costed nodes into units.

A GEMM, convolution, recurrent cell, attention or embedding node is a ``heavy`` unit of its own (its ops from
``costs.heavy_ops``), a pooling node a ``pool`` unit. Element-wise nodes fuse into ``region`` units, one
vector pass each: a node joins the open region that produced its full-size inputs; an input smaller than the
output (a bias, a mask, a gate) never splits a region, and a small region only that node reads is folded
into it, as is a full-size operand's region of dropout or casts. A region closes once anything outside it
reads it, which keeps the fused graph acyclic. A bias Add straight after a GEMM or convolution joins that
heavy unit, as Poplar adds it in the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from vipu.emulator.graph import Op, OpKind
from vipu.emulator.onnxgraph.classify import Lowering
from vipu.emulator.onnxgraph.costs import HEAVY_OPS, heavy_ops, pool_ops
from vipu.emulator.onnxgraph.load import _node_label
from vipu.emulator.onnxgraph.rules import element_ops, is_declared

_LIGHT = frozenset({"Dropout", "Cast", "CastLike"})
"""Operators whose region a full-size reader folds in (Poplar applies them in that reader's pass)."""
_BIASED = (OpKind.MATMUL, OpKind.CONV, OpKind.GROUPED_CONV, OpKind.DEPTHWISE_CONV)


@dataclass
class Unit:
    """Nodes that run as one: a heavy op (and its bias), a pooling pass, or a fused element-wise region."""

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
    merged_into: Unit | None = None
    biased: bool = False

    def live(self) -> Unit:
        u = self
        while u.merged_into is not None:
            u = u.merged_into
        return u


def fuse(low: Lowering, costed: list[tuple[int, onnx.NodeProto, str]]) -> list[Unit]:
    """The units of the costed nodes (``Lowering.classify``), in order of their first node."""
    consumers: dict[str, set[int]] = {}
    for i, node, _ in costed:
        for t in node.input:
            if t and t not in low.const:
                for r in low.roots.get(t, ()):
                    consumers.setdefault(r, set()).add(i)
    fusion = _Fusion(low, consumers)
    for i, node, role in costed:
        fusion.add(i, node, role)
    return [u for u in fusion.units if u.merged_into is None]


@dataclass
class _Fusion:
    low: Lowering
    consumers: dict[str, set[int]]
    """The costed nodes that read each activation (by the activations their inputs alias)."""
    producer: dict[str, Unit] = field(default_factory=dict)
    units: list[Unit] = field(default_factory=list)

    def add(self, i: int, node: onnx.NodeProto, role: str) -> None:
        low = self.low
        label = _node_label(node, i)
        ins = [t for t in node.input if t and t not in low.const]
        outs = [o for o in node.output if o]
        in_roots = frozenset().union(*(low.roots.get(t, frozenset()) for t in ins))
        params = low.new_params(node)
        if role in HEAVY_OPS:
            ops = heavy_ops(low, i, node, role)
            unit = Unit("heavy", i, i, [label], [i], ops=ops, produced=set(outs), params=params)
            self.units.append(unit)
        elif role == "pool":
            ops = pool_ops(low, i, node, label, ins, outs)
            unit = Unit("pool", i, i, [label], [i], ops=ops, produced=set(outs), params=params)
            self.units.append(unit)
        else:
            unit = self._elementwise(i, node, label, ins, outs, params)
        for r in in_roots:
            u = self.producer.get(r)
            if u is not None and u.live() is not unit:
                u.live().closed = True
        for o in outs:
            self.producer[o] = unit

    def _elementwise(
        self, i: int, node: onnx.NodeProto, label: str, ins: list[str], outs: list[str], params: int
    ) -> Unit:
        low = self.low
        declared = is_declared(node.domain, node.op_type, low.graph.declared_elementwise)
        out_n = low.numel(outs[0], node, i)
        sizes = {t: low.numel(t, node, i) for t in ins}
        work = max([out_n, *sizes.values()]) * low.scale * element_ops(node.op_type, declared, low.train)
        full = [t for t in ins if sizes[t] >= out_n]
        side = [t for t in ins if sizes[t] < out_n]
        full_roots = frozenset().union(*(low.roots.get(t, frozenset()) for t in full))
        side_roots = frozenset().union(*(low.roots.get(t, frozenset()) for t in side))
        # A bias added to a GEMM or convolution's output belongs to that op's pass.
        if node.op_type in ("Add", "Sub") and len(full) == 1 and not side and len(ins) == 1:
            h = self._biases(i, full_roots)
            if h is not None:
                h.biased = True
                h.params += params
                h.produced.update(outs)
                h.last = i
                h.nodes.append(label)
                h.members.append(i)
                return h
        target = self._open_region(full_roots)
        if target is None:
            target = Unit("region", i, i, [], [], sources=set(full_roots))
            self.units.append(target)
        target.nodes.append(label)
        target.members.append(i)
        target.op_types.add(node.op_type)
        target.last = i
        target.elements += work
        target.params += params
        target.produced.update(outs)
        self._fold_in(i, target, full_roots, side_roots)
        return target

    def _biases(self, i: int, full_roots: frozenset[str]) -> Unit | None:
        """The heavy unit whose output node ``i`` (an Add or Sub of a constant) is the bias of, if any."""
        if len(full_roots) != 1:
            return None
        (r,) = tuple(full_roots)
        h = self.producer.get(r)
        if (
            h is not None
            and h.kind == "heavy"
            and not h.biased
            and self.consumers.get(r) == {i}
            and h.ops[-1].kind in _BIASED
        ):
            return h
        return None

    def _open_region(self, full_roots: frozenset[str]) -> Unit | None:
        """An open region that produced (or reads) every one of a node's full-size inputs."""
        for r in full_roots:
            u = self.producer.get(r)
            if u is None:
                continue
            u = u.live()
            if (
                u.kind == "region"
                and not u.closed
                and all(fr in u.produced or fr in u.sources for fr in full_roots)
            ):
                return u
        return None

    def _fold_in(self, i: int, target: Unit, full_roots: frozenset[str], side_roots: frozenset[str]) -> None:
        """Fold into ``target`` what only node ``i`` reads: a small operand's own region (a gate, a mask), and
        a full-size operand's region of dropout or casts (Poplar applies a dropout mask in the pass of the
        residual add that follows it, as the catalogue's "residual + layernorm + dropout")."""
        producer = self.producer
        light = {r for r in full_roots if (u := producer.get(r)) is not None and u.live().op_types <= _LIGHT}
        for r in side_roots | light:
            p = producer.get(r)
            if p is None:
                continue
            p = p.live()
            if p is target or p.kind != "region" or p.closed:
                continue
            if all(self.consumers.get(pr, set()) <= {i} for pr in p.produced):
                p.merged_into = target
                target.first = min(target.first, p.first)
                target.nodes[:0] = p.nodes
                target.members[:0] = p.members
                target.elements += p.elements
                target.params += p.params
                target.produced |= p.produced
                target.sources |= p.sources - target.produced
                target.op_types |= p.op_types
