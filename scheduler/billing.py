"""Billing arithmetic, in one place: how IPU time becomes grant IPU-milliseconds, and what is left of a grant.

A grant is kept in IPU-milliseconds (integers, so that the ledger sums exactly on every database) and
shown in IPU-hours. An attempt is charged `rate x IPUs x cluster seconds`, at the rate of the machine
type it ran on (`scheduler/services/tenancy/rates.py` says where a rate comes from). What is left of a grant
is the quota less what was used and what running and queued jobs hold. Changing how billing works
means changing this module and `tests/tenancy/test_billing.py`; metering (`services/metering.py`)
writes the ledger with these formulas and everything that shows or checks a grant reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from vipu.machine_types import MACHINE_TYPE_NAMES

IPU_MS_PER_HOUR = 3_600_000


class Grant(Protocol):
    """What a tenant row carries about its grant, in IPU-milliseconds."""

    quota_ipu_ms: int
    used_ipu_ms: int
    reserved_ipu_ms: int


def ipu_hours(ipu_ms: float | None) -> float:
    """IPU-milliseconds as IPU-hours, to the microhour. ``int()`` first: PostgreSQL sums BIGINTs as
    NUMERIC (a Decimal here), and every database must report alike."""
    return round(int(ipu_ms or 0) / IPU_MS_PER_HOUR, 6)


def ipu_ms_of_hours(hours: float) -> int:
    return round(hours * IPU_MS_PER_HOUR)


def ipu_ms(size: int, cluster_s: float) -> int:
    """`size` IPUs held for `cluster_s` cluster seconds, uncharged (rate 1)."""
    return round(size * cluster_s * 1000)


def charged_ipu_ms(size: int, cluster_s: float, rate: float) -> int:
    """What `size` IPUs for `cluster_s` cluster seconds cost at `rate`, in grant IPU-milliseconds."""
    return round(size * cluster_s * 1000 * rate)


def raw_ipu_ms(charged: int, rate: float) -> int:
    """The IPU-milliseconds behind an amount charged at `rate`."""
    return round(charged / rate) if rate > 0 else 0


def option_cost_ipu_ms(option: Mapping[str, float]) -> int:
    """The predicted charge of one machine-type option of a job (`ipus`, `predicted_runtime_s`, `rate`)."""
    return charged_ipu_ms(int(option["ipus"]), float(option["predicted_runtime_s"]), float(option["rate"]))


def promised_kind(options: Mapping[str, Mapping[str, float]], prefer: str = "time") -> str:
    """The machine type a job that may run on several is promised at: the one it finishes first on
    (`time`: the shortest predicted run) or the one that spends least of the grant (`cost`; the
    shorter run among equally cheap ones), in the registry's order on a tie. Its submission
    reserves this option's cost, and an estimate with the same `prefer` answers for it; wherever it
    runs, its settle bills what it ran (`services/metering.py`), within the grant."""
    order = {kind: n for n, kind in enumerate(MACHINE_TYPE_NAMES)}

    def rank(kind: str) -> tuple[float, ...]:
        o = options[kind]
        runtime, at = float(o["predicted_runtime_s"]), order.get(kind, len(order))
        return (option_cost_ipu_ms(o), runtime, at) if prefer == "cost" else (runtime, at)

    return min(options, key=rank)


def reserve_ipu_ms(options: Mapping[str, Mapping[str, float]], prefer: str = "time") -> int:
    """What a job with these machine-type options reserves of its grant: its promised option's cost."""
    return option_cost_ipu_ms(options[promised_kind(options, prefer)])


def left_ipu_ms(grant: Grant, *, held: int = 0, count_reserved: bool = True) -> int:
    """What is left of a grant after what was used, what queued and running jobs reserve
    (`count_reserved`), and `held` more; negative when it is overdrawn. The scheduler's pass counts
    running jobs' holdings itself (`held`) and leaves queued reservations out, since it is deciding
    which of those queued jobs may spend them."""
    left = grant.quota_ipu_ms - grant.used_ipu_ms - held
    return left - grant.reserved_ipu_ms if count_reserved else left


def remaining_ipu_ms(grant: Grant) -> int:
    """What a tenant is shown as left of its grant: never below zero."""
    return max(0, left_ipu_ms(grant))
