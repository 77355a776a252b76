"""Scheduling policy: pure functions over a snapshot, shared by the live loop and the simulator.

`decide` runs one pass of a named policy (`config.POLICIES`) over a `Snapshot` and returns a
`Decision`: what starts where, what is preempted, and why every other queued job waits.
"""

from scheduler.policy.config import BASELINES, POLICIES, REFERENCES, PolicyConfig, get_policy
from scheduler.policy.fairshare import DEFAULT_HALF_LIFE_S, accrue, add_sample, decay, standing
from scheduler.policy.model import (
    Decision,
    HeldArray,
    JobQueue,
    MachineOption,
    PassStats,
    QueuedJob,
    Reservation,
    ReservedPartition,
    Snapshot,
    TenantState,
    Wait,
)
from scheduler.policy.pipeline import decide, partition_name_for
from scheduler.policy.running import RunningJob
from scheduler.policy.timetable import TimeTable, expected_end

__all__ = [
    "BASELINES",
    "DEFAULT_HALF_LIFE_S",
    "POLICIES",
    "REFERENCES",
    "Decision",
    "HeldArray",
    "JobQueue",
    "MachineOption",
    "PassStats",
    "PolicyConfig",
    "QueuedJob",
    "Reservation",
    "ReservedPartition",
    "RunningJob",
    "Snapshot",
    "TenantState",
    "TimeTable",
    "Wait",
    "accrue",
    "add_sample",
    "decay",
    "decide",
    "expected_end",
    "get_policy",
    "partition_name_for",
    "standing",
]
