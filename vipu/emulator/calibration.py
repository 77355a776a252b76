"""The published Bow Pod16 training table the efficiencies are fitted to, and the fit itself.

The table is ``docs/hardware.md``: Bow Pod16 (16 Bow IPUs), FP16, items per second at the
stated global batch. The fit minimises the sum of squared log errors over all seven rows at once, with
a Nelder-Mead search over the logarithms of three constants of ``timing.Constants`` (the fourth, the
vector efficiency, is not identifiable from the table; see ``fit``); the result is frozen in
``timing.FITTED``. The compile-time coefficients are solved from the reference's two compile figures.
``benchmarks/emulator_calibration.py --fit`` reruns both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vipu.emulator.errors import CompileError
from vipu.emulator.graph import Precision, Task
from vipu.emulator.memory import superstep_instances
from vipu.emulator.planner import Plan, _Overrides, _plan
from vipu.emulator.spec import WorkloadSpec
from vipu.emulator.timing import COMPILE_FIXED_S, COMPILE_PER_REPLICA_DOUBLING_S, Constants


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    label: str
    model: str
    seq_len: int | None
    global_batch: int
    published: float
    task: Task = "train"
    precision: Precision = "fp16"
    ipus: int = 16
    machine: str = "bow"

    def spec(self) -> WorkloadSpec:
        return WorkloadSpec(
            model=self.model,
            task=self.task,
            batch_size=self.global_batch,
            seq_len=self.seq_len,
            precision=self.precision,
        )


BOW_POD16_TABLE: tuple[CalibrationRow, ...] = (
    CalibrationRow("ResNet-50 v1.5", "resnet50", None, 1920, 42_029),
    CalibrationRow("EfficientNet-B4", "efficientnet-b4", None, 6144, 8_936),
    CalibrationRow("ResNeXt-101", "resnext101", None, 768, 12_221),
    CalibrationRow("BERT-Large pre-training phase 1, seq 128", "bert-large", 128, 65_536, 5_179),
    CalibrationRow("BERT-Large pre-training phase 2, seq 512", "bert-large", 512, 9_600, 2_126),
    CalibrationRow("BERT-Base pre-training phase 1, seq 128", "bert-base", 128, 65_536, 16_391),
    CalibrationRow("BERT-Large SQuAD fine-tuning, seq 384", "bert-large", 384, 256, 1_183),
)


def plan_with(row: CalibrationRow, c: Constants) -> Plan:
    """Plan a calibration row with the given constants (the planner's choices depend on them too)."""
    spec = row.spec()
    pods = max(1, math.ceil(row.ipus / 64))
    return _plan(spec, row.ipus, row.machine, pods, pods > 1, _Overrides(None, None, None, None), c)


def predicted(row: CalibrationRow, c: Constants) -> float:
    return plan_with(row, c).throughput


def loss(c: Constants, rows: Sequence[CalibrationRow] = BOW_POD16_TABLE) -> float:
    total = 0.0
    for row in rows:
        try:
            err = math.log(predicted(row, c) / row.published)
        except CompileError:
            err = 10.0
        total += err * err
    return total


def _nelder_mead(
    f: Callable[[list[float]], float],
    x0: list[float],
    step: float = 0.3,
    iterations: int = 300,
    tol: float = 1e-7,
) -> list[float]:
    n = len(x0)
    simplex = [list(x0)]
    for i in range(n):
        x = list(x0)
        x[i] += step
        simplex.append(x)
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=lambda k: values[k])
        simplex = [simplex[k] for k in order]
        values = [values[k] for k in order]
        if values[-1] - values[0] < tol:
            break
        centroid = [sum(x[i] for x in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]
        reflected = [centroid[i] + (centroid[i] - worst[i]) for i in range(n)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [centroid[i] + 2.0 * (centroid[i] - worst[i]) for i in range(n)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [centroid[i] + 0.5 * (worst[i] - centroid[i]) for i in range(n)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[best[i] + 0.5 * (x[i] - best[i]) for i in range(n)] for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda k: values[k])]


def fit(start: Constants, rows: Sequence[CalibrationRow] = BOW_POD16_TABLE) -> Constants:
    """Fit matmul efficiency, conv efficiency and superstep cycles to ``rows`` (least squares on log
    throughput, efficiencies kept in (0, 1]).

    The vector efficiency is held at ``start``'s value: the table cannot separate the cost of
    element-wise work from the superstep overhead, since the element-wise ops are also what adds the
    supersteps, so fitting both only trades one against the other.
    """

    def unpack(x: list[float]) -> Constants:
        return Constants(
            matmul_efficiency=min(1.0, math.exp(x[0])),
            conv_efficiency=min(1.0, math.exp(x[1])),
            vector_efficiency=start.vector_efficiency,
            superstep_cycles=math.exp(x[2]),
        )

    x0 = [math.log(v) for v in (start.matmul_efficiency, start.conv_efficiency, start.superstep_cycles)]
    c = unpack(_nelder_mead(lambda x: loss(unpack(x), rows), x0))
    # Three significant figures: the fit is not more precise than that, and it keeps them readable.
    return Constants(
        matmul_efficiency=float(f"{c.matmul_efficiency:.3g}"),
        conv_efficiency=float(f"{c.conv_efficiency:.3g}"),
        vector_efficiency=c.vector_efficiency,
        superstep_cycles=float(f"{c.superstep_cycles:.3g}"),
    )


# The reference's compile-time figures: BERT-Base on 4 IPUs about 8 minutes, BERT-Large on 64 IPUs 8 to
# 11 minutes (we take the middle, 9.5). Both are pre-training at sequence length 128.
COMPILE_ANCHORS: tuple[tuple[str, int, float], ...] = (
    ("bert-base", 4, 8.0 * 60),
    ("bert-large", 64, 9.5 * 60),
)


def solve_compile_constants(c: Constants) -> tuple[float, float]:
    """The per-superstep and per-IPU compile coefficients that put both anchors exactly on their figures.

    compile_s = fixed + a x superstep instances of the largest IPU + b x IPUs per replica
                + per-doubling x log2(replicas); two anchors, two unknowns (a, b).
    """
    rows = []
    for model, ipus, target in COMPILE_ANCHORS:
        row = CalibrationRow(model, model, 128, 65_536, 0.0, ipus=ipus)
        p = plan_with(row, c)
        graph = row.spec().workload.graph("train", 128)
        stages = [graph.layers[s.first_layer : s.last_layer + 1] for s in p.stages]
        instances = max(superstep_instances(st, True, p.recompute) for st in stages)
        rest = target - COMPILE_FIXED_S - COMPILE_PER_REPLICA_DOUBLING_S * math.log2(p.replicas)
        rows.append((float(instances), float(p.ipus_per_replica), rest))
    (a1, b1, r1), (a2, b2, r2) = rows
    det = a1 * b2 - a2 * b1
    return (r1 * b2 - r2 * b1) / det, (a1 * r2 - a2 * r1) / det
