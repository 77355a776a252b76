"""The live side of the scheduling policy: a `Snapshot` from the database, and what a `Decision` writes
besides placements (preemptions, why jobs wait, fair-share samples).

Times handed to the policy are wall-clock epoch seconds, the scheduler's clock. Predicted run times
and usage are cluster time (docs/architecture.md, "Clocks"), so the pass's `Clock` converts them on
the way in: a job predicted to take 100 cluster seconds holds its partition for
`clock.to_wall(100)` wall seconds.

Fair share needs each tenant's decayed usage. Summing meter events at every pass would grow with the
history; instead each tenant row keeps its decayed usage as last sampled, with the metered counter
(`used_ipu_ms`) at that moment. A pass adds what was metered since (`add_sample`) and writes the new
sample back at most every `FAIRSHARE_SAMPLE_S`, so a pass costs one row per queued tenant.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session, aliased, defer

from scheduler import billing
from scheduler.clock import UNSCALED, Clock
from scheduler.ids import id_floor
from scheduler.jobspec import DEFAULT_CHECKPOINT_EVERY_S
from scheduler.models import (
    LIVE_ATTEMPT_STATES,
    SERVE_TASK,
    Attempt,
    AttemptState,
    Ipu,
    IpuAssignment,
    Job,
    JobState,
    Partition,
    Plan,
    Tenant,
)
from scheduler.policy import (
    HeldArray,
    JobQueue,
    MachineOption,
    PolicyConfig,
    QueuedJob,
    ReservedPartition,
    RunningJob,
    Snapshot,
    TenantState,
    Wait,
    add_sample,
    expected_end,
    get_policy,
)
from scheduler.policy.las import job_class, plan_of
from scheduler.policy.preemption import resumed_runtime_s
from scheduler.services.batch import arrays, attempts, checkpoints
from scheduler.services.clock import db_now
from scheduler.services.views import WaitView
from scheduler.settings import Settings
from vipu.allocator import Allocator
from vipu.machine_types import MACHINE_TYPE_NAMES

# Partitions that host jobs they outlive: reserved ones, and sessions' (a session job waiting for a
# free graph compile domain is placed like a job in a reserved partition).
_HOSTING = ("reserved", "session")

# A preempted job goes back at the head of its tenant's work: ahead of every priority its owner
# may give (-100 .. 100), so what it gave up its IPUs for is all that runs before it resumes.
REQUEUED_FIRST = 101
FAIRSHARE_SAMPLE_S = 60.0  # wall seconds between writes of a tenant's fair-share sample


def has_queued(*, session: Session) -> bool:
    """Whether any job waits (one indexed probe)."""
    return session.execute(select(Job.id).where(Job.state == JobState.QUEUED).limit(1)).first() is not None


# JSON a pass does not read of the jobs it starts: left unloaded (loaded if something does read
# them), as decoding them cost a pass starting 5,000 jobs a tenth of a second or more.
_UNREAD_WHEN_PLACING = (Job.spec, Job.submit_response, Job.notify, Job.params, Job.depends_on)


def lock_startable(*, session: Session, job_ids: Collection[str]) -> dict[str, Job]:
    """Lock the jobs a pass decided to start and keep those still queued and not being cancelled: a
    cancel may have committed since the snapshot. The cancel locks the job too, so it either saw no
    attempt or will find this one placed."""
    return {
        j.id: j
        for j in session.execute(
            select(Job)
            .where(Job.id.in_(job_ids))
            .with_for_update(key_share=True)
            .options(*(defer(column) for column in _UNREAD_WHEN_PLACING))
            .execution_options(populate_existing=True)
        ).scalars()
        if j.state == JobState.QUEUED and not j.cancel_requested
    }


def live_policy(settings: Settings) -> PolicyConfig:
    """The policy IPUCLOUD_SCHEDULER_POLICY names, with the cloud's IPUCLOUD_PLACEMENT_POLICY.

    IPUCLOUD_PREEMPTION switches on preemption for a higher plan's work; a policy that preempts by
    itself (`default-classes`: a lower service class, when it pays) keeps it on whatever the switch
    says. Its guards' times are cluster seconds, as the emulator's costs are, while the pass runs on
    the wall clock (`clock_scale`)."""
    base = get_policy(settings.scheduler_policy)
    return base.with_options(
        placement=settings.placement_policy,
        preemption=base.preemption or settings.preemption,
        clock_scale=settings.time_scale,
        preempt_warning_s=settings.preemption_warning_s,
    )


@dataclass
class LiveSnapshot:
    snapshot: Snapshot
    waits: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)  # stored, when asked for
    # Fair-share samples due, written by `write_fairshare_samples` in a transaction of their own:
    # kept inside the pass, those tenant row locks would hold up every submission and meter tick
    # of those tenants until the pass commits.
    samples: list[dict[str, Any]] = field(default_factory=list)
    # Queued jobs kept from the policy (`gate_queue`) and why they wait.
    gated: dict[str, Wait] = field(default_factory=dict)


def plan_priority(*, session: Session, tenant_id: str | None) -> int:
    """The plan priority a tenant's queued work is ranked at, as `build_snapshot` reads it (0 for
    no tenant: an admin's estimate)."""
    if tenant_id is None:
        return 0
    found = session.execute(
        select(Plan.priority).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).scalar_one_or_none()
    return int(found or 0)


def build_snapshot(
    *,
    session: Session,
    allocator: Allocator,
    now: datetime,
    clock: Clock,
    half_life_s: float,
    arrivals_seen: set[str] | None = None,
    read_waits: bool = False,
    also_tenants: Collection[str] = (),
    policy: PolicyConfig | None = None,
) -> LiveSnapshot:
    """Everything a pass decides over, read in a handful of indexed queries.

    ``arrivals_seen`` holds the ids of queued jobs shown to the policy before (the caller keeps it);
    jobs not in it are this pass's arrivals, whose sizes feed the placement policy's demand model.
    ``read_waits`` also returns each queued job's stored wait, to compare new explanations with.
    ``also_tenants`` are read with the tenants that have queued jobs (an estimate's asker).
    """
    now_s = now.timestamp()
    queue = _read_queue(session=session, now_s=now_s, clock=clock, read_waits=read_waits, policy=policy)
    queued = queue.queued
    live = _read_running(session=session, now=now, clock=clock, policy=policy)
    samples: list[dict[str, Any]] = []
    tenants = _tenant_states(
        session=session,
        samples=samples,
        tenant_ids={q.tenant_id for q in queued} | set(also_tenants),
        now=now,
        clock=clock,
        half_life_s=half_life_s,
        held_by_queued=queue.held_by_queued,
        running_jobs=live.running_jobs,
        committed=live.committed,
    )
    gated: dict[str, Wait] = {}
    held_arrays: dict[str, HeldArray] = {}
    if queue.extra:
        queued, gated = gate_queue(
            session=session, queued=queued, extra=queue.extra, tenants=tenants, held=held_arrays
        )
    reserved = _hosting_partitions(session=session, busy=live.busy)
    # Only a preemptible job's forecast expects later work (scheduler.policy.forecast, `_inflow`).
    window = policy.inflow_window_s if policy is not None else 0.0
    yielding = any(q.preemptible for q in queued) or any(
        q.preemptible for held in held_arrays.values() for q in held.waiting
    )
    recent = (
        _read_recent(session=session, now_s=now_s, clock=clock, policy=policy, window_s=window)
        if policy is not None and window > 0 and yielding
        else []
    )
    snapshot = Snapshot(
        now=now_s,
        queue=JobQueue(queued),
        running=live.running,
        tenants=tenants,
        allocator=allocator,
        reserved=reserved,
        arrivals=_arrivals(queued, arrivals_seen),
        held=held_arrays,
        stopping=live.stopping,
        recent=recent,
    )
    return LiveSnapshot(snapshot, queue.stored, samples, gated)


def _read_recent(
    *, session: Session, now_s: float, clock: Clock, policy: PolicyConfig, window_s: float
) -> list[QueuedJob]:
    """The non-preemptible jobs submitted in the last ``window_s`` (any state), each as it was
    queued, in the class it was submitted in (`Snapshot.recent`)."""
    since = now_s - window_s
    rows = session.execute(
        select(
            Job.id,
            Job.tenant_id,
            Job.ipus,
            Job.created_at,
            Job.predicted_runtime_s,
            Job.machine_type,
            Job.task,
            Plan.priority,
        )
        .join(Tenant, Tenant.id == Job.tenant_id)
        .join(Plan, Plan.name == Tenant.plan_name)
        .where(
            Job.id >= id_floor("job", since),
            Job.created_at >= datetime.fromtimestamp(since, UTC),
            Job.preemptible.is_(False),
            Job.partition_name.is_(None),
        )
    ).all()
    out = []
    for job_id, tenant_id, size, created, predicted, machine, task, plan_priority in rows:
        if predicted is None or not size or task == SERVE_TASK:
            continue  # an endpoint's replicas are not work submitted to the queue
        run_s = clock.to_wall(predicted)
        out.append(
            QueuedJob(
                id=job_id,
                tenant_id=tenant_id,
                size=size,
                submitted_at=created.timestamp(),
                predicted_runtime_s=run_s,
                priority=job_class(policy, plan_priority, size, run_s),
                machine_type=machine,
            )
        )
    return out


@dataclass
class _Queue:
    """The queue as `_read_queue` found it, with what the later steps of `build_snapshot` need."""

    queued: list[QueuedJob]
    held_by_queued: dict[str, int]  # quota reserved by each tenant's queued jobs
    stored: dict[str, Mapping[str, Any] | None]  # stored waits, when asked for
    # Array, singleton and dependency facts of the jobs `gate_queue` has to look at.
    extra: dict[str, tuple[str | None, int | None, bool, str, str | None]]


def _read_queue(
    *, session: Session, now_s: float, clock: Clock, read_waits: bool, policy: PolicyConfig | None
) -> _Queue:
    """The queued jobs not being cancelled and not already running, as the policy sees them."""
    live = select(Attempt.job_id).where(Attempt.state.in_(LIVE_ATTEMPT_STATES)).scalar_subquery()
    columns = [
        Job.id,
        Job.tenant_id,
        Job.ipus,
        Job.created_at,
        Job.predicted_runtime_s,
        Job.priority,
        Job.machine_type,
        Job.partition_name,
        Job.reserved_ipu_ms,
        Job.options,
        Job.prefer,
        Job.preemptible,
        Job.task,
    ]
    if read_waits:
        columns.append(Job.wait)
    # Arrays, singletons and dependencies (scheduler/services/batch/arrays.py, `gate_queue`).
    columns += [Job.array_id, Job.array_index, Job.singleton, Job.name, Job.held_for]
    # The class ranking a job against every tenant's is its tenant's plan priority as it is now
    # (an admin's plan edit reaches queued jobs); the job's own priority orders its tenant's jobs.
    columns.append(Plan.priority)
    rows = session.execute(
        select(*columns)
        .join(Tenant, Tenant.id == Job.tenant_id)
        .join(Plan, Plan.name == Tenant.plan_name)
        .where(Job.state == JobState.QUEUED, Job.cancel_requested.is_(False), Job.id.not_in(live))
    ).all()
    # A requeued job resumes from its last checkpoint: it is predicted to run what that did not keep.
    kept = checkpoints.kept_run_s_of_queued(session=session)
    queue = _Queue(queued=[], held_by_queued={}, stored={}, extra={})
    held_by_queued, extra = queue.held_by_queued, queue.extra
    for row in rows:
        job_id, tenant_id, size, created, predicted, priority, machine, partition, held, choices, prefer = (
            row[:11]
        )
        predicted_whole = predicted  # what its quota reservation was taken for (billing's, unchanged)
        preemptible, task, plan_priority = row[11], row[12], row[-1]
        if job_id in kept:
            predicted = resumed_runtime_s(predicted, kept[job_id])
        # A job with one type to run on is a job of that type: its own prediction is the one to use.
        options = machine_options(choices, clock) if machine is None and partition is None else ()
        if job_id in kept:
            options = tuple(
                replace(
                    o,
                    predicted_runtime_s=resumed_runtime_s(o.predicted_runtime_s, clock.to_wall(kept[job_id])),
                )
                for o in options
            )
        if len(options) == 1:
            machine, options = options[0].machine_type, ()
        queue.queued.append(
            QueuedJob(
                id=job_id,
                tenant_id=tenant_id,
                size=min((o.size for o in options), default=size),
                submitted_at=created.timestamp(),
                predicted_runtime_s=clock.to_wall(predicted),
                # Below the plan's priority, the policy's service class (scheduler.policy.las).
                priority=(
                    plan_priority
                    if policy is None
                    else job_class(
                        policy,
                        plan_priority,
                        size,
                        clock.to_wall(predicted),
                        waited_s=max(0.0, now_s - created.timestamp()),
                    )
                ),
                user_priority=priority,
                machine_type=machine,
                partition=partition,
                # What its reservation covers: its promised option (billing.promised_kind), or its
                # one type at its rate.
                cost_ipu_ms=(
                    billing.reserve_ipu_ms(choices, prefer or "time")
                    if options
                    else _typed_cost(size, predicted_whole, choices, machine)
                ),
                options=options,
                prefer=prefer or "time",
                preemptible=bool(preemptible),
                counted=task != SERVE_TASK,
            )
        )
        held_by_queued[tenant_id] = held_by_queued.get(tenant_id, 0) + held
        if read_waits:
            queue.stored[job_id] = row[13]
        array_id, array_index, singleton, name, held_for = row[-6:-1]
        if array_id is not None or singleton or held_for is not None:
            extra[job_id] = (array_id, array_index, bool(singleton), name, held_for)

    queue.queued = _requeued_first(session=session, queued=queue.queued)
    return queue


def _requeued_first(*, session: Session, queued: list[QueuedJob]) -> list[QueuedJob]:
    """The queue with the jobs that were preempted at the head of their tenants' work."""
    if not queued:
        return queued
    again = set(
        session.execute(
            select(Attempt.job_id)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.state == JobState.QUEUED, Job.attempts > 0, Attempt.state == AttemptState.PREEMPTED)
        ).scalars()
    )
    if not again:
        return queued
    return [replace(q, user_priority=REQUEUED_FIRST) if q.id in again else q for q in queued]


def _preempted_before(*, session: Session, policy: PolicyConfig | None) -> dict[str, int]:
    """How often each running job was preempted before: a policy that bounds it (preempt_max) reads
    it, in one grouped query over the live attempts' jobs; one that does not spares the pass it."""
    if policy is None or policy.preempt_max is None:
        return {}
    earlier = aliased(Attempt)
    return {
        job_id: int(n)
        for job_id, n in session.execute(
            select(earlier.job_id, func.count())
            .where(
                earlier.state == AttemptState.PREEMPTED,
                earlier.job_id.in_(select(Attempt.job_id).where(Attempt.state.in_(LIVE_ATTEMPT_STATES))),
            )
            .group_by(earlier.job_id)
        ).tuples()
    }


@dataclass
class _Running:
    """The live attempts as `_read_running` found them, with their sums by tenant and partition."""

    running: list[RunningJob] = field(default_factory=list)
    stopping: dict[str, float] = field(default_factory=dict)  # warned jobs' preemption deadlines
    running_jobs: dict[str, int] = field(default_factory=dict)  # counted jobs by tenant
    committed: dict[str, float] = field(default_factory=dict)  # IPU-seconds still to run, by tenant
    busy: dict[str, list[str]] = field(default_factory=dict)  # jobs in each hosting partition


def _read_running(*, session: Session, now: datetime, clock: Clock, policy: PolicyConfig | None) -> _Running:
    """The live attempts, as the policy sees the jobs holding IPUs."""
    now_s = now.timestamp()
    preempted_before = _preempted_before(session=session, policy=policy)
    found = _Running()
    running, stopping, running_jobs = found.running, found.stopping, found.running_jobs
    committed, busy = found.committed, found.busy
    for (
        job_id,
        tenant_id,
        size,
        name,
        kind,
        placed,
        taken,
        predicted,
        ran,
        priority,
        preemptible,
        every,
        task,
        gcd,
        created_at,
        opted_out,
        plan_opted_out,
        deadline,
        timeline,
        runtime_base,
    ) in session.execute(
        select(
            Attempt.job_id,
            Attempt.tenant_id,
            Attempt.size,
            Partition.name,
            Partition.kind,
            Attempt.placed_at,
            Attempt.started_at,
            Job.predicted_runtime_s,
            Attempt.cluster_s,
            Plan.priority,
            Job.preemptible,
            Job.checkpoint_every_s,
            Job.task,
            Attempt.gcd,
            Job.created_at,
            Job.never_preempt,
            Plan.never_preempt,
            Attempt.preempt_deadline,
            Attempt.timeline,
            Job.runtime_base_s,
        )
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .join(Job, Job.id == Attempt.job_id)
        .join(Tenant, Tenant.id == Attempt.tenant_id)
        .join(Plan, Plan.name == Tenant.plan_name)
        .where(Attempt.state.in_(LIVE_ATTEMPT_STATES))
    ).tuples():
        # Its predicted end counts from when a worker took it (placement, until one does). It does
        # not move with each heartbeat, so a reservation behind it does not either; a job past its
        # prediction has its end extended by the policy (planners.expected_end).
        started = (taken or placed).timestamp()
        # An attempt resumed from a checkpoint runs what the checkpoint did not keep (attempts.take_many
        # notes the run time it resumed at, `run_base_s`, counted since its owner last started it).
        resumed_at = max(0.0, float((timeline or {}).get("run_base_s", 0.0)) - (runtime_base or 0.0))
        if resumed_at > 0:
            predicted = resumed_runtime_s(predicted, resumed_at)
        end = started + clock.to_wall(predicted)
        # A session's jobs run in a partition that outlives them, as in a reserved one; the session's
        # hold (GCD -1, scheduler/services/sessions/) frees it at its end.
        inside = kind == "reserved" or (kind == "session" and gcd >= 0)
        if taken is not None:
            # How far it has run follows from its start; what was billed lags by up to a meter tick.
            ran = max(ran, clock.cluster_since(taken, now))
        held_job = RunningJob(
            job_id,
            tenant_id,
            size,
            name,
            started,
            end,
            priority,
            inside,
            preemptible=bool(preemptible),
            checkpoint_every=clock.to_wall(checkpoint_every(every, task)),
            session=kind == "session" and gcd < 0,
            # Its own opt-out or its plan's as the plan is now (an admin's edit reaches running work).
            never_preempt=bool(opted_out or plan_opted_out),
            preemptions=preempted_before.get(job_id, 0),
            submitted_at=created_at.timestamp(),
            # Once it has timed its first steps, its reported progress tells its end far closer than
            # its prediction; only the forecast reads it (the policy plans on `end`).
            measured_end=attempts.measured_end(timeline, taken, now) if taken is not None else math.nan,
        )
        if policy is not None:
            # Its class by what it is still expected to run (one past its prediction: as long again).
            # Its promotion goes on rising while it runs, as the waiting jobs' do (scheduler.policy.las).
            left = max(0.0, expected_end(held_job, now_s) - now_s)
            waited = max(0.0, (now - created_at).total_seconds())
            klass = job_class(policy, priority, size, left, waited_s=waited, run_s=clock.to_wall(predicted))
            held_job = replace(held_job, priority=klass)
        running.append(held_job)
        if deadline is not None:
            # Warned of its preemption: the forecast frees its IPUs when the warning ends.
            stopping[job_id] = deadline.timestamp()
        committed[tenant_id] = committed.get(tenant_id, 0.0) + clock.to_wall(size * max(0.0, predicted - ran))
        if task != SERVE_TASK:  # replicas count against the plan's endpoint limits instead
            running_jobs[tenant_id] = running_jobs.get(tenant_id, 0) + 1
        if gcd >= 0:
            busy.setdefault(name, []).append(job_id)
    return found


def _hosting_partitions(*, session: Session, busy: Mapping[str, list[str]]) -> dict[str, ReservedPartition]:
    """The partitions that host jobs they outlive (reserved and sessions'), with the jobs in each."""
    unhealthy = set(
        session.execute(
            select(Partition.name)
            .join(IpuAssignment, IpuAssignment.partition_pk == Partition.pk)
            .join(Ipu, Ipu.id == IpuAssignment.ipu_id)
            .where(Partition.kind.in_(_HOSTING), Partition.released_at.is_(None), Ipu.health != "up")
            .distinct()
        ).scalars()
    )
    return {
        name: ReservedPartition(
            name,
            tenant_id,
            size,
            next(iter(busy.get(name, ())), None),
            gcds=gcds,
            running_jobs=tuple(busy.get(name, ())),
            healthy=name not in unhealthy,
        )
        for name, tenant_id, size, gcds in session.execute(
            select(Partition.name, Partition.tenant_id, Partition.size, Partition.gcds).where(
                Partition.kind.in_(_HOSTING), Partition.released_at.is_(None)
            )
        ).tuples()
    }


def _arrivals(queued: list[QueuedJob], arrivals_seen: set[str] | None) -> list[QueuedJob]:
    """The queued jobs not in ``arrivals_seen``, which it then holds (with the ids no longer queued
    dropped)."""
    if arrivals_seen is None:
        return []
    # In age order, as the simulator meets them: the demand model weighs later ones more.
    arrivals = sorted((q for q in queued if q.id not in arrivals_seen), key=lambda q: (q.submitted_at, q.id))
    arrivals_seen.intersection_update(q.id for q in queued)
    arrivals_seen.update(q.id for q in arrivals)
    return arrivals


def gate_queue(
    *,
    session: Session,
    queued: list[QueuedJob],
    extra: Mapping[str, tuple[str | None, int | None, bool, str, str | None]],
    tenants: Mapping[str, TenantState],
    held: dict[str, HeldArray] | None = None,
) -> tuple[list[QueuedJob], dict[str, Wait]]:
    """The queue the policy sees, and why the jobs kept from it wait: a job held for its
    dependencies (its wait is the dependency resolver's), a singleton whose name runs already (or
    an older one of that name waits), and an array's elements past what may start this pass: its
    `max_running` less its running elements, and no more than its tenant may still start. Those
    shown are its first by priority, then index; the rest would wait behind them anyway, as
    Slurm's backfill skips the rest of an array whose element does not fit.

    ``held`` (when given) is filled with each array's elements kept back, for the forecast, which
    lets them in no faster than the array's `max_running` (or its tenant's running limit) allows."""
    arrays_seen = {e[0] for e in extra.values() if e[0] is not None}
    singles = {(q.tenant_id, extra[q.id][3]) for q in queued if q.id in extra and extra[q.id][2]}
    g = arrays.gate(session=session, array_ids=arrays_seen, singleton_names=singles)
    by_array: dict[str, list[QueuedJob]] = {}
    shown: list[QueuedJob] = []
    waits: dict[str, Wait] = {}
    first_single: dict[tuple[str, str], str] = {}
    for q in sorted(queued, key=lambda q: (q.submitted_at, q.id)):
        e = extra.get(q.id)
        if e is None:
            shown.append(q)
            continue
        array_id, _, singleton, name, held_for = e
        if held_for is not None:
            continue
        if singleton:
            key = (q.tenant_id, name)
            if key in g.running_names:
                waits[q.id] = Wait("singleton", f"a job of yours named {name!r} is running (singleton)")
                continue
            if first_single.setdefault(key, q.id) != q.id:
                waits[q.id] = Wait(
                    "singleton",
                    f"an older job of yours named {name!r} starts first (singleton)",
                    behind=(first_single[key],),
                )
                continue
        if array_id is not None:
            by_array.setdefault(array_id, []).append(q)
            continue
        shown.append(q)
    for array_id, elements in by_array.items():
        tenant = tenants.get(elements[0].tenant_id)
        room = len(elements)
        if tenant is not None:
            room = max(1, (tenant.max_concurrent_jobs or 0) - (tenant.running_jobs or 0))
        limit = g.room.get(array_id)
        if limit is not None:
            room = min(room, limit)
        elements.sort(key=lambda q: (-q.user_priority, extra[q.id][1] or 0))
        shown.extend(elements[:room])
        if held is not None and len(elements) > room:
            cap = g.caps.get(array_id)
            if cap is None:
                cap = tenant.max_concurrent_jobs if tenant is not None else None
            held[array_id] = HeldArray(
                cap=max(1, cap if cap is not None else room),
                members=frozenset(q.id for q in elements[:room]) | g.live.get(array_id, frozenset()),
                waiting=tuple(elements[room:]),
            )
        for q in elements[room:]:
            if limit is not None and room == limit:
                waits[q.id] = Wait(
                    "array-throttle", f"its array {array_id} runs at most its max_running elements at once"
                )
            else:
                waits[q.id] = Wait("array", f"behind earlier elements of its array {array_id}")
    return shown, waits


def checkpoint_every(checkpoint_every_s: int | None, task: str) -> float:
    """Cluster seconds between a job's checkpoints (inf: it takes none). Its agent checkpoints that
    often from the attempt's start, so its work at risk is derived, not read (RunningJob.at_risk)."""
    if task != "train":
        return math.inf
    return float(checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S)


def machine_options(
    choices: Mapping[str, Mapping[str, float]] | None, clock: Clock
) -> tuple[MachineOption, ...]:
    """A job's per-type options (`Job.options`) as the policy sees them, run times on the wall clock,
    in registry order."""
    if not choices:
        return ()
    return tuple(
        MachineOption(kind, int(o["ipus"]), clock.to_wall(float(o["predicted_runtime_s"])), float(o["rate"]))
        for kind in MACHINE_TYPE_NAMES
        if (o := choices.get(kind)) is not None
    )


def _typed_cost(
    size: int, predicted: float, choices: Mapping[str, Mapping[str, float]] | None, machine: str | None
) -> int:
    rate = float((choices or {}).get(machine or "", {}).get("rate", 1.0))
    return round(rate * size * predicted * 1000)


def _tenant_states(
    *,
    session: Session,
    samples: list[dict[str, Any]],
    tenant_ids: set[str],
    now: datetime,
    clock: Clock,
    half_life_s: float,
    held_by_queued: Mapping[str, int],
    running_jobs: Mapping[str, int],
    committed: Mapping[str, float],
) -> dict[str, TenantState]:
    """Admission state and fair-share standing of the tenants with queued jobs; collects in
    ``samples`` a new fair-share sample for those whose last one is older than `FAIRSHARE_SAMPLE_S`."""
    if not tenant_ids:
        return {}
    states: dict[str, TenantState] = {}
    for tenant, plan in session.execute(
        select(Tenant, Plan).join(Plan, Plan.name == Tenant.plan_name).where(Tenant.id.in_(tenant_ids))
    ).tuples():
        since = tenant.fairshare_sampled_at
        elapsed = 0.0 if since is None else max(0.0, (now - since).total_seconds())
        metered_s = (tenant.used_ipu_ms - tenant.fairshare_used_ipu_ms) / 1000
        usage = add_sample(tenant.fairshare_usage_ipu_s, metered_s, elapsed, half_life_s)
        if since is None or elapsed >= FAIRSHARE_SAMPLE_S:
            samples.append({"t_id": tenant.id, "t_usage": usage, "t_used": tenant.used_ipu_ms, "t_at": now})
        # What the queued jobs may spend: the grant less what was used and what running jobs hold.
        held_by_running = tenant.reserved_ipu_ms - held_by_queued.get(tenant.id, 0)
        states[tenant.id] = TenantState(
            id=tenant.id,
            active=tenant.status == "active",
            expires_at=None if tenant.expires_at is None else tenant.expires_at.timestamp(),
            quota_left_ipu_ms=billing.left_ipu_ms(tenant, held=held_by_running, count_reserved=False),
            max_concurrent_jobs=plan.max_concurrent_jobs,
            max_queued_jobs=plan.max_queued_jobs,
            max_partition_size=plan.max_partition_size,
            running_jobs=running_jobs.get(tenant.id, 0),
            usage_ipu_s=clock.to_wall(usage),
            committed_ipu_s=committed.get(tenant.id, 0.0),
            weight=tenant.fairshare_weight,
        )
    return states


def write_fairshare_samples(*, session: Session, samples: list[dict[str, Any]]) -> None:
    """Store the fair-share samples a snapshot found due (see LiveSnapshot.samples)."""
    if not samples:
        return
    table = Tenant.__table__
    session.execute(
        update(table)
        .where(table.c.id == bindparam("t_id"))
        .values(
            fairshare_usage_ipu_s=bindparam("t_usage"),
            fairshare_used_ipu_ms=bindparam("t_used"),
            fairshare_sampled_at=bindparam("t_at"),
            updated_at=table.c.updated_at,  # bookkeeping, not a change of the tenant
        ),
        samples,
    )


def wait_json(wait: Wait) -> WaitView:
    """A wait as `Job.wait` stores it and `GET /jobs/{id}` shows it."""
    start = wait.estimated_start
    return {
        "reason": wait.reason,
        "detail": wait.detail,
        "behind": list(wait.behind),
        "estimated_start": None if start is None else datetime.fromtimestamp(round(start), UTC).isoformat(),
    }


def record_waits(
    *, session: Session, waits: Mapping[str, Wait], known: dict[str, Mapping[str, Any] | None]
) -> int:
    """Store the explanations that changed since ``known`` (updated in place); returns rows written.

    Only changes are written: with thousands of queued jobs, most explanations are the same from
    one pass to the next, and rewriting them all every half second would be pure write load.
    """
    changed = []
    for job_id, wait in waits.items():
        value = wait_json(wait)
        if known.get(job_id) != value:
            changed.append({"j_id": job_id, "j_wait": value})
            known[job_id] = value
    for gone in set(known) - set(waits):
        del known[gone]
    if changed:
        table = Job.__table__
        session.execute(
            update(table)
            .where(table.c.id == bindparam("j_id"), table.c.state == JobState.QUEUED)
            .values(wait=bindparam("j_wait"), updated_at=table.c.updated_at),
            changed,
        )
    return len(changed)


def preemption_reason(
    victim: RunningJob, *, for_job: str, for_tenant: str | None, by_class: bool = False
) -> str:
    """What the victim's owner is told: why, and for whom. Another tenant's job is never named.
    ``by_class``: stopped for a higher service class of its own plan priority (`default-classes`),
    where "higher-priority" would read as a plan the owner cannot see above its own."""
    if for_tenant == victim.tenant_id:
        return f"preempted for your job {for_job}"
    if victim.preemptible:
        return "preempted for non-preemptible work of another tenant"
    if by_class:
        return "preempted for shorter work of another tenant"
    return "preempted for a higher-priority job of another tenant"


def by_service_class(policy: PolicyConfig, victims: Collection[RunningJob], for_priority: int) -> set[str]:
    """The victims a policy of service classes stops for a job of their own plan priority."""
    if policy.priority_from != "predicted":
        return set()
    plan = plan_of(for_priority)
    return {v.id for v in victims if not v.preemptible and plan_of(v.priority) >= plan}


def preempt(
    *,
    session: Session,
    victims: list[RunningJob],
    for_job: str,
    max_attempts: int,
    warning_s: float = 30.0,
    clock: Clock = UNSCALED,
    grace_s: float = 1.0,
    by_class: Collection[str] = (),
) -> int:
    """Preempt the victims' live attempts (`preempted` is a platform state: requeued at the head of
    its tenant's work, billed only for the work up to a checkpoint, see attempts.end_attempts).
    Returns how many were stopped now.

    Every running victim is warned first (`checkpoints.warn_preemption`), whether it was submitted
    preemptible or is stopped for a higher plan priority: it has `warning_s` cluster seconds to
    checkpoint and end itself, plus `grace_s` wall seconds for its agent's tick to write that; one
    still live after that deadline is stopped then. One not yet taken by an agent has run nothing
    and is stopped at once. Its owner is told why, naming `for_job` only if it is the owner's own;
    ``by_class`` are the victims stopped for a higher service class of their own plan (`by_service_class`)."""
    now = db_now(session)
    live = session.execute(
        select(Attempt.id, Attempt.job_id, Attempt.state, Attempt.preempt_deadline).where(
            Attempt.job_id.in_([v.id for v in victims]),
            Attempt.state.in_(LIVE_ATTEMPT_STATES),
            Attempt.gcd >= 0,  # a session's hold is ended by the session, never preempted
        )
    ).tuples()
    for_tenant = session.execute(select(Job.tenant_id).where(Job.id == for_job)).scalar_one_or_none()
    why = {
        v.id: preemption_reason(v, for_job=for_job, for_tenant=for_tenant, by_class=v.id in by_class)
        for v in victims
    }
    warn: dict[int, str] = {}
    stop: dict[str, list[int]] = {}
    for attempt_id, job_id, state, deadline in live:
        if state != AttemptState.RUNNING:
            stop.setdefault(f"{why[job_id]} before it started", []).append(attempt_id)
        elif deadline is not None and deadline <= now:
            late = f"{why[job_id]}; stopped when its warning ran out, it resumes from its last checkpoint"
            stop.setdefault(late, []).append(attempt_id)
        elif deadline is None:
            warn[attempt_id] = why[job_id]
    if warn:
        checkpoints.warn_preemption(
            session=session,
            attempt_ids=list(warn),
            deadline=now + timedelta(seconds=clock.to_wall(warning_s) + grace_s),
            window_s=warning_s,
            reasons=warn,
        )
    stopped = 0
    for reason, ids in stop.items():
        stopped += len(
            attempts.stop_running(
                session=session,
                attempt_ids=ids,
                outcome=AttemptState.PREEMPTED,
                reason=reason,
                max_attempts=max_attempts,
            )
        )
    return stopped
