"""The policy pipeline over an in-memory snapshot: order the queue, then place what fits.

Nothing here touches the database or a clock: the live loop builds a Snapshot from the database
and the wall clock, the simulator from a trace and a simulated clock, and both call `decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vipu.allocator import Allocator, Placement


@dataclass(frozen=True)
class QueuedJob:
    id: str
    tenant_id: str
    size: int
    submitted_at: float
    predicted_runtime_s: float
    priority: int = 0
    machine_type: str | None = None
    partition: str | None = None  # a reserved partition it must run in


@dataclass(frozen=True)
class RunningJob:
    id: str
    tenant_id: str
    size: int
    partition: str
    started_at: float
    expected_end: float
    priority: int = 0


@dataclass(frozen=True)
class TenantState:
    id: str
    max_concurrent_jobs: int = 1_000_000
    running_jobs: int = 0


@dataclass
class Snapshot:
    now: float
    queued: list[QueuedJob]
    running: list[RunningJob]
    tenants: dict[str, TenantState]
    allocator: Allocator
    reserved_free: dict[str, str] = field(default_factory=dict)  # free reserved partition -> tenant


@dataclass(frozen=True)
class Wait:
    reason: str  # no-room | limit | partition-busy
    detail: str


@dataclass
class Decision:
    starts: list[tuple[QueuedJob, Placement | str]] = field(default_factory=list)
    waits: dict[str, Wait] = field(default_factory=dict)


def partition_name_for(job_id: str) -> str:
    """The partition a job runs in is named after it (names are unique among live partitions)."""
    return "p_" + job_id.split("_", 1)[-1]


def order(queued: list[QueuedJob]) -> list[QueuedJob]:
    return sorted(queued, key=lambda j: (-j.priority, j.submitted_at, j.id))


def decide(snapshot: Snapshot, *, policy: str = "default") -> Decision:
    """Start, in priority then age order, every job that fits now (first fit)."""
    alloc = snapshot.allocator
    decision = Decision()
    running = {t: s.running_jobs for t, s in snapshot.tenants.items()}
    reserved_free = dict(snapshot.reserved_free)
    for job in order(snapshot.queued):
        tenant = snapshot.tenants.get(job.tenant_id)
        if tenant is not None and running.get(job.tenant_id, 0) >= tenant.max_concurrent_jobs:
            decision.waits[job.id] = Wait("limit", f"tenant runs {tenant.max_concurrent_jobs} jobs at most")
            continue
        if job.partition is not None:
            if reserved_free.pop(job.partition, None) is None:
                decision.waits[job.id] = Wait("partition-busy", f"reserved partition {job.partition} is busy")
                continue
            decision.starts.append((job, job.partition))
        else:
            placement = alloc.allocate(partition_name_for(job.id), job.size, machine_type=job.machine_type)
            if placement is None:
                decision.waits[job.id] = Wait("no-room", f"no free partition of {job.size} IPUs")
                continue
            decision.starts.append((job, placement))
        running[job.tenant_id] = running.get(job.tenant_id, 0) + 1
    return decision
