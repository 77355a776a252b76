"""Serving: a model held on a replica of IPUs answering requests one batch per host call.

Offline inference (``plan`` with ``task: "infer"``) runs thousands of batches per host call and
spreads the call's cost over them. A server cannot wait for thousands of requests: each batch it
forms is one call, so the call's fixed cost, the batch's trip over the host link and its trip
through the chip are all in the answer's latency. For a batch of ``b`` requests on a replica of
``P`` pipeline stages times ``R`` data-parallel copies, each copy taking ``c = ceil(b / R)`` rows:

    device_s(b)  = sum over stages of stage_s(c) + sum over stage boundaries of hand-over(c)
                   stage_s: the forward time of the stage's layers at micro-batch c (``timing.layer_s``)
                   hand-over: c x activations crossing x bytes / (IPU-Link B/s towards the neighbour / 2)
                              + one superstep
    host_s(b)    = c x input bytes per row / host B/s + c x output bytes per row / host B/s
                   host B/s: ``Machine.serving_host_bytes_per_s`` (each way, per IPU)
    latency_s(b) = host_call_s + host_s(b) + device_s(b)
    step_s(b)    = max(slowest stage + its hand-over, c x input bytes / host B/s,
                       c x output bytes / host B/s, host_call_s)

``step_s`` models overlap: the host runtime, the host link (full duplex) and every pipeline stage
work on different batches at once, as Poplar's I/O tiles stream the next batch in while the compute
tiles run, so a replica at saturation starts a batch every ``step_s`` while each request still
waits ``latency_s``. ``host_call_s`` is the machine's (``vipu/machine_types.py``): gateway-attached
IPU-M2000 and Bow-2000 pay round trips over RoCEv2, PCIe C2 cards over PCIe.

The layout is compiled once, for the largest batch that fits In-Processor-Memory (at most the batch
asked for); smaller batches are timed as the same layers at fewer rows, the figures a program built
for that batch would give (a server that pads every batch to the compiled size would see
``latency_s(max_batch_size)`` for all of them). Bytes on the host link follow the signature's
datatypes, not the 8-bit images of Graphcore's offline recipes.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from vipu.emulator.catalogue.probabilistic import MCMC_DIMENSION
from vipu.emulator.catalogue.recommendation import AUTOENCODER_ITEMS
from vipu.emulator.catalogue.series import SERIES_FEATURES
from vipu.emulator.catalogue.vision import IMAGENET_CLASSES
from vipu.emulator.errors import CompileError, WorkloadError
from vipu.emulator.graph import Layer
from vipu.emulator.machines import MACHINES, Machine
from vipu.emulator.memory import StageAggregate, dtype_bytes
from vipu.emulator.planner import (
    _check_partition,
    _explain,
    _Layout,
    _oom_error,
    _Overrides,
    _ranges,
    _Shortfall,
    _worse_of,
)
from vipu.emulator.spec import WorkloadSpec
from vipu.emulator.timing import (
    FITTED,
    PIPELINE_LINK_FRACTION,
    compile_s,
    layer_s,
    load_s,
)
from vipu.machine_types import MachineType

if TYPE_CHECKING:
    import numpy as np

MAX_SERVE_BATCH = 65_536
MAX_SERVING_IPUS = 64
"""The largest replica ``choose_serving_ipus`` considers: one POD64, no GW-Link inside a replica."""
DEFAULT_SERVE_BATCHES = (1, 2, 4, 8, 16, 32, 64)

# Bytes per element of the KServe v2 datatypes the emulator serves (BYTES, strings of no fixed size,
# is not one of them; BF16 is Triton's addition to the protocol's list).
V2_BYTES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "BF16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
}


@lru_cache(maxsize=1)
def numpy_types() -> dict[str, Any]:
    # numpy is imported on the first tensor: the processes that never see one (the scheduler,
    # the agents, an API serving no endpoint) do not hold its ~20 MiB.
    import numpy as np

    return {
        "BOOL": np.bool_,
        "UINT8": np.uint8,
        "INT8": np.int8,
        "UINT16": np.uint16,
        "INT16": np.int16,
        "FP16": np.float16,
        "BF16": np.uint16,  # numpy has no bfloat16: the raw 16 bits, as the v2 binary extension carries them
        "UINT32": np.uint32,
        "INT32": np.int32,
        "FP32": np.float32,
        "UINT64": np.uint64,
        "INT64": np.int64,
        "FP64": np.float64,
    }


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a served model, as v2 model metadata lists it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    """The batch axis written -1 (the first, but for an own graph whose batch axis is elsewhere);
    every other dimension bound."""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @property
    def bytes_per_row(self) -> int:
        return V2_BYTES[self.datatype] * math.prod(d for d in self.shape if d != -1)

    def shape_for(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == -1 else d for d in self.shape)


@dataclass(frozen=True, slots=True)
class Signature:
    """What a request carries in and what its answer carries out."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_bytes_per_row(self) -> int:
        return sum(t.bytes_per_row for t in self.inputs)

    @property
    def output_bytes_per_row(self) -> int:
        return sum(t.bytes_per_row for t in self.outputs)

    def to_dict(self) -> dict[str, object]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}


def signature_of(spec: WorkloadSpec) -> Signature:
    """The serving signature of a workload at its sizes (``seq_len``, ``dims``, precision).

    An own ONNX graph serves its own inputs and outputs (names, element types, shapes bound at the
    spec's dimensions); a catalogue model the tensors of its published inference app. Raises
    ``WorkloadError`` for a graph with a tensor the protocol cannot carry at a fixed size.
    """
    if spec.source is not None:
        io = getattr(spec.source, "io", None)
        if io is None:
            raise WorkloadError("model", f"{spec.label} has no inputs and outputs to serve")
        inputs, outputs = io(spec.bindings)
        return Signature(
            tuple(TensorSpec(*t) for t in inputs),
            tuple(TensorSpec(*t) for t in outputs),
        )
    return _catalogue_signature(spec.workload.family, spec.model, spec.seq_len, spec.dtype)


@lru_cache(maxsize=256)
def _catalogue_signature(family: str, name: str, seq_len: int | None, precision: str) -> Signature:
    fp = "FP16" if precision == "fp16" else "FP32"
    if family == "nlp":
        # Graphcore's BERT SQuAD inference (graphcore/examples nlp/bert, and optimum-graphcore's
        # question-answering pipeline): the tokenizer's three INT64 tensors in, a start and an end
        # logit per token out, in FP32 whatever the model computes in.
        seq = int(seq_len or 0)
        ins = tuple(
            TensorSpec(n, "INT64", (-1, seq)) for n in ("input_ids", "attention_mask", "token_type_ids")
        )
        outs = (TensorSpec("start_logits", "FP32", (-1, seq)), TensorSpec("end_logits", "FP32", (-1, seq)))
        return Signature(ins, outs)
    if family == "vision":
        # Graphcore's CNN inference app (graphcore/examples applications/pytorch/cnns/inference): an
        # NCHW image batch in the model's precision, the classifier's ImageNet logits out.
        from vipu.emulator.catalogue import get_workload

        size = int(get_workload(name).image_size or 0)
        return Signature(
            (TensorSpec("images", fp, (-1, 3, size, size)),),
            (TensorSpec("logits", fp, (-1, IMAGENET_CLASSES)),),
        )
    if family == "time-series":
        # The catalogue's forecaster: a window of seq_len readings of every series, FP32 from the
        # host (catalogue/series.py, SERIES_READING_BYTES), and the next reading of each series back.
        seq = int(seq_len or 0)
        return Signature(
            (TensorSpec("window", "FP32", (-1, seq, SERIES_FEATURES)),),
            (TensorSpec("forecast", "FP32", (-1, SERIES_FEATURES)),),
        )
    if family == "recommendation":
        # DeepRecommender: a user's dense rating vector, one byte per item (ratings 0-5, as the
        # catalogue streams it), and the predicted rating of every item back.
        return Signature(
            (TensorSpec("ratings", "UINT8", (-1, AUTOENCODER_ITEMS)),),
            (TensorSpec("predicted_ratings", fp, (-1, AUTOENCODER_ITEMS)),),
        )
    if family == "probabilistic":
        # HMC: each row is one chain's current position; the answer is its next draw of theta (FP32, as
        # the catalogue sends draws to the host) and whether the Metropolis step accepted it.
        return Signature(
            (TensorSpec("position", "FP32", (-1, MCMC_DIMENSION)),),
            (TensorSpec("draw", "FP32", (-1, MCMC_DIMENSION)), TensorSpec("accepted", "BOOL", (-1,))),
        )
    raise WorkloadError("model", f"{name} has no serving signature")


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """One batch's times on a replica, in cluster seconds."""

    device_s: float
    host_s: float
    host_call_s: float
    latency_s: float
    step_s: float


class _Timer:
    """The per-batch times of one serving layout, each batch size computed once and kept (the
    serving path asks for them per batch)."""

    __slots__ = (
        "_cache",
        "boundaries",
        "host_bps",
        "in_bytes",
        "machine",
        "out_bytes",
        "precision",
        "replicas",
        "stages",
    )

    def __init__(
        self,
        stages: tuple[tuple[Layer, ...], ...],
        *,
        machine: Machine,
        precision: str,
        replicas: int,
        in_bytes: float,
        out_bytes: float,
    ) -> None:
        self.stages = stages
        self.machine = machine
        self.precision = precision
        self.replicas = replicas
        self.in_bytes = in_bytes
        self.out_bytes = out_bytes
        self.host_bps = machine.serving_host_bytes_per_s
        # Activations entering each stage after the first cross one IPU-Link hand-over.
        self.boundaries = tuple(s[0].input_elements for s in stages[1:])
        self._cache: dict[int, BatchTimes] = {}

    def times(self, batch: int) -> BatchTimes:
        hit = self._cache.get(batch)
        if hit is not None:
            return hit
        m = self.machine
        rows = -(-batch // self.replicas)
        stage_s = [
            sum(layer_s(layer, rows, self.precision, m, FITTED, False, False) for layer in stage)
            for stage in self.stages
        ]
        hand_s = [0.0] * len(self.stages)
        if self.boundaries:
            link = m.neighbour_link_bytes_per_s(len(self.stages), ring=False) * PIPELINE_LINK_FRACTION
            superstep = FITTED.superstep_cycles / m.clock_hz
            b = dtype_bytes(self.precision)
            for i, elements in enumerate(self.boundaries):
                hand_s[i] = rows * elements * b / link + superstep
        device = sum(stage_s) + sum(hand_s)
        host_in = rows * self.in_bytes / self.host_bps
        host_out = rows * self.out_bytes / self.host_bps
        call = m.host_call_s
        slowest = max(s + h for s, h in zip(stage_s, hand_s, strict=True))
        out = BatchTimes(
            device_s=device,
            host_s=host_in + host_out,
            host_call_s=call,
            latency_s=call + host_in + host_out + device,
            step_s=max(slowest, host_in, host_out, call),
        )
        self._cache[batch] = out
        return out


@dataclass(frozen=True, slots=True)
class ServePlan:
    """A model laid out on one serving replica, with its per-batch times (see the module docstring)."""

    model: str
    machine: str
    ipus: int
    """IPUs per replica: pipeline stages x data-parallel copies inside the replica (a power of two)."""
    precision: str
    max_batch_size: int
    """The largest batch that fits In-Processor-Memory, at most the one asked for."""
    compile_s: float
    load_s: float
    executable_key: str
    host_call_s: float
    signature: Signature
    pipeline_stages: int
    replicas: int
    """Data-parallel copies of the pipeline inside the replica; a batch is split between them."""
    layers_per_stage: tuple[int, ...]
    memory_per_ipu_bytes: int
    """The busiest IPU's memory at ``max_batch_size``."""
    host_bytes_per_s: float
    """Host data per IPU, each way."""
    _timer: _Timer = field(compare=False, repr=False)

    def _times(self, batch: int) -> BatchTimes:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= self.max_batch_size:
            raise ValueError(f"batch must be an integer from 1 to {self.max_batch_size}, got {batch!r}")
        return self._timer.times(batch)

    def times(self, batch: int) -> BatchTimes:
        """Every part of one batch's time at once."""
        return self._times(batch)

    def device_s(self, batch: int) -> float:
        return self._times(batch).device_s

    def host_s(self, batch: int) -> float:
        return self._times(batch).host_s

    def latency_s(self, batch: int) -> float:
        return self._times(batch).latency_s

    def step_s(self, batch: int) -> float:
        """How long the replica is busy per batch at saturation: less than ``latency_s`` (overlap)."""
        return self._times(batch).step_s

    def throughput(self, batch: int) -> float:
        return batch / self._times(batch).step_s

    def under_load(
        self,
        arrivals_s: Sequence[float],
        *,
        max_batch_size: int | None = None,
        max_wait_ms: float = 0.0,
    ) -> list[float]:
        """Each request's latency (cluster seconds) when one replica serves requests of one row
        arriving at these times (sorted), as ``workers/serving.py`` batches them: queue wait +
        batch wait + the plan's latency of the batch it ran in. See ``batch_under_load``."""
        return batch_under_load(
            self,
            arrivals_s,
            max_batch_size=self.max_batch_size if max_batch_size is None else max_batch_size,
            max_wait_ms=max_wait_ms,
        )

    def p99_under_load(
        self,
        rate: float,
        *,
        max_batch_size: int | None = None,
        max_wait_ms: float = 0.0,
        seconds: float = 10.0,
    ) -> float:
        """The p99 latency (cluster seconds) at ``rate`` requests/s arriving at a fixed rate: the plan's
        prediction of what an endpoint's Server-Timing shows under that load, queueing included
        (``latency_s`` is what a request sees on an idle replica)."""
        n = max(1, int(rate * seconds))
        lat = self.under_load([i / rate for i in range(n)], max_batch_size=max_batch_size,
                              max_wait_ms=max_wait_ms)  # fmt: skip
        return sorted(lat)[min(n - 1, round(0.99 * (n - 1)))]

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "machine": self.machine,
            "ipus": self.ipus,
            "precision": self.precision,
            "max_batch_size": self.max_batch_size,
            "compile_s": self.compile_s,
            "load_s": self.load_s,
            "executable_key": self.executable_key,
            "host_call_s": self.host_call_s,
            "signature": self.signature.to_dict(),
            "pipeline_stages": self.pipeline_stages,
            "replicas": self.replicas,
            "layers_per_stage": list(self.layers_per_stage),
            "memory_per_ipu_bytes": self.memory_per_ipu_bytes,
            "host_bytes_per_s": self.host_bytes_per_s,
            "input_bytes_per_row": self.signature.input_bytes_per_row,
            "output_bytes_per_row": self.signature.output_bytes_per_row,
        }


@dataclass(frozen=True, slots=True)
class Cut:
    """A replica's next batch on its device's timeline (``cut_batch``), in the arrivals' time unit."""

    n: int
    """How many of the pending requests (oldest first, from ``first``) it takes."""
    rows: int
    fill_from: float
    """When the device is free for it and its first request has come: waiting before is queueing."""
    start: float
    """When it starts: ``fill_from``, or later by the batching window (waiting after is batching)."""
    known: float
    """Requests arriving up to this time may still join it (unless ``closed``)."""
    closed: bool
    """Full, or stopped by a request that does not fit: later arrivals cannot change it."""


def cut_batch(
    arrivals: Sequence[float],
    device_free: float,
    max_rows: int,
    wait_s: float,
    *,
    rows: Sequence[int] | None = None,
    first: int = 0,
) -> Cut:
    """The serving replica's batching policy, the one implementation: the live replica
    (``workers.serving``) and the plan's replay (``batch_under_load``) both call it.

    On the requests pending from ``first`` (``arrivals`` sorted, at least one from ``first``; ``rows``
    each, one if None): the device takes every request that arrived by the time it is free (or, idle,
    the first request's arrival), up to ``max_rows``, then waits up to ``wait_s`` from then for the
    batch to fill, starting as soon as it is full. A request of several rows that does not fit ends
    the batch (at its arrival: the batcher then knows it is complete). Scale-free: the arrivals, the
    device's free time and ``wait_s`` in one unit (wall seconds live, cluster seconds in the replay)."""
    fill_from = max(device_free, arrivals[first])
    end = len(arrivals)
    i = first
    taken = 0
    limit = fill_from
    for phase in (0, 1):
        if phase == 1:
            if wait_s <= 0 or taken >= max_rows:
                break
            limit = fill_from + wait_s
        while i < end and taken < max_rows:
            t = arrivals[i]
            if t > limit:
                break
            r = 1 if rows is None else rows[i]
            if i > first and taken + r > max_rows:
                start = max(fill_from, t)
                return Cut(i - first, taken, fill_from, start, start, True)
            taken += r
            i += 1
    if taken >= max_rows:
        start = max(fill_from, arrivals[i - 1])
        return Cut(i - first, taken, fill_from, start, start, True)
    start = fill_from + wait_s if wait_s > 0 else fill_from
    return Cut(i - first, taken, fill_from, start, start, False)


def batch_under_load(
    plan: ServePlan, arrivals_s: Sequence[float], *, max_batch_size: int, max_wait_ms: float = 0.0
) -> list[float]:
    """The serving replica's batching policy (``cut_batch``, as ``workers/serving.py`` runs it) replayed
    on the plan's times.

    The device takes a batch every ``step_s(b)`` at most (pipelined: the next may start while this
    one's answers are on their way); when it is free, the replica takes every request waiting, up to
    ``max_batch_size``, and waits up to ``max_wait_ms`` from then for the batch to fill (starting as
    soon as it is full). A request's latency is its wait for the device (the queue), its wait for
    the batch to fill, then ``latency_s`` of the batch it ran in: under load, most requests arrive
    while the device runs an earlier batch, so a p99 lies up to one step above ``latency_s``. This
    is what the endpoint reports in ``Server-Timing`` (queue + batch + host + ipu); the hop from the
    API to the replica is the platform's and in neither."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    wait = max(0.0, max_wait_ms) / 1000.0
    out: list[float] = []
    n = len(arrivals_s)
    device_free = -math.inf
    i = 0
    while i < n:
        cut = cut_batch(arrivals_s, device_free, max_batch_size, wait, first=i)
        t = plan.times(min(cut.rows, plan.max_batch_size))
        for k in range(i, i + cut.n):
            out.append(cut.start - arrivals_s[k] + t.latency_s)
        device_free = cut.start + t.step_s
        i += cut.n
    return out


def serve_plan(spec: WorkloadSpec, *, machine: str, ipus: int, max_batch_size: int) -> ServePlan:
    """Lay ``spec`` (an inference workload) out on a serving replica of ``ipus`` IPUs of ``machine``
    for batches of up to ``max_batch_size`` requests.

    Among the layouts the replica allows (P pipeline stages x R copies, P x R = ipus), keeps the one
    that fits the largest batch (at most the one asked), then the one with the lowest latency there.
    Raises ``CompileError`` (naming the stage, the bytes it needs and the bytes an IPU has) when not
    even a batch of one fits, ``WorkloadError`` for a training spec, ``ValueError`` for an impossible
    replica or batch.
    """
    if spec.task != "infer":
        raise WorkloadError("task", "serving answers inference requests: the task must be 'infer'")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
        raise ValueError(f"max_batch_size must be an integer, got {max_batch_size!r}")
    if not 1 <= max_batch_size <= MAX_SERVE_BATCH:
        raise ValueError(f"max_batch_size must be from 1 to {MAX_SERVE_BATCH:,}, got {max_batch_size}")
    m = _check_partition(ipus, machine)
    return _serve_plan(spec, ipus, m.type.value, max_batch_size)


@dataclass(slots=True)
class _Candidate:
    stages: int
    replicas: int
    rows: int
    layout: _Layout
    ends: list[int]


@lru_cache(maxsize=512)
def _serve_plan(spec: WorkloadSpec, ipus: int, machine_type: str, asked: int) -> ServePlan:
    m = MACHINES[MachineType(machine_type)]
    sig = signature_of(spec)
    # The host streams are the signature's tensors, double-buffered on the first stage's IPU.
    graph = replace(
        spec.graph(), host_bytes_per_sample=float(sig.input_bytes_per_row + sig.output_bytes_per_row)
    )
    layers = graph.layers
    precision = spec.dtype
    whole = StageAggregate()
    for layer in layers:
        whole.add(layer)

    def fitting(p: int, rows: int) -> tuple[_Layout, list[int] | None]:
        lay = _Layout(
            graph,
            stages=p,
            micro_batch=rows,
            precision=precision,
            train=False,
            recompute=False,
            offchip=False,
            times=[],
            limit=m.sram_bytes,
        )
        if lay.cannot_fit(whole):
            return lay, None
        lay.times = [layer_s(layer, rows, precision, m, FITTED, False, False) for layer in layers]
        return lay, lay.split(check_memory=True)

    most = min(ipus, spec.max_ipus_per_replica, len(layers))
    best: tuple[tuple[int, float, int], _Candidate, _Timer] | None = None
    shortfall: _Shortfall | None = None
    p = 1
    while p <= most:
        r = ipus // p
        want = -(-asked // r)
        lay, ends = fitting(p, 1)
        if ends is None:
            lay.times = [layer_s(layer, 1, precision, m, FITTED, False, False) for layer in layers]
            shortfall = _worse_of(shortfall, _explain(lay))
            p *= 2
            continue
        rows = 1
        top_lay, top_ends = fitting(p, want) if want > 1 else (lay, ends)
        if top_ends is not None:
            rows, lay, ends = want, top_lay, top_ends
        else:
            lo, hi = 1, want  # fits at lo, not at hi: memory grows with the rows
            while hi - lo > 1:
                mid = (lo + hi) // 2
                mid_lay, mid_ends = fitting(p, mid)
                if mid_ends is None:
                    hi = mid
                else:
                    lo, lay, ends = mid, mid_lay, mid_ends
            rows = lo
        assert ends is not None
        batch = min(asked, rows * r)
        cand = _Candidate(p, r, rows, lay, ends)
        timer = _timer_of(cand, graph.layers, m, precision, sig)
        rank = (-batch, timer.times(batch).latency_s, p)
        if best is None or rank < best[0]:
            best = (rank, cand, timer)
        p *= 2
    if best is None:
        assert shortfall is not None
        raise _oom_error(spec, graph, m, ipus, shortfall, _Overrides(None, None, None, None))
    (neg_batch, _, _), cand, timer = best
    ranges = _ranges(cand.ends)
    stage_layers = timer.stages
    memories = [cand.layout.memory(s, i, j) for s, (i, j) in enumerate(ranges)]
    exe_bytes = max(mem.code + mem.weights for mem in memories)
    ident: dict[str, object] = {
        "serve": 1,
        "model": spec.executable_identity,
        "task": "infer",
        "seq_len": spec.seq_len,
        "precision": precision,
        "machine": machine_type,
        "ipus": ipus,
        "pipeline_stages": cand.stages,
        "replicas": cand.replicas,
        "max_batch_size": -neg_batch,
        "stages": [[i, j] for i, j in ranges],
        "signature": sig.to_dict(),
    }
    if spec.source is not None:
        ident["dims"] = sorted(spec.bindings)
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()
    return ServePlan(
        model=spec.model,
        machine=machine_type,
        ipus=ipus,
        precision=precision,
        max_batch_size=-neg_batch,
        compile_s=compile_s(stage_layers, cand.replicas, False, False),
        load_s=load_s(exe_bytes, m),
        executable_key=hashlib.sha256(blob).hexdigest()[:24],
        host_call_s=m.host_call_s,
        signature=sig,
        pipeline_stages=cand.stages,
        replicas=cand.replicas,
        layers_per_stage=tuple(j - i + 1 for i, j in ranges),
        memory_per_ipu_bytes=max(mem.total for mem in memories),
        host_bytes_per_s=m.serving_host_bytes_per_s,
        _timer=timer,
    )


def _timer_of(
    cand: _Candidate, layers: tuple[Layer, ...], m: Machine, precision: str, sig: Signature
) -> _Timer:
    stages = tuple(layers[i : j + 1] for i, j in _ranges(cand.ends))
    return _Timer(
        stages,
        machine=m,
        precision=precision,
        replicas=cand.replicas,
        in_bytes=sig.input_bytes_per_row,
        out_bytes=sig.output_bytes_per_row,
    )


def choose_serving_ipus(spec: WorkloadSpec, *, machine: str, max_batch_size: int) -> int:
    """The fewest IPUs (a power of two) on which a replica serves batches of ``max_batch_size``.

    If no replica of up to ``MAX_SERVING_IPUS`` (or the machine type's largest partition) holds that
    batch, the fewest IPUs holding the largest batch that does fit. Raises the closest
    ``CompileError`` when not even a batch of one fits anywhere.
    """
    most = min(_check_partition(1, machine).max_partition, MAX_SERVING_IPUS)
    best: tuple[int, int] | None = None  # (batch, ipus)
    closest: CompileError | None = None
    ipus = 1
    while ipus <= most:
        try:
            sp = serve_plan(spec, machine=machine, ipus=ipus, max_batch_size=max_batch_size)
        except CompileError as exc:
            if closest is None or (exc.needed_bytes or 0) < (closest.needed_bytes or math.inf):
                closest = exc
            ipus *= 2
            continue
        if sp.max_batch_size >= max_batch_size:
            return ipus
        if best is None or sp.max_batch_size > best[0]:
            best = (sp.max_batch_size, ipus)
        ipus *= 2
    if best is not None:
        return best[1]
    assert closest is not None
    raise closest


def outputs_for(signature: Signature, batch: int, request_digest: bytes) -> list[np.ndarray]:
    """Deterministic answers of the signature's output shapes and types for a request of ``batch``
    rows: the same digest gives the same bytes, in any process. The emulator computes times, never a
    model's values: these are placeholders of the right form (floats standard normal, integers 0-99,
    booleans either), generated in microseconds per kilobyte.

    Each output's generator is a PCG64 whose 128-bit state and increment are set straight from a hash
    of the digest and the output's name. Seeding one through NumPy's ``SeedSequence`` (``PCG64(seed)``)
    cost more than the rest of the answer (docs/performance.md); the values are a function of the
    digest either way, not the same values."""

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    rng = _seeded_rng()
    out: list[np.ndarray] = []
    for t in signature.outputs:
        seed = hashlib.blake2b(request_digest + b"\x00" + t.name.encode(), digest_size=32).digest()
        rng.bit_generator.state = {
            "bit_generator": "PCG64",
            # PCG's increment must be odd.
            "state": {
                "state": int.from_bytes(seed[:16], "little"),
                "inc": int.from_bytes(seed[16:], "little") | 1,
            },
            "has_uint32": 0,
            "uinteger": 0,
        }
        out.append(_fill(rng, t.datatype, t.shape_for(batch)))
    return out


_RNG = threading.local()


def _seeded_rng() -> np.random.Generator:
    """This thread's generator, reseeded by its caller for each output (a generator is not thread-safe)."""
    rng = getattr(_RNG, "rng", None)
    if rng is None:
        import numpy as np

        rng = _RNG.rng = np.random.Generator(np.random.PCG64())
    return rng


def _fill(rng: np.random.Generator, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    import numpy as np

    if datatype in ("FP16", "FP32", "FP64"):
        return rng.standard_normal(shape, dtype=np.float32).astype(numpy_types()[datatype], copy=False)
    if datatype == "BF16":
        bits = rng.standard_normal(shape, dtype=np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16)
    # Integers and booleans from the bit generator's raw 64-bit words: `Generator.integers` costs
    # several times as much for the few values an answer holds (its bounds and size handling).
    if datatype == "BOOL":
        return (rng.bit_generator.random_raw(math.prod(shape)) & 1).astype(np.bool_).reshape(shape)
    if datatype in numpy_types():
        raw = rng.bit_generator.random_raw(math.prod(shape))
        return (raw % 100).astype(numpy_types()[datatype]).reshape(shape)
    raise ValueError(f"unknown datatype {datatype!r}")
