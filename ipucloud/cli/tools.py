"""Offline tools: `estimate` (the emulator's dry run) and `simulate` (replay a trace through the policies)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from ipucloud.cli.figures import charged_line
from ipucloud.exit_codes import Exit
from vipu.machine_types import MACHINE_TYPE_NAMES, get_machine

out = Console()
err = Console(stderr=True)
# Option help from the machine-type registry (vipu/machine_types.py), so a new type needs no edit here.
TYPES = ", ".join(MACHINE_TYPE_NAMES)
POD_TYPES = ", ".join(t for t in MACHINE_TYPE_NAMES if "pod64" in get_machine(t).layouts)


def estimate(
    model: Annotated[
        str | None, typer.Option(help="Catalogue workload, e.g. bert-large (or use --model-file).")
    ] = None,
    model_file: Annotated[
        Path | None,
        typer.Option("--model-file", help="Plan this ONNX file on this machine, without uploading it."),
    ] = None,
    ipus: Annotated[str, typer.Option(help="Partition size (a power of two) or `auto`.")] = "auto",
    machine: Annotated[
        str,
        typer.Option(help=f"{TYPES}; `any` estimates every type and shows the fastest."),
    ] = "m2000",
    prefer: Annotated[
        str,
        typer.Option(help="With machine any: time (where it finishes first) or cost (least grant spent)."),
    ] = "time",
    task: Annotated[str, typer.Option(help="train or infer.")] = "train",
    batch_size: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(help="Sequence length (BERT, LSTM, GRU; a model file's sequence dimensions)."),
    ] = None,
    dim: Annotated[
        list[str] | None,
        typer.Option("--dim", help="NAME=SIZE of a model file's dynamic dimension (repeat)."),
    ] = None,
    elementwise: Annotated[
        list[str] | None,
        typer.Option(
            "--elementwise", help="A model file's unknown operator that acts element-wise (repeat)."
        ),
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(help="A model file's optimizer: sgd, sgd-momentum, adam (default), lamb, rmsprop."),
    ] = None,
    precision: Annotated[str, typer.Option(help="fp16 or fp32.")] = "fp16",
    samples: Annotated[int | None, typer.Option(help="Samples to process.")] = None,
    steps: Annotated[int | None, typer.Option(help="Steps to run.")] = None,
    serve: Annotated[
        str | None,
        typer.Option(
            help="Inference: batch sizes to time one serving replica at, e.g. 1,2,4,8 (latency and "
            "throughput per batch; the replica is --ipus IPUs, or with auto the fewest that hold "
            "the largest)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Plan a workload on a partition: fit, memory per IPU, compile time, throughput, time and IPU-hours.

    With --model-file, plan an ONNX file here (its weights are never read) before pushing it. With
    --serve, also the latency and throughput of serving it one batch per request batch."""
    from pydantic import ValidationError

    from ipucloud.cli.client_models import parse_dims
    from scheduler.errors import DomainError
    from scheduler.jobspec import WorkloadRequest
    from scheduler.services.batch.estimates import estimate as run_estimate

    if machine not in (*MACHINE_TYPE_NAMES, "any"):
        err.print(f"[red]--machine must be one of {', '.join(MACHINE_TYPE_NAMES)} or any[/]")
        raise typer.Exit(2)
    if prefer not in ("time", "cost"):
        err.print("[red]--prefer must be time or cost[/]")
        raise typer.Exit(Exit.USAGE)
    if (model is None) == (model_file is None):
        err.print("[red]give --model (a catalogue workload) or --model-file (an ONNX file)[/]")
        raise typer.Exit(2)
    size: int | Literal["auto"]
    if ipus == "auto":
        size = "auto"
    elif ipus.isascii() and ipus.isdigit():
        size = int(ipus)
    else:
        err.print("[red]--ipus must be a power of two or `auto`[/]")
        raise typer.Exit(2)
    batch_sizes = _batch_sizes(serve) if serve is not None else None
    dims = parse_dims(dim) if dim else None
    source = None
    if model_file is not None:
        source = _local_model(model_file, dims, elementwise or [], seq_len)
        model = source.label
    try:
        req = WorkloadRequest(
            model=model,  # type: ignore[arg-type]
            task=task,  # type: ignore[arg-type]
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,  # type: ignore[arg-type]
            samples=samples,
            steps=steps,
            dims=dims if model_file is None else None,
            optimizer=optimizer,  # type: ignore[arg-type]
        )
        # Read as a mapping of any values: the figures printed below are all there when it fits.
        result: Mapping[str, Any] = run_estimate(
            session=None,
            workload=req,
            ipus=size,
            machine=machine,
            source=source,
            serve=batch_sizes,
            prefer=prefer,
        )
    except ValidationError as exc:
        err.print(f"[red]{exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}[/]")
        raise typer.Exit(2)
    except DomainError as exc:
        # Does not fit, or an invalid workload: the code `jobs submit --dry-run` gives for the same.
        err.print(f"[red]{exc.detail}[/]")
        raise typer.Exit(Exit.DOES_NOT_FIT)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        raise typer.Exit(Exit.OK if result.get("fits") else Exit.DOES_NOT_FIT)
    if not result.get("fits"):
        err.print(f"[red]Does not fit:[/] {result.get('error')}")
        raise typer.Exit(Exit.DOES_NOT_FIT)
    plan = result.get("plan") or {}
    machine = str(result.get("machine") or machine)
    sram = get_machine(machine).sram_label
    table = Table(
        title=f"{model} ({task}, {precision}) on {plan.get('ipus', ipus)} x {machine}", show_header=False
    )
    rows = [
        ("IPUs per replica x replicas", f"{plan.get('ipus_per_replica')} x {plan.get('replicas')}"),
        ("micro-batch / grad. accumulation", f"{plan.get('micro_batch')} / {plan.get('grad_accum')}"),
        ("global batch", str(plan.get("global_batch"))),
        ("optimizer state off-chip", str(plan.get("optimizer_offchip"))),
        ("memory per IPU", f"{result.get('memory_per_ipu_bytes', 0) / 2**20:,.1f} MB of {sram}"),
        ("compile time", f"{result['compile_s']:,.1f} s"),
        ("step time", f"{result['step_s'] * 1000:,.2f} ms"),
        ("throughput", f"{result['throughput']:,.1f} samples/s"),
        ("total time", f"{result['total_s']:,.1f} s"),
        (
            "charged",
            charged_line(result.get("charged_ipu_hours"), result["ipu_hours"], machine, result.get("rate"))
            or "",
        ),
    ]
    for k, v in rows:
        table.add_row(k, v)
    out.print(table)
    if result.get("serve") is not None:
        _print_serve(result)


def _batch_sizes(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        err.print("[red]--serve takes batch sizes separated by commas, e.g. 1,2,4,8[/]")
        raise typer.Exit(2)
    return [int(p) for p in parts]


def _print_serve(result: Mapping[str, Any]) -> None:
    served = result.get("serve_plan") or {}
    title = "Serving"
    if served:
        title = (
            f"Serving on a replica of {served['ipus']} x {served['machine']} IPU(s) "
            f"({served['pipeline_stages']} stage(s) x {served['replicas']}; largest batch "
            f"{served['max_batch_size']}; host call {served['host_call_s'] * 1e6:,.0f} us)"
        )
    table = Table(title=title)
    for name in ("batch", "latency ms", "samples/s", "call ms", "host ms", "device ms", "step ms"):
        table.add_column(name, justify="right")
    for row in result["serve"]:
        if not row["fits"]:
            table.add_row(str(row["batch_size"]), "does not fit", "", "", "", "", "")
            continue
        table.add_row(
            str(row["batch_size"]),
            f"{row['latency_ms']:,.3f}",
            f"{row['throughput']:,.0f}",
            f"{row['host_call_ms']:,.3f}",
            f"{row['host_ms']:,.3f}",
            f"{row['device_ms']:,.3f}",
            f"{row['step_ms']:,.3f}",
        )
    out.print(table)
    for row in result["serve"]:
        if not row["fits"]:
            err.print(f"batch {row['batch_size']}: {row['error']}")
            break


def _local_model(path: Path, dims: dict[str, int] | None, elementwise: list[str], seq_len: int | None) -> Any:
    """An ONNX file on this machine as a workload source: stripped (weights skipped), checked, loaded."""
    from vipu.emulator.onnxgraph import (
        GraphError,
        GraphTooLarge,
        OnnxWorkload,
        StripError,
        load_graph,
        strip_file,
    )

    if not path.is_file():
        err.print(f"[red]{path}: no such file[/]")
        raise typer.Exit(2)
    try:
        graph = load_graph(strip_file(path).data, tuple(elementwise))
    except (StripError, GraphTooLarge, GraphError) as exc:
        err.print(f"[red]{path}: {exc}[/]")
        raise typer.Exit(2)
    unbound = [d for d in graph.dynamic_dims if d not in (dims or {})]
    if unbound and seq_len is None:
        err.print(
            f"[red]{path}: dynamic dimension(s) {', '.join(unbound)} need a size: give --seq-len or "
            f"--dim NAME=SIZE[/]"
        )
        raise typer.Exit(2)
    return OnnxWorkload(graph, path.stem or "model", default_dims=dims)


def simulate(
    trace: Annotated[Path, typer.Option(help="Trace CSV (Philly's columns unless mapped below).")],
    pods: Annotated[int, typer.Option(min=1, max=1024, help="POD64s in the simulated fleet.")] = 8,
    machine: Annotated[str, typer.Option(help=f"Machine type of the POD64s: {POD_TYPES}.")] = "m2000",
    fleet: Annotated[
        str | None,
        typer.Option(
            help="A fleet of several types instead of --pods x --machine, e.g. 4xm2000,2xbow,32xdss8440: "
            "each job may run on any type and the policy picks (type-blind: the first with room)."
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="Scheduling policy; repeat for several side by side. Default: the three baselines and the "
            "two research anchors (tiresias, srtf-oracle)."
        ),
    ] = None,
    estimates: Annotated[
        str, typer.Option(help="What policies know of run times: predicted, perfect, user or none.")
    ] = "predicted",
    seed: Annotated[int, typer.Option(help="Seed of the estimate models (same seed, same numbers).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object keyed by policy.")] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write per-job CSV, summary JSON and SVG plots here.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Replay only this many jobs (in time order).")
    ] = None,
    skip: Annotated[int, typer.Option(min=0, help="Skip this many jobs first (in time order).")] = 0,
    prediction_error: Annotated[
        float, typer.Option(min=0.0, help="Sigma of the log-normal error of `predicted` estimates.")
    ] = 0.3,
    max_runtime: Annotated[
        float | None, typer.Option(help="Queue time limit in seconds (default: longest job, in whole days).")
    ] = None,
    submit_column: Annotated[str, typer.Option(help="Column with submission times.")] = "timestamp",
    duration_column: Annotated[str, typer.Option(help="Column with run times in seconds.")] = "duration",
    size_column: Annotated[str, typer.Option(help="Column with accelerators requested.")] = "num_gpus",
    tenant_column: Annotated[str, typer.Option(help="Column naming the tenant.")] = "cluster",
    workers: Annotated[
        int, typer.Option(min=0, help="Policies replayed in parallel processes (0: one per CPU).")
    ] = 0,
    preemptible_fraction: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of the jobs submitted preemptible (drawn from --seed): any job that is not may "
            "preempt them; reports the work each preemption lost (docs/checkpoints.md).",
        ),
    ] = 0.0,
    checkpoint_every: Annotated[
        float, typer.Option(min=1.0, help="Seconds between a preemptible job's checkpoints.")
    ] = 600.0,
    preemption_warning: Annotated[
        float, typer.Option(min=0.0, help="Seconds of warning a preempted job gets (0: none).")
    ] = 30.0,
    estimate_every: Annotated[
        int,
        typer.Option(
            min=0,
            help="At every n-th submission, forecast the job's start as POST /estimates does and report "
            "the error against its real start (estimate_error); 0: none. Each forecast costs passes.",
        ),
    ] = 0,
) -> None:
    """Replay a job trace on a simulated fleet through the scheduler's policies, side by side."""
    import os

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from scheduler.policy import BASELINES, POLICIES, REFERENCES
    from scheduler.simulator import (
        ESTIMATE_MODELS,
        Columns,
        ReplaySpec,
        TraceError,
        replay,
        report,
        write_outputs,
    )

    names = tuple(policy) if policy else (*BASELINES, *REFERENCES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        err.print(f"[red]unknown policy {', '.join(unknown)}; available: {', '.join(POLICIES)}[/]")
        raise typer.Exit(2)
    if estimates not in ESTIMATE_MODELS:
        err.print(f"[red]--estimates must be one of {', '.join(ESTIMATE_MODELS)}[/]")
        raise typer.Exit(2)
    pod_types = [t for t in MACHINE_TYPE_NAMES if "pod64" in get_machine(t).layouts]
    if machine not in pod_types:
        err.print(
            f"[red]--machine must be one of {', '.join(pod_types)} (POD64s); use --fleet for servers[/]"
        )
        raise typer.Exit(2)
    if fleet is not None:
        from vipu.topology import parse_fleet_description

        try:
            parse_fleet_description(fleet)
        except ValueError as exc:
            err.print(f"[red]--fleet: {exc}[/]")
            raise typer.Exit(2)
    spec = ReplaySpec(
        trace=trace,
        pods=pods,
        machine=machine,
        policies=names,
        estimates=estimates,
        seed=seed,
        columns=Columns(submit_column, duration_column, size_column, tenant_column),
        limit=limit,
        start_row=skip,
        prediction_error=prediction_error,
        max_runtime_s=max_runtime,
        fleet=fleet,
        preemptible_fraction=preemptible_fraction,
        checkpoint_every_s=checkpoint_every,
        warning_s=preemption_warning,
        estimate_every=estimate_every,
    )
    try:
        jobs = spec.load()
    except TraceError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2)
    if not jobs:
        err.print("[red]the trace (or the slice asked for) has no jobs[/]")
        raise typer.Exit(2)
    with Progress(
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as bar:
        tasks = {name: bar.add_task(name, total=len(jobs)) for name in names}
        results = replay(
            spec,
            jobs,
            workers=workers or min(len(names), os.cpu_count() or 1),
            progress=lambda name, done: bar.advance(tasks[name], done),
        )
    figures = report(results)
    where = f"{pods} POD64 ({pods * 64} IPUs, {machine})" if fleet is None else f"{fleet}"
    if out_dir is not None:
        title = f"{len(jobs):,} jobs on {where}"
        for path in write_outputs(results, out_dir, title=title):
            err.print(f"wrote {path}")
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    table = Table(title=f"{trace.name}: {len(jobs):,} jobs on {where}")
    rows: list[tuple[str, str, Callable[[Any], str]]] = [
        ("avg JCT", "avg_jct_s", _duration),
        ("p50 JCT", "p50_jct_s", _duration),
        ("p99 JCT", "p99_jct_s", _duration),
        ("avg wait", "avg_wait_s", _duration),
        ("p50 wait", "p50_wait_s", _duration),
        ("p99 wait", "p99_wait_s", _duration),
        ("makespan", "makespan_s", _duration),
        ("utilisation", "utilization", _share),
        ("fragmentation", "fragmentation", _share),
        ("refused with room", "refused_while_free", _share),
        ("fairness (Jain)", "fairness", lambda v: f"{v:.3f}"),
        ("fairness, per job", "fairness_jobs", lambda v: f"{v:.3f}"),
        ("worst tenant slowdown", "worst_tenant_slowdown", lambda v: f"{v:.2f}"),
        ("estimates", "estimates", str),
        ("launch failures", "launch_failures", lambda v: f"{v:,}"),
        ("replay time", "replay_wall_s", lambda v: f"{v:.1f} s"),
    ]
    table.add_column("")
    for name in figures:
        table.add_column(name, justify="right")
    for head, key, fmt in rows:
        table.add_row(head, *(fmt(row[key]) for row in figures.values()))
    if preemptible_fraction > 0:
        table.add_row("preemptions", *(f"{row['preemptions']:,}" for row in figures.values()))
        for head, get, fmt in (
            ("avg JCT, preemptible", lambda p: p["avg_jct_s"], _duration),
            ("avg JCT, others", lambda p: p["avg_jct_other_s"], _duration),
            ("lost per preemption", lambda p: p["lost_per_preemption_s"]["mean"], lambda v: f"{v:.1f} s"),
        ):
            table.add_row(
                head,
                *(fmt(get(row["preemptible"])) if "preemptible" in row else "-" for row in figures.values()),
            )
    if estimate_every:
        for head, key, fmt in (
            ("estimate: median error / wait", "median_abs_error_share", _share),
            ("estimate: within 25%", "within_25pct", _share),
            ("estimate: at once, said < 60 s", "immediate_under_60s", _share),
        ):
            table.add_row(
                head, *(fmt(row.get("estimate_error", {}).get(key, math.nan)) for row in figures.values())
            )
    out.print(table)


def _duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _share(value: float) -> str:
    return f"{100 * value:.1f}%"


def register(app: typer.Typer) -> None:
    app.command()(estimate)
    app.command()(simulate)
