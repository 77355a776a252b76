"""Typed views that more than one service builds or reads (each service's own sit next to it).

They are TypedDicts, not classes: what the API, the dashboard and the CLI read is a plain dict, and
the JSON columns store it as it is; the types say which keys there are and what they hold.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class WaitView(TypedDict):
    """Why a queued job is not running: as `Job.wait` stores it and `GET /jobs/{id}` shows it."""

    reason: str
    detail: str
    behind: NotRequired[list[str]]
    estimated_start: NotRequired[str | None]  # ISO 8601, when the policy forecasts the start
    behind_other_tenants: NotRequired[int]  # told to a tenant instead of other tenants' job ids


class RuntimeLimitView(TypedDict):
    """A plan's run-time limit per job and whether a job ends within it (with what would, if not)."""

    max_runtime_s: int
    within: bool
    detail: str | None
    predicted_runtime_s: NotRequired[float]
    fitting_steps: NotRequired[int]
    fitting_samples: NotRequired[int]
    fitting_ipus: NotRequired[int | None]
