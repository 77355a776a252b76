"""The event-driven simulator: one policy replays one trace on a simulated fleet and clock.

Events are submissions and completions. At every instant something happens, the simulator applies
the completions (freeing partitions), queues the submissions, and runs one scheduling pass: the same
`scheduler.policy.decide` the live loop runs, over a `Snapshot` it keeps up to date in memory, with
the real `vipu.allocator.Allocator` placing every partition. A pass that preempts work is followed by
another pass at the same instant, as the live loop's next pass would follow once the victims stop.

Preemptible work (``preemptible``, one flag per job; docs/checkpoints.md) may be preempted by any job
that is not. It checkpoints every ``checkpoint_every_s`` of its run, and a victim is warned
``warning_s`` ahead: it checkpoints at the warning, runs on until the window ends (the work it does
then is lost: the live agent's upper bound, which checkpoints at its next step boundary and ends
sooner) and frees its IPUs then; the job that preempted it waits for them. With ``warning_s`` 0 it
stops at once and loses the work since its last periodic checkpoint. Requeued, it runs only what
it had not checkpointed. A victim of the operator's priority preemption loses all it had run, as
before (the trace has no checkpoints for it).

Every policy that preempts pays what a preemption costs (``preemption_cost``, the emulator's figures
in scheduler.policy.preemption), the research anchors included: the victim is warned and holds its
IPUs for the warning (the job it makes room for waits), loses what it ran in the window, and on its
next start loads its executable and reads its checkpoint back (and compiles first on another machine
type). With ``preemption_cost`` None the anchors preempt for free, as they used to here.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from scheduler.policy import (
    JobQueue,
    MachineOption,
    PolicyConfig,
    QueuedJob,
    RunningJob,
    Snapshot,
    TenantState,
    TimeTable,
    accrue,
    decide,
)
from scheduler.policy.forecast import estimate_start
from scheduler.policy.las import (
    attained_class,
    next_promotion,
    predicted_class,
    promoted,
    running_class,
    starved_after,
)
from scheduler.policy.preemption import PreemptionCost, resumed_runtime_s
from scheduler.simulator.estimates import measured_end
from scheduler.simulator.machines import TypeRun
from scheduler.simulator.trace import TraceJob
from vipu.allocator import Allocator, Placement
from vipu.machine_types import default_rates
from vipu.topology import IPUS_PER_POD, Fleet, MachineType


def largest_partition(pods: int) -> int:
    """The largest partition a fleet of ``pods`` POD64s of one type can form."""
    if pods <= 0:
        return 0
    return IPUS_PER_POD * (1 << (pods.bit_length() - 1))


@dataclass
class JobOutcome:
    start_s: float = math.nan  # its last start (a preempted job's resumption)
    end_s: float = math.nan
    first_start_s: float = math.nan  # when it first started: what a wait estimate foretells
    ipus: tuple[str, ...] = ()  # recorded only when asked (tests compare placements)
    preempted: int = 0
    machine_type: str = ""
    lost_s: float = 0.0  # run time lost to preemptions (work redone)
    # The wait estimate at submission (scheduler.policy.forecast, the code POST /estimates runs):
    # when the policy said the job would start. NaN: not estimated; inf: no forecast start.
    estimated_start_s: float = math.nan


@dataclass
class SimResult:
    policy: str
    estimates: str
    jobs: Sequence[TraceJob]
    outcomes: list[JobOutcome]
    capacity_ipus: int
    busy_bins: list[float]  # IPU-seconds run in each bin of `bin_s`
    bin_s: float
    waiting_s: float = 0.0  # time during which some job was first in line and could not start
    stranded_ipu_s: float = 0.0  # integral of the stranded share of free IPUs over that time
    refused_with_room_s: float = 0.0  # part of that time with enough IPUs free in total
    launch_failures: int = 0
    passes: int = 0
    backfilled: int = 0
    preemptions: int = 0
    # Run time each preemption cost its victim (seconds of the victim's run redone).
    preemption_losses: list[float] = field(default_factory=list)
    preemptible: Sequence[bool] = ()
    wall_s: float = 0.0
    # Processor seconds of the replay's own process: on a shared machine, the figure that compares.
    cpu_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class _Tenant:
    """A tenant's fair-share ledger, advanced in closed form from event to event."""

    usage: float = 0.0
    at: float = 0.0
    ipus: int = 0
    end_weighted: float = 0.0  # sum over running jobs of size * predicted end

    def advance(self, now: float, half_life: float) -> None:
        self.usage = accrue(self.usage, self.ipus, now - self.at, half_life)
        self.at = now


class Simulation:
    """Replay ``jobs`` under ``policy`` with the given per-job estimates.

    On a ``fleet`` of several machine types, ``runs`` says per job where it can run and how long
    there (``scheduler.simulator.machines``): every job may then run on any of those types, and the
    policy settles which (``scheduler.policy.machine_choice``). Without them the fleet is ``pods``
    POD64s of ``machine`` and every job runs as recorded.
    """

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: PolicyConfig,
        estimates: Sequence[float],
        *,
        pods: int = 0,
        machine: str = "m2000",
        estimate_model: str = "predicted",
        record_placements: bool = False,
        bins: int = 400,
        fleet: Fleet | None = None,
        runs: Sequence[tuple[TypeRun, ...]] | None = None,
        preemptible: Sequence[bool] | None = None,
        never_preempt: Sequence[bool] | None = None,
        checkpoint_every_s: float = 600.0,
        warning_s: float = 30.0,
        estimate_every: int = 0,
        estimate_passes: int = 2000,
        preemption_cost: PreemptionCost | None = PreemptionCost(),
    ) -> None:
        if len(estimates) != len(jobs):
            raise ValueError("one estimate per job")
        if runs is not None and len(runs) != len(jobs):
            raise ValueError("one set of machine runs per job")
        self.jobs = jobs
        self.policy = policy
        self.estimates = estimates
        self.fleet = fleet if fleet is not None else Fleet.uniform(pods, MachineType(machine))
        self.runs = runs
        self.rates = default_rates()
        self.estimate_model = estimate_model
        self.record_placements = record_placements
        self.bins = bins
        self.preemptible = list(preemptible) if preemptible is not None else [False] * len(jobs)
        if len(self.preemptible) != len(jobs):
            raise ValueError("one preemptible flag per job")
        # Jobs (or their plans) opted out of preemption, as the live snapshot reads them.
        self.never_preempt = list(never_preempt) if never_preempt is not None else [False] * len(jobs)
        if len(self.never_preempt) != len(jobs):
            raise ValueError("one never_preempt flag per job")
        self.checkpoint_every_s = checkpoint_every_s
        self.warning_s = warning_s
        # Forecast the start of every n-th submission (0: none). Each forecast replays passes ahead,
        # so a full trace samples rather than asks at every one of its submissions.
        self.estimate_every = estimate_every
        self.estimate_passes = estimate_passes
        # What each preemption costs (None: nothing, the anchors as their papers simulate them). Its
        # warning is ``warning_s`` (0: stopped at once, back to the last periodic checkpoint).
        self.cost = preemption_cost
        self._placed_on: dict[int, float] = {}  # run-time factor of the type a job last started on

    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        """Replay the trace, event by event (`_Replay`); ``progress`` is told of completed jobs."""
        return _Replay(self).run(progress)

    def _rank(self, attained_ipu_s: float, left_s: float, told_ipu_s: float = 0.0) -> int:
        """A job's service class (higher first; scheduler.policy.las): default's by the predicted
        IPU-seconds it still needs (``told_ipu_s``); Tiresias' queue of the service had; or the
        oracle's true time left on a log scale (classes 19% apart; FIFO within one)."""
        config = self.policy
        if config.priority_from == "predicted":
            return predicted_class(told_ipu_s, attained_ipu_s, config.las_thresholds_ipu_s)
        if config.priority_from == "las":
            return attained_class(attained_ipu_s, config.las_thresholds_ipu_s)
        return -math.ceil(4 * math.log2(max(left_s, 1.0)))

    def _options(self, i: int) -> tuple[MachineOption, ...]:
        if self.runs is None:
            return ()
        told = self.estimates[i]
        return tuple(
            MachineOption(run.machine_type, run.size, told * run.factor, self.rates[run.machine_type])
            for run in self.runs[i]
        )

    def _factor(self, i: int, machine_type: str) -> float:
        if self.runs is None:
            return 1.0
        for run in self.runs[i]:
            if run.machine_type == machine_type:
                return run.factor
        raise AssertionError(f"job {i} placed on {machine_type}, where it cannot run")

    @staticmethod
    def _tenant_states(tenants: dict[str, _Tenant], now: float, half_life: float) -> dict[str, TenantState]:
        states = {}
        for name, ledger in tenants.items():
            usage = accrue(ledger.usage, ledger.ipus, now - ledger.at, half_life)
            committed = max(0.0, ledger.end_weighted - now * ledger.ipus)
            states[name] = TenantState(name, usage_ipu_s=usage, committed_ipu_s=committed)
        return states

    @staticmethod
    def _add_busy(result: SimResult, start: float, end: float, busy: int) -> None:
        bins, width = result.busy_bins, result.bin_s
        first = int(start // width)
        last = int(end // width)
        while last >= len(bins):
            bins.append(0.0)
        if first == last:
            bins[first] += busy * (end - start)
            return
        bins[first] += busy * ((first + 1) * width - start)
        for b in range(first + 1, last):
            bins[b] += busy * width
        bins[last] += busy * (end - last * width)


class _Replay:
    """One run of a `Simulation`: the state its events move (the queue, the running jobs, the fleet,
    the tenants' ledgers, each job's progress) and the steps of each instant, in the order they are
    taken: apply the completions and the warned victims' stops, queue the submissions (forecasting
    some), move the waiting and running jobs' classes, then the policy's passes."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        jobs, config, est = sim.jobs, sim.policy, sim.estimates
        self.jobs, self.config, self.est = jobs, config, est
        self.alloc = Allocator(sim.fleet, policy=config.placement)
        capacity = sim.fleet.ipus
        self.index = {job.id: i for i, job in enumerate(jobs)}
        self.outcomes = outcomes = [JobOutcome() for _ in jobs]
        horizon = max((j.submit_s + j.duration_s for j in jobs), default=1.0)
        # Bins cover the submissions plus the longest job; a queue that outlasts them grows the list.
        bin_s = max(horizon / sim.bins, 1.0)
        self.result = SimResult(
            policy=config.name,
            estimates=sim.estimate_model,
            jobs=jobs,
            outcomes=outcomes,
            capacity_ipus=capacity,
            busy_bins=[0.0] * (sim.bins + 1),
            bin_s=bin_s,
            preemptible=sim.preemptible,
        )
        self.flags = sim.preemptible
        # Warned victims stop when their warning ends: (at, job index, attempt).
        self.stops: list[tuple[float, int, int]] = []
        self.warned: set[str] = set()
        self.fair = config.ordering == "fair"
        self.half_life = config.half_life_s
        self.queue = JobQueue()
        self.running: dict[str, RunningJob] = {}
        self.table = TimeTable(sim.fleet)
        self.tenants: dict[str, _Tenant] = {}
        # (end, job index, attempt): a preempted attempt's completion is ignored when it comes up.
        self.completions: list[tuple[float, int, int]] = []
        self.attempt = [0] * len(jobs)
        self.submitted: list[QueuedJob | None] = [None] * len(jobs)
        # Reference policies (tiresias, srtf-oracle) rank by service had or time left and resume
        # preempted jobs from their checkpoint; the others rank as asked and lose preempted work.
        self.ranked = ranked = config.priority_from != "plan"
        self.left = [j.duration_s for j in jobs]  # true run time still to go, on the recorded machine
        self.told_left = list(est)  # what the policy believes is still to go
        self.attained = [0.0] * len(jobs)  # IPU-seconds run so far (Tiresias' service)
        self.run_from = [0.0] * len(jobs)
        self.cost = sim.cost
        self.predicted = config.priority_from == "predicted"
        self.promote_s = config.promote_after_s if ranked else None
        # Starved queued jobs move up a class (scheduler.policy.las.promoted): (due, job, attempt).
        self.promotions: list[tuple[float, int, int]] = []
        self.queued_at = [0.0] * len(jobs)
        self.starve_at = [math.inf] * len(jobs)  # the wait after which a job is starved (las.starved_after)
        self.reclass: list[tuple[float, int, int]] = []  # (when its class next moves, job, attempt)
        self.base_class = [0] * len(jobs)
        self.last_type: dict[int, str] = {}
        self.now = 0.0
        self.busy = 0
        self.head_size: int | None = None
        self.head_refused = False
        self.next_arrival = 0
        self.done = 0
        # The non-preemptible submissions of the policy's last `inflow_window_s`, as queued: what a
        # preemptible job's forecast expects again (Snapshot.recent). Kept only when estimating.
        self.recent: deque[QueuedJob] = deque()
        self.keep_recent = bool(sim.estimate_every) and config.inflow_window_s > 0

    def run(self, progress: Callable[[int], None] | None) -> SimResult:
        jobs = self.jobs
        while self.next_arrival < len(jobs) or self.completions or self.stops:
            self._advance(self._next_instant())
            self._complete_due()
            self._stop_warned_due()
            arrivals = self._arrive_due()
            self._promote_due()
            self._reclass_running()
            self._schedule(arrivals)
            if progress is not None and self.done:
                progress(self.done)
                self.done = 0
        if self.queue:
            raise RuntimeError(f"{len(self.queue)} jobs never started: the fleet cannot host them")
        return self.result

    def _next_instant(self) -> float:
        """When the next event comes: a submission, a completion or a warned victim's stop."""
        jobs, completions, stops = self.jobs, self.completions, self.stops
        upcoming = jobs[self.next_arrival].submit_s if self.next_arrival < len(jobs) else math.inf
        if completions and completions[0][0] <= upcoming:
            upcoming = completions[0][0]
        if stops and stops[0][0] <= upcoming:
            upcoming = stops[0][0]
        return upcoming

    def _advance(self, upcoming: float) -> None:
        """Move the clock to ``upcoming``, integrating the figures over the interval during which
        nothing changed."""
        now, result = self.now, self.result
        elapsed = upcoming - now
        if elapsed > 0:
            if self.busy:
                self.sim._add_busy(result, now, upcoming, self.busy)
            if self.head_size is not None:
                result.waiting_s += elapsed
                result.stranded_ipu_s += elapsed * self.alloc.fragmentation(self.head_size).stranded_share
                if self.head_refused:
                    result.refused_with_room_s += elapsed
        self.now = upcoming

    def _complete_due(self) -> None:
        """Free the partitions of the jobs that end now (a preempted attempt's end is ignored)."""
        jobs, completions, attempt, now = self.jobs, self.completions, self.attempt, self.now
        while completions and completions[0][0] <= now:
            _, i, number = heapq.heappop(completions)
            if number != attempt[i]:
                continue  # this attempt was preempted
            job = jobs[i]
            ended = self.running.pop(job.id)
            self.alloc.release(ended.partition)
            self.table.remove(ended.partition)
            self.busy -= job.size
            ledger = self.tenants[job.tenant]
            ledger.advance(now, self.half_life)
            ledger.ipus -= job.size
            ledger.end_weighted -= job.size * ended.expected_end
            self.outcomes[i].end_s = now
            self.warned.discard(job.id)
            self.done += 1

    def _stop_warned_due(self) -> None:
        """Stop the warned victims whose warning ends now."""
        stops, now = self.stops, self.now
        while stops and stops[0][0] <= now:
            _, i, number = heapq.heappop(stops)
            if number == self.attempt[i] and self.jobs[i].id in self.running:
                # Checkpointed at its warning; what it ran in the window is lost.
                self._stop(i, min(self.sim.warning_s, now - self.run_from[i]))

    def _stop(self, i: int, lost: float) -> None:
        """Take job `i` off its partition and queue it again; `lost` of the run time it had
        (since its last start) is redone, the rest it resumes from (a checkpoint)."""
        sim, now, ranked, cost = self.sim, self.now, self.ranked, self.cost
        left, told_left, outcomes = self.left, self.told_left, self.outcomes
        job = self.jobs[i]
        victim = self.running.pop(job.id)
        self.alloc.release(victim.partition)
        self.table.remove(victim.partition)
        self.attempt[i] += 1
        self.busy -= victim.size
        ledger = self.tenants[victim.tenant_id]
        ledger.advance(now, self.half_life)
        ledger.ipus -= victim.size
        ledger.end_weighted -= victim.size * victim.expected_end
        factor = sim._placed_on[i]
        ran = now - self.run_from[i]
        if sim.runs is not None:
            # It was counted as running all it had left; it ran `ran` of it.
            self.result.extra["work_ipu_s"] -= victim.size * (left[i] * factor - ran)
        kept_s = max(0.0, ran - lost) / factor
        if kept_s > 0 or ranked:
            # Resumed, it loads its executable and reads its checkpoint back before new work.
            restart = cost.restart_s() / factor if cost is not None else 0.0
            left[i] = max(0.0, left[i] - kept_s) + restart
            told_left[i] = resumed_runtime_s(told_left[i], kept_s, restart)
        self.attained[i] += victim.size * ran
        outcomes[i].preempted += 1
        outcomes[i].lost_s += lost
        outcomes[i].start_s = math.nan
        self.result.preemption_losses.append(lost)
        self.warned.discard(job.id)
        again = self.submitted[i]
        assert again is not None
        if kept_s > 0 or ranked:
            again = replace(again, predicted_runtime_s=told_left[i])
        if ranked:
            self.base_class[i] = sim._rank(self.attained[i], left[i], victim.size * told_left[i])
            again = replace(again, priority=self.base_class[i])
            self.queued_at[i] = now
            self.starve_at[i] = starved_after(self.config, told_left[i])
            due = next_promotion(self.base_class[i], now, now, self.promote_s, self.starve_at[i])
            if due < math.inf:
                heapq.heappush(self.promotions, (due, i, self.attempt[i]))
        self.submitted[i] = again
        self.queue.add(again)

    def _arrive_due(self) -> list[QueuedJob]:
        """Queue the jobs submitted by now, forecasting the start of every n-th as asked; the
        arrivals, which the next pass is told of."""
        sim, jobs, est, now = self.sim, self.jobs, self.est, self.now
        promote_s = self.promote_s
        arrivals: list[QueuedJob] = []
        while self.next_arrival < len(jobs) and jobs[self.next_arrival].submit_s <= now:
            next_arrival = self.next_arrival
            job = jobs[next_arrival]
            klass = sim._rank(0.0, job.duration_s, job.size * est[next_arrival]) if self.ranked else 0
            if promote_s is not None:
                self.base_class[next_arrival] = klass
                self.queued_at[next_arrival] = now
                self.starve_at[next_arrival] = starved_after(self.config, est[next_arrival])
                due = next_promotion(klass, now, now, promote_s, self.starve_at[next_arrival])
                if due < math.inf:
                    heapq.heappush(self.promotions, (due, next_arrival, 0))
            queued = self.submitted[next_arrival] = QueuedJob(
                job.id,
                job.tenant,
                job.size,
                job.submit_s,
                est[next_arrival],
                priority=klass,
                options=sim._options(next_arrival),
                preemptible=self.flags[next_arrival],
            )
            self.tenants.setdefault(job.tenant, _Tenant(at=now))
            if sim.estimate_every and next_arrival % sim.estimate_every == 0:
                self._estimate(next_arrival, queued, arrivals)
            self.queue.add(queued)
            arrivals.append(queued)
            if self.keep_recent and not queued.preemptible:
                self.recent.append(queued)
            self.next_arrival += 1
        return arrivals

    def _estimate(self, i: int, queued: QueuedJob, arrivals: list[QueuedJob]) -> None:
        """Forecast when job `i`, submitted now, starts (what POST /estimates would have told it)."""
        sim, jobs, now = self.sim, self.jobs, self.now
        recent = self.recent
        while recent and recent[0].submitted_at < now - self.config.inflow_window_s:
            recent.popleft()
        view = Snapshot(
            now=now,
            queue=self.queue,
            running=self._measured() if sim.estimate_model != "perfect" else self.running.values(),
            tenants=sim._tenant_states(self.tenants, now, self.half_life) if self.fair else {},
            allocator=self.alloc,
            arrivals=arrivals,
            timetable=self.table,
            stopping={
                jobs[w].id: at
                for at, w, number in self.stops
                if number == self.attempt[w] and jobs[w].id in self.warned
            },
            recent=list(recent) if queued.preemptible else (),
        )
        start = estimate_start(view, queued, self.config, max_passes=sim.estimate_passes, name_for=_own_name)
        self.outcomes[i].estimated_start_s = math.inf if start is None else start

    def _measured(self) -> list[RunningJob]:
        """The running jobs as the forecast sees them: each with the end its measured progress tells,
        once it has run its warm-up (`estimates.measured_end`; the live snapshot reads it from the
        attempt's reported progress). Only the forecast reads it; the policy plans on predictions."""
        jobs, now, index = self.jobs, self.now, self.index
        out = []
        for r in self.running.values():
            i = index[r.id]
            true_end = self.run_from[i] + self.left[i] * self.sim._placed_on[i]
            end = measured_end(jobs[i].id, self.attempt[i], r.started_at, true_end, now)
            out.append(r if math.isnan(end) else replace(r, measured_end=end))
        return out

    def _promote_due(self) -> None:
        """Move starved queued jobs up a class as their promotions fall due."""
        promotions, submitted, queue, now = self.promotions, self.submitted, self.queue, self.now
        base_class, queued_at, promote_s = self.base_class, self.queued_at, self.promote_s
        while promotions and promotions[0][0] <= now:
            _, i, number = heapq.heappop(promotions)
            waiting = submitted[i]
            if number != self.attempt[i] or waiting is None or waiting.id not in queue:
                continue
            klass = promoted(base_class[i], now - queued_at[i], promote_s, self.starve_at[i])
            if klass != waiting.priority:
                queue.remove(waiting.id)
                waiting = submitted[i] = replace(waiting, priority=klass)
                queue.add(waiting)
            due = next_promotion(base_class[i], queued_at[i], now, promote_s, self.starve_at[i])
            if due < math.inf:
                heapq.heappush(promotions, (due, i, number))

    def _reclass_running(self) -> None:
        """Move the running jobs' classes (ranked policies), before a pass that may preempt them."""
        sim, jobs, running, now = self.sim, self.jobs, self.running, self.now
        if self.predicted and self.queue:
            # A running job's class moves only when its predicted remaining IPU-seconds cross a
            # power of two, its prediction runs out, or a promotion falls due: each is
            # recomputed then (`las.running_class`), not at every event.
            reclass = self.reclass
            while reclass and reclass[0][0] <= now:
                _, i, number = heapq.heappop(reclass)
                r = running.get(jobs[i].id)
                if r is None or number != self.attempt[i]:
                    continue
                klass, due = running_class(self.config, r, now, self.queued_at[i], self.starve_at[i])
                if klass != r.priority:
                    running[r.id] = _with_priority(r, klass)
                heapq.heappush(reclass, (due, i, number))
        elif self.ranked and self.queue:
            # Service grows and time left shrinks while jobs run: their classes move with them.
            index, run_from, attained, left = self.index, self.run_from, self.attained, self.left
            for job_id, r in running.items():
                i = index[job_id]
                ran = now - run_from[i]
                klass = sim._rank(attained[i] + r.size * ran, left[i] - ran / sim._placed_on[i])
                if klass != r.priority:
                    running[job_id] = replace(r, priority=klass)

    def _schedule(self, arrivals: list[QueuedJob]) -> None:
        """The policy's passes at this instant: start what it starts and preempt what it preempts;
        a pass that stops victims at once is followed by another, as the live loop's next pass
        follows once the victims stop."""
        sim, queue, result, now = self.sim, self.queue, self.result, self.now
        self.head_size = None
        self.head_refused = False
        while queue:
            snapshot = Snapshot(
                now=now,
                queue=queue,
                running=self.running.values(),
                tenants=sim._tenant_states(self.tenants, now, self.half_life) if self.fair else {},
                allocator=self.alloc,
                arrivals=arrivals,
                timetable=self.table,
            )
            decision = decide(snapshot, self.config, explain=False, name_for=_own_name)
            arrivals = []
            result.passes += 1
            result.launch_failures += decision.stats.launch_failures
            result.backfilled += decision.stats.backfilled
            for queued, placement in decision.starts:
                assert not isinstance(placement, str)
                self._start(queued, placement)
            self.head_size = decision.stats.head_size
            self.head_refused = decision.stats.head_refused_with_room
            warned = self.warned
            fresh = [v for v in decision.preempt if v.id not in warned]
            if not fresh:
                break  # nothing to stop now: the victims warned before free their IPUs later
            for victim in fresh:
                self._preempt(victim)
            result.preemptions += len(fresh)
            if all(v.id in warned for v in fresh):
                break

    def _start(self, queued: QueuedJob, placement: Placement) -> None:
        """Start a job the pass placed: on its partition, in the ledgers and the figures."""
        sim, now, cost, flags = self.sim, self.now, self.cost, self.flags
        left, told_left, outcomes = self.left, self.told_left, self.outcomes
        i = self.index[queued.id]
        job = self.jobs[i]
        self.queue.remove(queued.id)
        factor = sim._factor(i, placement.machine_type)
        kind = placement.machine_type.value
        if cost is not None and outcomes[i].preempted and self.last_type.get(i, kind) != kind:
            # Its executable was built for another machine type: compiled again.
            left[i] += cost.compile_s / factor
            told_left[i] += cost.compile_s / factor
        self.last_type[i] = kind
        end = now + told_left[i] * factor
        started = RunningJob(
            job.id,
            job.tenant,
            job.size,
            placement.partition_id,
            now,
            end,
            queued.priority,
            preemptible=flags[i],
            checkpoint_every=sim.checkpoint_every_s if flags[i] else math.inf,
            never_preempt=sim.never_preempt[i],
            preemptions=outcomes[i].preempted,
            submitted_at=queued.submitted_at,
        )
        self.running[job.id] = started
        if self.predicted:
            heapq.heappush(self.reclass, (now, i, self.attempt[i]))
        self.table.add(placement.partition_id, placement, started)
        self.run_from[i] = now
        sim._placed_on[i] = factor
        heapq.heappush(self.completions, (now + left[i] * factor, i, self.attempt[i]))
        result = self.result
        if sim.runs is not None:
            result.extra["work_ipu_s"] = result.extra.get("work_ipu_s", 0.0) + job.size * left[i] * factor
        self.busy += job.size
        ledger = self.tenants[job.tenant]
        ledger.advance(now, self.half_life)
        ledger.ipus += job.size
        ledger.end_weighted += job.size * end
        outcome = outcomes[i]
        outcome.start_s = now
        if math.isnan(outcome.first_start_s):
            outcome.first_start_s = now
        outcome.machine_type = placement.machine_type.value
        if sim.record_placements:
            outcome.ipus = placement.ipu_ids

    def _preempt(self, victim: RunningJob) -> None:
        """Preempt a job the pass chose: warn it (it stops when the warning ends) or stop it now."""
        i = self.index[victim.id]
        now, warning_s = self.now, self.sim.warning_s
        if (victim.preemptible or (self.ranked and self.cost is not None)) and warning_s > 0:
            # Warned: it checkpoints and holds its IPUs until the warning ends.
            self.warned.add(victim.id)
            heapq.heappush(self.stops, (now + warning_s, i, self.attempt[i]))
        elif victim.preemptible:
            self._stop(i, victim.at_risk(now))  # no warning: back to its last checkpoint
        elif self.ranked:
            self._stop(i, 0.0)  # free preemption: resumed from the moment it was stopped
        else:
            self._stop(i, now - self.run_from[i])  # priority preemption: all of its run is lost


def _with_priority(r: RunningJob, priority: int) -> RunningJob:
    """``replace(r, priority=priority)``, field by field: a replay moves running jobs' classes some
    hundred thousand times, and `dataclasses.replace` is several times slower."""
    return RunningJob(
        r.id,
        r.tenant_id,
        r.size,
        r.partition,
        r.started_at,
        r.expected_end,
        priority,
        r.reserved,
        r.preemptible,
        r.checkpoint_every,
        r.session,
        r.never_preempt,
        r.preemptions,
        r.submitted_at,
        r.measured_end,
    )


def _own_name(job_id: str) -> str:
    return job_id
