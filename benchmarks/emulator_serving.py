"""Serving latency and throughput against batch size: ResNet-50, BERT-Base (sequence 128) and the LSTM
(a 128-step window), FP16, on one serving replica (vipu/emulator/serving.py).

Prints, as Markdown tables: every batch 1 to 64 (powers of two) on one IPU of an IPU-M2000 with the
latency's parts; then batch 1, 8 and 64 on each machine type, on the fewest IPUs whose replica holds a
batch of 64 (`choose_serving_ipus`). Writes two log-log charts of the one-IPU M2000 curves to
docs/img/emulator-serving-latency.svg and docs/img/emulator-serving-throughput.svg.

Reproduce:  .venv/bin/python benchmarks/emulator_serving.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.simulator.svg import loglog_chart  # noqa: E402
from vipu.emulator import WorkloadSpec, choose_serving_ipus, serve_plan  # noqa: E402
from vipu.machine_types import MACHINE_TYPE_NAMES  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/emulator_serving.py"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
MODELS = {
    "ResNet-50": WorkloadSpec(model="resnet50", task="infer"),
    "BERT-Base seq 128": WorkloadSpec(model="bert-base", task="infer", seq_len=128),
    "LSTM seq 128": WorkloadSpec(model="lstm", task="infer", seq_len=128),
}


def one_ipu_table() -> tuple[list[str], dict[str, list[tuple[int, float, float]]]]:
    lines = [
        "| model | batch | latency ms | host call ms | host ms | device ms | step ms | samples/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    curves: dict[str, list[tuple[int, float, float]]] = {}
    for label, spec in MODELS.items():
        sp = serve_plan(spec, machine="m2000", ipus=1, max_batch_size=max(BATCHES))
        points = []
        for b in BATCHES:
            if b > sp.max_batch_size:
                lines.append(f"| {label} | {b} | does not fit (largest {sp.max_batch_size}) | | | | | |")
                continue
            t = sp.times(b)
            lines.append(
                f"| {label} | {b} | {t.latency_s * 1e3:.3f} | {t.host_call_s * 1e3:.3f} | "
                f"{t.host_s * 1e3:.3f} | {t.device_s * 1e3:.3f} | {t.step_s * 1e3:.3f} | "
                f"{b / t.step_s:,.0f} |"
            )
            points.append((b, t.latency_s * 1e3, b / t.step_s))
        curves[label] = points
    return lines, curves


def machines_table() -> list[str]:
    lines = [
        "| model | machine | replica IPUs (stages x copies) | batch 1 ms | batch 8 ms | batch 64 ms | "
        "samples/s at 64 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, spec in MODELS.items():
        for machine in MACHINE_TYPE_NAMES:
            ipus = choose_serving_ipus(spec, machine=machine, max_batch_size=64)
            sp = serve_plan(spec, machine=machine, ipus=ipus, max_batch_size=64)
            cells = [f"{sp.latency_s(b) * 1e3:.3f}" if b <= sp.max_batch_size else "-" for b in (1, 8, 64)]
            top = f"{sp.throughput(64):,.0f}" if sp.max_batch_size >= 64 else "-"
            lines.append(
                f"| {label} | {machine} | {ipus} ({sp.pipeline_stages} x {sp.replicas}) | "
                + " | ".join(cells)
                + f" | {top} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the SVGs go")
    args = parser.parse_args()
    lines, curves = one_ipu_table()
    print(f"One IPU of an IPU-M2000, FP16 ({COMMAND}):\n")
    print("\n".join(lines))
    print("\nBatch 1, 8 and 64 on the fewest IPUs that hold a batch of 64, each machine type:\n")
    print("\n".join(machines_table()))
    args.out.mkdir(parents=True, exist_ok=True)
    latency = loglog_chart(
        {label: [(b, ms) for b, ms, _ in points] for label, points in curves.items()},
        title="Serving latency on one IPU-M2000 IPU (emulated, FP16)",
        x_label="batch size (requests per host call)",
        y_label="latency of a request, ms",
    )
    throughput = loglog_chart(
        {label: [(b, rate) for b, _, rate in points] for label, points in curves.items()},
        title="Serving throughput of one IPU-M2000 IPU (emulated, FP16)",
        x_label="batch size (requests per host call)",
        y_label="samples/s at saturation",
    )
    for name, svg in (("latency", latency), ("throughput", throughput)):
        path = args.out / f"emulator-serving-{name}.svg"
        path.write_text(svg)
        print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


if __name__ == "__main__":
    main()
