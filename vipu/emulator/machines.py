"""The two IPU machine types the cloud emulates, from the published specifications.

Every figure comes from ``reference/ipu-hardware.md`` (Graphcore's GC200 / IPU-M2000 and Bow IPU /
Bow-2000 datasheets). Where that file gives no figure for the Bow IPU, the value is derived from the
GC200 figure and the clock ratio 1,850 / 1,330 MHz, because the Bow IPU is the same Colossus Mk2 logic
die clocked higher (its FP16 figure, 350 vs 250 TFLOP/s, is exactly that ratio: 250 x 1.391 = 347.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MachineType = Literal["m2000", "bow"]

GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True, slots=True)
class Machine:
    """One IPU machine type: a 1U blade of four IPUs with its gateway, links and streaming memory."""

    type: MachineType
    product: str
    chip: str
    ipus_per_machine: int
    tiles_per_ipu: int
    threads_per_tile: int
    tile_memory_bytes: int
    clock_hz: float
    fp16_flops: float
    """Peak FP16.16 FLOP/s of one IPU on its matrix units (AMP)."""
    fp32_flops: float
    exchange_bytes_per_s: float
    """Tile-to-tile exchange bandwidth inside one IPU."""
    inter_ipu_exchange_bytes_per_s: float
    """Published aggregate exchange bandwidth between IPUs (kept for the catalogue; the timing model
    charges inter-IPU traffic to the per-IPU IPU-Link figure, the narrower pipe)."""
    ipu_links_per_ipu: int
    ipu_link_bytes_per_s: float
    """Bandwidth of one IPU-Link."""
    ipu_link_port_bytes_per_s: float | None
    """The datasheet's per-port IPU-Link figure between machines, where one is published (Bow-2000)."""
    gw_links_per_machine: int
    gw_link_bytes_per_s: float
    """Bandwidth of one GW-Link (100 GbE), the only path between POD64s."""
    streaming_memory_bytes: int
    """Gateway DDR per machine, where optimizer state can live off-chip."""
    host_link_bytes_per_s: float
    """PCIe Gen4 x16 per IPU, both directions together (half each way)."""

    @property
    def sram_bytes(self) -> int:
        """In-Processor-Memory of one IPU: 1,472 tiles x 624 KiB = 940,572,672 bytes, Graphcore's "900 MB"."""
        return self.tiles_per_ipu * self.tile_memory_bytes

    @property
    def ipu_link_bytes_per_s_per_ipu(self) -> float:
        return self.ipu_links_per_ipu * self.ipu_link_bytes_per_s

    @property
    def gw_link_bytes_per_s_per_machine(self) -> float:
        return self.gw_links_per_machine * self.gw_link_bytes_per_s

    def peak_flops(self, precision: str) -> float:
        return self.fp16_flops if precision == "fp16" else self.fp32_flops

    def amp_macs_per_cycle_per_tile(self, precision: str) -> float:
        """Multiply-accumulates per cycle of one tile's AMP unit, derived from peak FLOP/s.

        GC200: 250e12 / (2 x 1,472 x 1.33e9) = 63.8, i.e. 64 FP16 MACs per cycle; 16 in FP32.
        """
        return self.peak_flops(precision) / (2.0 * self.tiles_per_ipu * self.clock_hz)

    def vector_lanes(self, precision: str) -> int:
        """Elements per cycle per tile through the vector (non-AMP) path.

        Not a published figure: a tile loads 64 bits per cycle, so a streaming element-wise operation
        moves 4 FP16 or 2 FP32 elements per cycle (the f16v4 / f32v2 instructions).
        """
        return 4 if precision == "fp16" else 2

    def to_dict(self) -> dict[str, object]:
        return {
            "type": self.type,
            "product": self.product,
            "chip": self.chip,
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
            "gw_link_bytes_per_s_per_machine": self.gw_link_bytes_per_s_per_machine,
            "streaming_memory_bytes_per_machine": self.streaming_memory_bytes,
            "host_link_bytes_per_s_per_ipu": self.host_link_bytes_per_s,
        }


_GC200_CLOCK = 1.33e9
_BOW_CLOCK = 1.85e9
# The Bow IPU is the GC200 logic die at a higher clock: clock-bound figures scale by this ratio.
BOW_CLOCK_RATIO = _BOW_CLOCK / _GC200_CLOCK

M2000 = Machine(
    type="m2000",
    product="IPU-M2000",
    chip="GC200 (Colossus Mk2)",
    ipus_per_machine=4,
    tiles_per_ipu=1472,
    threads_per_tile=6,
    tile_memory_bytes=624 * 1024,
    clock_hz=_GC200_CLOCK,
    fp16_flops=250e12,
    fp32_flops=62.5e12,
    exchange_bytes_per_s=47e12,
    inter_ipu_exchange_bytes_per_s=8e12,
    ipu_links_per_ipu=10,
    # 10 links, 320 GB/s per IPU (reference) -> 32 GB/s (256 Gbit/s) per link.
    ipu_link_bytes_per_s=320e9 / 10,
    ipu_link_port_bytes_per_s=None,
    gw_links_per_machine=2,
    gw_link_bytes_per_s=100 * GBIT,
    streaming_memory_bytes=448 * 10**9,
    host_link_bytes_per_s=64e9,
)

BOW = Machine(
    type="bow",
    product="Bow-2000",
    chip="Bow IPU",
    ipus_per_machine=4,
    tiles_per_ipu=1472,
    threads_per_tile=6,
    tile_memory_bytes=624 * 1024,
    clock_hz=_BOW_CLOCK,
    fp16_flops=350e12,
    # No published figure in the reference: GC200's 62.5 TFLOP/s x the clock ratio (86.9 TFLOP/s; the
    # same as 350 / 4, the FP16:FP32 ratio of the GC200, to within 1%).
    fp32_flops=62.5e12 * BOW_CLOCK_RATIO,
    # The exchange is clocked with the tiles, so its bandwidth scales with the clock (65.4 TB/s).
    exchange_bytes_per_s=47e12 * BOW_CLOCK_RATIO,
    # Off-chip traffic is link-bound, not clock-bound: no published change, so the GC200 figure.
    inter_ipu_exchange_bytes_per_s=8e12,
    ipu_links_per_ipu=10,
    # The Bow IPU is the GC200 die with the same ten IPU-Links, and links are not clock-bound, so the
    # per-IPU figure stays 320 GB/s. The reference's "IPU-Link 512 Gbit/s" is the Bow-2000 datasheet's
    # per-port figure between machines; reading it as a per-link rate would double the links (640 GB/s)
    # and let communication-bound jobs gain more than the 40% Graphcore claims for Bow over M2000.
    ipu_link_bytes_per_s=320e9 / 10,
    ipu_link_port_bytes_per_s=512 * GBIT,
    gw_links_per_machine=2,
    gw_link_bytes_per_s=100 * GBIT,
    streaming_memory_bytes=256 * 10**9,
    host_link_bytes_per_s=64e9,
)

MACHINES: dict[str, Machine] = {"m2000": M2000, "bow": BOW}

POD64_IPUS = 64
MAX_IPUS = 65_536


def get_machine(machine_type: str) -> Machine:
    try:
        return MACHINES[machine_type]
    except KeyError:
        raise ValueError(f"unknown machine type {machine_type!r}; expected one of {sorted(MACHINES)}")
