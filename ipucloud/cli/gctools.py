"""`ipucloud gc-info` and `ipucloud gc-monitor`: the installed tools' commands (ipucloud/gctools.py) in
the `ipucloud` CLI, with the same flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ipucloud.gctools import DEFAULT_TIMEOUT_S, gc_info_render, monitor, run

HostOpt = Annotated[str | None, typer.Option("--api-host", help="The V-IPU endpoint's host.")]
PortOpt = Annotated[int | None, typer.Option("--api-port", help="The V-IPU endpoint's port (8090).")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-access-key", help="An ipucloud API key or an attempt's key.")
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="A vipu-cli.hcl to read the above from.")]
PartitionOpt = Annotated[
    str | None, typer.Option("--partition", help="This partition (default: IPUOF_VIPU_API_PARTITION_ID).")
]
AllOpt = Annotated[bool, typer.Option("--all-partitions", help="Every partition the key may see.")]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the endpoint.", min=0.1, max=60)
]


def gc_info(
    list_devices_flag: Annotated[
        bool, typer.Option("--list-devices", "-l", help="List the devices (the default).")
    ] = False,
    device_info_flag: Annotated[
        bool, typer.Option("--device-info", "-i", help="Print the attributes of the device given by -d.")
    ] = False,
    device: Annotated[
        int, typer.Option("--device-id", "-d", help="The device for --device-info.", min=0)
    ] = 0,
    ipu_count: Annotated[bool, typer.Option("--ipu-count", help="Print how many IPUs there are.")] = False,
    partition: PartitionOpt = None,
    all_partitions: AllOpt = False,
    api_host: HostOpt = None,
    api_port: PortOpt = None,
    api_access_key: KeyOpt = None,
    config: ConfigOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Graphcore's gc-info: the devices of your partition (single IPUs, then multi-IPU groups)."""
    render = gc_info_render(
        list_devices_flag=list_devices_flag,
        device_info_flag=device_info_flag,
        device=device,
        ipu_count=ipu_count,
    )
    code = run(
        "gc-info",
        render,
        api_host=api_host,
        api_port=api_port,
        api_access_key=api_access_key,
        config=config,
        partition=partition,
        all_partitions=all_partitions,
        timeout=timeout,
    )
    raise typer.Exit(code)


def gc_monitor(
    partition: PartitionOpt = None,
    all_partitions: AllOpt = False,
    api_host: HostOpt = None,
    api_port: PortOpt = None,
    api_access_key: KeyOpt = None,
    config: ConfigOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Graphcore's gc-monitor: your partition's IPUs and the processes attached to them (the attempts
    running there: job, user, progress)."""
    code = run(
        "gc-monitor",
        monitor,
        api_host=api_host,
        api_port=api_port,
        api_access_key=api_access_key,
        config=config,
        partition=partition,
        all_partitions=all_partitions,
        timeout=timeout,
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("gc-info")(gc_info)
    app.command("gc-monitor")(gc_monitor)
