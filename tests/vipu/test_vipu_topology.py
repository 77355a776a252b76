import pytest

from vipu.topology import (
    MAX_PODS,
    Fleet,
    Health,
    MachineType,
    Unit,
    ipu_id,
    machine_id,
    machines_of,
    parse_ipu_id,
    parse_machine_id,
    parse_pod_id,
    parse_rack_id,
    pod_id,
    pods_of,
    rack_id,
    rack_of_pod,
    racks_of,
    ring_distance,
    ring_position,
    spans_gw_links,
)


def test_ids_have_the_documented_shape():
    assert pod_id(3) == "pod0003"
    assert rack_id(1) == "rack0001"
    assert machine_id(3, 7) == "pod0003-m07"
    assert ipu_id(3, 7, 2) == "pod0003-m07-i2"
    assert ipu_id(1023, 15, 3) == "pod1023-m15-i3"


def test_ids_round_trip():
    assert parse_pod_id("pod0003") == 3
    assert parse_rack_id("rack0001") == 1
    assert parse_machine_id("pod0003-m07") == (3, 7)
    assert parse_ipu_id("pod0003-m07-i2") == (3, 7, 2)
    for pod, machine, ipu in [(0, 0, 0), (511, 8, 1), (1023, 15, 3)]:
        assert parse_ipu_id(ipu_id(pod, machine, ipu)) == (pod, machine, ipu)


@pytest.mark.parametrize(
    "text",
    [
        "pod3-m07-i2",
        "pod0003-m7-i2",
        "pod0003-m16-i0",
        "pod0003-m07-i4",
        "POD0003-m07-i2",
        "pod0003-m07-i2 ",
        "pod0003_m07_i2",
        "pod0003-m07",
        "",
        "pod10000-m00-i0",
        "pod1024-m00-i0",
    ],
)
def test_malformed_ipu_ids_are_rejected(text):
    with pytest.raises(ValueError):
        parse_ipu_id(text)


@pytest.mark.parametrize(
    "text", ["pod0003-m16", "pod0003-m7", "pod0003", "pod0003-m07-i1", "x", "pod2000-m00"]
)
def test_malformed_machine_ids_are_rejected(text):
    with pytest.raises(ValueError):
        parse_machine_id(text)


def test_non_string_ids_are_rejected():
    with pytest.raises(ValueError):
        parse_ipu_id(17)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_pod_id("pod03")
    with pytest.raises(ValueError):
        parse_pod_id("pod1024")
    with pytest.raises(ValueError):
        parse_rack_id("rack1024")


def test_formatters_reject_out_of_range_indices():
    with pytest.raises(ValueError):
        pod_id(1024)
    with pytest.raises(ValueError):
        machine_id(0, 16)
    with pytest.raises(ValueError):
        ipu_id(0, 0, 4)
    with pytest.raises(ValueError):
        ipu_id(-1, 0, 0)


def test_ring_positions_and_distance_wrap_around():
    assert ring_position(7, 2) == 30
    assert ring_position(15, 3) == 63
    assert ring_distance(63, 0) == 1
    assert ring_distance(0, 32) == 32
    assert ring_distance(2, 60) == 6


def test_racks_hold_two_pods():
    assert [rack_of_pod(pod) for pod in range(5)] == [0, 0, 1, 1, 2]
    assert Fleet.uniform(3).racks == 2
    assert Fleet.uniform(3).rack_ids() == ("rack0000", "rack0001")


def test_fleet_shapes():
    fleet = Fleet([MachineType.M2000, "bow", MachineType.BOW])
    assert fleet.pods == 3
    assert fleet.ipus == 192
    assert fleet.machines == 48
    assert fleet.machine_types == (MachineType.M2000, MachineType.BOW)
    assert fleet.pods_of_type("bow") == (1, 2)
    assert fleet.machine_type_of_ipu("pod0001-m00-i0") is MachineType.BOW
    assert list(fleet.ipu_ids())[:2] == ["pod0000-m00-i0", "pod0000-m00-i1"]
    assert len(list(fleet.machine_ids())) == 48
    assert Fleet.uniform(2, MachineType.BOW) == Fleet(["bow", "bow"])


def test_fleet_size_is_bounded():
    assert Fleet.uniform(MAX_PODS).ipus == 65_536
    with pytest.raises(ValueError, match="at most 1024"):
        Fleet.uniform(MAX_PODS + 1)
    with pytest.raises(ValueError):
        Fleet(["tpu"])


def test_fleet_checks_membership():
    fleet = Fleet.uniform(2)
    assert fleet.check_ipu("pod0001-m15-i3") == (1, 15, 3)
    with pytest.raises(ValueError, match="not in this fleet"):
        fleet.check_ipu("pod0002-m00-i0")
    with pytest.raises(ValueError, match="not in this fleet"):
        fleet.check_machine("pod0002-m00")


def test_link_helpers():
    inside = ["pod0000-m00-i0", "pod0000-m15-i3"]
    across = ["pod0000-m00-i0", "pod0003-m00-i0"]
    assert pods_of(across) == (0, 3)
    assert racks_of(across) == (0, 1)
    assert machines_of(inside) == ("pod0000-m00", "pod0000-m15")
    assert not spans_gw_links(inside)
    assert spans_gw_links(across)


def test_enums_are_strings():
    assert MachineType("m2000") is MachineType.M2000
    assert Health.DRAINING == "draining"


def test_servers_and_pod16s_have_their_own_ids_and_shapes():
    fleet = Fleet(["m2000", "m2000", "c2", "c2", "m2000"])
    assert [u.layout for u in fleet.units] == ["pod64", "pod64", "server", "server", "pod64"]
    # Two POD64s share a rack; servers fill their own rack; the next POD64 starts another.
    assert [u.rack for u in fleet.units] == [0, 0, 1, 1, 2]
    assert fleet.ipus == 64 * 3 + 16 * 2
    assert fleet.pod_ids() == ("pod0000", "pod0001", "srv0002", "srv0003", "pod0004")
    assert fleet.unit_ipu_ids(2)[:2] == ("srv0002-i00", "srv0002-i01") and len(fleet.unit_ipu_ids(2)) == 16
    assert fleet.unit_machine_ids(3) == ("srv0003",)
    assert fleet.units[2].model == "dss8440"
    assert parse_ipu_id("srv0002-i13") == (2, 3, 1)
    assert parse_machine_id("srv0002") == (2, 0)
    assert fleet.machine_mask("srv0002") == (2, 0xFFFF)
    assert fleet.machine_mask("pod0001-m03") == (1, 0xF000)
    assert machines_of(["srv0002-i00", "srv0002-i15", "pod0000-m01-i0"]) == ("pod0000-m01", "srv0002")
    pod16 = Fleet([Unit(MachineType.BOW, "pod16", 0)])
    assert pod16.ipus == 16 and list(pod16.machine_ids()) == [f"pod0000-m0{m}" for m in range(4)]
    with pytest.raises(ValueError, match="not in this fleet"):
        pod16.check_ipu("pod0000-m04-i0")
    with pytest.raises(ValueError, match="not in this fleet"):
        fleet.check_machine("pod0002-m00")


@pytest.mark.parametrize("text", ["srv0002-i16", "srv0002-i1", "srv2-i01", "srv0002-m00-i0", "SRV0002-i00"])
def test_malformed_server_ids_are_rejected(text):
    with pytest.raises(ValueError):
        parse_ipu_id(text)


def test_units_must_come_in_their_types_layouts():
    with pytest.raises(ValueError, match="comes in server"):
        Unit(MachineType.C2, "pod64", 0)
    with pytest.raises(ValueError, match="dss8440, nf5568m5"):
        Unit(MachineType.C2, "server", 0, "dgx")
    with pytest.raises(ValueError, match="no server model"):
        Unit(MachineType.M2000, "pod64", 0, "dss8440")


def test_a_retired_unit_keeps_its_index_and_is_absent():
    fleet = Fleet([Unit(MachineType.M2000, "pod64", 0), None, Unit(MachineType.C2, "server", 1)])
    assert fleet.pods == 3 and fleet.ipus == 80
    assert not fleet.has_pod(1)
    assert fleet.pod_types == (MachineType.M2000, None, MachineType.C2)
    with pytest.raises(ValueError, match="not in this fleet"):
        fleet.check_ipu("pod0001-m00-i0")
