"""Placement policies: where in the fleet a new partition goes.

Every policy answers two questions against the ``FreeSpace`` index and never scans the fleet:

- ``choose_window``: a size of 1..64 IPUs (``level`` 0..6) -> ``(pod, start ring position)``;
- ``choose_pods``: ``count`` whole POD64s of one machine type -> ``(machine type, pods)``.

Every policy must find a placement whenever one exists; they differ only in which one they pick.
Policies place on PODs (ring units); servers, whose partitions are aligned blocks, are carved by
``buddy_window`` under every policy.
``first-fit`` is V-IPU's buddy-style baseline and ``best-fit`` the classic tightest-hole rule.
``default`` scores each candidate by the free IPUs it would strand for the sizes actually being
requested, and, told when a partition is expected to end, puts it beside partitions that leave at
about the same time (``choose_timed_window``; see ``DemandAware`` and docs/vipu.md).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from vipu._bitmaps import (
    ALIGNED_BIT,
    FREE_COUNT_BIT,
    FREE_PAIR_HOLE,
    FULL_RING,
    HALF_PAIR_BIT,
    HALF_PAIR_HOLE,
    HOST_BIT,
    MACHINE_LEVEL,
    PARTIAL_PAIR_BIT,
    POD_LEVELS,
    RUN_BIT,
    aligned_machine_window_starts,
    circular_runs,
    free_machines,
    free_pairs,
    half_pairs,
    machine_window_starts,
)
from vipu.free_space import FreeSpace, iter_pods, lowest_pod
from vipu.topology import IPUS_PER_MACHINE, IPUS_PER_POD, MACHINES_PER_POD, MAX_IPUS, MachineType

SIZE_LEVELS = MAX_IPUS.bit_length()  # levels 0..16: sizes 1..65,536


@dataclass(frozen=True, slots=True)
class Timing:
    """When a request is placed (``now``) and when it is expected to end (``end``), in cluster seconds."""

    now: float
    end: float


def lowest_window(free: int, level: int, *, aligned: bool) -> int | None:
    """Lowest ring position where a free window of ``2**level`` IPUs starts in one pod."""
    if level == 0:
        return (free & -free).bit_length() - 1 if free else None
    if level == 1:
        pairs = free_pairs(free)
        return (pairs & -pairs).bit_length() - 1 if pairs else None
    machines = 1 << (level - MACHINE_LEVEL)
    free_set = free_machines(free)
    starts = (
        aligned_machine_window_starts(free_set, machines)
        if aligned
        else machine_window_starts(free_set, machines)
    )
    if not starts:
        return None
    return ((starts & -starts).bit_length() - 1) * IPUS_PER_MACHINE


def lowest_pods_of_kind(
    space: FreeSpace, count: int, kinds: tuple[MachineType, ...]
) -> dict[MachineType, tuple[int, ...]]:
    """For each kind with at least ``count`` wholly free pods, its ``count`` lowest ones."""
    found: dict[MachineType, tuple[int, ...]] = {}
    for kind in kinds:
        whole = space.whole_pods(kind)
        if whole.bit_count() >= count:
            found[kind] = tuple(iter_pods(whole, count))
    return found


def buddy_window(space: FreeSpace, level: int, kinds: tuple[MachineType, ...]) -> tuple[int, int] | None:
    """Where a partition of ``2**level`` IPUs goes on servers, whatever the placement policy.

    A server is carved as ``gc-info`` acquires devices: aligned blocks of 1, 2, 4, 8 or 16 IPUs, so
    it is a buddy system, and the classic buddy rule keeps it whole longest. The server with the
    fewest free IPUs that holds a free aligned block of the size (ties: the lowest), then the
    smallest free block in it that is not half of a larger free one (ties: the lowest).
    """
    best: tuple[int, int] | None = None  # (free IPUs, pod)
    for kind in kinds:
        hosts = space.pods_with(kind, ALIGNED_BIT + level)
        if not hosts:
            continue
        for count in range(1 << level, IPUS_PER_POD + 1):
            tight = hosts & space.pods_with(kind, FREE_COUNT_BIT + count)
            if tight:
                candidate = (count, lowest_pod(tight))
                if best is None or candidate < best:
                    best = candidate
                break
    if best is None:
        return None
    pod = best[1]
    return pod, buddy_start(space.free_mask(pod), 1 << level, space.fleet.layout_of(pod).ipus)


def buddy_start(free: int, size: int, unit_ipus: int) -> int:
    """The start of the smallest maximal free aligned block of at least ``size`` IPUs."""
    block = size
    while block <= unit_ipus:
        whole = (1 << block) - 1
        for start in range(0, unit_ipus, block):
            if free >> start & whole != whole:
                continue
            parent = 2 * block
            first = start - start % parent
            if parent > unit_ipus or free >> first & ((1 << parent) - 1) != (1 << parent) - 1:
                return start
        block *= 2
    raise AssertionError("pod index out of step with its free mask")


def _union(space: FreeSpace, kinds: tuple[MachineType, ...], feature_bit: int) -> int:
    pods = 0
    for kind in kinds:
        pods |= space.pods_with(kind, feature_bit)
    return pods


class PlacementPolicy(ABC):
    """One way of choosing where a partition goes. Stateless policies share themselves on clone."""

    name: ClassVar[str]

    def observe(self, size: int, machine_type: MachineType | None = None) -> None:
        """A request was seen (allocated or queued), maybe pinned to a type; stateless policies ignore it."""
        del size, machine_type

    def clone(self) -> PlacementPolicy:
        return self

    @abstractmethod
    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        """``(pod, start)`` for a partition of ``2**level`` IPUs (level 0..6), or None if none fits."""

    def choose_timed_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...], timing: Timing
    ) -> tuple[int, int] | None:
        """``choose_window`` for a partition expected to end at ``timing.end`` (ignored by default)."""
        del timing
        return self.choose_window(space, level, kinds)

    def choose_pods(
        self, space: FreeSpace, count: int, kinds: tuple[MachineType, ...]
    ) -> tuple[MachineType, tuple[int, ...]] | None:
        """``count`` wholly free pods of one kind; by default the kind whose pods come first."""
        options = lowest_pods_of_kind(space, count, kinds)
        if not options:
            return None
        kind = min(options, key=lambda k: options[k])
        return kind, options[kind]


class FirstFit(PlacementPolicy):
    """V-IPU-like baseline: windows aligned to their size, the lowest pod and position first.

    When no aligned window is free anywhere it falls back to the lowest unaligned one, so it never
    refuses a request that fits.
    """

    name = "first-fit"

    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        for aligned, feature in ((True, ALIGNED_BIT + level), (False, HOST_BIT + level)):
            pods = _union(space, kinds, feature)
            if pods:
                pod = lowest_pod(pods)
                start = lowest_window(space.free_mask(pod), level, aligned=aligned)
                assert start is not None, "pod index out of step with its free mask"
                return pod, start
        return None


class BestFit(PlacementPolicy):
    """The pod with the fewest free IPUs that can host the size, then the smallest free hole in it.

    Holes are maximal runs of free positions on the ring for 1 and 2 IPUs, and maximal runs of free
    machines for 4 and more. Ties go to the lowest pod, then the lowest position.
    """

    name = "best-fit"

    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        hosts = _union(space, kinds, HOST_BIT + level)
        if not hosts:
            return None
        for count in range(1 << level, IPUS_PER_POD + 1):
            tight = hosts & _union(space, kinds, FREE_COUNT_BIT + count)
            if tight:
                pod = lowest_pod(tight)
                return pod, self._smallest_hole(space.free_mask(pod), level)
        raise AssertionError("a pod hosts the size but has fewer free IPUs than the size")

    @staticmethod
    def _smallest_hole(free: int, level: int) -> int:
        if level >= MACHINE_LEVEL:
            need = 1 << (level - MACHINE_LEVEL)
            runs = [run for run in circular_runs(free_machines(free), MACHINES_PER_POD) if run[1] >= need]
            start, _ = min(runs, key=lambda run: (run[1], run[0]))
            return start * IPUS_PER_MACHINE
        best: tuple[int, int] | None = None
        for start, length in circular_runs(free, IPUS_PER_POD):
            offset = 0 if level == 0 else start % 2
            if offset + (1 << level) > length:
                continue
            if best is None or length < best[0]:
                best = (length, (start + offset) % IPUS_PER_POD)
        assert best is not None, "pod index out of step with its free mask"
        return best[1]

    def choose_pods(
        self, space: FreeSpace, count: int, kinds: tuple[MachineType, ...]
    ) -> tuple[MachineType, tuple[int, ...]] | None:
        options = lowest_pods_of_kind(space, count, kinds)
        if not options:
            return None
        kind = min(options, key=lambda k: (space.whole_pods(k).bit_count(), options[k]))
        return kind, options[kind]


def _covered(free_units: int, window: int) -> int:
    """Units of a free run (or of a set of free pods) that some window of ``window`` units covers."""
    return free_units if free_units >= window else 0


class DemandAware(PlacementPolicy):
    """Fragmentation-aware default: keep the fleet able to host the sizes that are being requested.

    For a request of size ``s``, a free IPU is *stranded* when no free ``s``-window covers it (the
    figure ``Allocator.fragmentation`` reports). A candidate placement costs the IPUs it newly strands,
    summed over sizes, each size weighted by its share of recent requests that could land on that
    machine type, plus a small floor so that a size not seen lately still counts for something. So
    the cost is the expected rise in stranded IPUs for the next request. The policy takes the
    cheapest candidate, then the lowest pod.

    The size mix is learned as exponentially decayed histograms over sizes 1..65,536, one for
    requests that name no machine type and one per named type. ``allocate`` and ``observe_request``
    each add one request. A request pinned to a type weighs on that type's capacity. An unpinned one
    weighs on the fleet as a whole, so a scarce, much-demanded type costs more to use. The mix decides
    real trade-offs. Cutting a machine off a run of 2 free machines kills an 8-window. Cutting one
    off a run of 5 keeps the 8-window but shrinks the 16-windows' cover, so which is cheaper depends
    on whether 8s or 16s are being asked for.

    One placement changes only one pod, so the candidates fall into few classes:

    - 1 IPU into a half-used pair: strands nothing new;
    - 1 or 2 IPUs into a free pair of a machine already in use: strands the pair's twin (for size 1);
    - whole machines cut from the end of a run of ``n`` free machines: costs what that run loses for
      every machine-sized window, plus, when the run is a whole free POD64, what the machine type
      loses for multi-POD64 partitions.

    Cutting from a run's end is never worse than cutting from its middle, for every size at once, so
    a class's cost depends on ``n`` alone. The lowest pod of each class is then the only candidate
    worth scoring: at most 19 per machine type, each O(1).

    Told when a request is expected to end (``Allocator.allocate(..., expected_end=, now=)``), it
    also packs in time: see ``choose_timed_window``. A machine is only whole again when the last
    of its partitions leaves, so partitions that leave together free whole machines and runs.
    """

    name = "default"
    DECAY = 0.995  # per observed request: the mix's half-life is about 140 requests
    FLOOR = 1e-3  # weight every size keeps, so unseen sizes are still preferred whole
    # Temporal packing (see ``choose_timed_window``): costs per unit of log-time mismatch.
    LATE = 1.0
    EARLY = 0.1
    UNTIMED = 0.5  # a hole whose machine's release time nobody told us
    NEIGHBOUR_PODS = 4  # pods with the cheapest class of run whose ends are weighed by time
    NEIGHBOUR_UNTIMED = 3.0  # a neighbour with no known release: as bad as a 20-fold mismatch

    def __init__(self) -> None:
        self._untyped = [0.0] * SIZE_LEVELS
        self._typed: dict[MachineType, list[float]] = {}
        self._increment = 1.0

    def clone(self) -> DemandAware:
        twin = DemandAware()
        twin._untyped = self._untyped.copy()
        twin._typed = {kind: counts.copy() for kind, counts in self._typed.items()}
        twin._increment = self._increment
        return twin

    def observe(self, size: int, machine_type: MachineType | None = None) -> None:
        counts = (
            self._untyped
            if machine_type is None
            else self._typed.setdefault(machine_type, [0.0] * SIZE_LEVELS)
        )
        # Growing the increment instead of decaying every bucket keeps observe O(1).
        counts[size.bit_length() - 1] += self._increment
        self._increment /= self.DECAY
        if self._increment > 1e100:
            self._untyped = [count / self._increment for count in self._untyped]
            self._typed = {
                kind: [count / self._increment for count in counts] for kind, counts in self._typed.items()
            }
            self._increment = 1.0

    def weights(self, kind: MachineType, capacity_share: float) -> list[float]:
        """Per size level: the demand that can land on ``kind``, per unit of the fleet's capacity.

        A request pinned to ``kind`` competes only for that type's ``capacity_share`` of the fleet,
        so it weighs ``1 / capacity_share`` times as much as an unpinned one.
        """
        total = sum(self._untyped) + sum(sum(counts) for counts in self._typed.values())
        if total == 0:
            return [self.FLOOR] * SIZE_LEVELS
        typed = self._typed.get(kind)
        if typed is None:
            return [count / total + self.FLOOR for count in self._untyped]
        return [
            (untyped + pinned / capacity_share) / total + self.FLOOR
            for untyped, pinned in zip(self._untyped, typed, strict=True)
        ]

    @staticmethod
    def _run_loss(weights: list[float], run: int, taken: int) -> float:
        """Weighted IPUs stranded for machine-sized windows when ``taken`` machines leave a run.

        A whole free ring (16) minus some machines is a linear run, and a window of 16 machines fits
        the ring only while it is whole, so the same count works for both.
        """
        left = run - taken
        loss = 0.0
        for level in range(MACHINE_LEVEL, POD_LEVELS):
            machines = 1 << (level - MACHINE_LEVEL)
            loss += weights[level] * (_covered(run, machines) - _covered(left, machines)) * IPUS_PER_MACHINE
        return loss

    @staticmethod
    def _whole_pod_loss(weights: list[float], whole: int, taken: int) -> float:
        """Weighted IPUs stranded for multi-POD64 sizes when ``taken`` of ``whole`` free pods go."""
        loss = 0.0
        for level in range(POD_LEVELS, SIZE_LEVELS):
            pods = 1 << (level - POD_LEVELS + 1)
            loss += weights[level] * (_covered(whole, pods) - _covered(whole - taken, pods)) * IPUS_PER_POD
        return loss

    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        best = self._cheapest(space, level, kinds)
        if best is None:
            return None
        _, pod, klass, _ = best
        return pod, self._start_in(space.free_mask(pod), klass)

    def _cheapest(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[float, int, int, MachineType] | None:
        """The cheapest candidate class as (cost, its lowest pod, class, machine type), or None.

        Class -2 is a half-used pair, -1 a free pair of a machine in use, n a run of n free machines.
        """
        taken = 1 if level < MACHINE_LEVEL else 1 << (level - MACHINE_LEVEL)
        best: tuple[float, int, int, MachineType] | None = None
        for kind in kinds:
            weights = self.weights(kind, space.capacity_share(kind))
            pair_loss = 2 * weights[1] if level == 0 else 0.0
            options: list[tuple[float, int, int]] = []
            if level == 0:
                options.append((0.0, -2, space.pods_with(kind, HALF_PAIR_BIT)))
            if level <= 1:
                options.append((pair_loss, -1, space.pods_with(kind, PARTIAL_PAIR_BIT)))
            for run in range(taken, MACHINES_PER_POD + 1):
                pods = space.pods_with(kind, RUN_BIT + run)
                if pods:
                    cost = pair_loss + self._run_loss(weights, run, taken)
                    if run == MACHINES_PER_POD:
                        cost += self._whole_pod_loss(weights, space.whole_pods(kind).bit_count(), 1)
                    options.append((cost, run, pods))
            for cost, klass, pods in options:
                if pods:
                    candidate = (cost, lowest_pod(pods), klass, kind)
                    if best is None or candidate[:3] < best[:3]:
                        best = candidate
        return best

    @staticmethod
    def _start_in(free: int, klass: int) -> int:
        """Where in the pod a candidate class puts the partition."""
        if klass == -2:
            halves = half_pairs(free)
            lone = free & (halves | halves << 1)
            return (lone & -lone).bit_length() - 1
        if klass == -1:
            machines = free_machines(free)
            pairs = free_pairs(free)
            for machine in range(MACHINES_PER_POD):
                if machines >> machine & 1:
                    pairs &= ~(0b101 << (machine * IPUS_PER_MACHINE))
            return (pairs & -pairs).bit_length() - 1
        machines = free_machines(free)
        if machines == FULL_RING:
            return 0
        for start, length in circular_runs(machines, MACHINES_PER_POD):
            if length == klass:
                return start * IPUS_PER_MACHINE
        raise AssertionError("pod index out of step with its free mask")

    def choose_timed_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...], timing: Timing
    ) -> tuple[int, int] | None:
        """Temporal packing: put the partition beside partitions expected to leave when it does, so
        that they free contiguous space together.

        - 1 and 2 IPUs go into a hole (a free IPU or pair of a machine in use), as untimed: a hole
          never costs a whole machine. But the hole is the one whose machine's other partitions
          end nearest after this one: outliving them costs ``LATE`` per unit of log-time (the
          machine stays broken longer), ending first ``EARLY`` (its IPU idles in a busy machine),
          ``UNTIMED`` when one of them was placed without a hint, plus the pair's twin as untimed
          when a 1 splits a free pair. The release-time index finds the two nearest machines of
          each class by binary search. Only when there is no hole at all does a machine get
          broken into, by the untimed rule.
        - 4 to 32 IPUs go into the cheapest class of free run, as untimed, so they strand no more
          than the untimed choice. Among the lowest ``NEIGHBOUR_PODS`` pods with such a run, they
          take the run end whose busy neighbour machine is expected to leave nearest in log-time.
        - Whole POD64s are placed as untimed: their neighbours are whole POD64s, joined by GW-Links
          at any distance.
        """
        if level >= MACHINE_LEVEL:
            return self._timed_run_window(space, level, kinds, timing)
        ends_in = _log_horizon(timing.end, timing.now)
        # (cost, machine key, hole class)
        best: tuple[float, int, int] | None = None
        for kind in kinds:
            pair_loss = 2 * self.weights(kind, space.capacity_share(kind))[1] if level == 0 else 0.0
            for hole_class in (HALF_PAIR_HOLE, FREE_PAIR_HOLE) if level == 0 else (FREE_PAIR_HOLE,):
                base = 0.0 if hole_class == HALF_PAIR_HOLE else pair_loss
                before, after, untimed = space.holes_around(kind, hole_class, timing.end)
                candidates: list[tuple[float, int, int]] = []
                for found in (before, after):
                    if found is not None:
                        release, key = found
                        mismatch = self._mismatch(ends_in, _log_horizon(release, timing.now))
                        candidates.append((base + mismatch, key, hole_class))
                if untimed is not None:
                    candidates.append((base + self.UNTIMED, untimed, hole_class))
                for candidate in candidates:
                    if best is None or candidate < best:
                        best = candidate
        if best is None:
            # No holes at all: a machine must be broken into, and the untimed rule picks which.
            return self.choose_window(space, level, kinds)
        _, key, hole_class = best
        pod, machine = divmod(key, MACHINES_PER_POD)
        nibble = space.free_mask(pod) >> (machine * IPUS_PER_MACHINE) & 0b1111
        if hole_class == HALF_PAIR_HOLE:
            halves = (nibble ^ (nibble >> 1)) & 0b0101
            slots = nibble & (halves | halves << 1)
        else:
            slots = nibble & (nibble >> 1) & 0b0101
        return pod, machine * IPUS_PER_MACHINE + (slots & -slots).bit_length() - 1

    def _timed_run_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...], timing: Timing
    ) -> tuple[int, int] | None:
        best = self._cheapest(space, level, kinds)
        if best is None:
            return None
        _, first_pod, klass, kind = best
        if klass == MACHINES_PER_POD:  # a whole free ring: no busy neighbour to match
            return first_pod, self._start_in(space.free_mask(first_pod), klass)
        taken = 1 << (level - MACHINE_LEVEL)
        ends_in = _log_horizon(timing.end, timing.now)
        # (mismatch, order, pod, first machine): order keeps the untimed choice first among equals.
        chosen: tuple[float, int, int, int] | None = None
        order = 0
        for pod in iter_pods(space.pods_with(kind, RUN_BIT + klass), self.NEIGHBOUR_PODS):
            for start, length in circular_runs(free_machines(space.free_mask(pod)), MACHINES_PER_POD):
                if length != klass:
                    continue
                after = (start + length) % MACHINES_PER_POD
                before = (start - 1) % MACHINES_PER_POD
                ends: tuple[tuple[int, tuple[int, ...]], ...] = (
                    ((start, (before, after)),)
                    if length == taken
                    else ((start, (before,)), ((after - taken) % MACHINES_PER_POD, (after,)))
                )
                for first, neighbours in ends:
                    mismatch = min(
                        self._neighbour_mismatch(space.release(pod, machine), ends_in, timing.now)
                        for machine in neighbours
                    )
                    candidate = (mismatch, order, pod, first)
                    order += 1
                    if chosen is None or candidate < chosen:
                        chosen = candidate
        assert chosen is not None, "pod index out of step with its free mask"
        return chosen[2], chosen[3] * IPUS_PER_MACHINE

    @classmethod
    def _neighbour_mismatch(cls, release: float | None, ends_in: float, now: float) -> float:
        if release is None:
            return cls.NEIGHBOUR_UNTIMED
        return abs(ends_in - _log_horizon(release, now))

    @classmethod
    def _mismatch(cls, ends_in: float, released_in: float) -> float:
        """What sharing a machine costs a job that ends ``ends_in`` (log seconds) from now with jobs
        that leave it ``released_in`` from now: outliving them keeps the machine from being whole
        again, the costlier way; ending first leaves its IPU idle in a busy machine."""
        if ends_in > released_in:
            return cls.LATE * (ends_in - released_in)
        return cls.EARLY * (released_in - ends_in)

    def choose_pods(
        self, space: FreeSpace, count: int, kinds: tuple[MachineType, ...]
    ) -> tuple[MachineType, tuple[int, ...]] | None:
        options = lowest_pods_of_kind(space, count, kinds)
        if not options:
            return None

        def cost(kind: MachineType) -> tuple[float, tuple[int, ...]]:
            weights = self.weights(kind, space.capacity_share(kind))
            whole = space.whole_pods(kind).bit_count()
            # The pods taken are lost to 64-IPU requests too, not only to multi-POD64 ones.
            single = weights[POD_LEVELS - 1] * count * IPUS_PER_POD
            return single + self._whole_pod_loss(weights, whole, count), options[kind]

        kind = min(options, key=cost)
        return kind, options[kind]


def _log_horizon(moment: float, now: float) -> float:
    """log of the seconds from ``now`` to ``moment``, from one second up (a job past its
    expected end is expected to end any moment)."""
    return math.log(max(moment - now, 1.0))


_POLICIES: dict[str, type[PlacementPolicy]] = {
    policy.name: policy for policy in (DemandAware, FirstFit, BestFit)
}


def available_policies() -> tuple[str, ...]:
    return tuple(_POLICIES)


def make_policy(name: str) -> PlacementPolicy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; available: {', '.join(available_policies())}"
        ) from None
