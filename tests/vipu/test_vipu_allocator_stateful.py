"""Random allocate / release / occupy / fail / drain / restore sequences on small mixed fleets (POD64s,
POD16s and C2 servers), for every policy, checked against a brute-force enumeration of the partition
rules: aligned blocks on servers, never across servers, failed IPUs never handed out."""

from __future__ import annotations

import unittest
from collections import defaultdict

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from vipu_oracle import SIZES, all_windows, fits, largest, stranded

from vipu._bitmaps import HOLE_CLASSES, MACHINE_HOLES
from vipu.allocator import AllocationConflict, Allocator, Placement
from vipu.partitions import validate_partition
from vipu.placement_policies import available_policies
from vipu.topology import Fleet, Health, MachineType, Unit, parse_ipu_id

KINDS = (None, *MachineType)
UNITS = [("m2000", "pod64"), ("bow", "pod64"), ("m2000", "pod16"), ("bow", "pod16"), ("c2", "server")]
STATES = (Health.UP, Health.DRAINING, Health.FAILED)
# How long a partition is expected to run, when the caller says: often nothing, often a tie.
RUNTIMES = st.none() | st.sampled_from([10.0, 100.0, 1000.0]) | st.floats(0.0, 1e6)


class AllocatorMachine(RuleBasedStateMachine):
    policy: str

    def __init__(self) -> None:
        super().__init__()
        self.allocator: Allocator
        self.fleet: Fleet
        self.live: dict[str, frozenset[str]] = {}
        self.ends: dict[str, float] = {}  # expected ends of the partitions placed with one
        self.clock = 0.0
        self.machine_health: dict[str, Health] = {}
        self.ipu_health: dict[str, Health] = {}
        self.serial = 0

    @initialize(units=st.lists(st.sampled_from(UNITS), min_size=1, max_size=3))
    def build(self, units: list[tuple[str, str]]) -> None:
        self.fleet = Fleet(
            [Unit(MachineType(kind), layout, rack) for rack, (kind, layout) in enumerate(units)]
        )
        self.allocator = Allocator(self.fleet, self.policy)

    # --- the model -----------------------------------------------------------------------------

    def healthy(self, ipu: str) -> bool:
        machine = ipu.rsplit("-", 1)[0]
        return self.machine_health.get(machine, Health.UP) is Health.UP and (
            self.ipu_health.get(ipu, Health.UP) is Health.UP
        )

    def taken(self) -> set[str]:
        return set().union(*self.live.values()) if self.live else set()

    def free(self) -> set[str]:
        taken = self.taken()
        return {ipu for ipu in self.fleet.ipu_ids() if ipu not in taken and self.healthy(ipu)}

    def health_map(self) -> dict[str, Health]:
        return {**self.machine_health, **self.ipu_health}

    def new_id(self) -> str:
        self.serial += 1
        return f"p{self.serial}"

    def check_new_placement(self, placement: Placement, size: int, kind: MachineType | None) -> None:
        shape = validate_partition(self.fleet, placement.ipu_ids, health=self.health_map())
        assert shape.ipu_ids == placement.ipu_ids, "placement IPUs are not in ring order"
        assert placement.size == size == len(placement.ipu_ids)
        assert kind is None or placement.machine_type is kind
        assert placement.pods == shape.pods
        assert placement.spans_gw_links == (len(shape.pods) > 1)
        assert not set(placement.ipu_ids) & self.taken(), "handed out an IPU that is in use"

    # --- rules ---------------------------------------------------------------------------------

    @rule(
        size=st.sampled_from(SIZES),
        kind=st.sampled_from(KINDS),
        gcds=st.sampled_from([1, 2]),
        runtime=RUNTIMES,
        elapsed=st.sampled_from([0.0, 1.0, 50.0]),
    )
    def allocate(
        self, size: int, kind: MachineType | None, gcds: int, runtime: float | None, elapsed: float
    ) -> None:
        gcds = min(gcds, size)
        self.clock += elapsed
        hint = {} if runtime is None else {"expected_end": self.clock + runtime, "now": self.clock}
        expected = fits(self.fleet, self.free(), size, kind)
        found = self.allocator.find(size, machine_type=kind, **hint)
        placement = self.allocator.allocate(self.new_id(), size, machine_type=kind, gcds=gcds, **hint)
        if not expected:
            assert found is None and placement is None
            return
        assert placement is not None, f"refused {size} ({kind}) while a valid placement exists"
        assert found is not None and found.ipu_ids == placement.ipu_ids
        self.check_new_placement(placement, size, kind)
        assert placement.gcds == gcds
        self.live[placement.partition_id] = frozenset(placement.ipu_ids)
        if runtime is not None:
            self.ends[placement.partition_id] = self.clock + runtime

    @rule(size=st.sampled_from(SIZES))
    def observe(self, size: int) -> None:
        self.allocator.observe_request(size)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        partition_id = data.draw(st.sampled_from(sorted(self.live)))
        self.allocator.release(partition_id)
        del self.live[partition_id]
        self.ends.pop(partition_id, None)

    @rule(data=st.data(), size=st.sampled_from([1, 2, 4, 8, 16, 64]), runtime=RUNTIMES)
    def occupy_existing(self, data: st.DataObject, size: int, runtime: float | None) -> None:
        """Register a partition as if loaded from the database, on any machines, healthy or not."""
        windows = [ipus for _, ipus in all_windows(self.fleet, size)]
        if not windows:
            return  # no unit of this fleet is that large (a POD16 or a server and 64)
        ipus = data.draw(st.sampled_from(windows))
        partition_id = self.new_id()
        end = None if runtime is None else self.clock + runtime
        if ipus & self.taken():
            try:
                self.allocator.occupy(partition_id, sorted(ipus), expected_end=end)
            except AllocationConflict:
                return
            raise AssertionError("occupy accepted IPUs that are in use")
        placement = self.allocator.occupy(partition_id, sorted(ipus), expected_end=end)
        assert frozenset(placement.ipu_ids) == ipus
        self.live[partition_id] = ipus
        if end is not None:
            self.ends[partition_id] = end

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def set_machine_health(self, data: st.DataObject, state: Health) -> None:
        machine = data.draw(st.sampled_from(list(self.fleet.machine_ids())))
        self.allocator.set_machine_health(machine, state)
        if state is Health.UP:
            self.machine_health.pop(machine, None)
        else:
            self.machine_health[machine] = state

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def set_ipu_health(self, data: st.DataObject, state: Health) -> None:
        ipu = data.draw(st.sampled_from(list(self.fleet.ipu_ids())))
        self.allocator.set_ipu_health(ipu, state)
        if state is Health.UP:
            self.ipu_health.pop(ipu, None)
        else:
            self.ipu_health[ipu] = state

    @rule(sizes=st.lists(st.sampled_from(SIZES), max_size=4))
    def clone_is_independent(self, sizes: list[int]) -> None:
        before = (dict(self.allocator.partitions()), self.allocator.free_ipus(), self.allocator.find(4))
        twin = self.allocator.clone()
        for size in sizes:
            twin.allocate(self.new_id(), size)
        for partition_id in list(self.live)[:2]:
            twin.release(partition_id)
        twin.set_machine_health(next(self.fleet.machine_ids()), Health.FAILED)
        after = (dict(self.allocator.partitions()), self.allocator.free_ipus(), self.allocator.find(4))
        assert after == before

    @rule()
    def release_everything_and_restore(self) -> None:
        for partition_id in sorted(self.live):
            self.allocator.release(partition_id)
        for machine in sorted(self.machine_health):
            self.allocator.set_machine_health(machine, Health.UP)
        for ipu in sorted(self.ipu_health):
            self.allocator.set_ipu_health(ipu, Health.UP)
        self.live.clear()
        self.ends.clear()
        self.machine_health.clear()
        self.ipu_health.clear()
        assert self.allocator.partitions() == {}
        assert self.allocator.free_ipus() == self.fleet.ipus
        everything = set(self.fleet.ipu_ids())
        for kind in self.fleet.machine_types:
            assert self.allocator.largest_free(kind) == largest(self.fleet, everything, kind)

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def partitions_match_and_never_overlap(self) -> None:
        if not hasattr(self, "allocator"):
            return
        partitions = self.allocator.partitions()
        assert {pid: frozenset(p.ipu_ids) for pid, p in partitions.items()} == self.live
        assert sum(len(ipus) for ipus in self.live.values()) == len(self.taken())
        for placement in partitions.values():
            validate_partition(self.fleet, placement.ipu_ids)

    @invariant()
    def free_space_matches_brute_force(self) -> None:
        if not hasattr(self, "allocator"):
            return
        free = self.free()
        for kind in KINDS:
            of_kind = [ipu for ipu in free if kind is None or self.fleet.machine_type_of_ipu(ipu) is kind]
            assert self.allocator.free_ipus(kind) == len(of_kind)
            assert self.allocator.largest_free(kind) == largest(self.fleet, free, kind)
        for size in SIZES:
            expected = fits(self.fleet, free, size, None)
            assert (self.allocator.find(size) is not None) == expected
            report = self.allocator.fragmentation(size)
            assert report.stranded_ipus == stranded(self.fleet, free, size, None)
            assert report.free_ipus == len(free)

    @invariant()
    def release_times_and_holes_match_brute_force(self) -> None:
        """The index behind timed placement (white-box: the allocator's FreeSpace) against the model:
        a machine's release time is the latest expected end of the partitions smaller than a machine
        on it when all of them were given one, or the expected end of the partition of whole
        machines (inside one pod) holding it; its holes are by its free IPUs alone."""
        if not hasattr(self, "allocator"):
            return
        space = self.allocator._space
        small: dict[tuple[int, int], list[float | None]] = defaultdict(list)
        release: dict[tuple[int, int], float | None] = {}
        for partition_id, ipus in self.live.items():
            end = self.ends.get(partition_id)
            machines = {parse_ipu_id(ipu)[:2] for ipu in ipus}
            for machine in machines:
                if len(ipus) < 4:
                    small[machine].append(end)
                elif len(ipus) < 64 and end is not None:
                    release[machine] = end
        for machine, ends in small.items():
            release[machine] = None if None in ends else max(e for e in ends if e is not None)
        free = self.free()
        for kind in self.fleet.machine_types:
            expected: list[tuple[list[tuple[float, int]], list[int]]] = [
                ([], []) for _ in range(HOLE_CLASSES)
            ]
            for pod in self.fleet.pods_of_type(kind):
                ids = self.fleet.unit_ipu_ids(pod)
                for machine in range(16):
                    when = release.get((pod, machine))
                    assert space.release(pod, machine) == when, (pod, machine)
                    nibble = sum(
                        1 << i
                        for i in range(4)
                        if machine * 4 + i < len(ids) and ids[machine * 4 + i] in free
                    )
                    for hole_class in range(HOLE_CLASSES):
                        if MACHINE_HOLES[nibble] >> hole_class & 1:
                            timed, untimed = expected[hole_class]
                            if when is None:
                                untimed.append(pod * 16 + machine)
                            else:
                                timed.append((when, pod * 16 + machine))
            for hole_class, (timed, untimed) in enumerate(expected):
                assert space.holes(kind, hole_class) == (sorted(timed), sorted(untimed))


def _suite(policy: str) -> type[unittest.TestCase]:
    machine = type(f"AllocatorMachine_{policy.replace('-', '_')}", (AllocatorMachine,), {"policy": policy})
    machine.TestCase.settings = settings(
        max_examples=30,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return machine.TestCase


TestDefaultPolicy = _suite("default")
TestFirstFitPolicy = _suite("first-fit")
TestBestFitPolicy = _suite("best-fit")
assert set(available_policies()) == {"default", "first-fit", "best-fit"}
