"""The fleet: racks, units (POD64s, POD16s and IPU servers), machines and IPUs, their ids and links.

A fleet is a row of units numbered from 0, each of one machine type and one layout
(``vipu.machine_types.LAYOUTS``), each in a rack:

- a POD64 is 16 machines of 4 IPUs (IPU-M2000 or Bow-2000). Its IPU-Links form a 2D torus that
  V-IPU presents as one ring of 64: machine ``m``'s IPU ``i`` sits at ring position ``m * 4 + i``,
  and machine 15 is linked back to machine 0. POD64s are joined to one another by GW-Links through
  their machines' gateways. A rack holds at most two POD64s.
- a POD16 is 4 such machines, positions 0 to 15, in a line of IPU-Links.
- an IPU server (``c2``: a Dell EMC DSS 8440 or an Inspur NF5568M5) is one machine of 16 first-
  generation IPUs on 8 C2 cards, position = IPU number; no link leaves the server.

Ids: a POD is ``pod0003``, its machines ``pod0003-m07``, its IPUs ``pod0003-m07-i2``; a server is
``srv0004``, which is also its machine's id, and its IPUs are ``srv0004-i13``. A unit's index is the
number in its id, whatever its layout, so the index space is shared. A retired unit keeps its index
(its ids stay in the history) and is simply absent: a fleet holds ``None`` there.

Everything here is immutable and cheap; nothing does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from vipu.machine_types import LAYOUTS, MACHINES, MAX_PARTITION, MAX_UNITS, Layout, MachineType

__all__ = [
    "IPUS_PER_MACHINE",
    "IPUS_PER_POD",
    "MACHINES_PER_POD",
    "MAX_IPUS",
    "MAX_PODS",
    "PODS_PER_RACK",
    "Fleet",
    "Health",
    "MachineType",
    "Unit",
    "UnitGroup",
    "describe_fleet",
    "ipu_id",
    "machine_id",
    "machine_of_ipu",
    "machines_of",
    "parse_fleet_description",
    "parse_ipu_id",
    "parse_machine_id",
    "parse_pod_id",
    "parse_rack_id",
    "parse_unit_id",
    "pod_id",
    "pod_ipu_ids",
    "pods_of",
    "rack_id",
    "rack_of_pod",
    "racks_of",
    "ring_distance",
    "ring_position",
    "server_id",
    "server_ipu_ids",
    "spans_gw_links",
    "unit_id",
]


class Health(StrEnum):
    UP = "up"
    DRAINING = "draining"
    FAILED = "failed"


# The bitmap geometry every unit is mapped onto: 16 groups of 4 positions (a POD64's machines).
MACHINES_PER_POD = 16
IPUS_PER_MACHINE = 4
IPUS_PER_POD = MACHINES_PER_POD * IPUS_PER_MACHINE
PODS_PER_RACK = LAYOUTS["pod64"].per_rack
MAX_PODS = MAX_UNITS
MAX_IPUS = MAX_PARTITION
SERVER_IPUS = LAYOUTS["server"].ipus

_POD_RE = re.compile(r"pod(\d{4})")
_SERVER_RE = re.compile(r"srv(\d{4})")
_RACK_RE = re.compile(r"rack(\d{4})")
_MACHINE_RE = re.compile(r"pod(\d{4})-m(\d{2})")
_IPU_RE = re.compile(r"pod(\d{4})-m(\d{2})-i(\d)")
_SERVER_IPU_RE = re.compile(r"srv(\d{4})-i(\d{2})")


def _check_pod(pod: int) -> None:
    if not 0 <= pod < MAX_PODS:
        raise ValueError(f"unit index {pod} is outside 0..{MAX_PODS - 1}")


def _check_machine(machine: int) -> None:
    if not 0 <= machine < MACHINES_PER_POD:
        raise ValueError(f"machine index {machine} is outside 0..{MACHINES_PER_POD - 1}")


def _check_ipu(ipu: int) -> None:
    if not 0 <= ipu < IPUS_PER_MACHINE:
        raise ValueError(f"IPU index {ipu} is outside 0..{IPUS_PER_MACHINE - 1}")


def pod_id(pod: int) -> str:
    _check_pod(pod)
    return f"pod{pod:04d}"


def server_id(unit: int) -> str:
    _check_pod(unit)
    return f"srv{unit:04d}"


def rack_id(rack: int) -> str:
    if not 0 <= rack < MAX_UNITS:
        raise ValueError(f"rack index {rack} is outside 0..{MAX_UNITS - 1}")
    return f"rack{rack:04d}"


def machine_id(pod: int, machine: int) -> str:
    _check_machine(machine)
    return f"{pod_id(pod)}-m{machine:02d}"


@lru_cache(maxsize=1024)
def pod_ipu_ids(pod: int) -> tuple[str, ...]:
    """The 64 IPU ids of a POD64 in ring order (a POD16 has the first 16); cached because placements
    slice it constantly."""
    return tuple(
        f"{machine_id(pod, machine)}-i{ipu}"
        for machine in range(MACHINES_PER_POD)
        for ipu in range(IPUS_PER_MACHINE)
    )


@lru_cache(maxsize=1024)
def server_ipu_ids(unit: int) -> tuple[str, ...]:
    """The 16 IPU ids of a server, IPU 0 first (``gc-info``'s numbering)."""
    _check_pod(unit)
    return tuple(f"srv{unit:04d}-i{ipu:02d}" for ipu in range(SERVER_IPUS))


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


def parse_unit_id(text: str) -> int:
    """A POD's or a server's id -> its unit index: ``"pod0003"`` -> 3, ``"srv0004"`` -> 4."""
    if isinstance(text, str) and text.startswith("srv"):
        unit = int(_match(_SERVER_RE, text, "server").group(1))
        _check_pod(unit)
        return unit
    return parse_pod_id(text)


def parse_rack_id(text: str) -> int:
    """``"rack0001"`` -> ``1``."""
    rack = int(_match(_RACK_RE, text, "rack").group(1))
    rack_id(rack)
    return rack


def parse_machine_id(text: str) -> tuple[int, int]:
    """``"pod0003-m07"`` -> ``(3, 7)``; a server's ``"srv0004"`` -> ``(4, 0)``, its one machine."""
    if isinstance(text, str) and text.startswith("srv"):
        return parse_unit_id(text), 0
    found = _match(_MACHINE_RE, text, "machine")
    pod, machine = int(found.group(1)), int(found.group(2))
    _check_pod(pod)
    _check_machine(machine)
    return pod, machine


def parse_ipu_id(text: str) -> tuple[int, int, int]:
    """``"pod0003-m07-i2"`` -> ``(3, 7, 2)``: the unit, then the position as (group of 4, offset).

    A server's ``"srv0004-i13"`` -> ``(4, 3, 1)``: position 13 is the second IPU of group 3.
    """
    if isinstance(text, str) and text.startswith("srv"):
        found = _match(_SERVER_IPU_RE, text, "IPU")
        unit, ipu = int(found.group(1)), int(found.group(2))
        _check_pod(unit)
        if ipu >= SERVER_IPUS:
            raise ValueError(f"IPU index {ipu} is outside 0..{SERVER_IPUS - 1}")
        return unit, ipu // IPUS_PER_MACHINE, ipu % IPUS_PER_MACHINE
    found = _match(_IPU_RE, text, "IPU")
    pod, machine, ipu = int(found.group(1)), int(found.group(2)), int(found.group(3))
    _check_pod(pod)
    _check_machine(machine)
    _check_ipu(ipu)
    return pod, machine, ipu


def machine_of_ipu(ipu: str) -> str:
    """The id of the machine an IPU sits in (a server's IPUs sit in the server)."""
    parse_ipu_id(ipu)
    return ipu.rsplit("-", 1)[0]


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
    """The rack of a POD64 in a fleet of POD64s only (two to a rack); ``Fleet.rack_of`` in general."""
    _check_pod(pod)
    return pod // PODS_PER_RACK


def pods_of(ipu_ids: Iterable[str]) -> tuple[int, ...]:
    """The distinct units the IPUs live in, ascending."""
    return tuple(sorted({parse_ipu_id(ipu)[0] for ipu in ipu_ids}))


def racks_of(ipu_ids: Iterable[str]) -> tuple[int, ...]:
    """Racks of POD64s in a fleet of POD64s only (see ``rack_of_pod``)."""
    return tuple(sorted({rack_of_pod(pod) for pod in pods_of(ipu_ids)}))


def machines_of(ipu_ids: Iterable[str]) -> tuple[str, ...]:
    """The distinct machine ids the IPUs live in, ascending."""
    return tuple(sorted({machine_of_ipu(ipu) for ipu in ipu_ids}))


def spans_gw_links(ipu_ids: Iterable[str]) -> bool:
    """True when traffic between these IPUs must cross GW-Links (they sit in more than one POD64)."""
    return len(pods_of(ipu_ids)) > 1


@dataclass(frozen=True, slots=True)
class Unit:
    """One POD or server of the fleet: its machine type, layout, rack and (servers) model."""

    machine_type: MachineType
    layout: str
    rack: int
    model: str | None = None

    def __post_init__(self) -> None:
        kind = MachineType(self.machine_type)
        object.__setattr__(self, "machine_type", kind)
        machine = MACHINES[kind]
        if self.layout not in machine.layouts:
            raise ValueError(f"{kind.value} comes in {', '.join(machine.layouts)}, not as a {self.layout}")
        if machine.models:
            model = self.model or machine.models[0]
            if model not in machine.models:
                raise ValueError(
                    f"a {kind.value} server is one of {', '.join(machine.models)}, not {model!r}"
                )
            object.__setattr__(self, "model", model)
        elif self.model is not None:
            raise ValueError(f"a {self.layout} of {kind.value} has no server model")
        rack_id(self.rack)

    @property
    def spec(self) -> Layout:
        return LAYOUTS[self.layout]


def unit_id(unit: int, layout: str) -> str:
    return server_id(unit) if layout == "server" else pod_id(unit)


def _assign_racks(entries: Sequence[tuple[MachineType, str, str | None] | None]) -> list[Unit | None]:
    """Racks for units given without one: each rack takes units of one layout, up to its ``per_rack``
    (two POD64s, one POD16, eight servers), in order; a retired slot takes none."""
    units: list[Unit | None] = []
    rack = -1
    filled = 0
    layout_here: str | None = None
    for entry in entries:
        if entry is None:
            units.append(None)
            continue
        kind, layout, model = entry
        if layout != layout_here or filled >= LAYOUTS[layout].per_rack:
            rack, filled, layout_here = rack + 1, 0, layout
        filled += 1
        units.append(Unit(kind, layout, rack, model))
    return units


@dataclass(frozen=True, slots=True, init=False)
class Fleet:
    """An immutable description of the hardware: one unit per index (``None`` where one was retired)."""

    units: tuple[Unit | None, ...]
    # Derived once: placement asks these on every request.
    _types: tuple[MachineType | None, ...] = field(compare=False, repr=False)
    _present: tuple[MachineType, ...] = field(compare=False, repr=False)
    _ipus: int = field(compare=False, repr=False)

    def __init__(self, units: Sequence[Unit | MachineType | str | None]) -> None:
        if isinstance(units, str):
            raise TypeError("units is a sequence of units or machine types, not one string")
        if len(units) > MAX_PODS:
            raise ValueError(f"a fleet holds at most {MAX_PODS} PODs and servers, got {len(units)}")
        if all(unit is None or isinstance(unit, Unit) for unit in units):
            built = list(units)
        else:
            # Machine types alone: each becomes its type's first layout, racks assigned in order.
            entries: list[tuple[MachineType, str, str | None] | None] = []
            for unit in units:
                if unit is None:
                    entries.append(None)
                elif isinstance(unit, Unit):
                    entries.append((unit.machine_type, unit.layout, unit.model))
                else:
                    kind = MachineType(unit)
                    entries.append((kind, MACHINES[kind].layouts[0], None))
            built = list(_assign_racks(entries))
        object.__setattr__(self, "units", tuple(built))
        types = tuple(None if unit is None else unit.machine_type for unit in self.units)
        object.__setattr__(self, "_types", types)
        object.__setattr__(self, "_present", tuple(kind for kind in MachineType if kind in set(types)))
        object.__setattr__(self, "_ipus", sum(unit.spec.ipus for unit in self.units if unit is not None))

    @classmethod
    def uniform(cls, pods: int, machine_type: MachineType | str = MachineType.M2000) -> Fleet:
        if pods < 0:
            raise ValueError(f"pod count must not be negative, got {pods}")
        return cls([MachineType(machine_type)] * pods)

    @classmethod
    def build(cls, groups: Iterable[UnitGroup] | str) -> Fleet:
        """Units from a fleet description (``parse_fleet_description``), racks assigned in order."""
        if isinstance(groups, str):
            groups = parse_fleet_description(groups)
        entries: list[tuple[MachineType, str, str | None] | None] = []
        for group in groups:
            entries.extend((group.machine_type, group.layout, group.model) for _ in range(group.count))
        return cls(_assign_racks(entries))

    # --- shape ----------------------------------------------------------------------------------

    @property
    def pods(self) -> int:
        """The unit index space: every unit ever added, retired ones included."""
        return len(self.units)

    @property
    def pod_types(self) -> tuple[MachineType | None, ...]:
        """Each unit's machine type, ``None`` for a retired unit."""
        return self._types

    @property
    def racks(self) -> int:
        return len({unit.rack for unit in self.units if unit is not None})

    @property
    def machines(self) -> int:
        return sum(unit.spec.machines for unit in self.units if unit is not None)

    @property
    def ipus(self) -> int:
        return self._ipus

    @property
    def machine_types(self) -> tuple[MachineType, ...]:
        """The machine types present, in declaration order of MachineType."""
        return self._present

    def has_pod(self, pod: int) -> bool:
        return 0 <= pod < len(self.units) and self.units[pod] is not None

    def unit(self, pod: int) -> Unit:
        if not self.has_pod(pod):
            raise ValueError(f"unit {pod} is not in this fleet of {self.pods} units")
        unit = self.units[pod]
        assert unit is not None
        return unit

    def layout_of(self, pod: int) -> Layout:
        return self.unit(pod).spec

    def unit_id(self, pod: int) -> str:
        return unit_id(pod, self.unit(pod).layout)

    def capacity_mask(self, pod: int) -> int:
        """The positions a unit has (all 64 for a POD64, the first 16 for a POD16 or a server)."""
        return (1 << self.layout_of(pod).ipus) - 1

    def rack_of(self, pod: int) -> int:
        return self.unit(pod).rack

    def machine_type_of(self, pod: int) -> MachineType:
        return self.unit(pod).machine_type

    def machine_type_of_ipu(self, ipu: str) -> MachineType:
        return self.machine_type_of(parse_ipu_id(ipu)[0])

    def pods_of_type(self, machine_type: MachineType | str) -> tuple[int, ...]:
        kind = MachineType(machine_type)
        return tuple(
            pod for pod, unit in enumerate(self.units) if unit is not None and unit.machine_type is kind
        )

    def pod_ids(self) -> tuple[str, ...]:
        return tuple(self.unit_id(pod) for pod in range(self.pods) if self.has_pod(pod))

    def rack_ids(self) -> tuple[str, ...]:
        return tuple(rack_id(rack) for rack in sorted({u.rack for u in self.units if u is not None}))

    def unit_ipu_ids(self, pod: int) -> tuple[str, ...]:
        """A unit's IPU ids in position order."""
        layout = self.layout_of(pod)
        if layout.name == "server":
            return server_ipu_ids(pod)
        return pod_ipu_ids(pod)[: layout.ipus]

    def unit_machine_ids(self, pod: int) -> tuple[str, ...]:
        layout = self.layout_of(pod)
        if layout.name == "server":
            return (server_id(pod),)
        return tuple(machine_id(pod, machine) for machine in range(layout.machines))

    def machine_ids(self) -> Iterator[str]:
        for pod in range(self.pods):
            if self.has_pod(pod):
                yield from self.unit_machine_ids(pod)

    def ipu_ids(self) -> Iterator[str]:
        for pod in range(self.pods):
            if self.has_pod(pod):
                yield from self.unit_ipu_ids(pod)

    # --- checks ---------------------------------------------------------------------------------

    def check_ipu(self, ipu: str) -> tuple[int, int, int]:
        """Parse an IPU id and make sure this fleet has it: ``(unit, group of 4, offset)``."""
        pod, machine, index = parse_ipu_id(ipu)
        if not self.has_pod(pod):
            raise ValueError(f"{ipu} is not in this fleet of {self.pods} units")
        layout = self.layout_of(pod)
        if (layout.name == "server") != ipu.startswith(
            "srv"
        ) or machine * IPUS_PER_MACHINE + index >= layout.ipus:
            raise ValueError(
                f"{ipu} is not in this fleet: unit {pod} is a {layout.label} ({self.unit_id(pod)})"
            )
        return pod, machine, index

    def check_machine(self, machine: str) -> tuple[int, int]:
        """Parse a machine id and make sure this fleet has it: ``(unit, machine index)``."""
        pod, index = parse_machine_id(machine)
        if not self.has_pod(pod):
            raise ValueError(f"{machine} is not in this fleet of {self.pods} units")
        layout = self.layout_of(pod)
        if (layout.name == "server") != machine.startswith("srv") or index >= layout.machines:
            raise ValueError(
                f"{machine} is not in this fleet: unit {pod} is a {layout.label} ({self.unit_id(pod)})"
            )
        return pod, index

    def machine_mask(self, machine: str) -> tuple[int, int]:
        """``(unit, positions)`` of a machine: one group of 4 in a POD, all 16 of a server."""
        pod, index = self.check_machine(machine)
        layout = self.layout_of(pod)
        width = layout.ipus_per_machine
        return pod, ((1 << width) - 1) << (index * width)

    def machine_of_group(self, pod: int, group: int) -> str:
        """The machine holding positions ``4 * group .. 4 * group + 3`` of a unit."""
        layout = self.layout_of(pod)
        if layout.name == "server":
            return server_id(pod)
        return machine_id(pod, group)

    def groups_of_machine(self, machine: str) -> tuple[int, tuple[int, ...]]:
        """``(unit, groups of 4 positions)`` a machine covers."""
        pod, mask = self.machine_mask(machine)
        return pod, tuple(g for g in range(MACHINES_PER_POD) if mask >> (g * IPUS_PER_MACHINE) & 0b1111)


@dataclass(frozen=True, slots=True)
class UnitGroup:
    """``count`` units of one machine type, layout and (servers) model: one item of a fleet description."""

    machine_type: MachineType
    layout: str
    count: int
    model: str | None = None

    def describe(self) -> str:
        name = self.model or self.machine_type.value
        default = MACHINES[self.machine_type].layouts[0]
        return f"{self.count}x{name}" + ("" if self.layout == default or self.model else f"/{self.layout}")


_ITEM_RE = re.compile(r"(?:(\d+)\s*x\s*)?([a-z0-9]+)(?:/([a-z0-9]+))?")
DEMO_FLEET = "2xm2000,1xdss8440"


def parse_fleet_description(text: str) -> tuple[UnitGroup, ...]:
    """A fleet written as ``2xm2000, 1xbow/pod16, 1xdss8440``: counts of machine types (in their
    first layout unless ``/pod16`` or another is given) or of server models (each a ``c2`` server).
    Raises ValueError naming the item it cannot read."""
    models = {model: kind for kind, machine in MACHINES.items() for model in machine.models}
    groups: list[UnitGroup] = []
    items = [item.strip().lower() for item in text.split(",")]
    if not any(items):
        raise ValueError("a fleet description names at least one POD or server, e.g. 2xm2000,1xdss8440")
    for item in items:
        found = _ITEM_RE.fullmatch(item)
        if found is None:
            raise ValueError(f"cannot read {item!r}: write COUNTxTYPE, e.g. 2xm2000, 1xbow/pod16, 4xdss8440")
        count = int(found.group(1) or 1)
        name, layout = found.group(2), found.group(3)
        if name in models:
            if layout not in (None, "server"):
                raise ValueError(f"{item!r}: a {name} is a server")
            kind, model, layout = models[name], name, "server"
        else:
            try:
                kind = MachineType(name)
            except ValueError:
                names = ", ".join([*(k.value for k in MachineType), *models])
                raise ValueError(f"{item!r}: unknown machine type or server model {name!r}; one of {names}")
            machine = MACHINES[kind]
            layout = layout or machine.layouts[0]
            model = machine.models[0] if machine.models else None
            if layout not in machine.layouts:
                raise ValueError(f"{item!r}: {kind.value} comes in {', '.join(machine.layouts)}")
        if not 1 <= count <= MAX_PODS:
            raise ValueError(f"{item!r}: a count is from 1 to {MAX_PODS}")
        groups.append(UnitGroup(kind, layout, count, model))
    if sum(group.count for group in groups) > MAX_PODS:
        raise ValueError(f"a fleet holds at most {MAX_PODS} PODs and servers")
    return tuple(groups)


def describe_fleet(groups: Iterable[UnitGroup]) -> str:
    return ",".join(group.describe() for group in groups)
