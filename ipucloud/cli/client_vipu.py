"""`ipucloud vipu create|list|get|remove|reset partition`: V-IPU's verbs and `|` tables, over the API.

Output follows the V-IPU admin CLI (`vipu list partitions`, `vipu create partition p1 --size 16`):
`|`-separated tables between dashed rules, and `<verb> partition (<id>): success.` on changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

import typer

from ipucloud.cli.client_common import EXIT_CODES_HELP, JsonOpt, KeyOpt, UrlOpt, connect, print_json
from ipucloud.sdk import Partition
from vipu.machine_types import MACHINE_TYPE_NAMES

app = typer.Typer(
    help="Virtual-IPU partitions with V-IPU's verbs (admin key).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)
create_app = typer.Typer(help="Create a partition.", no_args_is_help=True)
list_app = typer.Typer(help="List partitions.", no_args_is_help=True)
get_app = typer.Typer(help="Show a partition.", no_args_is_help=True)
remove_app = typer.Typer(help="Remove a partition.", no_args_is_help=True)
reset_app = typer.Typer(help="Reset a partition's IPUs.", no_args_is_help=True)
app.add_typer(create_app, name="create")
app.add_typer(list_app, name="list")
app.add_typer(get_app, name="get")
app.add_typer(remove_app, name="remove")
app.add_typer(reset_app, name="reset")

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


@create_app.command("partition")
def create_partition(
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    size: Annotated[int, typer.Option(help="IPUs: a power of two.", min=1)],
    machine: Annotated[
        str | None, typer.Option(help=f"{', '.join(MACHINE_TYPE_NAMES)} (default: any).")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Reserve it for this tenant id.")] = None,
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
    """Carve a partition now (`vipu create partition p1 --size 16`)."""
    with connect(url, key, as_json) as client:
        part = client.create_partition(
            name, size=size, machine_type=machine, tenant=tenant, gcds=num_gcds, reconfigurable=reconfigurable
        )
    if as_json:
        print_json(part)
    else:
        typer.echo(f"create partition ({part.id}): success.")


def _list(tenant: str | None, url: str | None, key: str | None, as_json: bool) -> None:
    with connect(url, key, as_json) as client:
        parts = list(client.iter_partitions(tenant=tenant))
    if as_json:
        print_json(parts)
    else:
        typer.echo(pipe_table(COLUMNS, [row(p) for p in parts]))


@list_app.command("partitions")
def list_partitions(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's reserved partitions.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live partitions, job and reserved (`vipu list partitions`)."""
    _list(tenant, url, key, as_json)


@list_app.command("partition", hidden=True)
def list_partition(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's reserved partitions.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Same as `list partitions`."""
    _list(tenant, url, key, as_json)


@get_app.command("partition")
def get_partition(
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One partition, with every IPU it holds."""
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
        return [ipu, "-", "-"]
    return [ipu, f"{m.group(1)}-m{m.group(2)}", m.group(3)]


@remove_app.command("partition")
def remove_partition(
    name: Annotated[str, typer.Argument(help="The partition's id.")],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Free a partition's IPUs (refused while a job runs in it)."""
    with connect(url, key, as_json) as client:
        part = client.remove_partition(name)
    if as_json:
        print_json(part)
    else:
        typer.echo(f"remove partition ({part.id}): success.")


@reset_app.command("partition")
def reset_partition(
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
