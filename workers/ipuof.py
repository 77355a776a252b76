"""Hand a job its partition the way V-IPU hands one to a Poplar program.

A Poplar program finds its partition through `IPUOF_VIPU_API_HOST`, `IPUOF_VIPU_API_PORT`,
`IPUOF_VIPU_API_PARTITION_ID` and `IPUOF_VIPU_API_GCD_ID`, and its IPUs through the IPUoF
configuration file at `IPUOF_CONFIG_PATH`. The host agent gives each attempt exactly these, and the
attempt's log shows them. Beside the configuration, in the attempt's own directory (mode 0700), it
writes `vipu-cli.hcl`: the V-IPU endpoint's address and the attempt's short-lived key
(scheduler/services/capacity/attempt_keys.py), which `vipu`, `gc-info` and `gc-monitor` read. The key is in
that file only, never in the environment or the log, and stops working when the attempt ends; the
directory is removed then.

The attempts' directories live in memory by default (`/dev/shm`, in a directory private to this user
and data directory; `IPUCLOUD_RUNTIME_DIR` names another): the files hold a key and live only as long
as their attempt, so a disk is never the place for them, and creating a file on a disk can cost far
more than the rest of taking an attempt (`benchmarks/attempt_files.py`; docs/performance.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
from functools import lru_cache
from pathlib import Path

from scheduler.services.capacity import attempt_keys
from scheduler.settings import Settings, write_private
from vipu import ipuof

log = logging.getLogger("ipucloud.agent")

CONFIG_NAME = "ipuof.conf"
CLI_CONFIG_NAME = "vipu-cli.hcl"


SHM = Path("/dev/shm")


def runtime_root(settings: Settings) -> Path:
    """The directory holding every running attempt's directory: `IPUCLOUD_RUNTIME_DIR` as it is, else
    one in `/dev/shm` named by this user and the data directory (so that two clouds on one host never
    share it; mode 0700, this user's), else `<data_dir>/attempts`."""
    return _runtime_root(settings.runtime_dir, settings.data_dir)


@lru_cache(maxsize=64)
def _runtime_root(configured: Path | None, data_dir: Path) -> Path:
    if configured is not None:
        return _make_root(configured.resolve(), private=False)
    data_dir = data_dir.resolve()
    if SHM.is_dir() and os.access(SHM, os.W_OK | os.X_OK):
        digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
        try:
            return _make_root(SHM / f"ipucloud-{os.geteuid()}-{digest}", private=True)
        except OSError as exc:
            log.warning("attempt files go to the data directory, not %s: %s", SHM, exc)
    return _make_root(data_dir / "attempts", private=True)


def _make_root(path: Path, *, private: bool) -> Path:
    """Make the root `path`. A configured one (`private=False`) is the operator's, used as it is: a
    Kubernetes memory volume is root's and open to all (0777), a systemd RuntimeDirectory this user's;
    each attempt's own directory is private either way. The default one is made a directory only this
    user can enter, refusing one that is not this user's (in a shared directory such as /dev/shm
    another user could have made it, or a link of that name, first)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not private:
        return path
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory of this user's")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def attempt_dir(settings: Settings, attempt_id: int) -> Path:
    return runtime_root(settings) / str(attempt_id)


def release_runtime_root(settings: Settings) -> None:
    """Remove the default root once no attempt's directory is left in it (a stopping agent's last
    act), so that /dev/shm keeps nothing of a cloud that is gone; another agent's next attempt makes it
    again. A configured `IPUCLOUD_RUNTIME_DIR` is the operator's (a mount, systemd's
    `RuntimeDirectory`, where this process may not make it again) and is left as it is."""
    if settings.runtime_dir is not None:
        return
    try:
        os.rmdir(runtime_root(settings))
    except OSError:
        pass  # not empty (another agent of this data directory runs attempts), or already gone


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
    try:
        os.mkdir(directory, 0o700)
    except FileNotFoundError:  # the root was released since (an agent of this data directory stopped)
        _make_root(directory.parent, private=settings.runtime_dir is None)
        os.mkdir(directory, 0o700)
    except FileExistsError:  # a redelivered attempt, or one an agent that died left behind
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
