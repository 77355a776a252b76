"""The fleet's free space, indexed so that no placement question scans the whole fleet.

Per pod we keep one 64-bit mask of IPUs that are healthy and unassigned. Its summary is a set of
feature bits (see ``vipu._bitmaps``): "a free 8-window exists", "a run of exactly 5 free machines
exists", "exactly 37 IPUs are free", and so on. For every machine type and every feature bit we keep
one int used as a bitmask over pod indices. A change to one pod flips only the bits whose feature
changed, and a question like "lowest m2000 pod that can host 16" is one mask lookup plus a lowest-bit
trick. Totals (free IPUs and usable IPUs per size) are kept per machine type the same way, so the
fragmentation figures are O(1) too.

Holes (free IPUs of machines partly in use) are also indexed per machine, by the time the machine
is expected to be wholly free again when the allocator was told (its *release* time), so that "the
machine with a half-used pair whose release comes soonest after t" is a binary search.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TypeVar

from vipu._bitmaps import (
    FEATURE_BITS,
    HOLE_CLASSES,
    HOST_BIT,
    MACHINE_HOLES,
    POD_LEVELS,
    RUN_BIT,
    PodSummary,
    changed_machines,
    summarize,
)
from vipu.machine_types import ALIGNED_TYPES
from vipu.topology import IPUS_PER_MACHINE, MACHINES_PER_POD, Fleet, MachineType


def lowest_pod(pods: int) -> int:
    """Index of the lowest set bit (pods must be non-zero)."""
    return (pods & -pods).bit_length() - 1


def iter_pods(pods: int, limit: int | None = None) -> list[int]:
    """Set bit indices in ascending order, at most ``limit`` of them."""
    found: list[int] = []
    while pods and (limit is None or len(found) < limit):
        low = pods & -pods
        found.append(low.bit_length() - 1)
        pods ^= low
    return found


_Sortable = TypeVar("_Sortable", int, tuple[float, int])


class _TypeIndex:
    __slots__ = ("by_feature", "free", "pods", "timed_holes", "untimed_holes", "usable")

    def __init__(self, pods: int, by_feature: list[int], free: int, usable: list[int]) -> None:
        self.pods = pods
        self.by_feature = by_feature
        self.free = free
        self.usable = usable
        # Per hole class, machines (pod * 16 + machine) with such holes: sorted (release, machine)
        # pairs for those with a known release time, sorted machines for the rest.
        self.timed_holes: list[list[tuple[float, int]]] = [[] for _ in range(HOLE_CLASSES)]
        self.untimed_holes: list[list[int]] = [[] for _ in range(HOLE_CLASSES)]

    def copy(self) -> _TypeIndex:
        twin = _TypeIndex(self.pods, self.by_feature.copy(), self.free, self.usable.copy())
        twin.timed_holes = [machines.copy() for machines in self.timed_holes]
        twin.untimed_holes = [machines.copy() for machines in self.untimed_holes]
        return twin


def _discard(ordered: list[_Sortable], item: _Sortable) -> None:
    at = bisect_left(ordered, item)
    # Deleting whatever sits there would corrupt the index silently; a miss is a bug to surface.
    if at == len(ordered) or ordered[at] != item:
        raise AssertionError(f"hole index out of step: {item!r} is not indexed")
    del ordered[at]


class FreeSpace:
    """Free-IPU masks of every pod plus per machine type indexes over them.

    Every unit is a "pod" here: a POD16 or a server has only its first 16 positions, the others are
    never free. A retired unit belongs to no type and is never indexed.
    """

    __slots__ = ("_aligned", "_free", "_index", "_ipus", "_release", "_summary", "fleet")

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._aligned = [kind in ALIGNED_TYPES for kind in fleet.pod_types]
        self._free = [fleet.capacity_mask(pod) if fleet.has_pod(pod) else 0 for pod in range(fleet.pods)]
        # Kept beside the masks (not re-derived) so an update never depends on the memo still holding it.
        self._summary = [
            summarize(mask, aligned) for mask, aligned in zip(self._free, self._aligned, strict=True)
        ]
        # pod * 16 + machine -> when the machine is expected to be wholly free, where known.
        self._release: dict[int, float] = {}
        self._index: dict[MachineType, _TypeIndex] = {}
        self._ipus: dict[MachineType, int] = {}
        for kind in fleet.machine_types:
            # Units of a type share few empty shapes (a POD64, a POD16, a server): index each shape once.
            shapes: dict[PodSummary, int] = {}
            for pod in fleet.pods_of_type(kind):
                summary = self._summary[pod]
                shapes[summary] = shapes.get(summary, 0) | 1 << pod
            pods = 0
            by_feature = [0] * FEATURE_BITS
            usable = [0] * POD_LEVELS
            free = 0
            for summary, members in shapes.items():
                pods |= members
                count = members.bit_count()
                for bit in range(FEATURE_BITS):
                    if summary.features >> bit & 1:
                        by_feature[bit] |= members
                usable = [have + count * more for have, more in zip(usable, summary.usable, strict=True)]
                free += count * summary.free
            self._index[kind] = _TypeIndex(pods.bit_count(), by_feature, free, usable)
            self._ipus[kind] = free

    def clone(self) -> FreeSpace:
        twin = FreeSpace.__new__(FreeSpace)
        twin.fleet = self.fleet
        twin._aligned = self._aligned
        twin._ipus = self._ipus
        twin._free = self._free.copy()
        twin._summary = self._summary.copy()
        twin._release = self._release.copy()
        twin._index = {kind: index.copy() for kind, index in self._index.items()}
        return twin

    def free_mask(self, pod: int) -> int:
        return self._free[pod]

    def set_free_mask(self, pod: int, mask: int) -> None:
        """Record pod's new free mask and update every index that depends on it."""
        old_mask = self._free[pod]
        if mask == old_mask:
            return
        old = self._summary[pod]
        new = summarize(mask, self._aligned[pod])
        self._free[pod] = mask
        self._summary[pod] = new
        kind = self.fleet.pod_types[pod]
        assert kind is not None, "a retired unit has no free space"
        index = self._index[kind]
        bit = 1 << pod
        changed = old.features ^ new.features
        by_feature = index.by_feature
        while changed:
            low = changed & -changed
            by_feature[low.bit_length() - 1] ^= bit
            changed ^= low
        index.free += new.free - old.free
        usable = index.usable
        for level in range(POD_LEVELS):
            usable[level] += new.usable[level] - old.usable[level]
        machines = changed_machines(old_mask, mask)
        while machines:
            low = machines & -machines
            machines ^= low
            machine = low.bit_length() - 1
            shift = machine * IPUS_PER_MACHINE
            before = MACHINE_HOLES[old_mask >> shift & 0b1111]
            after = MACHINE_HOLES[mask >> shift & 0b1111]
            if before != after:
                key = pod * MACHINES_PER_POD + machine
                release = self._release.get(key)
                self._unindex_holes(index, key, before, release)
                self._index_holes(index, key, after, release)

    def set_release(self, pod: int, machine: int, release: float | None) -> None:
        """Record when a machine is expected to be wholly free again (None: unknown)."""
        key = pod * MACHINES_PER_POD + machine
        old = self._release.get(key)
        if old == release:
            return
        if release is None:
            del self._release[key]
        else:
            self._release[key] = release
        holes = MACHINE_HOLES[self._free[pod] >> (machine * IPUS_PER_MACHINE) & 0b1111]
        kind = self.fleet.pod_types[pod]
        if holes and kind is not None:
            index = self._index[kind]
            self._unindex_holes(index, key, holes, old)
            self._index_holes(index, key, holes, release)

    def holes(self, kind: MachineType, hole_class: int) -> tuple[list[tuple[float, int]], list[int]]:
        """The index of one hole class, for checks: sorted (release, machine key) pairs of machines
        with a known release time, and the sorted keys of the others."""
        index = self._index[kind]
        return index.timed_holes[hole_class].copy(), index.untimed_holes[hole_class].copy()

    def release(self, pod: int, machine: int) -> float | None:
        """When the machine is expected to be free of its partitions, if the allocator was told."""
        return self._release.get(pod * MACHINES_PER_POD + machine)

    @staticmethod
    def _index_holes(index: _TypeIndex, key: int, holes: int, release: float | None) -> None:
        for hole_class in range(HOLE_CLASSES):
            if holes >> hole_class & 1:
                if release is None:
                    insort(index.untimed_holes[hole_class], key)
                else:
                    insort(index.timed_holes[hole_class], (release, key))

    @staticmethod
    def _unindex_holes(index: _TypeIndex, key: int, holes: int, release: float | None) -> None:
        for hole_class in range(HOLE_CLASSES):
            if holes >> hole_class & 1:
                if release is None:
                    _discard(index.untimed_holes[hole_class], key)
                else:
                    _discard(index.timed_holes[hole_class], (release, key))

    def holes_around(
        self, kind: MachineType, hole_class: int, end: float
    ) -> tuple[tuple[float, int] | None, tuple[float, int] | None, int | None]:
        """Machines of ``kind`` with holes of ``hole_class`` nearest in release time to ``end``.

        Returns (the latest release before ``end``, the earliest at or after it), each as
        ``(release, pod * 16 + machine)``, and the lowest such machine whose release is unknown.
        """
        index = self._index[kind]
        timed = index.timed_holes[hole_class]
        at = bisect_left(timed, (end, -1))
        untimed = index.untimed_holes[hole_class]
        return (
            timed[at - 1] if at else None,
            timed[at] if at < len(timed) else None,
            untimed[0] if untimed else None,
        )

    def capacity_share(self, kind: MachineType) -> float:
        """The share of the fleet's IPUs that are of ``kind``."""
        return self._ipus[kind] / self.fleet.ipus

    def kinds(self, machine_type: MachineType | None) -> tuple[MachineType, ...]:
        """The machine types a request may use, restricted to the ones this fleet has."""
        if machine_type is None:
            return tuple(self._index)
        return (machine_type,) if machine_type in self._index else ()

    def pods_with(self, kind: MachineType, feature_bit: int) -> int:
        """Bitmask of pods of ``kind`` that have a feature bit set."""
        return self._index[kind].by_feature[feature_bit]

    def hosts(self, kind: MachineType, level: int) -> int:
        """Pods of ``kind`` with a free window of size ``2**level`` (level 0..6)."""
        return self._index[kind].by_feature[HOST_BIT + level]

    def whole_pods(self, kind: MachineType) -> int:
        """Pods of ``kind`` that are entirely free and healthy."""
        return self._index[kind].by_feature[RUN_BIT + MACHINES_PER_POD]

    def free_ipus(self, kind: MachineType) -> int:
        return self._index[kind].free

    def usable_ipus(self, kind: MachineType, level: int) -> int:
        """Free IPUs of ``kind`` covered by at least one free window of size ``2**level`` (0..6)."""
        return self._index[kind].usable[level]

    def largest_level_if(self, kind: MachineType, masks: dict[int, int]) -> int:
        """`largest_level` as it would be were the pods in ``masks`` free as given there (their new
        free masks): a what-if without a clone. Nothing changes."""
        index = self._index[kind]
        by_feature = index.by_feature
        whole_bit = RUN_BIT + MACHINES_PER_POD
        changed = 0
        features: dict[int, int] = {}
        for pod, mask in masks.items():
            if self.fleet.pod_types[pod] is kind:
                changed |= 1 << pod
                features[pod] = summarize(mask, self._aligned[pod]).features

        def pods_with(bit: int) -> int:
            pods = by_feature[bit] & ~changed
            for pod, have in features.items():
                if have >> bit & 1:
                    pods |= 1 << pod
            return pods

        whole = pods_with(whole_bit).bit_count()
        if whole >= 2:
            return POD_LEVELS - 1 + whole.bit_length() - 1
        for level in range(POD_LEVELS - 1, -1, -1):
            if pods_with(HOST_BIT + level):
                return level
        return -1

    def largest_level(self, kind: MachineType) -> int:
        """Largest level (log2 size) allocatable in ``kind``, -1 when nothing is free."""
        whole = self.whole_pods(kind).bit_count()
        if whole >= 2:
            return POD_LEVELS - 1 + whole.bit_length() - 1
        for level in range(POD_LEVELS - 1, -1, -1):
            if self.hosts(kind, level):
                return level
        return -1
