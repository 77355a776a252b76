"""The order a pass considers queued jobs in: priority class first, then fair share or FIFO, then age.

Both orders merge the queue's (priority, tenant) groups, each already in age order, with a heap of
group cursors, so a pass that stops early never pays for the jobs it did not reach.

Fair order ranks groups by their tenant's standing (see ``fairshare``) and re-ranks a tenant as soon
as one of its jobs starts, charging the job's predicted IPU-seconds: in one pass, tenants take turns
rather than the first one in line taking the whole fleet.

Strict fair share starves: a tenant that used a lot waits behind every lighter tenant's jobs for as
long as lighter tenants keep submitting. So, as Slurm's multifactor priority adds an age factor to
the fair-share factor, a job's rank is ``log2(1 + standing) - wait / aging_s``: every ``aging_s``
of waiting is worth halving the tenant's standing. A tenant that used 100 times more than another
waits about 6.6 ``aging_s`` longer, not forever. Within a tenant older jobs still go first.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from scheduler.policy.fairshare import standing
from scheduler.policy.model import JobQueue, QueuedJob, TenantState, _Group, age_key, tenant_key

_Key = tuple[float, float, float, str]
_GroupKey = tuple[int, str, int]


class Order:
    """Iterate the queue in policy order; call ``charge`` when a yielded job starts."""

    def __init__(
        self,
        queue: JobQueue,
        tenants: Mapping[str, TenantState],
        mode: Literal["fair", "fifo"],
        prune: Callable[[_Group], bool] | None = None,
        *,
        now: float = 0.0,
        aging_s: float | None = None,
    ) -> None:
        self._queue = queue
        self._tenants = tenants
        self._fair = mode == "fair"
        self._prune = prune
        self._charges: dict[str, int] = {}
        self._now = now
        self._aging = aging_s
        self._standing: dict[str, float] = {}
        if self._fair:
            for _, tenant_id, _ in queue.groups():
                if tenant_id not in self._standing:
                    t = tenants.get(tenant_id) or TenantState(tenant_id)
                    self._standing[tenant_id] = standing(t.usage_ipu_s, t.committed_ipu_s, t.weight)

    def standing_of(self, tenant_id: str) -> float:
        return self._standing.get(tenant_id, 0.0)

    def charge(self, job: QueuedJob) -> None:
        if not self._fair or not math.isfinite(job.predicted_runtime_s):
            return
        tenant = self._tenants.get(job.tenant_id)
        weight = tenant.weight if tenant is not None else 1.0
        if weight > 0:
            self._standing[job.tenant_id] += job.size * job.predicted_runtime_s / weight
            self._charges[job.tenant_id] = self._charges.get(job.tenant_id, 0) + 1

    def _rank(self, tenant_id: str, job: QueuedJob) -> float:
        if not self._fair:
            return 0.0
        share = self._standing[tenant_id]
        if self._aging is None:
            return share
        return math.log2(1.0 + share) - (self._now - job.submitted_at) / self._aging

    def __iter__(self) -> Iterator[QueuedJob]:
        if not self._fair:
            return self._fifo()
        return self._merge()

    def _fifo(self) -> Iterator[QueuedJob]:
        """Priority classes, highest first; within one, every size level merged by age."""
        prune = self._prune
        classes = self._queue.classes()
        for priority in sorted({p for p, _ in classes}, reverse=True):
            heap: list[tuple[float, str, int, Iterator[QueuedJob], _Group]] = []
            for (p, level), klass in classes.items():
                if p == priority:
                    cursor = iter(klass.jobs.values())
                    first = next(cursor)
                    heap.append((first.submitted_at, first.id, level, cursor, klass))
            heapq.heapify(heap)
            while heap:
                _, _, level, cursor, klass = entry = heapq.heappop(heap)
                if prune is not None and prune(klass):
                    continue
                yield klass.jobs[entry[1]]
                following = next(cursor, None)
                if following is not None:
                    heapq.heappush(heap, (following.submitted_at, following.id, level, cursor, klass))

    def _merge(self) -> Iterator[QueuedJob]:
        """Tenants take turns by rank; in its turn a tenant runs its own next job.

        A tenant's rank is its standing, aged by its oldest waiting job (each group's first, in
        its tenant's order); which of its jobs goes in its turn is its owner's order (priority,
        then age: `model.tenant_key`). With every job at the owner's default priority this is
        exactly a merge of all groups by (class, rank, age)."""
        rank, charges, prune = self._rank, self._charges, self._prune
        heappush, heappop = heapq.heappush, heapq.heappop
        groups = self._queue.groups()
        # Classes come strictly one after the other (a class is the first part of every rank), so
        # each is merged only when the pass reaches it: a pass that stops early never ranks the
        # (class, tenant) pairs below. The groups' order numbers are over the whole queue, as the
        # tie-break between two groups of one tenant.
        by_class: dict[int, list[tuple[int, _GroupKey, _Group]]] = {}
        for seq, (group_key, group) in enumerate(groups.items()):
            by_class.setdefault(group_key[0], []).append((seq, group_key, group))
        for klass in sorted(by_class, reverse=True):
            yield from self._merge_class(by_class[klass], groups, rank, charges, prune, heappush, heappop)

    @staticmethod
    def _merge_class(
        members: list[tuple[int, _GroupKey, _Group]],
        groups: Mapping[_GroupKey, _Group],
        rank: Callable[[str, QueuedJob], float],
        charges: dict[str, int],
        prune: Callable[[_Group], bool] | None,
        heappush: Any,
        heappop: Any,
    ) -> Iterator[QueuedJob]:
        # Per (class, tenant): its groups' next jobs, in the tenant's order, as
        # (tenant order key, group order, group key, cursor, the job).
        turns: dict[
            tuple[int, str], list[tuple[tuple[Any, ...], int, _GroupKey, Iterator[QueuedJob], QueuedJob]]
        ]
        turns = {}
        for seq, group_key, group in members:
            cursor = iter(group.jobs.values())
            first = next(cursor, None)
            if first is not None:
                turns.setdefault((group_key[0], group_key[1]), []).append(
                    (tenant_key(first), seq, group_key, cursor, first)
                )
        for waiting in turns.values():
            heapq.heapify(waiting)

        def entry(who: tuple[int, str]) -> tuple[_Key, tuple[int, str], int]:
            # Ranked by its oldest next job: the one whose wait ages it most.
            oldest = min((item[4] for item in turns[who]), key=age_key)
            key: _Key = (-who[0], rank(who[1], oldest), oldest.submitted_at, oldest.id)
            return key, who, charges.get(who[1], 0)

        heap = [entry(who) for who in turns]
        heapq.heapify(heap)
        while heap:
            _, who, charged = heappop(heap)
            waiting = turns[who]
            tenant_id = who[1]
            if charges.get(tenant_id, 0) != charged:
                # The tenant was charged since this entry was ranked: rank it again.
                fresh = entry(who)
                if heap and fresh[0] > heap[0][0]:
                    heappush(heap, fresh)
                    continue
            _, seq, group_key, cursor, job = heappop(waiting)
            if prune is not None and prune(groups[group_key]):
                # None of this group can start this pass: drop it, and rank the tenant again.
                if waiting:
                    heappush(heap, entry(who))
                continue
            yield job
            following = next(cursor, None)
            if following is not None:
                heappush(waiting, (tenant_key(following), seq, group_key, cursor, following))
            if waiting:
                heappush(heap, entry(who))
