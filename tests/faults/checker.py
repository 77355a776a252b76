"""The one check every fault scenario ends with: what the database says after the queue drained.

1. every accepted job reached a final state, and no attempt of it is still live;
2. no job succeeded twice (at most one succeeded attempt; none for a job that did not succeed);
3. no IPU is held by a finished job;
4. no two live partitions share an IPU;
5. the ledger has exactly one settled record per attempt, bills a platform failure (a lost,
   handed-back or preempted attempt) only for the work up to its last checkpoint, which the job
   keeps (0 without one), bills every other attempt exactly rate x partition size x the cluster
   time it ran less the restore of a checkpoint at its start (docs/checkpoints.md), and each
   tenant's usage is the sum of its ledger.

It also measures what the scenario report needs: which jobs the fault hit (an attempt ended by a
platform fault: lost or handed back), which of those recovered (ran again and succeeded), how long
after the fault each was running again (its next attempt's start minus the latest fault injected
before the hit attempt ended; the report gives the worst and the mean), and which jobs were only
delayed (a message the reconciler had to publish again, no attempt lost).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from scheduler.billing import charged_ipu_ms
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    PLATFORM_FAULT_STATES,
    Attempt,
    AttemptState,
    Checkpoint,
    IpuAssignment,
    Job,
    JobState,
    MeterEvent,
    Partition,
    ReconcilerAction,
    Tenant,
)


@dataclass
class Outcome:
    jobs: int
    states: dict[str, int]
    attempts: dict[str, int]
    affected: list[str]
    recovered: list[str]
    recovery_s: list[float]
    delayed: list[str] = field(default_factory=list)
    repairs: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "final_states": self.states,
            "attempts_by_outcome": self.attempts,
            "jobs_hit": len(self.affected),
            "jobs_recovered": len(self.recovered),
            "jobs_only_delayed": len(self.delayed),
            "time_to_recover_s": {
                "max": round(max(self.recovery_s), 2),
                "mean": round(sum(self.recovery_s) / len(self.recovery_s), 2),
            }
            if self.recovery_s
            else None,
            "reconciler_repairs": self.repairs,
        }


def check_cloud(
    db: Any, job_ids: list[str], *, fault_at: datetime | None = None, faults: list[datetime] | None = None
) -> Outcome:
    """Assert the five invariants over `job_ids` (and the whole fleet); return what happened.

    `fault_at` is when the first fault was injected, `faults` every injection time (default: just
    `fault_at`); they only shape the report."""
    faults = sorted(faults or ([fault_at] if fault_at else []))
    assert job_ids, "a scenario with no accepted job proves nothing"
    with db.read() as s:
        jobs = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(job_ids))).scalars()}
        assert set(jobs) == set(job_ids), "an accepted job is missing from the database"
        by_job: dict[str, list[Attempt]] = defaultdict(list)
        for a in s.execute(select(Attempt).where(Attempt.job_id.in_(job_ids)).order_by(Attempt.id)).scalars():
            by_job[a.job_id].append(a)

        # 1. Every accepted job is final, with no attempt still live.
        unfinished = {j.id: j.state for j in jobs.values() if j.state not in FINAL_JOB_STATES}
        assert not unfinished, f"jobs not in a final state: {unfinished}"
        live = [
            (a.job_id, a.id, a.state)
            for atts in by_job.values()
            for a in atts
            if a.state in LIVE_ATTEMPT_STATES
        ]
        assert not live, f"live attempts of finished jobs: {live}"

        # 2. No job succeeded twice; only a succeeded job has a succeeded attempt.
        for jid, job in jobs.items():
            wins = [a.id for a in by_job[jid] if a.state == AttemptState.SUCCEEDED]
            expected = 1 if job.state == JobState.SUCCEEDED else 0
            assert len(wins) == expected, f"{jid} ({job.state}) has succeeded attempts {wins}"

        # 3. No IPU is held by a finished job (jobs here are all finished).
        held = s.execute(
            select(Partition.job_id, IpuAssignment.ipu_id)
            .join(Partition, Partition.pk == IpuAssignment.partition_pk)
            .where(Partition.job_id.in_(job_ids))
        ).all()
        assert not held, f"IPUs still assigned to partitions of finished jobs: {held[:10]}"
        kept = s.execute(
            select(Partition.name, Partition.job_id).where(
                Partition.job_id.in_(job_ids), Partition.kind == "job", Partition.released_at.is_(None)
            )
        ).all()
        assert not kept, f"partitions of finished jobs not released: {kept}"

        # 4. No two live partitions share an IPU, and the assignments agree with the partitions.
        owner: dict[str, str] = {}
        for name, ipus in s.execute(
            select(Partition.name, Partition.ipu_ids).where(Partition.released_at.is_(None))
        ).all():
            for ipu in ipus:
                assert ipu not in owner, f"IPU {ipu} is in live partitions {owner[ipu]} and {name}"
                owner[ipu] = name
        assigned = s.execute(
            select(IpuAssignment.ipu_id, Partition.name, Partition.released_at).join(
                Partition, Partition.pk == IpuAssignment.partition_pk
            )
        ).all()
        for ipu, name, released in assigned:
            assert released is None, f"IPU {ipu} still assigned to released partition {name}"
            assert owner.get(ipu) == name, f"IPU {ipu} assigned to {name} but listed in {owner.get(ipu)}"

        # 5. The ledger: one settle per attempt, nothing for platform faults, exactly what ran otherwise.
        kept: dict[int, float] = {
            int(attempt_id): float(at)
            for attempt_id, at in s.execute(
                select(Checkpoint.attempt_id, func.max(Checkpoint.cluster_s))
                .where(Checkpoint.job_id.in_(job_ids))
                .group_by(Checkpoint.attempt_id)
            ).all()
        }
        events: dict[int, list[MeterEvent]] = defaultdict(list)
        for e in s.execute(select(MeterEvent).where(MeterEvent.job_id.in_(job_ids))).scalars():
            events[e.attempt_id].append(e)
        for atts in by_job.values():
            for a in atts:
                settles = [e for e in events[a.id] if e.kind == "settle"]
                assert len(settles) == 1, f"attempt {a.id} ({a.state}) has {len(settles)} settle records"
                assert settles[0].outcome == a.state, f"attempt {a.id} settled as {settles[0].outcome}"
                billed = sum(e.ipu_ms for e in events[a.id])
                if a.state in PLATFORM_FAULT_STATES:
                    upto = min(kept.get(a.id, 0.0), a.cluster_s)
                    owed = charged_ipu_ms(a.size, max(0.0, upto - a.unbilled_s), a.rate) if upto else 0
                    assert billed == owed, (
                        f"platform fault billed: attempt {a.id} ({a.state}) {billed} IPU-ms, kept {owed}"
                    )
                else:
                    ran = charged_ipu_ms(a.size, max(0.0, a.cluster_s - a.unbilled_s), a.rate)
                    assert billed == ran, f"attempt {a.id} ({a.state}) billed {billed} IPU-ms, ran {ran}"
        tenants = {j.tenant_id for j in jobs.values()}
        for tid in tenants:
            tenant = s.get(Tenant, tid)
            assert tenant is not None
            ledger = s.execute(
                select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.tenant_id == tid)
            ).scalar_one()
            assert tenant.used_ipu_ms == ledger, f"tenant {tid}: used {tenant.used_ipu_ms} != ledger {ledger}"
            assert tenant.reserved_ipu_ms == 0, f"tenant {tid} still holds {tenant.reserved_ipu_ms} IPU-ms"

        # What the fault did, for the report.
        republished = set(
            s.execute(
                select(ReconcilerAction.job_id).where(
                    ReconcilerAction.action == "outbox_republished",
                    ReconcilerAction.job_id.in_(job_ids),
                    *([ReconcilerAction.at >= fault_at] if fault_at else []),
                )
            ).scalars()
        )
        repairs = Counter(
            dict(
                s.execute(
                    select(ReconcilerAction.action, func.count())
                    .where(*([ReconcilerAction.at >= fault_at] if fault_at else []))
                    .group_by(ReconcilerAction.action)
                ).all()
            )
        )
    affected: list[str] = []
    recovered: list[str] = []
    delayed: list[str] = []
    recovery: list[float] = []
    for jid, atts in by_job.items():
        hit = [a for a in atts if a.state in PLATFORM_FAULT_STATES]
        if not hit:
            if jid in republished:
                delayed.append(jid)
            continue
        affected.append(jid)
        if jobs[jid].state == JobState.SUCCEEDED:
            recovered.append(jid)
        for a in hit:
            nxt = next((b for b in atts if b.number > a.number and b.started_at is not None), None)
            before = [f for f in faults if a.ended_at is not None and f <= a.ended_at]
            if nxt is not None and before:
                recovery.append((nxt.started_at - before[-1]).total_seconds())
    return Outcome(
        jobs=len(jobs),
        states=dict(Counter(j.state for j in jobs.values())),
        attempts=dict(Counter(a.state for atts in by_job.values() for a in atts)),
        affected=sorted(affected),
        recovered=sorted(recovered),
        recovery_s=recovery,
        delayed=sorted(delayed),
        repairs=dict(repairs),
    )
