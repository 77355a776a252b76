"""When will a partition of N IPUs be free, if every running job ends when predicted?

This is the reservation question of backfill. Asking the allocator directly means cloning it and
releasing running partitions one by one until ``find`` succeeds, which costs a fleet index update per
release: too slow at thousands of passes with hundreds of running jobs. A `TimeTable` instead knows,
per POD64, which partition holds which IPUs and which job frees them, so it can say for every IPU
when it is free (now, a running job's predicted end, or never) and scan the shapes V-IPU allows
(``vipu.partitions``): any IPU for 1, an aligned pair for 2, a run of whole machines on the ring for
4 to 64 (an aligned block on a server; a POD16's positions past its 16 are never free), whole POD64s
above. The earliest shape wins; ties go to the lowest pod, then the lowest ring position.

The simulator keeps one time table up to date as jobs start and end; the live loop builds one from
the allocator when a pass needs a reservation. Health set on single IPUs (rather than machines) is
not visible through the allocator's public questions, so when the free-IPU count of a table
disagrees with the allocator's, `Inconsistent` tells the caller to replay releases on a clone.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from functools import lru_cache

from scheduler.policy.running import RunningJob
from vipu.allocator import Allocator, Placement
from vipu.machine_types import ALIGNED_TYPES
from vipu.partitions import footprint, partition_ipu_ids, pods_ipu_ids
from vipu.topology import (
    IPUS_PER_MACHINE,
    IPUS_PER_POD,
    MACHINES_PER_POD,
    Fleet,
    MachineType,
    parse_ipu_id,
)

FULL_POD = (1 << IPUS_PER_POD) - 1
INF = math.inf

_Cover = tuple[tuple[int, ...], tuple[int, ...]]  # ring positions and machines a partition covers
Window = tuple[float, tuple[str, ...]]  # when, and which IPUs


@lru_cache(maxsize=1 << 16)
def _footprint(first_ipu: str, size: int, pods: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    if size >= IPUS_PER_POD:
        return footprint(pods, 0, size)
    pod, machine, ipu = parse_ipu_id(first_ipu)
    return footprint((pod,), machine * IPUS_PER_MACHINE + ipu, size)


def placement_masks(placement: Placement) -> tuple[tuple[int, int], ...]:
    """``(pod, 64-bit ring mask)`` for each pod the partition covers."""
    return _footprint(placement.ipu_ids[0], placement.size, placement.pods)


def expected_end(job: RunningJob, now: float) -> float:
    """When a running job should end. One that has outrun its estimate gets the estimate doubled
    until it lies in the future (as Tsafrir, Etsion and Feitelson 2007 do for predictions)."""
    end = job.expected_end
    if end > now:
        return end
    span = max(end - job.started_at, 1.0)
    while job.started_at + span <= now:
        span *= 2.0
    return job.started_at + span


class Inconsistent(Exception):
    """The allocator holds IPUs back that the time table does not know of (single-IPU health)."""


class TimeTable:
    """Live partitions per POD64, each with the running job that frees it (None: never freed)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._assigned = [0] * fleet.pods
        # Positions a unit does not have never come free (a POD16 or a server has 16 of the 64).
        self._blocked = [
            FULL_POD & ~fleet.capacity_mask(pod) if fleet.has_pod(pod) else FULL_POD
            for pod in range(fleet.pods)
        ]
        # Per pod: partition -> (IPU ring positions, machines) it covers there.
        self._by_pod: list[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = [
            {} for _ in range(fleet.pods)
        ]
        self._masks: dict[str, tuple[tuple[int, int], ...]] = {}
        self._jobs: dict[str, RunningJob | None] = {}
        self._version = 0
        # The last answer, reusable while nothing was added or removed and no time in it went by.
        self._cached: (
            tuple[tuple[int, int, str | None], float, tuple[float, tuple[str, ...]] | None] | None
        ) = None

    @classmethod
    def from_allocator(
        cls, allocator: Allocator, running: Collection[RunningJob], skip: Collection[str] = ()
    ) -> TimeTable:
        """The allocator's live partitions (but ``skip``), freed by the running jobs in them."""
        table = cls(allocator.fleet)
        freed_by = {r.partition: r for r in running if not r.reserved}
        for name, placement in allocator.partitions().items():
            if name not in skip:
                table.add(name, placement, freed_by.get(name))
        for machine_id in allocator.unhealthy_machines():
            pod, mask = allocator.fleet.machine_mask(machine_id)
            table._blocked[pod] |= mask
        return table

    def add(self, name: str, placement: Placement, job: RunningJob | None) -> None:
        masks = placement_masks(placement)
        self._masks[name] = masks
        self._jobs[name] = job
        for pod, mask in masks:
            self._assigned[pod] |= mask
            self._by_pod[pod][name] = _cover(mask)
        self._version += 1

    def remove(self, name: str) -> None:
        for pod, mask in self._masks.pop(name):
            self._assigned[pod] &= ~mask
            del self._by_pod[pod][name]
        del self._jobs[name]
        self._version += 1

    def earliest(
        self,
        size: int,
        machine_type: str | None,
        now: float,
        *,
        also: Collection[tuple[float, Placement]] = (),
        allocator_free: int | None = None,
    ) -> tuple[float, tuple[str, ...]] | None:
        """The earliest time (>= now) a partition of ``size`` fits, and its IPUs; None if never.

        ``also`` are partitions placed since the table was last updated, with their predicted ends.
        ``allocator_free``, the allocator's free IPUs of the type, checks that the table is complete.
        """
        key = (self._version, size, machine_type)
        cached = self._cached
        if not also and cached is not None and cached[0] == key and now < cached[1]:
            return cached[2]
        fleet = self.fleet
        kinds = [k for k in fleet.machine_types if machine_type is None or k is MachineType(machine_type)]
        pods = [pod for kind in kinds for pod in fleet.pods_of_type(kind)]
        extra: dict[int, list[tuple[float, int]]] = {}
        free_total = 0
        for end, placement in also:
            for pod, mask in placement_masks(placement):
                extra.setdefault(pod, []).append((end, mask))
        by_ipu = size < IPUS_PER_MACHINE
        rows: dict[int, list[float]] = {}
        horizon = INF  # the earliest time any value in the rows would change
        for pod in pods:
            blocked = self._blocked[pod]
            assigned = self._assigned[pod]
            for _, mask in extra.get(pod, ()):
                assigned |= mask
            free = FULL_POD & ~(assigned | blocked)
            free_total += free.bit_count()
            row = _base_row(free, by_ipu, now)
            for name, (positions, machines) in self._by_pod[pod].items():
                job = self._jobs[name]
                if job is None:
                    for slot in positions if by_ipu else machines:
                        row[slot] = INF
                    continue
                end = job.expected_end
                if end <= now:
                    end = expected_end(job, now)
                if end < horizon:
                    horizon = end
                for slot in positions if by_ipu else machines:
                    if row[slot] < end:
                        row[slot] = end
            for end, mask in extra.get(pod, ()):
                positions, machines = _cover(mask)
                for slot in positions if by_ipu else machines:
                    if row[slot] < end:
                        row[slot] = end
            if blocked:
                positions, machines = _cover(blocked)
                for slot in positions if by_ipu else machines:
                    row[slot] = INF
            rows[pod] = row
        if allocator_free is not None and free_total != allocator_free:
            raise Inconsistent()
        found = self._scan(rows, kinds, size, now, by_ipu)
        if not also and (found is None or found[0] > now):
            self._cached = (key, horizon, found)
        return found

    def _scan(
        self, rows: dict[int, list[float]], kinds: list[MachineType], size: int, now: float, by_ipu: bool
    ) -> tuple[float, tuple[str, ...]] | None:
        if not rows:
            return None
        if size > IPUS_PER_POD:
            joined = {pod: row for pod, row in rows.items() if self.fleet.layout_of(pod).joins}
            return _whole_pods(self.fleet.pod_types, kinds, joined, size, now)
        best: tuple[float, int, int] | None = None
        for pod, row in rows.items():
            aligned = self.fleet.pod_types[pod] in ALIGNED_TYPES
            at, start = _in_pod(row, size) if by_ipu else _in_ring(row, size // IPUS_PER_MACHINE, aligned)
            if best is None or (at, pod, start) < best:
                best = (at, pod, start)
        if best is None or best[0] == INF:
            return None
        at, pod, start = best
        return max(at, now), partition_ipu_ids(self.fleet, (pod,), start, size)


@lru_cache(maxsize=1 << 14)
def _cover(mask: int) -> _Cover:
    """The ring positions a mask covers, and the machines those positions belong to."""
    positions = tuple(p for p in range(IPUS_PER_POD) if mask >> p & 1)
    return positions, tuple(sorted({p // IPUS_PER_MACHINE for p in positions}))


def _base_row(free: int, by_ipu: bool, now: float) -> list[float]:
    """``now`` where everything is free, else minus infinity (raised by the partitions there, or
    to infinity by a partition nobody frees)."""
    if by_ipu:
        return [now if free >> p & 1 else -INF for p in range(IPUS_PER_POD)]
    return [now if (free >> (4 * m)) & 0b1111 == 0b1111 else -INF for m in range(MACHINES_PER_POD)]


def _in_pod(times: list[float], size: int) -> tuple[float, int]:
    """Earliest (time, start position) of 1 IPU or an aligned pair, from per-IPU times."""
    if size == 1:
        at = min(times)
        return at, times.index(at)
    pairs = [max(times[p], times[p + 1]) for p in range(0, IPUS_PER_POD, 2)]
    at = min(pairs)
    return at, 2 * pairs.index(at)


def _in_ring(machines: list[float], count: int, aligned: bool = False) -> tuple[float, int]:
    """Earliest (time, start position) of ``count`` adjacent machines, from per-machine times
    (``aligned``: only starts at multiples of ``count``, a server's blocks)."""
    if count == MACHINES_PER_POD:
        return max(machines), 0
    ring = machines + machines
    best_at, best_start = INF, 0
    for start in range(0, MACHINES_PER_POD, count if aligned else 1):
        at = max(ring[start : start + count])
        if at < best_at:
            best_at, best_start = at, start
    return best_at, best_start * IPUS_PER_MACHINE


def _whole_pods(
    pod_types: tuple[MachineType | None, ...],
    kinds: list[MachineType],
    times: dict[int, list[float]],
    size: int,
    now: float,
) -> tuple[float, tuple[str, ...]] | None:
    count = size // IPUS_PER_POD
    best: tuple[float, tuple[int, ...]] | None = None
    for kind in kinds:
        ready = sorted((max(times[pod]), pod) for pod in times if pod_types[pod] is kind)
        if len(ready) < count:
            continue
        chosen = ready[:count]
        at = chosen[-1][0]
        pods = tuple(sorted(pod for _, pod in chosen))
        if at < INF and (best is None or (at, pods) < best):
            best = (at, pods)
    if best is None:
        return None
    return max(best[0], now), pods_ipu_ids(best[1])
