"""Taking attempts: a host agent moves delivered attempts `placed` -> `running` under its incarnation
(`take_many`), fixing each run's timeline on the partition it got."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.clock import UNSCALED, Clock
from scheduler.jobspec import DEFAULT_CHECKPOINT_EVERY_S
from scheduler.models import (
    FINAL_JOB_STATES,
    SERVE_TASK,
    Attempt,
    AttemptState,
    Checkpoint,
    Job,
    JobEvent,
    JobState,
    OutboxMessage,
    Partition,
)
from scheduler.services.batch import checkpoints, executables
from scheduler.services.batch.attempts.ending import end_attempt
from scheduler.services.batch.attempts.locks import _lock_jobs
from scheduler.services.batch.attempts.placing import array_environment, gcd_ipus
from scheduler.services.batch.job_state import add_event
from scheduler.services.capacity import agents
from scheduler.services.capacity.agents import AgentLease
from scheduler.services.clock import db_now
from scheduler.services.tenancy import notifications
from vipu import emulator
from vipu.emulator.replica import ReplicaRun


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
    # Job rows first, as a cancel takes them (job, then attempt); holding them also makes the
    # "is it still wanted" check below exact.
    jobs = _lock_jobs(session, ids)
    placed = _lock_placed(session, ids, dict(deliveries))
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
        got = _start(session, agent, attempt, job, partition, now, result)
        if got is not None:
            planned.append((attempt, job, partition, *got))
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
    for attempt, job, partition, plan, spec in planned:
        run, end_s, run_base, unbilled = _timeline(
            attempt,
            job,
            plan,
            spec,
            checkpoint=resume_from.get(job.id),
            warm=cache_key[attempt.id] in cached,
            clock=clock,
        )
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
        result.taken.append(_taken(session, attempt, job, partition, run, end_s, run_base, unbilled, now))
    if started_events:
        session.execute(insert(JobEvent.__table__), started_events)
    return result


def _lock_placed(session: Session, ids: list[int], wanted: dict[int, int]) -> list[Attempt]:
    """The attempts still placed at the delivered epoch, locked in id order."""
    return [
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


def _start(
    session: Session,
    agent: AgentLease,
    attempt: Attempt,
    job: Job,
    partition: Partition,
    now: datetime,
    result: TakeResult,
) -> tuple[emulator.Plan | emulator.ServePlan, emulator.WorkloadSpec] | None:
    """One placed attempt now running under this agent, planned on the partition it got; or none
    (refused or failed in `result`): a cancel raced it, or its workload does not compile there."""
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
        return None
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
        return None
    return plan, spec


def _timeline(
    attempt: Attempt,
    job: Job,
    plan: emulator.Plan | emulator.ServePlan,
    spec: emulator.WorkloadSpec,
    *,
    checkpoint: Checkpoint | None,
    warm: bool,
    clock: Clock,
) -> tuple[emulator.EmulatedRun | ReplicaRun, float, float, float]:
    """The attempt's run (from its job's last checkpoint, if any) and its timeline, fixed on the
    attempt: the run, where it ends, the job's run time before it, and its unbilled restore."""
    first_step, run_base = (checkpoint.step, checkpoint.run_s) if checkpoint is not None else (0, 0.0)
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
    return run, end_s, run_base, unbilled


def _taken(
    session: Session,
    attempt: Attempt,
    job: Job,
    partition: Partition,
    run: emulator.EmulatedRun | ReplicaRun,
    end_s: float,
    run_base: float,
    unbilled: float,
    now: datetime,
) -> TakenAttempt:
    """What the agent is handed of an attempt it took."""
    return TakenAttempt(
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
            float(job.checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S) if job.task == "train" else None
        ),
        run_base_s=run_base,
        unbilled_s=unbilled,
        rate=attempt.rate if attempt.rate is not None else 1.0,
        session_id=job.session_id,
        endpoint_id=str(job.spec.get("endpoint")) if job.task == SERVE_TASK else None,
        environment=array_environment(session, job),
    )


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
