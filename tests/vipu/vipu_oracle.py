"""A brute-force statement of the partition rules for small fleets, written without the library's
bit tricks, to check the allocator's answers against."""

from __future__ import annotations

from collections.abc import Iterator

from vipu.topology import Fleet, MachineType, ipu_id

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def all_windows(fleet: Fleet, size: int) -> Iterator[tuple[MachineType, frozenset[str]]]:
    """Every set of IPUs that forms a valid partition of ``size``, regardless of state."""
    if size <= 64:
        for pod in range(fleet.pods):
            kind = fleet.pod_types[pod]
            if size == 1:
                for machine in range(16):
                    for ipu in range(4):
                        yield kind, frozenset({ipu_id(pod, machine, ipu)})
            elif size == 2:
                for machine in range(16):
                    for first in (0, 2):
                        yield kind, frozenset({ipu_id(pod, machine, first), ipu_id(pod, machine, first + 1)})
            else:
                machines = size // 4
                starts = [0] if machines == 16 else range(16)
                for start in starts:
                    yield kind, frozenset(
                        ipu_id(pod, (start + step) % 16, ipu) for step in range(machines) for ipu in range(4)
                    )
    # Multi-pod windows are too many to list; callers use whole_pod_fit instead.


def whole_pod_ipus(pod: int) -> frozenset[str]:
    return frozenset(ipu_id(pod, machine, ipu) for machine in range(16) for ipu in range(4))


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
            pod for pod in range(fleet.pods) if fleet.pod_types[pod] is kind and whole_pod_ipus(pod) <= free
        ]
        if len(whole) >= size // 64:
            # Any whole free pod of this kind can be part of some placement.
            found.extend(whole_pod_ipus(pod) for pod in whole)
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
