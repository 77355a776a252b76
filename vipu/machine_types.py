"""The machine-type registry: every kind of IPU hardware the cloud runs, described once.

Each entry says what a machine type is made of (its chip, the machine that holds the chips, how
machines are arranged in racks or servers, how the IPUs are linked, whether there is streaming
memory) and what an IPU-hour of it costs by default. Topology, partition rules, the allocator, the
emulator, the scheduler, the API schemas, the CLI and the dashboard all read this module; adding a
machine type means adding one member to ``MachineType`` and one ``Machine`` to ``MACHINES`` here.

Figures come from ``docs/hardware.md`` (the project's copy of the public datasheets it is built on).
Where that page gives no figure, the value is derived and the derivation is written beside it.

Layouts (``LAYOUTS``) are the units the fleet is built of:

- ``pod64``: an IPU-POD64, 16 machines of 4 IPUs whose IPU-Links V-IPU presents as one ring of 64
  that wraps from machine 15 to machine 0; whole POD64s join over GW-Links into larger partitions.
- ``pod16``: an IPU-POD16, 4 machines of 4 IPUs cabled in a line. Nothing published says the line
  wraps, so a window of machines never does; a POD16 is not joined to others.
- ``server``: a PCIe IPU server (Dell EMC DSS 8440, Inspur NF5568M5): 8 C2 cards, 16 first-generation
  IPUs in a ladder of IPU-Link cables, acquired in the aligned groups ``gc-info`` lists (1, 2, 4, 8,
  16). There is no IPU-Link or GW-Link between servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class MachineType(StrEnum):
    M2000 = "m2000"
    BOW = "bow"
    C2 = "c2"


GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True, slots=True)
class Layout:
    """How the IPUs of one unit of the fleet (a POD or a server) are arranged and may be carved.

    Inside a unit, IPU ``i`` of machine ``m`` sits at position ``m * ipus_per_machine + i``; the
    partition rules work on those positions in groups of four (pairs inside a group of four, whole
    groups above that), which is a machine of a POD and a quarter of a server.
    """

    name: str
    label: str
    machines: int
    ipus_per_machine: int
    wraps: bool
    """The IPU-Link ring closes: a window of machines may run from the last machine to the first."""
    aligned: bool
    """A partition of 4 or more IPUs starts at a multiple of its size (``gc-info``'s device groups)."""
    joins: bool
    """Whole units of one machine type join over GW-Links into partitions larger than one unit."""
    per_rack: int
    """How many of these a rack holds (a rack holds at most two POD64s; eight 4U servers)."""

    @property
    def ipus(self) -> int:
        return self.machines * self.ipus_per_machine


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            "pod64",
            "IPU-POD64",
            machines=16,
            ipus_per_machine=4,
            wraps=True,
            aligned=False,
            joins=True,
            per_rack=2,
        ),
        Layout(
            "pod16",
            "IPU-POD16",
            machines=4,
            ipus_per_machine=4,
            wraps=False,
            aligned=False,
            joins=False,
            per_rack=1,
        ),
        Layout(
            "server",
            "IPU server",
            machines=1,
            ipus_per_machine=16,
            wraps=False,
            aligned=True,
            joins=False,
            per_rack=8,
        ),
    )
}

LinkTopology = Literal["torus", "ladder"]
HostAttach = Literal["gateway", "pcie"]

# One host call (``engine.run`` of one batch, as an inference server makes it) costs the host
# runtime's own work plus the host-device synchronisations of the run, each one round trip over
# the machine's host attachment (see ``Machine.host_call_s``; docs/hardware.md, "Host attachment").
# Neither figure is published: both are first-principles assumptions. The runtime's share is a
# few thread hand-offs on the host (queue the run, wake the thread that services the device, wake
# the caller), each of the order of 10 us on Linux. The syncs: the run's start, its input stream,
# its output stream and its completion.
HOST_RUNTIME_S = 50e-6
HOST_SYNCS_PER_CALL = 4


@dataclass(frozen=True, slots=True)
class Machine:
    """One machine type: chip, machine, layouts, links, streaming memory and default rate.

    The emulator reads the chip and link figures; the topology reads ``layouts`` and ``models``; the
    scheduler and metering read ``rate``.
    """

    type: MachineType
    product: str
    chip: str
    generation: str
    ipus_per_machine: int
    """IPUs in the product that holds the chips: an IPU-M2000 or Bow-2000 blade, a C2 card."""
    tiles_per_ipu: int
    threads_per_tile: int
    tile_memory_bytes: int
    sram_label: str
    """In-Processor-Memory per IPU as the datasheet writes it ("900 MB" for 1,472 x 624 KiB)."""
    clock_hz: float
    fp16_flops: float
    """Peak FP16.16 FLOP/s of one IPU on its matrix units (AMP)."""
    fp32_flops: float
    exchange_bytes_per_s: float
    """Tile-to-tile exchange bandwidth inside one IPU."""
    inter_ipu_exchange_bytes_per_s: float | None
    """Published aggregate exchange bandwidth between IPUs where one is (kept for the catalogue; the
    timing model charges inter-IPU traffic to the IPU-Link figures, the narrower pipe)."""
    ipu_links_per_ipu: int
    ipu_link_bytes_per_s: float
    """Bandwidth of one IPU-Link."""
    ipu_link_port_bytes_per_s: float | None
    """The datasheet's per-port IPU-Link figure between machines, where one is published (Bow-2000)."""
    link_topology: LinkTopology
    """``torus``: the POD's IPU-Link torus, presented as a ring; ``ladder``: C2 cards in a chassis."""
    card_twin_bytes_per_s: float | None
    """Ladder only: IPU-Link bandwidth between the two IPUs of one card, both directions."""
    card_to_card_bytes_per_s: float | None
    """Ladder only: IPU-Link bandwidth between neighbouring cards, both directions."""
    gw_links_per_machine: int
    gw_link_bytes_per_s: float
    """Bandwidth of one GW-Link (100 GbE), the only path between POD64s; 0 when there are none."""
    streaming_memory_bytes: int
    """Gateway DDR per machine, where optimizer state can live off-chip; 0 when there is none."""
    offchip_store: str
    """Where off-chip optimizer state lives: the gateway's streaming memory, or the host's memory."""
    host_link_bytes_per_s: float
    """PCIe per IPU, both directions together (half each way)."""
    host_attach: HostAttach
    """How the host server reaches the IPUs: ``gateway`` (host -> RoCEv2 over 100 GbE -> the
    machine's gateway -> PCIe -> IPU: IPU-M2000, Bow-2000) or ``pcie`` (cards in the host's own PCIe
    slots: C2)."""
    host_network_bytes_per_s: float
    """Gateway-attached only: the host network's bandwidth into one machine, each way (shared by
    its IPUs); 0 for PCIe cards, whose host link is ``host_link_bytes_per_s``."""
    host_round_trip_s: float
    """One host-device synchronisation: a round trip from the host to an IPU and back."""
    layouts: tuple[str, ...]
    """The units (``LAYOUTS``) this type comes in; the first is the default."""
    models: tuple[str, ...]
    """Server models of a ``server`` layout, the first being the default; empty for PODs."""
    rate: float
    """Default grant units per IPU-hour (a plan may set its own); 1.0 is an IPU-M2000 IPU-hour."""

    @property
    def sram_bytes(self) -> int:
        """In-Processor-Memory of one IPU (GC200: 1,472 x 624 KiB = 940,572,672 bytes, "900 MB")."""
        return self.tiles_per_ipu * self.tile_memory_bytes

    @property
    def ipu_link_bytes_per_s_per_ipu(self) -> float:
        return self.ipu_links_per_ipu * self.ipu_link_bytes_per_s

    @property
    def gw_link_bytes_per_s_per_machine(self) -> float:
        return self.gw_links_per_machine * self.gw_link_bytes_per_s

    @property
    def has_streaming_memory(self) -> bool:
        return self.streaming_memory_bytes > 0

    @property
    def max_partition(self) -> int:
        """The largest partition this type can ever form: whole joined units, or one unit."""
        sizes = [LAYOUTS[name].ipus * (MAX_UNITS if LAYOUTS[name].joins else 1) for name in self.layouts]
        return min(MAX_PARTITION, max(sizes))

    def neighbour_link_bytes_per_s(self, ipus: int, *, ring: bool) -> float:
        """IPU-Link bandwidth (both directions) between an IPU and its neighbour in a chain over
        ``ipus`` IPUs: a pipeline hand-over (``ring`` False) or one hop of a ring all-reduce.

        Torus (POD64, POD16): all of the IPU's links, whichever the chain (the timing model sends
        over half of them towards each neighbour). Ladder (C2 server): within one card the twin links;
        past one card the card-to-card links, and a ring crosses every card boundary twice (up one
        rail of the ladder and down the other), so each crossing has half of them.
        """
        if self.link_topology == "torus":
            return self.ipu_link_bytes_per_s_per_ipu
        assert self.card_twin_bytes_per_s is not None and self.card_to_card_bytes_per_s is not None
        if ipus <= 2:
            return self.card_twin_bytes_per_s
        return self.card_to_card_bytes_per_s / 2.0 if ring else self.card_to_card_bytes_per_s

    @property
    def host_call_s(self) -> float:
        """Overhead of one host call that runs one batch (serving: nothing to amortise it over)."""
        return HOST_RUNTIME_S + HOST_SYNCS_PER_CALL * self.host_round_trip_s

    @property
    def serving_host_bytes_per_s(self) -> float:
        """Host data one IPU can send or receive, each way, while every IPU of its machine does too:
        its PCIe link's one-way half, or its share of the machine's host network when that is the
        narrower pipe (a gateway-attached machine)."""
        pcie = self.host_link_bytes_per_s / 2.0
        if self.host_attach == "pcie":
            return pcie
        return min(pcie, self.host_network_bytes_per_s / self.ipus_per_machine)

    def peak_flops(self, precision: str) -> float:
        return self.fp16_flops if precision == "fp16" else self.fp32_flops

    def amp_macs_per_cycle_per_tile(self, precision: str) -> float:
        """Multiply-accumulates per cycle of one tile's AMP unit, derived from peak FLOP/s.

        GC200: 250e12 / (2 x 1,472 x 1.33e9) = 63.8, i.e. 64 FP16 MACs per cycle; 16 in FP32.
        GC2: 124.5e12 / (2 x 1,216 x 1.6e9) = 32 FP16 MACs per cycle; 8 in FP32.
        """
        return self.peak_flops(precision) / (2.0 * self.tiles_per_ipu * self.clock_hz)

    def vector_lanes(self, precision: str) -> int:
        """Elements per cycle per tile through the vector (non-AMP) path.

        Not a published figure: a tile loads 64 bits per cycle, so a streaming element-wise operation
        moves 4 FP16 or 2 FP32 elements per cycle (the f16v4 / f32v2 instructions). Both generations
        have 64-bit tile loads.
        """
        return 4 if precision == "fp16" else 2

    def to_dict(self) -> dict[str, object]:
        return {
            "type": self.type.value,
            "product": self.product,
            "chip": self.chip,
            "generation": self.generation,
            "ipus_per_machine": self.ipus_per_machine,
            "tiles_per_ipu": self.tiles_per_ipu,
            "threads_per_tile": self.threads_per_tile,
            "sram_bytes_per_ipu": self.sram_bytes,
            "clock_hz": self.clock_hz,
            "fp16_flops_per_ipu": self.fp16_flops,
            "fp32_flops_per_ipu": self.fp32_flops,
            "exchange_bytes_per_s": self.exchange_bytes_per_s,
            "inter_ipu_exchange_bytes_per_s": self.inter_ipu_exchange_bytes_per_s,
            "ipu_link_bytes_per_s_per_ipu": self.ipu_link_bytes_per_s_per_ipu,
            "ipu_link_port_bytes_per_s": self.ipu_link_port_bytes_per_s,
            "link_topology": self.link_topology,
            "gw_link_bytes_per_s_per_machine": self.gw_link_bytes_per_s_per_machine,
            "streaming_memory_bytes_per_machine": self.streaming_memory_bytes,
            "offchip_store": self.offchip_store,
            "host_link_bytes_per_s_per_ipu": self.host_link_bytes_per_s,
            "host_attach": self.host_attach,
            "host_network_bytes_per_s_per_machine": self.host_network_bytes_per_s,
            "host_round_trip_s": self.host_round_trip_s,
            "host_call_s": self.host_call_s,
            "layouts": list(self.layouts),
            "models": list(self.models),
            "max_partition": self.max_partition,
            "rate": self.rate,
        }


MAX_UNITS = 1024  # PODs and servers in one fleet (1,024 POD64s are Graphcore's largest system)
MAX_PARTITION = 65_536

_GC200_CLOCK = 1.33e9
_BOW_CLOCK = 1.85e9
# The Bow IPU is the GC200 logic die at a higher clock: clock-bound figures scale by this ratio.
BOW_CLOCK_RATIO = _BOW_CLOCK / _GC200_CLOCK
_GC2_CLOCK = 1.6e9

M2000 = Machine(
    type=MachineType.M2000,
    product="IPU-M2000",
    chip="GC200 (Colossus Mk2)",
    generation="second",
    ipus_per_machine=4,
    tiles_per_ipu=1472,
    threads_per_tile=6,
    tile_memory_bytes=624 * 1024,
    sram_label="900 MB",
    clock_hz=_GC200_CLOCK,
    fp16_flops=250e12,
    fp32_flops=62.5e12,
    exchange_bytes_per_s=47e12,
    inter_ipu_exchange_bytes_per_s=8e12,
    ipu_links_per_ipu=10,
    # 10 links, 320 GB/s per IPU -> 32 GB/s (256 Gbit/s) per link.
    ipu_link_bytes_per_s=320e9 / 10,
    ipu_link_port_bytes_per_s=None,
    link_topology="torus",
    card_twin_bytes_per_s=None,
    card_to_card_bytes_per_s=None,
    gw_links_per_machine=2,
    gw_link_bytes_per_s=100 * GBIT,
    streaming_memory_bytes=448 * 10**9,
    offchip_store="streaming memory",
    host_link_bytes_per_s=64e9,
    host_attach="gateway",
    # One 100 Gbit/s RoCEv2 link's worth per machine (the machine's Ethernet speed; docs/hardware.md).
    host_network_bytes_per_s=100 * GBIT,
    # Host NIC, a 100 GbE switch, the gateway and its PCIe to the IPU: the path a GW-Link hop takes
    # through one gateway and switch (timing.GW_LINK_HOP_S, 10 us), an assumption of the same order.
    host_round_trip_s=10e-6,
    layouts=("pod64", "pod16"),
    models=(),
    rate=1.0,
)

BOW = Machine(
    type=MachineType.BOW,
    product="Bow-2000",
    chip="Bow IPU",
    generation="second",
    ipus_per_machine=4,
    tiles_per_ipu=1472,
    threads_per_tile=6,
    tile_memory_bytes=624 * 1024,
    sram_label="900 MB",
    clock_hz=_BOW_CLOCK,
    fp16_flops=350e12,
    # No published figure: GC200's 62.5 TFLOP/s x the clock ratio (86.9 TFLOP/s; the same as 350 / 4,
    # the FP16:FP32 ratio of the GC200, to within 1%).
    fp32_flops=62.5e12 * BOW_CLOCK_RATIO,
    # The exchange is clocked with the tiles, so its bandwidth scales with the clock (65.4 TB/s).
    exchange_bytes_per_s=47e12 * BOW_CLOCK_RATIO,
    # Off-chip traffic is link-bound, not clock-bound: no published change, so the GC200 figure.
    inter_ipu_exchange_bytes_per_s=8e12,
    ipu_links_per_ipu=10,
    # The Bow IPU is the GC200 die with the same ten IPU-Links, and links are not clock-bound, so the
    # per-IPU figure stays 320 GB/s. The datasheet's "IPU-Link 512 Gbit/s" is the Bow-2000's per-port
    # figure between machines; reading it as a per-link rate would double the links (640 GB/s) and
    # let communication-bound jobs gain more than the 40% Graphcore claims for Bow over M2000.
    ipu_link_bytes_per_s=320e9 / 10,
    ipu_link_port_bytes_per_s=512 * GBIT,
    link_topology="torus",
    card_twin_bytes_per_s=None,
    card_to_card_bytes_per_s=None,
    gw_links_per_machine=2,
    gw_link_bytes_per_s=100 * GBIT,
    streaming_memory_bytes=256 * 10**9,
    offchip_store="streaming memory",
    host_link_bytes_per_s=64e9,
    # The Bow-2000 keeps the IPU-M2000's gateway and host attachment.
    host_attach="gateway",
    host_network_bytes_per_s=100 * GBIT,
    host_round_trip_s=10e-6,
    layouts=("pod64", "pod16"),
    models=(),
    # Its peak FP16 over the GC200's (350 / 250): what an hour of it is worth to a compute-bound job.
    rate=1.4,
)

C2 = Machine(
    type=MachineType.C2,
    product="C2 PCIe card",
    chip="GC2 (Colossus Mk1)",
    generation="first",
    ipus_per_machine=2,
    tiles_per_ipu=1216,
    threads_per_tile=6,
    tile_memory_bytes=256 * 1024,  # 1,216 x 256 KiB = 304 MiB per IPU
    sram_label="304 MB",
    clock_hz=_GC2_CLOCK,
    # 1,216 tiles x 1.6 GHz x 64 flop per cycle (FP16 with FP32 accumulation); FP32 a quarter of it.
    fp16_flops=124.5e12,
    fp32_flops=31.1e12,
    exchange_bytes_per_s=7.8e12,
    inter_ipu_exchange_bytes_per_s=None,
    # 80 lanes x 32 Gbit/s = 2,560 Gbit/s = 320 GB/s per chip, in ten links of 32 GB/s as on GC200.
    ipu_links_per_ipu=10,
    ipu_link_bytes_per_s=80 * 32 * GBIT / 10,
    ipu_link_port_bytes_per_s=None,
    link_topology="ladder",
    card_twin_bytes_per_s=192e9,
    card_to_card_bytes_per_s=128e9,
    gw_links_per_machine=0,
    gw_link_bytes_per_s=0.0,
    streaming_memory_bytes=0,
    offchip_store="host memory",
    # PCIe x8 per IPU. The servers' Xeon hosts of that generation are PCIe Gen3: 8 GT/s x 8 lanes is
    # about 8 GB/s each way, 16 GB/s both (the GC200's Gen4 x16, 64 GB/s, is four times that).
    host_link_bytes_per_s=16e9,
    host_attach="pcie",
    host_network_bytes_per_s=0.0,
    # A PCIe read round trip from the host's root complex to the card and back: about 1 us (an
    # assumption of the order PCIe Gen3 devices show; no IPU figure is published).
    host_round_trip_s=1e-6,
    layouts=("server",),
    models=("dss8440", "nf5568m5"),
    # Its peak FP16 over the GC200's (124.5 / 250).
    rate=0.5,
)

MACHINES: dict[MachineType, Machine] = {machine.type: machine for machine in (M2000, BOW, C2)}
assert tuple(MACHINES) == tuple(MachineType), "every machine type has exactly one entry, in order"

# Server models and their product names (both hold 8 C2 cards; see docs/hardware.md).
SERVER_MODELS: dict[str, str] = {"dss8440": "Dell EMC DSS 8440", "nf5568m5": "Inspur NF5568M5"}
assert all(model in SERVER_MODELS for machine in MACHINES.values() for model in machine.models)

# Partition rules are chosen per machine type, so all layouts of one type carve alike.
assert all(len({LAYOUTS[name].aligned for name in m.layouts}) == 1 for m in MACHINES.values())
ALIGNED_TYPES = frozenset(kind for kind, m in MACHINES.items() if LAYOUTS[m.layouts[0]].aligned)

MACHINE_TYPE_NAMES: tuple[str, ...] = tuple(kind.value for kind in MachineType)


def get_machine(machine_type: str) -> Machine:
    try:
        return MACHINES[MachineType(machine_type)]
    except ValueError:
        raise ValueError(
            f"unknown machine type {machine_type!r}; expected one of {', '.join(MACHINE_TYPE_NAMES)}"
        ) from None


def default_rates() -> dict[str, float]:
    """Grant units per IPU-hour of each type, before any plan sets its own."""
    return {kind.value: machine.rate for kind, machine in MACHINES.items()}


def layouts_of(machine_type: str) -> tuple[Layout, ...]:
    return tuple(LAYOUTS[name] for name in get_machine(machine_type).layouts)
