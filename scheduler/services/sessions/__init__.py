"""Sessions: a partition held for one tenant, on which its jobs start at once (docs/sessions.md).

One module per step of a session's life: `start` (admission, and the hold the pass places), `views`
(reading, and the API's answer), `change` (a longer duration, another idle timeout), `jobs` (its own
jobs, placed at once), `end` (by the owner or the sweep) and `sweep` (billing, warnings, ends). Every
public name is importable from here (`sessions.start_session`).

A session queues like a job because it is one: its *holder job* (task `session`, hidden from the
job list) goes through admission (its whole `max_duration_s` reserved from the grant at the plan's
rate, as a job's predicted cost is) and the same scheduling passes, fair share and limits as any job.
When the scheduler places it (`activate_many`, in the pass's transaction), no host agent is asked to
run anything: the partition becomes kind `session`, and a *holding attempt* on graph compile
domain -1 is written `running`. That attempt is metered like any other (`att:<id>:tick:<n>`, then
one settle), so the session is billed per held IPU-second, busy or idle, with the ledger's exactness.

The session's own jobs (`"session": id`) are admitted at the session's GCD size with rate 0 (the
session pays for the partition) and placed in the submission's own transaction on a free GCD
(0 .. gcds-1), so they never wait for a scheduling pass or behind anyone's queue; a job that finds
every GCD busy waits for one like a job in a reserved partition (same partition name), and only
behind the session's own jobs.

`sweep` runs in every scheduler iteration (the leader's, fenced): it bills the holding attempts,
warns `warning_s` cluster seconds before an idle timeout or the maximum duration, and ends sessions
whose time is up. Ending stops the session's running jobs, settles the holding attempt and frees the
partition. All durations are cluster seconds, converted to the wall clock by the caller's `Clock`
(`scheduler/clock.py`).

Locks are taken in the order sessions, jobs, attempts, tenants. The scheduling pass alone comes to a
session with its holder job already locked; it skips a session row another transaction holds
(`activate_many`) rather than wait for it.
"""

from __future__ import annotations

from scheduler.services.sessions.change import change_session
from scheduler.services.sessions.end import (
    FAULT,
    IDLE_TIMEOUT,
    MAX_DURATION,
    OWNER,
    QUOTA,
    end_many,
    end_session,
)
from scheduler.services.sessions.jobs import place_session_jobs, session_for_job
from scheduler.services.sessions.start import HOLD_GCD, SESSION_TASK, activate_many, start_session
from scheduler.services.sessions.sweep import SweepResult, has_due, sweep
from scheduler.services.sessions.views import (
    SessionEventView,
    SessionJobView,
    SessionJson,
    SessionPartitionView,
    SessionView,
    get_session,
    list_sessions,
    session_answer,
    session_json,
    view,
)

__all__ = [
    "FAULT",
    "HOLD_GCD",
    "IDLE_TIMEOUT",
    "MAX_DURATION",
    "OWNER",
    "QUOTA",
    "SESSION_TASK",
    "SessionEventView",
    "SessionJobView",
    "SessionJson",
    "SessionPartitionView",
    "SessionView",
    "SweepResult",
    "activate_many",
    "change_session",
    "end_many",
    "end_session",
    "get_session",
    "has_due",
    "list_sessions",
    "place_session_jobs",
    "session_answer",
    "session_for_job",
    "session_json",
    "start_session",
    "sweep",
    "view",
]
