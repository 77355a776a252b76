"""The partition allocator: live partitions, IPU health and free space of one fleet, in memory.

The scheduler owns the truth (the database). It rebuilds an ``Allocator`` from it with ``occupy`` and
asks it where new partitions go. Every decision is deterministic: the same calls in the same order
give the same placements. Nothing here scans the whole fleet on the request path. ``FreeSpace``
keeps per-pod bitmasks and per-type indexes, so ``find``, ``allocate``, ``release`` and
``largest_free`` cost about the same at 4 IPUs as at 65,536.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from vipu._bitmaps import POD_LEVELS
from vipu.free_space import FreeSpace
from vipu.machine_types import ALIGNED_TYPES
from vipu.partitions import (
    PartitionRuleError,
    check_gcds,
    check_size,
    footprint,
    partition_ipu_ids,
    validate_partition,
)
from vipu.placement_policies import PlacementPolicy, Timing, buddy_window, make_policy
from vipu.topology import (
    IPUS_PER_MACHINE,
    IPUS_PER_POD,
    MACHINES_PER_POD,
    Fleet,
    Health,
    MachineType,
)

_SEVERITY = {Health.UP: 0, Health.DRAINING: 1, Health.FAILED: 2}
_MACHINE_FIRST_IPUS = int("0001" * MACHINES_PER_POD, 2)


class PolicyError(RuntimeError):
    """A placement policy answered with IPUs that are not free or not a valid window (a policy bug)."""


class AllocationConflict(ValueError):
    """``occupy`` cannot register a partition: an IPU is already taken, or the shape breaks a rule."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a partition lives. ``ipu_ids`` are in ring order (pod by pod for multi-POD64 ones)."""

    partition_id: str
    size: int
    machine_type: MachineType
    ipu_ids: tuple[str, ...]
    pods: tuple[int, ...]
    gcds: int = 1
    spans_gw_links: bool = False
    reconfigurable: bool = False


@dataclass(frozen=True, slots=True)
class FragmentationReport:
    """How much free capacity a request of ``head_size`` cannot use right now.

    ``stranded_ipus`` are free, healthy IPUs that no placement of ``head_size`` could include (they sit
    in holes too small or too broken up). With no head request (``head_size`` None) nothing is stranded.
    """

    free_ipus: int
    head_size: int | None
    stranded_ipus: int
    stranded_share: float
    largest_free_by_type: dict[str, int]


@dataclass(frozen=True, slots=True)
class _Choice:
    machine_type: MachineType
    pods: tuple[int, ...]
    start: int
    size: int


class Allocator:
    """Carves one fleet into partitions with a pluggable placement policy."""

    def __init__(self, fleet: Fleet, policy: str | PlacementPolicy = "default") -> None:
        self.fleet = fleet
        self._policy = make_policy(policy) if isinstance(policy, str) else policy
        self._space = FreeSpace(fleet)
        # Per unit: the positions it has (a POD16 or a server has 16 of the 64, a retired unit none).
        self._capacity = [fleet.capacity_mask(pod) if fleet.has_pod(pod) else 0 for pod in range(fleet.pods)]
        self._assigned = [0] * fleet.pods  # per pod: ring positions in live partitions
        self._blocked = [0] * fleet.pods  # per pod: ring positions not up (machine or IPU)
        self._machine_health: dict[int, Health] = {}  # pod * 16 + machine -> state, only when not up
        self._ipu_health: dict[int, Health] = {}  # pod * 64 + position -> state, only when not up
        self._partitions: dict[str, Placement] = {}
        self._footprints: dict[str, tuple[tuple[int, int], ...]] = {}
        # Expected ends of the partitions placed with one, and per machine (pod * 16 + machine) that
        # holds partitions smaller than a machine: how many, and the expected ends of those told.
        self._ends: dict[str, float] = {}
        self._machine_ends: dict[int, tuple[int, tuple[float, ...]]] = {}

    @property
    def policy_name(self) -> str:
        return self._policy.name

    def clone(self) -> Allocator:
        """An independent copy (policy state included) for what-if planning."""
        twin = Allocator.__new__(Allocator)
        twin.fleet = self.fleet
        twin._policy = self._policy.clone()
        twin._space = self._space.clone()
        twin._capacity = self._capacity
        twin._assigned = self._assigned.copy()
        twin._blocked = self._blocked.copy()
        twin._machine_health = self._machine_health.copy()
        twin._ipu_health = self._ipu_health.copy()
        # Placements and footprints are immutable, so sharing them between the twins is safe.
        twin._partitions = self._partitions.copy()
        twin._footprints = self._footprints.copy()
        twin._ends = self._ends.copy()
        twin._machine_ends = self._machine_ends.copy()
        return twin

    # --- placing -------------------------------------------------------------------------------

    def observe_request(self, size: int, *, machine_type: MachineType | str | None = None) -> None:
        """Tell the policy a request of ``size`` IPUs exists (e.g. a queued job) without placing it.

        ``allocate`` already observes its own request, so call this only for requests not allocated.
        """
        check_size(size)
        self._policy.observe(size, None if machine_type is None else MachineType(machine_type))

    def find(
        self,
        size: int,
        *,
        machine_type: MachineType | str | None = None,
        expected_end: float | None = None,
        now: float | None = None,
    ) -> Placement | None:
        """Where ``allocate`` would put a partition right now (partition_id ""), or None. No side effect."""
        check_size(size)
        choice = self._choose(size, machine_type, _timing(expected_end, now))
        return None if choice is None else self._placement("", choice, gcds=1, reconfigurable=False)

    def allocate(
        self,
        partition_id: str,
        size: int,
        *,
        machine_type: MachineType | str | None = None,
        gcds: int = 1,
        reconfigurable: bool = False,
        expected_end: float | None = None,
        now: float | None = None,
    ) -> Placement | None:
        """Place and commit a new partition on healthy free IPUs; None when nothing fits now.

        ``expected_end`` (with ``now``, both in cluster seconds) is an optional hint: when the
        partition is expected to be released. The default policy uses it to put small partitions
        beside ones that will leave at about the same time, so that whole machines come free
        together. Without it, placement is exactly as without hints.
        """
        if partition_id in self._partitions:
            raise AllocationConflict(f"partition {partition_id!r} already exists")
        check_size(size)
        check_gcds(size, gcds)
        timing = _timing(expected_end, now)
        choice = self._choose(size, machine_type, timing)
        # Observed after choosing, so that allocate puts the partition exactly where find said.
        self._policy.observe(size, None if machine_type is None else MachineType(machine_type))
        if choice is None:
            return None
        placement = self._placement(partition_id, choice, gcds=gcds, reconfigurable=reconfigurable)
        self._commit(
            partition_id,
            placement,
            footprint(choice.pods, choice.start, choice.size),
            None if timing is None else timing.end,
        )
        return placement

    def occupy(
        self,
        partition_id: str,
        ipu_ids: Sequence[str],
        *,
        gcds: int = 1,
        reconfigurable: bool = False,
        expected_end: float | None = None,
    ) -> Placement:
        """Register a partition that already exists (e.g. loaded from the database).

        Its IPUs may be draining or failed: a partition that was live before its machine went down is
        still live until released. Raises ``AllocationConflict`` if the id is in use, any IPU belongs to
        another live partition, or the IPUs do not form a valid partition. ``expected_end`` is the
        same optional hint as ``allocate`` takes.
        """
        if partition_id in self._partitions:
            raise AllocationConflict(f"partition {partition_id!r} already exists")
        if expected_end is not None:
            _check_moment("expected_end", expected_end)
        try:
            shape = validate_partition(self.fleet, ipu_ids, gcds=gcds, reconfigurable=reconfigurable)
        except PartitionRuleError as error:
            raise AllocationConflict(f"partition {partition_id!r}: {error}") from error
        masks = shape.pod_masks()
        if any(self._assigned[pod] & mask for pod, mask in masks):
            raise AllocationConflict(
                f"partition {partition_id!r} overlaps live partition(s) " + ", ".join(self._owners(masks))
            )
        placement = Placement(
            partition_id=partition_id,
            size=shape.size,
            machine_type=shape.machine_type,
            ipu_ids=shape.ipu_ids,
            pods=shape.pods,
            gcds=shape.gcds,
            spans_gw_links=shape.spans_gw_links,
            reconfigurable=shape.reconfigurable,
        )
        self._commit(partition_id, placement, masks, expected_end)
        return placement

    def release(self, partition_id: str) -> None:
        """Free a partition's IPUs; unhealthy ones stay out of use until restored."""
        masks = self._footprints.pop(partition_id)  # KeyError for an unknown id
        placement = self._partitions.pop(partition_id)
        end = self._ends.pop(partition_id, None)
        if placement.size < IPUS_PER_MACHINE:
            pod, machine = _machine_of(masks)
            key = pod * MACHINES_PER_POD + machine
            count, ends = self._machine_ends.pop(key)
            if end is not None:
                kept = list(ends)
                kept.remove(end)
                ends = tuple(kept)
            if count > 1:
                self._machine_ends[key] = (count - 1, ends)
            self._space.set_release(pod, machine, _release_of(count - 1, ends))
        elif end is not None:
            for pod, machine in _machines_of(masks):
                self._space.set_release(pod, machine, None)
        for pod, mask in masks:
            self._assigned[pod] &= ~mask
            self._refresh(pod)

    def reconfigure(self, partition_id: str, gcds: int) -> Placement:
        """Re-split a reconfigurable partition into ``gcds`` compile domains; its IPUs stay put."""
        placement = self._partitions[partition_id]
        if not placement.reconfigurable:
            raise PartitionRuleError(f"partition {partition_id!r} is not reconfigurable")
        check_gcds(placement.size, gcds)
        updated = replace(placement, gcds=gcds)
        self._partitions[partition_id] = updated
        return updated

    def _choose(
        self, size: int, machine_type: MachineType | str | None, timing: Timing | None
    ) -> _Choice | None:
        kinds = self._space.kinds(None if machine_type is None else MachineType(machine_type))
        if not kinds:
            return None
        # Ring units (PODs) go through the placement policy; servers are carved buddy-style by every
        # policy. A request that names no type tries the PODs first.
        ring = tuple(kind for kind in kinds if kind not in ALIGNED_TYPES)
        level = size.bit_length() - 1
        if level < POD_LEVELS:
            window = None
            if ring:
                window = (
                    self._policy.choose_window(self._space, level, ring)
                    if timing is None
                    else self._policy.choose_timed_window(self._space, level, ring, timing)
                )
            if window is None and len(ring) < len(kinds):
                window = buddy_window(self._space, level, tuple(k for k in kinds if k in ALIGNED_TYPES))
            if window is None:
                return None
            pod, start = window
            kind = self.fleet.pod_types[pod]
            assert kind is not None, "a policy chose a retired unit"
            choice = _Choice(kind, (pod,), start, size)
        else:
            chosen = self._policy.choose_pods(self._space, size // IPUS_PER_POD, ring) if ring else None
            if chosen is None:
                return None
            kind, pods = chosen
            choice = _Choice(kind, tuple(pods), 0, size)
        self._check_choice(choice, kinds)
        return choice

    def _check_choice(self, choice: _Choice, kinds: tuple[MachineType, ...]) -> None:
        """Policies are pluggable; a wrong answer must not corrupt the books, and checking is O(pods)."""
        size, start, pods, kind = choice.size, choice.start, choice.pods, choice.machine_type
        # Windows start on their own grain: any IPU, an even IPU, a machine, or (whole pods) position 0.
        step = min(size, IPUS_PER_MACHINE) if size < IPUS_PER_POD else IPUS_PER_POD
        if kind in ALIGNED_TYPES:
            step = size
        sound = (
            kind in kinds
            and len(set(pods)) == len(pods) == max(1, size // IPUS_PER_POD)
            and all(self.fleet.has_pod(pod) and self.fleet.pod_types[pod] is kind for pod in pods)
            and (len(pods) == 1 or all(self.fleet.layout_of(pod).joins for pod in pods))
            and 0 <= start < IPUS_PER_POD
            and start % step == 0
        )
        if sound:
            sound = all(
                self._space.free_mask(pod) & mask == mask and self._capacity[pod] & mask == mask
                for pod, mask in footprint(pods, start, size)
            )
        if not sound:
            raise PolicyError(
                f"placement policy {self._policy.name!r} chose {size} IPUs at pods {pods} position {start}, "
                "which is not a free valid window of the requested type"
            )

    def _placement(self, partition_id: str, choice: _Choice, *, gcds: int, reconfigurable: bool) -> Placement:
        return Placement(
            partition_id=partition_id,
            size=choice.size,
            machine_type=choice.machine_type,
            ipu_ids=partition_ipu_ids(self.fleet, choice.pods, choice.start, choice.size),
            pods=choice.pods,
            gcds=gcds,
            spans_gw_links=len(choice.pods) > 1,
            reconfigurable=reconfigurable,
        )

    def _commit(
        self,
        partition_id: str,
        placement: Placement,
        masks: tuple[tuple[int, int], ...],
        end: float | None,
    ) -> None:
        self._partitions[partition_id] = placement
        self._footprints[partition_id] = masks
        if end is not None and placement.size < IPUS_PER_POD:
            self._ends[partition_id] = end
        if placement.size < IPUS_PER_MACHINE:
            # Partitions smaller than a machine share it; the last of them to end frees it.
            pod, machine = _machine_of(masks)
            key = pod * MACHINES_PER_POD + machine
            count, ends = self._machine_ends.get(key, (0, ()))
            if end is not None:
                ends = (*ends, end)
            self._machine_ends[key] = (count + 1, ends)
            self._space.set_release(pod, machine, _release_of(count + 1, ends))
        elif end is not None and placement.size < IPUS_PER_POD:
            # Whole machines inside a pod neighbour free runs, so their release times matter.
            # (A partition of whole pods has no neighbour in them.)
            for pod, machine in _machines_of(masks):
                self._space.set_release(pod, machine, end)
        for pod, mask in masks:
            self._assigned[pod] |= mask
            self._refresh(pod)

    def _refresh(self, pod: int) -> None:
        self._space.set_free_mask(pod, self._capacity[pod] & ~(self._assigned[pod] | self._blocked[pod]))

    # --- health --------------------------------------------------------------------------------

    def set_machine_health(self, machine_id: str, health: Health | str) -> None:
        """Drain, fail or restore a whole machine (a server is one machine of 16 IPUs). Restoring
        does not override an IPU's own state."""
        pod, groups = self.fleet.groups_of_machine(machine_id)
        state = Health(health)
        # Health is kept per group of 4 positions, the bitmaps' grain; a server sets all four.
        for group in groups:
            key = pod * MACHINES_PER_POD + group
            if state is Health.UP:
                self._machine_health.pop(key, None)
            else:
                self._machine_health[key] = state
            self._reblock_machine(pod, group)

    def set_ipu_health(self, ipu_id: str, health: Health | str) -> None:
        """Drain, fail or restore one IPU. Restoring it leaves it blocked if its machine is not up."""
        pod, machine, index = self.fleet.check_ipu(ipu_id)
        key = pod * IPUS_PER_POD + machine * IPUS_PER_MACHINE + index
        state = Health(health)
        if state is Health.UP:
            self._ipu_health.pop(key, None)
        else:
            self._ipu_health[key] = state
        self._reblock_machine(pod, machine)

    def _reblock_machine(self, pod: int, machine: int) -> None:
        first = machine * IPUS_PER_MACHINE
        bits = 0
        if pod * MACHINES_PER_POD + machine in self._machine_health:
            bits = 0b1111 << first
        else:
            for position in range(first, first + IPUS_PER_MACHINE):
                if pod * IPUS_PER_POD + position in self._ipu_health:
                    bits |= 1 << position
        self._blocked[pod] = (self._blocked[pod] & ~(0b1111 << first)) | bits
        self._refresh(pod)

    def machine_health(self, machine_id: str) -> Health:
        pod, groups = self.fleet.groups_of_machine(machine_id)
        return self._machine_health.get(pod * MACHINES_PER_POD + groups[0], Health.UP)

    def ipu_health(self, ipu_id: str) -> Health:
        """The IPU's effective health: the worse of its own state and its machine's."""
        pod, machine, index = self.fleet.check_ipu(ipu_id)
        own = self._ipu_health.get(pod * IPUS_PER_POD + machine * IPUS_PER_MACHINE + index, Health.UP)
        host = self._machine_health.get(pod * MACHINES_PER_POD + machine, Health.UP)
        return max(own, host, key=_SEVERITY.__getitem__)

    def unhealthy_machines(self) -> dict[str, Health]:
        """Machines that are draining or failed, by id."""
        return {
            self.fleet.machine_of_group(*divmod(key, MACHINES_PER_POD)): state
            for key, state in sorted(self._machine_health.items())
        }

    # --- questions -----------------------------------------------------------------------------

    def partitions(self) -> Mapping[str, Placement]:
        """A snapshot of the live partitions by id."""
        return dict(self._partitions)

    def partition(self, partition_id: str) -> Placement:
        return self._partitions[partition_id]

    def partitions_on_machine(self, machine_id: str) -> tuple[str, ...]:
        """Live partitions holding any IPU of a machine (e.g. the ones a failure interrupts)."""
        pod, bits = self.fleet.machine_mask(machine_id)
        if not self._assigned[pod] & bits:
            return ()
        return self._owners(((pod, bits),))

    def _owners(self, masks: tuple[tuple[int, int], ...]) -> tuple[str, ...]:
        """Live partitions overlapping some pod masks; scans every partition, so only off the hot path."""
        return tuple(
            sorted(
                partition_id
                for partition_id, other in self._footprints.items()
                if any(
                    pod == other_pod and mask & other_mask
                    for pod, mask in masks
                    for other_pod, other_mask in other
                )
            )
        )

    def largest_free(self, machine_type: MachineType | str | None = None) -> int:
        """The largest partition size allocatable right now (0 if none)."""
        kinds = self._space.kinds(None if machine_type is None else MachineType(machine_type))
        level = max((self._space.largest_level(kind) for kind in kinds), default=-1)
        return 0 if level < 0 else 1 << level

    def largest_free_after(
        self, partition_ids: Sequence[str], machine_type: MachineType | str | None = None
    ) -> int:
        """`largest_free` as it would be once ``partition_ids`` (unknown ids ignored) were released,
        without releasing them: what a search for partitions to preempt asks before it clones."""
        assigned: dict[int, int] = {}
        for partition_id in partition_ids:
            for pod, mask in self._footprints.get(partition_id, ()):
                assigned[pod] = assigned.get(pod, self._assigned[pod]) & ~mask
        masks = {pod: self._capacity[pod] & ~(taken | self._blocked[pod]) for pod, taken in assigned.items()}
        kinds = self._space.kinds(None if machine_type is None else MachineType(machine_type))
        level = max((self._space.largest_level_if(kind, masks) for kind in kinds), default=-1)
        return 0 if level < 0 else 1 << level

    def free_ipus(self, machine_type: MachineType | str | None = None) -> int:
        """IPUs that are healthy and in no partition."""
        kinds = self._space.kinds(None if machine_type is None else MachineType(machine_type))
        return sum(self._space.free_ipus(kind) for kind in kinds)

    def fragmentation(
        self, head_size: int | None, machine_type: MachineType | str | None = None
    ) -> FragmentationReport:
        kinds = self._space.kinds(None if machine_type is None else MachineType(machine_type))
        free = 0
        stranded = 0
        if head_size is not None:
            check_size(head_size)
        for kind in kinds:
            kind_free = self._space.free_ipus(kind)
            free += kind_free
            if head_size is None:
                continue
            level = head_size.bit_length() - 1
            if level < POD_LEVELS:
                stranded += kind_free - self._space.usable_ipus(kind, level)
            else:
                whole = self._space.whole_pods(kind).bit_count()
                fits = whole >= head_size // IPUS_PER_POD
                stranded += kind_free - (whole * IPUS_PER_POD if fits else 0)
        return FragmentationReport(
            free_ipus=free,
            head_size=head_size,
            stranded_ipus=stranded,
            stranded_share=stranded / free if free else 0.0,
            largest_free_by_type={kind.value: self.largest_free(kind) for kind in self.fleet.machine_types},
        )


def _check_moment(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of cluster seconds, not {value!r}")


def _timing(expected_end: float | None, now: float | None) -> Timing | None:
    """The optional end-time hint: both moments or neither."""
    if expected_end is None and now is None:
        return None
    if expected_end is None or now is None:
        raise ValueError("expected_end and now go together: give both or neither")
    _check_moment("expected_end", expected_end)
    _check_moment("now", now)
    return Timing(now=float(now), end=float(expected_end))


def _machines_of(masks: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """(pod, machine) of every machine a partition of whole machines holds."""
    found = []
    for pod, mask in masks:
        firsts = mask & _MACHINE_FIRST_IPUS
        while firsts:
            low = firsts & -firsts
            found.append((pod, (low.bit_length() - 1) // IPUS_PER_MACHINE))
            firsts ^= low
    return found


def _machine_of(masks: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(pod, machine) of a partition smaller than a machine."""
    pod, mask = masks[0]
    return pod, ((mask & -mask).bit_length() - 1) // IPUS_PER_MACHINE


def _release_of(count: int, ends: tuple[float, ...]) -> float | None:
    """When a machine is expected to be free of its ``count`` small partitions, of which ``ends``
    are the expected ends told: unknown unless all were."""
    return max(ends) if ends and len(ends) == count else None
