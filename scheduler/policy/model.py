"""What a scheduling pass sees and what it decides: plain data, no database, no clock.

The live loop fills a `Snapshot` from the database and the wall clock; the simulator keeps one up to
date in memory on a simulated clock. Times are seconds on the caller's clock (epoch seconds live,
trace seconds in the simulator); sizes are IPUs; usage is IPU-seconds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduler.policy.running import RunningJob
from vipu.allocator import Allocator, Placement
from vipu.topology import MAX_IPUS

if TYPE_CHECKING:
    from scheduler.policy.timetable import TimeTable

SIZE_LEVELS = MAX_IPUS.bit_length()  # sizes 1 .. 65,536 are levels 0 .. 16


@dataclass(frozen=True, slots=True)
class MachineOption:
    """What a job would need on one machine type: its partition size, its predicted run time there,
    and the rate (grant units per IPU-hour) it would be billed at."""

    machine_type: str
    size: int
    predicted_runtime_s: float
    rate: float = 1.0

    @property
    def cost_ipu_ms(self) -> int:
        return round(self.rate * self.size * self.predicted_runtime_s * 1000)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job waiting for a partition.

    ``predicted_runtime_s`` is what the policy believes the job will take (the emulator's prediction
    capped by the job's ``max_runtime_s`` live; whatever estimate model the simulator runs).
    ``cost_ipu_ms`` is the quota it needs; 0 when quotas do not apply.

    A job that may run on several machine types (``machine_type`` None) lists ``options``, one per
    type; a pass settles it on one (``scheduler.policy.machine_choice``) before placing it, and its
    own ``size`` is then the smallest of them. ``prefer`` is ``time`` or ``cost``.

    ``priority`` is the job's class, which ranks it against every tenant's jobs: live, its tenant's
    plan priority (set by an admin); the research anchors' own classes in the simulator.
    ``user_priority`` is the priority its owner gave it, which orders that tenant's jobs only.
    """

    id: str
    tenant_id: str
    size: int
    submitted_at: float
    predicted_runtime_s: float
    priority: int = 0
    machine_type: str | None = None
    partition: str | None = None  # a reserved partition it must run in
    cost_ipu_ms: int = 0
    options: tuple[MachineOption, ...] = ()
    prefer: str = "time"
    preemptible: bool = False
    user_priority: int = 0
    # An inference endpoint's replica: exempt from the plan's job-count limits (it counts against the
    # plan's endpoint limits, judged when the endpoint is created or changed).
    counted: bool = True


@dataclass(frozen=True, slots=True)
class HeldArray:
    """A job array's queued elements kept from a pass (past its ``max_running`` less its running
    elements, or past its tenant's room), as the forecast needs them: ``waiting`` (in the order
    they would be shown) join the replay's queue one by one while fewer than ``cap`` of the array's
    elements run or wait in that queue; ``members`` are those running or shown to the pass now.
    ``cap`` is the array's ``max_running``, or without one its tenant's running limit (the
    replay's policy holds the tenant to that limit; the cap keeps its queue as short as the pass's)."""

    cap: int
    members: frozenset[str]
    waiting: tuple[QueuedJob, ...]


@dataclass(frozen=True, slots=True)
class TenantState:
    """One tenant as admission and fair share see it. ``None`` limits mean "no limit".

    ``usage_ipu_s`` is the decayed IPU-seconds the tenant has used; ``committed_ipu_s`` the
    predicted IPU-seconds its running jobs still have to run. ``quota_left_ipu_ms`` is the grant
    minus what was used minus what running jobs still hold, i.e. what its queued jobs may spend.
    """

    id: str
    active: bool = True
    expires_at: float | None = None
    quota_left_ipu_ms: int | None = None
    max_concurrent_jobs: int | None = None
    max_queued_jobs: int | None = None
    max_partition_size: int | None = None
    running_jobs: int = 0
    usage_ipu_s: float = 0.0
    committed_ipu_s: float = 0.0
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ReservedPartition:
    """An admin-made partition that serves one tenant's jobs, one per graph compile domain (GCD)."""

    name: str
    tenant_id: str | None
    size: int
    running_job: str | None = None  # a job in it now, if any (the first, when several)
    gcds: int = 1
    running_jobs: tuple[str, ...] = ()  # every job in it now, one per GCD
    healthy: bool = True  # no IPU of it on a machine that is failed or draining

    @property
    def holders(self) -> tuple[str, ...]:
        return self.running_jobs or ((self.running_job,) if self.running_job else ())


class JobQueue:
    """Queued jobs grouped by (priority, tenant, size level), each group in its tenant's order (the
    owner's priority, then age), and by (priority, size level) across tenants, in age order.

    Every ordering the policies use is a merge of these groups (fair share: by tenant; FIFO: by
    class), so the simulator keeps one queue up to date job by job instead of re-sorting thousands of
    jobs at every event. Grouping by size too lets a pass skip at once every job of a size that
    cannot start, however the sizes interleave in age order.
    """

    __slots__ = ("_classes", "_groups", "_where", "preemptible")

    def __init__(self, jobs: Sequence[QueuedJob] = ()) -> None:
        self._groups: dict[tuple[int, str, int], _Group] = {}
        self._classes: dict[tuple[int, int], _Group] = {}
        self._where: dict[str, tuple[int, str, int]] = {}
        self.preemptible = 0  # how many of its jobs are preemptible
        # In age order (the classes' order), then each tenant's group sorted once: adding them one
        # by one would rebuild a group whose owner ranks a newer job higher again and again.
        for job in sorted(jobs, key=age_key):
            self._put(job, settled=False)
        for group in self._groups.values():
            group.settle()
        for klass in self._classes.values():
            klass.settle()

    def add(self, job: QueuedJob) -> None:
        self._put(job, settled=True)

    def _put(self, job: QueuedJob, *, settled: bool) -> None:
        if job.id in self._where:
            raise ValueError(f"job {job.id} is already queued")
        level = job.size.bit_length() - 1
        key = (job.priority, job.tenant_id, level)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(level, tenant_key)
        group.add(job, settled)
        klass = self._classes.get((job.priority, level))
        if klass is None:
            klass = self._classes[job.priority, level] = _Group(level, age_key)
        klass.add(job, settled)
        self._where[job.id] = key
        self.preemptible += job.preemptible

    def remove(self, job_id: str) -> QueuedJob:
        key = self._where.pop(job_id)
        group = self._groups[key]
        job = group.remove(job_id)
        if not group.jobs:
            del self._groups[key]
        class_key = (key[0], key[2])
        klass = self._classes[class_key]
        klass.remove(job_id)
        if not klass.jobs:
            del self._classes[class_key]
        self.preemptible -= job.preemptible
        return job

    def get(self, job_id: str) -> QueuedJob | None:
        key = self._where.get(job_id)
        return None if key is None else self._groups[key].jobs[job_id]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[QueuedJob]:
        for group in self._groups.values():
            yield from group.jobs.values()

    def groups(self) -> Mapping[tuple[int, str, int], _Group]:
        """(priority, tenant, size level) -> its jobs."""
        return self._groups

    def classes(self) -> Mapping[tuple[int, int], _Group]:
        """(priority, size level) -> its jobs of every tenant."""
        return self._classes


class _Group:
    """Queued jobs of one size level, in the order `order` gives (age, or the tenant's order), with
    the shortest predicted run time among them (kept cheap to ask: a pass asks it of every group it
    considers skipping)."""

    __slots__ = ("_order", "_runtimes", "jobs", "last", "level")

    def __init__(self, level: int, order: Callable[[QueuedJob], tuple[Any, ...]]) -> None:
        self.level = level
        self.jobs: dict[str, QueuedJob] = {}
        self.last: tuple[Any, ...] | None = None
        self._order = order
        self._runtimes: list[tuple[float, str]] = []  # a heap; entries of removed jobs linger

    def add(self, job: QueuedJob, settled: bool = True) -> None:
        """Add a job in its place; with `settled` False, at the end (`settle` orders them later)."""
        key = self._order(job)
        if not settled:
            self.jobs[job.id] = job
        elif self.last is not None and key < self.last:
            # Out of order (a preempted job back in the queue, or a job its owner ranks higher):
            # rebuild this group in order.
            ordered = sorted([*self.jobs.values(), job], key=self._order)
            self.jobs = {j.id: j for j in ordered}
        else:
            self.jobs[job.id] = job
            self.last = key
        heapq.heappush(self._runtimes, (job.predicted_runtime_s, job.id))

    def settle(self) -> None:
        """Put the jobs added unsettled in order."""
        ordered = sorted(self.jobs.values(), key=self._order)
        self.jobs = {j.id: j for j in ordered}
        self.last = self._order(ordered[-1]) if ordered else None

    def remove(self, job_id: str) -> QueuedJob:
        job = self.jobs.pop(job_id)
        if not self.jobs:
            self.last = None
            self._runtimes.clear()
        elif len(self._runtimes) > 2 * len(self.jobs) + 16:
            self._runtimes = [(j.predicted_runtime_s, j.id) for j in self.jobs.values()]
            heapq.heapify(self._runtimes)
        return job

    def shortest_runtime(self) -> float:
        runtimes = self._runtimes
        while runtimes and runtimes[0][1] not in self.jobs:
            heapq.heappop(runtimes)
        return runtimes[0][0] if runtimes else math.inf


def age_key(job: QueuedJob) -> tuple[float, str]:
    return (job.submitted_at, job.id)


def tenant_key(job: QueuedJob) -> tuple[int, float, str]:
    """A tenant's own order of its jobs: the priority its owner gave, then age."""
    return (-job.user_priority, job.submitted_at, job.id)


@dataclass
class Snapshot:
    """Everything one pass decides over. The pass allocates on ``allocator`` as it starts jobs.

    ``arrivals`` are queued jobs the caller has not shown the policy before: their sizes feed the
    placement policy's demand model (``Allocator.observe_request``) before anything is placed.
    ``timetable``, when the caller keeps one in step with the allocator and ``running``, saves the
    pass rebuilding it for a reservation (the simulator keeps one; the live loop does not need to).
    """

    now: float
    queue: JobQueue
    running: Collection[RunningJob]
    tenants: Mapping[str, TenantState]
    allocator: Allocator
    reserved: Mapping[str, ReservedPartition] = field(default_factory=dict)
    arrivals: Sequence[QueuedJob] = ()
    timetable: TimeTable | None = None
    # Arrays whose queued elements were kept from the policy (scheduling.gate_queue), by array id:
    # the pass never sees them, the forecast lets them in as the array's throttle would.
    held: Mapping[str, HeldArray] = field(default_factory=dict)
    # Running jobs already warned of their preemption, by id: when the warning ends and they stop.
    # Only the forecast reads it (a pass that picks one as a victim again changes nothing).
    stopping: Mapping[str, float] = field(default_factory=dict)
    # Non-preemptible jobs submitted within the policy's ``inflow_window_s`` before ``now``, as they
    # were queued (started or not): only the forecast reads them, to expect as much such work again
    # ahead of the preemptible jobs it forecasts. Callers fill it when preemptible work is queued.
    recent: Sequence[QueuedJob] = ()

    @classmethod
    def build(
        cls,
        *,
        now: float,
        queued: Sequence[QueuedJob],
        allocator: Allocator,
        running: Collection[RunningJob] = (),
        tenants: Mapping[str, TenantState] | None = None,
        reserved: Mapping[str, ReservedPartition] | None = None,
        arrivals: Sequence[QueuedJob] = (),
    ) -> Snapshot:
        return cls(
            now=now,
            queue=JobQueue(queued),
            running=running,
            tenants=tenants or {},
            allocator=allocator,
            reserved=reserved or {},
            arrivals=arrivals,
        )


@dataclass(frozen=True, slots=True)
class Wait:
    """Why a queued job did not start in this pass.

    ``reason`` is one of: ``quota``, ``limit``, ``tenant-inactive``, ``no-room`` (no free partition
    of its size), ``behind`` (it would fit, but starting it would delay the job(s) in ``behind``),
    ``reserved`` (it is first in line; ``estimated_start`` is when its reserved IPUs free up),
    ``preempting`` (lower-priority work is being stopped for it), ``partition-busy`` and
    ``partition-missing``, ``partition-unhealthy`` (for jobs bound to a reserved partition).
    """

    reason: str
    detail: str
    behind: tuple[str, ...] = ()
    estimated_start: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "detail": self.detail,
            "behind": list(self.behind),
            "estimated_start": self.estimated_start,
        }


@dataclass(frozen=True, slots=True)
class Reservation:
    """The first job in line that cannot start now: when and where it will, if estimates hold."""

    job_id: str
    size: int
    start: float  # math.inf when it cannot start even once everything running has ended
    ipu_ids: frozenset[str] = frozenset()

    @property
    def timed(self) -> bool:
        return math.isfinite(self.start)


@dataclass
class PassStats:
    """Figures of one pass, for the simulator's report and the live loop's metrics."""

    examined: int = 0
    backfilled: int = 0
    head_size: int | None = None
    head_machine_type: str | None = None
    head_refused_with_room: bool = False  # enough IPUs were free in total, but no valid partition
    launch_failures: int = 0  # count-only planners: starts the allocator could not place


@dataclass
class Decision:
    """What to do now: start ``starts`` (a placement, or the name of a reserved partition), stop
    ``preempt`` (their attempts are requeued and not billed), and why the others wait."""

    starts: list[tuple[QueuedJob, Placement | str]] = field(default_factory=list)
    preempt: list[RunningJob] = field(default_factory=list)
    waits: dict[str, Wait] = field(default_factory=dict)
    reservation: Reservation | None = None
    stats: PassStats = field(default_factory=PassStats)
