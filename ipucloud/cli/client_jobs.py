"""`ipucloud jobs submit|list|show|logs|cancel`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    Exit,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    console,
    duration,
    fail,
    kv_table,
    parse_ipus,
    print_json,
    show,
    table,
    when,
)
from ipucloud.cli.client_models import parse_dims
from ipucloud.cli.figures import charged_line
from ipucloud.sdk import Client, Job, StreamEvent
from vipu.machine_types import MACHINE_TYPE_NAMES

app = typer.Typer(
    help="Submit, list, inspect, follow and cancel jobs.", epilog=EXIT_CODES_HELP, no_args_is_help=True
)

STATE_STYLE = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def load_spec(path: Path) -> dict[str, Any]:
    """A job spec from a JSON or YAML file (`-` reads stdin)."""
    try:
        text = typer.get_text_stream("stdin").read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", Exit.USAGE)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        fail(f"{path} is not valid JSON or YAML: {exc}", Exit.USAGE)
    if not isinstance(data, dict):
        fail(f"{path} must hold one job spec (a mapping), not {type(data).__name__}", Exit.USAGE)
    return data


def final_exit(job_state: str | None) -> Exit:
    return Exit.OK if job_state == "succeeded" else Exit.JOB_FAILED


def follow(client: Client, job: Job, *, as_json: bool, show_logs: bool = True) -> str | None:
    """Follow a job to its end: a progress bar and log lines (or NDJSON events); the final state."""
    if as_json:
        final: str | None = None
        for event in client.stream_logs(job.id):
            typer.echo(json.dumps({"event": event.event, "id": event.id, **event.data}, default=str))
            final = event.state or final
        return final
    err = console(stderr=True)
    out = console()
    columns = (
        TextColumn("[bold]{task.fields[state]:<9}"),
        BarColumn(bar_width=None),
        TaskProgressColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    )
    final = None
    with Progress(*columns, console=err, transient=False, redirect_stdout=False) as bar:
        task = bar.add_task(job.name, total=100.0, state=job.state, detail="")
        for event in client.stream_logs(job.id):
            final = _render_event(event, bar, task, out if show_logs else None) or final
    if final:
        style = STATE_STYLE.get(final, "white")
        err.print(f"job {job.id} [{style}]{final}[/]")
    return final


def _render_event(event: StreamEvent, bar: Progress, task: Any, out: Any) -> str | None:
    if event.event == "progress" and event.progress is not None:
        p = event.progress
        bits = []
        if p.phase:
            bits.append(p.phase)
        if p.step is not None and p.steps:
            bits.append(f"step {p.step}/{p.steps}")
        if p.throughput:
            bits.append(f"{p.throughput:,.0f} samples/s")
        if p.eta_s is not None and p.phase != "done":
            bits.append(f"eta {duration(p.eta_s)} cluster time")
        bar.update(task, completed=p.percent or 0.0, detail="  ".join(bits))
    elif event.entry is not None:
        entry = event.entry
        state = (entry.data or {}).get("state")
        if isinstance(state, str):
            bar.update(task, state=state)
        if out is not None:
            # On a terminal the lines go above the bar; piped, they go to stdout and the bar to stderr.
            target = bar.console if out.is_terminal and bar.console.is_terminal else out
            target.print(f"{when(entry.at)}  {entry.kind:<5}  {entry.message}", markup=False)
    elif event.event == "end":
        state = event.state
        bar.update(task, state=state, completed=100.0 if state == "succeeded" else None)
        return state
    return None


@app.command()
def submit(
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Job spec as JSON or YAML (`-` for stdin); flags override it."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name.")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Catalogue workload, e.g. bert-large (see `ipucloud estimate`), or the name or id of one of "
            "your models (`ipucloud models list`)."
        ),
    ] = None,
    task: Annotated[str | None, typer.Option(help="train or infer.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length (BERT, LSTM, GRU).")] = None,
    precision: Annotated[str | None, typer.Option(help="fp16 or fp32.")] = None,
    steps: Annotated[int | None, typer.Option(help="Steps to run.")] = None,
    samples: Annotated[int | None, typer.Option(help="Samples to process (instead of --steps).")] = None,
    dim: Annotated[
        list[str] | None,
        typer.Option(
            "--dim", help="Your model's dynamic dimension as NAME=SIZE (repeat); overrides its default."
        ),
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(help="Your model's optimizer: sgd, sgd-momentum, adam (default), lamb, rmsprop."),
    ] = None,
    ipus: Annotated[str | None, typer.Option(help="Partition size (a power of two) or `auto`.")] = None,
    machine: Annotated[
        str | None,
        typer.Option(
            help=f"{', '.join(MACHINE_TYPE_NAMES)}, or any (default): where it is predicted to finish first."
        ),
    ] = None,
    prefer: Annotated[
        str | None, typer.Option(help="With machine any: time (default) or cost (the least grant spent).")
    ] = None,
    partition: Annotated[str | None, typer.Option(help="Run inside this reserved partition.")] = None,
    session: Annotated[
        str | None,
        typer.Option(
            help="Run in this active session of yours (`ipucloud sessions start`): it starts at once."
        ),
    ] = None,
    priority: Annotated[int | None, typer.Option(help="-100..100 within your tenant.")] = None,
    max_runtime: Annotated[
        int | None, typer.Option("--max-runtime", help="Stop after this many cluster seconds.")
    ] = None,
    preemptible: Annotated[
        bool | None,
        typer.Option(
            "--preemptible/--no-preemptible",
            help="Run at the plan's discounted rate; other work may preempt it after a warning, and it "
            "resumes from its checkpoint.",
        ),
    ] = None,
    never_preempt: Annotated[
        bool | None,
        typer.Option(
            "--never-preempt",
            help="Never preempt this job for other work (it waits its turn); charged as without it.",
        ),
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            "--checkpoint-every", help="Training: cluster seconds between checkpoints (default 600)."
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            "--array",
            help="Submit a job array, Slurm's way: indices `0-99`, `0-99:2`, `1,5,7`; `%N` runs at most N at "
            "once (`0-99%10`).",
        ),
    ] = None,
    dependency: Annotated[
        list[str] | None,
        typer.Option(
            "--dependency",
            help="Start after TYPE:ID[:ID...] (repeat): after, afterany, afterok, afternotok, aftercorr; "
            "ID a job or an array of yours.",
        ),
    ] = None,
    dependency_any: Annotated[
        bool, typer.Option("--dependency-any", help="Any one --dependency suffices (default: all).")
    ] = False,
    hold_unsatisfiable: Annotated[
        bool,
        typer.Option(
            "--hold-unsatisfiable", help="Keep it queued when its dependencies can no longer be met."
        ),
    ] = False,
    singleton: Annotated[
        bool | None,
        typer.Option("--singleton", help="Run only when no other job of yours with this name runs."),
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Submitting again with the same key returns the same job.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Only estimate: fit, machine type, time, grant charged (and raw IPU-hours), wait; "
            "exit 2 if it does not fit.",
        ),
    ] = False,
    do_follow: Annotated[
        bool, typer.Option("--follow", help="Watch it run to the end (exit 1 if it fails).")
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job from flags and/or a JSON/YAML spec file."""
    base = load_spec(file) if file is not None else {}
    fields: dict[str, Any] = dict(
        name=name,
        model=model,
        task=task,
        batch_size=batch_size,
        seq_len=seq_len,
        precision=precision,
        steps=steps,
        samples=samples,
        dims=parse_dims(dim) or None,
        optimizer=optimizer,
        ipus=parse_ipus(ipus),
        machine=machine,
        prefer=prefer,
        partition=partition,
        session=session,
        priority=priority,
        max_runtime_s=max_runtime,
        preemptible=preemptible,
        never_preempt=never_preempt,
        checkpoint_every_s=checkpoint_every,
        singleton=singleton,
    )
    if array is not None:
        fields["array"] = parse_array(array)
    if dependency:
        fields["depends_on"] = parse_dependencies(dependency, any_=dependency_any)
        if hold_unsatisfiable:
            fields["on_unsatisfiable"] = "hold"
    if not base and model is None:
        fail("give --model (or a spec with --file)", Exit.USAGE)
    if not dry_run and ("array" in fields or "array" in base or "sweep" in base):
        with connect(url, key, as_json) as client:
            made = client.submit_array(base, idempotency_key=idempotency_key, **fields)
        if as_json:
            print_json(made)
        else:
            show(
                f"submitted array [bold]{made.id}[/] ({made.name}): {made.size} jobs"
                + (f", at most {made.max_running} at once" if made.max_running else "")
            )
        return
    with connect(url, key, as_json) as client:
        if dry_run:
            est = client.estimate(base, **fields)
            if as_json:
                print_json(est)
            elif est.totals is not None:
                _print_array_estimate(est)
            else:
                _print_estimate(est)
            raise typer.Exit(Exit.OK if est.fits else Exit.DOES_NOT_FIT)
        job = client.submit_job(base, idempotency_key=idempotency_key, **fields)
        if not do_follow:
            if as_json:
                print_json(job)
            else:
                show(
                    f"submitted [bold]{job.id}[/] ({job.name}): {job.state}, {job.ipus} IPUs, "
                    f"predicted {duration(job.predicted_runtime_s)}"
                )
            return
        if as_json:
            # Scripts get one JSON document: the job as it ended.
            for _ in client.stream_logs(job.id):
                pass
            done = client.get_job(job.id)
            print_json(done)
            final: str | None = done.state
        else:
            console(stderr=True).print(f"submitted [bold]{job.id}[/] ({job.name}), {job.ipus} IPUs")
            final = follow(client, job, as_json=False)
    raise typer.Exit(final_exit(final))


def parse_array(text: str) -> dict[str, Any]:
    """`0-99%10` -> {"indices": "0-99", "max_running": 10}."""
    indices, _, throttle = text.partition("%")
    out: dict[str, Any] = {"indices": indices}
    if throttle:
        if not throttle.isdigit() or int(throttle) < 1:
            fail(f"--array {text}: after % comes how many run at once, a positive number", Exit.USAGE)
        out["max_running"] = int(throttle)
    return out


DEPENDENCY_TYPES = ("after", "afterany", "afterok", "afternotok", "aftercorr")


def parse_dependencies(items: list[str], *, any_: bool = False) -> dict[str, Any]:
    """Slurm's `afterok:job_a:job_b` (repeatable) -> {"all": [{"job": ..., "type": ...}, ...]}."""
    deps = []
    for item in items:
        kind, _, ids = item.partition(":")
        if kind not in DEPENDENCY_TYPES or not ids:
            fail(f"--dependency {item}: give TYPE:ID ({', '.join(DEPENDENCY_TYPES)})", Exit.USAGE)
        deps += [{"job": i, "type": kind} for i in ids.split(":") if i]
    return {"any" if any_ else "all": deps}


def _wait(seconds: float | None, wall_s: float | None = None) -> str:
    """The expected wait, in cluster time like every duration here, and on the wall clock."""
    if seconds is None:
        return "no healthy room of that size"
    if seconds == 0:
        return "starts at once"
    wall = "" if wall_s is None else f" (about {duration(wall_s)} wall clock)"
    return f"{duration(seconds)} cluster time{wall}"


def _progress_row(p: Any) -> str | None:
    """Steps done (compile and load are phases that move no percent), with the run's cluster time."""
    if p is None or p.percent is None:
        return None
    steps = f", step {p.step:,} of {p.steps:,}" if p.step is not None and p.steps else ""
    ran = f", {duration(p.cluster_s)} cluster time" if p.cluster_s is not None else ""
    return f"{p.percent:.1f}% of steps ({p.phase}{steps}{ran})"


def _print_estimate(est: Any) -> None:
    if not est.fits:
        fail(f"does not fit: {est.error}", Exit.DOES_NOT_FIT)
    plan = est.plan or {}
    wait = est.expected_wait_s
    options = est.machine_options or {}
    chosen = (
        f"{est.machine} (where it {'spends least' if est.prefer == 'cost' else 'finishes first'} of "
        f"{len(options)} types)"
        if options
        else est.machine
    )
    reserve = est.reserve_ipu_hours
    rows: list[tuple[str, Any]] = [
        ("fits", "yes"),
        ("machine type", chosen),
        ("IPUs", plan.get("ipus")),
        ("IPUs per replica x replicas", f"{plan.get('ipus_per_replica')} x {plan.get('replicas')}"),
        ("compile", duration(est.compile_s)),
        ("step", duration(est.step_s)),
        ("throughput", f"{est.throughput:,.1f} samples/s" if est.throughput else None),
        ("total time", f"{duration(est.total_s)} cluster time" if est.total_s is not None else None),
        ("charged", charged_line(est.charged_ipu_hours, est.ipu_hours, est.machine, est.rate)),
    ]
    if reserve is not None and reserve != est.charged_ipu_hours:
        # Submitting reserves the type it is promised at (the fastest by run time, or the cheapest).
        rows.append(
            ("reserved on submit", f"{reserve:,.4f} IPU-hours of the grant (its end bills what it ran)")
        )
    rows.append(("expected wait", _wait(wait, est.expected_wait_wall_s)))
    show(kv_table(rows))


def _print_array_estimate(est: Any) -> None:
    """An array's or sweep's dry run: a row per element (as many as the API answered), then the whole."""
    rows = [
        [
            str(e.index),
            ", ".join(f"{k}={v}" for k, v in (e.params or {}).items()) or "-",
            "yes" if e.fits else f"no: {e.error}",
            str(e.ipus or "-"),
            e.machine or "-",
            duration(e.total_s),
            f"{e.throughput:,.1f}" if e.throughput else "-",
            f"{e.charged_ipu_hours:,.4f}" if e.charged_ipu_hours is not None else "-",
            _wait(e.expected_wait_s),
        ]
        for e in est.elements or []
    ]
    show(
        table(
            None,
            ["index", "params", "fits", "IPUs", "machine", "time", "samples/s", "IPU-hours", "wait"],
            rows,
        )
    )
    t = est.totals
    if est.elements_truncated:
        show(f"(the first {len(rows)} of {t.elements} elements; --json or the API's max_rows for more)")
    show(
        kv_table(
            [
                ("elements", f"{t.elements} ({t.fitting} fit)"),
                ("at most running", t.max_running or "no limit"),
                ("run time, added up", f"{duration(t.total_s)} cluster time"),
                ("IPU-hours (grant spent)", f"{t.charged_ipu_hours:,.4f}"),
                ("first starts in", _wait(t.expected_wait_s)),
                ("last ends in", _wait(t.expected_end_s)),
            ]
        )
    )


@app.command("list")
def list_(
    state: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed or cancelled.")
    ] = None,
    limit: Annotated[int, typer.Option(help="How many (newest first).", min=1, max=500)] = 20,
    all_: Annotated[bool, typer.Option("--all", help="Every job, page by page.")] = False,
    expand: Annotated[
        bool, typer.Option("--expand", help="Every queued element of an array (by default one row each).")
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your tenant's jobs, newest first; an array's queued elements are one row (`arr_..._[5-99]`)."""
    with connect(url, key, as_json) as client:
        if all_:
            jobs = list(client.iter_jobs(state=state, page_size=200))
        else:
            jobs = client.list_jobs(state=state, limit=limit, expand=expand).items
    if as_json:
        print_json(jobs)
        return
    rows = [
        (
            j.folded.label if j.folded is not None else j.id,
            j.name if j.folded is None else f"{j.folded.count} x {j.name.rsplit('[', 1)[0]}",
            f"[{STATE_STYLE.get(j.state, 'white')}]{j.state}[/]",
            j.ipus,
            j.workload.get("model"),
            duration(j.predicted_runtime_s),
            when(j.created_at),
        )
        for j in jobs
    ]
    show(table(None, ["ID", "NAME", "STATE", "IPUS", "MODEL", "PREDICTED", "CREATED"], rows))


@app.command("show")
def show_(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job: its state, where it runs, progress, why it waits, its history."""
    with connect(url, key, as_json) as client:
        job = client.get_job(job_id)
    if as_json:
        print_json(job)
        return
    p = job.progress
    rows: list[tuple[str, Any]] = [
        ("id", job.id),
        ("name", job.name),
        ("state", f"[{STATE_STYLE.get(job.state, 'white')}]{job.state}[/]"),
        ("reason", job.reason),
        ("workload", ", ".join(f"{k}={v}" for k, v in job.workload.items() if v is not None)),
        ("IPUs", f"{job.ipus} (asked: {job.ipus_requested})"),
        ("machine", job.machine),
        ("partition", job.partition),
        ("predicted", f"{duration(job.predicted_runtime_s)} cluster time"),
        ("progress", _progress_row(p)),
        ("throughput", f"{p.throughput:,.1f} samples/s" if p and p.throughput else None),
        ("used", f"{job.used_ipu_hours:.6f} IPU-hours" if job.used_ipu_hours is not None else None),
        ("attempts", job.attempts),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
    ]
    if job.wait is not None:
        rows.append(("waiting", f"{job.wait.reason}: {job.wait.detail}"))
        if job.wait.estimated_start is not None:
            rows.append(("estimated start", f"{when(job.wait.estimated_start)} UTC (wall clock)"))
    if job.preemptible:
        rows.append(("preemptible", "yes (discounted; may be preempted after a warning)"))
    if job.never_preempt:
        rows.append(("never preempted", "yes (opted out)"))
    if job.resumable_until is not None:
        rows.append(
            (
                "resumable until",
                f"{when(job.resumable_until)} UTC, wall clock (`ipucloud jobs resume {job.id}`)",
            )
        )
    show(kv_table(rows))
    if job.checkpoints:
        show(
            table(
                f"checkpoints ({job.checkpoint_count or len(job.checkpoints)}, newest first)",
                ["AT", "STEP", "SAMPLES", "WHY", "ATTEMPT"],
                [
                    (when(c.at), f"{c.step:,}/{c.steps:,}", f"{c.samples:,}", c.reason, c.attempt)
                    for c in job.checkpoints
                ],
            )
        )
    if job.history:
        show(
            table(
                "history", ["AT", "STATE", "MESSAGE"], [(when(h.at), h.state, h.message) for h in job.history]
            )
        )


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    do_follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-F", help="Stream until the job ends, with a progress bar (exit 1 if it fails)."
        ),
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A job's events and log lines; --follow streams them live (server-sent events)."""
    with connect(url, key, as_json) as client:
        if do_follow:
            job = client.get_job(job_id)
            final = follow(client, job, as_json=as_json)
            raise typer.Exit(final_exit(final))
        entries = list(client.iter_logs(job_id))
    if as_json:
        print_json(entries)
        return
    out = console()
    for e in entries:
        out.print(f"{when(e.at)}  {e.kind:<5}  {e.message}", markup=False)


@app.command()
def resume(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume a job its time limit stopped, from its last checkpoint (within the plan's retention)."""
    with connect(url, key, as_json) as client:
        job = client.resume_job(job_id)
    if as_json:
        print_json(job)
        return
    step = f" from step {job.checkpoints[0].step:,}" if job.checkpoints else ""
    show(f"{job.id} resumed{step}: {job.state}")


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: a queued one ends now, a running one stops at its next heartbeat."""
    with connect(url, key, as_json) as client:
        job = client.cancel_job(job_id)
    if as_json:
        print_json(job)
    elif job.state == "cancelled":
        show(f"{job.id} cancelled")
    else:
        show(f"{job.id} cancel requested (it is {job.state}; it stops at its next heartbeat)")
