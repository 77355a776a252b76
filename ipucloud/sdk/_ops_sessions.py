"""Sessions: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk._ops_common import V1, _drop_none, _page, seg
from ipucloud.sdk.models import Page, Session


class SessionOps:
    """Interactive sessions: start, read, change, end."""

    @operation
    def start_session(
        self,
        *,
        ipus: int,
        machine: str | None = None,
        max_duration_s: int | None = None,
        idle_timeout_s: int | None = None,
        gcds: int | None = None,
        name: str | None = None,
    ) -> Call[Session]:
        """Hold a partition: the session queues like a job, then its jobs (`submit_job(session=id)`)
        start at once. Durations in cluster seconds; the plan sets the defaults and the ceiling."""
        body = _drop_none(
            ipus=ipus,
            machine=machine,
            max_duration_s=max_duration_s,
            idle_timeout_s=idle_timeout_s,
            gcds=gcds,
            name=name,
        )
        return Call("POST", f"{V1}/sessions", model(Session), json=body)

    @operation
    def get_session(self, session_id: str) -> Call[Session]:
        """A session of yours by id: its state, partition, jobs and what it has cost."""
        return Call("GET", f"{V1}/sessions/{seg(session_id)}", model(Session))

    @operation
    def list_sessions(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Call[Page[Session]]:
        """One page of the caller's sessions, newest first."""
        params = {"state": state, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/sessions", _page(Session), params=params)

    @paginated
    def iter_sessions(self, *, state: str | None = None, page_size: int = 50) -> Pager[Session]:
        """Every session of your tenant, fetched page by page."""
        return lambda cursor: SessionOps.list_sessions.build(
            self, state=state, limit=page_size, cursor=cursor
        )

    @operation
    def change_session(
        self, session_id: str, *, max_duration_s: int | None = None, idle_timeout_s: int | None = None
    ) -> Call[Session]:
        """Give a session a longer maximum duration (a total from its start, reserved from the grant)
        or another idle timeout; repeating a change is harmless."""
        body = _drop_none(max_duration_s=max_duration_s, idle_timeout_s=idle_timeout_s)
        return Call("PATCH", f"{V1}/sessions/{seg(session_id)}", model(Session), json=body)

    @operation
    def end_session(self, session_id: str) -> Call[Session]:
        """End a session: its running jobs stop, its hold is billed up to now."""
        return Call("DELETE", f"{V1}/sessions/{seg(session_id)}", model(Session))
