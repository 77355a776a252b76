"""Issue #32 item 15: what the landing page, the fleet map, a GCD refusal and a small model's figures
say is true and readable."""

from __future__ import annotations

from typing import Any

import pytest

from api.dashboard import fleetmap
from api.dashboard.web import duration as web_duration
from ipucloud.cli.client_common import duration as cli_duration
from scheduler.figures import flops
from tests.support import services
from tests.vipu_api.test_gcds import reserve, submit, tenant_key
from vipu.emulator.run import _duration, _step


def test_the_landing_page_counts_each_kind_of_unit(db: Any, env: Any, client: Any) -> None:
    services.seed(db, fleet_description="4xm2000,1xm2000/pod16,2xdss8440")
    page = client.get("/")
    assert page.status_code == 200
    text = " ".join(page.text.split())
    assert "4 IPU-POD64s, 1 IPU-POD16 and 2 IPU servers" in text, text
    assert "POD64 rack" not in text
    assert "(304 IPUs:" in text  # 4 x 64 + 16 + 2 x 16


def _view(*partitions: tuple[str, int]) -> dict[str, Any]:
    """One POD64's map with the given partitions' IPUs in map order, (name, IPUs)."""
    ipus: list[dict[str, Any]] = []
    for name, n in partitions:
        ipus += [
            {"id": f"x{len(ipus)}", "partition": name, "tenant": "ten_a", "kind": "job"} for _ in range(n)
        ]
    ipus += [{"id": f"x{i}", "partition": None, "tenant": None, "kind": None} for i in range(len(ipus), 64)]
    machines = [{"id": f"m{m}", "ipus": ipus[4 * m : 4 * m + 4]} for m in range(16)]
    return {"pods": [{"id": "pod0000", "layout": "pod64", "machines": machines}]}


def test_fleet_map_letters_stay_with_their_partitions() -> None:
    created = {"old": 7, "mid": 9}
    first = {k.name: k.letter for k in fleetmap.legend(_view(("old", 4), ("mid", 8)), {}, {}, created)}
    again = {k.name: k.letter for k in fleetmap.legend(_view(("old", 4), ("mid", 8)), {}, {}, created)}
    assert first == again
    # A new partition lands before them on the map, and "old" leaves: the others keep their letters.
    created = {"mid": 9, "new": 12}
    later = {k.name: k.letter for k in fleetmap.legend(_view(("new", 4), ("mid", 8)), {}, {}, created)}
    assert later["mid"] == first["mid"]
    assert len(set(later.values())) == 2
    # Two whose keys name the same letter: the older keeps it, the newer takes the next one free.
    n = len(fleetmap.LETTERS)
    clash = fleetmap.letters({"a": 3, "b": 3 + n})
    assert clash["a"] == "C" and clash["b"] == "D"
    assert fleetmap.letters({"first": 1}) == {"first": "A"}


def test_a_gcd_refusal_counts_gcds_not_ipus(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = tenant_key(client, seeded, "gcd")
    reserve(client, seeded, tenant, "pair", 8, 2)
    r = submit(client, key, "too-big", ipus=8, partition="pair")
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert "its 8 IPUs are split into 2 GCDs of 4" in detail, detail
    assert "of 8 IPUs" not in detail


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (22.42e9, "22.4 GFLOP"),
        (6.43e6, "6.43 MFLOP"),
        (7800.0, "7.80 kFLOP"),
        (512.0, "512 FLOP"),
        (None, "-"),
    ],
)
def test_flops_are_written_in_the_unit_that_shows_them(value: float | None, text: str) -> None:
    assert flops(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0 s"), (0.000042, "42 µs"), (0.0021, "2.10 ms"), (0.3374, "337 ms"), (12.0, "12.0 s")],
)
def test_short_durations_are_not_zero_ms(seconds: float, text: str) -> None:
    assert cli_duration(seconds) == text
    assert web_duration(seconds) == text


def test_a_small_models_step_log_says_microseconds() -> None:
    assert _step(0.0000417) == "41.7 µs" and _step(0.0021) == "2.10 ms" and _step(0.3374) == "337.4 ms"
    assert _duration(0.004) == "4.00 ms"
