"""Placement policies: where in the fleet a new partition goes.

Every policy answers two questions against the ``FreeSpace`` index and never scans the fleet:

- ``choose_window``: a size of 1..64 IPUs (``level`` 0..6) -> ``(pod, start ring position)``;
- ``choose_pods``: ``count`` whole POD64s of one machine type -> ``(machine type, pods)``.

Every policy must find a placement whenever one exists; they differ only in which one they pick.
``first-fit`` is V-IPU's buddy-style baseline, ``best-fit`` the classic tightest-hole rule, and
``default`` scores each candidate by how much of the fleet's ability to host the sizes actually being
requested it would destroy (see ``DemandAware`` and docs/vipu.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from vipu._bitmaps import (
    ALIGNED_BIT,
    FULL_RING,
    HALF_PAIR_BIT,
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


def lowest_pods_of_kind(space: FreeSpace, count: int, kinds: tuple[MachineType, ...]) -> dict[
    MachineType, tuple[int, ...]
]:
    """For each kind with at least ``count`` wholly free pods, its ``count`` lowest ones."""
    found: dict[MachineType, tuple[int, ...]] = {}
    for kind in kinds:
        whole = space.whole_pods(kind)
        if whole.bit_count() >= count:
            found[kind] = tuple(iter_pods(whole, count))
    return found


def _union(space: FreeSpace, kinds: tuple[MachineType, ...], feature_bit: int) -> int:
    pods = 0
    for kind in kinds:
        pods |= space.pods_with(kind, feature_bit)
    return pods


class PlacementPolicy(ABC):
    """One way of choosing where a partition goes. Stateless policies share themselves on clone."""

    name: ClassVar[str]

    def observe(self, size: int) -> None:
        """A request of ``size`` IPUs was seen (allocated or queued); stateless policies ignore it."""
        del size

    def clone(self) -> PlacementPolicy:
        return self

    @abstractmethod
    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        """``(pod, start)`` for a partition of ``2**level`` IPUs (level 0..6), or None if none fits."""

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
        for aligned, feature in ((True, ALIGNED_BIT + level), (False, level)):
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
        hosts = _union(space, kinds, level)
        if not hosts:
            return None
        for count in range(1 << level, IPUS_PER_POD + 1):
            tight = hosts & _union_free_count(space, kinds, count)
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


def _union_free_count(space: FreeSpace, kinds: tuple[MachineType, ...], count: int) -> int:
    pods = 0
    for kind in kinds:
        pods |= space.pods_with_free_count(kind, count)
    return pods


def _packed_machines(run: int, machines: int) -> int:
    """Windows of ``machines`` that fit side by side in a linear run, counted in machines."""
    return run // machines * machines


class DemandAware(PlacementPolicy):
    """Fragmentation-aware default: keep the fleet able to host the sizes that are being requested.

    It learns the size mix as an exponentially decayed histogram over sizes 1..65,536 (every
    ``allocate`` and ``observe_request`` adds one). The fleet's "hosting capacity" for a size ``s`` is
    how many IPUs of free space can be packed with disjoint ``s``-windows. A candidate placement costs
    the drop in that capacity, summed over sizes and weighted by each size's share of the requests
    (plus a small floor, so that unseen sizes still break ties toward keeping big blocks whole). It
    takes the candidate with the lowest cost, then the lowest pod.

    Candidates come in few classes because one placement only changes one pod's structure:

    - 1 IPU into a half-used pair: costs nothing beyond the IPU itself;
    - 1 or 2 IPUs into a free pair of a machine already in use: costs one pair (for size 1);
    - whole machines cut from the end of a run of ``n`` free machines: costs what that run loses for
      every machine-sized window, plus, when the run is a whole free POD64, what the fleet loses for
      multi-POD64 partitions.

    Cutting from a run's end is never worse than cutting from its middle, for every size at once,
    so the cost of a class is a function of ``n`` alone. The lowest pod of each class is therefore
    the only candidate worth scoring: at most 19 candidates per machine type, each O(1).
    """

    name = "default"
    DECAY = 0.995  # per observed request: the mix's half-life is about 140 requests
    FLOOR = 1e-3  # weight every size keeps, so unseen sizes are still preferred whole

    def __init__(self) -> None:
        self._counts = [0.0] * SIZE_LEVELS
        self._increment = 1.0

    def clone(self) -> DemandAware:
        twin = DemandAware()
        twin._counts = self._counts.copy()
        twin._increment = self._increment
        return twin

    def observe(self, size: int) -> None:
        # Growing the increment instead of decaying every bucket keeps observe O(1).
        self._counts[size.bit_length() - 1] += self._increment
        self._increment /= self.DECAY
        if self._increment > 1e100:
            self._counts = [count / self._increment for count in self._counts]
            self._increment = 1.0

    def weights(self) -> list[float]:
        """Each size level's share of recent requests, plus the floor."""
        total = sum(self._counts)
        if total == 0:
            return [self.FLOOR] * SIZE_LEVELS
        return [count / total + self.FLOOR for count in self._counts]

    @staticmethod
    def _run_loss(weights: list[float], run: int, taken: int) -> float:
        """Weighted IPU capacity lost for machine-sized windows when ``taken`` machines leave a run."""
        left = run - taken  # a whole ring minus some machines is a linear run
        loss = 0.0
        for level in range(MACHINE_LEVEL, POD_LEVELS):
            machines = 1 << (level - MACHINE_LEVEL)
            before = MACHINES_PER_POD if run == MACHINES_PER_POD else _packed_machines(run, machines)
            loss += weights[level] * (before - _packed_machines(left, machines)) * IPUS_PER_MACHINE
        return loss

    @staticmethod
    def _whole_pod_loss(weights: list[float], whole: int, taken: int) -> float:
        """Weighted capacity lost for multi-POD64 sizes when ``taken`` of ``whole`` free pods go."""
        loss = 0.0
        for level in range(POD_LEVELS, SIZE_LEVELS):
            pods = 1 << (level - POD_LEVELS + 1)
            loss += weights[level] * ((whole // pods - (whole - taken) // pods) * pods * IPUS_PER_POD)
        return loss

    def choose_window(
        self, space: FreeSpace, level: int, kinds: tuple[MachineType, ...]
    ) -> tuple[int, int] | None:
        weights = self.weights()
        pair_loss = 2 * weights[1] if level == 0 else 0.0
        taken = 1 if level < MACHINE_LEVEL else 1 << (level - MACHINE_LEVEL)
        best: tuple[float, int, int] | None = None  # (cost, pod, class: -2 half, -1 partial, n run)

        def consider(cost: float, pods: int, klass: int) -> None:
            nonlocal best
            if pods:
                candidate = (cost, lowest_pod(pods), klass)
                if best is None or candidate < best:
                    best = candidate

        for kind in kinds:
            if level == 0:
                consider(0.0, space.pods_with(kind, HALF_PAIR_BIT), -2)
            if level <= 1:
                consider(pair_loss, space.pods_with(kind, PARTIAL_PAIR_BIT), -1)
            whole_loss = self._whole_pod_loss(weights, space.whole_pods(kind).bit_count(), 1)
            for run in range(taken, MACHINES_PER_POD + 1):
                pods = space.pods_with(kind, RUN_BIT + run)
                if pods:
                    cost = pair_loss + self._run_loss(weights, run, taken)
                    if run == MACHINES_PER_POD:
                        cost += whole_loss
                    consider(cost, pods, run)
        if best is None:
            return None
        _, pod, klass = best
        free = space.free_mask(pod)
        if klass == -2:
            halves = half_pairs(free)
            lone = free & (halves | halves << 1)
            return pod, (lone & -lone).bit_length() - 1
        if klass == -1:
            machines = free_machines(free)
            pairs = free_pairs(free)
            for machine in range(MACHINES_PER_POD):
                if machines >> machine & 1:
                    pairs &= ~(0b101 << (machine * IPUS_PER_MACHINE))
            return pod, (pairs & -pairs).bit_length() - 1
        machines = free_machines(free)
        if machines == FULL_RING:
            return pod, 0
        for start, length in circular_runs(machines, MACHINES_PER_POD):
            if length == klass:
                return pod, start * IPUS_PER_MACHINE
        raise AssertionError("pod index out of step with its free mask")

    def choose_pods(
        self, space: FreeSpace, count: int, kinds: tuple[MachineType, ...]
    ) -> tuple[MachineType, tuple[int, ...]] | None:
        options = lowest_pods_of_kind(space, count, kinds)
        if not options:
            return None
        weights = self.weights()

        def cost(kind: MachineType) -> tuple[float, tuple[int, ...]]:
            # Every kind loses the same single-POD64 capacity, so only multi-POD64 losses differ.
            whole = space.whole_pods(kind).bit_count()
            return self._whole_pod_loss(weights, whole, count), options[kind]

        kind = min(options, key=cost)
        return kind, options[kind]


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
