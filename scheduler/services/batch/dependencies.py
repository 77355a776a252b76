"""Dependencies between jobs (docs/sweeps.md): checked and stored as a submission states them
(`check_dependencies`), and resolved by the scheduler's leader on every pass (`resolve_dependencies`):
a held job whose upstreams have settled is released, or cancelled (or kept held) when they can no
longer satisfy it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from sqlalchemy import bindparam, case, func, select, update
from sqlalchemy.orm import Session

from scheduler.errors import InvalidRequest, NotFound
from scheduler.jobspec import DependsOn
from scheduler.models import (
    FINAL_JOB_STATES,
    Job,
    JobArray,
    JobState,
)
from scheduler.services.batch.job_state import finalize_job

DEPENDENCY = "dependency"  # Job.held_for while its dependencies keep it from the scheduler


class StoredDependency(TypedDict):
    job: str
    type: str


class StoredDependencies(TypedDict):
    """`Job.depends_on`: what a held job waits for."""

    mode: str  # all | any
    on: list[StoredDependency]
    on_unsatisfiable: NotRequired[str]  # cancel | hold


def check_dependencies(
    *, session: Session, tenant_id: str, depends_on: DependsOn | None, is_array: bool
) -> StoredDependencies | None:
    """The stored form of a submission's dependencies, or NotFound naming an id that is not the
    tenant's (another tenant's is as missing as one that never was). Each exists already, so no
    cycle can form."""
    if depends_on is None:
        return None
    items = depends_on.items
    job_ids = sorted({d.job for d in items if d.job.startswith("job_")})
    array_ids = sorted({d.job for d in items if d.job.startswith("arr_")})
    found: set[str] = set()
    if job_ids:
        found |= set(
            session.execute(select(Job.id).where(Job.id.in_(job_ids), Job.tenant_id == tenant_id)).scalars()
        )
    if array_ids:
        found |= set(
            session.execute(
                select(JobArray.id).where(JobArray.id.in_(array_ids), JobArray.tenant_id == tenant_id)
            ).scalars()
        )
    for d in items:
        if d.job not in found:
            raise NotFound(f"depends_on: no job or array {d.job}.", field="depends_on")
        if d.type == "aftercorr" and (not is_array or not d.job.startswith("arr_")):
            raise InvalidRequest(
                "depends_on: `aftercorr` ties an array's elements to another array's: both must be arrays.",
                field="depends_on",
            )
    return {"mode": depends_on.mode, "on": [{"job": d.job, "type": d.type} for d in items]}


@dataclass
class _Upstream:
    """What a condition needs to know of a job or an array: its elements' states (one for a job)."""

    total: int = 0
    succeeded: int = 0
    final: int = 0
    started: int = 0
    by_index: dict[int, str] | None = None  # aftercorr only


def _verdict(kind: str, up: _Upstream, index: int | None) -> bool | None:
    """True: satisfied; False: can no longer be; None: not yet."""
    if kind == "aftercorr":
        state = (up.by_index or {}).get(index if index is not None else -1)
        if state is None:  # no corresponding element: nothing to wait for (Slurm's behaviour)
            return True
        if state == JobState.SUCCEEDED:
            return True
        return False if state in FINAL_JOB_STATES else None
    if up.total == 0:
        return True
    failed = up.final - up.succeeded
    if kind == "after":
        return True if up.started >= up.total else None
    if kind == "afterany":
        return True if up.final >= up.total else None
    if kind == "afterok":
        if failed:
            return False
        return True if up.succeeded >= up.total else None
    # afternotok: once all ended, at least one did not succeed
    if up.final >= up.total:
        return failed > 0
    return None


def _condition(stored: Mapping[str, Any], ups: Mapping[str, _Upstream], index: int | None) -> bool | None:
    verdicts = [_verdict(d["type"], ups.get(d["job"], _Upstream()), index) for d in stored["on"]]
    if stored["mode"] == "all":
        if any(v is False for v in verdicts):
            return False
        return True if all(v is True for v in verdicts) else None
    if any(v is True for v in verdicts):
        return True
    return False if all(v is False for v in verdicts) else None


def _upstreams(session: Session, held: Sequence[Any]) -> dict[str, _Upstream]:
    job_ids: set[str] = set()
    array_ids: set[str] = set()
    corr: set[str] = set()
    for row in held:
        for d in row.depends_on["on"]:
            (array_ids if d["job"].startswith("arr_") else job_ids).add(d["job"])
            if d["type"] == "aftercorr":
                corr.add(d["job"])
    out: dict[str, _Upstream] = {}
    if job_ids:
        for job_id, state, started in session.execute(
            select(Job.id, Job.state, Job.started_at).where(Job.id.in_(sorted(job_ids)))
        ).tuples():
            final = state in FINAL_JOB_STATES
            out[job_id] = _Upstream(
                total=1,
                succeeded=int(state == JobState.SUCCEEDED),
                final=int(final),
                started=int(final or state == JobState.RUNNING or started is not None),
            )
    if array_ids:
        final_states = [s.value for s in FINAL_JOB_STATES]
        for array_id, total, ok, final, started in session.execute(
            select(
                Job.array_id,
                func.count(),
                func.sum(case((Job.state == JobState.SUCCEEDED, 1), else_=0)),
                func.sum(case((Job.state.in_(final_states), 1), else_=0)),
                func.sum(case((Job.state != JobState.QUEUED, 1), else_=0)),
            )
            .where(Job.array_id.in_(sorted(array_ids)))
            .group_by(Job.array_id)
        ).tuples():
            out[array_id] = _Upstream(int(total), int(ok or 0), int(final or 0), int(started or 0))
        for array_id in corr:
            up = out.setdefault(array_id, _Upstream())
            up.by_index = {
                int(i or 0): s
                for i, s in session.execute(
                    select(Job.array_index, Job.state).where(Job.array_id == array_id)
                ).tuples()
            }
    return out


@dataclass
class Resolved:
    released: list[str]
    cancelled: list[str]
    held: list[str]  # unsatisfiable, kept (on_unsatisfiable: hold)


def has_held(*, session: Session) -> bool:
    return session.execute(select(Job.id).where(Job.held_for == DEPENDENCY).limit(1)).first() is not None


def resolve_dependencies(*, session: Session, limit: int = 20_000) -> Resolved:
    """Release the held jobs whose dependencies are met, and cancel (or keep held, saying so) those
    whose dependencies can no longer be. A requeued upstream is queued again, not final: nothing
    fires on it until it ends."""
    held = session.execute(
        select(Job.id, Job.tenant_id, Job.depends_on, Job.array_index, Job.wait, Job.state)
        .where(Job.held_for == DEPENDENCY)
        .order_by(Job.id)
        .limit(limit)
    ).all()
    out = Resolved([], [], [])
    if not held:
        return out
    ups = _upstreams(session, held)
    release: list[str] = []
    cancel: list[tuple[str, str]] = []
    waits: list[dict[str, Any]] = []
    for row in held:
        if row.state != JobState.QUEUED:
            release.append(row.id)  # ended meanwhile (cancelled): nothing holds it any more
            continue
        stored = row.depends_on
        verdict = _condition(stored, ups, row.array_index)
        on = ", ".join(f"{d['type']}:{d['job']}" for d in stored["on"])
        if verdict is True:
            release.append(row.id)
        elif verdict is False:
            reason = f"dependency can never be satisfied ({stored['mode']} of {on})"
            if stored.get("on_unsatisfiable", "cancel") == "cancel":
                cancel.append((row.id, reason))
            else:
                wait = {
                    "reason": "dependency-never",
                    "detail": reason + "; held until you cancel it",
                    "behind": [d["job"] for d in stored["on"]],
                }
                if row.wait != wait:
                    waits.append({"j_id": row.id, "j_wait": wait})
                out.held.append(row.id)
        else:
            wait = {
                "reason": DEPENDENCY,
                "detail": f"waiting for {stored['mode']} of {on}",
                "behind": [d["job"] for d in stored["on"]],
            }
            if row.wait != wait:
                waits.append({"j_id": row.id, "j_wait": wait})
    table = Job.__table__
    if release:
        session.execute(
            update(table)
            .where(table.c.id.in_(release))
            .values(held_for=None, wait=None, updated_at=table.c.updated_at)
        )
        out.released = release
    if waits:
        session.execute(
            update(table)
            .where(table.c.id == bindparam("j_id"))
            .values(wait=bindparam("j_wait"), updated_at=table.c.updated_at),
            waits,
        )
    if cancel:
        reasons = dict(cancel)
        for job in _lock(session, list(reasons)):
            if job.state in FINAL_JOB_STATES:
                continue
            job.held_for = None
            job.wait = None
            finalize_job(session=session, job=job, state=JobState.CANCELLED, reason=reasons[job.id])
            out.cancelled.append(job.id)
    session.flush()
    return out


def _lock(session: Session, job_ids: Sequence[str]) -> list[Job]:
    return list(
        session.execute(
            select(Job)
            .where(Job.id.in_(sorted(job_ids)))
            .order_by(Job.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).scalars()
    )
