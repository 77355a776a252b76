"""Agent incarnations that begin (`register_agent`) and end (a lapsed lease, a replaced agent): their
attempts end with them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import (
    Attempt,
    AttemptState,
)
from scheduler.services.batch.attempts.ending import stop_running
from scheduler.services.capacity import agents
from scheduler.services.capacity.agents import AgentLease


@dataclass(frozen=True)
class Lapse:
    """An agent whose lease ran out and the attempts the reconciler ended for it."""

    name: str
    epoch: int
    ended: list[Attempt]


def end_attempts_of(
    *, session: Session, agent: AgentLease, outcome: AttemptState, reason: str, max_attempts: int
) -> list[Attempt]:
    """End every running attempt of one agent incarnation (its lapse, or its successor's start)."""
    held = session.execute(
        select(Attempt.id).where(
            Attempt.worker == agent.name,
            Attempt.agent_epoch == agent.epoch,
            Attempt.state == AttemptState.RUNNING,
        )
    ).scalars()
    return stop_running(
        session=session, attempt_ids=list(held), outcome=outcome, reason=reason, max_attempts=max_attempts
    )


def register_agent(
    *,
    session: Session,
    name: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    lease_s: float,
    max_attempts: int,
    takeover: bool = False,
) -> tuple[AgentLease, list[Attempt]]:
    """Start a new incarnation of agent `name` (`agents.register`) and end what the previous one
    still held; returns the new lease and the attempts ended."""
    lease, previous = agents.register(
        session=session, name=name, host=host, pid=pid, queues=queues, lease_s=lease_s, takeover=takeover
    )
    if previous is None:
        return lease, []
    ended = end_attempts_of(
        session=session,
        agent=previous,
        outcome=AttemptState.LOST,
        reason="its host agent restarted",
        max_attempts=max_attempts,
    )
    return lease, ended


def lapse_agents(
    *, session: Session, max_attempts: int, now: datetime | None = None, limit: int = 50
) -> list[Lapse]:
    """Reconciler: agents whose lease ran out (`agents.lapse_expired`) lose everything they ran;
    their jobs go again."""
    return [
        Lapse(
            name=lapsed.name,
            epoch=lapsed.epoch,
            ended=end_attempts_of(
                session=session,
                agent=lapsed,
                outcome=AttemptState.LOST,
                reason="its host agent stopped answering (lease expired)",
                max_attempts=max_attempts,
            ),
        )
        for lapsed in agents.lapse_expired(session=session, now=now, limit=limit)
    ]
