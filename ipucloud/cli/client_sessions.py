"""`ipucloud sessions start|list|show|extend|end`: a partition held for your jobs, which start in it at once.

    ipucloud sessions start --ipus 4 --wait       # queues like a job; --wait returns once it holds IPUs
    ipucloud jobs submit --session ses_... --model resnet50 --steps 100 --ipus 4
    ipucloud sessions extend ses_... --by 3600    # an hour more, reserved from the grant
    ipucloud sessions end ses_...

Durations are cluster seconds; the plan sets their defaults and the ceiling (docs/sessions.md).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    Exit,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    duration,
    fail,
    kv_table,
    print_json,
    show,
    table,
    when,
)
from ipucloud.sdk import Session
from ipucloud.sdk.models import Model
from vipu.machine_types import MACHINE_TYPE_NAMES

app = typer.Typer(
    help="Hold a partition for your jobs: they start in it at once, with warm executables.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)

SessionArg = Annotated[str, typer.Argument(help="The session's id (ses_...).", show_default=False)]


def _given(obj: Model | None, name: str, default: Any) -> Any:
    # What `.get(name, default)` gave when these were dicts: a field the server sent, even null.
    return getattr(obj, name) if obj is not None and name in obj.model_fields_set else default


def describe(s: Session) -> list[tuple[str, Any]]:
    part = s.partition
    rows: list[tuple[str, Any]] = [
        ("id", s.id),
        ("state", s.state + (f" ({s.ended_reason}: {s.ended_detail})" if s.ended_reason else "")),
        (
            "IPUs",
            f"{s.ipus} x {_given(part, 'machine', s.machine)}" + (f", {s.gcds} GCDs" if s.gcds > 1 else ""),
        ),
        ("partition", _given(part, "id", "-")),
        ("held", duration(s.held_s)),
        ("max duration", duration(s.max_duration_s)),
        ("time left", duration(s.time_left_s)),
        ("idle", "a job is running" if s.state == "active" and s.idle_s is None else duration(s.idle_s)),
        ("ends after idle", duration(s.idle_left_s)),
        ("billed", f"{s.billed_ipu_hours:.4f} IPU-hours"),
        ("started", when(s.started_at)),
        ("ended", when(s.ended_at)),
        ("clocks", "durations in cluster time; started and ended on the wall clock (UTC)"),
    ]
    if s.jobs:
        rows.append(("jobs", ", ".join(f"{j.id} {j.state}" for j in s.jobs[:10])))
    return rows


@app.command()
def start(
    ipus: Annotated[int, typer.Option(help="Partition size (a power of two).", min=1)],
    machine: Annotated[
        str | None, typer.Option(help=f"{', '.join(MACHINE_TYPE_NAMES)}, or any (default).")
    ] = None,
    max_duration: Annotated[
        int | None,
        typer.Option(
            "--max-duration", help="Cluster seconds it may hold the partition (default: the plan's)."
        ),
    ] = None,
    idle_timeout: Annotated[
        int | None,
        typer.Option("--idle-timeout", help="End it after this many cluster seconds with no job running."),
    ] = None,
    gcds: Annotated[
        int | None, typer.Option(help="Split the partition into graph compile domains, one job in each.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name to know it by.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Return once it is active (holds its IPUs).")] = False,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a session: it queues like a job, then holds its partition until you end it, it reaches its
    maximum duration, or it idles past its timeout."""
    with connect(url, key, as_json) as client:
        s = client.start_session(
            ipus=ipus,
            machine=machine,
            max_duration_s=max_duration,
            idle_timeout_s=idle_timeout,
            gcds=gcds,
            name=name,
        )
        deadline = time.monotonic() + timeout
        while wait and s.state == "starting" and time.monotonic() < deadline:
            time.sleep(0.5)
            s = client.get_session(s.id)
    if as_json:
        print_json(s)
    else:
        show(kv_table(describe(s)))
    if wait and s.state != "active":
        fail(
            f"session {s.id} is {s.state}, not active",
            Exit.CONFLICT if s.state == "ended" else Exit.UNAVAILABLE,
        )


@app.command("list")
def list_(
    state: Annotated[str | None, typer.Option(help="starting, active or ended.")] = None,
    limit: Annotated[int, typer.Option(help="How many (newest first).", min=1, max=200)] = 50,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your sessions, newest first."""
    with connect(url, key, as_json) as client:
        page = client.list_sessions(state=state, limit=limit)
    if as_json:
        print_json(page)
        return
    rows = [
        (
            s.id,
            s.state + (f" ({s.ended_reason})" if s.ended_reason else ""),
            f"{s.ipus} x {_given(s.partition, 'machine', s.machine)}",
            _given(s.partition, "id", "-"),
            duration(s.time_left_s),
            duration(s.idle_left_s),
            len(s.jobs),
            f"{s.billed_ipu_hours:.4f}",
            when(s.created_at),
        )
        for s in page.items
    ]
    show(
        table(
            None,
            ["ID", "STATE", "IPUS", "PARTITION", "TIME LEFT", "IDLE LEFT", "JOBS", "IPU-HOURS", "CREATED"],
            rows,
        )
    )


@app.command("show")
def show_(session: SessionArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """A session: its partition, time left, idle countdown and jobs."""
    with connect(url, key, as_json) as client:
        s = client.get_session(session)
    if as_json:
        print_json(s)
    else:
        show(kv_table(describe(s)))


@app.command()
def extend(
    session: SessionArg,
    by: Annotated[
        int | None, typer.Option("--by", help="Cluster seconds to add to its maximum duration.", min=1)
    ] = None,
    max_duration: Annotated[
        int | None,
        typer.Option(
            "--max-duration", help="Its new maximum duration (cluster seconds from its start).", min=1
        ),
    ] = None,
    idle_timeout: Annotated[
        int | None,
        typer.Option(
            "--idle-timeout", help="End it after this many cluster seconds with no job running.", min=1
        ),
    ] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give a session more time (reserved from your grant, up to the plan's ceiling) or another idle
    timeout."""
    if by is not None and max_duration is not None:
        fail("give --by or --max-duration, not both", Exit.USAGE)
    if by is None and max_duration is None and idle_timeout is None:
        fail("give --by, --max-duration or --idle-timeout", Exit.USAGE)
    with connect(url, key, as_json) as client:
        if by is not None:
            # The API takes a total, so a retried call cannot add the time twice.
            max_duration = client.get_session(session).max_duration_s + by
        s = client.change_session(session, max_duration_s=max_duration, idle_timeout_s=idle_timeout)
    if as_json:
        print_json(s)
    else:
        show(kv_table(describe(s)))


@app.command()
def end(session: SessionArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """End a session: its running jobs stop, the hold is billed up to now and the partition freed."""
    with connect(url, key, as_json) as client:
        s = client.end_session(session)
    if as_json:
        print_json(s)
    else:
        show(f"ended {s.id} after {duration(s.held_s)} ({s.billed_ipu_hours:.4f} IPU-hours)")
