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
from scheduler.policy.las import attained_class, next_promotion, predicted_class, promoted, starved_after
from scheduler.policy.preemption import PreemptionCost, resumed_runtime_s
from scheduler.policy.timetable import expected_end
from scheduler.simulator.machines import TypeRun
from scheduler.simulator.trace import TraceJob
from vipu.allocator import Allocator
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
        jobs, config, est = self.jobs, self.policy, self.estimates
        alloc = Allocator(self.fleet, policy=config.placement)
        capacity = self.fleet.ipus
        index = {job.id: i for i, job in enumerate(jobs)}
        outcomes = [JobOutcome() for _ in jobs]
        horizon = max((j.submit_s + j.duration_s for j in jobs), default=1.0)
        # Bins cover the submissions plus the longest job; a queue that outlasts them grows the list.
        bin_s = max(horizon / self.bins, 1.0)
        result = SimResult(
            policy=config.name,
            estimates=self.estimate_model,
            jobs=jobs,
            outcomes=outcomes,
            capacity_ipus=capacity,
            busy_bins=[0.0] * (self.bins + 1),
            bin_s=bin_s,
            preemptible=self.preemptible,
        )
        flags = self.preemptible
        # Warned victims stop when their warning ends: (at, job index, attempt).
        stops: list[tuple[float, int, int]] = []
        warned: set[str] = set()
        fair = config.ordering == "fair"
        half_life = config.half_life_s
        queue = JobQueue()
        running: dict[str, RunningJob] = {}
        table = TimeTable(self.fleet)
        tenants: dict[str, _Tenant] = {}
        # (end, job index, attempt): a preempted attempt's completion is ignored when it comes up.
        completions: list[tuple[float, int, int]] = []
        attempt = [0] * len(jobs)
        submitted: list[QueuedJob | None] = [None] * len(jobs)
        # Reference policies (tiresias, srtf-oracle) rank by service had or time left and resume
        # preempted jobs from their checkpoint; the others rank as asked and lose preempted work.
        ranked = config.priority_from != "plan"
        left = [j.duration_s for j in jobs]  # true run time still to go, on the recorded machine
        told_left = list(est)  # what the policy believes is still to go
        attained = [0.0] * len(jobs)  # IPU-seconds run so far (Tiresias' service)
        run_from = [0.0] * len(jobs)
        cost = self.cost
        predicted = config.priority_from == "predicted"
        promote_s = config.promote_after_s if ranked else None
        # Starved queued jobs move up a class (scheduler.policy.las.promoted): (due, job, attempt).
        promotions: list[tuple[float, int, int]] = []
        queued_at = [0.0] * len(jobs)
        starve_at = [math.inf] * len(jobs)  # the wait after which a job is starved (las.starved_after)
        reclass: list[tuple[float, int, int]] = []  # (when its class next moves, job, attempt)
        base_class = [0] * len(jobs)
        last_type: dict[int, str] = {}
        now = 0.0
        busy = 0
        head_size: int | None = None
        head_refused = False
        next_arrival = 0
        done = 0

        def stop(i: int, lost: float) -> None:
            """Take job `i` off its partition and queue it again; `lost` of the run time it had
            (since its last start) is redone, the rest it resumes from (a checkpoint)."""
            job = jobs[i]
            victim = running.pop(job.id)
            alloc.release(victim.partition)
            table.remove(victim.partition)
            attempt[i] += 1
            nonlocal busy
            busy -= victim.size
            ledger = tenants[victim.tenant_id]
            ledger.advance(now, half_life)
            ledger.ipus -= victim.size
            ledger.end_weighted -= victim.size * victim.expected_end
            factor = self._placed_on[i]
            ran = now - run_from[i]
            if self.runs is not None:
                # It was counted as running all it had left; it ran `ran` of it.
                result.extra["work_ipu_s"] -= victim.size * (left[i] * factor - ran)
            kept_s = max(0.0, ran - lost) / factor
            if kept_s > 0 or ranked:
                # Resumed, it loads its executable and reads its checkpoint back before new work.
                restart = cost.restart_s() / factor if cost is not None else 0.0
                left[i] = max(0.0, left[i] - kept_s) + restart
                told_left[i] = resumed_runtime_s(told_left[i], kept_s, restart)
            attained[i] += victim.size * ran
            outcomes[i].preempted += 1
            outcomes[i].lost_s += lost
            outcomes[i].start_s = math.nan
            result.preemption_losses.append(lost)
            warned.discard(job.id)
            again = submitted[i]
            assert again is not None
            if kept_s > 0 or ranked:
                again = replace(again, predicted_runtime_s=told_left[i])
            if ranked:
                base_class[i] = self._rank(attained[i], left[i], victim.size * told_left[i])
                again = replace(again, priority=base_class[i])
                queued_at[i] = now
                starve_at[i] = starved_after(config, told_left[i])
                due = next_promotion(base_class[i], now, now, promote_s, starve_at[i])
                if due < math.inf:
                    heapq.heappush(promotions, (due, i, attempt[i]))
            submitted[i] = again
            queue.add(again)

        while next_arrival < len(jobs) or completions or stops:
            upcoming = jobs[next_arrival].submit_s if next_arrival < len(jobs) else math.inf
            if completions and completions[0][0] <= upcoming:
                upcoming = completions[0][0]
            if stops and stops[0][0] <= upcoming:
                upcoming = stops[0][0]
            # Integrate the figures over the interval during which nothing changed.
            elapsed = upcoming - now
            if elapsed > 0:
                if busy:
                    self._add_busy(result, now, upcoming, busy)
                if head_size is not None:
                    result.waiting_s += elapsed
                    result.stranded_ipu_s += elapsed * alloc.fragmentation(head_size).stranded_share
                    if head_refused:
                        result.refused_with_room_s += elapsed
            now = upcoming

            while completions and completions[0][0] <= now:
                _, i, number = heapq.heappop(completions)
                if number != attempt[i]:
                    continue  # this attempt was preempted
                job = jobs[i]
                ended = running.pop(job.id)
                alloc.release(ended.partition)
                table.remove(ended.partition)
                busy -= job.size
                ledger = tenants[job.tenant]
                ledger.advance(now, half_life)
                ledger.ipus -= job.size
                ledger.end_weighted -= job.size * ended.expected_end
                outcomes[i].end_s = now
                warned.discard(job.id)
                done += 1
            while stops and stops[0][0] <= now:
                _, i, number = heapq.heappop(stops)
                if number == attempt[i] and jobs[i].id in running:
                    # Checkpointed at its warning; what it ran in the window is lost.
                    stop(i, min(self.warning_s, now - run_from[i]))
            arrivals: list[QueuedJob] = []
            while next_arrival < len(jobs) and jobs[next_arrival].submit_s <= now:
                job = jobs[next_arrival]
                klass = self._rank(0.0, job.duration_s, job.size * est[next_arrival]) if ranked else 0
                if promote_s is not None:
                    base_class[next_arrival] = klass
                    queued_at[next_arrival] = now
                    starve_at[next_arrival] = starved_after(config, est[next_arrival])
                    due = next_promotion(klass, now, now, promote_s, starve_at[next_arrival])
                    if due < math.inf:
                        heapq.heappush(promotions, (due, next_arrival, 0))
                queued = submitted[next_arrival] = QueuedJob(
                    job.id,
                    job.tenant,
                    job.size,
                    job.submit_s,
                    est[next_arrival],
                    priority=klass,
                    options=self._options(next_arrival),
                    preemptible=flags[next_arrival],
                )
                tenants.setdefault(job.tenant, _Tenant(at=now))
                if self.estimate_every and next_arrival % self.estimate_every == 0:
                    view = Snapshot(
                        now=now,
                        queue=queue,
                        running=running.values(),
                        tenants=self._tenant_states(tenants, now, half_life) if fair else {},
                        allocator=alloc,
                        arrivals=arrivals,
                        timetable=table,
                        stopping={
                            jobs[w].id: at
                            for at, w, number in stops
                            if number == attempt[w] and jobs[w].id in warned
                        },
                    )
                    start = estimate_start(
                        view, queued, config, max_passes=self.estimate_passes, name_for=_own_name
                    )
                    outcomes[next_arrival].estimated_start_s = math.inf if start is None else start
                queue.add(queued)
                arrivals.append(queued)
                next_arrival += 1

            while promotions and promotions[0][0] <= now:
                _, i, number = heapq.heappop(promotions)
                waiting = submitted[i]
                if number != attempt[i] or waiting is None or waiting.id not in queue:
                    continue
                klass = promoted(base_class[i], now - queued_at[i], promote_s, starve_at[i])
                if klass != waiting.priority:
                    queue.remove(waiting.id)
                    waiting = submitted[i] = replace(waiting, priority=klass)
                    queue.add(waiting)
                due = next_promotion(base_class[i], queued_at[i], now, promote_s, starve_at[i])
                if due < math.inf:
                    heapq.heappush(promotions, (due, i, number))
            head_size = None
            head_refused = False
            if predicted and queue:
                # A running job's class moves only when its predicted remaining IPU-seconds cross a
                # power of two, its prediction runs out, or a promotion falls due: each is
                # recomputed then (`_reclass`), not at every event.
                while reclass and reclass[0][0] <= now:
                    _, i, number = heapq.heappop(reclass)
                    r = running.get(jobs[i].id)
                    if r is None or number != attempt[i]:
                        continue
                    klass, due = self._reclass(r, now, queued_at[i], promote_s, starve_at[i])
                    if klass != r.priority:
                        running[r.id] = _with_priority(r, klass)
                    heapq.heappush(reclass, (due, i, number))
            elif ranked and queue:
                # Service grows and time left shrinks while jobs run: their classes move with them.
                for job_id, r in running.items():
                    i = index[job_id]
                    ran = now - run_from[i]
                    klass = self._rank(attained[i] + r.size * ran, left[i] - ran / self._placed_on[i])
                    if klass != r.priority:
                        running[job_id] = replace(r, priority=klass)
            while queue:
                snapshot = Snapshot(
                    now=now,
                    queue=queue,
                    running=running.values(),
                    tenants=self._tenant_states(tenants, now, half_life) if fair else {},
                    allocator=alloc,
                    arrivals=arrivals,
                    timetable=table,
                )
                decision = decide(snapshot, config, explain=False, name_for=_own_name)
                arrivals = []
                result.passes += 1
                result.launch_failures += decision.stats.launch_failures
                result.backfilled += decision.stats.backfilled
                for queued, placement in decision.starts:
                    assert not isinstance(placement, str)
                    i = index[queued.id]
                    job = jobs[i]
                    queue.remove(queued.id)
                    factor = self._factor(i, placement.machine_type)
                    kind = placement.machine_type.value
                    if cost is not None and outcomes[i].preempted and last_type.get(i, kind) != kind:
                        # Its executable was built for another machine type: compiled again.
                        left[i] += cost.compile_s / factor
                        told_left[i] += cost.compile_s / factor
                    last_type[i] = kind
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
                        checkpoint_every=self.checkpoint_every_s if flags[i] else math.inf,
                        never_preempt=self.never_preempt[i],
                        preemptions=outcomes[i].preempted,
                    )
                    running[job.id] = started
                    if predicted:
                        heapq.heappush(reclass, (now, i, attempt[i]))
                    table.add(placement.partition_id, placement, started)
                    run_from[i] = now
                    self._placed_on[i] = factor
                    heapq.heappush(completions, (now + left[i] * factor, i, attempt[i]))
                    if self.runs is not None:
                        result.extra["work_ipu_s"] = (
                            result.extra.get("work_ipu_s", 0.0) + job.size * left[i] * factor
                        )
                    busy += job.size
                    ledger = tenants[job.tenant]
                    ledger.advance(now, half_life)
                    ledger.ipus += job.size
                    ledger.end_weighted += job.size * end
                    outcome = outcomes[i]
                    outcome.start_s = now
                    if math.isnan(outcome.first_start_s):
                        outcome.first_start_s = now
                    outcome.machine_type = placement.machine_type.value
                    if self.record_placements:
                        outcome.ipus = placement.ipu_ids
                head_size = decision.stats.head_size
                head_refused = decision.stats.head_refused_with_room
                fresh = [v for v in decision.preempt if v.id not in warned]
                if not fresh:
                    break  # nothing to stop now: the victims warned before free their IPUs later
                for victim in fresh:
                    i = index[victim.id]
                    if (victim.preemptible or (ranked and cost is not None)) and self.warning_s > 0:
                        # Warned: it checkpoints and holds its IPUs until the warning ends.
                        warned.add(victim.id)
                        heapq.heappush(stops, (now + self.warning_s, i, attempt[i]))
                    elif victim.preemptible:
                        stop(i, victim.at_risk(now))  # no warning: back to its last checkpoint
                    elif ranked:
                        stop(i, 0.0)  # free preemption: resumed from the moment it was stopped
                    else:
                        stop(i, now - run_from[i])  # priority preemption: all of its run is lost
                result.preemptions += len(fresh)
                if all(v.id in warned for v in fresh):
                    break
            if progress is not None and done:
                progress(done)
                done = 0
        if queue:
            raise RuntimeError(f"{len(queue)} jobs never started: the fleet cannot host them")
        return result

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

    def _reclass(
        self, r: RunningJob, now: float, queued_at: float, promote_s: float | None, starve_s: float
    ) -> tuple[int, float]:
        """A running job's class under ``predicted`` classes, and when it next changes. Its class
        goes on rising with promotion while it runs, as the classes of the jobs waiting behind it
        do: those it kept waiting never overtake it and preempt it straight back."""
        config = self.policy
        end = expected_end(r, now)  # past its prediction: expected to run as long again
        remaining = r.size * (end - now)
        base = predicted_class(remaining, 0.0, config.las_thresholds_ipu_s)
        klass = promoted(base, now - queued_at, promote_s, starve_s)
        crosses = end if remaining <= 1.0 else end - 2.0 ** (math.ceil(math.log2(remaining)) - 1) / r.size
        due = min(max(crosses, now), end, next_promotion(base, queued_at, now, promote_s, starve_s))
        return klass, due if due > now else end

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
    )


def _own_name(job_id: str) -> str:
    return job_id
