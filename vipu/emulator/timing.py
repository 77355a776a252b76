"""The timing model: compile time, executable load, and one step's time from compute, exchange, sync,
pipeline fill and drain, gradient all-reduce over IPU-Links and GW-Links, optimizer and host I/O.

Every op runs as bulk-synchronous supersteps over the IPU's 1,472 tiles. Per op and micro-batch b:

    GEMM (matmul, conv, recurrent step):
        t = W / (tiles x AMP MACs/cycle x clock x e_kind x u)         compute phase
          + 3 (W / tiles)^(2/3) x bytes / (exchange B/s / tiles)     exchange phase (operands and partials)
          + S_kind x c_ss / clock                                    syncs and superstep overheads
        W = b x m x k x n x groups; e_kind = matmul or conv efficiency;
        u = min(1, input channels per group / AMP input block) for convs
    vector work (element-wise, normalisation, depthwise conv):
        t = E / (tiles x lanes x clock x e_vec) + S_kind x c_ss / clock
    embedding: the gathered rows cross the exchange, then one vector pass.
    S_kind: supersteps per op and pass (graph.SUPERSTEPS).

Training costs each op three forward times (forward, input gradient, weight gradient) plus one more when
the stage recomputes its activations. A pipeline of P stages and G micro-batches per step takes
(G + P - 1) slots, a slot being the slowest stage plus the activations crossing to the next IPU; then
gradients are all-reduced, the optimizer runs and, every ``device_iterations`` steps, the host is synced.

Three constants are fitted (matmul and conv efficiency, c_ss), once, to the Bow Pod16
table of ``docs/hardware.md`` by ``calibration.py``; e_vec is fixed (see ``Constants``).
Everything else is a published figure (``vipu/machine_types.py``) or a stated first-principles
assumption below. Every machine type, the first-generation GC2 included, runs through the same
equations with the same constants: only the figures of its chip and links differ.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from vipu.emulator.graph import SUPERSTEPS, Layer, ModelGraph, Op, OpKind
from vipu.emulator.machines import POD64_IPUS, Machine
from vipu.emulator.memory import dtype_bytes, superstep_instances


@dataclass(frozen=True, slots=True)
class Constants:
    """The calibrated constants of the timing model (see ``FITTED``)."""

    matmul_efficiency: float
    """Fraction of the AMP units' peak reached by the compute phases of matmuls (and recurrent cells,
    whose time steps are matmuls)."""
    conv_efficiency: float
    """The same for convolutions (dense and grouped), whose spatial windows need their own layouts."""
    vector_efficiency: float
    """Fraction of the vector path's peak (4 FP16 / 2 FP32 elements per cycle per tile) reached by
    element-wise, normalisation and depthwise work. Not fitted: the calibration table cannot tell its
    cost from the superstep overhead (the element-wise ops are also what adds supersteps), so it is held
    at 1, element-wise work streaming at the tile's load rate."""
    superstep_cycles: float
    """Fixed cycles of one BSP superstep: tile sync, exchange set-up, vertex launch, load imbalance."""


# Fitted once against the Bow Pod16 table (see calibration.py and docs/emulator.md for the fit).
FITTED = Constants(
    matmul_efficiency=0.407,
    conv_efficiency=0.846,
    vector_efficiency=1.0,
    superstep_cycles=10_800.0,
)

# ------------------------------------------------------------------------- stated modelling assumptions
# The AMP consumes input channels in blocks (16 FP16 / 8 FP32: 64 FP16 MACs per cycle = 16 input x 4
# output channels), so a convolution with fewer input channels per group leaves part of it idle. This
# is why grouped convolutions (ResNeXt's 4- and 8-wide groups) and the RGB stem run below peak.
AMP_INPUT_CHANNEL_BLOCK = {"fp16": 16, "fp32": 8}
# Latency of one hop of a ring all-reduce: an IPU-Link hop inside a POD64; a GW-Link hop crosses the
# gateway, a 100 GbE switch and the remote gateway. Not published; order-of-magnitude figures.
IPU_LINK_HOP_S = 1.0e-6
GW_LINK_HOP_S = 10.0e-6
# One host call (launch the device program, sync, read back metrics) costs this much host time. The
# planner batches steps into device iterations so that a call lasts at least HOST_CALL_TARGET_S.
HOST_CALL_S = 2.0e-3
HOST_CALL_TARGET_S = 0.5
# A pipeline hand-over uses the IPU-Links towards one neighbour: half of the links between them
# (``Machine.neighbour_link_bytes_per_s``), the other half carrying the gradients back.
PIPELINE_LINK_FRACTION = 0.5
# A ring all-reduce sends to one neighbour and receives from the other: half the links each way.
RING_LINK_FRACTION = 0.5

# Compile time (Poplar graph lowering, tile mapping, code generation). Per the reference, BERT-Base on 4
# IPUs compiles in about 8 minutes and BERT-Large on 64 IPUs in 8 to 11; code generation grows with the
# supersteps of the largest IPU's program, the inter-IPU exchange and sync programs with the IPUs of a
# replica, and the collectives with the number of replicas. The two per-size coefficients are solved
# from those two figures (see calibration.py); the fixed part is host-side graph construction.
COMPILE_FIXED_S = 60.0
COMPILE_PER_SUPERSTEP_S = 0.569
COMPILE_PER_IPU_S = 36.7
COMPILE_PER_REPLICA_DOUBLING_S = 10.0
# Loading a compiled (or cached) executable: attach to and reset the partition, configure the links,
# then stream each IPU's code and weights over its host link.
LOAD_FIXED_S = 10.0


def _ss_s(machine: Machine, c: Constants) -> float:
    return c.superstep_cycles / machine.clock_hz


def _gemm_s(
    macs: float,
    operand_elements: float,
    precision: str,
    machine: Machine,
    efficiency: float,
    utilisation: float,
) -> float:
    tiles = machine.tiles_per_ipu
    per_tile = macs / tiles
    compute = per_tile / (machine.amp_macs_per_cycle_per_tile(precision) * utilisation * efficiency)
    compute_s = compute / machine.clock_hz
    # A 3D split of an m x k x n product over p tiles needs at least 3 (mkn/p)^(2/3) operand elements per
    # tile (the surface of its sub-cube), and never more than the operands themselves.
    volume = min(3.0 * per_tile ** (2.0 / 3.0), operand_elements)
    exchange_s = volume * dtype_bytes(precision) / (machine.exchange_bytes_per_s / tiles)
    return compute_s + exchange_s


def _vector_s(elements: float, precision: str, machine: Machine, c: Constants) -> float:
    rate = machine.tiles_per_ipu * machine.vector_lanes(precision) * machine.clock_hz * c.vector_efficiency
    return elements / rate


@lru_cache(maxsize=65_536)
def op_forward_s(op: Op, batch: int, precision: str, machine: Machine, c: Constants) -> float:
    """Forward time of one op for a micro-batch of ``batch`` samples on one IPU."""
    kind = op.kind
    ss = SUPERSTEPS[kind] * _ss_s(machine, c)
    if kind in (OpKind.MATMUL, OpKind.CONV, OpKind.GROUPED_CONV):
        m = op.m * batch
        macs = m * op.k * op.n * op.groups
        operands = op.groups * (m * op.k + op.k * op.n + m * op.n)
        utilisation = 1.0
        efficiency = c.matmul_efficiency
        if kind is not OpKind.MATMUL:
            efficiency = c.conv_efficiency
            utilisation = min(1.0, op.in_channels_per_group / AMP_INPUT_CHANNEL_BLOCK[precision])
        return _gemm_s(macs, operands, precision, machine, efficiency, utilisation) + ss
    if kind is OpKind.RECURRENT:
        # Time steps depend on each other: every step is its own GEMM over the batch and its gate
        # arithmetic, with all their supersteps, however small the batch.
        m = op.m * batch
        macs = m * op.k * op.n * op.groups
        operands = op.groups * (m * op.k + op.k * op.n + m * op.n)
        per_step = (
            _gemm_s(macs, operands, precision, machine, c.matmul_efficiency, 1.0)
            + _vector_s(batch * op.elements, precision, machine, c)
            + ss
        )
        return op.steps * per_step
    if kind is OpKind.DEPTHWISE_CONV:
        # Too few channels per group for the AMP: Poplar runs depthwise convolutions on the vector path,
        # and each output needs its input window exchanged in.
        macs = batch * op.m * op.k * op.n * op.groups
        halo_s = 2.0 * batch * op.saved * dtype_bytes(precision) / machine.exchange_bytes_per_s
        return _vector_s(macs, precision, machine, c) + halo_s + ss
    if kind is OpKind.EMBEDDING:
        gathered = batch * op.elements
        moved_s = gathered * dtype_bytes(precision) / machine.exchange_bytes_per_s
        return moved_s + _vector_s(gathered, precision, machine, c) + ss
    return _vector_s(batch * op.elements, precision, machine, c) + ss


def op_s(
    op: Op, batch: int, precision: str, machine: Machine, c: Constants, train: bool, recompute: bool
) -> float:
    fwd = op_forward_s(op, batch, precision, machine, c)
    if not train:
        return fwd
    return fwd * (3.0 + (1.0 if recompute else 0.0))


@lru_cache(maxsize=16_384)
def layer_s(
    layer: Layer, batch: int, precision: str, machine: Machine, c: Constants, train: bool, recompute: bool
) -> float:
    """One micro-batch through one layer: forward (and backward, and recomputation when training)."""
    return sum(op_s(op, batch, precision, machine, c, train, recompute) for op in layer.ops)


def stage_compute_s(
    layers: tuple[Layer, ...],
    batch: int,
    precision: str,
    machine: Machine,
    c: Constants,
    train: bool,
    recompute: bool,
    trainable: bool,
) -> float:
    t = sum(layer_s(layer, batch, precision, machine, c, train, recompute) for layer in layers)
    if train and trainable:
        # Every micro-batch's weight gradients are added into the accumulators: one vector pass.
        params = sum(layer.params for layer in layers)
        t += _vector_s(params, precision, machine, c)
    return t


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One step (one global batch) and its parts, in cluster seconds."""

    step_s: float
    slot_s: float
    stage_compute_s: tuple[float, ...]
    boundary_s: float
    host_io_s: float
    pipeline_fill_drain_s: float
    allreduce_s: float
    allreduce_ipu_link_s: float
    allreduce_gw_link_s: float
    optimizer_s: float
    host_call_s: float
    micro_batches: int

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["stage_compute_s"] = list(self.stage_compute_s)
        return d


def ring_allreduce_s(
    grad_bytes: float, replicas: int, pods: int, machine: Machine, stages: int = 1
) -> tuple[float, float]:
    """Gradient all-reduce of one stage across ``replicas`` replicas of ``stages`` IPUs each, spread
    over ``pods`` POD64s.

    Inside a POD64 (or a server), a ring over IPU-Links: reduce-scatter then all-gather, each moving
    (r - 1) / r of the gradients through every IPU. Across POD64s, hierarchically: after the
    reduce-scatter each IPU holds 1 / r_pod of the gradients, which are all-reduced between POD64s
    over the GW-Links of its machine (two 100 GbE links shared by its four IPUs), before the in-POD
    all-gather.
    Returns (IPU-Link part, GW-Link part) in seconds.
    """
    if replicas <= 1:
        return 0.0, 0.0
    pods = max(1, min(pods, replicas))
    r_pod = max(1, replicas // pods)
    ipu_link_s = 0.0
    if r_pod > 1:
        span = r_pod * stages  # the IPUs the ring runs past: on a ladder, whether it leaves the card
        bw = machine.neighbour_link_bytes_per_s(span, ring=True) * RING_LINK_FRACTION
        ipu_link_s = 2.0 * (r_pod - 1) / r_pod * grad_bytes / bw + 2.0 * (r_pod - 1) * IPU_LINK_HOP_S
    gw_s = 0.0
    if pods > 1:
        shard = grad_bytes / r_pod
        bw = machine.gw_link_bytes_per_s_per_machine / machine.ipus_per_machine
        gw_s = 2.0 * (pods - 1) / pods * shard / bw + 2.0 * (pods - 1) * GW_LINK_HOP_S
    return ipu_link_s, gw_s


def step_timing(
    graph: ModelGraph,
    stages: tuple[tuple[Layer, ...], ...],
    *,
    micro_batch: int,
    micro_batches: int,
    replicas: int,
    pods: int,
    precision: str,
    machine: Machine,
    train: bool,
    recompute: bool,
    optimizer_offchip: bool,
    device_iterations: int,
    c: Constants,
    stage_times: tuple[float, ...] | None = None,
) -> StepTiming:
    p = len(stages)
    if stage_times is None:
        stage_times = tuple(
            stage_compute_s(s, micro_batch, precision, machine, c, train, recompute, graph.trainable)
            for s in stages
        )
    b = dtype_bytes(precision)
    boundary_s = 0.0
    if p > 1:
        link = machine.neighbour_link_bytes_per_s(p, ring=False) * PIPELINE_LINK_FRACTION
        crossing = max(s[0].input_elements for s in stages[1:])
        # activations forward, and their gradients back when training
        boundary_s = (2.0 if train else 1.0) * micro_batch * crossing * b / link + _ss_s(machine, c)
    # Input streams are prefetched during compute; they only show when they are the slower of the two.
    host_io_s = micro_batch * graph.host_bytes_per_sample / (machine.host_link_bytes_per_s / 2.0)
    slot_s = max(max(stage_times) + boundary_s, host_io_s)
    fill_drain_s = (p - 1) * slot_s
    pipeline_s = micro_batches * slot_s + fill_drain_s

    allreduce_s = ipu_link_s = gw_s = optimizer_s = 0.0
    if train and graph.trainable:
        for layers in stages:
            params = sum(layer.params for layer in layers)
            ipu_part, gw_part = ring_allreduce_s(params * b, replicas, pods, machine, p)
            if ipu_part + gw_part > allreduce_s:
                allreduce_s, ipu_link_s, gw_s = ipu_part + gw_part, ipu_part, gw_part
            # Off-chip state is sharded over the replicas (replicated tensor sharding) and streamed from
            # the gateway's DDR: read the moments, write them back, over the IPU's host link.
            updated = params / replicas if optimizer_offchip else params
            t = _vector_s(updated * graph.optimizer_ops_per_param, precision, machine, c)
            if optimizer_offchip:
                state_bytes = updated * graph.optimizer_state_per_param * 4
                t += 2.0 * state_bytes / machine.host_link_bytes_per_s
            optimizer_s = max(optimizer_s, t)
    host_call_s = HOST_CALL_S / max(1, device_iterations)
    step_s = pipeline_s + allreduce_s + optimizer_s + host_call_s
    return StepTiming(
        step_s=step_s,
        slot_s=slot_s,
        stage_compute_s=stage_times,
        boundary_s=boundary_s,
        host_io_s=host_io_s,
        pipeline_fill_drain_s=fill_drain_s,
        allreduce_s=allreduce_s,
        allreduce_ipu_link_s=ipu_link_s,
        allreduce_gw_link_s=gw_s,
        optimizer_s=optimizer_s,
        host_call_s=host_call_s,
        micro_batches=micro_batches,
    )


def compile_s(stages: tuple[tuple[Layer, ...], ...], replicas: int, train: bool, recompute: bool) -> float:
    """Cluster seconds Poplar spends compiling the graph of one replica (replicas share the executable)."""
    instances = max(superstep_instances(s, train, recompute) for s in stages)
    return (
        COMPILE_FIXED_S
        + COMPILE_PER_SUPERSTEP_S * instances
        + COMPILE_PER_IPU_S * len(stages)
        + COMPILE_PER_REPLICA_DOUBLING_S * math.log2(max(1, replicas))
    )


def load_s(executable_bytes_per_ipu: float, machine: Machine) -> float:
    """Cluster seconds to load the executable: fixed attach and reset, then each IPU's image in parallel."""
    return LOAD_FIXED_S + executable_bytes_per_ipu / (machine.host_link_bytes_per_s / 2.0)


def pods_spanned(ipus: int) -> int:
    return max(1, math.ceil(ipus / POD64_IPUS))
