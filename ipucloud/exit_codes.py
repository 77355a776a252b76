"""Exit codes of every ipucloud command, in a module of their own so that `gc-info` and `gc-monitor`
start without loading the CLI and the SDK."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    """Exit codes scripts can rely on (documented in docs/cli.md and `ipucloud --help`)."""

    OK = 0
    JOB_FAILED = 1  # a followed job ended failed or cancelled
    USAGE = 2  # bad flags or a request the server refused as invalid (400/413/422)
    # The workload does not fit (no partition of the type holds it): the same code from
    # `ipucloud estimate`, `jobs submit --dry-run` and a submission the server refuses for it (a 422).
    DOES_NOT_FIT = 2
    AUTH = 3  # no key, unknown/revoked/expired key, or not allowed (401/403)
    NOT_FOUND = 4  # no such job, tenant, partition... (404)
    CONFLICT = 5  # state conflict, no capacity, quota or plan limit (409, quota/limit/inactive)
    UNAVAILABLE = 6  # server unreachable, rate limited after retries, or failing (429/5xx)


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 a followed job failed or was cancelled; 2 usage error, invalid request, or the "
    "workload does not fit (estimate, --dry-run and submit alike); "
    "3 authentication or permission; 4 not found; 5 conflict, quota or plan limit; "
    "6 server unreachable or unavailable."
)
