"""Offline tools: `estimate` (the emulator's dry run)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

out = Console()
err = Console(stderr=True)


def estimate(
    model: Annotated[str, typer.Option(help="Catalogue workload, e.g. bert-large.")],
    ipus: Annotated[str, typer.Option(help="Partition size (a power of two) or `auto`.")] = "auto",
    machine: Annotated[str, typer.Option(help="m2000 or bow.")] = "m2000",
    task: Annotated[str, typer.Option(help="train or infer.")] = "train",
    batch_size: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length (BERT, LSTM, GRU).")] = None,
    precision: Annotated[str, typer.Option(help="fp16 or fp32.")] = "fp16",
    samples: Annotated[int | None, typer.Option(help="Samples to process.")] = None,
    steps: Annotated[int | None, typer.Option(help="Steps to run.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Plan a workload on a partition: fit, memory per IPU, compile time, throughput, time and IPU-hours."""
    from pydantic import ValidationError

    from scheduler.errors import DomainError
    from scheduler.jobspec import WorkloadRequest
    from scheduler.services.estimates import estimate as run_estimate

    if machine not in ("m2000", "bow"):
        err.print("[red]--machine must be m2000 or bow[/]")
        raise typer.Exit(2)
    size: int | Literal["auto"]
    if ipus == "auto":
        size = "auto"
    elif ipus.isdigit():
        size = int(ipus)
    else:
        err.print("[red]--ipus must be a power of two or `auto`[/]")
        raise typer.Exit(2)
    try:
        req = WorkloadRequest(
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,  # type: ignore[arg-type]
            precision=precision,
            samples=samples,
            steps=steps,
        )  # type: ignore[arg-type]
        result = run_estimate(session=None, workload=req, ipus=size, machine=machine)
    except ValidationError as exc:
        err.print(f"[red]{exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}[/]")
        raise typer.Exit(2)
    except DomainError as exc:
        err.print(f"[red]{exc.detail}[/]")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        raise typer.Exit(0 if result.get("fits") else 1)
    if not result.get("fits"):
        err.print(f"[red]Does not fit:[/] {result.get('error')}")
        raise typer.Exit(1)
    plan = result.get("plan") or {}
    table = Table(
        title=f"{model} ({task}, {precision}) on {plan.get('ipus', ipus)} x {machine}", show_header=False
    )
    rows = [
        ("IPUs per replica x replicas", f"{plan.get('ipus_per_replica')} x {plan.get('replicas')}"),
        ("micro-batch / grad. accumulation", f"{plan.get('micro_batch')} / {plan.get('grad_accum')}"),
        ("global batch", str(plan.get("global_batch"))),
        ("optimizer state off-chip", str(plan.get("optimizer_offchip"))),
        ("memory per IPU", f"{result.get('memory_per_ipu_bytes', 0) / 1e6:,.1f} MB of 900 MB"),
        ("compile time", f"{result['compile_s']:,.1f} s"),
        ("step time", f"{result['step_s'] * 1000:,.2f} ms"),
        ("throughput", f"{result['throughput']:,.1f} samples/s"),
        ("total time", f"{result['total_s']:,.1f} s"),
        ("IPU-hours", f"{result['ipu_hours']:,.4f}"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command()(estimate)
