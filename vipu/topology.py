"""The fleet: racks, IPU-POD64s, machines and IPUs, their stable ids and the links between them.

A cluster is a row of POD64s. Rack ``r`` holds pods ``2r`` and ``2r + 1`` (a rack holds at most two
POD64s). A POD64 is 16 machines of one type (IPU-M2000 or Bow-2000), each with 4 IPUs. Inside a POD64
the IPU-Links form a 2D torus that V-IPU presents as one ring of 64 IPUs: machine ``m``'s IPU ``i`` sits
at ring position ``m * 4 + i``, and machine 15 is linked back to machine 0. POD64s are joined to one
another by GW-Links through their machines' gateways.

Everything here is immutable and cheap; nothing does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache


class MachineType(StrEnum):
    M2000 = "m2000"
    BOW = "bow"


class Health(StrEnum):
    UP = "up"
    DRAINING = "draining"
    FAILED = "failed"


MACHINES_PER_POD = 16
IPUS_PER_MACHINE = 4
IPUS_PER_POD = MACHINES_PER_POD * IPUS_PER_MACHINE
PODS_PER_RACK = 2
MAX_PODS = 1024
MAX_IPUS = MAX_PODS * IPUS_PER_POD

_POD_RE = re.compile(r"pod(\d{4})")
_RACK_RE = re.compile(r"rack(\d{4})")
_MACHINE_RE = re.compile(r"pod(\d{4})-m(\d{2})")
_IPU_RE = re.compile(r"pod(\d{4})-m(\d{2})-i(\d)")


def _check_pod(pod: int) -> None:
    if not 0 <= pod < MAX_PODS:
        raise ValueError(f"pod index {pod} is outside 0..{MAX_PODS - 1}")


def _check_machine(machine: int) -> None:
    if not 0 <= machine < MACHINES_PER_POD:
        raise ValueError(f"machine index {machine} is outside 0..{MACHINES_PER_POD - 1}")


def _check_ipu(ipu: int) -> None:
    if not 0 <= ipu < IPUS_PER_MACHINE:
        raise ValueError(f"IPU index {ipu} is outside 0..{IPUS_PER_MACHINE - 1}")


def pod_id(pod: int) -> str:
    _check_pod(pod)
    return f"pod{pod:04d}"


def rack_id(rack: int) -> str:
    if not 0 <= rack < MAX_PODS // PODS_PER_RACK:
        raise ValueError(f"rack index {rack} is outside 0..{MAX_PODS // PODS_PER_RACK - 1}")
    return f"rack{rack:04d}"


def machine_id(pod: int, machine: int) -> str:
    _check_pod(pod)
    _check_machine(machine)
    return f"pod{pod:04d}-m{machine:02d}"


@lru_cache(maxsize=1024)
def pod_ipu_ids(pod: int) -> tuple[str, ...]:
    """The 64 IPU ids of one pod in ring order; cached because placements slice it constantly."""
    _check_pod(pod)
    return tuple(
        f"pod{pod:04d}-m{machine:02d}-i{ipu}"
        for machine in range(MACHINES_PER_POD)
        for ipu in range(IPUS_PER_MACHINE)
    )


def ipu_id(pod: int, machine: int, ipu: int) -> str:
    _check_machine(machine)
    _check_ipu(ipu)
    return pod_ipu_ids(pod)[machine * IPUS_PER_MACHINE + ipu]


def _match(pattern: re.Pattern[str], text: object, kind: str) -> re.Match[str]:
    if not isinstance(text, str):
        raise ValueError(f"{kind} id must be a string, got {type(text).__name__}")
    found = pattern.fullmatch(text)
    if found is None:
        raise ValueError(f"malformed {kind} id {text!r}")
    return found


def parse_pod_id(text: str) -> int:
    """``"pod0003"`` -> ``3``."""
    pod = int(_match(_POD_RE, text, "pod").group(1))
    _check_pod(pod)
    return pod


def parse_rack_id(text: str) -> int:
    """``"rack0001"`` -> ``1``."""
    rack = int(_match(_RACK_RE, text, "rack").group(1))
    rack_id(rack)
    return rack


def parse_machine_id(text: str) -> tuple[int, int]:
    """``"pod0003-m07"`` -> ``(3, 7)``."""
    found = _match(_MACHINE_RE, text, "machine")
    pod, machine = int(found.group(1)), int(found.group(2))
    _check_pod(pod)
    _check_machine(machine)
    return pod, machine


def parse_ipu_id(text: str) -> tuple[int, int, int]:
    """``"pod0003-m07-i2"`` -> ``(3, 7, 2)``."""
    found = _match(_IPU_RE, text, "IPU")
    pod, machine, ipu = int(found.group(1)), int(found.group(2)), int(found.group(3))
    _check_pod(pod)
    _check_machine(machine)
    _check_ipu(ipu)
    return pod, machine, ipu


def ring_position(machine: int, ipu: int) -> int:
    """Where an IPU sits on its POD64's IPU-Link ring (0..63)."""
    _check_machine(machine)
    _check_ipu(ipu)
    return machine * IPUS_PER_MACHINE + ipu


def ring_distance(pos_a: int, pos_b: int) -> int:
    """IPU-Link hops between two ring positions of one POD64, going the short way round."""
    for pos in (pos_a, pos_b):
        if not 0 <= pos < IPUS_PER_POD:
            raise ValueError(f"ring position {pos} is outside 0..{IPUS_PER_POD - 1}")
    gap = abs(pos_a - pos_b)
    return min(gap, IPUS_PER_POD - gap)


def rack_of_pod(pod: int) -> int:
    _check_pod(pod)
    return pod // PODS_PER_RACK


def pods_of(ipu_ids: Iterable[str]) -> tuple[int, ...]:
    """The distinct pods the IPUs live in, ascending."""
    return tuple(sorted({parse_ipu_id(ipu)[0] for ipu in ipu_ids}))


def racks_of(ipu_ids: Iterable[str]) -> tuple[int, ...]:
    return tuple(sorted({rack_of_pod(pod) for pod in pods_of(ipu_ids)}))


def machines_of(ipu_ids: Iterable[str]) -> tuple[str, ...]:
    """The distinct machine ids the IPUs live in, ascending."""
    return tuple(sorted({machine_id(*parse_ipu_id(ipu)[:2]) for ipu in ipu_ids}))


def spans_gw_links(ipu_ids: Iterable[str]) -> bool:
    """True when traffic between these IPUs must cross GW-Links (they sit in more than one POD64)."""
    return len(pods_of(ipu_ids)) > 1


@dataclass(frozen=True, slots=True, init=False)
class Fleet:
    """An immutable description of the hardware: one machine type per POD64, pods numbered from 0."""

    pod_types: tuple[MachineType, ...]

    def __init__(self, pod_types: Sequence[MachineType | str]) -> None:
        if isinstance(pod_types, str):
            raise TypeError("pod_types is a sequence of machine types, not one string")
        types = tuple(MachineType(kind) for kind in pod_types)
        if len(types) > MAX_PODS:
            raise ValueError(f"a fleet holds at most {MAX_PODS} POD64s ({MAX_IPUS} IPUs), got {len(types)}")
        object.__setattr__(self, "pod_types", types)

    @classmethod
    def uniform(cls, pods: int, machine_type: MachineType | str = MachineType.M2000) -> Fleet:
        if pods < 0:
            raise ValueError(f"pod count must not be negative, got {pods}")
        return cls([MachineType(machine_type)] * pods)

    @property
    def pods(self) -> int:
        return len(self.pod_types)

    @property
    def racks(self) -> int:
        return (self.pods + PODS_PER_RACK - 1) // PODS_PER_RACK

    @property
    def machines(self) -> int:
        return self.pods * MACHINES_PER_POD

    @property
    def ipus(self) -> int:
        return self.pods * IPUS_PER_POD

    @property
    def machine_types(self) -> tuple[MachineType, ...]:
        """The machine types present, in declaration order of MachineType."""
        present = set(self.pod_types)
        return tuple(kind for kind in MachineType if kind in present)

    def has_pod(self, pod: int) -> bool:
        return 0 <= pod < self.pods

    def machine_type_of(self, pod: int) -> MachineType:
        if not self.has_pod(pod):
            raise ValueError(f"{pod_id(pod)} is not in this fleet of {self.pods} pods")
        return self.pod_types[pod]

    def machine_type_of_ipu(self, ipu: str) -> MachineType:
        return self.machine_type_of(parse_ipu_id(ipu)[0])

    def pods_of_type(self, machine_type: MachineType | str) -> tuple[int, ...]:
        kind = MachineType(machine_type)
        return tuple(pod for pod, pod_type in enumerate(self.pod_types) if pod_type is kind)

    def pod_ids(self) -> tuple[str, ...]:
        return tuple(pod_id(pod) for pod in range(self.pods))

    def rack_ids(self) -> tuple[str, ...]:
        return tuple(rack_id(rack) for rack in range(self.racks))

    def machine_ids(self) -> Iterator[str]:
        for pod in range(self.pods):
            for machine in range(MACHINES_PER_POD):
                yield machine_id(pod, machine)

    def ipu_ids(self) -> Iterator[str]:
        for pod in range(self.pods):
            yield from pod_ipu_ids(pod)

    def check_ipu(self, ipu: str) -> tuple[int, int, int]:
        """Parse an IPU id and make sure this fleet has it."""
        pod, machine, index = parse_ipu_id(ipu)
        if not self.has_pod(pod):
            raise ValueError(f"{ipu} is not in this fleet of {self.pods} pods")
        return pod, machine, index

    def check_machine(self, machine: str) -> tuple[int, int]:
        """Parse a machine id and make sure this fleet has it."""
        pod, index = parse_machine_id(machine)
        if not self.has_pod(pod):
            raise ValueError(f"{machine} is not in this fleet of {self.pods} pods")
        return pod, index
