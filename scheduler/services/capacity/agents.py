"""Host agents and their leases: liveness per host, not per attempt.

A host agent (`ipucloud worker`) drives every attempt placed on the racks it serves. Like slurmd's
node heartbeat or the kubelet's node Lease, it holds one lease for itself and renews it with one
heartbeat for all its attempts, so the database's write load follows the number of hosts, not the
number of running jobs.

- `register` starts an incarnation: the agent's row gets a new epoch. Whatever an earlier
  incarnation of the same name still held is ended at once (its successor knows nothing of it):
  `attempts.register_agent` does both.
- `renew` is the heartbeat and the fence in one statement: a guarded UPDATE that only succeeds
  while this incarnation's lease is current. Every agent transaction starts with it, so its row
  lock orders the agent's writes against the reconciler's lapse of the same agent, and an agent
  whose lease lapsed (paused, cut off, or replaced) can change nothing.
- `lapse_expired` (the reconciler) marks the agents whose lease ran out lapsed; every attempt they
  held is then ended in the same pass and its job queued again (`attempts.lapse_agents`): a
  platform fault, never billed, within the retry limit.

This module keeps the leases only; ending attempts is `attempts`', which fences on these leases.

Leases are judged on the database's clock (services.clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.db import changed
from scheduler.models import Agent, AgentState, Attempt, AttemptState
from scheduler.services.clock import db_now


@dataclass(frozen=True)
class AgentLease:
    """An agent incarnation: what every write of the agent is fenced by."""

    name: str
    epoch: int


class NameTaken(Exception):
    """Another live process holds the lease of this agent name (two workers on one host without
    `--hostname` take the same Celery node name). ``host`` and ``pid`` are the holder's."""

    def __init__(self, name: str, host: str, pid: int, until: datetime) -> None:
        self.name = name
        self.host = host
        self.pid = pid
        self.until = until
        super().__init__(
            f"another host agent named {name!r} is running (host {host}, pid {pid}; its lease runs until "
            f"{until:%H:%M:%S} UTC): each agent needs its own name. Start this one with "
            f"`ipucloud worker --hostname NAME` (a Celery node name such as worker2@%h), or stop the other."
        )


def register(
    *,
    session: Session,
    name: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    lease_s: float,
    takeover: bool = False,
) -> tuple[AgentLease, AgentLease | None]:
    """Start a new incarnation of agent `name`; returns its lease and the previous incarnation's,
    whose attempts the caller ends (`attempts.register_agent` does both).

    Raises `NameTaken` while another process (another host, or another pid) holds a current lease
    under the name, unless `takeover` (the caller knows that process is gone: a restart)."""
    now = db_now(session)
    row = session.execute(
        select(Agent).where(Agent.name == name).with_for_update().execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if (
        row is not None
        and not takeover
        and row.state == AgentState.ACTIVE
        and row.lease_expires_at is not None
        and row.lease_expires_at >= now
        and (row.host != host[:200] or row.pid != pid)
    ):
        raise NameTaken(name, row.host or "?", row.pid or 0, row.lease_expires_at)
    previous: AgentLease | None = None
    if row is None:
        row = Agent(name=name, epoch=0)
        session.add(row)
    else:
        previous = AgentLease(name=name, epoch=row.epoch)
    row.epoch = row.epoch + 1
    row.state = AgentState.ACTIVE
    row.host = host[:200]
    row.pid = pid
    row.queues = list(queues)
    row.started_at = now
    row.heartbeat_at = now
    row.lease_expires_at = now + timedelta(seconds=lease_s)
    row.running = 0
    row.ipus_busy = 0
    session.flush()
    return AgentLease(name=name, epoch=row.epoch), previous


def renew(
    *, session: Session, lease: AgentLease, lease_s: float, running: int = 0, ipus_busy: int = 0
) -> bool:
    """The heartbeat: extend this incarnation's lease if it is still current. False: fenced."""
    now = db_now(session)
    done = changed(
        session,
        update(Agent)
        .where(
            Agent.name == lease.name,
            Agent.epoch == lease.epoch,
            Agent.state == AgentState.ACTIVE,
            Agent.lease_expires_at >= now,
        )
        .values(
            heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=lease_s),
            running=running,
            ipus_busy=ipus_busy,
        )
        .execution_options(synchronize_session=False),
    )
    return bool(done == 1)


def release(*, session: Session, lease: AgentLease) -> bool:
    """A clean shutdown, once the agent has handed back or finished everything it ran."""
    now = db_now(session)
    done = changed(
        session,
        update(Agent)
        .where(Agent.name == lease.name, Agent.epoch == lease.epoch, Agent.state == AgentState.ACTIVE)
        .values(state=AgentState.STOPPED, lease_expires_at=now, running=0, ipus_busy=0)
        .execution_options(synchronize_session=False),
    )
    return bool(done == 1)


def running_attempt_ids(*, session: Session, lease: AgentLease) -> set[int]:
    """What the database says this incarnation runs: the agent's periodic look at the truth."""
    return set(
        session.execute(
            select(Attempt.id).where(
                Attempt.worker == lease.name,
                Attempt.agent_epoch == lease.epoch,
                Attempt.state == AttemptState.RUNNING,
            )
        ).scalars()
    )


def lapse_expired(*, session: Session, now: datetime | None = None, limit: int = 50) -> list[AgentLease]:
    """Reconciler: mark the agents whose lease ran out lapsed and return their incarnations, whose
    attempts the caller ends (`attempts.lapse_agents` does both).

    SKIP LOCKED: an agent whose row is locked is renewing its lease right now, and is looked at
    again on the next pass rather than waited for.
    """
    now = now or db_now(session)
    lapsed = list(
        session.execute(
            select(Agent)
            .where(Agent.state == AgentState.ACTIVE, Agent.lease_expires_at < now)
            .order_by(Agent.name)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        ).scalars()
    )
    for agent in lapsed:
        agent.state = AgentState.LAPSED
        agent.running = 0
        agent.ipus_busy = 0
    return [AgentLease(name=a.name, epoch=a.epoch) for a in lapsed]


def unheld_running_attempts(*, session: Session, limit: int = 500) -> list[int]:
    """Running attempts no active agent incarnation holds (its agent stopped without handing them
    back, or they predate host agents): nothing will ever end them but the reconciler."""
    live = (
        select(Agent.name)
        .where(
            Agent.name == Attempt.worker,
            Agent.epoch == Attempt.agent_epoch,
            Agent.state == AgentState.ACTIVE,
        )
        .exists()
    )
    return list(
        session.execute(
            select(Attempt.id)
            # A session's hold (GCD -1) is driven by the scheduler (scheduler/services/sessions/).
            .where(Attempt.state == AttemptState.RUNNING, Attempt.gcd >= 0, ~live)
            .order_by(Attempt.id)
            .limit(limit)
        ).scalars()
    )


def list_agents(*, session: Session) -> list[Agent]:
    return list(session.execute(select(Agent).order_by(Agent.name)).scalars())
