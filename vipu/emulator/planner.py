"""The planner: how a workload is laid out on a partition, as Poplar and optimum-graphcore would.

Given the partition (IPUs, machine type, POD64s spanned), the planner searches the configurations an
``IPUConfig`` can express: IPUs per replica P (pipeline stages, one IPU each; a power of two), replicas
R = IPUs / P, the micro-batch and the gradient accumulation (global batch = micro-batch x accumulation x
replicas), recomputation, and whether optimizer state lives off-chip in streaming memory. Layers are
split into P contiguous stages balanced by compute subject to every IPU fitting its In-Processor-Memory
(900 MB on GC200 and Bow, 304 MB on GC2); among the
configurations that fit it keeps the one with the shortest time per sample. Nothing fits: CompileError,
naming the stage, the bytes it needs, the bytes an IPU has, and what to change.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache

from vipu.emulator.errors import CompileError
from vipu.emulator.graph import Layer, ModelGraph
from vipu.emulator.machines import MACHINES, MAX_IPUS, Machine, get_machine
from vipu.emulator.memory import CODE_BASE_BYTES, StageAggregate, StageMemory, dtype_bytes, memory_of
from vipu.emulator.spec import WorkloadSpec
from vipu.emulator.timing import (
    FITTED,
    HOST_CALL_S,
    HOST_CALL_TARGET_S,
    Constants,
    StepTiming,
    compile_s,
    layer_s,
    load_s,
    pods_spanned,
    stage_compute_s,
    step_timing,
)
from vipu.machine_types import MachineType
from vipu.partitions import is_power_of_two

MAX_DEVICE_ITERATIONS = 1024
MB = 2**20  # Graphcore's "900 MB" is 1,472 x 624 KiB: binary megabytes


def _fmt_mb(n: float) -> str:
    return f"{n / MB:,.0f} MB"


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One pipeline stage: the IPU at this position in every replica."""

    index: int
    layers: tuple[str, ...]
    first_layer: int
    last_layer: int
    params: int
    memory: StageMemory
    compute_s: float
    """Time for one micro-batch through this stage (forward, backward, recomputation)."""
    compute_share: float
    """This stage's share of the replica's compute: 1 / P when perfectly balanced."""

    @property
    def memory_bytes(self) -> int:
        return self.memory.total

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "layers": list(self.layers),
            "first_layer": self.first_layer,
            "last_layer": self.last_layer,
            "params": self.params,
            "memory_bytes": self.memory_bytes,
            "memory": self.memory.to_dict(),
            "compute_s_per_micro_batch": self.compute_s,
            "compute_share": self.compute_share,
        }


@dataclass(frozen=True)
class Plan:
    """A compiled layout of a workload on a partition, with its predicted step timing."""

    spec: WorkloadSpec
    machine: str
    ipus: int
    pods: int
    gw_links: bool
    ipus_per_replica: int
    replicas: int
    micro_batch: int
    grad_accum: int
    """Micro-batches accumulated per replica per step (training; 1 for inference)."""
    micro_batches_per_step: int
    """Micro-batches each replica processes per step: the accumulation, or the inference batches."""
    device_iterations: int
    """Steps run on the device per host call."""
    global_batch: int
    requested_batch: int
    optimizer_offchip: bool
    recompute: bool
    stages: tuple[StagePlan, ...]
    memory_per_ipu_bytes: int
    sram_bytes: int
    timing: StepTiming
    compile_s: float
    load_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def layers_per_ipu(self) -> list[int]:
        return [s.last_layer - s.first_layer + 1 for s in self.stages]

    @property
    def step_s(self) -> float:
        return self.timing.step_s

    @property
    def throughput(self) -> float:
        """Samples per second in steady state."""
        return self.global_batch / self.timing.step_s

    @property
    def executable_key(self) -> str:
        """Hash of everything that determines the compiled executable (not steps, not the IPU ids)."""
        ident: dict[str, object] = {
            "model": self.spec.executable_identity,
            "task": self.spec.task,
            "seq_len": self.spec.seq_len,
            "precision": self.spec.precision,
            "machine": self.machine,
            "ipus_per_replica": self.ipus_per_replica,
            "replicas": self.replicas,
            "pods": self.pods if self.gw_links else 1,
            "micro_batch": self.micro_batch,
            "micro_batches_per_step": self.micro_batches_per_step,
            "device_iterations": self.device_iterations,
            "optimizer_offchip": self.optimizer_offchip,
            "recompute": self.recompute,
            "stages": [[s.first_layer, s.last_layer] for s in self.stages],
        }
        if self.spec.source is not None:
            ident["dims"] = sorted(self.spec.bindings)
            ident["optimizer"] = self.spec.optimizer
        blob = json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable; keys follow optimum-graphcore's IPUConfig where one exists."""
        return {
            "executable_key": self.executable_key,
            "machine": self.machine,
            "ipus": self.ipus,
            "pods": self.pods,
            "gw_links": self.gw_links,
            "ipus_per_replica": self.ipus_per_replica,
            "replication_factor": self.replicas,
            "replicas": self.replicas,
            "layers_per_ipu": self.layers_per_ipu,
            "micro_batch": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "grad_accum": self.grad_accum,
            "micro_batches_per_step": self.micro_batches_per_step,
            "device_iterations": self.device_iterations,
            "global_batch": self.global_batch,
            "requested_batch": self.requested_batch,
            "optimizer_state_offchip": self.optimizer_offchip,
            "optimizer_offchip": self.optimizer_offchip,
            "recompute": self.recompute,
            "memory_per_ipu_bytes": self.memory_per_ipu_bytes,
            "sram_bytes_per_ipu": self.sram_bytes,
            "stages": [s.to_dict() for s in self.stages],
            "timing": self.timing.to_dict(),
            "compile_s": self.compile_s,
            "load_s": self.load_s,
            "throughput": self.throughput,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class _Overrides:
    ipus_per_replica: int | None
    micro_batch: int | None
    optimizer_offchip: bool | None
    recompute: bool | None


@dataclass(slots=True)
class _Shortfall:
    """The least-bad configuration that did not fit, to explain the compile error."""

    over_ratio: float
    stage: int
    stages: int
    layers: tuple[str, ...]
    memory: StageMemory
    micro_batch: int
    optimizer_offchip: bool
    recompute: bool


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class _Layout:
    """Per-configuration helper: stage memory and the contiguous split of layers into stages."""

    def __init__(
        self,
        graph: ModelGraph,
        *,
        stages: int,
        micro_batch: int,
        precision: str,
        train: bool,
        recompute: bool,
        offchip: bool,
        times: list[float],
        limit: int,
    ) -> None:
        self.graph = graph
        self.layers = graph.layers
        self.p = stages
        self.mb = micro_batch
        self.precision = precision
        self.train = train
        self.recompute = recompute
        self.offchip = offchip
        self.times = times
        self.limit = limit

    def _memory(self, stage: int, agg: StageAggregate, i: int, j: int) -> StageMemory:
        return memory_of(
            self.graph,
            agg,
            stage=stage,
            stages=self.p,
            micro_batch=self.mb,
            precision=self.precision,
            train=self.train,
            recompute=self.recompute,
            optimizer_offchip=self.offchip,
            first=i == 0,
            last=j == len(self.layers) - 1,
        )

    def cannot_fit(self, whole: StageAggregate) -> bool:
        """A cheap necessary condition: the P stages together must hold the whole model, and the
        largest layer must fit on an IPU by itself even as the last stage."""
        together = self._memory(self.p - 1, whole, 0, len(self.layers) - 1)
        extra_code = (self.p - 1) * CODE_BASE_BYTES
        if together.total + extra_code > self.p * self.limit:
            return True
        if self.p == 1:
            return together.total > self.limit
        return False

    def memory(self, stage: int, i: int, j: int) -> StageMemory:
        agg = StageAggregate()
        for layer in self.layers[i : j + 1]:
            agg.add(layer)
        return self._memory(stage, agg, i, j)

    def _greedy(self, bottleneck: float, check_memory: bool) -> list[int] | None:
        """Stage end indices packing layers left to right under ``bottleneck`` and the memory limit."""
        n = len(self.layers)
        ends: list[int] = []
        i = 0
        for s in range(self.p):
            remaining_stages = self.p - s - 1
            agg = StageAggregate()
            agg.add(self.layers[i])
            t = self.times[i]
            j = i
            last_allowed = n - 1 - remaining_stages
            if remaining_stages == 0:
                for k in range(i + 1, n):
                    agg.add(self.layers[k])
                    t += self.times[k]
                j = n - 1
                if t > bottleneck or (check_memory and self._memory(s, agg, i, j).total > self.limit):
                    return None
                ends.append(j)
                return ends
            if t > bottleneck or (check_memory and self._memory(s, agg, i, j).total > self.limit):
                return None
            while j + 1 <= last_allowed and t + self.times[j + 1] <= bottleneck:
                if check_memory:
                    trial = agg.copy()
                    trial.add(self.layers[j + 1])
                    if self._memory(s, trial, i, j + 1).total > self.limit:
                        break
                    agg = trial
                j += 1
                t += self.times[j]
            ends.append(j)
            i = j + 1
        return None

    def split(self, check_memory: bool) -> list[int] | None:
        """The contiguous split minimising the slowest stage, by bisection on the bottleneck time."""
        if self.p > len(self.layers):
            return None
        lo = max(self.times)
        hi = sum(self.times)
        best = self._greedy(hi, check_memory)
        if best is None or self.p == 1:
            return best
        for _ in range(40):
            if hi - lo <= 1e-3 * hi:
                break
            mid = (lo + hi) / 2
            ends = self._greedy(mid, check_memory)
            if ends is None:
                lo = mid
            else:
                hi, best = mid, ends
        return best


def _ranges(ends: list[int]) -> list[tuple[int, int]]:
    out = []
    start = 0
    for e in ends:
        out.append((start, e))
        start = e + 1
    return out


def _device_iterations(step_s_without_host: float) -> int:
    if step_s_without_host <= 0:
        return MAX_DEVICE_ITERATIONS
    want = HOST_CALL_TARGET_S / step_s_without_host
    if want <= 1:
        return 1
    return min(MAX_DEVICE_ITERATIONS, 2 ** math.ceil(math.log2(want)))


def _check_partition(ipus: int, machine: str) -> Machine:
    if machine not in MACHINES:
        raise ValueError(f"machine must be one of {', '.join(MACHINES)}, got {machine!r}")
    m = get_machine(machine)
    if isinstance(ipus, bool) or not isinstance(ipus, int) or not is_power_of_two(ipus) or ipus > MAX_IPUS:
        raise ValueError(f"ipus must be a power of two from 1 to {MAX_IPUS:,}, got {ipus!r}")
    if ipus > m.max_partition:
        raise ValueError(
            f"a {m.type.value} partition holds at most {m.max_partition} IPUs ({_largest_unit(m)}), "
            f"got {ipus}"
        )
    return m


def _largest_unit(m: Machine) -> str:
    return "one server: no IPU-Link or GW-Link joins servers" if m.max_partition < 64 else "whole POD64s"


def plan(
    spec: WorkloadSpec,
    ipus: int,
    machine: str = "m2000",
    *,
    pods: int | None = None,
    gw_links: bool | None = None,
    ipus_per_replica: int | None = None,
    micro_batch: int | None = None,
    optimizer_offchip: bool | None = None,
    recompute: bool | None = None,
) -> Plan:
    """Lay ``spec`` out on a partition of ``ipus`` IPUs of ``machine``.

    ``pods`` (POD64s spanned, default ceil(ipus / 64)) and ``gw_links`` (whether the partition's
    traffic crosses GW-Links, default pods > 1) are the topology facts of the partition. The keyword
    overrides pin a choice the planner would otherwise make, like the matching ``IPUConfig`` options.
    Raises ``CompileError`` when nothing fits, ``ValueError`` for an impossible partition.
    """
    m = _check_partition(ipus, machine)
    n_pods = pods if pods is not None else pods_spanned(ipus)
    crosses = gw_links if gw_links is not None else n_pods > 1
    overrides = _Overrides(ipus_per_replica, micro_batch, optimizer_offchip, recompute)
    return _plan(spec, ipus, m.type.value, n_pods, crosses, overrides, FITTED)


@lru_cache(maxsize=1024)
def _plan(
    spec: WorkloadSpec, ipus: int, machine_type: str, pods: int, gw_links: bool, ov: _Overrides, c: Constants
) -> Plan:
    m = MACHINES[MachineType(machine_type)]
    train = spec.task == "train"
    precision = spec.dtype
    graph = spec.graph()
    layers = graph.layers
    limit = m.sram_bytes
    batch = spec.global_batch
    allreduce_pods = pods if gw_links else 1
    trained = train and graph.trainable

    most = min(ipus, spec.max_ipus_per_replica, len(layers))
    p_options = [p for p in (2**i for i in range(17)) if p <= most]
    if ov.ipus_per_replica is not None:
        if ov.ipus_per_replica not in p_options:
            raise CompileError(
                f"ipus_per_replica={ov.ipus_per_replica} is not possible for {spec.label} on {ipus} IPUs.",
                suggestion=f"choose one of {', '.join(map(str, p_options))}",
            )
        p_options = [ov.ipus_per_replica]
    recompute_options = (False, True) if train else (False,)
    if ov.recompute is not None:
        recompute_options = (ov.recompute,) if train else (False,)
    offchip_options = (False, True) if trained else (False,)
    if ov.optimizer_offchip is not None:
        offchip_options = (ov.optimizer_offchip,) if trained else (False,)

    best: tuple[float, Plan] | None = None
    best_rounded: tuple[float, Plan] | None = None
    failed: dict[tuple[int, bool, bool], _Layout] = {}
    too_few_samples = True
    whole = StageAggregate()
    for layer in layers:
        whole.add(layer)

    for p in p_options:
        replicas = ipus // p
        if replicas > batch:
            continue
        too_few_samples = False
        per_replica = -(-batch // replicas)
        exact = per_replica * replicas == batch
        mbs = _divisors(per_replica)
        if ov.micro_batch is not None:
            if per_replica % ov.micro_batch:
                raise CompileError(
                    f"micro_batch={ov.micro_batch} does not divide the {per_replica} samples each of the "
                    f"{replicas} replicas gets per step.",
                    suggestion="choose a micro-batch that divides batch_size / replicas",
                )
            mbs = [ov.micro_batch]
        for recompute in recompute_options:
            for offchip in offchip_options:
                # Walk the micro-batch down from the largest; the time per sample first improves (less
                # pipeline bubble) or not at all, then worsens (smaller GEMMs, more fixed costs).
                previous: float | None = None
                for mb in sorted(mbs, reverse=True):
                    lay = _Layout(
                        graph,
                        stages=p,
                        micro_batch=mb,
                        precision=precision,
                        train=train,
                        recompute=recompute,
                        offchip=offchip,
                        times=[],
                        limit=limit,
                    )
                    if lay.cannot_fit(whole):
                        failed[(p, recompute, offchip)] = lay
                        continue
                    lay.times = [layer_s(layer, mb, precision, m, c, train, recompute) for layer in layers]
                    ends = lay.split(check_memory=True)
                    if ends is None:
                        failed[(p, recompute, offchip)] = lay
                        continue
                    candidate = _build(
                        spec,
                        graph,
                        m,
                        ipus,
                        pods,
                        gw_links,
                        allreduce_pods,
                        p,
                        replicas,
                        mb,
                        per_replica // mb,
                        recompute,
                        offchip,
                        lay,
                        ends,
                        c,
                        exact,
                    )
                    per_sample = candidate.step_s / candidate.global_batch
                    if exact:
                        if best is None or per_sample < best[0]:
                            best = (per_sample, candidate)
                    elif best_rounded is None or per_sample < best_rounded[0]:
                        best_rounded = (per_sample, candidate)
                    if previous is not None and per_sample > previous:
                        break
                    previous = per_sample
    if best is not None:
        return best[1]
    if best_rounded is not None:
        return best_rounded[1]
    if too_few_samples:
        # R = IPUs / P replicas each need a sample, and P is at most the deepest pipeline tried.
        deepest = max(p_options)
        raise CompileError(
            f"a global batch of {batch} cannot give each of the {ipus // deepest} or more replicas of "
            f"{spec.label} on {ipus} IPUs a sample.",
            suggestion=f"use a batch_size of at least {ipus // deepest}, or a partition of at most "
            f"{batch * deepest} IPUs",
        )
    shortfall: _Shortfall | None = None
    for lay in failed.values():
        lay.times = [layer_s(layer, lay.mb, precision, m, c, train, lay.recompute) for layer in layers]
        shortfall = _worse_of(shortfall, _explain(lay))
    assert shortfall is not None
    raise _oom_error(spec, graph, m, ipus, shortfall, ov)


def _build(
    spec: WorkloadSpec,
    graph: ModelGraph,
    m: Machine,
    ipus: int,
    pods: int,
    gw_links: bool,
    allreduce_pods: int,
    p: int,
    replicas: int,
    mb: int,
    micro_batches: int,
    recompute: bool,
    offchip: bool,
    lay: _Layout,
    ends: list[int],
    c: Constants,
    exact: bool,
) -> Plan:
    train = spec.task == "train"
    precision = spec.dtype
    ranges = _ranges(ends)
    stage_layers: tuple[tuple[Layer, ...], ...] = tuple(graph.layers[i : j + 1] for i, j in ranges)
    stage_times = tuple(
        stage_compute_s(s, mb, precision, m, c, train, recompute, graph.trainable) for s in stage_layers
    )

    def timed(device_iterations: int) -> StepTiming:
        return step_timing(
            graph,
            stage_layers,
            micro_batch=mb,
            micro_batches=micro_batches,
            replicas=replicas,
            pods=allreduce_pods,
            precision=precision,
            machine=m,
            train=train,
            recompute=recompute,
            optimizer_offchip=offchip,
            device_iterations=device_iterations,
            c=c,
            stage_times=stage_times,
        )

    # The host-call cost depends on the device iterations, which depend on the step without it.
    di = _device_iterations(timed(1).step_s - HOST_CALL_S)
    timing = timed(di)
    total = sum(stage_times)
    stages = []
    for s, ((i, j), layers) in enumerate(zip(ranges, stage_layers, strict=True)):
        stages.append(
            StagePlan(
                index=s,
                layers=tuple(layer.name for layer in layers),
                first_layer=i,
                last_layer=j,
                params=sum(layer.params for layer in layers),
                memory=lay.memory(s, i, j),
                compute_s=stage_times[s],
                compute_share=stage_times[s] / total if total > 0 else 1.0 / p,
            )
        )
    global_batch = replicas * mb * micro_batches
    notes = []
    if not exact:
        notes.append(
            f"global batch rounded up from {spec.global_batch} to {global_batch} so that each of the "
            f"{replicas} replicas gets the same number of samples"
        )
    if graph.samples_per_slot > 1:
        notes.append(
            f"sequences are packed, {graph.samples_per_slot:.2f} per {spec.seq_len}-token slot on average"
        )
    if offchip and not m.has_streaming_memory:
        notes.append(
            f"optimizer state lives off-chip in the {m.offchip_store} and crosses PCIe every step: a "
            f"{m.product} has no streaming memory"
        )
    memory_per_ipu = max(s.memory_bytes for s in stages)
    exe_bytes = max(s.memory.code + s.memory.weights for s in stages)
    return Plan(
        spec=spec,
        machine=m.type.value,
        ipus=ipus,
        pods=pods,
        gw_links=gw_links,
        ipus_per_replica=p,
        replicas=replicas,
        micro_batch=mb,
        grad_accum=micro_batches if train else 1,
        micro_batches_per_step=micro_batches,
        device_iterations=di,
        global_batch=global_batch,
        requested_batch=spec.global_batch,
        optimizer_offchip=offchip,
        recompute=recompute,
        stages=tuple(stages),
        memory_per_ipu_bytes=memory_per_ipu,
        sram_bytes=m.sram_bytes,
        timing=timing,
        compile_s=compile_s(stage_layers, replicas, train, recompute),
        load_s=load_s(exe_bytes, m),
        notes=tuple(notes),
    )


def _explain(lay: _Layout) -> _Shortfall:
    """The worst stage of the compute-balanced split, for a configuration that does not fit."""
    ends = lay.split(check_memory=False)
    assert ends is not None, "the planner only tries as many stages as there are layers"
    worst: _Shortfall | None = None
    for s, (i, j) in enumerate(_ranges(ends)):
        mem = lay.memory(s, i, j)
        ratio = mem.total / lay.limit
        if worst is None or ratio > worst.over_ratio:
            worst = _Shortfall(
                ratio,
                s,
                lay.p,
                tuple(layer.name for layer in lay.layers[i : j + 1]),
                mem,
                lay.mb,
                lay.offchip,
                lay.recompute,
            )
    assert worst is not None
    return worst


def _worse_of(current: _Shortfall | None, new: _Shortfall) -> _Shortfall:
    # Report the configuration that came closest to fitting: it is the one worth explaining.
    if current is None or new.over_ratio < current.over_ratio:
        return new
    return current


def _layer_span(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"


def _oom_error(
    spec: WorkloadSpec, graph: ModelGraph, m: Machine, ipus: int, sf: _Shortfall, ov: _Overrides
) -> CompileError:
    mem = sf.memory
    needed = mem.total
    parts = ", ".join(
        f"{k.replace('_', ' ')} {_fmt_mb(v)}" for k, v in mem.to_dict().items() if k != "total" and v
    )
    message = (
        f"Out of memory compiling {spec.label} ({spec.task}, {spec.precision}) for {ipus} IPU(s): "
        f"stage {sf.stage} of {sf.stages} ({_layer_span(sf.layers)}) needs {_fmt_mb(needed)} "
        f"({needed:,} bytes) but a {m.chip} IPU has {m.sram_label} ({m.sram_bytes:,} bytes) of "
        "In-Processor-Memory "
        f"[{parts}; micro-batch {sf.micro_batch}]."
    )
    advice: list[str] = []
    state = graph.params * dtype_bytes(spec.dtype) * (2 if spec.task == "train" and graph.trainable else 1)
    if sf.stages * 2 <= spec.max_ipus_per_replica:
        want = max(2 * ipus, 2 ** math.ceil(math.log2(max(1.0, 1.6 * state / m.sram_bytes))))
        held = "weights and gradients" if spec.task == "train" else "weights"
        if want <= m.max_partition:
            advice.append(
                f"more IPUs per replica: a partition of {min(want, MAX_IPUS)} or more IPUs "
                f"({held} alone take {_fmt_mb(state)})"
            )
        else:
            others = ", ".join(t for t, other in MACHINES.items() if other.max_partition >= want)
            advice.append(
                f"a machine type with room for {want} or more IPUs per replica ({others}): a "
                f"{m.type.value} partition holds at most {m.max_partition} ({held} alone take "
                f"{_fmt_mb(state)})"
            )
    if sf.micro_batch > 1:
        advice.append(f"a smaller micro-batch than {sf.micro_batch}")
    if spec.task == "train" and graph.trainable and not sf.optimizer_offchip:
        advice.append(f"optimizer state off-chip in {m.offchip_store} (optimizer_offchip=True)")
    if spec.task == "train" and not sf.recompute:
        advice.append("recomputation (recompute=True)")
    if spec.precision == "fp32":
        advice.append("FP16, which halves weights and activations")
    suggestion = "; ".join(advice) if advice else "a larger partition"
    return CompileError(
        message,
        suggestion=suggestion,
        stage=sf.stage,
        stage_layers=sf.layers,
        needed_bytes=needed,
        available_bytes=m.sram_bytes,
    )


def choose_ipus_auto(spec: WorkloadSpec, machine: str = "m2000") -> int:
    """The smallest power-of-two partition on which ``spec`` compiles (for ``"ipus": "auto"``)."""
    most = _check_partition(1, machine).max_partition
    closest_oom: CompileError | None = None
    last: CompileError | None = None
    ipus = 1
    while ipus <= most:
        try:
            plan(spec, ipus, machine)
            return ipus
        except CompileError as exc:
            last = exc
            if exc.needed_bytes is not None:
                closest_oom = exc
        ipus *= 2
    # Past some size the batch no longer covers the replicas; the memory error from the largest
    # partition that was still tried for memory is the one that explains why nothing fits.
    error = closest_oom or last
    assert error is not None
    raise error
