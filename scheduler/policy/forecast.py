"""When will queued jobs start? The policy's own passes, replayed forward on predicted run times.

A wait estimate that is not the scheduler's own answer drifts from it: a first-come-first-served
replay ignores fair share, backfill and free room, and once said a 16-IPU job would wait 15 hours
when it started at once. So the forecast runs `decide` itself, over a copy of the snapshot, and moves
the clock from one predicted end to the next (each running job ends when its measured progress says
once it has some, `measured_end`, else at `timetable.expected_end`; every started job after its
predicted run time), starting what the policy would start at each of those
instants, with the same ordering, reservation and backfill (the planner's `TimeTable`). A job's
forecast start is the instant the replay starts it. What the live pass changes between passes it
changes too: running jobs' classes rise as their work runs down (`_Classes`), and a job it preempts
goes back to the queue as submitted (`RunningJob.submitted_at`), at the head of its tenant's work.

What it cannot know, it holds constant: tenants' fair-share standing (usage moves with a half-life of
hours; the forecast spans the queue ahead), jobs submitted later, and run times other than predicted.
One exception: a preemptible job never leads the line while other work waits, and other work stops it,
so it waits for non-preemptible work submitted after it too. Its forecast is a second replay that
expects the non-preemptible submissions of the policy's last ``inflow_window_s`` (``Snapshot.recent``)
again over as long ahead (`_inflow`); every other job keeps the queue as it stands.
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
import math
import random
import time
from collections import deque
from collections.abc import Callable, Collection
from statistics import NormalDist

from scheduler.policy.config import PolicyConfig, get_policy
from scheduler.policy.las import CLASS_SPAN, combined, plan_of, running_class, starved_after
from scheduler.policy.model import JobQueue, QueuedJob, Snapshot, TenantState
from scheduler.policy.pipeline import decide, partition_name_for
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
    bounds the replay's processor time too (the live loop forecasts inside its pass's transaction).

    With ``config.forecast_samples`` above 1 the replay is made that many times, each with run times
    drawn around the predictions (``config.forecast_spread``: `_Draw`), and a job's forecast start
    is the median of its starts in them: the first of many running jobs to end does so sooner than
    the first of their predictions says (the minimum of noisy ends is below the minimum of their
    medians), and a single replay on predictions alone tells every job behind a busy fleet it waits
    longer than it will. Replays the budget cut short are left out of the median."""
    stop_at = None if budget_s is None else time.perf_counter() + budget_s
    config = get_policy(policy) if isinstance(policy, str) else policy
    inflow = _inflow(snapshot, config)
    if target is not None:
        # Only preemptible work waits for what is submitted after it (`_inflow`).
        expect = inflow if target.preemptible else []
        starts = _replays(snapshot, config, target, max_passes, name_for, stop_at, until, expect)
        return {k: v for k, v in starts.items() if not k.endswith(EXPECTED)} if expect else starts
    starts = _replays(snapshot, config, None, max_passes, name_for, stop_at, until, [])
    yielding = _preemptible_ids(snapshot)
    if inflow and yielding:
        # Preemptible jobs are forecast again with the work expected to come; the others keep the
        # queue as it stands (expecting it for every job made Philly's estimate worse, docs/scheduling.md).
        later = _replays(snapshot, config, None, max_passes, name_for, stop_at, yielding, inflow)
        for job_id in yielding:
            if job_id in later:
                starts[job_id] = later[job_id]
            else:
                starts.pop(job_id, None)
    return starts


# What the forecast appends to a job's id for the work it expects to be submitted like it again
# (real ids never hold it), so its starts are told apart from the real jobs'.
EXPECTED = "~expected"


def _inflow(snapshot: Snapshot, config: PolicyConfig) -> list[QueuedJob]:
    """The non-preemptible work a preemptible job's forecast expects to be submitted after it: the
    submissions of the last ``inflow_window_s`` (``Snapshot.recent``) again, as far ahead of now as
    they came before it, each in the class it was queued in. Not their quota: they stand in for
    work not yet submitted, which has not reserved any."""
    window = config.inflow_window_s
    if window <= 0 or not snapshot.recent:
        return []
    now = snapshot.now
    out = [
        dataclasses.replace(r, id=r.id + EXPECTED, submitted_at=r.submitted_at + window, cost_ipu_ms=0)
        for r in snapshot.recent
        if not r.preemptible and r.partition is None and 0 <= now - r.submitted_at < window
    ]
    out.sort(key=lambda q: (q.submitted_at, q.id))
    return out


def _preemptible_ids(snapshot: Snapshot) -> set[str]:
    """The queued jobs (held elements too) that may be preempted, bound to no reserved partition."""
    ids = {q.id for q in snapshot.queue if q.preemptible and q.partition is None}
    for held in snapshot.held.values():
        ids.update(q.id for q in held.waiting if q.preemptible and q.partition is None)
    return ids


def _replays(
    snapshot: Snapshot,
    config: PolicyConfig,
    target: QueuedJob | None,
    max_passes: int,
    name_for: Callable[[str], str],
    stop_at: float | None,
    until: Collection[str],
    inflow: list[QueuedJob],
) -> dict[str, float]:
    """The forecast starts of one replay, or the median of ``config.forecast_samples`` drawn ones."""
    samples = max(1, config.forecast_samples) if config.forecast_spread > 0 else 1
    if samples == 1:
        return _replay(snapshot, config, target, max_passes, name_for, stop_at, until, None, inflow)[0]
    seed = f"{snapshot.now!r}:{target.id if target is not None else ''}"
    runs: list[dict[str, float]] = []
    for k in range(samples):
        starts, finished = _replay(
            snapshot,
            config,
            target,
            max_passes,
            name_for,
            stop_at,
            until,
            _Draw(config.forecast_spread, f"{seed}:{k}"),
            inflow,
        )
        if finished or not runs:
            runs.append(starts)
        if not finished:
            break
    return _median_starts(runs)


def _median_starts(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each job's median start over the replays (one that did not start it: never), if finite."""
    out: dict[str, float] = {}
    for job_id in {job_id for starts in runs for job_id in starts}:
        at = sorted(starts.get(job_id, math.inf) for starts in runs)
        middle = at[(len(at) - 1) // 2] if len(at) % 2 else (at[len(at) // 2 - 1] + at[len(at) // 2]) / 2
        if math.isfinite(middle):
            out[job_id] = middle
    return out


class _Draw:
    """Run times drawn around the predictions, for one replay: the prediction times ``exp(N(0,
    sigma))`` (the simulator's model of the emulator's error, docs/scheduling.md), and for a job
    running now, one drawn on condition that it has not ended yet (it has run what it has)."""

    def __init__(self, sigma: float, seed: str) -> None:
        self.sigma = sigma
        self.rng = random.Random(seed)

    def factor(self) -> float:
        return math.exp(self.rng.gauss(0.0, self.sigma))

    def running_end(self, job: RunningJob, now: float) -> float:
        span = job.expected_end - job.started_at
        if span <= 0:
            return likely_end(job, now)
        # Inverse transform of the log-normal above the run time it has had.
        floor = _NORMAL.cdf(math.log(max(now - job.started_at, 1e-9) / span) / self.sigma)
        u = floor + (1.0 - floor) * self.rng.random()
        if u >= 1.0:
            return likely_end(job, now)
        return max(now, job.started_at + span * math.exp(self.sigma * _NORMAL.inv_cdf(max(u, 1e-12))))


_NORMAL = NormalDist()


def _replay(
    snapshot: Snapshot,
    config: PolicyConfig,
    target: QueuedJob | None,
    max_passes: int,
    name_for: Callable[[str], str],
    stop_at: float | None,
    until: Collection[str],
    draw: _Draw | None,
    inflow: list[QueuedJob],
) -> tuple[dict[str, float], bool]:
    """One replay: forecast starts, and whether it ran to its end (not cut short by the budget).
    ``inflow`` (in submission order) joins the queue as the replay's clock reaches each submission."""
    finished = True
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
    # A victim is warned the configured cluster seconds ahead (IPUCLOUD_PREEMPTION_WARNING_S live),
    # on the pass's clock as the pipeline's stop cost counts them (`clock_scale`).
    warning = config.preempt_warning_s / config.clock_scale
    # Each running job ends when its measured progress says (`RunningJob.measured_end`), else when
    # predicted; one past its prediction gets it extended (expected_end).
    ends: list[tuple[float, str]] = [
        (
            measured_end(r, now)
            if r.measured_end > now
            else expected_end(r, now)
            if draw is None
            else draw.running_end(r, now),
            r.id,
        )
        for r in shared
    ]
    heapq.heapify(ends)
    # When the replay frees each job it runs: an entry of `ends` that is not (a victim's end before it
    # was preempted, the end of an attempt since restarted) frees nothing.
    release = {job_id: at for at, job_id in ends}
    tenants = dict(snapshot.tenants)
    arrivals: Collection[QueuedJob] = list(snapshot.arrivals)
    if target is not None and target.partition is None:
        arrivals = [*arrivals, target]
    waited = set(until)
    starts: dict[str, float] = {}
    stopping: dict[str, QueuedJob] = {}  # warned victims, queued again when their warning ends
    for job_id, at in snapshot.stopping.items():
        # Warned before the snapshot: it frees its IPUs when its warning ends, not at its predicted
        # end, and a pass that picks it as a victim again does not warn it anew.
        held = running.get(job_id)
        if held is None or held.reserved or job_id in stopping:
            continue
        release[job_id] = max(at, now)
        heapq.heappush(ends, (release[job_id], job_id))
        stopping[job_id] = QueuedJob(
            held.id,
            held.tenant_id,
            held.size,
            _submitted(held),
            max(1.0, held.expected_end - release[job_id]),
            held.priority,
            preemptible=held.preemptible,
        )
    starving = _starving(queued, config, now)
    classes = _Classes(config, shared, now)
    origin: dict[str, QueuedJob] = {}  # the jobs the replay started, as they were queued
    coming = 0  # the next of `inflow` to join the queue
    passes = 0
    while (queue or throttle.waiting) and passes < max_passes:
        if stop_at is not None and time.perf_counter() > stop_at:
            finished = False
            break
        while starving and starving[0][0] <= now:
            # Starved while the replay ran: the policy lifts it to the top class then, so does this.
            _, _, lifted = heapq.heappop(starving)
            if lifted.id in queue:
                queue.remove(lifted.id)
                queue.add(dataclasses.replace(lifted, priority=plan_of(lifted.priority) * CLASS_SPAN))
        for q in throttle.take():  # as many as the array's elements that ended since
            queue.add(q)
        if coming < len(inflow) and inflow[coming].submitted_at <= now:
            came = []
            while coming < len(inflow) and inflow[coming].submitted_at <= now:
                came.append(inflow[coming])
                queue.add(inflow[coming])
                coming += 1
            arrivals = [*arrivals, *came]
        passes += 1
        classes.move(running, now)
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
                preemptible=job.preemptible,
            )
            running[job.id] = started
            origin[job.id] = job
            classes.started(started, job)
            table.add(placement.partition_id, placement, started)
            # The policy plans with its prediction; the replay frees it when it (is drawn to) end.
            freed = started.expected_end if draw is None else now + job.predicted_runtime_s * draw.factor()
            heapq.heappush(ends, (freed, job.id))
            release[job.id] = freed
            starts.setdefault(job.id, now)  # a job preempted in the replay and restarted: its first start
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
            warned_until = now + warning
            stopped = dataclasses.replace(held, expected_end=warned_until, measured_end=math.nan)
            running[victim.id] = stopped
            table.remove(held.partition)
            table.add(held.partition, alloc.partition(held.partition), stopped)
            heapq.heappush(ends, (warned_until, victim.id))
            release[victim.id] = warned_until
            left = max(1.0, victim.expected_end - now)
            queued_as = origin.get(victim.id)
            stopping[victim.id] = (
                QueuedJob(
                    victim.id,
                    victim.tenant_id,
                    victim.size,
                    _submitted(victim),
                    left,
                    victim.priority,
                    preemptible=victim.preemptible,
                )
                if queued_as is None
                else dataclasses.replace(queued_as, predicted_runtime_s=left, priority=victim.priority)
            )
        # Nothing more starts now: move to the next predicted end and free what it frees.
        while ends and release.get(ends[0][1]) != ends[0][0]:
            heapq.heappop(ends)  # a preempted attempt's end
        due = inflow[coming].submitted_at if coming < len(inflow) else math.inf
        if not ends and due == math.inf:
            break  # nothing running, nothing startable and nothing to come: the rest cannot start
        now = min(ends[0][0] if ends else math.inf, due)
        while ends and ends[0][0] <= now:
            at, job_id = heapq.heappop(ends)
            if release.get(job_id) != at:
                continue
            del release[job_id]
            ended = running.pop(job_id)
            throttle.ended(job_id)
            alloc.release(ended.partition)
            table.remove(ended.partition)
            _count(tenants, QueuedJob(ended.id, ended.tenant_id, ended.size, now, 0.0), -1)
            again = stopping.pop(job_id, None)
            if again is not None:
                queue.add(again)
    return starts, finished


# How much longer a job that has outrun its prediction is expected to run, as a share of its
# prediction. The policy plans with `timetable.expected_end`, which doubles the run time (a bound
# it should rarely be wrong to wait for); the forecast asks when the job will most likely end.
# Predictions are off by about 20% at the median (log-normal, sigma 0.3, in the simulator): given
# that a job ran past its prediction, it runs on for about a quarter of it at the mean.
OVERRUN_SHARE = 0.25


def _starving(
    queued: list[QueuedJob], config: PolicyConfig, now: float
) -> list[tuple[float, str, QueuedJob]]:
    """When each queued job not yet at the top class becomes starved for its size (a heap), for a
    policy with the rule (scheduler.policy.las.starved_after); its wait counts from its submission."""
    if config.priority_from != "predicted" or config.starve_slowdown is None:
        return []
    due = []
    for q in queued:
        if q.priority == plan_of(q.priority) * CLASS_SPAN:
            continue  # at the top already
        at = q.submitted_at + starved_after(config, q.predicted_runtime_s)
        if now < at < math.inf:
            due.append((at, q.id, q))
    heapq.heapify(due)
    return due


class _Classes:
    """Moves the replay's running jobs' classes as the live loop and the simulator move them (a
    policy of ``predicted`` classes: `las.running_class`): a job's class is that of the work it has
    left, so it rises as the job nears its end. Without this a job kept the class it started in for
    all the replay: the pass tried victims in stale classes, and a victim went back to the queue in
    its stale, lower class, behind work the policy puts after it (docs/scheduling.md).

    A job counts its wait from its submission, as the live loop does (one whose submission the
    caller did not give: from its start); one at the top already stays there."""

    def __init__(self, config: PolicyConfig, running: list[RunningJob], now: float) -> None:
        self.config = config
        self.on = config.priority_from == "predicted"
        self.due: list[tuple[float, str, float]] = []  # (when its class moves, job, its start)
        self.queued_at: dict[str, tuple[float, float]] = {}  # job -> (wait counted from, starved after)
        if not self.on:
            return
        for r in running:
            if r.priority != plan_of(r.priority) * CLASS_SPAN:
                self.queued_at[r.id] = (_submitted(r), starved_after(config, r.expected_end - r.started_at))
                self.due.append((now, r.id, r.started_at))
        heapq.heapify(self.due)

    def started(self, r: RunningJob, queued: QueuedJob) -> None:
        if self.on:
            self.queued_at[r.id] = (
                queued.submitted_at,
                starved_after(self.config, queued.predicted_runtime_s),
            )
            heapq.heappush(self.due, (r.started_at, r.id, r.started_at))

    def move(self, running: dict[str, RunningJob], now: float) -> None:
        due = self.due
        while due and due[0][0] <= now:
            _, job_id, token = heapq.heappop(due)
            r = running.get(job_id)
            if r is None or r.started_at != token or r.expected_end <= r.started_at:
                continue  # ended, restarted since, or a warned victim (its class no longer matters)
            since, starve = self.queued_at[job_id]
            klass, when = running_class(self.config, r, now, since, starve)
            priority = combined(plan_of(r.priority), klass)
            if priority != r.priority:
                running[job_id] = dataclasses.replace(r, priority=priority)
            heapq.heappush(due, (when, job_id, token))


def _submitted(job: RunningJob) -> float:
    """When a running job was submitted, as the queue it goes back to when preempted has it (the head
    of its tenant's newer work); its start when the caller did not say."""
    return job.started_at if math.isnan(job.submitted_at) else job.submitted_at


def measured_end(job: RunningJob, now: float) -> float:
    """When a running job ends as far as the forecast can tell: by its measured progress once it has
    some (`running.end_by_progress`: the steps it has left at its measured step time, far closer
    than the prediction made before it ran), else its predicted end. The policy still plans on the
    prediction (``expected_end``), and so does the replay (a job it preempts goes back to the queue
    with its predicted work left, as the live queue has it): only when the replay frees the job moves."""
    if job.measured_end > now:
        return job.measured_end
    return job.expected_end


def likely_end(job: RunningJob, now: float) -> float:
    """When a running job most likely ends: its predicted end, or, past it, a share of its
    prediction later (`OVERRUN_SHARE`)."""
    if job.expected_end > now:
        return job.expected_end
    return now + max(1.0, OVERRUN_SHARE * (job.expected_end - job.started_at))


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
