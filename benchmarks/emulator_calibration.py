"""Predicted vs published throughput for the emulator's calibration table, and predictions beyond it.

Prints, for every row of the Bow Pod16 table in ``docs/hardware.md``, the emulator's
prediction, the published figure and the error; then what the same model predicts where nothing was
fitted (IPU-M2000, 64 to 256 IPUs, inference, the compile-time anchors). ``--fit`` refits the
constants from scratch first and prints them next to the frozen ones.

Reproduce:  .venv/bin/python benchmarks/emulator_calibration.py [--fit] [--markdown]
"""

from __future__ import annotations

import argparse
import time

from vipu.emulator import EmulatedRun, WorkloadSpec, plan
from vipu.emulator.calibration import (
    BOW_POD16_TABLE,
    fit,
    loss,
    plan_with,
    solve_compile_constants,
)
from vipu.emulator.timing import (
    COMPILE_PER_IPU_S,
    COMPILE_PER_SUPERSTEP_S,
    FITTED,
    Constants,
)

COMMAND = ".venv/bin/python benchmarks/emulator_calibration.py"


def _table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def calibration_rows(c: Constants) -> tuple[list[list[str]], float]:
    rows = []
    worst = 0.0
    for row in BOW_POD16_TABLE:
        p = plan_with(row, c)
        err = 100.0 * (p.throughput / row.published - 1.0)
        worst = max(worst, abs(err))
        rows.append(
            [
                row.label,
                f"{row.global_batch:,}",
                f"{row.published:,.0f}",
                f"{p.throughput:,.0f}",
                f"{err:+.1f}%",
                f"{p.ipus_per_replica}x{p.replicas}",
                f"{p.micro_batch}",
                f"{p.grad_accum}",
                f"{p.memory_per_ipu_bytes / 2**20:,.0f}",
            ]
        )
    return rows, worst


def beyond_rows() -> list[list[str]]:
    """Predictions the model was never fitted to: other machines, sizes and modes."""
    cases = [
        ("resnet50", "train", 1920, None, [16, 64, 128, 256]),
        ("bert-large", "train", 65_536, 128, [16, 64, 128, 256]),
        ("bert-large", "train", 256, 384, [16, 64]),
        ("efficientnet-b4", "train", 6144, None, [16, 64]),
        ("resnext101", "train", 768, None, [16, 64]),
        ("bert-base", "train", 65_536, 128, [16, 64]),
        ("resnet50", "infer", 4096, None, [16]),
        ("bert-large", "infer", 4096, 384, [16]),
        ("efficientnet-b0", "train", 4096, None, [16]),
        ("lstm", "train", 4096, 128, [16]),
        ("gru", "infer", 4096, 128, [16]),
        ("deep-autoencoder", "train", 4096, None, [16]),
        ("mcmc", "infer", 16_384, None, [16]),
    ]
    rows = []
    for model, task, batch, seq, sizes in cases:
        spec = WorkloadSpec(model=model, task=task, batch_size=batch, seq_len=seq)
        for ipus in sizes:
            bow = plan(spec, ipus, "bow")
            m2000 = plan(spec, ipus, "m2000")
            rows.append(
                [
                    f"{model}{'' if seq is None else f' seq {seq}'}",
                    task,
                    f"{batch:,}",
                    f"{ipus}",
                    f"{m2000.throughput:,.0f}",
                    f"{bow.throughput:,.0f}",
                    f"{bow.throughput / m2000.throughput:.2f}",
                    f"{bow.ipus_per_replica}x{bow.replicas}",
                    f"{bow.timing.allreduce_s * 1e3:.1f}",
                ]
            )
    return rows


def compile_rows() -> list[list[str]]:
    rows = []
    for model, ipus, published in (("bert-base", 4, "about 8 min"), ("bert-large", 64, "8 to 11 min")):
        p = plan(WorkloadSpec(model=model, batch_size=65_536), ipus, "bow")
        run = EmulatedRun(p, cached=False)
        rows.append(
            [
                f"{model} train seq 128, {ipus} IPUs",
                published,
                f"{run.compile_s / 60:.1f} min",
                f"{run.load_s:.0f} s",
            ]
        )
    for model, ipus in (("resnet50", 16), ("lstm", 1), ("efficientnet-b4", 16)):
        run = EmulatedRun(plan(WorkloadSpec(model=model), ipus, "bow"), cached=False)
        rows.append(
            [f"{model} train, {ipus} IPUs", "-", f"{run.compile_s / 60:.1f} min", f"{run.load_s:.0f} s"]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants before printing")
    parser.add_argument("--markdown", action="store_true", help="markdown tables, as in docs/emulator.md")
    args = parser.parse_args()

    c = FITTED
    if args.fit:
        t0 = time.perf_counter()
        refit = fit(FITTED)
        a, b = solve_compile_constants(refit)
        print(f"refit in {time.perf_counter() - t0:.0f} s: {refit} (loss {loss(refit):.4f})")
        print(f"frozen:          {FITTED} (loss {loss(FITTED):.4f})")
        print(
            f"compile: {a:.3f} s per superstep instance, {b:.1f} s per IPU per replica "
            f"(frozen: {COMPILE_PER_SUPERSTEP_S}, {COMPILE_PER_IPU_S})\n"
        )
        c = refit

    rows, worst = calibration_rows(c)
    print("Calibration: Bow Pod16 (16 Bow IPUs), FP16, training, items/s at the published global batch")
    print(
        _table(
            [
                "workload",
                "global batch",
                "published",
                "predicted",
                "error",
                "PxR",
                "micro-batch",
                "grad accum",
                "MB/IPU",
            ],
            rows,
            args.markdown,
        )
    )
    print(f"\nworst error {worst:.1f}% (the tests require <= 15%)\n")
    print("Beyond the table (nothing here was fitted): items/s, M2000 vs Bow, all-reduce ms per step on Bow")
    print(
        _table(
            ["workload", "task", "batch", "IPUs", "M2000", "Bow", "Bow/M2000", "PxR (Bow)", "all-reduce ms"],
            beyond_rows(),
            args.markdown,
        )
    )
    print("\nCompile and load time (cluster time)")
    print(_table(["graph", "reference", "predicted compile", "load"], compile_rows(), args.markdown))
    print(f"\nreproduce: {COMMAND}{' --fit' if args.fit else ''}{' --markdown' if args.markdown else ''}")


if __name__ == "__main__":
    main()
