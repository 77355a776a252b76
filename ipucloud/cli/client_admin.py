"""`ipucloud admin ...`: tenants, plans, trial applications, keys, machines, racks and servers, the
fleet, usage."""

from __future__ import annotations

import string
from typing import Annotated, Any

import typer

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    Exit,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    console,
    fail,
    kv_table,
    parse_time,
    print_json,
    show,
    table,
    when,
)
from ipucloud.sdk import Fleet, Tenant
from vipu.machine_types import MACHINES, SERVER_MODELS

app = typer.Typer(help="Cloud administration (admin key).", epilog=EXIT_CODES_HELP, no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants: create, list, show, update.", no_args_is_help=True)
plans_app = typer.Typer(help="Plans: list, update.", no_args_is_help=True)
trials_app = typer.Typer(help="Trial applications: list, show, approve, reject.", no_args_is_help=True)
keys_app = typer.Typer(
    help="API keys: list, create, revoke (yours, or a tenant's with --tenant).", no_args_is_help=True
)
machines_app = typer.Typer(help="Machines: drain, fail, restore.", no_args_is_help=True)
racks_app = typer.Typer(
    help="Racks of PODs: list, add, drain, restore, retire (the fleet changes while it runs).",
    no_args_is_help=True,
)
servers_app = typer.Typer(help="IPU servers (C2 cards): add, retire.", no_args_is_help=True)
POD_TYPES = [t.value for t, m in MACHINES.items() if any(n != "server" for n in m.layouts)]
app.add_typer(tenants_app, name="tenants")
app.add_typer(plans_app, name="plans")
app.add_typer(trials_app, name="trials")
app.add_typer(keys_app, name="keys")
app.add_typer(machines_app, name="machines")
app.add_typer(racks_app, name="racks")
app.add_typer(servers_app, name="servers")


def _tenant_rows(t: Tenant) -> list[tuple[str, Any]]:
    return [
        ("id", t.id),
        ("name", t.name),
        ("plan", t.plan),
        ("status", t.status),
        ("quota", f"{t.quota_ipu_hours:,.3f} IPU-hours"),
        ("used", f"{t.used_ipu_hours:,.6f} IPU-hours"),
        ("reserved", f"{t.reserved_ipu_hours:,.6f} IPU-hours"),
        ("remaining", f"{t.remaining_ipu_hours:,.6f} IPU-hours"),
        ("expires", when(t.expires_at)),
        ("fair-share weight", t.fairshare_weight),
        ("category", t.category),
        ("organisation", t.organisation),
        ("created", when(t.created_at)),
    ]


# Tenants ----------------------------------------------------------------------------------------------


@tenants_app.command("create")
def tenants_create(
    name: Annotated[str, typer.Argument(help="The tenant's unique name.")],
    plan: Annotated[str, typer.Option(help="Plan name (see `ipucloud admin plans list`).")] = "trial",
    quota: Annotated[float | None, typer.Option(help="IPU-hour grant (default: the plan's).", min=0)] = None,
    email: Annotated[str | None, typer.Option(help="The owner's e-mail.")] = None,
    expires: Annotated[
        str | None, typer.Option(help="End of access, ISO 8601 (default: the plan's).")
    ] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant; prints its first API key, once."""
    with connect(url, key, as_json) as client:
        created = client.create_tenant(
            name=name,
            plan=plan,
            quota_ipu_hours=quota,
            expires_at=parse_time(expires, "--expires"),
            fairshare_weight=weight,
            owner_email=email,
        )
    if as_json:
        print_json(created)
        return
    show(kv_table(_tenant_rows(created)))
    show(f"\nAPI key (shown once, store it now): [bold]{created.api_key}[/]")


@tenants_app.command("list")
def tenants_list(
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every tenant with its grant and usage."""
    with connect(url, key, as_json) as client:
        tenants = list(client.iter_tenants())
    if as_json:
        print_json(tenants)
        return
    rows = [
        (
            t.id,
            t.name,
            t.plan,
            t.status,
            f"{t.quota_ipu_hours:,.1f}",
            f"{t.used_ipu_hours:,.4f}",
            f"{t.remaining_ipu_hours:,.4f}",
            when(t.expires_at),
        )
        for t in tenants
    ]
    show(table(None, ["ID", "NAME", "PLAN", "STATUS", "QUOTA H", "USED H", "LEFT H", "EXPIRES"], rows))


@tenants_app.command("show")
def tenants_show(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One tenant."""
    with connect(url, key, as_json) as client:
        t = client.get_tenant(tenant_id)
    if as_json:
        print_json(t)
    else:
        show(kv_table(_tenant_rows(t)))


@tenants_app.command("update")
def tenants_update(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id.")],
    plan: Annotated[str | None, typer.Option(help="Move to this plan.")] = None,
    quota: Annotated[float | None, typer.Option(help="New IPU-hour grant.", min=0)] = None,
    status: Annotated[str | None, typer.Option(help="active or suspended.")] = None,
    expires: Annotated[str | None, typer.Option(help="New end of access, ISO 8601.")] = None,
    weight: Annotated[float | None, typer.Option(help="Fair-share weight.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a tenant's plan, grant, status, expiry or weight."""
    changes: dict[str, Any] = {
        k: v
        for k, v in dict(
            plan=plan,
            quota_ipu_hours=quota,
            status=status,
            expires_at=parse_time(expires, "--expires"),
            fairshare_weight=weight,
        ).items()
        if v is not None
    }
    if not changes:
        fail("nothing to change: give --plan, --quota, --status, --expires or --weight", Exit.USAGE)
    with connect(url, key, as_json) as client:
        t = client.update_tenant(tenant_id, **changes)
    if as_json:
        print_json(t)
    else:
        show(kv_table(_tenant_rows(t)))


# Plans ------------------------------------------------------------------------------------------------


@plans_app.command("list")
def plans_list(url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """The plans tenants can be on."""
    with connect(url, key, as_json) as client:
        plans = list(client.iter_plans())
    if as_json:
        print_json(plans)
        return
    rows = [
        (
            p.name,
            p.kind,
            p.quota_ipu_hours,
            p.trial_days,
            p.max_partition_size,
            p.max_concurrent_jobs,
            p.max_queued_jobs,
            p.description,
        )
        for p in plans
    ]
    show(
        table(None, ["NAME", "KIND", "QUOTA H", "DAYS", "MAX IPUS", "RUNNING", "QUEUED", "DESCRIPTION"], rows)
    )


@plans_app.command("update")
def plans_update(
    name: Annotated[str, typer.Argument(help="The plan's name.")],
    quota: Annotated[float | None, typer.Option(help="IPU-hour grant of new tenants.", min=0)] = None,
    trial_days: Annotated[int | None, typer.Option(help="Days a trial lasts.", min=1)] = None,
    max_partition_size: Annotated[int | None, typer.Option(help="Largest partition.", min=1)] = None,
    max_concurrent_jobs: Annotated[int | None, typer.Option(help="Jobs running at once.", min=1)] = None,
    max_queued_jobs: Annotated[int | None, typer.Option(help="Jobs waiting at once.", min=1)] = None,
    description: Annotated[str | None, typer.Option(help="What the plan is for.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a plan (applies to new tenants' grants and to every tenant's limits)."""
    changes = {
        k: v
        for k, v in dict(
            quota_ipu_hours=quota,
            trial_days=trial_days,
            max_partition_size=max_partition_size,
            max_concurrent_jobs=max_concurrent_jobs,
            max_queued_jobs=max_queued_jobs,
            description=description,
        ).items()
        if v is not None
    }
    if not changes:
        fail("nothing to change", Exit.USAGE)
    with connect(url, key, as_json) as client:
        plan = client.update_plan(name, **changes)
    if as_json:
        print_json(plan)
    else:
        show(kv_table(list(plan.to_dict().items())))


# Trial applications -----------------------------------------------------------------------------------


@trials_app.command("list")
def trials_list(
    status: Annotated[str | None, typer.Option(help="pending, approved or rejected (default: all).")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Trial applications, oldest first."""
    with connect(url, key, as_json) as client:
        apps = list(client.iter_trials(status=status))
    if as_json:
        print_json(apps)
        return
    rows = [(a.id, a.status, a.name, a.email, a.organisation, a.category, when(a.created_at)) for a in apps]
    show(table(None, ["ID", "STATUS", "NAME", "EMAIL", "ORGANISATION", "CATEGORY", "APPLIED"], rows))


@trials_app.command("show")
def trials_show(
    application_id: Annotated[str, typer.Argument(help="The application's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One application, with what the applicant intends to do."""
    with connect(url, key, as_json) as client:
        a = client.get_trial(application_id)
    if as_json:
        print_json(a)
    else:
        show(kv_table(list(a.to_dict().items())))


@trials_app.command("approve")
def trials_approve(
    application_id: Annotated[str, typer.Argument(help="The application's id.")],
    plan: Annotated[str | None, typer.Option(help="Plan (default: the trial plan of its category).")] = None,
    hand_over_key: Annotated[
        bool,
        typer.Option(
            "--hand-over-key",
            help="Print the first key for you to hand over (mail cannot reach the applicant); no claim link.",
        ),
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve: creates the tenant; the applicant's mailed claim link gives them its first key."""
    with connect(url, key, as_json) as client:
        decision = client.approve_trial(application_id, plan=plan, hand_over_key=hand_over_key)
    if as_json:
        print_json(decision)
        return
    tenant = decision.tenant
    show(
        f"approved {application_id}: tenant {tenant.id if tenant else '-'} ({tenant.plan if tenant else '-'})"
    )
    if decision.api_key:
        show(f"API key (shown once, hand it to the applicant): [bold]{decision.api_key}[/]")
    else:
        show("no key shown: the applicant's mailed claim link gives them the first key")


@trials_app.command("reject")
def trials_reject(
    application_id: Annotated[str, typer.Argument(help="The application's id.")],
    reason: Annotated[str, typer.Option(help="Why (the applicant may be told).")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject an application."""
    with connect(url, key, as_json) as client:
        a = client.reject_trial(application_id, reason=reason)
    if as_json:
        print_json(a)
    else:
        show(f"rejected {a.id}: {a.reason}")


# Keys -------------------------------------------------------------------------------------------------


TenantOpt = Annotated[
    str | None,
    typer.Option("--tenant", help="A tenant's keys (admin key); default: the keys your own key may see."),
]


@keys_app.command("list")
def keys_list(
    tenant: TenantOpt = None, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False
) -> None:
    """API keys (never the keys themselves: their prefix, scopes and state)."""
    with connect(url, key, as_json) as client:
        keys = list(client.iter_tenant_keys(tenant) if tenant else client.iter_keys())
    if as_json:
        print_json(keys)
        return
    rows = [
        (k.id, k.name, k.prefix, " ".join(k.scopes), k.state, when(k.created_at), when(k.expires_at))
        for k in keys
    ]
    show(table(None, ["ID", "NAME", "PREFIX", "SCOPES", "STATE", "CREATED", "EXPIRES"], rows))


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Argument(help="What the key is for.")],
    tenant: TenantOpt = None,
    scope: Annotated[
        list[str] | None, typer.Option(help="read or submit (repeat; default: all allowed).")
    ] = None,
    expires: Annotated[str | None, typer.Option(help="Expiry, ISO 8601.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key; prints it once."""
    expires_at = parse_time(expires, "--expires")
    with connect(url, key, as_json) as client:
        if tenant:
            created = client.create_tenant_key(tenant, name=name, scopes=scope, expires_at=expires_at)
        else:
            created = client.create_key(name=name, scopes=scope, expires_at=expires_at)
    if as_json:
        print_json(created)
    else:
        show(
            f"key {created.id} ({created.name}) created. Shown once, store it now: [bold]{created.api_key}[/]"
        )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (not the key itself).")],
    tenant: TenantOpt = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key at once."""
    with connect(url, key, as_json) as client:
        revoked = client.revoke_tenant_key(tenant, key_id) if tenant else client.revoke_key(key_id)
    if as_json:
        print_json(revoked)
    else:
        show(f"key {revoked.id} revoked")


# Machines and fleet -----------------------------------------------------------------------------------


def _machine_command(action: str) -> Any:
    verbs = {
        "drain": "Drain: jobs on it finish, nothing new is placed.",
        "fail": "Mark failed: never allocated until restored.",
        "restore": "Restore: allocatable again.",
    }

    def command(
        machine_id: Annotated[str, typer.Argument(help="Machine id, e.g. pod0000-m03.")],
        reason: Annotated[str | None, typer.Option(help="Why (shown on the fleet map).")] = None,
        url: UrlOpt = None,
        key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        with connect(url, key, as_json) as client:
            m = getattr(client, f"{action}_machine")(machine_id, reason=reason)
        if as_json:
            print_json(m)
        else:
            show(f"{m.id}: {m.health}" + (f" ({m.reason})" if m.reason else ""))

    command.__doc__ = verbs[action]
    command.__name__ = action
    return command


for _action in ("drain", "fail", "restore"):
    machines_app.command(_action)(_machine_command(_action))


@racks_app.command("list")
def racks_list(url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """The racks, their PODs and servers, and how many machines of each are up, draining, failed."""
    with connect(url, key, as_json) as client:
        r = client.racks()
    if as_json:
        print_json(r)
        return
    rows = []
    for rack in r.racks:
        for unit in rack.units:
            health = ", ".join(f"{n} {state}" for state, n in unit.machines.items() if n)
            label = unit.model or unit.layout
            rows.append((rack.id, unit.id, unit.machine_type, label, unit.ipus, health))
    show(table(None, ["RACK", "UNIT", "TYPE", "LAYOUT", "IPUS", "MACHINES"], rows))


@racks_app.command("add")
def racks_add(
    machine_type: Annotated[str, typer.Argument(help=f"Machine type of its PODs: {', '.join(POD_TYPES)}.")],
    layout: Annotated[str, typer.Option(help="pod64 (16 machines) or pod16 (4 machines).")] = "pod64",
    pods: Annotated[int, typer.Option(help="PODs in the rack: 1 or 2 POD64s, 1 POD16.", min=1, max=2)] = 1,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a rack of PODs to the running fleet: the scheduler places on it at its next pass."""
    with connect(url, key, as_json) as client:
        rack = client.add_rack(machine_type, layout=layout, pods=pods)
    if as_json:
        print_json(rack)
    else:
        show(f"{rack.id}: " + ", ".join(f"{u.id} ({u.machine_type} {u.layout})" for u in rack.units))


def _rack_health_command(action: str) -> Any:
    verbs = {
        "drain": "Drain every machine of a rack: jobs finish, nothing new is placed (retire it after).",
        "restore": "Restore every machine of a rack.",
    }

    def command(
        rack_id: Annotated[str, typer.Argument(help="Rack id, e.g. rack0002.")],
        reason: Annotated[str | None, typer.Option(help="Why (shown on the fleet map).")] = None,
        url: UrlOpt = None,
        key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        with connect(url, key, as_json) as client:
            r = getattr(client, f"{action}_rack")(rack_id, reason=reason)
        if as_json:
            print_json(r)
        else:
            show(f"{r.rack}: {len(r.machines)} machines {r.health}")

    command.__doc__ = verbs[action]
    command.__name__ = action
    return command


for _action in ("drain", "restore"):
    racks_app.command(_action)(_rack_health_command(_action))


@racks_app.command("retire")
def racks_retire(
    rack_id: Annotated[str, typer.Argument(help="Rack id, e.g. rack0002.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Retire a drained rack for good (refused while any of its IPUs is in a live partition)."""
    with connect(url, key, as_json) as client:
        r = client.retire_rack(rack_id)
    if as_json:
        print_json(r)
    else:
        show(f"{rack_id} retired: {', '.join(r.retired)}")


@servers_app.command("add")
def servers_add(
    model: Annotated[str, typer.Argument(help=f"Server model: {', '.join(SERVER_MODELS)}.")],
    count: Annotated[int, typer.Option(help="How many.", min=1, max=64)] = 1,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add IPU servers to the running fleet (they fill the last server rack first)."""
    with connect(url, key, as_json) as client:
        added = client.add_servers(model, count=count)
    if as_json:
        print_json(added)
    else:
        show("added " + ", ".join(f"{u.id} ({u.model})" for u in added.servers))


@servers_app.command("retire")
def servers_retire(
    unit_id: Annotated[str, typer.Argument(help="Server id (srv0004) or POD id (pod0003).")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Retire a drained server (or POD) for good: drain it first with `admin machines drain srv0004`."""
    with connect(url, key, as_json) as client:
        r = client.retire_unit(unit_id)
    if as_json:
        print_json(r)
    else:
        show(f"retired {', '.join(r.retired)}")


SYMBOLS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def fleet_map(fleet: Fleet) -> tuple[list[str], list[tuple[str, str, str, str]]]:
    """One line per POD (16 or 4 machines of 4 IPUs) or server (its 16 IPUs, a pair per C2 card).
    A letter per partition, `.` free, `x` failed, `~` free on a draining machine; and the legend."""
    symbol: dict[str, str] = {}
    legend: list[tuple[str, str, str, str]] = []
    lines = []
    for pod in fleet.pods:
        cells: list[str] = []
        for m in pod.machines:
            chars = []
            for ipu in m.ipus:
                if ipu.partition:
                    if ipu.partition not in symbol:
                        symbol[ipu.partition] = SYMBOLS[len(symbol) % len(SYMBOLS)]
                        legend.append(
                            (symbol[ipu.partition], ipu.partition, ipu.kind or "-", ipu.tenant or "-")
                        )
                    chars.append(symbol[ipu.partition])
                elif m.health == "failed":
                    chars.append("x")
                elif m.health == "draining":
                    chars.append("~")
                else:
                    chars.append(".")
            if pod.layout == "server":
                cells.extend("".join(chars[i : i + 2]) for i in range(0, len(chars), 2))
            else:
                cells.append("".join(chars))
        kind = pod.model or pod.machine_type
        lines.append(f"{pod.id} {kind:<8} " + " ".join(cells))
    return lines, legend


@app.command("fleet")
def fleet(
    pods: Annotated[int, typer.Option(help="How many PODs and servers to show.", min=1, max=1024)] = 64,
    pod_from: Annotated[int, typer.Option(help="First POD or server index.", min=0)] = 0,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The fleet as a map: each POD as its machines x 4 IPUs, each server as its 8 cards x 2 IPUs, who
    holds what, what is down."""
    with connect(url, key, as_json) as client:
        f = client.fleet(pod_from=pod_from, pods=pods)
    if as_json:
        print_json(f)
        return
    s = f.summary
    frag = s.get("fragmentation") or {}
    out = console()
    live = s.get("live_partitions", 0)
    parts = [f"{s.get('ipus', '-')} IPUs", f"{s.get('free_ipus', '-')} free"]
    parts.append(f"{live} partition{'' if live == 1 else 's'}")
    for kind in s.get("by_machine_type") or []:
        free = f"{kind['free_ipus']:,}/{kind['ipus']:,}"
        parts.append(f"{kind['machine_type']} {free} free, largest {kind['largest_free']}")
    if frag.get("head_size"):
        parts.append(f"{frag.get('stranded_ipus')} IPUs stranded for {frag['head_size']}-IPU jobs")
    out.print(", ".join(parts), markup=False)
    lines, legend = fleet_map(f)
    for line in lines:
        out.print(line, markup=False)
    out.print("legend: . free  ~ draining  x failed", markup=False)
    total = s.get("pods")
    if f.pods and total and len(f.pods) < total:
        first, last = f.pods[0].id, f.pods[-1].id
        out.print(
            f"showing {first} to {last} of {total:,} PODs and servers (--pod-from, --pods); "
            "partitions and machines not up below are those on the pods shown",
            markup=False,
        )
    if legend:
        show(table(None, ["", "PARTITION", "KIND", "TENANT"], legend))
    down = [(m.id, m.health, m.reason) for p in f.pods for m in p.machines if m.health != "up"]
    if down:
        show(table("machines not up", ["MACHINE", "HEALTH", "REASON"], down))


@app.command("usage")
def usage(
    csv: Annotated[bool, typer.Option("--csv", help="Print CSV (one row per tenant).")] = False,
    since: Annotated[str | None, typer.Option(help="From this time, ISO 8601.")] = None,
    until: Annotated[str | None, typer.Option(help="Until this time, ISO 8601.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Usage across tenants."""
    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    with connect(url, key, as_json) as client:
        if csv:
            typer.echo(client.admin_usage_csv(since=start, until=end), nl=False)
            return
        u = client.admin_usage(since=start, until=end)
    if as_json:
        print_json(u)
        return
    rows = [
        (
            t.name,
            t.tenant_id,
            t.plan,
            f"{t.quota_ipu_hours:,.1f}",
            f"{t.used_ipu_hours:,.6f}",
            f"{t.reserved_ipu_hours:,.6f}",
        )
        for t in u.tenants
    ]
    show(table(None, ["TENANT", "ID", "PLAN", "QUOTA H", "USED H", "RESERVED H"], rows))
    if u.by_workload:
        show(
            table(
                "by workload",
                ["WORKLOAD", "IPU-HOURS"],
                [(w.workload, w.ipu_hours) for w in u.by_workload],
            )
        )
