"""Hand a job its partition the way V-IPU hands one to a Poplar program.

A Poplar program finds its partition through `IPUOF_VIPU_API_HOST`, `IPUOF_VIPU_API_PORT`,
`IPUOF_VIPU_API_PARTITION_ID` and `IPUOF_VIPU_API_GCD_ID`. The host agent gives each attempt
exactly these, and the attempt's log shows them: they are what the tenant's program would see,
and nothing of the host that runs it.
"""

from __future__ import annotations

from scheduler.settings import Settings


def environment(settings: Settings, partition: str, gcd: int = 0) -> dict[str, str]:
    return {
        "IPUOF_VIPU_API_HOST": settings.vipu_api_host,
        "IPUOF_VIPU_API_PORT": str(settings.vipu_api_port),
        "IPUOF_VIPU_API_PARTITION_ID": partition,
        "IPUOF_VIPU_API_GCD_ID": str(gcd),
    }
