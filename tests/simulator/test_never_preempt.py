"""The simulator reads the opt-out of preemption per job (`never_preempt`), as the live snapshot
reads it from the job and its plan (scheduler/services/batch/scheduling.py)."""

from __future__ import annotations

import pytest

from scheduler.policy import get_policy
from scheduler.simulator import Simulation, TraceJob

HOUR = 3600.0


def test_an_opted_out_job_is_never_preempted_in_the_simulator() -> None:
    config = get_policy("default-classes")
    # A long 64-IPU job of tenant A holds the one POD64; a short one of B arrives an hour later.
    trace = [TraceJob("long", 0.0, 8 * HOUR, 64, "A", 64), TraceJob("short", HOUR, 600.0, 64, "B", 64)]
    estimates = [j.duration_s for j in trace]
    free = Simulation(trace, config, estimates, pods=1).run()
    assert free.outcomes[0].preempted == 1, "without the opt-out the short job preempts it"
    kept = Simulation(trace, config, estimates, pods=1, never_preempt=[True, False]).run()
    assert kept.outcomes[0].preempted == 0 and kept.preemptions == 0
    assert kept.outcomes[1].start_s >= kept.outcomes[0].end_s, "the short job waits for it"
    with pytest.raises(ValueError, match="one never_preempt flag per job"):
        Simulation(trace, config, estimates, pods=1, never_preempt=[True])
