"""Throughput against partition size, 1 to 1,024 IPUs, for every catalogue workload on every machine type.

Each workload runs its catalogue default (training, or inference for `mcmc`) at a fixed global batch,
so the curves are strong scaling: the planner lays the same batch out on more IPUs. A C2 server holds
16 IPUs and nothing joins servers, so `c2` curves end at 16. A point is missing where the workload
cannot run at all (out of In-Processor-Memory, or fewer samples than replicas).

Prints the table of throughputs, the ResNet-50 scale-out check at the published global batch of 1,920
(128 against 256 IPUs, with the step's parts and the GW-Link term recomputed from docs/hardware.md's
link figures), and writes one log-log chart per type to docs/img/emulator-scaling-<type>.svg.

Reproduce:  .venv/bin/python benchmarks/emulator_scaling.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.simulator.svg import loglog_chart  # noqa: E402
from vipu.emulator import CompileError, WorkloadSpec, catalogue, plan  # noqa: E402
from vipu.machine_types import GBIT, MACHINES  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/emulator_scaling.py"
SIZES = tuple(2**i for i in range(11))  # 1 .. 1,024


def spec_of(name: str, tasks: tuple[str, ...]) -> WorkloadSpec:
    return WorkloadSpec(model=name, task="train" if "train" in tasks else "infer")


def curves() -> dict[str, dict[str, list[tuple[int, float | None, str]]]]:
    """type -> workload -> [(IPUs, samples/s or None, plan summary or why not)]."""
    out: dict[str, dict[str, list[tuple[int, float | None, str]]]] = {}
    for kind, machine in MACHINES.items():
        by_workload: dict[str, list[tuple[int, float | None, str]]] = {}
        for workload in catalogue():
            spec = spec_of(workload.name, workload.tasks)
            points: list[tuple[int, float | None, str]] = []
            for ipus in SIZES:
                if ipus > machine.max_partition:
                    break
                try:
                    p = plan(spec, ipus, kind.value)
                except CompileError as exc:
                    points.append((ipus, None, "OOM" if exc.needed_bytes else "batch"))
                    continue
                points.append((ipus, p.throughput, f"{p.ipus_per_replica}x{p.replicas}"))
            by_workload[f"{workload.name} ({spec.task}, batch {spec.global_batch:,})"] = points
        out[kind.value] = by_workload
    return out


def resnet50_check() -> list[str]:
    spec = WorkloadSpec(model="resnet50", task="train", batch_size=1920)
    m = MACHINES["m2000"]  # type: ignore[index]
    lines = ["ResNet-50 training, global batch 1,920, IPU-M2000 (strong scaling past one POD64):"]
    lines.append(
        "  IPUs  PxR     micro-batch  accum  samples/s  step ms  slot ms  fill ms  "
        "all-reduce ms (IPU-Link / GW-Link)"
    )
    for ipus in (64, 128, 256, 512, 1024):
        p = plan(spec, ipus, "m2000")
        t = p.timing
        lines.append(
            f"  {ipus:>4}  {p.ipus_per_replica}x{p.replicas:<5} {p.micro_batch:>11}  {p.grad_accum:>5}  "
            f"{p.throughput:>9,.0f}  {t.step_s * 1e3:>7.2f}  {t.slot_s * 1e3:>7.2f}  "
            f"{t.pipeline_fill_drain_s * 1e3:>7.2f}  {t.allreduce_s * 1e3:>5.2f} "
            f"({t.allreduce_ipu_link_s * 1e3:.2f} / {t.allreduce_gw_link_s * 1e3:.2f})"
        )
    # The GW-Link term at 128 IPUs (2 POD64s, 128 replicas) from the published link figures alone.
    grads = 25.56e6 * 2  # ResNet-50's 25.6 M parameters in FP16
    per_ipu = 2 * 100 * GBIT / 4  # 2 x 100 Gbit/s GW-Links per machine, shared by its 4 IPUs
    shard = grads / 64  # after the in-POD reduce-scatter over 64 replicas
    by_hand = 2 * (2 - 1) / 2 * shard / per_ipu + 2 * (2 - 1) * 10e-6
    model = plan(spec, 128, "m2000").timing.allreduce_gw_link_s
    lines.append(
        f"  GW-Link term at 128 IPUs: {model * 1e3:.3f} ms in the model, {by_hand * 1e3:.3f} ms by hand from "
        f"2 x 100 Gbit/s per machine / 4 IPUs = {per_ipu / 1e9:.2f} GB/s per IPU"
    )
    ring = 2 * 63 / 64 * grads / (m.ipu_link_bytes_per_s_per_ipu / 2) + 2 * 63 * 1e-6
    lines.append(
        f"  IPU-Link ring over 64 replicas: {ring * 1e3:.3f} ms by hand from 320 GB/s per IPU, half each way"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the charts go")
    args = parser.parse_args()
    data = curves()
    for kind, by_workload in data.items():
        print(f"\n{kind}: samples/s by IPUs (- : cannot run; OOM or fewer samples than replicas)")
        sizes = [s for s in SIZES if s <= MACHINES[kind].max_partition]  # type: ignore[index]
        print(f"  {'workload':<48}" + "".join(f"{s:>11,}" for s in sizes))
        for name, points in by_workload.items():
            cells = {ipus: value for ipus, value, _ in points}
            row = "".join(f"{cells[s]:>11,.0f}" if cells.get(s) is not None else f"{'-':>11}" for s in sizes)
            print(f"  {name:<48}{row}")
        series = {
            name.split(" (")[0]: [(float(ipus), value) for ipus, value, _ in points if value is not None]
            for name, points in by_workload.items()
        }
        machine = MACHINES[kind]  # type: ignore[index]
        chart = loglog_chart(
            series,
            title=f"Throughput vs IPUs, {kind} ({machine.product}, {machine.chip.split(' (')[0]})",
            x_label="IPUs in the partition",
            y_label="samples per second (log)",
        )
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"emulator-scaling-{kind}.svg"
        path.write_text(chart)
        print(f"  wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    print()
    print("\n".join(resnet50_check()))
    print(f"\nreproduce: {COMMAND}")


if __name__ == "__main__":
    main()
