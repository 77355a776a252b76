"""An attempt's life: placed (partition held, outbox row), taken by a host agent, billed, ended.

A host agent (scheduler.services.capacity.agents) holds one lease for all the attempts it drives, and every
one of its writes starts by renewing that lease: a guarded UPDATE that fails once the lease has
lapsed, so an agent that was paused, cut off or replaced can change nothing.

- `take_many` moves delivered attempts `placed` -> `running` by compare-and-set on (attempt, state,
  epoch), under the agent's incarnation, and fixes each run's timeline (its plan on the partition it
  got), so its progress can be derived by anyone instead of written every second.
- `record_tick` is one agent tick in one transaction: the lease, the log lines of every attempt,
  the meter ticks due, and the attempts that ended.
- `stop_running` is the control plane ending live attempts itself (a cancel, a preemption, a failed
  machine, a lapsed agent); the agent learns it over the bus or at its next look, and its later
  writes for them are refused because they are no longer running under its incarnation.

Locks are taken in one global order, so batches of many attempts never deadlock: job rows (by id),
then attempt rows (by id), then tenant rows (by id). The agent's meter ticks lock attempts only: a
job's row is not written while its attempt runs. On SQLite every write transaction holds the
database lock from BEGIN, which serialises them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict, cast

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, object_session
from sqlalchemy.orm.attributes import set_committed_value

from scheduler import bus, emulation
from scheduler.clock import UNSCALED, Clock
from scheduler.db import insert_returning_keys, update_by_key
from scheduler.errors import Conflict
from scheduler.jobspec import DEFAULT_CHECKPOINT_EVERY_S
from scheduler.models import (
    FINAL_JOB_STATES,
    PLATFORM_FAULT_STATES,
    SERVE_TASK,
    Agent,
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    JobArray,
    JobEvent,
    JobState,
    OutboxMessage,
    Partition,
    utcnow,
)
from scheduler.services.batch import checkpoints, executables
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import agents, fleet
from scheduler.services.capacity.agents import AgentLease
from scheduler.services.clock import db_now
from scheduler.services.tenancy import metering, notifications, rates
from vipu import emulator
from vipu.emulator.replica import ReplicaRun

TASK_NAME = "ipucloud.run_attempt"


class PlacedPartition(Protocol):
    """What placing an attempt reads of its partition (a Partition, or one just inserted)."""

    @property
    def pk(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def machine_type(self) -> str: ...
    @property
    def ipu_ids(self) -> list[str]: ...
    @property
    def gcds(self) -> int: ...


def gcd_ipus(ipu_ids: Sequence[str], gcds: int, gcd: int) -> list[str]:
    """The IPUs of graph compile domain `gcd` of a partition split into `gcds` equal ones."""
    size = len(ipu_ids) // gcds
    return list(ipu_ids[gcd * size : (gcd + 1) * size])


def free_gcds(*, session: Session, partition_pk: int, gcds: int) -> list[int]:
    """The partition's graph compile domains no live attempt holds, lowest first."""
    used = set(
        session.execute(
            select(Attempt.gcd).where(
                Attempt.partition_pk == partition_pk,
                Attempt.state.in_((AttemptState.PLACED, AttemptState.RUNNING)),
            )
        ).scalars()
    )
    return [g for g in range(gcds) if g not in used]


def place(
    *,
    session: Session,
    job: Job,
    partition: PlacedPartition,
    queue: str,
) -> int:
    """Record attempt N of `job` on `partition` and its outbox message, in the caller's transaction;
    returns the attempt's id."""
    return place_many(session=session, placements=[(job, partition, queue)])[0]


def place_many(*, session: Session, placements: Sequence[tuple[Job, PlacedPartition, str]]) -> list[int]:
    """`place` for many jobs at once: the attempts, their outbox messages and their events each in
    one batched statement, so a scheduling pass that starts a thousand jobs costs a few statements
    rather than a few per job. Returns the attempts' ids, in order."""
    if not placements:
        return []
    now = utcnow()
    rows = []
    # A partition of several graph compile domains runs one job on each: the lowest free one.
    free = {
        p.pk: free_gcds(session=session, partition_pk=p.pk, gcds=p.gcds)
        for _, p, _ in placements
        if p.gcds > 1
    }
    held: list[tuple[int, int, list[str]]] = []  # (gcd, IPUs it holds, their ids)
    for job, partition, _ in placements:
        if partition.gcds > 1:
            if not free[partition.pk]:
                raise Conflict(f"every graph compile domain of partition {partition.name} is in use")
            gcd = free[partition.pk].pop(0)
            ipus = gcd_ipus(partition.ipu_ids, partition.gcds, gcd)
        else:
            gcd, ipus = 0, list(partition.ipu_ids)
        held.append((gcd, len(ipus), ipus))
        # Counted in memory as already written: the rows are updated below in one statement rather
        # than flushed by the ORM one UPDATE per job.
        set_committed_value(job, "attempts", job.attempts + 1)
        set_committed_value(job, "updated_at", now)
        rows.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "number": job.attempts,
                "state": AttemptState.PLACED,
                "epoch": 0,
                "partition_pk": partition.pk,
                "gcd": gcd,
                "size": len(ipus),
                "machine_type": partition.machine_type,
                "placed_at": now,
                # The type's rate for this job, and the wait (rates.py); an `any` job takes on
                # the size and run time of the type it was placed on.
                **rates.attempt_fields(job, partition.machine_type, now),
            }
        )
    update_by_key(
        session,
        Job.__table__,
        "id",
        {job.id: {"attempts": job.attempts} for job, _, _ in placements},
        same={"updated_at": now},
    )
    ids = insert_returning_keys(session, Attempt.__table__, rows)
    session.execute(
        insert(OutboxMessage.__table__),
        [
            {
                "attempt_id": attempt_id,
                "queue": queue,
                "payload": {"attempt_id": attempt_id, "epoch": 0, "job_id": job.id},
                "created_at": now,
                "publish_count": 0,
            }
            for attempt_id, (job, _, queue) in zip(ids, placements, strict=True)
        ],
    )
    session.execute(
        insert(JobEvent.__table__),
        [
            {
                "job_id": job.id,
                "attempt": job.attempts,
                "kind": "state",
                "message": (
                    f"placed on partition {partition.name}"
                    + (f" graph compile domain {gcd}" if partition.gcds > 1 else "")
                    + f" ({size} x {partition.machine_type}: {_ipu_range(ipus)})"
                ),
                "data": {"partition": partition.name, "gcd": gcd, "ipus": ipus, "attempt": job.attempts},
                "at": now,
            }
            for (job, partition, _), (gcd, size, ipus) in zip(placements, held, strict=True)
        ],
    )
    return ids


def _ipu_range(ipus: list[str]) -> str:
    return ipus[0] if len(ipus) == 1 else f"{ipus[0]} .. {ipus[-1]}"


def array_environment(session: Session, job: Job) -> dict[str, str] | None:
    """An array element's environment: its array, index and the array's size and index range, under
    ipucloud's names and Slurm's (SLURM_ARRAY_JOB_ID, _TASK_ID, _TASK_COUNT, _TASK_MIN, _TASK_MAX)."""
    if job.array_id is None or job.array_index is None:
        return None
    array = session.get(JobArray, job.array_id)
    size = array.size if array is not None else 0
    bounds = session.execute(
        select(func.min(Job.array_index), func.max(Job.array_index)).where(Job.array_id == job.array_id)
    ).one()
    lo, hi = int(bounds[0] or 0), int(bounds[1] or 0)
    env = {
        "IPUCLOUD_ARRAY_ID": job.array_id,
        "IPUCLOUD_ARRAY_INDEX": str(job.array_index),
        "IPUCLOUD_ARRAY_SIZE": str(size),
        "SLURM_ARRAY_JOB_ID": job.array_id,
        "SLURM_ARRAY_TASK_ID": str(job.array_index),
        "SLURM_ARRAY_TASK_COUNT": str(size),
        "SLURM_ARRAY_TASK_MIN": str(lo),
        "SLURM_ARRAY_TASK_MAX": str(hi),
    }
    for path, value in (job.params or {}).items():
        env["IPUCLOUD_PARAM_" + path.upper().replace(".", "_")] = str(value)
    return env


@dataclass(frozen=True)
class TakenAttempt:
    """An attempt a host agent now drives, with everything it needs to emulate it."""

    attempt_id: int
    epoch: int
    number: int
    job_id: str
    job_name: str
    tenant_id: str
    partition: str
    partition_ipus: list[str]
    partition_size: int
    partition_gcds: int
    gcd: int
    machine_type: str
    started_at: datetime
    run: emulator.EmulatedRun | ReplicaRun
    """A job's run, or a serving replica's (``endpoint_id`` set): compile, load, serve until drained."""
    end_s: float
    """Cluster time at which the agent ends it: the run's end, or `max_runtime_s` if sooner."""
    max_runtime_s: float | None
    # Checkpoints (training only; None: it takes none): every this many cluster seconds, and the
    # job's run time kept before this attempt and not billed at its start (a restore).
    checkpoint_every_s: float | None = None
    run_base_s: float = 0.0
    unbilled_s: float = 0.0
    # What it is billed at: its type's rate under the tenant's plan (0 in a session, which is billed
    # for holding its partition instead, `session_id`).
    rate: float = 1.0
    session_id: str | None = None
    endpoint_id: str | None = None
    # An array element's IPUCLOUD_ARRAY_* and Slurm's SLURM_ARRAY_* variables (docs/sweeps.md).
    environment: dict[str, str] | None = None

    @property
    def timed_out(self) -> bool:
        return self.end_s < self.run.total_s

    def done_message(self, message: str, ipu_hours: float) -> str:
        """The run's "Done: ..." line with what the grant is charged for it, the raw IPU-hours beside
        it: the grant is spent at rate x IPU-hours, so raw IPU-hours alone misstate it on any type
        whose rate is not 1 (a restored checkpoint's time is not billed)."""
        head, sep, _ = message.rpartition("; ")
        if not sep:
            return message
        if self.session_id is not None:
            return (
                f"{head}; {ipu_hours:,.3f} IPU-hours on {self.machine_type}, billed as part of session "
                f"{self.session_id}"
            )
        billed = ipu_hours * max(0.0, 1.0 - self.unbilled_s / self.run.total_s) if self.run.total_s else 0.0
        return (
            f"{head}; {billed * self.rate:,.3f} IPU-hours charged to the grant ({ipu_hours:,.3f} IPU-hours "
            f"on {self.machine_type} at rate {self.rate:g})"
        )

    def checkpoint_at(self, t: float, reason: str) -> checkpoints.CheckpointDue | None:
        """The checkpoint this attempt has at cluster time `t`: its last completed step, if it
        completed any in this run (None otherwise, or when it takes no checkpoints)."""
        if self.checkpoint_every_s is None:
            return None
        timeline = self.run.timeline
        step = timeline.step_at(t)
        if step <= timeline.first_step:
            return None
        at = timeline.step_time(step)
        return checkpoints.CheckpointDue(
            attempt_id=self.attempt_id,
            job_id=self.job_id,
            attempt=self.number,
            step=step,
            steps=timeline.steps,
            samples=step * timeline.samples_per_step,
            executable_key=self.run.plan.executable_key,
            machine_type=self.machine_type,
            cluster_s=at,
            run_s=self.run_base_s + max(0.0, at - self.unbilled_s),
            reason=reason,
        )


@dataclass
class TakeResult:
    taken: list[TakenAttempt] = field(default_factory=list)
    # Not this agent's to run: a duplicate or stale delivery, or a job no longer wanted.
    refused: list[int] = field(default_factory=list)
    # Taken but unable to run on its partition (it did not compile): ended as failed.
    failed: list[int] = field(default_factory=list)
    # The agent's lease is gone: it took nothing and must stop everything it runs.
    fenced: bool = False


def take_many(
    *,
    session: Session,
    agent: AgentLease,
    deliveries: Sequence[tuple[int, int]],
    lease_s: float,
    clock: Clock,
    running: int = 0,
    ipus_busy: int = 0,
) -> TakeResult:
    """Take delivered attempts `(attempt id, epoch)`: compare-and-set `placed` -> `running` under
    this agent's incarnation, all in the caller's transaction."""
    ids = sorted({attempt_id for attempt_id, _ in deliveries})
    if not agents.renew(session=session, lease=agent, lease_s=lease_s, running=running, ipus_busy=ipus_busy):
        return TakeResult(refused=ids, fenced=True)
    wanted = dict(deliveries)
    # Job rows first, as a cancel takes them (job, then attempt); holding them also makes the
    # "is it still wanted" check below exact.
    jobs = _lock_jobs(session, ids)
    placed = [
        a
        for a in session.execute(
            select(Attempt)
            .where(Attempt.id.in_(ids), Attempt.state == AttemptState.PLACED)
            .order_by(Attempt.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
        if a.epoch == wanted[a.id]
    ]
    result = TakeResult(refused=sorted(set(ids) - {a.id for a in placed}))
    if not placed:
        return result
    now = db_now(session)
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.attempt_id.in_([a.id for a in placed]))
        .values(acked_at=now)
        .execution_options(synchronize_session=False)
    )
    partitions = {
        p.pk: p
        for p in session.execute(
            select(Partition).where(Partition.pk.in_({a.partition_pk for a in placed}))
        ).scalars()
    }
    planned: list[
        tuple[Attempt, Job, Partition, emulator.Plan | emulator.ServePlan, emulator.WorkloadSpec]
    ] = []
    for attempt in placed:
        job = jobs[attempt.job_id]
        partition = partitions[attempt.partition_pk]
        attempt.state = AttemptState.RUNNING
        attempt.epoch += 1
        attempt.worker = agent.name[:200]
        attempt.agent_epoch = agent.epoch
        attempt.started_at = now
        if job.state in FINAL_JOB_STATES or job.cancel_requested:
            # A cancel that raced the placement (or the take itself): do not start what nobody wants.
            end_attempt(
                session=session,
                attempt=attempt,
                job=job,
                outcome=AttemptState.CANCELLED,
                reason="cancelled before it started" if job.cancel_requested else f"job already {job.state}",
                max_attempts=1,
            )
            result.refused.append(attempt.id)
            continue
        ipus = gcd_ipus(partition.ipu_ids, partition.gcds, attempt.gcd)
        plan: emulator.Plan | emulator.ServePlan
        try:
            if job.task == SERVE_TASK:
                plan, spec = emulation.serve_plan_on_partition(
                    job.spec, len(ipus), partition.machine_type, session=session
                )
            else:
                plan, spec = emulation.plan_on_partition(
                    job.spec, len(ipus), partition.machine_type, ipus, session=session
                )
        except (emulator.CompileError, emulator.WorkloadError) as exc:
            add_event(
                session, job.id, "log", f"compile failed: {exc}", attempt=attempt.number,
                data={"phase": "compile", "error": str(exc)}, at=now,
            )  # fmt: skip
            end_attempt(
                session=session,
                attempt=attempt,
                job=job,
                outcome=AttemptState.FAILED,
                reason=f"compile error: {exc}",
                max_attempts=1,
            )
            result.failed.append(attempt.id)
            continue
        planned.append((attempt, job, partition, plan, spec))
    cache_key = {
        attempt.id: executables.tenant_key(tenant_id=job.tenant_id, key=plan.executable_key)
        for attempt, job, _, plan, _ in planned
    }
    cached = executables.cached_keys(session=session, keys=set(cache_key.values()))
    # A job that checkpointed resumes from its last checkpoint (docs/checkpoints.md).
    resume_from = checkpoints.latest_by_job(
        session=session, job_ids=[job.id for _, job, _, _, _ in planned if job.task == "train"]
    )
    started_events: list[dict[str, Any]] = []
    for attempt, job, partition, planned_plan, spec in planned:
        plan = planned_plan
        checkpoint = resume_from.get(job.id)
        first_step, run_base = (checkpoint.step, checkpoint.run_s) if checkpoint is not None else (0, 0.0)
        warm = cache_key[attempt.id] in cached
        run: emulator.EmulatedRun | ReplicaRun
        if isinstance(plan, emulator.ServePlan):
            run = ReplicaRun(plan, spec, cached=warm)
        else:
            try:
                run = emulation.emulated_run(plan, spec, cached=warm, first_step=first_step)
            except ValueError:  # a checkpoint past the run's end (its spec changed): start afresh
                first_step, run_base = 0, 0.0
                run = emulation.emulated_run(plan, spec, cached=warm)
        # Restoring a checkpoint (compile if need be, load) is the platform's cost, not billed.
        unbilled = run.run_start_s if first_step else 0.0
        end_s = run.total_s
        if job.max_runtime_s is not None:
            # The time limit counts the job's run time, kept across attempts, since its owner last
            # started or resumed it.
            budget = max(0.0, float(job.max_runtime_s) - max(0.0, run_base - job.runtime_base_s))
            end_s = min(run.total_s, unbilled + budget)
        attempt.unbilled_s = unbilled
        attempt.timeline = {
            **run.timeline.to_dict(),
            "end_s": end_s,
            "scale": clock.scale,
            "cached": run.cached,
            "unbilled_s": unbilled,
            "run_base_s": run_base,
        }
        job.state = JobState.RUNNING
        job.started_at = job.started_at or now
        job.updated_at = now
        notifications.job_event(
            session, job, "job.started", key=f"{job.id}:{attempt.number}", attempt=attempt.number
        )
        started_events.append(
            {
                "job_id": job.id,
                "attempt": attempt.number,
                "kind": "state",
                "message": f"running (attempt {attempt.number})",
                "data": {"state": "running"},
                "at": now,
            }
        )
        result.taken.append(
            TakenAttempt(
                attempt_id=attempt.id,
                epoch=attempt.epoch,
                number=attempt.number,
                job_id=job.id,
                job_name=job.name,
                tenant_id=job.tenant_id,
                partition=partition.name,
                partition_ipus=gcd_ipus(partition.ipu_ids, partition.gcds, attempt.gcd),
                partition_size=attempt.size,
                partition_gcds=partition.gcds,
                gcd=attempt.gcd,
                machine_type=partition.machine_type,
                started_at=now,
                run=run,
                end_s=end_s,
                max_runtime_s=job.max_runtime_s,
                checkpoint_every_s=(
                    float(job.checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S)
                    if job.task == "train"
                    else None
                ),
                run_base_s=run_base,
                unbilled_s=unbilled,
                rate=attempt.rate if attempt.rate is not None else 1.0,
                session_id=job.session_id,
                endpoint_id=str(job.spec.get("endpoint")) if job.task == SERVE_TASK else None,
                environment=array_environment(session, job),
            )
        )
    if started_events:
        session.execute(insert(JobEvent.__table__), started_events)
    return result


def take(
    *,
    session: Session,
    agent: AgentLease,
    attempt_id: int,
    epoch: int,
    lease_s: float,
    clock: Clock = UNSCALED,
) -> TakenAttempt | None:
    """`take_many` of one delivery."""
    result = take_many(
        session=session, agent=agent, deliveries=[(attempt_id, epoch)], lease_s=lease_s, clock=clock
    )
    return result.taken[0] if result.taken else None


@dataclass(frozen=True)
class LogLine:
    """A line of a running attempt's log, as its agent saw it happen."""

    job_id: str
    attempt: int
    kind: str
    message: str
    data: dict[str, Any] | None = None
    at: datetime | None = None


@dataclass(frozen=True)
class Bill:
    """Bill attempt `attempt_id` up to `cluster_s`, as its tick number `seq` (1, 2, ...)."""

    attempt_id: int
    seq: int
    cluster_s: float


@dataclass(frozen=True)
class Finish:
    """The agent's last word on an attempt."""

    attempt_id: int
    outcome: AttemptState
    cluster_s: float
    reason: str | None = None
    progress: ProgressView | None = None


@dataclass
class TickResult:
    fenced: bool = False
    # Attempts no longer running under this agent (the control plane ended them): forget them.
    gone: set[int] = field(default_factory=set)
    # Attempts whose tenant's grant ran out: billed what was left; the agent ends them now.
    exhausted: set[int] = field(default_factory=set)
    # Finishes that were written.
    finished: set[int] = field(default_factory=set)


def record_tick(
    *,
    session: Session,
    agent: AgentLease,
    lease_s: float,
    running: int = 0,
    ipus_busy: int = 0,
    logs: Sequence[LogLine] = (),
    bills: Sequence[Bill] = (),
    finishes: Sequence[Finish] = (),
    compiled: Iterable[tuple[str, str, float]] = (),
    max_attempts: int = 3,
    saved: Sequence[checkpoints.CheckpointDue] = (),
) -> TickResult:
    """One agent tick in the caller's transaction: renew the agent's lease (its heartbeat), write the
    log lines, record compiled executables `(tenant_key, machine type, compile_s)`, write the checkpoints
    `saved` of attempts it still holds, end what finished and bill what is due. Nothing is written if
    the lease is gone."""
    if not agents.renew(session=session, lease=agent, lease_s=lease_s, running=running, ipus_busy=ipus_busy):
        return TickResult(fenced=True)
    result = TickResult()
    now = utcnow()
    executables.record_many(session=session, entries=list(compiled))
    if logs:
        session.execute(
            insert(JobEvent.__table__),
            [
                {
                    "job_id": line.job_id,
                    "attempt": line.attempt,
                    "kind": line.kind,
                    "message": line.message[:2000],
                    "data": line.data,
                    "at": line.at or now,
                }
                for line in logs
            ],
        )
    ending = {f.attempt_id: f for f in finishes}
    billing = {b.attempt_id: b for b in bills if b.attempt_id not in ending}
    # Checkpoints of attempts neither ending nor billed this tick lock their attempts with the billed.
    saving = {c.attempt_id for c in saved} - set(ending) - set(billing)
    if not ending and not billing and not saving:
        return result
    jobs = _lock_jobs(session, ending)
    held = _lock_held(session, agent, ending)
    locked = _lock_billing(session, agent, set(billing) | saving)
    billed = [row for row in locked if row[0].id in billing]
    still = held.keys() | {m.id for m, _, _ in locked}
    result.gone = (set(ending) - held.keys()) | ((set(billing) | saving) - still)
    # Only for attempts still ours: an attempt the control plane ended was settled on the
    # checkpoints it had then, and must not resume past what was billed.
    checkpoints.record(session=session, items=[c for c in saved if c.attempt_id in still])
    endings: list[Ending] = []
    for attempt in held.values():
        f = ending[attempt.id]
        attempt.cluster_s = max(attempt.cluster_s, f.cluster_s)
        attempt.progress = f.progress
        endings.append(Ending(attempt, jobs[attempt.job_id], f.outcome, f.reason))
        result.finished.add(attempt.id)
    ticks = [
        metering.TickDue(m, billing[m.id].seq, billing[m.id].cluster_s, reserved, workload)
        for m, reserved, workload in billed
    ]
    # Both move tenants' counters, each tenant's in one order (metering.settle_many, meter_ticks).
    end_attempts(session=session, endings=endings, max_attempts=max_attempts)
    result.exhausted = metering.meter_ticks(session=session, ticks=ticks)
    return result


def _lock_jobs(session: Session, attempt_ids: Iterable[int]) -> dict[str, Job]:
    """The jobs of these attempts, locked in id order (jobs before attempts, always).

    FOR NO KEY UPDATE (`key_share=True`), not FOR UPDATE: a row inserted with a foreign key to the job
    (a job event, an agent tick's meter event) takes a KEY SHARE lock on it, which FOR UPDATE blocks.
    An agent's tick locks the attempt it bills and only then writes its meter event, so a stop (an
    endpoint's DELETE) holding the job FOR UPDATE and waiting for that attempt deadlocked with it."""
    ids = sorted(attempt_ids)
    if not ids:
        return {}
    return {
        j.id: j
        for j in session.execute(
            select(Job)
            .where(Job.id.in_(select(Attempt.job_id).where(Attempt.id.in_(ids))))
            .order_by(Job.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).scalars()
    }


def _lock_held(session: Session, agent: AgentLease, attempt_ids: Iterable[int]) -> dict[int, Attempt]:
    """The attempts among these still running under this agent's incarnation, locked."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return {}
    return {
        a.id: a
        for a in session.execute(
            select(Attempt)
            .where(
                Attempt.id.in_(ids),
                Attempt.state == AttemptState.RUNNING,
                Attempt.worker == agent.name,
                Attempt.agent_epoch == agent.epoch,
            )
            .order_by(Attempt.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    }


def _lock_billing(
    session: Session, agent: AgentLease, attempt_ids: Iterable[int]
) -> list[tuple[metering.Metered, int, str]]:
    """The attempts among these still running under this agent's incarnation, locked, as what
    billing them needs (no ORM objects), each with its job's reservation and workload. The job's
    row is read, not locked: neither changes while an attempt of the job runs."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return []
    rows = session.execute(
        select(
            Attempt.id,
            Attempt.tenant_id,
            Attempt.job_id,
            Attempt.size,
            Attempt.metered_ipu_ms,
            Attempt.reservation_used_ipu_ms,
            Attempt.cluster_s,
            Attempt.ticks,
            Job.reserved_ipu_ms,
            Job.model,
            Attempt.machine_type,
            Attempt.rate,
            Attempt.unbilled_s,
        )
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.id.in_(ids),
            Attempt.state == AttemptState.RUNNING,
            Attempt.worker == agent.name,
            Attempt.agent_epoch == agent.epoch,
        )
        .order_by(Attempt.id)
        .with_for_update(of=Attempt)
    ).tuples()
    out = []
    for row in rows:
        aid, tenant, job, size, metered, used, cluster_s, ticks, reserved, model, kind, rate, unbilled = row
        out.append(
            (
                metering.Metered(
                    aid, tenant, job, size, metered, used, cluster_s, ticks, kind, rate, unbilled or 0.0
                ),
                int(reserved),
                model,
            )
        )
    return out


def finish(
    *,
    session: Session,
    agent: AgentLease,
    attempt_id: int,
    outcome: AttemptState,
    cluster_s: float,
    lease_s: float,
    reason: str | None = None,
    progress: ProgressView | None = None,
    max_attempts: int = 3,
) -> bool:
    """One attempt's end as its agent reports it (`record_tick` with one finish). False, and nothing
    written, if the agent's lease or its hold on the attempt is gone."""
    result = record_tick(
        session=session,
        agent=agent,
        lease_s=lease_s,
        finishes=[Finish(attempt_id, outcome, cluster_s, reason, progress)],
        max_attempts=max_attempts,
    )
    return attempt_id in result.finished


def answered_until(attempt: Attempt, agent: Agent | None) -> datetime | None:
    """The wall time past which a running attempt's clock does not run: its agent's last heartbeat
    plus a quarter of the agent's lease. An agent that stops answering stops its attempts' clocks
    then, instead of their progress climbing for the rest of its lease and falling back when the
    lease lapses. A live agent renews every `IPUCLOUD_HEARTBEAT_S`, well inside that grace, so its
    runs are never held back. None (no limit): no agent, or another incarnation of it."""
    if agent is None or attempt.agent_epoch is None or agent.epoch != attempt.agent_epoch:
        return None
    grace = max(timedelta(0), (agent.lease_expires_at - agent.heartbeat_at) / 4)
    return agent.heartbeat_at + grace


def agent_of(attempt: Attempt) -> Agent | None:
    """The agent row of a running attempt, through the session the attempt was loaded in."""
    s = object_session(attempt)
    if s is None or not attempt.worker or attempt.state != AttemptState.RUNNING:
        return None
    return s.get(Agent, attempt.worker)


def derived_cluster_s(attempt: Attempt, now: datetime, *, agent: Agent | None = None) -> float:
    """How far a running attempt's run has got, from its start and its timeline: what the agent
    driving it reaches at `now`, without asking the agent, but no further than its agent answered
    (`answered_until`; the agent is looked up when not given)."""
    timeline = attempt.timeline
    if attempt.started_at is None or not timeline:
        return attempt.cluster_s
    until = answered_until(attempt, agent if agent is not None else agent_of(attempt))
    if until is not None and until < now:
        now = until
    # The clock it was taken at (its timeline's), not the process's: it runs on that to its end.
    t = Clock(float(timeline["scale"])).cluster_since(attempt.started_at, now)
    return max(attempt.cluster_s, min(float(timeline["end_s"]), max(0.0, t)))


class ProgressView(TypedDict):
    """How far a run has got at a cluster time: phase, step, samples, rate, memory."""

    phase: str
    step: int
    steps: int
    samples: int
    percent: float
    eta_s: float
    throughput: float
    memory_per_ipu_bytes: int
    cluster_s: float


def progress_of(attempt: Attempt, now: datetime) -> ProgressView | None:
    """The attempt's progress: derived while it runs, as recorded once it ended."""
    if attempt.state != AttemptState.RUNNING or not attempt.timeline:
        return cast("ProgressView | None", attempt.progress)  # what progress_dict gave, stored
    t = derived_cluster_s(attempt, now)
    return progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(t), t)


def progress_at(attempt: Attempt, cluster_s: float) -> ProgressView | None:
    """Where the attempt's timeline has it `cluster_s` into its run (None without a timeline)."""
    if not attempt.timeline:
        return None
    return progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(cluster_s), cluster_s)


def progress_dict(progress: emulator.Progress, cluster_s: float) -> ProgressView:
    return {
        "phase": progress.phase,
        "step": progress.step,
        "steps": progress.steps,
        "samples": progress.samples,
        "percent": round(progress.percent, 2),
        "eta_s": round(progress.eta_s, 3),
        "throughput": round(progress.throughput, 3),
        "memory_per_ipu_bytes": progress.memory_per_ipu_bytes,
        "cluster_s": round(cluster_s, 3),
    }


def stop_running(
    *,
    session: Session,
    attempt_ids: Sequence[int],
    outcome: AttemptState,
    reason: str,
    max_attempts: int,
) -> list[Attempt]:
    """The control plane ends live attempts itself: a cancel, a preemption, a failed machine, a
    lapsed agent. Each still live (placed or running) is ended now, a running one at the cluster
    time its run has reached; the others were ended meanwhile and are left alone. Returns the
    attempts ended; the agents driving them are told over the bus once this commits, or find out at
    their next look."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return []
    jobs = _lock_jobs(session, ids)
    live = list(
        session.execute(
            select(Attempt)
            .where(Attempt.id.in_(ids), Attempt.state.in_((AttemptState.PLACED, AttemptState.RUNNING)))
            .order_by(Attempt.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    )
    now = db_now(session)
    for attempt in live:
        if attempt.state == AttemptState.RUNNING and attempt.worker:
            bus.publish_after_commit(session, bus.STOP_CHANNEL, f"{attempt.worker} {attempt.id}")
        if attempt.state == AttemptState.RUNNING and attempt.timeline:
            t = derived_cluster_s(attempt, now)
            attempt.cluster_s = t
            attempt.progress = progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(t), t)
    end_attempts(
        session=session,
        endings=[Ending(a, jobs[a.job_id], outcome, reason) for a in live],
        max_attempts=max_attempts,
    )
    return live


@dataclass(frozen=True)
class Ending:
    """An attempt to end (its row locked by the caller), how, and why."""

    attempt: Attempt
    job: Job
    outcome: AttemptState
    reason: str | None


def end_attempt(
    *,
    session: Session,
    attempt: Attempt,
    job: Job,
    outcome: AttemptState,
    reason: str | None,
    max_attempts: int,
) -> None:
    """Settle, free the partition, and move the job on. The caller has fenced the attempt."""
    end_attempts(session=session, endings=[Ending(attempt, job, outcome, reason)], max_attempts=max_attempts)


def end_attempts(*, session: Session, endings: Sequence[Ending], max_attempts: int) -> None:
    """End many attempts in a handful of statements, whatever their number (an agent's tick, a
    lapsed agent, a failed machine): mark them, ack their outbox messages, free their partitions,
    move their jobs on, and settle them.

    The settle comes last: it moves the tenants' counters, and every attempt of a tenant ends
    through that row's lock, so it is held only for the last statements and the commit.
    """
    if not endings:
        return
    now = utcnow()
    for e in endings:
        e.attempt.state = e.outcome
        e.attempt.ended_at = now
        e.attempt.end_reason = e.reason
    ids = [e.attempt.id for e in endings]
    # The attempts' and the jobs' changes are written together, by the settle's flush.
    with session.no_autoflush:
        # Nobody needs the messages any more: the reconciler must not publish them again.
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.attempt_id.in_(ids), OutboxMessage.acked_at.is_(None))
            .values(acked_at=now)
            .execution_options(synchronize_session=False)
        )
        fleet.release_job_partitions(session=session, partition_pks=[e.attempt.partition_pk for e in endings])
        lost = _lost_attempts(
            session,
            [e for e in endings if e.outcome == AttemptState.LOST and e.job.state not in FINAL_JOB_STATES],
        )
        events: list[dict[str, Any]] = []
        for e in endings:
            # Only an attempt the reconciler ends for a job that already ended finds the job final:
            # its outcome was decided, and this attempt's end must not rewrite it.
            if e.job.state not in FINAL_JOB_STATES:
                _move_job_on(session, e, lost.get(e.job.id, 0), max_attempts, now, events)
        if events:
            session.execute(insert(JobEvent.__table__), events)
    # A platform fault keeps (and bills) the work up to the attempt's last checkpoint.
    kept = checkpoints.kept_by_attempt(
        session=session, attempt_ids=[e.attempt.id for e in endings if e.outcome in PLATFORM_FAULT_STATES]
    )
    holds = _hold_refunds(session, [e for e in endings if e.outcome in PLATFORM_FAULT_STATES], kept, now)
    # Last, since it moves the tenant's counters (and an ended job gives back what it reserves).
    metering.settle_many(
        session=session,
        items=[
            metering.Settle(
                attempt=e.attempt,
                job=e.job,
                billable=e.outcome not in PLATFORM_FAULT_STATES,
                outcome=str(e.outcome),
                job_ends=e.job.state in FINAL_JOB_STATES,
                kept_s=kept.get(e.attempt.id) if e.outcome in PLATFORM_FAULT_STATES else None,
            )
            for e in endings
        ],
    )
    metering.refund_holds(session=session, refunds=holds)


def _hold_refunds(
    session: Session, faulted: Sequence[Ending], kept: dict[int, float], now: datetime
) -> list[metering.HoldRefund]:
    """What a platform fault wasted of the sessions whose jobs it hit: a session job pays nothing
    itself (its session is billed for holding the partition), so without this the session paid for
    the IPUs the fault left idle, while a batch job hit by the same fault is billed only up to its
    last checkpoint. Per faulted job: its IPUs, from its last checkpoint (or its start) to the end
    of its attempt (a lost one's: when the reconciler found its agent gone), in cluster seconds."""
    hit = [e for e in faulted if e.job.session_id is not None and e.attempt.gcd >= 0]
    if not hit:
        return []
    holds = {
        row.id: row
        for row in session.execute(
            select(IpuSession).where(IpuSession.id.in_({e.job.session_id for e in hit}))
        ).scalars()
    }
    hold_ids = sorted({h.attempt_id for h in holds.values() if h.attempt_id is not None})
    held = {
        a.id: a
        for a in session.execute(
            select(Attempt).where(Attempt.id.in_(hold_ids)).order_by(Attempt.id).with_for_update()
        ).scalars()
    }
    out = []
    for e in hit:
        row = holds.get(e.job.session_id or "")
        hold = held.get(row.attempt_id or 0) if row is not None else None
        a = e.attempt
        if hold is None or hold.state != AttemptState.RUNNING or a.started_at is None:
            continue  # the hold ended too: its own settle decides what it is billed
        timeline = a.timeline or {}
        clock = Clock(float(timeline.get("scale") or 1.0))  # the one it was taken at
        started = a.started_at if a.started_at.tzinfo is not None else a.started_at.replace(tzinfo=now.tzinfo)
        ran = max(float(a.cluster_s or 0.0), clock.cluster_since(started, now))
        ran = min(ran, float(timeline.get("end_s") or ran))
        wasted = ran - float(kept.get(a.id) or 0.0)
        if wasted > 0:
            out.append(metering.HoldRefund(hold, a.id, a.size, wasted, e.job.model, str(e.outcome)))
    return out


def _move_job_on(
    session: Session,
    e: Ending,
    lost_before: int,
    max_attempts: int,
    now: datetime,
    events: list[dict[str, Any]],
) -> None:
    job, attempt, outcome, reason = e.job, e.attempt, e.outcome, e.reason

    def end(state: JobState, why: str | None) -> None:
        finalize_job(session=session, job=job, state=state, reason=why, release=False, events=events)

    if outcome == AttemptState.SUCCEEDED:
        end(JobState.SUCCEEDED, None)
    elif outcome == AttemptState.CANCELLED:
        end(JobState.CANCELLED, reason or "cancelled by user")
    elif outcome in (AttemptState.FAILED, AttemptState.TIMED_OUT):
        end(JobState.FAILED, reason)
    elif job.cancel_requested:
        end(JobState.CANCELLED, "cancelled by user")
    elif job.task == "session":
        # A session's hold lost to the platform (a failed machine): the session ends (its sweep frees
        # the partition, scheduler/services/sessions.py); holding another partition is not what was asked.
        end(JobState.FAILED, f"session's partition lost: {reason or outcome}")
    elif outcome != AttemptState.LOST or lost_before + 1 < max_attempts:
        # Only lost attempts count against the retry limit: a handed-back, preempted or interrupted
        # attempt is the platform making room or failing under it, not a sign that the job crashes
        # its host agent.
        job.state = JobState.QUEUED
        job.updated_at = now
        if outcome == AttemptState.PREEMPTED:
            # Why and for whom, as the job's history says it (another tenant's job is never named:
            # scheduling.preemption_reason).
            notifications.job_event(
                session,
                job,
                "job.preempted",
                key=f"{job.id}:{attempt.number}",
                attempt=attempt.number,
                reason=reason,
            )
        events.append(
            {
                "job_id": job.id,
                "attempt": attempt.number,
                "kind": "state",
                "message": (
                    f"requeued: attempt {attempt.number} {outcome}" + (f" ({reason})" if reason else "")
                )[:2000],
                "data": {"state": "queued", "requeued": True, "reason": reason},
                "at": now,
            }
        )
    else:
        end(JobState.FAILED, f"gave up after {max_attempts} lost attempts; last: {reason or outcome}")


def _lost_attempts(session: Session, endings: list[Ending]) -> dict[str, int]:
    """Each job's earlier lost attempts (these endings' new states are not written yet)."""
    if not endings:
        return {}
    return {
        job_id: int(n)
        for job_id, n in session.execute(
            select(Attempt.job_id, func.count())
            .where(
                Attempt.job_id.in_({e.job.id for e in endings}),
                Attempt.id.not_in([e.attempt.id for e in endings]),
                Attempt.state == AttemptState.LOST,
            )
            .group_by(Attempt.job_id)
        ).tuples()
    }


# Agent incarnations that end ------------------------------------------------------------------------


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
