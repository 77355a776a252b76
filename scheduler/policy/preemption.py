"""Preemption: stop running work so a job that waits can start now.

Two kinds of work may be stopped, never a job in a reserved partition (stopping it frees nothing for
anyone else) nor a session's hold on its partition (its owner is working in it):
- work its owner submitted `preemptible` (cheaper), for any job that is not, whoever's: the user's
  choice, always on;
- with the operator's switch (IPUCLOUD_PREEMPTION), any job of a strictly lower priority class.

Victims are tried preemptible first, then lowest class first, then those that would lose least: the
least work since their last checkpoint (times their size: IPU-seconds), the smallest, the most
recently started. Then only the victims whose IPUs the new partition actually needs are kept. A
preempted attempt is requeued and billed only for the work up to its checkpoint, which it keeps
(docs/checkpoints.md).
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.policy.model import QueuedJob
from scheduler.policy.running import RunningJob
from vipu.allocator import Allocator, Placement


def may_preempt(job: QueuedJob, victim: RunningJob, *, by_priority: bool) -> bool:
    """Whether ``victim`` may be stopped to make room for ``job``."""
    if victim.reserved or victim.session:
        return False
    if victim.preemptible and not job.preemptible:
        return True
    return by_priority and victim.priority < job.priority


def choose_victims(
    job: QueuedJob,
    running: Collection[RunningJob],
    allocator: Allocator,
    *,
    by_priority: bool = True,
    now: float | None = None,
) -> tuple[list[RunningJob], Placement] | None:
    """The running jobs to stop and where ``job`` would then go, or None if stopping cannot help.
    ``by_priority``: the operator's switch is on (lower classes may be stopped too); ``now`` ranks
    victims by the work they would lose (without it, by how recently they started)."""

    def loss(r: RunningJob) -> float:
        return 0.0 if now is None else r.at_risk(now) * r.size

    candidates = sorted(
        (r for r in running if may_preempt(job, r, by_priority=by_priority)),
        key=lambda r: (not r.preemptible, r.priority, loss(r), r.size, -r.started_at, r.id),
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
