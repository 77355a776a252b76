"""Partition rules: which sets of IPUs may form a V-IPU partition, checked in one place.

A partition's size is a power of two from 1 to 65,536, and its IPUs are all of one machine type.

- Size 1 is any single IPU.
- Size 2 is an aligned pair of one machine: IPUs {0, 1} or {2, 3}. Both pairs are IPU-Link neighbours
  on the ring. The middle pair {1, 2} is adjacent too, but taking it leaves IPUs 0 and 3 as two lone
  IPUs that can never pair again. With aligned pairs every machine splits like a buddy block: a released
  pair always rejoins its twin into a whole machine, and the allocator checks for a free pair with one
  mask test.
- Sizes 4 to 64 are ``size / 4`` whole machines that are neighbours on the POD64's ring. A window may wrap
  past machine 15 to machine 0, and it need not start at a multiple of its size.
- Sizes above 64 are ``size / 64`` whole POD64s of one machine type, joined by GW-Links. Any POD64s of
  the fleet may be joined: the GW-Links go through the gateways' IPU-Fabric, not a fixed ring.
- An IPU-POD16 is 4 machines in a line: sizes 4 to 16 are adjacent machines that do not wrap, and
  nothing is larger than the POD16.
- An IPU server (C2 cards) takes sizes 1, 2, 4, 8 and 16 as ``gc-info`` lists its devices: an
  aligned block of IPUs (a pair is one card; 4 starts at IPU 0, 4, 8 or 12; 8 at 0 or 8). A partition
  never spans two servers: nothing links them.

A partition holds ``gcds`` graph compile domains of ``size / gcds`` IPUs each, so ``gcds`` is a power
of two no larger than the size. A reconfigurable partition lets its owner split it again later.
New partitions take only healthy IPUs. A draining or failed IPU keeps its existing partitions, but
it gets no new ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from vipu._bitmaps import FULL_POD, FULL_RING, circular_runs, window_mask
from vipu.topology import (
    IPUS_PER_MACHINE,
    IPUS_PER_POD,
    MACHINES_PER_POD,
    MAX_IPUS,
    Fleet,
    Health,
    MachineType,
    machine_id,
    pod_id,
    pod_ipu_ids,
)

HealthSource = Mapping[str, Health] | Callable[[str], Health]


class PartitionRuleError(ValueError):
    """A set of IPUs that cannot form a partition; the message says which rule it breaks."""


@dataclass(frozen=True, slots=True)
class PartitionShape:
    """A validated partition: its IPUs in canonical ring order plus the facts derived from them."""

    size: int
    machine_type: MachineType
    pods: tuple[int, ...]
    start: int  # ring position of the first IPU within the first pod (0 for whole-pod partitions)
    ipu_ids: tuple[str, ...]
    gcds: int
    gcd_size: int
    reconfigurable: bool

    @property
    def spans_gw_links(self) -> bool:
        return len(self.pods) > 1

    def pod_masks(self) -> tuple[tuple[int, int], ...]:
        """``(pod, 64-bit ring mask)`` for every pod the partition touches."""
        return footprint(self.pods, self.start, self.size)


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_size(size: int) -> None:
    """Reject sizes no partition can have."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise PartitionRuleError(f"partition size must be an integer, got {size!r}")
    if not is_power_of_two(size) or size > MAX_IPUS:
        raise PartitionRuleError(f"partition size must be a power of two from 1 to {MAX_IPUS}, got {size}")


def check_gcds(size: int, gcds: int) -> int:
    """Return the GCD size, or explain why ``gcds`` cannot split ``size``."""
    if isinstance(gcds, bool) or not isinstance(gcds, int):
        raise PartitionRuleError(f"gcds must be an integer, got {gcds!r}")
    if gcds < 1:
        raise PartitionRuleError(f"a partition holds at least one GCD, got gcds={gcds}")
    if size % gcds or not is_power_of_two(size // gcds):
        raise PartitionRuleError(
            f"gcds={gcds} does not split {size} IPUs into equal power-of-two compile domains"
        )
    return size // gcds


def footprint(pods: tuple[int, ...], start: int, size: int) -> tuple[tuple[int, int], ...]:
    """``(pod, 64-bit ring mask)`` per pod of a partition: a window of one pod, or whole pods."""
    if size >= IPUS_PER_POD:
        return tuple((pod, FULL_POD) for pod in pods)
    return ((pods[0], window_mask(start, size)),)


def partition_ipu_ids(fleet: Fleet, pods: tuple[int, ...], start: int, size: int) -> tuple[str, ...]:
    """IPU ids of a partition in ring order, pod by pod."""
    if size >= IPUS_PER_POD:
        return pods_ipu_ids(pods)
    return window_ipu_ids(fleet, pods[0], start, size)


def window_ipu_ids(fleet: Fleet, pod: int, start: int, size: int) -> tuple[str, ...]:
    """IPU ids of a window inside one unit in ring order, e.g. machines 15, 0 for a wrapping 8."""
    ring = pod_ipu_ids(pod) if fleet.layout_of(pod).ipus == IPUS_PER_POD else fleet.unit_ipu_ids(pod)
    end = start + size
    if end <= IPUS_PER_POD:
        return ring[start:end]
    return ring[start:] + ring[: end - IPUS_PER_POD]


def pods_ipu_ids(pods: Iterable[int]) -> tuple[str, ...]:
    ids: list[str] = []
    for pod in pods:
        ids.extend(pod_ipu_ids(pod))
    return tuple(ids)


def _lookup_health(health: HealthSource, key: str) -> Health:
    if callable(health):
        return Health(health(key))
    return Health(health.get(key, Health.UP))


def _window_start(fleet: Fleet, pod: int, mask: int, size: int) -> int:
    """The ring position where a single-unit window starts, or a rule error when it is not a window."""
    ring = fleet.unit_ipu_ids(pod)
    layout = fleet.layout_of(pod)
    if size > layout.ipus:
        raise PartitionRuleError(
            f"a partition of {size} IPUs does not fit in {fleet.unit_id(pod)}, a {layout.label} of "
            f"{layout.ipus} IPUs"
        )
    if size == 1:
        return mask.bit_length() - 1
    if size == 2:
        low = (mask & -mask).bit_length() - 1
        if mask != 0b11 << low or low % 2:
            held = [ring[p] for p in range(layout.ipus) if mask >> p & 1]
            pair = "IPUs 0+1 or 2+3 of one machine" if not layout.aligned else "the two IPUs of one C2 card"
            raise PartitionRuleError(f"a 2-IPU partition is {pair}, got {' and '.join(held)}")
        return low
    if layout.aligned:
        low = (mask & -mask).bit_length() - 1
        if mask != ((1 << size) - 1) << low or low % size:
            raise PartitionRuleError(
                f"a {size}-IPU partition of {fleet.unit_id(pod)} is an aligned block of IPUs, as gc-info "
                f"lists them: IPUs {size}k .. {size}k+{size - 1}; got "
                + ", ".join(ring[p] for p in range(layout.ipus) if mask >> p & 1)
            )
        return low
    machines = 0
    for machine in range(MACHINES_PER_POD):
        taken = (mask >> (machine * IPUS_PER_MACHINE)) & 0b1111
        if taken == 0b1111:
            machines |= 1 << machine
        elif taken:
            raise PartitionRuleError(
                f"a {size}-IPU partition takes whole machines, but it holds only some IPUs of "
                f"{machine_id(pod, machine)}"
            )
    if machines == FULL_RING:
        return 0
    runs = circular_runs(machines, MACHINES_PER_POD)
    if len(runs) != 1:
        where = "one POD64's IPU-Link ring" if layout.wraps else f"the line of IPU-Links of a {layout.label}"
        raise PartitionRuleError(
            f"a {size}-IPU partition is {size // IPUS_PER_MACHINE} adjacent machines of {where}, but "
            f"the machines of {pod_id(pod)} it holds are not contiguous"
        )
    return runs[0][0] * IPUS_PER_MACHINE


def validate_partition(
    fleet: Fleet,
    ipu_ids: Iterable[str],
    *,
    gcds: int = 1,
    reconfigurable: bool = False,
    health: HealthSource | None = None,
) -> PartitionShape:
    """Check every partition rule for a proposed set of IPUs (any order) and return its shape.

    ``health`` maps an IPU id or machine id to its health (missing keys are up), or is a callable
    that takes an IPU id. An IPU counts as healthy only when both it and its machine are up. Pass
    ``None`` to skip the health rule, e.g. for a partition that already exists.
    """
    ids = list(ipu_ids)
    if not ids:
        raise PartitionRuleError("a partition holds at least one IPU")
    size = len(ids)
    if len(set(ids)) != size:
        repeated = sorted(ipu for ipu, seen in Counter(ids).items() if seen > 1)
        raise PartitionRuleError(f"IPUs listed more than once: {', '.join(repeated)}")
    check_size(size)
    gcd_size = check_gcds(size, gcds)

    masks: dict[int, int] = {}
    for ipu in ids:
        try:
            pod, machine, index = fleet.check_ipu(ipu)
        except ValueError as error:
            raise PartitionRuleError(str(error)) from None
        masks[pod] = masks.get(pod, 0) | 1 << (machine * IPUS_PER_MACHINE + index)

    kinds = {fleet.machine_type_of(pod) for pod in masks}
    if len(kinds) > 1:
        raise PartitionRuleError(
            "a partition's IPUs are all of one machine type, got "
            + " and ".join(sorted(kind.value for kind in kinds))
        )
    machine_type = kinds.pop()

    pods = tuple(sorted(masks))
    if size <= IPUS_PER_POD:
        if len(pods) > 1:
            layout = fleet.layout_of(pods[0])
            where = "one POD64" if layout.joins else f"one {layout.label}: nothing links two of them"
            raise PartitionRuleError(
                f"a partition of {size} IPUs lives inside {where}, but these IPUs span "
                + ", ".join(fleet.unit_id(pod) for pod in pods)
            )
        start = _window_start(fleet, pods[0], masks[pods[0]], size)
        ordered = window_ipu_ids(fleet, pods[0], start, size)
    else:
        lone = [pod for pod in pods if not fleet.layout_of(pod).joins]
        if lone:
            raise PartitionRuleError(
                f"a partition above {IPUS_PER_POD} IPUs joins whole POD64s over GW-Links; "
                + ", ".join(f"{fleet.unit_id(pod)} ({fleet.layout_of(pod).label})" for pod in lone)
                + " cannot be joined"
            )
        partial = [pod for pod in pods if masks[pod] != FULL_POD]
        if partial:
            raise PartitionRuleError(
                f"a partition above {IPUS_PER_POD} IPUs takes whole POD64s, but it holds only part of "
                + ", ".join(pod_id(pod) for pod in partial)
            )
        start = 0
        ordered = pods_ipu_ids(pods)

    if health is not None:
        unhealthy = []
        for ipu in ordered:
            state = _lookup_health(health, ipu)
            if state is Health.UP and not callable(health):
                state = _lookup_health(health, ipu.rsplit("-", 1)[0])
            if state is not Health.UP:
                unhealthy.append(f"{ipu} ({state.value})")
        if unhealthy:
            raise PartitionRuleError(
                "a new partition takes only healthy IPUs; not up: " + ", ".join(unhealthy)
            )

    return PartitionShape(
        size=size,
        machine_type=machine_type,
        pods=pods,
        start=start,
        ipu_ids=ordered,
        gcds=gcds,
        gcd_size=gcd_size,
        reconfigurable=reconfigurable,
    )
