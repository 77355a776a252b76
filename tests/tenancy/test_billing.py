"""The billing arithmetic every part of the cloud reads (scheduler/billing.py)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from scheduler import billing


@dataclass
class Grant:
    quota_ipu_ms: int
    used_ipu_ms: int
    reserved_ipu_ms: int


def test_an_ipu_hour_is_an_ipu_for_an_hour_at_rate_one() -> None:
    assert billing.ipu_ms(1, 3600) == billing.IPU_MS_PER_HOUR
    assert billing.ipu_hours(billing.ipu_ms(16, 1800)) == 8.0
    assert billing.ipu_ms_of_hours(2.5) == 9_000_000


def test_a_rate_scales_the_charge_and_the_raw_time_is_recovered() -> None:
    charged = billing.charged_ipu_ms(4, 90.0, 1.4)
    assert charged == round(4 * 90_000 * 1.4)
    assert billing.raw_ipu_ms(charged, 1.4) == billing.ipu_ms(4, 90.0)
    assert billing.raw_ipu_ms(charged, 0.0) == 0
    option = {"ipus": 4, "predicted_runtime_s": 90.0, "rate": 1.4}
    assert billing.option_cost_ipu_ms(option) == charged


def test_what_is_left_counts_use_reservations_and_holdings() -> None:
    g = Grant(quota_ipu_ms=10_000, used_ipu_ms=3_000, reserved_ipu_ms=2_000)
    assert billing.left_ipu_ms(g) == 5_000
    assert billing.left_ipu_ms(g, held=1_000) == 4_000
    # The scheduler's pass: queued reservations are what it is deciding about, so they do not count.
    assert billing.left_ipu_ms(g, held=500, count_reserved=False) == 6_500
    overdrawn = Grant(quota_ipu_ms=1_000, used_ipu_ms=1_500, reserved_ipu_ms=0)
    assert billing.left_ipu_ms(overdrawn) == -500
    assert billing.remaining_ipu_ms(overdrawn) == 0


def test_hours_are_reported_alike_from_any_database_sum() -> None:
    from decimal import Decimal

    assert billing.ipu_hours(Decimal(7_200_000)) == 2.0
    assert billing.ipu_hours(None) == 0.0


@given(st.integers(1, 65_536), st.floats(0, 1e7), st.sampled_from([0.5, 1.0, 1.4, 3.0]))
def test_charging_is_monotone_in_time(size: int, seconds: float, rate: float) -> None:
    assert billing.charged_ipu_ms(size, seconds + 1, rate) >= billing.charged_ipu_ms(size, seconds, rate)
