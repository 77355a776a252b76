"""The replay benchmark's checks of #31's targets say what the issue says (benchmarks/simulate_philly.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "simulate_philly", REPO / "benchmarks" / "simulate_philly.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def figures(avg_h: float, p99_h: float, fairness: float, **extra: Any) -> dict[str, Any]:
    return {
        "avg_jct_s": avg_h * 3600,
        "p99_jct_s": p99_h * 3600,
        "fairness": fairness,
        "preemptions_per_job_hour": extra.pop("rate", 0.0),
        **extra,
    }


def test_the_candidate_is_held_to_the_issues_targets_against_the_anchors_and_todays_default() -> None:
    checks = {
        label: ok
        for label, ok, _ in benchmark().anchor_targets(
            {
                # 1.4 x the oracle: within #31's 1.5 (the older 1.3 missed it).
                "default-classes": figures(
                    5.6,
                    100.0,
                    0.70,
                    rate=0.02,
                    estimate_error={"median_abs_error_share": 0.24, "waited_jobs": 9},
                ),
                "default": figures(13.0, 250.0, 0.71),
                "tiresias": figures(8.0, 120.0, 0.20, rate=0.06),
                "srtf-oracle": figures(4.0, 70.0, 0.95, rate=0.07),
            }
        )
    }
    assert checks == {
        "#31: default-classes avg JCT <= 0.8 x tiresias": True,
        "#31: default-classes p99 JCT no worse than tiresias": True,
        "#31: default-classes avg JCT within 1.5 x srtf-oracle": True,
        # Against today's default, not against Tiresias (whose 0.20 it beats).
        "#31: default-classes Jain fairness across tenants no worse than default's": False,
        "#31: default-classes wait estimate median error <= 25%": True,
        "#31: preemptions per job-hour reported": True,
    }


def test_without_default_classes_the_checks_are_defaults_and_each_needs_its_figures() -> None:
    found = benchmark().anchor_targets(
        {"default": figures(8.0, 100.0, 0.7), "srtf-oracle": figures(5.0, 70.0, 0.9)}
    )
    assert [(label, ok) for label, ok, _ in found] == [
        ("#31: default avg JCT within 1.5 x srtf-oracle", False),  # 1.6
        ("#31: preemptions per job-hour reported", True),
    ]
    assert found[-1][2] == "default 0.0000, srtf-oracle 0.0000"
