"""An attempt's life: placed (partition held, outbox row), taken by a host agent, billed, ended.

A host agent (scheduler.services.capacity.agents) holds one lease for all the attempts it drives, and every
one of its writes starts by renewing that lease: a guarded UPDATE that fails once the lease has
lapsed, so an agent that was paused, cut off or replaced can change nothing.

- `take_many` moves delivered attempts `placed` -> `running` by compare-and-set on (attempt, state,
  epoch), under the agent's incarnation, and fixes each run's timeline (its plan on the partition it
  got), so its progress can be derived by anyone instead of written every second.
- `record_tick` is one agent tick in one transaction: the lease, the log lines of every attempt,
  the meter ticks due, and the attempts that ended.
- `stop_running` is the control plane ending live attempts itself (a cancel, a preemption, a failed
  machine, a lapsed agent); the agent learns it over the bus or at its next look, and its later
  writes for them are refused because they are no longer running under its incarnation.

Locks are taken in one global order, so batches of many attempts never deadlock: job rows (by id),
then attempt rows (by id), then tenant rows (by id). The agent's meter ticks lock attempts only: a
job's row is not written while its attempt runs. On SQLite every write transaction holds the
database lock from BEGIN, which serialises them all.
"""

from __future__ import annotations

from scheduler.services.batch.attempts.ending import (
    Ending,
    end_attempt,
    end_attempts,
    stop_running,
)
from scheduler.services.batch.attempts.incarnations import (
    Lapse,
    end_attempts_of,
    lapse_agents,
    register_agent,
)
from scheduler.services.batch.attempts.placing import (
    TASK_NAME,
    PlacedPartition,
    array_environment,
    free_gcds,
    gcd_ipus,
    place,
    place_many,
)
from scheduler.services.batch.attempts.progress import (
    ProgressView,
    agent_of,
    answered_until,
    derived_cluster_s,
    measured_end,
    progress_at,
    progress_dict,
    progress_of,
)
from scheduler.services.batch.attempts.taking import (
    TakenAttempt,
    TakeResult,
    take,
    take_many,
)
from scheduler.services.batch.attempts.ticks import (
    Bill,
    Finish,
    LogLine,
    TickResult,
    finish,
    record_tick,
)

__all__ = [
    "TASK_NAME",
    "Bill",
    "Ending",
    "Finish",
    "Lapse",
    "LogLine",
    "PlacedPartition",
    "ProgressView",
    "TakeResult",
    "TakenAttempt",
    "TickResult",
    "agent_of",
    "answered_until",
    "array_environment",
    "derived_cluster_s",
    "end_attempt",
    "end_attempts",
    "end_attempts_of",
    "finish",
    "free_gcds",
    "gcd_ipus",
    "lapse_agents",
    "measured_end",
    "place",
    "place_many",
    "progress_at",
    "progress_dict",
    "progress_of",
    "record_tick",
    "register_agent",
    "stop_running",
    "take",
    "take_many",
]
