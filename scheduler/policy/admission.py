"""Admission: may this job start at all, whatever the free space? Tenant state, quota and limits.

Submission already checks all of these once; they are checked again at every pass because they
change while a job waits: an admin suspends a tenant or lowers its quota, a trial expires, a plan
is downgraded, or the tenant's running jobs used more than they were predicted to.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.billing import IPU_MS_PER_HOUR
from scheduler.policy.model import QueuedJob, TenantState, Wait


class Admission:
    """Per-pass bookkeeping of every tenant's budget and running jobs, updated as jobs start."""

    def __init__(self, tenants: Mapping[str, TenantState], now: float) -> None:
        self._tenants = tenants
        self._now = now
        self._running = {tid: t.running_jobs for tid, t in tenants.items()}
        self._budget = {tid: t.quota_left_ipu_ms for tid, t in tenants.items()}
        self._queued_seen: dict[str, int] = {}

    def check(self, job: QueuedJob) -> Wait | None:
        """None if the job may start; else why not. A job that passes holds its cost of the budget
        (it keeps its quota reservation while it waits for room), so later jobs see what is left."""
        tenant = self._tenants.get(job.tenant_id)
        if tenant is None:
            return None
        if not tenant.active:
            return Wait("tenant-inactive", "the tenant is suspended; its jobs wait until it is active again")
        if tenant.expires_at is not None and tenant.expires_at <= self._now:
            return Wait("tenant-inactive", "the tenant's trial has ended")
        if tenant.max_partition_size is not None and job.size > tenant.max_partition_size:
            return Wait(
                "limit",
                f"the plan allows partitions of at most {tenant.max_partition_size} IPUs; "
                f"this job needs {job.size}",
            )
        if tenant.max_queued_jobs is not None and job.counted:
            seen = self._queued_seen.get(job.tenant_id, 0) + 1
            self._queued_seen[job.tenant_id] = seen
            if seen > tenant.max_queued_jobs:
                return Wait(
                    "limit",
                    f"the plan allows {tenant.max_queued_jobs} queued jobs; this one is number {seen}",
                )
        budget = self._budget.get(job.tenant_id)
        if budget is not None:
            if job.cost_ipu_ms > budget:
                return Wait(
                    "quota",
                    f"the job is predicted to cost {job.cost_ipu_ms / IPU_MS_PER_HOUR:.2f} IPU-hours but "
                    f"only {max(0, budget) / IPU_MS_PER_HOUR:.2f} of the tenant's grant are left for it",
                )
            self._budget[job.tenant_id] = budget - job.cost_ipu_ms
        limit = tenant.max_concurrent_jobs
        if limit is not None and job.counted and self._running.get(job.tenant_id, 0) >= limit:
            return Wait("limit", f"the plan runs at most {limit} jobs at once; that many are running")
        return None

    def started(self, job: QueuedJob) -> None:
        if not job.counted:
            return
        self._running[job.tenant_id] = self._running.get(job.tenant_id, 0) + 1
