"""Preemption (off by default): stop lower-priority work so a higher-priority job can start now.

Only jobs of a strictly lower priority class are candidates, never a job in a reserved partition
(stopping it frees nothing for anyone else). Victims are tried lowest class first and, within a
class, most recently started first, since those lose the least work; then only the victims whose
IPUs the new partition actually needs are kept. A preempted attempt is requeued and not billed.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.policy.model import QueuedJob, RunningJob
from vipu.allocator import Allocator, Placement


def choose_victims(
    job: QueuedJob, running: Collection[RunningJob], allocator: Allocator
) -> tuple[list[RunningJob], Placement] | None:
    """The running jobs to stop and where ``job`` would then go, or None if stopping cannot help."""
    candidates = sorted(
        (r for r in running if r.priority < job.priority and not r.reserved),
        key=lambda r: (r.priority, -r.started_at, r.id),
    )
    if not candidates:
        return None
    twin = allocator.clone()
    released: list[RunningJob] = []
    for victim in candidates:
        try:
            twin.release(victim.partition)
        except KeyError:
            continue
        released.append(victim)
        if twin.free_ipus(job.machine_type) < job.size:
            continue
        found = twin.find(job.size, machine_type=job.machine_type)
        if found is None:
            continue
        needed = set(found.ipu_ids)
        victims = [r for r in released if needed.intersection(allocator.partition(r.partition).ipu_ids)]
        return victims, found
    return None
