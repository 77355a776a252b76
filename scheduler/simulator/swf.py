"""Standard Workload Format (SWF) logs of the Parallel Workloads Archive, as jobs the simulator replays.

The format (https://www.cs.huji.ac.il/labs/parallel/workload/swf.html): a header of ``;`` comment
lines (``; Key: value``), then one job a line, 18 whitespace-separated fields, ``-1`` where a value
is unknown:

    1 job number      2 submit time (s)     3 wait time (s)      4 run time (s)
    5 allocated procs 6 average CPU time    7 used memory        8 requested procs
    9 requested time  10 requested memory   11 status            12 user id
    13 group id       14 executable         15 queue             16 partition
    17 preceding job  18 think time

How an SWF job becomes a ``TraceJob`` (docs/scheduling.md, "A second trace", says why):

- **Which jobs.** A job counts only if it ran: run time above zero. Jobs cancelled before they
  started (status 5, run time 0 or -1) and jobs whose run time is unknown are dropped, as the
  archive advises, since they never loaded the machine; jobs that failed or were cancelled *while
  running* are kept, since they held their processors until then. Lines of status 2, 3 and 4 are
  the partial executions of a checkpointed or swapped job whose whole is on its own line: dropped,
  or the job would be counted twice.
- **Size.** Processors (allocated, or requested where allocation is unknown) over
  ``cores_per_ipu``, rounded up to a whole IPU, then up to a power of two (a partition's size is
  one), capped at the largest partition the fleet forms.
- **Tenant.** The user id (``tenant_by="group"``: the group id), as ``u<id>`` (``g<id>``).
- **Run time** is the log's; the **user's estimate** is the requested time (field 9), never less
  than the run time (a request is the limit a job is killed at, so a log that shows a job running
  past it shows a scheduler's grace, not a shorter request) and unknown where the log has -1.
- **Preemptible**: a job of a queue the header describes as preemptible (``; Queue: 2 - Besteffort
  jobs queue - ... can be preempted by normal jobs``, Gaia's best-effort queue under OAR), as the
  cluster treated it: any job that is not preemptible may stop it (docs/checkpoints.md). A header
  that describes no queue marks no job.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scheduler.simulator.trace import TraceError, TraceJob, round_size

FIELDS = 18
# The archive's status codes: 0 failed, 1 completed, 5 cancelled; 2-4 partial executions of a job
# that was checkpointed or swapped out (its summary line carries status 0, 1 or 5).
PARTIAL_STATUSES = frozenset({2, 3, 4})
# 4 cores an IPU: Gaia's 2,004 cores become 501 IPUs, the 512 of the 8 POD64s the Philly replay
# runs on, so the fleet is the cluster's size and the offered load stays the log's.
DEFAULT_CORES_PER_IPU = 4
# A header line that describes a queue: ``; Queue: <number> - <text>`` (the archive's convention).
QUEUE_LINE = re.compile(r"^;\s*Queue:\s*(\d+)\s*-?(.*)$")


@dataclass(frozen=True, slots=True)
class SwfJob:
    """One line of an SWF log, the fields the simulator uses (-1: unknown, as in the log)."""

    number: int
    submit_s: float
    wait_s: float
    run_s: float
    allocated: int
    requested: int
    requested_s: float
    status: int
    user: int
    group: int
    queue: int

    @property
    def processors(self) -> int:
        return self.allocated if self.allocated > 0 else self.requested

    @property
    def ran(self) -> bool:
        """Whether the job loaded the machine and stands for itself (the rule in the module's doc)."""
        return self.run_s > 0 and self.processors > 0 and self.status not in PARTIAL_STATUSES


def parse_swf(lines: Iterable[str], *, source: str = "SWF log") -> tuple[dict[str, str], list[SwfJob]]:
    """The header's ``Key: value`` pairs (the first of each key) and every job line, in file order."""
    header: dict[str, str] = {}
    jobs: list[SwfJob] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(";"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() and " " not in key.strip():
                header.setdefault(key.strip(), value.strip())
            continue
        fields = line.split()
        if len(fields) != FIELDS:
            raise TraceError(f"line {number} of {source}: {len(fields)} fields, an SWF job line has {FIELDS}")
        try:
            values = [float(f) for f in fields]
        except ValueError as exc:
            raise TraceError(f"line {number} of {source}: {exc}") from exc
        jobs.append(
            SwfJob(
                number=int(values[0]),
                submit_s=values[1],
                wait_s=values[2],
                run_s=values[3],
                allocated=int(values[4]),
                requested=int(values[7]),
                requested_s=values[8],
                status=int(values[10]),
                user=int(values[11]),
                group=int(values[12]),
                queue=int(values[14]),
            )
        )
    return header, jobs


def preemptible_queues(lines: Iterable[str]) -> frozenset[int]:
    """The queues the header describes as preemptible: their text speaks of preemption ("can be
    preempted", "preemptible") and does not deny it ("not preemptible")."""
    found = set()
    for line in lines:
        if not line.startswith(";"):
            break  # the header is over
        described = QUEUE_LINE.match(line.strip())
        if described is None:
            continue
        text = described.group(2).lower()
        if "preempt" in text and "not preemptible" not in text:
            found.add(int(described.group(1)))
    return frozenset(found)


def is_swf(path: Path) -> bool:
    return path.name.endswith((".swf", ".swf.gz"))


def _lines(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
            yield from handle
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc


def ipus_for(processors: int, cores_per_ipu: int) -> int:
    """IPUs a job of ``processors`` cores asks for, before rounding to a partition."""
    return max(1, math.ceil(processors / cores_per_ipu))


def to_trace_jobs(
    swf: Iterable[SwfJob],
    *,
    largest_partition: int,
    cores_per_ipu: int = DEFAULT_CORES_PER_IPU,
    tenant_by: Literal["user", "group"] = "user",
    limit: int | None = None,
    start_row: int = 0,
    preemptible: frozenset[int] = frozenset(),
) -> list[TraceJob]:
    """The jobs that ran, in submission order (the log's order among equal times), as ``TraceJob``s;
    those of the ``preemptible`` queues are preemptible."""
    if cores_per_ipu < 1:
        raise TraceError(f"cores per IPU must be at least 1, not {cores_per_ipu}")
    kept = sorted(
        ((job.submit_s, index, job) for index, job in enumerate(swf) if job.ran),
        key=lambda item: (item[0], item[1]),
    )
    kept = kept[start_row : None if limit is None else start_row + limit]
    if not kept:
        return []
    first = kept[0][0]
    out = []
    for index, (_, _, job) in enumerate(kept):
        wanted = ipus_for(job.processors, cores_per_ipu)
        owner = job.user if tenant_by == "user" else job.group
        out.append(
            TraceJob(
                id=f"j{index:06d}",
                submit_s=job.submit_s - first,
                duration_s=job.run_s,
                size=round_size(wanted, largest_partition),
                tenant=f"{tenant_by[0]}{owner}",
                requested_size=wanted,
                requested_s=max(job.requested_s, job.run_s) if job.requested_s > 0 else None,
                preemptible=job.queue in preemptible,
            )
        )
    return out


def load_swf(
    path: Path,
    *,
    largest_partition: int,
    cores_per_ipu: int = DEFAULT_CORES_PER_IPU,
    tenant_by: Literal["user", "group"] = "user",
    limit: int | None = None,
    start_row: int = 0,
) -> list[TraceJob]:
    """Read an SWF log (``.swf`` or ``.swf.gz``); ``start_row``/``limit`` slice the jobs kept."""
    lines = list(_lines(path))
    _, jobs = parse_swf(lines, source=str(path))
    return to_trace_jobs(
        jobs,
        largest_partition=largest_partition,
        cores_per_ipu=cores_per_ipu,
        tenant_by=tenant_by,
        limit=limit,
        start_row=start_row,
        preemptible=preemptible_queues(lines),
    )
