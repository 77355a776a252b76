"""The client commands, mirroring the HTTP API through the SDK.

`ipucloud login`, `ipucloud jobs ...`, `ipucloud models ...`, `ipucloud usage`, `ipucloud trial apply`,
`ipucloud admin ...` and `ipucloud vipu ...`. Every command that prints something a script may
read takes `--json`; exit codes are listed in `client_common.Exit`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ipucloud.cli import (
    client_admin,
    client_arrays,
    client_endpoints,
    client_jobs,
    client_models,
    client_sessions,
    client_vipu,
)
from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    errors,
    kv_table,
    parse_time,
    print_json,
    show,
    table,
)
from ipucloud.cli.client_webhooks import register as register_webhooks
from ipucloud.sdk import AuthError, Client, config
from ipucloud.sdk.config import DEFAULT_URL


def login(
    url: Annotated[str | None, typer.Option("--url", help="The cloud's URL.", show_default=False)] = None,
    key: Annotated[
        str | None,
        typer.Option("--key", help="API key (asked for, hidden, when not given).", show_default=False),
    ] = None,
    verify: Annotated[bool, typer.Option(help="Check the key against the cloud before saving.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Save the cloud's URL and your API key (config file with mode 0600)."""
    with errors(as_json):
        saved = config.load_config()
        url = url or saved.get("url") or DEFAULT_URL
        if key is None:
            key = typer.prompt("API key", hide_input=True).strip()
        who = "unverified"
        if verify:
            with Client(url, key) as client:
                who = _whoami(client)
        path = config.save_config(config.resolve(url, key).url, key)
    if as_json:
        print_json({"url": url, "config": str(path), "as": who})
    else:
        show(f"Logged in to {url} as {who}; saved to {path} (mode 0600).")


def _whoami(client: Client) -> str:
    client.workloads()  # any valid key may read the catalogue: this checks the key itself
    try:
        u = client.usage()
    except AuthError as exc:
        if exc.status != 403:
            raise
        return "admin"  # a valid key refused a tenant's own usage: an admin key, which has no tenant
    return f"tenant {u.tenant_id} ({u.plan})"


def logout(as_json: JsonOpt = False) -> None:
    """Forget the saved URL and key."""
    removed = config.remove_config()
    if as_json:
        print_json({"removed": removed, "config": str(config.config_path())})
    else:
        show(f"Removed {config.config_path()}." if removed else "Not logged in.")


def usage(
    csv: Annotated[bool, typer.Option("--csv", help="Print CSV (one row per job).")] = False,
    since: Annotated[str | None, typer.Option(help="From this time, ISO 8601.")] = None,
    until: Annotated[str | None, typer.Option(help="Until this time, ISO 8601.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your tenant's metered IPU-hours and what is left of the grant."""
    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    with connect(url, key, as_json) as client:
        if csv:
            typer.echo(client.usage_csv(since=start, until=end), nl=False)
            return
        u = client.usage(since=start, until=end)
    if as_json:
        print_json(u)
        return
    show(
        kv_table(
            [
                ("tenant", u.tenant_id),
                ("plan", u.plan),
                ("grant", f"{u.quota_ipu_hours:,.3f} IPU-hours"),
                ("used", f"{u.used_ipu_hours:,.6f} IPU-hours"),
                ("held by queued/running jobs", f"{u.reserved_ipu_hours:,.6f} IPU-hours"),
                ("remaining", f"{u.remaining_ipu_hours:,.6f} IPU-hours"),
                ("days left", f"{u.days_left:.1f}" if u.days_left is not None else "no end"),
            ]
        )
    )
    if u.by_workload:
        show(
            table(
                "by workload",
                ["WORKLOAD", "IPU-HOURS"],
                [(w.workload, w.ipu_hours) for w in u.by_workload],
            )
        )
    by_type = u.by_machine_type
    if by_type:
        rates = u.rates
        show(
            table(
                "by machine type (grant spent = rate x IPU-hours)",
                ["TYPE", "RATE", "IPU-HOURS", "GRANT SPENT"],
                [
                    (
                        t.machine_type,
                        rates.get(t.machine_type or "", "-"),
                        t.ipu_hours,
                        t.charged_ipu_hours,
                    )
                    for t in by_type
                ],
            )
        )
    if u.by_day:
        show(table("by day", ["DAY", "IPU-HOURS"], [(d.day, d.ipu_hours) for d in u.by_day[-14:]]))


trial_app = typer.Typer(help="Free trials.", epilog=EXIT_CODES_HELP, no_args_is_help=True)


@trial_app.command("apply")
def trial_apply(
    name: Annotated[str, typer.Option(help="Your name.")],
    email: Annotated[str, typer.Option(help="Where the key is sent.")],
    organisation: Annotated[str, typer.Option(help="Company, university or `-` for yourself.")],
    category: Annotated[str, typer.Option(help="individual, university or business.")],
    intended_use: Annotated[str, typer.Option("--use", help="What you want to run.")],
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Apply for a free trial (no key needed); an admin approves it."""
    with errors(as_json), Client(url) as client:
        a = client.apply_for_trial(
            name=name,
            email=email,
            organisation=organisation,
            category=category,
            intended_use=intended_use,
        )
    if as_json:
        print_json(a)
    else:
        show(f"Application {a.id} received ({a.status}). An admin will review it.")


def register(app: typer.Typer) -> None:
    app.command(epilog=EXIT_CODES_HELP)(login)
    app.command(epilog=EXIT_CODES_HELP)(logout)
    app.command(epilog=EXIT_CODES_HELP)(usage)
    app.add_typer(client_jobs.app, name="jobs")
    app.add_typer(client_arrays.app, name="arrays")
    app.add_typer(client_models.app, name="models")
    app.add_typer(client_sessions.app, name="sessions")
    app.add_typer(client_endpoints.app, name="endpoints")
    app.add_typer(trial_app, name="trial")
    app.add_typer(client_admin.keys_app, name="keys")
    app.add_typer(client_admin.app, name="admin")
    app.add_typer(client_vipu.app, name="vipu")
    register_webhooks(app)
