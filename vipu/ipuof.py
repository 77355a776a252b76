"""What a Poplar program is told about its partition: IPUoF configuration, device ids, IPU attributes.

Pure functions of a partition's IPU ids and machine type, shared by the V-IPU endpoint (which
answers `GetPartitionIpuofConfig`) and the host agent (which writes the same configuration into each
attempt's `IPUOF_CONFIG_PATH`), so the file and the endpoint can never disagree.

Device ids follow `gc-info --list-devices` (docs/hardware.md: on a 16-IPU server ids 0-15 are single
IPUs, 16-23 pairs, 24-27 groups of four, 28-29 groups of eight and 30 all sixteen): the single IPUs
of the device set come first, then every aligned group of 2, 4, 8 ... IPUs up to the whole set.

Nothing here invents hardware facts: an emulated IPU has no fabric address, serial number or
firmware, so those fields name the machine (its id stands where an IPU-Machine's address would) or
say `n/a`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vipu.machine_types import MACHINES, MachineType

# The V-IPU release whose user API (vipuuser.proto) the endpoint's messages are named after.
VIPU_API_VERSION = "1.18.0"
# What a Poplar program reads from a partition's IPUoF configuration to choose its IPUs (no RDMA
# server runs for an emulated IPU: the ports are 0, and `ip` carries the machine's id).
IPUOF_CONFIG_VERSION = 1
NOT_APPLICABLE = "n/a"

BOARD_TYPES = {MachineType.M2000: "M2000", MachineType.BOW: "Bow-2000", MachineType.C2: "C2"}
ARCHITECTURES = {MachineType.M2000: "ipu2", MachineType.BOW: "ipu21", MachineType.C2: "ipu1"}


def machine_of(ipu_id: str) -> str:
    """`pod0003-m07` for `pod0003-m07-i2`; `srv0004` for `srv0004-i13`."""
    return ipu_id.rsplit("-i", 1)[0]


def ipu_index(ipu_id: str) -> int:
    """The IPU's index in its machine (its board IPU index): 2 for `pod0003-m07-i2`."""
    return int(ipu_id.rsplit("-i", 1)[1])


def gcd_ipus(ipu_ids: Sequence[str], gcds: int, gcd: int) -> list[str]:
    """The IPUs of graph compile domain `gcd` of a partition split into `gcds` equal ones."""
    size = len(ipu_ids) // gcds
    return list(ipu_ids[gcd * size : (gcd + 1) * size])


def target(machine_type: str) -> str:
    """`Fabric` for IPUs reached over IPU over Fabric (IPU-Machines), `PCIe` for C2 cards."""
    return "PCIe" if MACHINES[MachineType(machine_type)].host_attach == "pcie" else "Fabric"


@dataclass(frozen=True, slots=True)
class Device:
    """One device of `gc-info --list-devices`: a single IPU or an aligned multi-IPU group."""

    id: int
    ipus: tuple[int, ...]
    """Positions in the device set (0 .. n-1) of the IPUs it holds, in order."""

    @property
    def multi(self) -> bool:
        return len(self.ipus) > 1


def devices(n: int) -> list[Device]:
    """Every device over a set of `n` IPUs (a power of two): singles, then groups of 2, 4 .. n."""
    out = [Device(i, (i,)) for i in range(n)]
    size = 2
    while size <= n:
        for start in range(0, n, size):
            out.append(Device(len(out), tuple(range(start, start + size))))
        size *= 2
    return out


def device_for(n: int, first: int, size: int) -> int:
    """The id of the device of `size` IPUs starting at position `first` of a set of `n` IPUs."""
    offset = 0
    width = 1
    while width < size:
        offset += n // width
        width *= 2
    return offset + first // size


def ipuof_device(ipu_id: str, position: int) -> dict[str, object]:
    """One IPU as the IPUoF configuration lists it (`IpuofDevice`)."""
    return {
        "ip": machine_of(ipu_id),
        "server_port": 0,
        "rdma_port": 0,
        "ipu_id": ipu_id,
        "ipu_index": ipu_index(ipu_id),
        "position": position,
    }


def ipuof_config(
    *, partition: str, own: Sequence[str], gcds: int, gcd: int, machine_type: str
) -> dict[str, object]:
    """The IPUoF configuration of GCD `gcd` of a partition, whose IPUs are `own` (`gcd_ipus`).

    `ipus` lists the GCD's IPUs in device-set order; `devices` the device ids a program may open on
    them (0 .. n-1 single IPUs, then the groups), so `gc-info` and `gc-monitor` number them alike."""
    return {
        "ipuof_config_version": IPUOF_CONFIG_VERSION,
        "partition_id": partition,
        "gcd_id": gcd,
        "num_gcds": gcds,
        "num_ipus": len(own),
        "target": target(machine_type),
        "board_type": BOARD_TYPES[MachineType(machine_type)],
        "ipus": [ipuof_device(ipu, i) for i, ipu in enumerate(own)],
        "devices": [{"id": d.id, "ipus": list(d.ipus)} for d in devices(len(own))],
    }


def ipu_attributes(ipu_id: str, machine_type: str) -> dict[str, str]:
    """The fixed attributes of one IPU, with `gc-info --device-info`'s attribute names.

    Only what the machine-type registry knows is given; what an emulated IPU has not got (serial
    numbers, firmware, temperatures, power) is left out rather than made up."""
    machine = MACHINES[MachineType(machine_type)]
    kind = MachineType(machine_type)
    return {
        "board ipu index": str(ipu_index(ipu_id)),
        "board type": BOARD_TYPES[kind],
        "board variant": BOARD_TYPES[kind],
        "clock": f"{machine.clock_hz / 1e6:.0f}MHz",
        "ipu architecture": ARCHITECTURES[kind],
        "chip": machine.chip,
        "tiles": str(machine.tiles_per_ipu),
        "in-processor memory": machine.sram_label,
        "target": target(machine_type),
        "machine": machine_of(ipu_id),
        "ipu": ipu_id,
    }
