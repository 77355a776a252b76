"""Hand a job its partition the way V-IPU hands one to a Poplar program.

A Poplar program finds its partition through `IPUOF_VIPU_API_HOST`, `IPUOF_VIPU_API_PORT`,
`IPUOF_VIPU_API_PARTITION_ID` and `IPUOF_VIPU_API_GCD_ID`, and its IPUs through the IPUoF
configuration file at `IPUOF_CONFIG_PATH`. The host agent gives each attempt exactly these, and the
attempt's log shows them. Beside the configuration, in the attempt's own directory (mode 0700), it
writes `vipu-cli.hcl`: the V-IPU endpoint's address and the attempt's short-lived key
(scheduler/services/capacity/attempt_keys.py), which `vipu`, `gc-info` and `gc-monitor` read. The key is in
that file only, never in the environment or the log, and stops working when the attempt ends; the
directory is removed then.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from scheduler.services.capacity import attempt_keys
from scheduler.settings import Settings, write_private
from vipu import ipuof

log = logging.getLogger("ipucloud.agent")

CONFIG_NAME = "ipuof.conf"
CLI_CONFIG_NAME = "vipu-cli.hcl"


def attempt_dir(settings: Settings, attempt_id: int) -> Path:
    return (settings.data_dir / "attempts" / str(attempt_id)).resolve()


def environment(
    settings: Settings, partition: str, gcd: int = 0, config_path: Path | None = None
) -> dict[str, str]:
    env = {
        "IPUOF_VIPU_API_HOST": settings.vipu_api_host,
        "IPUOF_VIPU_API_PORT": str(settings.vipu_api_port),
        "IPUOF_VIPU_API_PARTITION_ID": partition,
        "IPUOF_VIPU_API_GCD_ID": str(gcd),
    }
    if config_path is not None:
        env["IPUOF_CONFIG_PATH"] = str(config_path)
    return env


def cli_config(*, host: str, port: int, user: str, key: str, partition: str, gcd: int) -> str:
    """`vipu-cli.hcl`: the V-IPU CLI's settings, one `name = value` per line (HCL attributes)."""
    return (
        "# Written by the ipucloud host agent for one attempt; its key stops working when the attempt ends.\n"
        f'api-host = "{host}"\n'
        f"api-port = {port}\n"
        f'api-user-id = "{user}"\n'
        f'api-access-key = "{key}"\n'
        f'partition = "{partition}"\n'
        f"gcd = {gcd}\n"
    )


def write_attempt_files(
    settings: Settings,
    *,
    attempt_id: int,
    epoch: int,
    tenant_id: str,
    partition: str,
    gcd_ipus: list[str],
    gcds: int,
    gcd: int,
    machine_type: str,
) -> Path:
    """Write the attempt's IPUoF configuration and `vipu-cli.hcl`; returns the configuration's path."""
    directory = attempt_dir(settings, attempt_id)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    config = ipuof.ipuof_config(
        partition=partition, own=gcd_ipus, gcds=gcds, gcd=gcd, machine_type=machine_type
    )
    path = directory / CONFIG_NAME
    write_private(path, json.dumps(config, indent=2) + "\n")
    key = attempt_keys.issue(secret=settings.secret(), attempt_id=attempt_id, epoch=epoch)
    write_private(
        directory / CLI_CONFIG_NAME,
        cli_config(
            host=settings.vipu_api_host,
            port=settings.vipu_api_port,
            user=tenant_id,
            key=key,
            partition=partition,
            gcd=gcd,
        ),
    )
    return path


def remove_attempt_files(settings: Settings, attempt_id: int) -> None:
    try:
        shutil.rmtree(attempt_dir(settings, attempt_id), ignore_errors=True)
    except OSError as exc:  # bookkeeping only: the key has stopped working whatever happens here
        log.warning("could not remove the files of attempt %d: %s", attempt_id, exc)
