"""The trace simulator: replay a job trace through the live scheduler's policy code, on a simulated
clock and the real Virtual-IPU allocator, several policies side by side (`ipucloud simulate`)."""

from scheduler.simulator.engine import JobOutcome, SimResult, Simulation, largest_partition
from scheduler.simulator.estimates import ESTIMATE_MODELS, estimates
from scheduler.simulator.metrics import summarize
from scheduler.simulator.runner import ReplaySpec, replay, replay_policy, report, write_outputs
from scheduler.simulator.trace import Columns, TraceError, TraceJob, load_trace

__all__ = [
    "ESTIMATE_MODELS",
    "Columns",
    "JobOutcome",
    "ReplaySpec",
    "SimResult",
    "Simulation",
    "TraceError",
    "TraceJob",
    "estimates",
    "largest_partition",
    "load_trace",
    "replay",
    "replay_policy",
    "report",
    "summarize",
    "write_outputs",
]
