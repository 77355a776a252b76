"""`ipucloud models push|list|show|rm`: your own ONNX models, run like catalogue workloads.

`push` strips the weights on this machine (only the graph travels) and prints what the emulator sees;
the model's name or id then goes where a catalogue name does: `ipucloud jobs submit --model NAME`,
`ipucloud estimate --model NAME` (or `--model-file FILE` to plan a file without uploading it).
"""

from __future__ import annotations

from pathlib import Path
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
from ipucloud.sdk import OnnxModel
from scheduler import figures

app = typer.Typer(
    help="Your own ONNX models: push one, then run it like a catalogue workload.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)

DimOpt = Annotated[
    list[str] | None,
    typer.Option("--dim", help="NAME=SIZE for a dynamic dimension besides the batch (repeat for each)."),
]
ElementwiseOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--elementwise", help="An operator the emulator does not know that acts element by element (repeat)."
    ),
]


def parse_dims(values: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in values or []:
        name, sep, size = item.partition("=")
        ascii_digits = size.isascii() and size.isdigit() and len(size) <= 12  # not `²` nor `١٢`
        if not sep or not name or not ascii_digits or int(size) < 1:
            fail(f"--dim must be NAME=SIZE with a positive size, got {item!r}", Exit.USAGE)
        out[name] = int(size)
    return out


def _flops(value: float | None) -> str:
    return figures.flops(value)


def _dynamic(m: OnnxModel) -> str:
    """Each dynamic dimension with its default size, or, when the job gives it, the size the figures
    shown are at."""
    at = m.described_at or {}
    parts = [
        f"{d}={m.dims[d]}"
        if d in m.dims
        else f"{d}: the job's --seq-len/--dim (described at {at.get(d, '?')})"
        for d in m.dynamic_dims
    ]
    return ", ".join(parts) or "none"


def describe(m: OnnxModel) -> list[tuple[str, Any]]:
    inputs = ", ".join(f"{i.name} {i.shape} {i.dtype}" for i in m.inputs)
    unmodelled = "; ".join(f"{u.operator} x{u.nodes}: {u.treated_as}" for u in m.unmodelled)
    return [
        ("id", m.id),
        ("name", m.name),
        ("inputs", inputs),
        ("batch dimension", m.batch_dim),
        ("dynamic dimensions", _dynamic(m)),
        ("nodes / layers", f"{m.nodes} / {m.layers}"),
        ("parameters", f"{m.parameters:,}" if m.parameters is not None else "-"),
        ("forward per sample", _flops(m.forward_flops_per_sample)),
        ("activations per sample (fp16)", f"{m.activation_bytes_per_sample.get('fp16', 0) / 2**20:,.2f} MB"),
        ("tasks", ", ".join(m.tasks)),
        (
            "stored",
            f"{m.graph_bytes:,} bytes of graph (uploaded {m.uploaded_bytes:,}; weights left out "
            f"{m.weights_stripped_bytes:,})",
        ),
        ("approximated", unmodelled or "nothing"),
    ]


@app.command()
def push(
    file: Annotated[
        Path, typer.Argument(help="The ONNX file (its weights may be absent).", show_default=False)
    ],
    name: Annotated[str | None, typer.Option(help="Model name (default: the file's name).")] = None,
    dim: DimOpt = None,
    elementwise: ElementwiseOpt = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a model: its weights are stripped here, the graph is checked and described by the cloud."""
    from vipu.emulator.onnxgraph import GraphTooLarge, StripError

    dims = parse_dims(dim)
    if not file.is_file():
        fail(f"{file}: no such file", Exit.USAGE, as_json=as_json)
    with connect(url, key, as_json) as client:
        try:
            m = client.push_model(file, name=name, dims=dims, elementwise=elementwise)
        except (StripError, GraphTooLarge) as exc:
            fail(
                f"{file}: {exc}",
                Exit.USAGE,
                problem={"type": "/problems/invalid-model", "title": "Not an ONNX model", "detail": str(exc)},
                as_json=as_json,
            )
    if as_json:
        print_json(m)
        return
    show(kv_table(describe(m)))


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(help="How many (newest first).", min=1, max=500)] = 50,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your models, newest first."""
    with connect(url, key, as_json) as client:
        page = client.list_models(limit=limit)
    if as_json:
        print_json(page)
        return
    rows = [
        (
            m.id,
            m.name,
            f"{m.parameters:,}" if m.parameters is not None else "-",
            _flops(m.forward_flops_per_sample),
            m.layers,
            ", ".join(f"{k}={v}" for k, v in m.dims.items()) or "-",
            f"{m.graph_bytes:,}",
            when(m.created_at),
        )
        for m in page.items
    ]
    show(
        table(None, ["ID", "NAME", "PARAMS", "FWD/SAMPLE", "LAYERS", "DIMS", "GRAPH BYTES", "CREATED"], rows)
    )


@app.command("show")
def show_(
    model: Annotated[str, typer.Argument(help="The model's id or name.", show_default=False)],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What the emulator sees in one of your models."""
    with connect(url, key, as_json) as client:
        m = client.get_model(model)
    if as_json:
        print_json(m)
        return
    show(kv_table(describe(m)))


@app.command()
def rm(
    model: Annotated[str, typer.Argument(help="The model's id or name.", show_default=False)],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a model (refused while queued or running jobs use it)."""
    with connect(url, key, as_json) as client:
        m = client.delete_model(model)
    if as_json:
        print_json(m)
    else:
        show(f"removed {m.id} ({m.name})")
