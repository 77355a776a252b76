"""The machine types the emulator times, as the registry (``vipu/machine_types.py``) describes them.

The emulator keeps no figures of its own: chips, links and streaming memory are read from the one
registry every layer uses, so a new machine type is emulated as soon as it is described there.
"""

from __future__ import annotations

from vipu.machine_types import BOW_CLOCK_RATIO, GBIT, MACHINES, MAX_PARTITION, Machine, get_machine

POD64_IPUS = 64
MAX_IPUS = MAX_PARTITION

__all__ = ["BOW_CLOCK_RATIO", "GBIT", "MACHINES", "MAX_IPUS", "POD64_IPUS", "Machine", "get_machine"]
