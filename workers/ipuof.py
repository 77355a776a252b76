"""Hand a job its partition the way V-IPU hands one to a Poplar program.

A Poplar program finds its partition through `IPUOF_VIPU_API_HOST`, `IPUOF_VIPU_API_PORT`,
`IPUOF_VIPU_API_PARTITION_ID` and `IPUOF_VIPU_API_GCD_ID`, or a config file under
`~/.ipuof.conf.d/`. The worker writes both for each attempt, and the emulated program attaches
by reading them back, exactly as the real one would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from scheduler.services.attempts import TakenAttempt
from scheduler.settings import Settings

ENV_KEYS = (
    "IPUOF_VIPU_API_HOST",
    "IPUOF_VIPU_API_PORT",
    "IPUOF_VIPU_API_PARTITION_ID",
    "IPUOF_VIPU_API_GCD_ID",
)


def config_dir(settings: Settings) -> Path:
    return Path(settings.data_dir).resolve() / "ipuof.conf.d"


def prepare(settings: Settings, taken: TakenAttempt, gcd: int = 0) -> tuple[dict[str, str], Path]:
    env = {
        "IPUOF_VIPU_API_HOST": settings.vipu_api_host,
        "IPUOF_VIPU_API_PORT": str(settings.vipu_api_port),
        "IPUOF_VIPU_API_PARTITION_ID": taken.partition,
        "IPUOF_VIPU_API_GCD_ID": str(gcd),
    }
    directory = config_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{taken.partition}.conf"
    doc = {
        "attempt": taken.attempt_id,
        "job": taken.job_id,
        "partition": taken.partition,
        "size": taken.partition_size,
        "gcds": taken.partition_gcds,
        "machine_type": taken.machine_type,
        "ipus": taken.partition_ipus,
        **env,
    }
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)
    env["IPUOF_CONFIG_PATH"] = str(path)
    return env, path


def attach(env: dict[str, str]) -> tuple[str, int]:
    """What the program does at start-up: find its partition and GCD, preferring the environment."""
    missing = [k for k in ENV_KEYS if not env.get(k)]
    if missing:
        path = env.get("IPUOF_CONFIG_PATH")
        if not path or not Path(path).exists():
            raise RuntimeError(f"no partition: {missing} unset and no config file")
        doc = json.loads(Path(path).read_text())
        return str(doc["IPUOF_VIPU_API_PARTITION_ID"]), int(doc["IPUOF_VIPU_API_GCD_ID"])
    return env["IPUOF_VIPU_API_PARTITION_ID"], int(env["IPUOF_VIPU_API_GCD_ID"])
