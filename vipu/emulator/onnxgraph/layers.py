"""Pass 3 of lowering (``lower.py``, step 4): cut the units into layers, the units a pipeline boundary may
fall between.

``_crossings`` measures what crosses each cut between units (an activation crosses every cut from the unit
that produces it to the last unit that reads it); ``_boundary`` says where a layer may end; segments
without a heavy unit join a neighbour, and ``_group_repeats`` merges the sub-blocks of a repeated block.
"""

from __future__ import annotations

from dataclasses import dataclass

from vipu.emulator.graph import Layer, Op, OpKind
from vipu.emulator.onnxgraph.classify import Lowering
from vipu.emulator.onnxgraph.fuse import Unit

WAIST_SHARE = 0.95
"""A cut is a layer boundary when one activation carries at least this share of what crosses it."""
PLATEAU = 0.05
"""Crossing sizes within this share of each other count as equal when looking for a block boundary."""
REPEAT_PERIODS = (2, 3, 4)
MIN_REPEATS = 4


@dataclass(frozen=True)
class _Crossings:
    """What crosses the cuts between units (sorted by their last node), in activation elements per sample."""

    where: dict[str, int]
    """The unit that produces each activation."""
    last_use: dict[str, int]
    """The last unit (other than its producer) that reads each activation."""
    users: dict[str, set[int]]
    """The units (other than its producer) that read each activation."""
    cut_total: list[float]
    """``cut_total[p]``: what crosses the cut after unit p."""
    graph_inputs: float
    """What the graph's own inputs carry into the first unit."""


def layers(low: Lowering, units: list[Unit]) -> tuple[Layer, ...]:
    """The layers of ``units`` (sorted here, in place, by their last node)."""
    units.sort(key=lambda u: u.last)
    n = len(units)
    x = _crossings(low, units)
    cuts = [p for p in range(n - 1) if _boundary(low, p, units, x)]
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
    outputs = {vi.name for vi in low.g.output}
    return tuple(_layer(low, units, seg, x, outputs) for seg in _group_repeats(merged, units))


def _crossings(low: Lowering, units: list[Unit]) -> _Crossings:
    n = len(units)
    where: dict[str, int] = {}
    node_unit: dict[int, int] = {}
    for p, u in enumerate(units):
        for t in u.produced:
            where[t] = p
        for i in u.members:
            node_unit[i] = p
    last_use: dict[str, int] = {}
    users: dict[str, set[int]] = {}
    for i, node in enumerate(low.g.node):
        unit = node_unit.get(i)
        if unit is None:
            continue
        for t in node.input:
            if t and t not in low.const:
                for r in low.roots.get(t, ()):
                    if where.get(r, -1) != unit:
                        last_use[r] = max(last_use.get(r, -1), unit)
                        users.setdefault(r, set()).add(unit)
    diff = [0.0] * (n + 1)
    for r, end in last_use.items():
        start = max(0, where.get(r, -1))
        if end > start:
            size = low.root_numel(r) * low.scale
            diff[start] += size
            diff[end] -= size
    cut_total = [0.0] * n
    running = 0.0
    for p in range(n):
        running += diff[p]
        cut_total[p] = running
    graph_inputs = (
        sum(
            low.root_numel(vi.name)
            for vi in low.g.input
            if vi.name not in low.weights and vi.name in last_use
        )
        * low.scale
    )
    return _Crossings(where, last_use, users, cut_total, graph_inputs)


def _layer(low: Lowering, units: list[Unit], seg: list[int], x: _Crossings, outputs: set[str]) -> Layer:
    """The layer of the units at positions ``seg``: a region's saved activations are those read after it
    (or its largest output when none is)."""
    ops: list[Op] = []
    for p in seg:
        u = units[p]
        if u.kind == "region":
            kept = [t for t in u.produced if t in outputs or x.last_use.get(t, p) > p]
            saved = sum(low.root_numel(t) for t in (kept or u.produced)) * low.scale
            if not kept:
                saved = max(low.root_numel(t) for t in u.produced) * low.scale
            ops.append(
                Op(_span(u.nodes), OpKind.ELEMENTWISE, elements=u.elements, params=u.params, saved=saved)
            )
        else:
            ops.extend([_with_params(u.ops[0], u.params), *u.ops[1:]])
    entering = x.graph_inputs if seg[0] == 0 else x.cut_total[seg[0] - 1]
    name = _span([units[seg[0]].nodes[0], units[seg[-1]].nodes[-1]])
    return Layer(name, tuple(ops), input_elements=max(entering, 1.0))


def _boundary(low: Lowering, p: int, units: list[Unit], x: _Crossings) -> bool:
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
    here = x.cut_total[p]
    unit = units[p]
    crossing = [t for t in unit.produced if x.last_use.get(t, -1) > p]
    fresh = max((low.root_numel(t) * low.scale for t in crossing), default=0.0)
    if here <= 0 or fresh < WAIST_SHARE * here:
        return False
    readers = set().union(*(x.users.get(t, set()) for t in crossing))
    if unit.kind == "heavy" and readers == {p + 1} and units[p + 1].kind == "region":
        return False
    if _ends_layer(unit):
        return True
    if unit.kind == "region" and p > 0 and _ends_layer(units[p - 1]):
        before = units[p - 1]
        if set().union(*(x.users.get(t, set()) for t in before.produced)) == {p}:
            return True  # a dense layer or recurrent cell and its activation
    profile = [x.graph_inputs, *x.cut_total]
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


def _signature(units: list[Unit], seg: list[int]) -> tuple[str, ...]:
    # The GEMMs, convolutions, cells and lookups of a segment: what makes a block what it is (a mask or
    # cast computed at the start of the first block does not).
    return tuple(units[p].ops[0].kind.value for p in seg if units[p].kind == "heavy")


def _group_repeats(segments: list[list[int]], units: list[Unit]) -> list[list[int]]:
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


def _ends_layer(unit: Unit) -> bool:
    """A recurrent cell, or a dense layer (a GEMM with weights): a layer of an RNN or an MLP."""
    if unit.kind != "heavy" or len(unit.ops) != 1:
        return False
    op = unit.ops[0]
    return op.kind is OpKind.RECURRENT or (op.kind is OpKind.MATMUL and unit.params > 0)


def _heavy(units: list[Unit], positions: list[int]) -> bool:
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
