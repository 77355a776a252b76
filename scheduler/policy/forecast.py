"""When will queued jobs start? The policy's own passes, replayed forward on predicted run times.

A wait estimate that is not the scheduler's own answer drifts from it: a first-come-first-served
replay ignores fair share, backfill and free room, and once said a 16-IPU job would wait 15 hours
when it started at once. So the forecast runs `decide` itself, over a copy of the snapshot, and moves
the clock from one predicted end to the next (each running job ends at `timetable.expected_end`, every
started job after its predicted run time), starting what the policy would start at each of those
instants, with the same ordering, reservation and backfill (the planner's `TimeTable`). A job's
forecast start is the instant the replay starts it.

What it cannot know, it holds constant: tenants' fair-share standing (usage moves with a half-life of
hours; the forecast spans the queue ahead), jobs submitted later, and run times other than predicted.
Jobs bound to reserved partitions wait for their own partition, not for the shared pool, so they are
left out. An array's elements the live pass kept back (``Snapshot.held``: past its ``max_running``)
join the replay's queue only as its running elements end, so no more than ``max_running`` of them
are forecast to run at once. The replay stops after ``max_passes`` passes (or ``budget_s`` seconds);
jobs it has not started by then have no forecast (None), which callers show as unknown rather than
guess.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import deque
from collections.abc import Callable, Collection

from scheduler.policy.config import PolicyConfig, get_policy
from scheduler.policy.model import JobQueue, QueuedJob, Snapshot, TenantState
from scheduler.policy.pipeline import decide, partition_name_for
from scheduler.policy.preemption import WARNING_S
from scheduler.policy.running import RunningJob
from scheduler.policy.timetable import TimeTable, expected_end

DEFAULT_MAX_PASSES = 400


def forecast(
    snapshot: Snapshot,
    policy: PolicyConfig | str = "default",
    *,
    target: QueuedJob | None = None,
    max_passes: int = DEFAULT_MAX_PASSES,
    name_for: Callable[[str], str] = partition_name_for,
    budget_s: float | None = None,
    until: Collection[str] = (),
) -> dict[str, float]:
    """Forecast start (on the snapshot's clock) of every queued job the replay starts within
    ``max_passes`` passes. With ``target`` (a job not in the queue: "what if I submitted this?") the
    target joins the queue as the newest arrival, and the replay stops once it starts. ``until``
    (ids, e.g. the elements of an array put in ``snapshot.held``) stops it once all of those started.

    Nothing of ``snapshot`` is changed: the replay places on a clone of its allocator. ``budget_s``
    bounds the replay's processor time too (the live loop forecasts inside its pass's transaction)."""
    stop_at = None if budget_s is None else time.perf_counter() + budget_s
    config = get_policy(policy) if isinstance(policy, str) else policy
    alloc = snapshot.allocator.clone()
    queued = [j for j in snapshot.queue if j.partition is None]
    if target is not None:
        queued.append(target)
    running: dict[str, RunningJob] = {r.id: r for r in snapshot.running}
    throttle = _Throttle(snapshot, {j.id for j in queued} | running.keys())
    # The held elements that may join at once go in with the rest: the queue sorts them once.
    queue = JobQueue(queued + throttle.take())
    shared = [r for r in snapshot.running if not r.reserved]
    table = TimeTable.from_allocator(alloc, shared)
    now = snapshot.now
    # Each running job ends when predicted; one past its prediction gets it extended (expected_end).
    ends: list[tuple[float, str]] = [(expected_end(r, now), r.id) for r in shared]
    heapq.heapify(ends)
    tenants = dict(snapshot.tenants)
    arrivals: Collection[QueuedJob] = list(snapshot.arrivals)
    if target is not None and target.partition is None:
        arrivals = [*arrivals, target]
    waited = set(until)
    starts: dict[str, float] = {}
    stopping: dict[str, QueuedJob] = {}  # warned victims, queued again when their warning ends
    passes = 0
    while (queue or throttle.waiting) and passes < max_passes:
        if stop_at is not None and time.perf_counter() > stop_at:
            break
        for q in throttle.take():  # as many as the array's elements that ended since
            queue.add(q)
        passes += 1
        view = Snapshot(
            now=now,
            queue=queue,
            running=list(running.values()),
            tenants=tenants,
            allocator=alloc,
            arrivals=list(arrivals),
            timetable=table,
        )
        decision = decide(view, config, explain=False, name_for=name_for)
        arrivals = ()
        for job, placement in decision.starts:
            assert not isinstance(placement, str)  # reserved-partition jobs were left out
            queue.remove(job.id)
            started = RunningJob(
                job.id,
                job.tenant_id,
                job.size,
                placement.partition_id,
                now,
                now + job.predicted_runtime_s,
                job.priority,
            )
            running[job.id] = started
            table.add(placement.partition_id, placement, started)
            heapq.heappush(ends, (started.expected_end, job.id))
            starts[job.id] = now
            _count(tenants, job, +1)
        if target is not None and target.id in starts:
            break
        if waited and waited <= starts.keys():
            break
        for victim in decision.preempt:
            if victim.id in stopping or victim.id not in running:
                continue
            # As the live loop does: the victim is warned, holds its IPUs for the warning, then stops,
            # goes back to the queue and starts again later; the job it made room for waits that long.
            held = running[victim.id]
            warned_until = now + WARNING_S
            stopped = dataclasses.replace(held, expected_end=warned_until)
            running[victim.id] = stopped
            table.remove(held.partition)
            table.add(held.partition, alloc.partition(held.partition), stopped)
            heapq.heappush(ends, (warned_until, victim.id))
            stopping[victim.id] = QueuedJob(
                victim.id,
                victim.tenant_id,
                victim.size,
                victim.started_at,
                max(1.0, victim.expected_end - now),
                victim.priority,
            )
        # Nothing more starts now: move to the next predicted end and free what it frees.
        while ends and ends[0][1] not in running:
            heapq.heappop(ends)  # a preempted job's end
        if not ends:
            break  # nothing running and nothing startable: the rest cannot start
        now = ends[0][0]
        while ends and ends[0][0] <= now:
            _, job_id = heapq.heappop(ends)
            ended = running.pop(job_id, None)
            if ended is None:
                continue
            throttle.ended(job_id)
            alloc.release(ended.partition)
            table.remove(ended.partition)
            _count(tenants, QueuedJob(ended.id, ended.tenant_id, ended.size, now, 0.0), -1)
            again = stopping.pop(job_id, None)
            if again is not None:
                queue.add(again)
    return starts


class _Throttle:
    """Lets an array's held elements into the replay's queue as its `max_running` allows."""

    def __init__(self, snapshot: Snapshot, present: Collection[str]) -> None:
        """``present``: the ids of the jobs queued or running in the replay at its start."""
        self.array_of: dict[str, str] = {}  # element -> its capped array, while it runs or is queued
        self.active: dict[str, int] = {}
        self.cap: dict[str, int] = {}
        self.waiting: dict[str, deque[QueuedJob]] = {}
        for array_id, held in snapshot.held.items():
            todo = [q for q in held.waiting if q.partition is None]
            live = [m for m in held.members if m in present]
            self.array_of.update(dict.fromkeys(live, array_id))
            self.active[array_id] = len(live)
            self.cap[array_id] = held.cap
            if todo:
                self.waiting[array_id] = deque(todo)

    def take(self) -> list[QueuedJob]:
        """The held elements that may join the queue now, each array's next ones below its cap."""
        out = []
        for array_id in list(self.waiting):
            todo = self.waiting[array_id]
            while todo and self.active[array_id] < self.cap[array_id]:
                q = todo.popleft()
                out.append(q)
                self.array_of[q.id] = array_id
                self.active[array_id] += 1
            if not todo:
                del self.waiting[array_id]
        return out

    def ended(self, job_id: str) -> None:
        array_id = self.array_of.pop(job_id, None)
        if array_id is not None:
            self.active[array_id] -= 1


def _count(tenants: dict[str, TenantState], job: QueuedJob, delta: int) -> None:
    """Keep a tenant's running-job count (its concurrency limit) and quota in step with the replay."""
    state = tenants.get(job.tenant_id)
    if state is None:
        return
    quota = state.quota_left_ipu_ms
    if quota is not None and delta > 0:
        quota -= job.cost_ipu_ms
    tenants[job.tenant_id] = dataclasses.replace(
        state, running_jobs=max(0, state.running_jobs + delta), quota_left_ipu_ms=quota
    )


def estimate_start(
    snapshot: Snapshot,
    job: QueuedJob,
    policy: PolicyConfig | str = "default",
    *,
    max_passes: int = DEFAULT_MAX_PASSES,
    name_for: Callable[[str], str] = partition_name_for,
    budget_s: float | None = None,
) -> float | None:
    """When ``job`` would start if submitted now (None: not within ``max_passes`` passes)."""
    return forecast(
        snapshot, policy, target=job, max_passes=max_passes, name_for=name_for, budget_s=budget_s
    ).get(job.id)
