"""Fault injection for the fault suite: a testing facility, never a feature.

`IPUCLOUD_FAULT_CRASH_JOBS=<pattern>` makes a host agent's process die (`os._exit`, no cleanup,
exactly like a segfault or the OOM killer) while it runs an attempt of a job whose name matches the
shell-style pattern, once the attempt's first meter tick is written (so the crash happens mid-job,
with time already metered that the platform must refund). It exists so that "a job that crashes its
host every time" can be tested honestly, through the real agent, broker and reconciler.

Tenants cannot reach it: it is read only from the worker's own environment, which only whoever
runs the worker sets; nothing a job or an API request carries can set or change it. A worker
started with it logs a warning at start-up, so it is never on by accident.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("ipucloud.worker")

CRASH_EXIT_CODE = 70


class FaultSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IPUCLOUD_FAULT_", extra="ignore")

    crash_jobs: str | None = Field(
        None,
        description="Testing only: the worker process dies mid-attempt on jobs whose name matches this "
        "shell-style pattern.",
    )


@lru_cache(maxsize=1)
def fault_settings() -> FaultSettings:
    return FaultSettings()


def warn_if_enabled() -> None:
    pattern = fault_settings().crash_jobs
    if pattern:
        log.warning(
            "FAULT INJECTION ON: this worker crashes on jobs named %r (IPUCLOUD_FAULT_CRASH_JOBS; "
            "a testing facility, never set it in production)",
            pattern,
        )


def crash_armed(job_name: str) -> bool:
    """Whether an attempt of this job will crash its agent (only ever when the setting names it)."""
    pattern = fault_settings().crash_jobs
    return bool(pattern) and fnmatch.fnmatchcase(job_name, pattern)


def crash(attempt_id: int) -> None:
    """Die now, without cleanup."""
    log.critical("fault injection: crashing this agent's process on attempt %d", attempt_id)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(CRASH_EXIT_CODE)
