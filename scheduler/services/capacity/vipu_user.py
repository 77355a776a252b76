"""The V-IPU user API over the cloud's partitions: what `ipucloud vipu-server` answers.

A caller sees its own allocation and nothing else (docs/vipu.md, "The V-IPU endpoint"):

- a tenant's key: the live partitions of its tenant (reserved for it by an admin, its sessions'
  partitions, its running jobs' partitions), reserved partitions that belong to no tenant (any
  tenant's jobs may run there; other tenants' jobs on them are shown without their ids), and its
  sessions still waiting for IPUs (`PS_PENDING`);
- an attempt key (scheduler/services/capacity/attempt_keys.py): its attempt's partition only, read-only;
- an admin key: every live partition.

Another tenant's partition is answered exactly as a missing one (404 `partition-missing`), so a
key learns nothing of partitions outside its allocation. Errors say why in the words of a job's
`wait.reason` (`partition-busy`, `partition-missing`, `partition-unhealthy`) or `outside-allocation`
(the tenant's plan does not allow that partition), in the problem's `reason` member.

Creating a partition with a tenant's key starts a session (scheduler/services/sessions/start.py): it
queues for IPUs like a job, is billed per held IPU-second, and is bounded by the tenant's plan.
With an admin key it carves a reserved partition at once (scheduler/services/capacity/partitions.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from pydantic import ValidationError
from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from scheduler.clock import Clock
from scheduler.errors import Conflict, Forbidden, InvalidRequest, LimitExceeded, NotFound
from scheduler.jobspec import SessionSpec
from scheduler.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    Partition,
    SessionState,
    Tenant,
)
from scheduler.services import sessions
from scheduler.services.batch import attempts as attempt_service
from scheduler.services.capacity import fleet, partitions
from scheduler.services.capacity.attempt_keys import AttemptCaller
from scheduler.services.tenancy.scope import ALL_TENANTS, OneTenant, Scope
from vipu import ipuof

PS_ACTIVE = "PS_ACTIVE"
PS_PENDING = "PS_PENDING"
PS_ERROR = "PS_ERROR"

BUSY = "partition-busy"
MISSING = "partition-missing"
UNHEALTHY = "partition-unhealthy"
OUTSIDE = "outside-allocation"

_CHUNK = 900  # ids per IN (...) list: well under SQLite's bound variables per statement


@dataclass(frozen=True, slots=True)
class VipuCaller:
    """Who calls the endpoint: a tenant's or an admin's API key, or an attempt's key."""

    tenant_id: str | None
    admin: bool
    may_change: bool
    """The key may create, remove and reset (`submit` scope for a tenant, `admin` for an admin)."""
    attempt: AttemptCaller | None = None

    @property
    def scope(self) -> Scope:
        return ALL_TENANTS if self.admin else OneTenant(str(self.tenant_id))

    def require_change(self, what: str) -> None:
        if self.attempt is not None:
            raise Forbidden(f"An attempt's key may only look at its partition, not {what}.", code=DENIED)
        if not self.may_change:
            raise Forbidden(f"This key lacks the `submit` scope needed to {what}.", code=DENIED)


# gRPC status names the V-IPU CLI reports, carried in the problem's `code` member.
DENIED = "PERMISSION_DENIED"
NOT_FOUND = "NOT_FOUND"
PRECONDITION = "FAILED_PRECONDITION"
EXISTS = "ALREADY_EXISTS"
INVALID = "INVALID_ARGUMENT"


class ProcessView(TypedDict):
    """An attempt attached to a graph compile domain, as gc-monitor lists its processes."""

    pid: int
    """The attempt's id: an emulated attempt has no operating-system process."""
    job_id: str | None
    job_name: str | None
    user: str | None
    """The tenant's name (None for another tenant's job on a shared reserved partition)."""
    gcd: int
    state: str
    started_at: datetime | None
    elapsed_s: float
    """Cluster seconds the attempt has run."""
    progress: attempt_service.ProgressView | None


class GcdView(TypedDict):
    gcd_id: int
    ipus: list[str]
    processes: list[ProcessView]


class PartitionStatusView(TypedDict):
    """`PartitionStatus`: one partition, its state, IPUs, graph compile domains and what runs there."""

    id: str
    state: str
    reason: str | None
    size: int
    num_gcds: int
    reconfigurable: bool
    machine_type: str | None
    target: str | None
    cluster_id: str | None
    units: list[str]
    ipus: list[str]
    kind: str
    tenant_id: str | None
    session_id: str | None
    job_id: str | None
    created_at: datetime | None
    gcds: list[GcdView]


class AllocationView(TypedDict):
    """`Allocation`: a set of machines the caller may use; here, one per visible partition."""

    id: str
    spec: dict[str, object]


class IpuAttributesView(TypedDict):
    """One IPU's attributes (`vipu list ipu-attrs`, `gc-info --device-info`)."""

    agent_id: str
    ipu: int
    partition_id: str
    device_id: int
    attributes: dict[str, str]


class IpuofConfigView(TypedDict):
    """`GetPartitionIpuofConfigReply`: the IPUoF configuration of one GCD."""

    ipuof_config: dict[str, object]


# Finding what the caller may see ---------------------------------------------------------------------


def _visible(stmt: Select[tuple[Partition]], caller: VipuCaller) -> Select[tuple[Partition]]:
    if caller.attempt is not None:
        return stmt.where(Partition.pk == caller.attempt.partition_pk)
    if caller.admin:
        return stmt
    return stmt.where(
        or_(
            Partition.tenant_id == caller.tenant_id,
            (Partition.kind == "reserved") & Partition.tenant_id.is_(None),
        )
    )


def _missing(partition_id: str, caller: VipuCaller) -> NotFound:
    # Identical for a partition that does not exist and one of another tenant's (never a hint).
    whose = "" if caller.admin else " for this tenant"
    return NotFound(f"no partition {partition_id}{whose}", reason=MISSING, code=NOT_FOUND)


def _live_visible(session: Session, caller: VipuCaller, partition_id: str) -> Partition | None:
    stmt = select(Partition).where(Partition.name == partition_id, Partition.released_at.is_(None))
    return session.execute(_visible(stmt, caller)).scalar_one_or_none()


def _unended_session(session: Session, caller: VipuCaller, partition_id: str) -> IpuSession | None:
    """A session the caller may see, by its id or (a tenant's own) by its name."""
    if caller.attempt is not None:
        return None
    stmt = select(IpuSession).where(IpuSession.state != SessionState.ENDED)
    if caller.admin:
        stmt = stmt.where(IpuSession.id == partition_id)
    else:
        stmt = stmt.where(
            IpuSession.tenant_id == caller.tenant_id,
            or_(IpuSession.id == partition_id, IpuSession.name == partition_id),
        )
    return session.execute(stmt.order_by(IpuSession.id).limit(1)).scalar_one_or_none()


def _resolve(
    session: Session, caller: VipuCaller, partition_id: str
) -> tuple[Partition | None, IpuSession | None]:
    """The live partition, or the session waiting for one, that `partition_id` names for the caller."""
    part = _live_visible(session, caller, partition_id)
    if part is not None:
        return part, None
    row = _unended_session(session, caller, partition_id)
    if row is None:
        raise _missing(partition_id, caller)
    if row.state == SessionState.ACTIVE and row.partition_pk is not None:
        part = session.get(Partition, row.partition_pk)
        if part is not None and part.released_at is None:
            return part, row
    return None, row


# Views ------------------------------------------------------------------------------------------------


def _chunks(values: Sequence[int]) -> Iterable[Sequence[int]]:
    for i in range(0, len(values), _CHUNK):
        yield values[i : i + _CHUNK]


def _unhealthy_machines(session: Session) -> dict[str, tuple[str, str | None]]:
    return {m.id: (m.health, m.health_reason) for m in fleet.machines_not_up(session=session, limit=100_000)}


def health_reason(ipu_ids: Sequence[str], unhealthy: dict[str, tuple[str, str | None]]) -> str | None:
    """Which machines of these IPUs are failed or draining, and why; None when all are up."""
    bad = []
    for machine in dict.fromkeys(ipuof.machine_of(i) for i in ipu_ids):
        if machine in unhealthy:
            health, why = unhealthy[machine]
            bad.append(f"{machine} is {health}" + (f" ({why})" if why else ""))
    return "; ".join(bad) or None


def _processes(
    session: Session, caller: VipuCaller, pks: Sequence[int], now: datetime
) -> dict[int, list[ProcessView]]:
    out: dict[int, list[ProcessView]] = {}
    for chunk in _chunks(pks):
        rows = session.execute(
            select(Attempt, Job.name, Tenant.name)
            .join(Job, Job.id == Attempt.job_id)
            .join(Tenant, Tenant.id == Attempt.tenant_id)
            .where(
                Attempt.partition_pk.in_(chunk),
                Attempt.state.in_(LIVE_ATTEMPT_STATES),
                Attempt.gcd >= 0,  # a session's hold (GCD -1) is the partition itself, not a process
            )
            .order_by(Attempt.partition_pk, Attempt.gcd)
        ).tuples()
        for attempt, job_name, tenant_name in rows:
            own = caller.admin or attempt.tenant_id == caller.tenant_id
            running = attempt.state == AttemptState.RUNNING
            out.setdefault(attempt.partition_pk, []).append(
                {
                    "pid": attempt.id,
                    "job_id": attempt.job_id if own else None,
                    "job_name": job_name if own else None,
                    "user": tenant_name if own else None,
                    "gcd": attempt.gcd,
                    "state": attempt.state,
                    "started_at": attempt.started_at,
                    "elapsed_s": round(attempt_service.derived_cluster_s(attempt, now), 3)
                    if running
                    else 0.0,
                    "progress": attempt_service.progress_of(attempt, now) if running and own else None,
                }
            )
    return out


def _session_ids(session: Session, pks: Sequence[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in _chunks(pks):
        for pk, sid in session.execute(
            select(IpuSession.partition_pk, IpuSession.id).where(
                IpuSession.partition_pk.in_(chunk), IpuSession.state == SessionState.ACTIVE
            )
        ).tuples():
            if pk is not None:
                out[pk] = sid
    return out


def _units(ipu_ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(i.split("-", 1)[0] for i in ipu_ids))


def status_views(
    *, session: Session, caller: VipuCaller, parts: Sequence[Partition], now: datetime
) -> list[PartitionStatusView]:
    """`PartitionStatus` of many partitions in a few queries (health, processes, sessions)."""
    if not parts:
        return []
    unhealthy = _unhealthy_machines(session)
    pks = [p.pk for p in parts]
    procs = _processes(session, caller, pks, now)
    sessions_of = _session_ids(session, [p.pk for p in parts if p.kind == "session"])
    out: list[PartitionStatusView] = []
    for p in parts:
        reason = health_reason(p.ipu_ids, unhealthy)
        mine = procs.get(p.pk, [])
        gcds: list[GcdView] = [
            {
                "gcd_id": g,
                "ipus": ipuof.gcd_ipus(p.ipu_ids, p.gcds, g),
                "processes": [x for x in mine if x["gcd"] == g],
            }
            for g in range(p.gcds)
        ]
        out.append(
            {
                "id": p.name,
                "state": PS_ERROR if reason else PS_ACTIVE,
                "reason": reason,
                "size": p.size,
                "num_gcds": p.gcds,
                "reconfigurable": p.reconfigurable,
                "machine_type": p.machine_type,
                "target": ipuof.target(p.machine_type),
                "cluster_id": _units(p.ipu_ids)[0] if p.ipu_ids else None,
                "units": _units(p.ipu_ids),
                "ipus": list(p.ipu_ids),
                "kind": p.kind,
                "tenant_id": p.tenant_id,
                "session_id": sessions_of.get(p.pk),
                "job_id": p.job_id
                if p.kind == "job" and (caller.admin or p.tenant_id == caller.tenant_id)
                else None,
                "created_at": p.created_at,
                "gcds": gcds,
            }
        )
    return out


def _pending_view(session: Session, row: IpuSession) -> PartitionStatusView:
    job = session.get(Job, row.job_id)
    wait = (job.wait or {}) if job is not None else {}
    detail = wait.get("detail") if isinstance(wait, dict) else None
    return {
        "id": row.id,
        "state": PS_PENDING,
        "reason": f"waiting for {row.ipus} IPUs: {detail}" if detail else f"waiting for {row.ipus} IPUs",
        "size": row.ipus,
        "num_gcds": row.gcds,
        "reconfigurable": False,
        "machine_type": None if row.machine == "any" else row.machine,
        "target": None,
        "cluster_id": None,
        "units": [],
        "ipus": [],
        "kind": "session",
        "tenant_id": row.tenant_id,
        "session_id": row.id,
        "job_id": None,
        "created_at": row.created_at,
        "gcds": [],
    }


# Operations -------------------------------------------------------------------------------------------


def list_partitions(
    *, session: Session, caller: VipuCaller, now: datetime, limit: int = 100_000
) -> list[PartitionStatusView]:
    """`ListPartitions`: the caller's live partitions by name, then its sessions waiting for IPUs."""
    stmt = select(Partition).where(Partition.released_at.is_(None)).order_by(Partition.name).limit(limit)
    parts = list(session.execute(_visible(stmt, caller)).scalars())
    views = status_views(session=session, caller=caller, parts=parts, now=now)
    if caller.attempt is None:
        pending = select(IpuSession).where(IpuSession.state == SessionState.STARTING).order_by(IpuSession.id)
        if not caller.admin:
            pending = pending.where(IpuSession.tenant_id == caller.tenant_id)
        views += [_pending_view(session, row) for row in session.execute(pending.limit(limit)).scalars()]
    return views


def partition_status(
    *, session: Session, caller: VipuCaller, partition_id: str, now: datetime
) -> PartitionStatusView:
    """`GetPartitionStatus`: a partition by name, or a session by its id or name."""
    part, row = _resolve(session, caller, partition_id)
    if part is None:
        assert row is not None
        return _pending_view(session, row)
    return status_views(session=session, caller=caller, parts=[part], now=now)[0]


def ipuof_config(
    *, session: Session, caller: VipuCaller, partition_id: str, gcd: int, now: datetime
) -> IpuofConfigView:
    """`GetPartitionIpuofConfig`: what a program attaching to GCD `gcd` of the partition is given.

    Attaching is refused, with the cause, when the partition is still waiting for IPUs, when a
    machine under it has failed or is draining, or when another attempt holds that GCD (the
    attempt's own key is given its own GCD)."""
    part, row = _resolve(session, caller, partition_id)
    if part is None:
        assert row is not None
        raise Conflict(
            f"partition {partition_id} has no IPUs yet: {_pending_view(session, row)['reason']}",
            reason="partition-pending",
            code=PRECONDITION,
        )
    if not 0 <= gcd < part.gcds:
        raise InvalidRequest(
            f"partition {part.name} has graph compile domains 0 .. {part.gcds - 1}, not {gcd}",
            field="gcd_id",
            code=INVALID,
        )
    if caller.attempt is not None and caller.attempt.gcd != gcd:
        raise Forbidden(
            f"this attempt runs on GCD {caller.attempt.gcd} of {part.name}; its key opens no other GCD",
            code=DENIED,
        )
    why = health_reason(ipuof.gcd_ipus(part.ipu_ids, part.gcds, gcd), _unhealthy_machines(session))
    if why is not None:
        raise Conflict(
            f"reserved partition {part.name} has a machine that is failed or draining: {why}"
            if part.kind == "reserved"
            else f"partition {part.name} has a machine that is failed or draining: {why}",
            reason=UNHEALTHY,
            code=PRECONDITION,
        )
    holder = session.execute(
        select(Attempt, Job.name)
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.partition_pk == part.pk,
            Attempt.gcd == gcd,
            Attempt.state.in_(LIVE_ATTEMPT_STATES),
        )
    ).one_or_none()
    if holder is not None and (caller.attempt is None or holder[0].id != caller.attempt.attempt_id):
        attempt, job_name = holder
        own = caller.admin or attempt.tenant_id == caller.tenant_id
        who = f"{attempt.job_id} ({job_name}, {attempt.state})" if own else "a job of another tenant"
        noun = "reserved partition" if part.kind == "reserved" else "partition"
        raise Conflict(
            f"{noun} {part.name} runs {who} on GCD {gcd}: its IPUs are attached to that job until it ends",
            reason=BUSY,
            code=PRECONDITION,
            job=attempt.job_id if own else None,
        )
    return {
        "ipuof_config": ipuof.ipuof_config(
            partition=part.name,
            own=ipuof.gcd_ipus(part.ipu_ids, part.gcds, gcd),
            gcds=part.gcds,
            gcd=gcd,
            machine_type=part.machine_type,
        )
    }


def list_allocations(*, session: Session, caller: VipuCaller, now: datetime) -> list[AllocationView]:
    """`ListAllocations`: one allocation per partition the caller may use, with its machines."""
    stmt = select(Partition).where(Partition.released_at.is_(None)).order_by(Partition.name)
    parts = list(session.execute(_visible(stmt, caller)).scalars())
    return [
        {
            "id": p.name,
            "spec": {
                "cluster_id": _units(p.ipu_ids)[0] if p.ipu_ids else None,
                "agent_ids": list(dict.fromkeys(ipuof.machine_of(i) for i in p.ipu_ids)),
                "kind": p.kind,
                "size": p.size,
                "machine_type": p.machine_type,
            },
        }
        for p in parts
    ]


def ipu_attributes(
    *, session: Session, caller: VipuCaller, partition_id: str | None, now: datetime
) -> list[IpuAttributesView]:
    """`ListIpuAttributes`: every IPU of the caller's partitions (or of one), with what uses it."""
    if partition_id is not None:
        part, _ = _resolve(session, caller, partition_id)
        parts = [part] if part is not None else []
    else:
        stmt = select(Partition).where(Partition.released_at.is_(None)).order_by(Partition.name)
        parts = list(session.execute(_visible(stmt, caller)).scalars())
    unhealthy = _unhealthy_machines(session)
    procs = _processes(session, caller, [p.pk for p in parts], now)
    out: list[IpuAttributesView] = []
    for p in parts:
        by_gcd = {x["gcd"]: x for x in procs.get(p.pk, [])}
        per_gcd = p.size // p.gcds
        for position, ipu in enumerate(p.ipu_ids):
            gcd = position // per_gcd
            attrs = ipuof.ipu_attributes(ipu, p.machine_type)
            machine = ipuof.machine_of(ipu)
            attrs["partition"] = p.name
            attrs["gcd"] = str(gcd)
            attrs["health"] = unhealthy.get(machine, ("up", None))[0]
            proc = by_gcd.get(gcd)
            if proc is not None:
                attrs["user name"] = proc["user"] or "another tenant"
                attrs["user executable"] = proc["job_name"] or "-"
                attrs["user process id"] = str(proc["pid"])
                if proc["job_id"]:
                    attrs["job"] = proc["job_id"]
            out.append(
                {
                    "agent_id": machine,
                    "ipu": ipuof.ipu_index(ipu),
                    "partition_id": p.name,
                    "device_id": position % per_gcd,
                    "attributes": attrs,
                }
            )
    return out


class CreatedView(TypedDict):
    """`CreatePartitionReply`: the partition's id (a session's id while it waits for IPUs)."""

    partition_id: str
    state: str
    session_id: str | None


def create_partition(
    *,
    session: Session,
    caller: VipuCaller,
    partition_id: str,
    size: int,
    num_gcds: int,
    reconfigurable: bool,
    machine_type: str | None,
    policy: str,
    allocators: fleet.Allocators | None,
    created_by: str | None,
) -> CreatedView:
    """`CreatePartition`: an admin carves a reserved partition now; a tenant starts a session."""
    caller.require_change("create a partition")
    if caller.admin:
        part = partitions.create_partition(
            session=session,
            name=partition_id,
            size=size,
            machine_type=machine_type,
            tenant_id=None,
            gcds=num_gcds,
            reconfigurable=reconfigurable,
            created_by=created_by,
            policy=policy,
            allocators=allocators,
        )
        return {"partition_id": part.name, "state": PS_ACTIVE, "session_id": None}
    assert caller.tenant_id is not None
    if reconfigurable:
        raise InvalidRequest(
            "a tenant's partition is a session, which is never reconfigurable; ask an admin for a "
            "reconfigurable reserved partition",
            field="requirements.reconfigurable",
            code=INVALID,
        )
    if _live_visible(session, caller, partition_id) is not None or (
        _unended_session(session, caller, partition_id) is not None
    ):
        raise Conflict(f"partition {partition_id} already exists", code=EXISTS)
    try:
        spec = SessionSpec.model_validate(
            {"name": partition_id, "ipus": size, "gcds": num_gcds, "machine": machine_type or "any"}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        # A whole-model check (the partition rules) has no location: it is about the size.
        loc = str(first["loc"][0]) if first["loc"] else "ipus"
        field = {"ipus": "size", "name": "id", "machine": "machine_type", "gcds": "num_gcds"}.get(loc, loc)
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"requirements.{field}: {message}", field=f"requirements.{field}", code=INVALID)
    try:
        row = sessions.start_session(session=session, tenant_id=caller.tenant_id, spec=spec)
    except LimitExceeded as exc:
        raise Forbidden(f"outside your allocation: {exc.detail}", reason=OUTSIDE, code=DENIED, **exc.extra)
    return {"partition_id": row.id, "state": PS_PENDING, "session_id": row.id}


def _busy(part: Partition, live: Sequence[Attempt], what: str) -> Conflict:
    held = ", ".join(f"{a.job_id} on GCD {a.gcd}" for a in live)
    noun = "reserved partition" if part.kind == "reserved" else "partition"
    return Conflict(
        f"{noun} {part.name} runs {held}; {what} once they end or are cancelled",
        reason=BUSY,
        code=PRECONDITION,
        job=live[0].job_id,
    )


def _live_jobs(session: Session, part: Partition) -> list[Attempt]:
    return list(
        session.execute(
            select(Attempt)
            .where(
                Attempt.partition_pk == part.pk,
                Attempt.state.in_(LIVE_ATTEMPT_STATES),
                Attempt.gcd >= 0,
            )
            .order_by(Attempt.gcd)
        ).scalars()
    )


def remove_partition(*, session: Session, caller: VipuCaller, partition_id: str, clock: Clock) -> str:
    """`RemovePartition`: an admin frees a partition nothing runs on; a tenant ends its session."""
    caller.require_change("remove a partition")
    part, row = _resolve(session, caller, partition_id)
    if part is not None and row is None and part.kind == "session":
        row = session.execute(
            select(IpuSession).where(
                IpuSession.partition_pk == part.pk, IpuSession.state != SessionState.ENDED
            )
        ).scalar_one_or_none()
    if row is not None:
        sessions.end_session(session=session, session_id=row.id, scope=caller.scope, clock=clock)
        return part.name if part is not None else row.id
    assert part is not None
    if part.kind == "job":
        raise Conflict(
            f"partition {part.name} belongs to job {part.job_id} and goes when it ends; cancel the job",
            reason="job-partition",
            code=PRECONDITION,
        )
    if not caller.admin:
        raise Forbidden(
            f"reserved partition {part.name} was made for you by an admin; only an admin removes it",
            code=DENIED,
        )
    live = _live_jobs(session, part)
    if live:
        raise _busy(part, live, "remove it")
    partitions.remove_partition(session=session, name=part.name)
    return part.name


class ResetView(TypedDict):
    partition_id: str
    num_gcds: int
    interrupted_jobs: list[str]


def reset_partition(
    *, session: Session, caller: VipuCaller, partition_id: str, num_gcds: int | None, max_attempts: int
) -> ResetView:
    """`ResetPartition`: the partition's jobs lose their attempts (unbilled) and run again; with
    `num_gcds`, a reconfigurable partition is split anew once nothing runs on it."""
    caller.require_change("reset a partition")
    part, _ = _resolve(session, caller, partition_id)
    if part is None:
        raise Conflict(
            f"partition {partition_id} has no IPUs yet: nothing to reset",
            reason="partition-pending",
            code=PRECONDITION,
        )
    if part.kind == "job" and not caller.admin:
        raise Conflict(
            f"partition {part.name} belongs to job {part.job_id}; cancel or resubmit the job instead",
            reason="job-partition",
            code=PRECONDITION,
        )
    live = _live_jobs(session, part)
    if num_gcds is not None and num_gcds != part.gcds and live:
        raise _busy(part, live, "split it anew")
    if part.kind == "session":
        if num_gcds is not None and num_gcds != part.gcds:
            raise Conflict(
                f"partition {part.name} is a session's and is not reconfigurable",
                reason="not-reconfigurable",
                code=PRECONDITION,
            )
        attempt_service.stop_running(
            session=session,
            attempt_ids=[a.id for a in live],
            outcome=AttemptState.INTERRUPTED,
            reason=f"partition {part.name} was reset by its owner",
            max_attempts=max_attempts,
        )
        return {
            "partition_id": part.name,
            "num_gcds": part.gcds,
            "interrupted_jobs": [a.job_id for a in live],
        }
    done, jobs = partitions.reset_partition(
        session=session, name=part.name, max_attempts=max_attempts, gcds=num_gcds
    )
    return {"partition_id": done.name, "num_gcds": done.gcds, "interrupted_jobs": jobs}
