"""How a pass sees free space: start jobs now, reserve the first blocked job's start, backfill around it.

EASY backfill (Lifka 1995; Mu'alem and Feitelson 2001): the first job in line that cannot start gets
a reservation at the earliest time it could, found by replaying the running jobs' predicted ends.
A later job may start now only if it does not delay that reservation: it ends before the reserved
start, or it stays off what the reservation needs.

``TopologyPlanner`` knows partitions: it replays the ends on a clone of the Virtual-IPU allocator,
so the reservation is a concrete set of IPUs forming a valid partition, and a backfilled job that
outlives the reserved start must be placed off those IPUs.

``CountPlanner`` is Slurm with a count-only IPU resource (a GRES of N IPUs per cluster): it believes
any N free IPUs will do, and its reservation is a count ("the extra IPUs"). Its starts still go to
V-IPU, which must make a real partition of them; when the IPUs the count promised are not a valid
partition, V-IPU refuses and the launch fails (``Start.launch_failed``); the job stays queued.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, TypedDict

from scheduler.policy.model import QueuedJob, Reservation
from scheduler.policy.running import RunningJob
from scheduler.policy.timetable import Inconsistent, TimeTable, expected_end
from vipu.allocator import Allocator, Placement
from vipu.topology import Health, machine_of_ipu


class _Hint(TypedDict, total=False):
    expected_end: float
    now: float


@dataclass(frozen=True, slots=True)
class Start:
    """A placement, or why there is none: ``room`` (nothing of that size is free now), ``held``
    (there is, but using it would delay the reservation) or ``launch`` (the planner counted enough
    free IPUs, V-IPU could not make a partition of them)."""

    placement: Placement | None
    failure: Literal["room", "held", "launch"] | None = None


class TopologyPlanner:
    """Partitions as V-IPU makes them: every question goes to the allocator (or a clone of it)."""

    def __init__(
        self,
        allocator: Allocator,
        running: Collection[RunningJob],
        now: float,
        timetable: TimeTable | None = None,
        *,
        hints: bool = True,
    ) -> None:
        self.allocator = allocator
        self._hints = hints  # tell the placement policy predicted ends (a run-time-blind policy: not)
        self._running = running
        self._now = now
        self._table = timetable  # kept up to date by the caller, or None: built when needed
        self._free = allocator.free_ipus()
        self._started: list[tuple[float, str]] = []  # (predicted end, partition) started this pass
        self._view: Allocator | None = None  # the allocator with the reserved IPUs held back
        self._view_for: Reservation | None = None

    def free(self, machine_type: str | None) -> int:
        return self._free if machine_type is None else self.allocator.free_ipus(machine_type)

    def _placed(self, job: QueuedJob, name: str) -> None:
        self._free -= job.size
        self._started.append((self._now + job.predicted_runtime_s, name))

    def _hint(self, job: QueuedJob) -> _Hint:
        """When the partition should be free again, for the placement policy to pack ends together."""
        end = self._now + job.predicted_runtime_s
        return {"expected_end": end, "now": self._now} if self._hints and math.isfinite(end) else {}

    def start(self, job: QueuedJob, name: str) -> Start:
        placement = self.allocator.allocate(name, job.size, machine_type=job.machine_type, **self._hint(job))
        if placement is None:
            return Start(None, "room")
        if self._view is not None:
            self._view.occupy(name, placement.ipu_ids)
        self._placed(job, name)
        return Start(placement)

    def _releases(self) -> list[tuple[float, str]]:
        """Partitions that free up, with when: running jobs and the jobs this pass started."""
        ends = [(expected_end(r, self._now), r.partition) for r in self._running if not r.reserved]
        ends.extend(self._started)
        return ends

    def reserve(self, job: QueuedJob) -> Reservation:
        alloc = self.allocator
        started = {name for _, name in self._started}
        table = self._table or TimeTable.from_allocator(alloc, self._running, skip=started)
        try:
            found = table.earliest(
                job.size,
                job.machine_type,
                self._now,
                also=[(end, alloc.partition(name)) for end, name in self._started],
                allocator_free=alloc.free_ipus(job.machine_type),
            )
        except Inconsistent:
            return self._replay(job)
        if found is None:
            return Reservation(job.id, job.size, math.inf)
        return Reservation(job.id, job.size, found[0], frozenset(found[1]))

    def _replay(self, job: QueuedJob) -> Reservation:
        """The slow, always-right way: release partitions on a clone in end order until it fits."""
        kind = job.machine_type
        twin = self.allocator.clone()
        for end, name in sorted(self._releases()):
            try:
                twin.release(name)
            except KeyError:
                continue
            if twin.free_ipus(kind) < job.size or twin.largest_free(kind) < job.size:
                continue
            found = twin.find(job.size, machine_type=kind)
            if found is not None:
                return Reservation(job.id, job.size, max(end, self._now), frozenset(found.ipu_ids))
        return Reservation(job.id, job.size, math.inf)

    def fits_now(self, job: QueuedJob) -> bool:
        return self.allocator.find(job.size, machine_type=job.machine_type) is not None

    def backfill(self, job: QueuedJob, name: str, reservation: Reservation) -> Start:
        """Start ``job`` now without delaying ``reservation``; a placement or None."""
        if self._now + job.predicted_runtime_s <= reservation.start:
            return self.start(job, name)
        hint = self._hint(job)
        natural = self.allocator.find(job.size, machine_type=job.machine_type, **hint)
        if natural is None:
            return Start(None, "room")
        if reservation.ipu_ids.isdisjoint(natural.ipu_ids):
            # Where the placement policy would put it anyway stays off the reserved IPUs.
            return self.start(job, name)
        view = self._held_back(reservation)
        found = view.find(job.size, machine_type=job.machine_type, **hint)
        if found is None:
            return Start(None, "held")
        placement = self.allocator.occupy(name, found.ipu_ids, expected_end=hint.get("expected_end"))
        # occupy() places without asking the policy, so tell its demand model about the request.
        self.allocator.observe_request(job.size, machine_type=job.machine_type)
        view.occupy(name, found.ipu_ids, expected_end=hint.get("expected_end"))
        self._placed(job, name)
        return Start(placement)

    def _held_back(self, reservation: Reservation) -> Allocator:
        if self._view is not None and self._view_for == reservation:
            return self._view
        view = self.allocator.clone()
        machines: dict[str, list[str]] = {}
        for ipu in reservation.ipu_ids:
            machines.setdefault(machine_of_ipu(ipu), []).append(ipu)
        fleet = view.fleet
        for machine, ipus in machines.items():
            if len(ipus) == fleet.machine_mask(machine)[1].bit_count():
                view.set_machine_health(machine, Health.DRAINING)
            else:
                for ipu in ipus:
                    view.set_ipu_health(ipu, Health.DRAINING)
        self._view, self._view_for = view, reservation
        return view


class CountPlanner:
    """Slurm's view: a count of free IPUs. Placements still go through V-IPU (the allocator)."""

    def __init__(self, allocator: Allocator, running: Collection[RunningJob], now: float) -> None:
        self.allocator = allocator
        self._running = running
        self._now = now
        self._free = allocator.free_ipus()
        self._started: list[tuple[float, int]] = []  # (predicted end, size) started this pass
        self._extra = 0  # IPUs the reservation leaves over at its start ("extra nodes" in EASY)
        self._extra_for: Reservation | None = None

    def free(self, machine_type: str | None) -> int:
        return self._free

    def start(self, job: QueuedJob, name: str) -> Start:
        if self._free < job.size:
            return Start(None, "room")
        placement = self.allocator.allocate(name, job.size, machine_type=job.machine_type)
        if placement is None:
            return Start(None, "launch")
        self._free -= job.size
        self._started.append((self._now + job.predicted_runtime_s, job.size))
        return Start(placement)

    def reserve(self, job: QueuedJob) -> Reservation:
        available = self._free
        start = self._now
        if available < job.size:
            ends = [(expected_end(r, self._now), r.size) for r in self._running if not r.reserved]
            ends.extend(self._started)
            ends.sort()
            for end, size in ends:
                available += size
                if available >= job.size:
                    start = end
                    break
            else:
                self._extra, self._extra_for = 0, None
                return Reservation(job.id, job.size, math.inf)
        reservation = Reservation(job.id, job.size, start)
        self._extra, self._extra_for = available - job.size, reservation
        return reservation

    def fits_now(self, job: QueuedJob) -> bool:
        return self._free >= job.size

    def backfill(self, job: QueuedJob, name: str, reservation: Reservation) -> Start:
        if self._free < job.size:
            return Start(None, "room")
        before = self._now + job.predicted_runtime_s <= reservation.start
        if not before and (self._extra_for != reservation or job.size > self._extra):
            return Start(None, "held")
        started = self.start(job, name)
        if started.placement is not None and not before:
            self._extra -= job.size
        return started
