"""Fault injection for the fault suite: a testing facility, never a feature.

`IPUCLOUD_FAULT_CRASH_JOBS=<pattern>` makes the run of every job whose name matches the shell-style
pattern crash inside its host agent, as a bug in the agent's own code would: once the attempt's first
meter tick is written (so the crash happens mid-job, with time already metered that the platform must
refund), its driver raises. The agent must end that attempt alone, unbilled, and carry on with every
other; the retry limit then stops the job. It exists so that "a job that crashes its host every time"
can be tested honestly, through the real agent, broker and reconciler. (A host agent's process dying
is tested by killing it.)

Tenants cannot reach it: it is read only from the worker's own environment, which only whoever
runs the worker sets; nothing a job or an API request carries can set or change it. A worker
started with it logs a warning at start-up, so it is never on by accident.
"""

from __future__ import annotations

import fnmatch
import logging
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("ipucloud.worker")


class FaultSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IPUCLOUD_FAULT_", extra="ignore")

    crash_jobs: str | None = Field(
        None,
        description="Testing only: the runs of jobs whose name matches this shell-style pattern crash "
        "inside their host agent mid-attempt.",
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
    return pattern is not None and pattern != "" and fnmatch.fnmatchcase(job_name, pattern)


class InjectedCrash(RuntimeError):
    """The fault the setting injects into a run."""


def crash(attempt_id: int) -> None:
    """Crash this attempt's run now."""
    log.critical("fault injection: crashing the run of attempt %d", attempt_id)
    raise InjectedCrash(f"fault injection (IPUCLOUD_FAULT_CRASH_JOBS) on attempt {attempt_id}")
