"""Fair share: decayed IPU-second usage per tenant, as Slurm's and Kueue's fair sharing keep it.

Usage decays exponentially with a half-life (Slurm's ``PriorityDecayHalfLife``, Kueue's
``usageHalfLifeTime``; both default to 7 days), so last month's burst weighs less than this
morning's. A tenant's place in line is its *standing*: decayed usage plus the IPU-seconds its
running jobs are still predicted to run, divided by its weight. Counting committed work is our
version of Kueue's entry penalty: a tenant that just started 500 jobs ranks behind one that
started none, at once, not only after the 500 jobs have run for a while.
"""

from __future__ import annotations

import math

LN2 = math.log(2.0)
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0


def decay(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """``usage`` as it weighs ``elapsed_s`` later."""
    if elapsed_s <= 0:
        return usage
    return usage * 0.5 ** (elapsed_s / half_life_s)


def accrue(usage: float, ipus: float, elapsed_s: float, half_life_s: float) -> float:
    """Decayed usage after running ``ipus`` IPUs for ``elapsed_s`` more seconds.

    The integral of ``ipus * 2 ** (-(t_end - t) / half_life)`` over the interval, in closed form, so
    the simulator can advance a tenant from one event to the next in O(1).
    """
    if elapsed_s <= 0:
        return usage
    kept = 0.5 ** (elapsed_s / half_life_s)
    return usage * kept + ipus * half_life_s / LN2 * (1.0 - kept)


def add_sample(usage: float, ipu_s: float, elapsed_s: float, half_life_s: float) -> float:
    """Decayed usage after ``ipu_s`` more IPU-seconds were metered over the last ``elapsed_s``.

    The live loop samples the metered counter, not the running jobs, so it does not know when within
    the interval the IPU-seconds ran: it counts them at the interval's midpoint.
    """
    return max(0.0, decay(usage, elapsed_s, half_life_s) + decay(ipu_s, elapsed_s / 2, half_life_s))


def standing(usage_ipu_s: float, committed_ipu_s: float, weight: float) -> float:
    """Lower goes first. A weight of 0 (or less) puts the tenant behind everyone with a weight."""
    if weight <= 0:
        return math.inf
    return (usage_ipu_s + committed_ipu_s) / weight
