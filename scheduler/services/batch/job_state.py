"""Changes every part of a job's life shares: its event history and its end."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from scheduler.models import Job, JobEvent, JobState, Tenant, utcnow
from scheduler.services.tenancy import notifications


def add_event(
    session: Session,
    job_id: str,
    kind: str,
    message: str,
    *,
    attempt: int | None = None,
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    session.add(
        JobEvent(
            job_id=job_id, attempt=attempt, kind=kind, message=message[:2000], data=data, at=at or utcnow()
        )
    )


def finalize_job(
    *,
    session: Session,
    job: Job,
    state: JobState,
    reason: str | None,
    release: bool = True,
    events: list[dict[str, Any]] | None = None,
) -> None:
    """End a job and release whatever quota it still holds.

    `release=False` leaves the release to the caller (`release_reservation`), which an attempt's end
    does after its settle, so that the tenant's row is locked last and for as little as possible.
    `events`: append the job's event row there (the caller inserts many at once) instead of adding it.
    """
    if release:
        release_reservation(session=session, job=job)
    now = utcnow()
    job.state = state
    job.reason = reason
    job.finished_at = now
    job.updated_at = now
    message = f"{state}" + (f": {reason}" if reason else "")
    data = {"state": str(state), "reason": reason}
    notifications.job_event(session, job, f"job.{state}", key=f"{job.id}:{job.attempts}", reason=reason)
    if events is not None:
        events.append(
            {
                "job_id": job.id,
                "attempt": None,
                "kind": "state",
                "message": message[:2000],
                "data": data,
                "at": now,
            }
        )
        return
    add_event(session, job.id, "state", message, data=data, at=now)


def release_reservation(*, session: Session, job: Job) -> None:
    """Give the tenant back the quota the job still holds (its row lock is held until commit)."""
    if job.reserved_ipu_ms:
        session.execute(
            update(Tenant)
            .where(Tenant.id == job.tenant_id)
            .values(reserved_ipu_ms=Tenant.reserved_ipu_ms - job.reserved_ipu_ms)
        )
        job.reserved_ipu_ms = 0
