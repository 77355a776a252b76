"""Parity of uploaded ONNX graphs with the catalogue, and the operator coverage table.

Each catalogue workload is rendered as the ONNX graph a framework would export
(``vipu/emulator/onnxgraph/renderings.py``: onnx.helper, no weights), stripped and loaded as an upload
would be, and planned beside the catalogue entry on the same partition; the table gives both throughputs
and memories per IPU and their differences. A second table plans BERT with LayerNorm and GELU written as
primitive operators beside the fused ones. ``--coverage`` prints the operator coverage table of
docs/emulator.md.

    .venv/bin/python benchmarks/onnx_parity.py              # the parity tables (about a minute)
    .venv/bin/python benchmarks/onnx_parity.py --coverage   # the operator coverage table
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vipu.emulator import Plan, WorkloadSpec, plan
from vipu.emulator.onnxgraph import OnnxWorkload, load_graph, strip_bytes
from vipu.emulator.onnxgraph.renderings import render_bytes
from vipu.emulator.onnxgraph.rules import coverage

MACHINE = "bow"
# (model, task, seq_len, global batch, partition sizes): every rendered workload, training and inference,
# on one IPU, a POD16 and a POD64 where the batch covers the replicas.
CASES: tuple[tuple[str, str, int | None, int, tuple[int, ...]], ...] = (
    ("bert-base", "train", 128, 1024, (4, 16, 64)),
    ("bert-base", "infer", 384, 1024, (1, 16, 64)),
    ("bert-large", "train", 128, 1024, (16, 64)),
    ("bert-large", "train", 384, 256, (16, 64)),
    ("bert-large", "infer", 384, 1024, (4, 16, 64)),
    ("resnet50", "train", None, 1920, (1, 16, 64)),
    ("resnet50", "infer", None, 4096, (1, 16, 64)),
    ("resnext101", "train", None, 768, (2, 16, 64)),
    ("efficientnet-b0", "train", None, 4096, (1, 16, 64)),
    ("efficientnet-b4", "train", None, 6144, (2, 16, 64)),
    ("lstm", "train", 128, 4096, (1, 16, 64)),
    ("gru", "infer", 128, 4096, (1, 16, 64)),
    ("deep-autoencoder", "train", None, 4096, (1, 16, 64)),
)
TOLERANCE = 0.10
MB = 2**20


@dataclass(frozen=True)
class Row:
    model: str
    task: str
    seq_len: int | None
    batch: int
    ipus: int
    catalogue: Plan
    onnx: Plan
    onnx_same_layout: Plan
    """The ONNX graph planned with the catalogue plan's layout (IPUs per replica, micro-batch,
    recomputation, optimizer placement): the planner picks by time, and where two layouts run about
    equally fast the two graphs may pick differently, so memory is compared layout for layout."""

    @property
    def throughput_error(self) -> float:
        return self.onnx.throughput / self.catalogue.throughput - 1.0

    @property
    def memory_error(self) -> float:
        return self.onnx_same_layout.memory_per_ipu_bytes / self.catalogue.memory_per_ipu_bytes - 1.0


def onnx_spec(model: str, task: str, seq_len: int | None, batch: int, fused: bool = True) -> WorkloadSpec:
    """The rendering of ``model`` as an upload: stripped, loaded, bound and trained like the catalogue's."""
    catalogue_spec = WorkloadSpec(model=model, task=task, seq_len=seq_len, batch_size=batch)  # type: ignore[arg-type]
    data = strip_bytes(render_bytes(model, task, seq_len, fused)).data  # type: ignore[arg-type]
    graph = load_graph(data)
    source = OnnxWorkload(
        graph, f"{model} (ONNX)", default_dims={d: seq_len for d in graph.dynamic_dims} if seq_len else {}
    )
    optimizer = catalogue_spec.graph().optimizer
    return WorkloadSpec(
        model=f"{model}.onnx",
        task=task,
        seq_len=seq_len,
        batch_size=batch,  # type: ignore[arg-type]
        optimizer=optimizer if optimizer != "none" else None,
        source=source,
    )


def parity_rows() -> list[Row]:
    rows = []
    for model, task, seq, batch, sizes in CASES:
        ours = onnx_spec(model, task, seq, batch)
        theirs = WorkloadSpec(model=model, task=task, seq_len=seq, batch_size=batch)  # type: ignore[arg-type]
        for ipus in sizes:
            c = plan(theirs, ipus, MACHINE)
            same = plan(
                ours,
                ipus,
                MACHINE,
                ipus_per_replica=c.ipus_per_replica,
                micro_batch=c.micro_batch,
                recompute=c.recompute,
                optimizer_offchip=c.optimizer_offchip,
            )
            rows.append(Row(model, task, seq, batch, ipus, c, plan(ours, ipus, MACHINE), same))
    return rows


def fused_rows() -> list[tuple[str, int, Plan, Plan]]:
    out = []
    for model, task, seq, batch, ipus in (
        ("bert-base", "infer", 128, 1024, 4),
        ("bert-base", "train", 128, 1024, 16),
        ("bert-large", "train", 384, 256, 16),
    ):
        fused = plan(onnx_spec(model, task, seq, batch, fused=True), ipus, MACHINE)
        primitive = plan(onnx_spec(model, task, seq, batch, fused=False), ipus, MACHINE)
        out.append((f"{model} {task} seq {seq}", ipus, fused, primitive))
    return out


def _layout(p: Plan) -> str:
    return f"{p.ipus_per_replica}x{p.replicas} mb{p.micro_batch}{' rc' if p.recompute else ''}"


def print_parity() -> int:
    started = time.perf_counter()
    rows = parity_rows()
    print(
        f"Catalogue vs its ONNX rendering on {MACHINE}: items/s of each one's own plan; MB per IPU with the "
        "catalogue plan's layout (PxR micro-batch, rc: recompute)\n"
    )
    print(
        "| workload | task | batch | IPUs | catalogue items/s | ONNX items/s | diff | catalogue MB | ONNX MB "
        "| diff | layout (catalogue / ONNX) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst_t = worst_m = 0.0
    for r in rows:
        name = r.model + (f" seq {r.seq_len}" if r.seq_len else "")
        worst_t = max(worst_t, abs(r.throughput_error))
        worst_m = max(worst_m, abs(r.memory_error))
        c_mb = r.catalogue.memory_per_ipu_bytes / MB
        o_mb = r.onnx_same_layout.memory_per_ipu_bytes / MB
        print(
            f"| {name} | {r.task} | {r.batch:,} | {r.ipus} | {r.catalogue.throughput:,.0f} | "
            f"{r.onnx.throughput:,.0f} | {r.throughput_error:+.1%} | {c_mb:,.0f} | {o_mb:,.0f} | "
            f"{r.memory_error:+.1%} | {_layout(r.catalogue)} / {_layout(r.onnx)} |"
        )
    print(
        f"\nworst throughput difference {worst_t:.1%}, worst memory difference {worst_m:.1%} "
        f"over {len(rows)} plans (tolerance {TOLERANCE:.0%})\n"
    )
    print("Fused LayerNormalization and Gelu vs the same graphs written with primitive operators\n")
    print("| graph | IPUs | fused items/s | primitive items/s | diff | fused MB | primitive MB | diff |")
    print("|---|---|---|---|---|---|---|---|")
    for label, ipus, fused, primitive in fused_rows():
        f_mb, p_mb = fused.memory_per_ipu_bytes / MB, primitive.memory_per_ipu_bytes / MB
        print(
            f"| {label} | {ipus} | {fused.throughput:,.0f} | {primitive.throughput:,.0f} | "
            f"{primitive.throughput / fused.throughput - 1:+.1%} | {f_mb:,.0f} | {p_mb:,.0f} | "
            f"{p_mb / f_mb - 1:+.1%} |"
        )
    print(f"\n({time.perf_counter() - started:.0f} s) Reproduce: .venv/bin/python benchmarks/onnx_parity.py")
    return 0 if worst_t <= TOLERANCE and worst_m <= TOLERANCE else 1


def print_coverage() -> int:
    descriptions = {
        "gemm": "GEMM: m x k x n per group, AMP at matmul efficiency",
        "conv": "convolution as implicit GEMM (dense, grouped; depthwise on the vector path)",
        "recurrent": "one GEMM and the gate arithmetic per time step, in sequence",
        "attention": "QK^T and AV GEMMs per head, softmax on the vector path",
        "gather": "embedding (exchange + vector) when the table is a weight; else a free view",
        "elementwise": "vector path; chains on one tensor fuse into one pass",
        "pool": "vector path, one pass",
        "free": "no time, no memory: views, and anything computed from constants and shapes",
        "data_dependent": "refused unless its inputs are constants (the output size depends on values)",
        "control": "refused: no static plan (export with loops unrolled)",
    }
    print("| role | how it is costed | operators |")
    print("|---|---|---|")
    for role, ops in coverage().items():
        print(f"| {role} | {descriptions[role]} | {', '.join(ops)} |")
    print(
        "\nAny other operator (or another domain, e.g. com.microsoft) is refused by name unless declared "
        "element-wise.\nReproduce: .venv/bin/python benchmarks/onnx_parity.py --coverage"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coverage", action="store_true", help="print the operator coverage table instead")
    args = parser.parse_args()
    return print_coverage() if args.coverage else print_parity()


if __name__ == "__main__":
    raise SystemExit(main())
