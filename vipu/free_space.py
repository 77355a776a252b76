"""The fleet's free space, indexed so that no placement question scans the whole fleet.

Per pod we keep one 64-bit mask of IPUs that are healthy and unassigned. Its summary is a set of
feature bits (see ``vipu._bitmaps``): "a free 8-window exists", "a run of exactly 5 free machines
exists", "exactly 37 IPUs are free", and so on. For every machine type and every feature bit we keep
one int used as a bitmask over pod indices. A change to one pod flips only the bits whose feature
changed, and a question like "lowest m2000 pod that can host 16" is one mask lookup plus a lowest-bit
trick. Totals (free IPUs and usable IPUs per size) are kept per machine type the same way, so the
fragmentation figures are O(1) too.
"""

from __future__ import annotations

from vipu._bitmaps import (
    FEATURE_BITS,
    FULL_POD,
    HOST_BIT,
    POD_LEVELS,
    RUN_BIT,
    summarize,
)
from vipu.topology import IPUS_PER_POD, MACHINES_PER_POD, Fleet, MachineType


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


class _TypeIndex:
    __slots__ = ("by_feature", "free", "pods", "usable")

    def __init__(self, pods: int, by_feature: list[int], free: int, usable: list[int]) -> None:
        self.pods = pods
        self.by_feature = by_feature
        self.free = free
        self.usable = usable

    def copy(self) -> _TypeIndex:
        return _TypeIndex(self.pods, self.by_feature.copy(), self.free, self.usable.copy())


class FreeSpace:
    """Free-IPU masks of every pod plus per machine type indexes over them."""

    __slots__ = ("_free", "_index", "_summary", "fleet")

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        empty = summarize(FULL_POD)
        self._free = [FULL_POD] * fleet.pods
        # Kept beside the masks (not re-derived) so an update never depends on the memo still holding it.
        self._summary = [empty] * fleet.pods
        self._index: dict[MachineType, _TypeIndex] = {}
        for kind in fleet.machine_types:
            pods = 0
            for pod in fleet.pods_of_type(kind):
                pods |= 1 << pod
            count = pods.bit_count()
            by_feature = [0] * FEATURE_BITS
            for bit in range(FEATURE_BITS):
                if empty.features >> bit & 1:
                    by_feature[bit] = pods
            usable = [count * ipus for ipus in empty.usable]
            self._index[kind] = _TypeIndex(count, by_feature, count * IPUS_PER_POD, usable)

    def clone(self) -> FreeSpace:
        twin = FreeSpace.__new__(FreeSpace)
        twin.fleet = self.fleet
        twin._free = self._free.copy()
        twin._summary = self._summary.copy()
        twin._index = {kind: index.copy() for kind, index in self._index.items()}
        return twin

    def free_mask(self, pod: int) -> int:
        return self._free[pod]

    def set_free_mask(self, pod: int, mask: int) -> None:
        """Record pod's new free mask and update every index that depends on it."""
        if mask == self._free[pod]:
            return
        old = self._summary[pod]
        new = summarize(mask)
        self._free[pod] = mask
        self._summary[pod] = new
        index = self._index[self.fleet.pod_types[pod]]
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

    def capacity_share(self, kind: MachineType) -> float:
        """The share of the fleet's IPUs that are of ``kind``."""
        return self._index[kind].pods / self.fleet.pods

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

    def largest_level(self, kind: MachineType) -> int:
        """Largest level (log2 size) allocatable in ``kind``, -1 when nothing is free."""
        whole = self.whole_pods(kind).bit_count()
        if whole >= 2:
            return POD_LEVELS - 1 + whole.bit_length() - 1
        for level in range(POD_LEVELS - 1, -1, -1):
            if self.hosts(kind, level):
                return level
        return -1
