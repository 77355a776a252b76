"""`ipucloud endpoints create|list|show|invoke|delete`: a model served behind a URL (docs/endpoints.md).

    ipucloud endpoints create bert --model bert-base --seq-len 128 --max-batch-size 8 --replicas 0:4
    ipucloud endpoints show ep_...                # state, replicas, latency per batch size, last minute
    ipucloud endpoints delete ep_...

Requests go to the endpoint's `url` in the Open Inference Protocol (KServe v2), with a key that has
the `invoke` scope.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    Exit,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    fail,
    kv_table,
    print_json,
    show,
    table,
    when,
)
from ipucloud.sdk import Endpoint, EndpointMetrics
from vipu.machine_types import MACHINE_TYPE_NAMES

app = typer.Typer(
    help="Serve a model behind a URL: replicas held for you, autoscaled, at the latency the chip gives.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)

EndpointArg = Annotated[str, typer.Argument(help="The endpoint's id (ep_...).", show_default=False)]


def _replicas(spec: str) -> dict[str, int]:
    """`N` (min = max = N) or `MIN:MAX`."""
    low, _, high = spec.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        fail(f"--replicas takes N or MIN:MAX, not {spec!r}", Exit.USAGE)
    return {"min": lo, "max": hi}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def describe(e: Endpoint, metrics: EndpointMetrics | None = None) -> list[tuple[str, Any]]:
    r = e.replicas
    rows: list[tuple[str, Any]] = [
        ("id", e.id),
        ("name", e.name),
        ("url", e.url),
        ("state", e.state + (f" ({e.reason})" if e.reason else "")),
        ("model", e.model + (f" ({e.model_id})" if e.model_id != e.model else "")),
        ("replicas", f"{r.ready} serving, {r.desired} wanted ({r.min}..{r.max})"),
        ("per replica", f"{e.ipus_per_replica} IPUs ({e.ipus_requested}) on {e.machine}"),
        ("batching", f"up to {e.batching.get('max_batch_size')}, waiting {e.batching.get('max_wait_ms')} ms"),
        ("queue", f"{e.max_queue} requests; cold start timeout {e.cold_start_timeout_s:g} s"),
        ("billed", f"{e.billed_ipu_hours:.4f} IPU-hours"),
        ("created", when(e.created_at)),
    ]
    for p in e.serve_plans:
        figures = ", ".join(f"b{b.batch_size} {b.latency_ms:.2f} ms {b.throughput:,.0f}/s" for b in p.batches)
        rows.append((f"plan {p.machine}", f"compile {p.compile_s:,.0f} s, load {p.load_s:,.1f} s; {figures}"))
    for rep in e.replica_list:
        rows.append((f"replica {rep.id}", f"{rep.state} {rep.ipus} IPUs {rep.partition or ''}".rstrip()))
    w = metrics.window if metrics is not None else None
    if w is not None:
        rows.append(
            (
                "last minute",
                f"{w.rps:.2f} req/s, p50 {_ms(w.p50_ms)}, p90 {_ms(w.p90_ms)}, p99 {_ms(w.p99_ms)}, "
                f"batch {w.mean_batch or 0:.1f}, queue delay {_ms(w.queue_delay_ms)}, "
                f"429s {w.rejected_429}, cold starts {w.cold_starts}",
            )
        )
    return rows


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="A DNS label (a-z, 0-9, -), unique among yours.")],
    model: Annotated[str, typer.Option(help="A catalogue name, or the id or name of your own model.")],
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Sequence length.", min=1)] = None,
    precision: Annotated[str | None, typer.Option(help="fp16 (default) or fp32.")] = None,
    machine: Annotated[
        str | None, typer.Option(help=f"{', '.join(MACHINE_TYPE_NAMES)}, or any (default).")
    ] = None,
    ipus: Annotated[
        str | None, typer.Option("--ipus", help="IPUs per replica: a power of two, or auto (default).")
    ] = None,
    replicas: Annotated[
        str, typer.Option(help="N, or MIN:MAX for the autoscaler (MIN 0: scale to zero).")
    ] = "1",
    max_batch_size: Annotated[
        int | None, typer.Option("--max-batch-size", help="Largest batch.", min=1)
    ] = None,
    max_wait_ms: Annotated[
        float | None, typer.Option("--max-wait-ms", help="Wait for a batch to fill.")
    ] = None,
    target_queue_delay_ms: Annotated[
        float | None, typer.Option("--target-queue-delay-ms", help="Add replicas above this queue delay.")
    ] = None,
    max_queue: Annotated[int | None, typer.Option("--max-queue", help="Waiting requests before 429.")] = None,
    preemptible: Annotated[
        bool, typer.Option("--preemptible", help="Cheaper replicas that may be stopped.")
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create an endpoint: its minimum replicas queue like jobs, then compile, load and serve."""
    batching = {k: v for k, v in {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms}.items() if v}
    scaling = {"target_queue_delay_ms": target_queue_delay_ms} if target_queue_delay_ms else None
    per_replica: int | str | None = ipus
    if ipus is not None and ipus != "auto":
        try:
            per_replica = int(ipus)
        except ValueError:
            fail(f"--ipus takes a power of two or auto, not {ipus!r}", Exit.USAGE)
    with connect(url, key, as_json) as client:
        e = client.create_endpoint(
            name=name,
            model=model,
            seq_len=seq_len,
            precision=precision,
            machine=machine,
            ipus_per_replica=per_replica,
            replicas=_replicas(replicas),
            batching=batching or None,
            autoscaling=scaling,
            max_queue=max_queue,
            preemptible=preemptible or None,
        )
    if as_json:
        print_json(e)
    else:
        show(kv_table(describe(e)))


@app.command("list")
def list_(
    state: Annotated[
        str | None, typer.Option(help="provisioning, ready, scaled-to-zero, degraded, failed or stopped.")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many (newest first).", min=1, max=200)] = 50,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your endpoints, newest first."""
    with connect(url, key, as_json) as client:
        page = client.list_endpoints(state=state, limit=limit)
    if as_json:
        print_json(page)
        return
    rows = [
        (
            e.id,
            e.name,
            e.state,
            e.model,
            f"{e.replicas.ready}/{e.replicas.desired} ({e.replicas.min}..{e.replicas.max})",
            f"{e.ipus_per_replica} x {e.machine}",
            f"{e.billed_ipu_hours:.4f}",
            when(e.created_at),
        )
        for e in page.items
    ]
    show(table(None, ["ID", "NAME", "STATE", "MODEL", "REPLICAS", "IPUS", "IPU-HOURS", "CREATED"], rows))


@app.command("show")
def show_(endpoint: EndpointArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """An endpoint: state, replicas, the serve plan's latency per batch size and its last minute."""
    with connect(url, key, as_json) as client:
        e = client.get_endpoint(endpoint)
        m = client.endpoint_metrics(endpoint, minutes=1)
    if as_json:
        print_json(e)
    else:
        show(kv_table(describe(e, m)))


@app.command()
def delete(endpoint: EndpointArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Stop an endpoint: new requests are refused, its replicas drained and billed up to now."""
    with connect(url, key, as_json) as client:
        e = client.delete_endpoint(endpoint)
    if as_json:
        print_json(e)
    else:
        show(f"stopped {e.id} ({e.name}); billed {e.billed_ipu_hours:.4f} IPU-hours")


def _input(spec: str) -> tuple[str, Any]:
    """`NAME=FILE.npy` or `NAME=JSON` (a nested list)."""
    import numpy as np

    name, sep, value = spec.partition("=")
    if not sep or not name:
        fail(f"--input takes NAME=FILE.npy or NAME=JSON, not {spec!r}", Exit.USAGE)
    if value.endswith(".npy"):
        try:
            return name, np.load(value, allow_pickle=False)
        except (OSError, ValueError) as exc:
            fail(f"--input {name}: cannot read {value}: {exc}", Exit.USAGE)
    try:
        return name, json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"--input {name}: neither a .npy file nor JSON: {exc}", Exit.USAGE)


@app.command()
def invoke(
    endpoint: EndpointArg,
    inputs: Annotated[
        list[str],
        typer.Option(
            "--input", "-i", help="NAME=FILE.npy or NAME=JSON (a nested list, batch axis first); repeat."
        ),
    ],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send one inference request (Open Inference Protocol) and show the outputs and what the chip took.

    The key needs the `invoke` scope. Inputs are converted to the model's datatypes (its signature)."""
    arrays = dict(_input(spec) for spec in inputs)
    with connect(url, key, as_json) as client:
        e = client.get_endpoint(endpoint)
        datatypes = {t["name"]: t["datatype"] for t in e.signature.get("inputs", []) if t["name"] in arrays}
        answer = client.infer(endpoint, e.name, arrays, datatypes=datatypes)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "model_name": answer.model_name,
                    "replica": answer.replica,
                    "batch_size": answer.batch_size,
                    "timing_ms": answer.timing_ms,
                    "outputs": {k: v.tolist() for k, v in answer.outputs.items()},
                },
                indent=2,
            )
        )
        return
    timing = ", ".join(f"{k} {v:.3f}" for k, v in answer.timing_ms.items())
    show(
        f"{e.name}: replica {answer.replica}, batch of {answer.batch_size}; "
        f"{answer.latency_ms:.3f} ms ({timing})"
    )
    rows = []
    for name, arr in answer.outputs.items():
        flat = arr.reshape(-1)
        head = ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in flat[:6].tolist())
        rows.append(
            (name, str(arr.dtype), "x".join(map(str, arr.shape)), head + (", ..." if flat.size > 6 else ""))
        )
    show(table(None, ["output", "dtype", "shape", "values"], rows))
