"""Turn what the scheduler returns into the API's response bodies."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from api.schemas import (
    ArrayOut,
    CheckpointOut,
    DependencyOut,
    DependsOnOut,
    FoldedOut,
    HistoryEntry,
    JobOut,
    PartitionOut,
    Progress,
    TenantOut,
    WaitReason,
)
from scheduler.billing import ipu_hours as hours
from scheduler.billing import remaining_ipu_ms
from scheduler.jobspec import DEFAULT_CHECKPOINT_EVERY_S, compress_indices
from scheduler.models import Attempt, Job, JobEvent, Partition, Tenant, utcnow
from scheduler.services.batch import attempts
from scheduler.services.batch.arrays import ArraySummary, array_state
from scheduler.services.batch.job_views import JobRead


def render_submitted(job: Job) -> dict[str, object]:
    """A new job's answer, stored with it so that an Idempotency-Key replay returns it as it was."""
    return job_out(job).model_dump(mode="json")


def job_out(
    job: Job,
    *,
    attempt: Attempt | None = None,
    partition: Partition | None = None,
    history: list[JobEvent] | None = None,
    used_ipu_ms: int | None = None,
) -> JobOut:
    live_partition = partition.name if partition is not None else None
    return JobOut(
        id=job.id,
        name=job.name,
        state=job.state,
        reason=job.reason,
        ipus=job.ipus,
        ipus_requested=job.ipus_requested,
        machine=(
            partition.machine_type
            if partition is not None
            else attempt.machine_type
            if attempt is not None
            else job.machine_type or "any"
        ),
        prefer=job.prefer or "time",
        machine_options=job.options,
        partition=live_partition,
        session=job.spec.get("session") if job.task != "session" else None,
        priority=job.priority,
        workload=job.spec.get("workload", {}),
        max_runtime_s=job.max_runtime_s,
        predicted_runtime_s=round(job.predicted_runtime_s, 3),
        cancel_requested=job.cancel_requested,
        attempts=job.attempts,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        progress=_progress(attempt),
        used_ipu_hours=None if used_ipu_ms is None else hours(used_ipu_ms),
        preemptible=bool(job.preemptible),
        never_preempt=bool(job.never_preempt),
        checkpoint_every_s=(job.checkpoint_every_s or DEFAULT_CHECKPOINT_EVERY_S)
        if job.task == "train"
        else None,
        array_id=job.array_id,
        array_index=job.array_index,
        params=job.params,
        depends_on=None if job.depends_on is None else DependsOnOut(**job.depends_on),
        singleton=bool(job.singleton),
        history=None
        if history is None
        else [
            HistoryEntry(at=e.at, message=e.message, state=(e.data or {}).get("state"), attempt=e.attempt)
            for e in history
        ],
    )


def job_view(read: JobRead) -> JobOut:
    """A job as `GET /jobs/{id}` (and each row of `GET /jobs`) shows what `job_views` read of it."""
    out = job_out(
        read.job,
        attempt=read.attempt,
        partition=read.partition,
        history=read.history,
        used_ipu_ms=read.used_ipu_ms,
    )
    if read.wait is not None:
        out.wait = WaitReason(**read.wait)
    if read.checkpoints is not None:
        out.checkpoints = [CheckpointOut(**c) for c in read.checkpoints]
        out.checkpoint_count = read.checkpoint_count
        out.resumable_until = read.resumable_until
    if read.folded is not None:
        f = read.folded
        out.folded = FoldedOut(label=f"{f.first.array_id}_[{f.indices}]", count=f.count, indices=f.indices)
    return out


def tenant_status(t: Tenant) -> str:
    """`active`, `suspended`, or `expired` for an active tenant whose trial has ended."""
    if t.status == "active" and t.expires_at is not None and t.expires_at <= datetime.now(UTC):
        return "expired"
    return t.status


def _progress(attempt: Attempt | None) -> Progress | None:
    progress = None if attempt is None else attempts.progress_of(attempt, utcnow())
    return Progress(**progress) if progress else None


def tenant_out(t: Tenant) -> TenantOut:
    remaining = remaining_ipu_ms(t)
    return TenantOut(
        id=t.id,
        name=t.name,
        plan=t.plan_name,
        status=tenant_status(t),
        quota_ipu_hours=hours(t.quota_ipu_ms),
        used_ipu_hours=hours(t.used_ipu_ms),
        reserved_ipu_hours=hours(t.reserved_ipu_ms),
        remaining_ipu_hours=hours(remaining),
        expires_at=t.expires_at,
        fairshare_weight=t.fairshare_weight,
        category=t.category,
        organisation=t.organisation,
        created_at=t.created_at,
    )


def partition_out(p: Partition, running: list[str] | None = None) -> PartitionOut:
    """`running`: the jobs running in it now (scheduler.services.capacity.partitions.running_jobs)."""
    running = running or []
    return PartitionOut(
        id=p.name,
        size=p.size,
        ipus=list(p.ipu_ids),
        tenant=p.tenant_id,
        kind=p.kind,
        machine_type=p.machine_type,
        gcds=p.gcds,
        reconfigurable=p.reconfigurable,
        job=p.job_id or (running[0] if running else None),
        jobs=running if p.kind == "reserved" else ([p.job_id] if p.job_id and p.released_at is None else []),
        state="active" if p.released_at is None else "released",
        created_at=p.created_at,
        released_at=p.released_at,
    )


def days_left(expires_at: datetime | None) -> float | None:
    if expires_at is None:
        return None
    return round(max(0.0, (expires_at - datetime.now(UTC)).total_seconds() / 86400), 2)


def array_out(summary: ArraySummary) -> ArrayOut:
    """An array with its figures (scheduler/services/batch/arrays.py, `summaries`)."""
    a = summary.array
    ended = sum(n for state, n in summary.by_state.items() if state in ("succeeded", "failed", "cancelled"))
    deps = (a.spec or {}).get("depends_on")
    return ArrayOut(
        id=a.id,
        name=a.name,
        size=a.size,
        indices=a.indices,
        max_running=a.max_running,
        state=array_state(summary.by_state, a.size),
        elements_by_state=summary.by_state,
        completed_indices=compress_indices(summary.completed),
        failed_indices=compress_indices(summary.failed),
        progress_percent=round(100.0 * ended / max(1, a.size), 2),
        used_ipu_hours=hours(summary.used_ipu_ms),
        reserved_ipu_hours=hours(summary.reserved_ipu_ms),
        sweep=a.sweep,
        depends_on=None
        if not deps
        else DependsOnOut(
            mode="all" if "all" in deps else "any",
            on=[
                DependencyOut(job=d["job"], type=d.get("type", "afterok"))
                for d in deps.get("all") or deps.get("any") or []
            ],
            on_unsatisfiable=(a.spec or {}).get("on_unsatisfiable", "cancel"),
        ),
        created_at=a.created_at,
    )


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP: CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    # Job names are the tenant's to choose; an admin opening the export must not run one.
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def usage_csv(rows: Sequence[Mapping[str, Any]], fields: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return buf.getvalue()
