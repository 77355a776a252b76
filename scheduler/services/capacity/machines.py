"""A machine's health as admins set it, and what that does to the work on it.

Draining a machine lets what runs there finish and places nothing new on it. Failing one stops at
once every attempt on its IPUs (`interrupted`: a platform fault, never billed and not held against
the job's retry limit; the job is queued again), so a tenant is not billed for time on hardware
that is gone. The host agents driving those attempts are told over the bus.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import LIVE_ATTEMPT_STATES, Attempt, AttemptState, Ipu, IpuAssignment, Machine
from scheduler.services.batch import attempts
from scheduler.services.capacity import fleet


def set_health(
    *, session: Session, machine: str, health: str, reason: str | None, max_attempts: int
) -> tuple[Machine, list[Attempt]]:
    """Set a machine's health; returns it and the attempts a failure interrupted."""
    row = fleet.set_machine_health(session=session, machine=machine, health=health, reason=reason)
    if health != "failed":
        return row, []
    on_it = session.execute(
        select(Attempt.id)
        .join(IpuAssignment, IpuAssignment.partition_pk == Attempt.partition_pk)
        .join(Ipu, Ipu.id == IpuAssignment.ipu_id)
        .where(Ipu.machine_id == machine, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        .distinct()
    ).scalars()
    why = f"machine {machine} failed" + (f": {reason}" if reason else "")
    stopped = attempts.stop_running(
        session=session,
        attempt_ids=list(on_it),
        outcome=AttemptState.INTERRUPTED,
        reason=why,
        max_attempts=max_attempts,
    )
    return row, stopped
