"""Random allocate / release / occupy / fail / drain / restore sequences on small mixed fleets, for
every policy, checked against a brute-force enumeration of the partition rules."""

from __future__ import annotations

import unittest

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

from vipu.allocator import AllocationConflict, Allocator, Placement
from vipu.partitions import validate_partition
from vipu.placement_policies import available_policies
from vipu.topology import Fleet, Health, MachineType, ipu_id, machine_id

KINDS = (None, MachineType.M2000, MachineType.BOW)
STATES = (Health.UP, Health.DRAINING, Health.FAILED)


class AllocatorMachine(RuleBasedStateMachine):
    policy: str

    def __init__(self) -> None:
        super().__init__()
        self.allocator: Allocator
        self.fleet: Fleet
        self.live: dict[str, frozenset[str]] = {}
        self.machine_health: dict[str, Health] = {}
        self.ipu_health: dict[str, Health] = {}
        self.serial = 0

    @initialize(pod_types=st.lists(st.sampled_from(list(MachineType)), min_size=1, max_size=3))
    def build(self, pod_types: list[MachineType]) -> None:
        self.fleet = Fleet(pod_types)
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

    @rule(size=st.sampled_from(SIZES), kind=st.sampled_from(KINDS), gcds=st.sampled_from([1, 2]))
    def allocate(self, size: int, kind: MachineType | None, gcds: int) -> None:
        gcds = min(gcds, size)
        expected = fits(self.fleet, self.free(), size, kind)
        found = self.allocator.find(size, machine_type=kind)
        placement = self.allocator.allocate(self.new_id(), size, machine_type=kind, gcds=gcds)
        if not expected:
            assert found is None and placement is None
            return
        assert placement is not None, f"refused {size} ({kind}) while a valid placement exists"
        assert found is not None and found.ipu_ids == placement.ipu_ids
        self.check_new_placement(placement, size, kind)
        assert placement.gcds == gcds
        self.live[placement.partition_id] = frozenset(placement.ipu_ids)

    @rule(size=st.sampled_from(SIZES))
    def observe(self, size: int) -> None:
        self.allocator.observe_request(size)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        partition_id = data.draw(st.sampled_from(sorted(self.live)))
        self.allocator.release(partition_id)
        del self.live[partition_id]

    @rule(data=st.data(), size=st.sampled_from([1, 2, 4, 8, 16, 64]))
    def occupy_existing(self, data: st.DataObject, size: int) -> None:
        """Register a partition as if loaded from the database, on any machines, healthy or not."""
        windows = [ipus for _, ipus in all_windows(self.fleet, size)]
        ipus = data.draw(st.sampled_from(windows))
        partition_id = self.new_id()
        if ipus & self.taken():
            try:
                self.allocator.occupy(partition_id, sorted(ipus))
            except AllocationConflict:
                return
            raise AssertionError("occupy accepted IPUs that are in use")
        placement = self.allocator.occupy(partition_id, sorted(ipus))
        assert frozenset(placement.ipu_ids) == ipus
        self.live[partition_id] = ipus

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def set_machine_health(self, data: st.DataObject, state: Health) -> None:
        pod = data.draw(st.integers(0, self.fleet.pods - 1))
        machine = machine_id(pod, data.draw(st.integers(0, 15)))
        self.allocator.set_machine_health(machine, state)
        if state is Health.UP:
            self.machine_health.pop(machine, None)
        else:
            self.machine_health[machine] = state

    @rule(data=st.data(), state=st.sampled_from(STATES))
    def set_ipu_health(self, data: st.DataObject, state: Health) -> None:
        pod = data.draw(st.integers(0, self.fleet.pods - 1))
        ipu = ipu_id(pod, data.draw(st.integers(0, 15)), data.draw(st.integers(0, 3)))
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
        twin.set_machine_health(machine_id(0, 0), Health.FAILED)
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
        self.machine_health.clear()
        self.ipu_health.clear()
        assert self.allocator.partitions() == {}
        assert self.allocator.free_ipus() == self.fleet.ipus
        for kind in self.fleet.machine_types:
            pods = len(self.fleet.pods_of_type(kind))
            assert self.allocator.largest_free(kind) == 64 * (1 << (pods.bit_length() - 1))

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
