"""gc-info's device numbering and the IPUoF configuration of a GCD (vipu/ipuof.py)."""

from __future__ import annotations

from vipu import ipuof


def test_a_16_ipu_server_numbers_its_devices_as_gc_info_does() -> None:
    devices = ipuof.devices(16)
    by_size: dict[int, list[int]] = {}
    for d in devices:
        by_size.setdefault(len(d.ipus), []).append(d.id)
    # docs/hardware.md: 0-15 single IPUs, 16-23 pairs, 24-27 groups of 4, 28-29 groups of 8, 30 all 16.
    assert by_size == {
        1: list(range(16)),
        2: list(range(16, 24)),
        4: list(range(24, 28)),
        8: [28, 29],
        16: [30],
    }
    assert all(d.ipus[0] % len(d.ipus) == 0 for d in devices), "groups are aligned"
    for d in devices:
        assert ipuof.device_for(16, d.ipus[0], len(d.ipus)) == d.id


def test_a_gcds_configuration_lists_its_own_ipus_and_devices() -> None:
    ipus = [f"pod0001-m{m:02d}-i{i}" for m in (4, 5) for i in range(4)]
    conf = ipuof.ipuof_config(
        partition="p", own=ipuof.gcd_ipus(ipus, 2, 1), gcds=2, gcd=1, machine_type="bow"
    )
    assert conf["num_ipus"] == 4 and conf["board_type"] == "Bow-2000" and conf["target"] == "Fabric"
    assert [d["ipu_id"] for d in conf["ipus"]] == ipus[4:]
    assert {d["ip"] for d in conf["ipus"]} == {"pod0001-m05"}
    assert len(conf["devices"]) == 7
    assert ipuof.target("c2") == "PCIe"
    assert ipuof.ipu_attributes("srv0004-i13", "c2")["board ipu index"] == "13"
