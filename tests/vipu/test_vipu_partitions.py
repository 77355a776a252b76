import pytest

from vipu.partitions import PartitionRuleError, validate_partition
from vipu.topology import Fleet, Health, MachineType, Unit, ipu_id

FLEET = Fleet([MachineType.M2000, MachineType.M2000, MachineType.BOW, MachineType.BOW])


def machines(pod: int, *indices: int) -> list[str]:
    return [ipu_id(pod, machine, ipu) for machine in indices for ipu in range(4)]


def whole_pod(pod: int) -> list[str]:
    return machines(pod, *range(16))


def test_single_ipu():
    shape = validate_partition(FLEET, ["pod0001-m03-i2"])
    assert shape.size == 1
    assert shape.pods == (1,)
    assert shape.start == 14
    assert shape.machine_type is MachineType.M2000
    assert not shape.spans_gw_links


@pytest.mark.parametrize("count", [3, 5, 6, 12, 24])
def test_size_must_be_a_power_of_two(count):
    ids = [ipu_id(0, position // 4, position % 4) for position in range(count)]
    with pytest.raises(PartitionRuleError, match="power of two"):
        validate_partition(FLEET, ids)


@pytest.mark.parametrize("pair", [(0, 1), (2, 3)])
def test_aligned_pairs_of_one_machine(pair):
    shape = validate_partition(FLEET, [ipu_id(0, 5, pair[1]), ipu_id(0, 5, pair[0])])
    assert shape.ipu_ids == (ipu_id(0, 5, pair[0]), ipu_id(0, 5, pair[1]))


@pytest.mark.parametrize(
    "ids",
    [
        ["pod0000-m05-i1", "pod0000-m05-i2"],  # adjacent but not aligned
        ["pod0000-m05-i0", "pod0000-m05-i3"],
        ["pod0000-m05-i3", "pod0000-m06-i0"],  # ring neighbours in two machines
    ],
)
def test_other_pairs_are_refused(ids):
    with pytest.raises(PartitionRuleError, match="0\\+1 or 2\\+3"):
        validate_partition(FLEET, ids)


def test_whole_adjacent_machines():
    shape = validate_partition(FLEET, machines(0, 6, 7))
    assert shape.size == 8
    assert shape.start == 24
    shape = validate_partition(FLEET, machines(0, 3, 4, 5, 6))  # need not be aligned
    assert shape.start == 12


def test_windows_wrap_around_the_ring():
    shape = validate_partition(FLEET, machines(1, 0, 15))
    assert shape.start == 60
    assert shape.ipu_ids[0] == "pod0001-m15-i0"
    assert shape.ipu_ids[-1] == "pod0001-m00-i3"
    shape = validate_partition(FLEET, machines(1, 14, 15, 0, 1))
    order = [ipu[:11] for ipu in shape.ipu_ids[::4]]
    assert order == ["pod0001-m14", "pod0001-m15", "pod0001-m00", "pod0001-m01"]


def test_machine_windows_must_be_contiguous_and_whole():
    with pytest.raises(PartitionRuleError, match="not contiguous"):
        validate_partition(FLEET, machines(0, 1, 3))
    with pytest.raises(PartitionRuleError, match="whole machines"):
        validate_partition(FLEET, [ipu_id(0, 0, 2), ipu_id(0, 0, 3), ipu_id(0, 1, 0), ipu_id(0, 1, 1)])


def test_up_to_64_stays_in_one_pod():
    with pytest.raises(PartitionRuleError, match="inside one POD64"):
        validate_partition(FLEET, machines(0, 15) + machines(1, 0))
    shape = validate_partition(FLEET, whole_pod(1))
    assert shape.size == 64
    assert shape.start == 0


def test_above_64_takes_whole_pods_over_gw_links():
    shape = validate_partition(FLEET, whole_pod(1) + whole_pod(0))
    assert shape.size == 128
    assert shape.pods == (0, 1)
    assert shape.spans_gw_links
    assert shape.ipu_ids[0] == "pod0000-m00-i0"
    assert shape.ipu_ids[64] == "pod0001-m00-i0"


def test_above_64_refuses_partial_pods():
    fleet = Fleet.uniform(3)
    ids = whole_pod(0) + whole_pod(1)[:-2] + ["pod0002-m00-i0", "pod0002-m00-i1"]
    with pytest.raises(PartitionRuleError, match="whole POD64s"):
        validate_partition(fleet, ids)


def test_one_machine_type_only():
    with pytest.raises(PartitionRuleError, match="one machine type"):
        validate_partition(FLEET, whole_pod(1) + whole_pod(2))
    assert validate_partition(FLEET, whole_pod(2) + whole_pod(3)).machine_type is MachineType.BOW


def test_gcds_split_evenly_into_powers_of_two():
    ids = machines(0, 2, 3)
    assert validate_partition(FLEET, ids, gcds=4).gcd_size == 2
    assert validate_partition(FLEET, ids, gcds=8).gcd_size == 1
    for bad in (0, -1, 3, 16):
        with pytest.raises(PartitionRuleError):
            validate_partition(FLEET, ids, gcds=bad)


def test_reconfigurable_flag_is_carried():
    assert validate_partition(FLEET, machines(0, 2), reconfigurable=True).reconfigurable
    assert not validate_partition(FLEET, machines(0, 2)).reconfigurable


def test_unhealthy_ipus_are_refused_for_new_partitions():
    ids = machines(0, 4, 5)
    for state in (Health.DRAINING, Health.FAILED):
        with pytest.raises(PartitionRuleError, match="healthy"):
            validate_partition(FLEET, ids, health={"pod0000-m05-i1": state})
        with pytest.raises(PartitionRuleError, match="pod0000-m04-i0"):
            validate_partition(FLEET, ids, health={"pod0000-m04": state})
        with pytest.raises(PartitionRuleError):
            validate_partition(FLEET, ids, health=lambda ipu, s=state: s if ipu.endswith("i3") else Health.UP)
    assert validate_partition(FLEET, ids, health={"pod0000-m06": Health.FAILED}).size == 8
    # Health not given: the rule is skipped, as for a partition that already exists.
    assert validate_partition(FLEET, ids).size == 8


def test_malformed_or_foreign_ids_and_duplicates():
    with pytest.raises(PartitionRuleError, match="at least one"):
        validate_partition(FLEET, [])
    with pytest.raises(PartitionRuleError, match="more than once"):
        validate_partition(FLEET, ["pod0000-m00-i0", "pod0000-m00-i0"])
    with pytest.raises(PartitionRuleError, match="malformed"):
        validate_partition(FLEET, ["pod0000-m00-x0"])
    with pytest.raises(PartitionRuleError, match="not in this fleet"):
        validate_partition(FLEET, ["pod0009-m00-i0"])


def test_rule_errors_are_value_errors():
    assert issubclass(PartitionRuleError, ValueError)


# --- POD16s and C2 servers ---------------------------------------------------------------------

MIXED = Fleet(
    [
        Unit(MachineType.M2000, "pod64", 0),
        Unit(MachineType.M2000, "pod16", 1),
        Unit(MachineType.C2, "server", 2, "dss8440"),
        Unit(MachineType.C2, "server", 2, "nf5568m5"),
    ]
)


def server(unit: int, *ipus: int) -> list[str]:
    return [f"srv{unit:04d}-i{ipu:02d}" for ipu in ipus]


@pytest.mark.parametrize("size", [1, 2, 4, 8, 16])
def test_server_partitions_are_the_aligned_groups_gc_info_lists(size):
    for start in range(0, 16, size):
        shape = validate_partition(MIXED, server(2, *range(start, start + size)))
        assert shape.size == size and shape.start == start and shape.pods == (2,)
        assert shape.machine_type is MachineType.C2


@pytest.mark.parametrize(
    "ipus",
    [(1, 2), (2, 3, 4, 5), (4, 5, 6, 7, 8, 9, 10, 11), (6, 7, 8, 9)],
)
def test_server_partitions_off_their_alignment_are_refused(ipus):
    with pytest.raises(PartitionRuleError, match=r"C2 card|aligned block"):
        validate_partition(MIXED, server(2, *ipus))


def test_a_partition_never_spans_two_servers():
    with pytest.raises(PartitionRuleError, match="nothing links two of them"):
        validate_partition(MIXED, server(2, *range(8, 16)) + server(3, *range(8)))
    with pytest.raises(PartitionRuleError, match="cannot be joined"):
        validate_partition(
            Fleet([Unit(MachineType.C2, "server", r) for r in range(8)]),
            [ipu for unit in range(8) for ipu in server(unit, *range(16))],
        )


def test_server_ids_must_match_the_unit():
    with pytest.raises(PartitionRuleError, match="not in this fleet"):
        validate_partition(MIXED, ["srv0000-i00"])  # unit 0 is a POD64
    with pytest.raises(PartitionRuleError, match="not in this fleet"):
        validate_partition(MIXED, ["pod0002-m00-i0"])  # unit 2 is a server
    with pytest.raises(PartitionRuleError, match="not in this fleet"):
        validate_partition(MIXED, ["pod0001-m04-i0"])  # a POD16 has machines 0..3


def test_pod16_windows_are_a_line_that_does_not_wrap():
    shape = validate_partition(MIXED, machines(1, 1, 2))
    assert shape.start == 4 and shape.size == 8
    assert validate_partition(MIXED, machines(1, 0, 1, 2, 3)).size == 16
    with pytest.raises(PartitionRuleError, match="not contiguous"):
        validate_partition(MIXED, machines(1, 3, 0))
    with pytest.raises(PartitionRuleError, match="span pod0000, pod0001"):
        validate_partition(MIXED, machines(1, 0, 1, 2, 3) + machines(0, 0, 1, 2, 3))


def test_failed_server_ipus_are_never_taken():
    health = {"srv0002-i05": Health.FAILED}
    with pytest.raises(PartitionRuleError, match="srv0002-i05 \\(failed\\)"):
        validate_partition(MIXED, server(2, *range(4, 8)), health=health)
    with pytest.raises(PartitionRuleError, match="not up"):
        validate_partition(MIXED, server(3, 0), health={"srv0003": Health.DRAINING})
