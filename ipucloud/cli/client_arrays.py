"""`ipucloud arrays list|show|jobs|cancel|retry|throttle`: one handle for a job array or sweep."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    duration,
    kv_table,
    print_json,
    show,
    table,
    when,
)
from ipucloud.cli.client_jobs import STATE_STYLE

app = typer.Typer(
    help="Job arrays and sweeps (submit them with `ipucloud jobs submit --array` or a spec's `sweep`).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)


def _states(by_state: dict[str, int]) -> str:
    return ", ".join(f"[{STATE_STYLE.get(k, 'white')}]{n} {k}[/]" for k, n in sorted(by_state.items()))


def _show_array(a: Any) -> None:
    show(
        kv_table(
            [
                ("id", a.id),
                ("name", a.name),
                ("state", f"[{STATE_STYLE.get(a.state or '', 'white')}]{a.state}[/]"),
                ("size", a.size),
                ("indices", a.indices),
                ("max running", a.max_running or "no limit"),
                ("elements", _states(a.elements_by_state)),
                ("progress", f"{a.progress_percent:.1f} %"),
                ("succeeded", a.completed_indices or "-"),
                ("failed or cancelled", a.failed_indices or "-"),
                ("IPU-hours used", f"{a.used_ipu_hours:,.4f}"),
                ("IPU-hours reserved", f"{a.reserved_ipu_hours:,.4f}"),
                ("created", when(a.created_at)),
            ]
        )
    )


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(help="How many (newest first).", min=1, max=200)] = 20,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your tenant's arrays and sweeps, newest first."""
    with connect(url, key, as_json) as client:
        items = client.list_arrays(limit=limit).items
    if as_json:
        print_json(items)
        return
    rows = [
        (
            a.id,
            a.name,
            f"[{STATE_STYLE.get(a.state or '', 'white')}]{a.state}[/]",
            a.size,
            _states(a.elements_by_state),
        )
        for a in items
    ]
    show(table(None, ["ID", "NAME", "STATE", "SIZE", "ELEMENTS"], rows))


@app.command("show")
def show_(array_id: str, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """An array: its elements by state, progress, IPU-hours."""
    with connect(url, key, as_json) as client:
        a = client.get_array(array_id)
    if as_json:
        print_json(a)
    else:
        _show_array(a)


@app.command("jobs")
def jobs(
    array_id: str,
    state: Annotated[str | None, typer.Option(help="Only elements in this state.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """An array's elements by index, with the parameters a sweep gave each."""
    with connect(url, key, as_json) as client:
        items = list(client.iter_array_jobs(array_id, state=state))
    if as_json:
        print_json(items)
        return
    rows = [
        (
            j.array_index,
            j.id,
            f"[{STATE_STYLE.get(j.state, 'white')}]{j.state}[/]",
            j.ipus,
            " ".join(f"{k}={v}" for k, v in (j.params or {}).items()),
            duration(j.predicted_runtime_s),
        )
        for j in items
    ]
    show(table(None, ["INDEX", "ID", "STATE", "IPUS", "PARAMS", "PREDICTED"], rows))


@app.command()
def cancel(
    array_id: str,
    indices: Annotated[str | None, typer.Option(help="Only these (`1,5-9`); default every element.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel an array's queued and running elements."""
    with connect(url, key, as_json) as client:
        done = client.cancel_array(array_id, indices)
    if as_json:
        print_json(done)
    else:
        show(f"cancelled {len(done.job_ids)} elements of [bold]{array_id}[/]")


@app.command()
def retry(
    array_id: str,
    indices: Annotated[
        str, typer.Option(help="`failed` (every failed or cancelled one) or `1,5-9`.")
    ] = "failed",
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue an array's failed or cancelled elements again."""
    with connect(url, key, as_json) as client:
        done = client.retry_array(array_id, indices)
    if as_json:
        print_json(done)
    else:
        show(f"queued {len(done.job_ids)} elements of [bold]{array_id}[/] again")


@app.command()
def throttle(
    array_id: str,
    max_running: Annotated[int, typer.Argument(help="At most this many run at once; 0 lifts the limit.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change how many of an array's elements run at once."""
    with connect(url, key, as_json) as client:
        a = client.update_array(array_id, max_running=max_running or None)
    if as_json:
        print_json(a)
    else:
        _show_array(a)
