import random

import pytest

from vipu.allocator import AllocationConflict, Allocator, PolicyError
from vipu.partitions import PartitionRuleError, validate_partition
from vipu.placement_policies import PlacementPolicy, available_policies, lowest_window
from vipu.topology import Fleet, Health, MachineType, Unit, ipu_id

POLICIES = available_policies()


def machines(pod: int, *indices: int) -> list[str]:
    return [ipu_id(pod, machine, ipu) for machine in indices for ipu in range(4)]


def fill_except(allocator: Allocator, pod: int, free_machines: set[int]) -> None:
    """Occupy every machine of ``pod`` but ``free_machines``, one 4-IPU partition each."""
    for machine in range(16):
        if machine not in free_machines:
            allocator.occupy(f"fill-{pod}-{machine}", machines(pod, machine))


def first_machine(placement) -> str:
    return placement.ipu_ids[0].rsplit("-", 1)[0]


def test_policy_registry():
    assert set(POLICIES) == {"default", "first-fit", "best-fit"}
    assert Allocator(Fleet.uniform(1)).policy_name == "default"
    with pytest.raises(ValueError, match="available"):
        Allocator(Fleet.uniform(1), "random")


@pytest.mark.parametrize("policy", POLICIES)
def test_placement_shape(policy):
    allocator = Allocator(Fleet.uniform(3), policy)
    small = allocator.allocate("small", 8, gcds=2)
    big = allocator.allocate("big", 128)
    assert small is not None and big is not None
    assert small.partition_id == "small"
    assert small.size == 8 and len(small.ipu_ids) == 8
    assert small.gcds == 2
    assert not small.spans_gw_links
    assert big.spans_gw_links and len(big.pods) == 2
    assert small.pods[0] not in big.pods
    assert big.machine_type is MachineType.M2000
    for placement in (small, big):
        validate_partition(allocator.fleet, placement.ipu_ids)
    assert set(allocator.partitions()) == {"small", "big"}


def test_first_fit_aligns_windows_to_their_size():
    allocator = Allocator(Fleet.uniform(1), "first-fit")
    allocator.occupy("m00", machines(0, 0))
    assert first_machine(allocator.allocate("eight", 8)) == "pod0000-m02"
    assert first_machine(allocator.allocate("four", 4)) == "pod0000-m01"
    assert first_machine(allocator.allocate("sixteen", 16)) == "pod0000-m04"


def test_first_fit_falls_back_to_unaligned_windows():
    allocator = Allocator(Fleet.uniform(1), "first-fit")
    fill_except(allocator, 0, {1, 2})
    placement = allocator.allocate("eight", 8)
    assert placement is not None
    assert placement.ipu_ids[::4] == ("pod0000-m01-i0", "pod0000-m02-i0")


def test_first_fit_takes_the_lowest_pod():
    allocator = Allocator(Fleet.uniform(2), "first-fit")
    allocator.occupy("lone", ["pod0001-m05-i0"])
    assert allocator.allocate("one", 1).ipu_ids == ("pod0000-m00-i0",)


@pytest.mark.parametrize("policy", POLICIES)
def test_windows_wrap_from_machine_15_to_0(policy):
    allocator = Allocator(Fleet.uniform(1), policy)
    fill_except(allocator, 0, {15, 0})
    placement = allocator.allocate("wrap", 8)
    assert placement is not None
    assert placement.ipu_ids[0] == "pod0000-m15-i0"
    assert placement.ipu_ids[-1] == "pod0000-m00-i3"


def test_best_fit_takes_the_fullest_pod_and_the_smallest_hole():
    allocator = Allocator(Fleet.uniform(2), "best-fit")
    fill_except(allocator, 1, {0, 1, 2, 5, 6})
    # Pod 1 has the fewest free IPUs; its smallest run that holds one machine is m05-m06.
    assert first_machine(allocator.allocate("four", 4)) == "pod0001-m05"
    assert first_machine(allocator.allocate("eight", 8)) == "pod0001-m00"


def test_best_fit_smallest_hole_for_single_ipus():
    allocator = Allocator(Fleet.uniform(1), "best-fit")
    allocator.occupy("a", ["pod0000-m03-i0"])
    allocator.occupy("b", ["pod0000-m03-i2"])
    # Free runs: {m03-i1} (1 IPU), {m03-i3 .. m02-i3} (the rest): the single hole wins.
    assert allocator.allocate("one", 1).ipu_ids == ("pod0000-m03-i1",)


def test_default_fills_half_used_pairs_before_breaking_machines():
    allocator = Allocator(Fleet.uniform(2), "default")
    allocator.occupy("lone", ["pod0001-m05-i0"])
    assert allocator.allocate("one", 1).ipu_ids == ("pod0001-m05-i1",)
    # Machine 5 now has one free pair: a pair request takes it instead of breaking a whole machine.
    assert allocator.allocate("two", 2).ipu_ids == ("pod0001-m05-i2", "pod0001-m05-i3")


def test_default_keeps_runs_that_suit_bigger_windows():
    allocator = Allocator(Fleet.uniform(2), "default")
    fill_except(allocator, 1, {0, 1, 2, 5, 6})
    # Cutting one machine off the 3-run leaves an 8-window; cutting the 2-run would not. A whole
    # free POD64 (pod 0) is the most expensive thing to break.
    assert first_machine(allocator.allocate("four", 4)) == "pod0001-m00"
    assert first_machine(allocator.allocate("eight", 8)) == "pod0001-m01"
    assert first_machine(allocator.allocate("eight-2", 8)) == "pod0001-m05"
    assert first_machine(allocator.allocate("four-2", 4)) == "pod0000-m00"


def test_default_learns_which_machine_type_is_in_demand():
    fleet = Fleet([MachineType.BOW, MachineType.M2000])
    fresh = Allocator(fleet, "default")
    assert fresh.find(4).pods == (0,)  # nothing learned: the lowest pod
    learned = Allocator(fleet, "default")
    for _ in range(20):
        learned.observe_request(64, machine_type=MachineType.BOW)
        learned.observe_request(1)
    # Whole bow POD64s are wanted, so an unpinned request goes to the m2000 pod.
    assert learned.find(4).pods == (1,)
    assert learned.find(4, machine_type="bow").pods == (0,)


@pytest.mark.parametrize("policy", POLICIES)
def test_machine_type_is_respected(policy):
    allocator = Allocator(Fleet(["m2000", "bow"]), policy)
    placement = allocator.allocate("b", 4, machine_type=MachineType.BOW)
    assert placement.machine_type is MachineType.BOW and placement.pods == (1,)
    assert allocator.allocate("big", 128) is None
    assert allocator.find(64, machine_type="bow") is None
    assert allocator.largest_free("bow") == 32
    assert allocator.largest_free("m2000") == 64


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_and_draining_machines_get_nothing_new(policy):
    allocator = Allocator(Fleet.uniform(1), policy)
    for machine in range(0, 16, 2):
        allocator.set_machine_health(f"pod0000-m{machine:02d}", Health.FAILED)
    allocator.set_machine_health("pod0000-m01", Health.DRAINING)
    assert allocator.largest_free() == 4
    assert allocator.free_ipus() == 7 * 4
    placements = [allocator.allocate(f"p{i}", 4) for i in range(8)]
    assert placements[-1] is None
    used = {first_machine(p) for p in placements if p}
    assert used == {f"pod0000-m{m:02d}" for m in range(3, 16, 2)}


def test_failed_ipu_is_skipped_and_restore_brings_it_back():
    allocator = Allocator(Fleet.uniform(1), "first-fit")
    allocator.set_ipu_health("pod0000-m00-i0", Health.FAILED)
    assert allocator.ipu_health("pod0000-m00-i0") is Health.FAILED
    assert allocator.allocate("one", 1).ipu_ids == ("pod0000-m00-i1",)
    assert allocator.largest_free() == 32  # a 64 needs every IPU healthy
    allocator.set_ipu_health("pod0000-m00-i0", Health.UP)
    assert allocator.allocate("two", 1).ipu_ids == ("pod0000-m00-i0",)


def test_machine_restore_keeps_an_ipu_that_failed_on_its_own():
    allocator = Allocator(Fleet.uniform(1))
    allocator.set_ipu_health("pod0000-m03-i1", Health.FAILED)
    allocator.set_machine_health("pod0000-m03", Health.DRAINING)
    assert allocator.ipu_health("pod0000-m03-i0") is Health.DRAINING
    assert allocator.ipu_health("pod0000-m03-i1") is Health.FAILED
    assert allocator.unhealthy_machines() == {"pod0000-m03": Health.DRAINING}
    allocator.set_machine_health("pod0000-m03", Health.UP)
    assert allocator.free_ipus() == 63
    assert allocator.ipu_health("pod0000-m03-i1") is Health.FAILED


def test_live_partitions_survive_drain_and_failure_until_released():
    allocator = Allocator(Fleet.uniform(1))
    allocator.occupy("live", machines(0, 4, 5))
    allocator.set_machine_health("pod0000-m04", Health.DRAINING)
    allocator.set_machine_health("pod0000-m05", Health.FAILED)
    assert "live" in allocator.partitions()
    assert allocator.partitions_on_machine("pod0000-m05") == ("live",)
    assert allocator.partitions_on_machine("pod0000-m06") == ()
    allocator.release("live")
    assert allocator.free_ipus() == 56  # the two unhealthy machines stay out of use
    allocator.set_machine_health("pod0000-m04", Health.UP)
    allocator.set_machine_health("pod0000-m05", Health.UP)
    assert allocator.free_ipus() == 64
    assert allocator.largest_free() == 64


def test_occupy_is_allowed_on_unhealthy_machines():
    allocator = Allocator(Fleet.uniform(1))
    allocator.set_machine_health("pod0000-m07", Health.FAILED)
    placement = allocator.occupy("old", machines(0, 7), gcds=2)
    assert placement.gcds == 2
    assert placement.ipu_ids == tuple(machines(0, 7))


def test_occupy_conflicts():
    allocator = Allocator(Fleet.uniform(1))
    allocator.occupy("a", machines(0, 2, 3))
    with pytest.raises(AllocationConflict, match=r"overlaps live partition\(s\) a"):
        allocator.occupy("b", machines(0, 3))
    with pytest.raises(AllocationConflict, match="already exists"):
        allocator.occupy("a", machines(0, 9))
    with pytest.raises(AllocationConflict, match="0\\+1 or 2\\+3"):
        allocator.occupy("c", ["pod0000-m09-i1", "pod0000-m09-i2"])
    with pytest.raises(AllocationConflict, match="already exists"):
        allocator.allocate("a", 1)
    assert set(allocator.partitions()) == {"a"}
    assert allocator.free_ipus() == 56


def test_release_unknown_partition():
    allocator = Allocator(Fleet.uniform(1))
    with pytest.raises(KeyError):
        allocator.release("nope")


def test_bad_requests_are_rule_errors():
    allocator = Allocator(Fleet.uniform(1))
    for size in (0, 3, 65_537 * 2):
        with pytest.raises(PartitionRuleError):
            allocator.allocate("x", size)
    with pytest.raises(PartitionRuleError):
        allocator.allocate("x", 8, gcds=3)
    assert allocator.allocate("x", 512) is None
    assert allocator.partitions() == {}


def test_find_has_no_side_effect_and_allocate_agrees():
    allocator = Allocator(Fleet.uniform(2))
    allocator.occupy("lone", ["pod0001-m05-i0"])
    before = allocator.free_ipus()
    found = allocator.find(1)
    assert found.partition_id == ""
    assert allocator.find(1) == found
    assert allocator.free_ipus() == before
    assert allocator.allocate("one", 1).ipu_ids == found.ipu_ids


def test_largest_free_counts_whole_pods_for_multi_pod_sizes():
    allocator = Allocator(Fleet.uniform(5))
    assert allocator.largest_free() == 256
    allocator.allocate("one", 1)
    assert allocator.largest_free() == 256
    allocator.allocate("two", 1)  # lands beside the first: still four whole pods
    assert allocator.largest_free() == 256
    allocator.allocate("big", 256)
    assert allocator.largest_free() == 32
    assert allocator.free_ipus() == 62


def test_fragmentation_report():
    allocator = Allocator(Fleet(["m2000", "bow"]), "first-fit")
    for machine in range(0, 16, 2):
        allocator.occupy(f"m{machine}", machines(0, machine))
    report = allocator.fragmentation(8, machine_type="m2000")
    assert report.free_ipus == 32
    assert report.stranded_ipus == 32  # no two adjacent free machines in pod 0
    assert report.stranded_share == 1.0
    assert report.largest_free_by_type == {"m2000": 4, "bow": 64}
    both = allocator.fragmentation(8)
    assert both.free_ipus == 96 and both.stranded_ipus == 32
    assert allocator.fragmentation(4).stranded_ipus == 0
    assert allocator.fragmentation(128).stranded_ipus == 96
    idle = allocator.fragmentation(None)
    assert idle.stranded_ipus == 0 and idle.head_size is None


def test_fragmentation_of_an_exhausted_fleet():
    allocator = Allocator(Fleet.uniform(1))
    allocator.allocate("all", 64)
    report = allocator.fragmentation(1)
    assert report.free_ipus == 0 and report.stranded_share == 0.0
    assert allocator.largest_free() == 0


def test_reconfigure_only_reconfigurable_partitions():
    allocator = Allocator(Fleet.uniform(1))
    allocator.allocate("fixed", 8)
    allocator.allocate("flex", 8, reconfigurable=True)
    assert allocator.reconfigure("flex", 4).gcds == 4
    assert allocator.partition("flex").gcds == 4
    with pytest.raises(PartitionRuleError, match="not reconfigurable"):
        allocator.reconfigure("fixed", 2)
    with pytest.raises(PartitionRuleError):
        allocator.reconfigure("flex", 3)


@pytest.mark.parametrize("policy", POLICIES)
def test_clone_is_independent(policy):
    original = Allocator(Fleet(["m2000", "bow"]), policy)
    original.allocate("a", 16)
    before = original.find(4)
    twin = original.clone()
    assert twin.policy_name == original.policy_name
    twin.allocate("b", 64)
    twin.release("a")
    twin.set_machine_health("pod0000-m09", Health.FAILED)
    for _ in range(10):
        twin.observe_request(2)
    assert set(original.partitions()) == {"a"}
    assert original.free_ipus() == 112
    assert original.machine_health("pod0000-m09") is Health.UP
    assert original.find(4) == before
    assert set(twin.partitions()) == {"b"}


@pytest.mark.parametrize("policy", POLICIES)
def test_same_operations_give_same_placements(policy):
    def run() -> list[tuple[str, ...]]:
        allocator = Allocator(Fleet(["m2000", "bow", "m2000"]), policy)
        out = []
        for step, size in enumerate([1, 4, 2, 8, 1, 1, 16, 2, 64, 4, 1, 32]):
            placement = allocator.allocate(f"p{step}", size)
            out.append(placement.ipu_ids if placement else ())
            if step % 3 == 2:
                allocator.release(f"p{step - 1}")
        return out

    assert run() == run()


def test_custom_policy_instances_plug_in():
    class LastPod(PlacementPolicy):
        name = "last-pod"

        def choose_window(self, space, level, kinds):
            for pod in range(space.fleet.pods - 1, -1, -1):
                if any(space.hosts(kind, level) >> pod & 1 for kind in kinds):
                    return pod, lowest_window(space.free_mask(pod), level, aligned=False)
            return None

    allocator = Allocator(Fleet.uniform(3), LastPod())
    assert allocator.policy_name == "last-pod"
    assert allocator.allocate("x", 4).pods == (2,)


def test_a_policy_that_answers_with_busy_ipus_is_caught():
    class Careless(PlacementPolicy):
        name = "careless"

        def choose_window(self, space, level, kinds):
            return 0, 0

    allocator = Allocator(Fleet.uniform(1), Careless())
    assert allocator.allocate("first", 4).ipu_ids[0] == "pod0000-m00-i0"
    with pytest.raises(PolicyError, match="careless"):
        allocator.allocate("second", 4)
    assert set(allocator.partitions()) == {"first"}


def test_default_trades_window_sizes_by_the_learned_mix():
    def allocator_after(observed: int) -> Allocator:
        allocator = Allocator(Fleet.uniform(1), "default")
        fill_except(allocator, 0, {0, 1, 4, 5, 6, 7, 8})  # free runs: m00-m01 and m04-m08
        for _ in range(50):
            allocator.observe_request(observed)
        return allocator

    # 8s wanted: keep the 2-run whole and shave the 5-run (it still holds an 8 and a 16).
    assert first_machine(allocator_after(8).find(4)) == "pod0000-m04"
    # 16s wanted: the 5-run is the only home for a 16, so spend the 2-run instead.
    assert first_machine(allocator_after(16).find(4)) == "pod0000-m00"


# --- servers and POD16s ------------------------------------------------------------------------


def _servers(count: int) -> Fleet:
    return Fleet([Unit(MachineType.C2, "server", 0) for _ in range(count)])


@pytest.mark.parametrize("policy", POLICIES)
def test_servers_are_carved_buddy_style_under_every_policy(policy):
    allocator = Allocator(_servers(2), policy)
    one = allocator.allocate("one", 1, machine_type="c2")
    assert one is not None and one.ipu_ids == ("srv0000-i00",)
    # The next single IPU takes the lone twin of the first card, not a fresh card.
    two = allocator.allocate("two", 1)
    assert two is not None and two.ipu_ids == ("srv0000-i01",)
    # A pair goes into the server already in use, on the next free card.
    pair = allocator.allocate("pair", 2)
    assert pair is not None and pair.ipu_ids == ("srv0000-i02", "srv0000-i03")
    # 8 IPUs: the aligned upper half of the busy server, leaving the other server whole for a 16.
    eight = allocator.allocate("eight", 8)
    assert eight is not None and eight.ipu_ids == tuple(f"srv0000-i{i:02d}" for i in range(8, 16))
    sixteen = allocator.allocate("sixteen", 16)
    assert sixteen is not None and sixteen.pods == (1,) and sixteen.size == 16
    assert allocator.allocate("none", 8) is None
    assert allocator.largest_free("c2") == 4
    for placement in allocator.partitions().values():
        validate_partition(allocator.fleet, placement.ipu_ids)


def test_no_partition_is_larger_than_a_server_or_spans_two():
    allocator = Allocator(_servers(4))
    assert allocator.allocate("big", 32, machine_type="c2") is None
    assert allocator.largest_free() == 16
    report = allocator.fragmentation(32)
    assert report.stranded_ipus == 64 == report.free_ipus


def test_a_drained_server_takes_nothing_new_and_keeps_its_partitions():
    allocator = Allocator(_servers(1))
    held = allocator.allocate("held", 4)
    assert held is not None
    allocator.set_machine_health("srv0000", Health.DRAINING)
    assert allocator.machine_health("srv0000") is Health.DRAINING
    assert allocator.unhealthy_machines() == {"srv0000": Health.DRAINING}
    assert allocator.partitions_on_machine("srv0000") == ("held",)
    assert allocator.free_ipus() == 0 and allocator.allocate("new", 1) is None
    allocator.set_machine_health("srv0000", Health.UP)
    allocator.set_ipu_health("srv0000-i05", Health.FAILED)
    placed = allocator.allocate("after", 4)
    assert placed is not None and "srv0000-i05" not in placed.ipu_ids
    assert allocator.free_ipus() == 16 - 4 - 1 - 4  # less held, the failed IPU, and after


def test_untyped_requests_fill_pods_before_servers():
    fleet = Fleet([Unit(MachineType.C2, "server", 0), Unit(MachineType.M2000, "pod16", 1)])
    allocator = Allocator(fleet)
    first = allocator.allocate("a", 16)
    assert first is not None and first.machine_type is MachineType.M2000
    second = allocator.allocate("b", 16)
    assert second is not None and second.machine_type is MachineType.C2
    assert allocator.allocate("c", 1) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_pod16_windows_stay_in_line(policy):
    allocator = Allocator(Fleet([Unit(MachineType.BOW, "pod16", 0)]), policy)
    allocator.occupy("middle", machines(0, 1, 2))
    assert allocator.largest_free() == 4  # machines 3 and 0 are not neighbours on a POD16
    assert allocator.allocate("eight", 8) is None
    assert allocator.allocate("four", 4) is not None


@pytest.mark.parametrize("spec", ["8xm2000", "2xm2000,1xbow,8xdss8440"])
def test_largest_free_after_release_is_asked_without_releasing(spec: str) -> None:
    """`largest_free_after` answers what `largest_free` would once some partitions were released,
    for every subset tried, and changes nothing (the preemption search asks it before it clones)."""
    rng = random.Random(spec)
    fleet = Fleet.build(spec)
    alloc = Allocator(fleet)
    names: list[str] = []
    for i in range(400):
        size = rng.choice((1, 1, 1, 2, 4, 8, 16, 64, 128))
        if alloc.allocate(f"p{i}", size) is not None:
            names.append(f"p{i}")
        if names and rng.random() < 0.3:
            alloc.release(names.pop(rng.randrange(len(names))))
    assert names
    kinds = (None, *(kind.value for kind in fleet.machine_types))
    for _ in range(60):
        chosen = rng.sample(names, rng.randint(1, min(40, len(names))))
        twin = alloc.clone()
        for name in chosen:
            twin.release(name)
        before = {kind: alloc.largest_free(kind) for kind in kinds}
        for kind in kinds:
            assert alloc.largest_free_after([*chosen, "no-such"], kind) == twin.largest_free(kind), (
                kind,
                chosen,
            )
        assert {kind: alloc.largest_free(kind) for kind in kinds} == before
