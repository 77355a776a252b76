"""Bit tricks over one POD64's IPU-Link ring.

A pod's state is a 64-bit int: bit ``p`` is ring position ``p`` (``machine * 4 + ipu``). Machine-level
views compress it to 16 bits, bit ``m`` for machine ``m``. Both rings wrap: position 63 is linked to
position 0 and machine 15 to machine 0, so every "window" and "run" below is circular.

``summarize`` condenses a free mask into the few facts the fleet index needs (what sizes fit, how long
the free machine runs are, how many IPUs are usable for each size); it is memoised on the mask because
a busy fleet keeps producing the same handful of pod states.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from vipu.topology import IPUS_PER_MACHINE, IPUS_PER_POD, MACHINES_PER_POD

FULL_POD = (1 << IPUS_PER_POD) - 1
FULL_RING = (1 << MACHINES_PER_POD) - 1
# Bit 2j set: the aligned pair {2j, 2j+1}; bit 4m set: machine m's first IPU.
_EVEN_POSITIONS = int("01" * (IPUS_PER_POD // 2), 2)
_MACHINE_FIRST_POSITIONS = int("0001" * MACHINES_PER_POD, 2)

# Size levels inside one pod: level L is size 2**L, levels 0..6 are sizes 1..64.
POD_LEVELS = 7
MACHINE_LEVEL = 2  # the first level made of whole machines (size 4)

# Layout of a pod's feature bits (see ``summarize``): one fleet-wide pod bitmask is kept per bit.
HOST_BIT = 0  # + level: some window of this level is free
ALIGNED_BIT = HOST_BIT + POD_LEVELS  # + level: some window of this level aligned to its size is free
RUN_BIT = ALIGNED_BIT + POD_LEVELS - 1  # + n (1..16): a maximal run of n free machines exists
HALF_PAIR_BIT = RUN_BIT + MACHINES_PER_POD + 1  # an aligned pair with exactly one free IPU
PARTIAL_PAIR_BIT = HALF_PAIR_BIT + 1  # a free aligned pair in a machine that is not wholly free
FREE_COUNT_BIT = PARTIAL_PAIR_BIT + 1  # + c (0..64): exactly c free IPUs
FEATURE_BITS = FREE_COUNT_BIT + IPUS_PER_POD + 1


# Holes: free IPUs of a machine that is partly in use, which only 1- and 2-IPU partitions can take.
HALF_PAIR_HOLE = 0  # the machine has an aligned pair with exactly one free IPU
FREE_PAIR_HOLE = 1  # the machine has a free aligned pair but is not wholly free
HOLE_CLASSES = 2


def _hole_classes(nibble: int) -> int:
    half = (nibble ^ (nibble >> 1)) & 0b0101
    pair = nibble & (nibble >> 1) & 0b0101
    return (half != 0) << HALF_PAIR_HOLE | (nibble != 0b1111 and pair != 0) << FREE_PAIR_HOLE


# Bit c of entry n: a machine whose four free bits are n has holes of class c.
MACHINE_HOLES = tuple(_hole_classes(nibble) for nibble in range(16))


def changed_machines(before: int, after: int) -> int:
    """16-bit mask of machines whose free IPUs differ between two free masks of one pod."""
    diff = before ^ after
    diff |= diff >> 1
    diff |= diff >> 2
    firsts = diff & _MACHINE_FIRST_POSITIONS
    machines = 0
    while firsts:
        low = firsts & -firsts
        machines |= 1 << ((low.bit_length() - 1) // IPUS_PER_MACHINE)
        firsts ^= low
    return machines


def window_mask(start: int, size: int) -> int:
    """Positions ``start .. start + size - 1`` of the 64-position ring, wrapping past 63."""
    bits = ((1 << size) - 1) << start
    return (bits | (bits >> IPUS_PER_POD)) & FULL_POD


def machine_window_mask(start_machine: int, machines: int) -> int:
    """The IPU positions of ``machines`` whole adjacent machines from ``start_machine``, wrapping."""
    return window_mask(start_machine * IPUS_PER_MACHINE, machines * IPUS_PER_MACHINE)


def rotate_right16(mask: int, shift: int) -> int:
    """Machine ring rotation: bit ``m`` of the result is bit ``m + shift`` (mod 16) of ``mask``."""
    shift %= MACHINES_PER_POD
    return ((mask >> shift) | (mask << (MACHINES_PER_POD - shift))) & FULL_RING


def free_pairs(free: int) -> int:
    """Bit 2j set when both IPUs of the aligned pair {2j, 2j+1} are free."""
    return free & (free >> 1) & _EVEN_POSITIONS


def half_pairs(free: int) -> int:
    """Bit 2j set when exactly one IPU of the aligned pair {2j, 2j+1} is free."""
    return (free ^ (free >> 1)) & _EVEN_POSITIONS


@lru_cache(maxsize=1 << 16)
def free_machines(free: int) -> int:
    """16-bit mask of machines whose four IPUs are all free."""
    pairs = free_pairs(free)
    firsts = pairs & (pairs >> 2) & _MACHINE_FIRST_POSITIONS
    machines = 0
    while firsts:
        low = firsts & -firsts
        machines |= 1 << ((low.bit_length() - 1) // IPUS_PER_MACHINE)
        firsts ^= low
    return machines


def machine_window_starts(machines: int, count: int) -> int:
    """Bit ``m`` set when machines ``m .. m + count - 1`` (wrapping) are all in ``machines``.

    A window of all 16 machines is the same set whatever its start, so only start 0 is reported.
    """
    if count >= MACHINES_PER_POD:
        return 1 if machines == FULL_RING else 0
    starts = machines
    for shift in range(1, count):
        starts &= rotate_right16(machines, shift)
    return starts


def aligned_machine_window_starts(machines: int, count: int) -> int:
    """Like ``machine_window_starts`` but only starts that are multiples of ``count`` (buddy blocks)."""
    starts = machines
    span = 1
    while span < count:
        starts &= starts >> span
        span *= 2
    aligned = 0
    for start in range(0, MACHINES_PER_POD, count):
        aligned |= starts & (1 << start)
    return aligned


def circular_runs(mask: int, width: int) -> tuple[tuple[int, int], ...]:
    """Maximal runs of set bits on a ring of ``width`` bits as ``(start, length)``, by start.

    A run that wraps past the top bit starts where it begins, e.g. bits {62, 63, 0} -> (62, 3).
    """
    full = (1 << width) - 1
    mask &= full
    if mask == 0:
        return ()
    if mask == full:
        return ((0, width),)
    # Rotating a clear bit to position 0 means no run crosses the top, so runs read off linearly.
    zero = ((~mask) & (mask + 1)).bit_length() - 1
    rotated = ((mask >> zero) | (mask << (width - zero))) & full
    runs: list[tuple[int, int]] = []
    while rotated:
        start = (rotated & -rotated).bit_length() - 1
        tail = rotated >> start
        length = ((~tail) & (tail + 1)).bit_length() - 1
        runs.append(((start + zero) % width, length))
        rotated &= ~(((1 << length) - 1) << start)
    runs.sort()
    return tuple(runs)


class PodSummary(NamedTuple):
    """What the fleet index needs to know about one pod's free IPUs."""

    features: int  # feature bits, layout above
    free: int  # free IPUs
    usable: tuple[int, ...]  # per level: free IPUs that some free window of that level covers


def _aligned_cover(machines: int, count: int) -> int:
    """Machines (bits) that some free aligned block of ``count`` machines covers."""
    starts = aligned_machine_window_starts(machines, count)
    covered = 0
    while starts:
        low = starts & -starts
        covered |= ((1 << count) - 1) << (low.bit_length() - 1)
        starts ^= low
    return covered


@lru_cache(maxsize=1 << 16)
def summarize(free: int, aligned: bool = False) -> PodSummary:
    """The pod's features. ``aligned`` units (servers) host only windows aligned to their size, so
    for them "some window of this level is free" and the IPUs usable per level count aligned blocks."""
    count = free.bit_count()
    pairs = free_pairs(free)
    machines = free_machines(free)
    runs = circular_runs(machines, MACHINES_PER_POD)
    longest = max((length for _, length in runs), default=0)
    aligned_levels = [count > 0, pairs != 0]
    aligned_levels += [
        aligned_machine_window_starts(machines, 1 << (level - MACHINE_LEVEL)) != 0
        for level in range(MACHINE_LEVEL, POD_LEVELS)
    ]

    # The largest level that fits, -1 when nothing does.
    if aligned:
        cap = max((level for level, fits in enumerate(aligned_levels) if fits), default=-1)
    elif count == 0:
        cap = -1
    elif machines == FULL_RING:
        cap = POD_LEVELS - 1
    elif longest:
        cap = MACHINE_LEVEL + longest.bit_length() - 1
    elif pairs:
        cap = 1
    else:
        cap = 0

    features = 0
    for level in range(cap + 1):
        features |= 1 << (HOST_BIT + level)
    for level, fits in enumerate(aligned_levels):
        if fits:
            features |= 1 << (ALIGNED_BIT + level)
    for _, length in runs:
        features |= 1 << (RUN_BIT + length)
    if half_pairs(free):
        features |= 1 << HALF_PAIR_BIT
    whole_machine_pairs = 0
    for machine in range(MACHINES_PER_POD):
        if machines >> machine & 1:
            whole_machine_pairs |= 0b101 << (machine * IPUS_PER_MACHINE)
    if pairs & ~whole_machine_pairs:
        features |= 1 << PARTIAL_PAIR_BIT
    features |= 1 << (FREE_COUNT_BIT + count)

    usable = [count, 2 * pairs.bit_count()]
    for level in range(MACHINE_LEVEL, POD_LEVELS):
        need = 1 << (level - MACHINE_LEVEL)
        if aligned:
            usable.append(IPUS_PER_MACHINE * _aligned_cover(machines, need).bit_count())
        else:
            usable.append(IPUS_PER_MACHINE * sum(length for _, length in runs if length >= need))
    return PodSummary(features, count, tuple(usable))
