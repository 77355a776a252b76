"""`ipucloud vipu`: V-IPU's verbs and `|` tables, against the V-IPU endpoint or the cloud's admin API.

Given the V-IPU CLI's connection (its flags `--api-host`, `--api-port`, `--api-user-id`,
`--api-access-key`, a `--config` file, the `VIPU_CLI_API_*` variables, or inside an attempt the
`vipu-cli.hcl` beside `IPUOF_CONFIG_PATH`), it talks to the V-IPU endpoint (`ipucloud vipu-server`)
as Graphcore's `vipu` does, with a tenant's key, an admin's or an attempt's; the flags go anywhere on
the line, as `vipu`'s do. Without them it talks to the cloud's admin API (`--url`, `--key`).

Output follows the V-IPU CLI (`vipu list partitions`, `vipu create partition p1 --size 16`):
`|`-separated tables between dashed rules, and `<verb> partition (<id>): success.` on changes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    Exit,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    fail,
    print_json,
)
from ipucloud.sdk import Partition
from ipucloud.vipu_client import (
    Connection,
    VipuClient,
    VipuConfigError,
    VipuError,
    VipuUnreachable,
    resolve,
)
from vipu.machine_types import MACHINE_TYPE_NAMES

# The V-IPU CLI's global flags that take a value; `vipu` accepts them before or after the verb.
_GLOBAL_VALUED = ("--api-host", "--api-port", "--api-user-id", "--api-access-key", "--config")
_GLOBAL_FLAGS = ("--server-version",)


def hoist_globals(args: Sequence[str]) -> list[str]:
    """Move the V-IPU global flags (and their values) to the front, wherever they were given."""
    front: list[str] = []
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        name = arg.split("=", 1)[0]
        if name in _GLOBAL_VALUED:
            front.append(arg)
            if "=" not in arg:
                nxt = next(it, None)
                if nxt is not None:
                    front.append(nxt)
        elif arg in _GLOBAL_FLAGS:
            front.append(arg)
        else:
            rest.append(arg)
    return front + rest


class VipuGroup(TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_globals(args))


app = typer.Typer(
    cls=VipuGroup,
    help="Virtual-IPU partitions with V-IPU's verbs: against the V-IPU endpoint when given the V-IPU CLI's "
    "flags, config file or variables (any key), else the cloud's admin API (admin key).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
create_app = typer.Typer(help="Create a partition.", no_args_is_help=True)
list_app = typer.Typer(help="List partitions, allocations or IPU attributes.", no_args_is_help=True)
get_app = typer.Typer(help="Show a partition.", no_args_is_help=True)
remove_app = typer.Typer(help="Remove a partition.", no_args_is_help=True)
reset_app = typer.Typer(help="Reset a partition's IPUs.", no_args_is_help=True)
app.add_typer(create_app, name="create")
app.add_typer(list_app, name="list")
app.add_typer(get_app, name="get")
app.add_typer(remove_app, name="remove")
app.add_typer(reset_app, name="reset")


@dataclass(frozen=True)
class VipuGlobals:
    api_host: str | None = None
    api_port: int | None = None
    api_user_id: str | None = None
    api_access_key: str | None = None
    config: Path | None = None

    @property
    def given(self) -> bool:
        """The V-IPU endpoint was asked for: by a flag, a config file, or the V-IPU CLI's variables
        (inside an attempt, the files its host agent wrote)."""
        if any(v is not None for v in (self.api_host, self.api_port, self.api_user_id, self.api_access_key)):
            return True
        if self.config is not None:
            return True
        env = os.environ
        return bool(
            env.get("VIPU_CLI_API_HOST") or env.get("VIPU_CLI_API_ACCESS_KEY") or env.get("IPUOF_CONFIG_PATH")
        )


@app.callback()
def vipu_globals(
    ctx: typer.Context,
    api_host: Annotated[
        str | None, typer.Option("--api-host", help="The V-IPU endpoint's host (VIPU_CLI_API_HOST).")
    ] = None,
    api_port: Annotated[
        int | None,
        typer.Option(
            "--api-port", help="The V-IPU endpoint's port, 8090 (VIPU_CLI_API_PORT).", min=1, max=65535
        ),
    ] = None,
    api_user_id: Annotated[
        str | None,
        typer.Option("--api-user-id", help="Your user id (VIPU_CLI_API_USER_ID); shown, not checked."),
    ] = None,
    api_access_key: Annotated[
        str | None,
        typer.Option(
            "--api-access-key", help="An ipucloud API key or an attempt's key (VIPU_CLI_API_ACCESS_KEY)."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="A vipu-cli.hcl with api-host, api-port, api-access-key ..."),
    ] = None,
    server_version: Annotated[
        bool, typer.Option("--server-version", help="Print the V-IPU endpoint's version and exit.")
    ] = False,
) -> None:
    ctx.obj = VipuGlobals(api_host, api_port, api_user_id, api_access_key, config)
    if server_version:
        _print_version(ctx.obj)
        raise typer.Exit(0)


def _globals(ctx: typer.Context) -> VipuGlobals:
    obj = ctx.find_object(VipuGlobals)
    return obj if obj is not None else VipuGlobals()


def _vipu_fail(message: str, code: Exit, body: dict[str, Any] | None, as_json: bool) -> NoReturn:
    fail(message, code, problem=body, as_json=as_json)


_EXIT_BY_STATUS = {400: Exit.USAGE, 401: Exit.AUTH, 403: Exit.AUTH, 404: Exit.NOT_FOUND, 409: Exit.CONFLICT,
                   413: Exit.USAGE, 422: Exit.USAGE}  # fmt: skip


@contextmanager
def endpoint(g: VipuGlobals, as_json: bool = False, timeout: float = 10.0) -> Iterator[VipuClient]:
    """A client of the V-IPU endpoint; its errors become one line on stderr and the exit code."""
    try:
        conn: Connection = resolve(
            api_host=g.api_host,
            api_port=g.api_port,
            api_user_id=g.api_user_id,
            api_access_key=g.api_access_key,
            config=g.config,
        )
    except VipuConfigError as exc:
        _vipu_fail(str(exc), Exit.USAGE, {"detail": str(exc)}, as_json)
    client = VipuClient(conn, timeout=timeout)
    try:
        yield client
    except VipuError as exc:
        cause = f", {exc.reason}" if exc.reason else ""
        _vipu_fail(
            f"{exc.detail} ({exc.code}{cause})",
            _EXIT_BY_STATUS.get(exc.status, Exit.UNAVAILABLE),
            exc.body,
            as_json,
        )
    except VipuUnreachable as exc:
        _vipu_fail(str(exc), Exit.UNAVAILABLE, {"detail": str(exc), "code": "UNAVAILABLE"}, as_json)
    finally:
        client.close()


def _print_version(g: VipuGlobals) -> None:
    with endpoint(g) as client:
        v = client.call("GetVersion")
    typer.echo(
        f"version: {v['version']} (ipucloud {v['server']}), host: {client.conn.host}:{client.conn.port}"
    )


@app.command("version")
def version(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The V-IPU endpoint's API version (`vipu --server-version`)."""
    g = _globals(ctx)
    if as_json:
        with endpoint(g, as_json) as client:
            print_json(client.call("GetVersion"))
        return
    _print_version(g)


COLUMNS = (
    "Partition ID",
    "Kind",
    "Num. IPUs",
    "Num. GCDs",
    "Machine",
    "Reconfigurable",
    "Tenant",
    "Job",
    "IPUs",
    "State",
)

_IPU = re.compile(r"^(pod\d+)-m(\d+)-i(\d+)$")


def ipu_span(ipus: Sequence[str]) -> str:
    """`pod0000-m00-i0..pod0000-m03-i3` for a contiguous run; the first and last otherwise."""
    if not ipus:
        return "-"
    if len(ipus) == 1:
        return ipus[0]
    return f"{ipus[0]}..{ipus[-1]}"


def row(p: Partition) -> list[str]:
    return [
        p.id,
        p.kind or "-",
        str(p.size),
        str(p.gcds),
        p.machine_type or "-",
        "true" if p.reconfigurable else "false",
        p.tenant or "-",
        ", ".join(p.jobs) if p.jobs else (p.job or "-"),
        ipu_span(p.ipus),
        (p.state or "active").upper(),
    ]


def pipe_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "|".join(f" {cell:<{w}} " for cell, w in zip(cells, widths, strict=True)).rstrip()

    rule = "-" * (sum(widths) + 3 * len(widths) - 1)
    return "\n".join([rule, line(columns), rule, *(line(r) for r in rows), rule])


VIPU_COLUMNS = (
    "Partition ID",
    "Cluster",
    "Num. IPUs",
    "Num. GCDs",
    "Reconfigurable",
    "State",
    "Kind",
    "Jobs",
)


def vipu_row(p: dict[str, Any]) -> list[str]:
    jobs = [x["job_id"] or "another tenant's" for g in p.get("gcds", []) for x in g["processes"]]
    return [
        p["id"],
        p.get("cluster_id") or "-",
        str(p["size"]),
        str(p["num_gcds"]),
        "true" if p.get("reconfigurable") else "false",
        p["state"],
        p.get("kind") or "-",
        ", ".join(jobs) or "-",
    ]


def _api_only(flag: str, value: object) -> None:
    if value:
        fail(f"{flag} is the cloud's admin API's; the V-IPU endpoint does not take it", Exit.USAGE)


@create_app.command("partition")
def create_partition(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    size: Annotated[int, typer.Option(help="IPUs: a power of two.", min=1)],
    machine: Annotated[
        str | None, typer.Option(help=f"{', '.join(MACHINE_TYPE_NAMES)} (default: any).")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Reserve it for this tenant id (admin API).")] = None,
    num_gcds: Annotated[
        int,
        typer.Option("--num-gcds", help="Graph compile domains (GCDs): it runs one job in each.", min=1),
    ] = 1,
    reconfigurable: Annotated[
        bool, typer.Option(help="Allow splitting it anew (`vipu reset partition NAME --num-gcds N`).")
    ] = False,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Carve a partition (`vipu create partition p1 --size 16`); with a tenant's key on the V-IPU
    endpoint it starts a session, which waits for IPUs like a job."""
    g = _globals(ctx)
    if g.given and url is None and key is None:  # --url/--key ask for the admin API
        _api_only("--tenant", tenant)
        with endpoint(g, as_json) as client:
            made = client.call(
                "CreatePartition",
                {
                    "requirements": {
                        "id": name,
                        "size": size,
                        "num_gcds": num_gcds,
                        "reconfigurable": reconfigurable,
                        "machine_type": machine,
                    }
                },
            )
        if as_json:
            print_json(made)
            return
        typer.echo(f"create partition ({made['partition_id']}): success.")
        if made["state"] == "PS_PENDING":
            typer.echo(
                f"{made['partition_id']} is a session waiting for {size} IPUs ({made['state']}); "
                f"`get partition {name}` shows when it is active."
            )
        return
    with connect(url, key, as_json) as client:
        part = client.create_partition(
            name, size=size, machine_type=machine, tenant=tenant, gcds=num_gcds, reconfigurable=reconfigurable
        )
    if as_json:
        print_json(part)
    else:
        typer.echo(f"create partition ({part.id}): success.")


def _list(ctx: typer.Context, tenant: str | None, url: str | None, key: str | None, as_json: bool) -> None:
    g = _globals(ctx)
    if g.given and url is None and key is None:  # --url/--key ask for the admin API
        _api_only("--tenant", tenant)
        with endpoint(g, as_json) as client:
            parts = client.call("ListPartitions")["partitions"]
        if as_json:
            print_json(parts)
        else:
            typer.echo(pipe_table(VIPU_COLUMNS, [vipu_row(p) for p in parts]))
        return
    with connect(url, key, as_json) as client:
        api_parts = list(client.iter_partitions(tenant=tenant))
    if as_json:
        print_json(api_parts)
    else:
        typer.echo(pipe_table(COLUMNS, [row(p) for p in api_parts]))


@list_app.command("partitions")
def list_partitions(
    ctx: typer.Context,
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant's reserved partitions (admin API).")
    ] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live partitions (`vipu list partitions`)."""
    _list(ctx, tenant, url, key, as_json)


@list_app.command("partition", hidden=True)
def list_partition(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's reserved partitions.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Same as `list partitions`."""
    _list(ctx, tenant, url, key, as_json)


@list_app.command("allocations")
def list_allocations(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Your allocations and their machines (`vipu list allocations`; V-IPU endpoint)."""
    with endpoint(_globals(ctx), as_json) as client:
        allocations = client.call("ListAllocations")["allocations"]
    if as_json:
        print_json(allocations)
        return
    rows = [[a["id"], " ".join(a["spec"]["agent_ids"])] for a in allocations]
    typer.echo(pipe_table(("Allocation ID", "Agents"), rows))


@list_app.command("ipu-attrs")
def list_ipu_attrs(
    ctx: typer.Context,
    partition: Annotated[str | None, typer.Option(help="Only this partition's IPUs.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Attributes of the IPUs you may use (`vipu list ipu-attrs`; V-IPU endpoint)."""
    body = {"partition_id": partition} if partition else {}
    with endpoint(_globals(ctx), as_json) as client:
        attrs = client.call("ListIpuAttributes", body)["ipu_attributes"]
    if as_json:
        print_json(attrs)
        return
    rows: list[list[str]] = []
    for ipu in attrs:
        for i, (name, value) in enumerate(sorted(ipu["attributes"].items())):
            rows.append([ipu["agent_id"] if i == 0 else "", str(ipu["ipu"]) if i == 0 else "", name, value])
    typer.echo(pipe_table(("Agent", "IPU", "Attribute", "Value"), rows))


@get_app.command("partition")
def get_partition(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    ipu_configs: Annotated[
        bool, typer.Option("--ipu-configs", help="Print its IPUoF configuration (V-IPU endpoint).")
    ] = False,
    gcd: Annotated[int, typer.Option("--gcd", help="The GCD whose configuration to print.", min=0)] = 0,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One partition, with every IPU it holds."""
    g = _globals(ctx)
    if g.given and url is None and key is None:  # --url/--key ask for the admin API
        with endpoint(g, as_json) as client:
            if ipu_configs:
                conf = client.call("GetPartitionIpuofConfig", {"partition_id": name, "gcd_id": {"id": gcd}})
                typer.echo(json.dumps(conf["ipuof_config"], indent=2))
                return
            status = client.call("GetPartitionStatus", {"partition_id": name})["status"]
        if as_json:
            print_json(status)
            return
        typer.echo(pipe_table(VIPU_COLUMNS, [vipu_row(status)]))
        if status.get("reason"):
            typer.echo(f"{status['state']}: {status['reason']}")
        per_gcd = max(1, status["size"] // max(1, status["num_gcds"]))
        typer.echo(
            pipe_table(
                ("IPU ID", "Machine", "Index", "GCD"),
                [[*_ipu_row(i), str(n // per_gcd)] for n, i in enumerate(status["ipus"])],
            )
        )
        return
    if ipu_configs:
        fail("--ipu-configs needs the V-IPU endpoint (--api-host, --config or VIPU_CLI_API_HOST)", Exit.USAGE)
    with connect(url, key, as_json) as client:
        part = client.get_partition(name)
    if as_json:
        print_json(part)
        return
    typer.echo(pipe_table(COLUMNS, [row(part)]))
    typer.echo(pipe_table(("IPU ID", "Machine", "Index"), [_ipu_row(i) for i in part.ipus]))


def _ipu_row(ipu: str) -> list[str]:
    m = _IPU.match(ipu)
    if m is None:
        return [ipu, ipu.rsplit("-i", 1)[0], ipu.rsplit("-i", 1)[-1]]
    return [ipu, f"{m.group(1)}-m{m.group(2)}", m.group(3)]


@remove_app.command("partition")
def remove_partition(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Free a partition's IPUs (refused while a job runs in it); a tenant's ends its session."""
    g = _globals(ctx)
    if g.given and url is None and key is None:  # --url/--key ask for the admin API
        with endpoint(g, as_json) as client:
            gone = client.call("RemovePartition", {"partition_id": name})
        if as_json:
            print_json(gone)
        else:
            typer.echo(f"remove partition ({gone['partition_id']}): success.")
        return
    with connect(url, key, as_json) as client:
        part = client.remove_partition(name)
    if as_json:
        print_json(part)
    else:
        typer.echo(f"remove partition ({part.id}): success.")


@reset_app.command("partition")
def reset_partition(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    num_gcds: Annotated[
        int | None,
        typer.Option(
            "--num-gcds",
            help="Split a reconfigurable partition anew into this many graph compile domains "
            "(refused while a job runs in it).",
            min=1,
        ),
    ] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reset a partition's IPUs; jobs running on it lose their attempts (unbilled) and run again."""
    g = _globals(ctx)
    if g.given and url is None and key is None:  # --url/--key ask for the admin API
        body: dict[str, Any] = {"partition_id": name}
        if num_gcds is not None:
            body["num_gcds"] = num_gcds
        with endpoint(g, as_json) as client:
            done = client.call("ResetPartition", body)
        if as_json:
            print_json(done)
            return
        typer.echo(f"reset partition ({done['partition_id']}): success.")
        if num_gcds is not None:
            typer.echo(f"{done['partition_id']} now has {done['num_gcds']} graph compile domain(s).")
        for job in done["interrupted_jobs"]:
            typer.echo(f"job {job} was interrupted and goes back to the queue.")
        return
    with connect(url, key, as_json) as client:
        result = client.reset_partition(name, gcds=num_gcds)
    if as_json:
        print_json(result)
        return
    typer.echo(f"reset partition ({result.partition.id}): success.")
    if num_gcds is not None:
        typer.echo(f"{result.partition.id} now has {result.partition.gcds} graph compile domain(s).")
    for job in result.interrupted_jobs:
        typer.echo(f"job {job} was interrupted and goes back to the queue.")
