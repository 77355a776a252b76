"""A brute-force statement of the partition rules for small fleets, written without the library's
bit tricks, to check the allocator's answers against.

The rules, per unit layout: any IPU; an aligned pair; 4 and more IPUs as adjacent groups of four
(a POD's machines) that wrap around a POD64's ring, stay in line in a POD16, and are aligned
blocks on a server; above 64, whole POD64s of one type (nothing else joins)."""

from __future__ import annotations

from collections.abc import Iterator

from vipu.topology import Fleet, MachineType

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def all_windows(fleet: Fleet, size: int) -> Iterator[tuple[MachineType, frozenset[str]]]:
    """Every set of IPUs that forms a valid partition of ``size``, regardless of state."""
    if size > 64:
        return  # multi-pod windows are too many to list; callers use whole units instead
    for pod in range(fleet.pods):
        if not fleet.has_pod(pod):
            continue
        kind = fleet.machine_type_of(pod)
        layout = fleet.layout_of(pod)
        ids = fleet.unit_ipu_ids(pod)
        if size > layout.ipus:
            continue
        if size == 1:
            for ipu in ids:
                yield kind, frozenset({ipu})
        elif size == 2:
            for first in range(0, layout.ipus, 2):
                yield kind, frozenset(ids[first : first + 2])
        else:
            groups = layout.ipus // 4
            count = size // 4
            if layout.aligned:
                starts = list(range(0, groups, count))
            elif layout.wraps:
                starts = [0] if count == groups else list(range(groups))
            else:
                starts = list(range(groups - count + 1))
            for start in starts:
                yield (
                    kind,
                    frozenset(
                        ids[((start + step) % groups) * 4 + ipu] for step in range(count) for ipu in range(4)
                    ),
                )


def whole_pod_ipus(fleet: Fleet, pod: int) -> frozenset[str]:
    return frozenset(fleet.unit_ipu_ids(pod))


def placements(
    fleet: Fleet, free: set[str], size: int, machine_type: MachineType | None
) -> list[frozenset[str]]:
    """Every placement of ``size`` on free IPUs; for multi-pod sizes, one union per usable pod."""
    kinds = [machine_type] if machine_type is not None else list(MachineType)
    found: list[frozenset[str]] = []
    if size <= 64:
        for kind, ipus in all_windows(fleet, size):
            if kind in kinds and ipus <= free:
                found.append(ipus)
        return found
    for kind in kinds:
        whole = [
            pod
            for pod in range(fleet.pods)
            if fleet.has_pod(pod)
            and fleet.machine_type_of(pod) is kind
            and fleet.layout_of(pod).joins
            and whole_pod_ipus(fleet, pod) <= free
        ]
        if len(whole) >= size // 64:
            # Any whole free pod of this kind can be part of some placement.
            found.extend(whole_pod_ipus(fleet, pod) for pod in whole)
    return found


def fits(fleet: Fleet, free: set[str], size: int, machine_type: MachineType | None) -> bool:
    return bool(placements(fleet, free, size, machine_type))


def largest(fleet: Fleet, free: set[str], machine_type: MachineType | None) -> int:
    best = 0
    for size in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if size // 64 <= fleet.pods and fits(fleet, free, size, machine_type):
            best = size
    return best


def stranded(fleet: Fleet, free: set[str], size: int, machine_type: MachineType | None) -> int:
    kinds = [machine_type] if machine_type is not None else list(MachineType)
    of_kind = {ipu for ipu in free if fleet.machine_type_of_ipu(ipu) in kinds}
    covered: set[str] = set()
    for ipus in placements(fleet, free, size, machine_type):
        covered |= ipus
    return len(of_kind - covered)
