"""Typed views of what the API returns.

The models of answers the API describes in docs/openapi.json are generated from it
(`_schemas.py`, by scripts/gen_sdk_models.py); this module adds the SDK's own (a stream's events)
and gathers them under the names the SDK exports. Every model accepts fields it
does not know (`extra="allow"`), so a newer server never breaks an older client; known fields are
typed and validated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ipucloud.sdk import _schemas
from ipucloud.sdk._base import FINAL_STATES, SESSION_FINAL, Model, Page
from ipucloud.sdk._core import Paged
from ipucloud.sdk._schemas import *  # noqa: F403 - every generated answer, under its SDK name
from ipucloud.sdk._schemas import LogEntry, Progress

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]

__all__ = [
    "FINAL_STATES",
    "SESSION_FINAL",
    "JobState",
    "Model",
    "Page",
    "Paged",
    "StreamEvent",
    *_schemas.__all__,
]


class StreamEvent(Model):
    """One server-sent event of a job's log stream.

    `event` is `state` or `log` (a job event, with `entry`), `progress` (a snapshot, with
    `progress`) or `end` (the job reached a final state, `state` says which).
    """

    event: str
    id: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def entry(self) -> LogEntry | None:
        if self.event in ("state", "log") and "message" in self.data:
            return LogEntry.model_validate(self.data)
        return None

    @property
    def progress(self) -> Progress | None:
        return Progress.model_validate(self.data) if self.event == "progress" else None

    @property
    def state(self) -> str | None:
        return str(self.data.get("state")) if self.event == "end" else None
