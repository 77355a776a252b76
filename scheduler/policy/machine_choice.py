"""Which machine type a job that may run on several runs on: heterogeneity-aware placement.

A job submitted with ``machine: any`` carries one ``MachineOption`` per type it fits on (its
partition size there, the emulator's predicted run time there, the rate it would be billed). Before
a pass places such a job, ``Chooser.settle`` turns it into a job of one type, and from there on the
pass treats it like any typed job: it starts, is reserved for, is backfilled around, on that type.

- ``finish`` (the default policy): the type where it is predicted to **finish** first, counting the
  wait there and the run time there. A type with room now finishes it at ``now + run time``. On a
  type without room it waits:

  - first in line, until its reservation there (the earliest-start question EASY backfill asks,
    answered on the time table of running jobs);
  - behind others, for the work queued ahead of it there: ``now + (work running there + work this
    pass left waiting there) / the type's IPUs`` (in IPU-seconds), the fluid approximation of a
    queue. A pass adds every job it settles on a type without room to that type's waiting work, so
    the jobs behind see the queue grow and spread over the types.

  So a job waits a little for a Bow partition rather than starting now on a first-generation server
  where it would run three times longer, but takes the server when the wait would cost more.
  A job whose tenant asked for ``prefer: cost`` goes where it spends the least of its grant
  (rate x size x run time), ties broken by the earliest finish.
- ``first-fit`` (the type-blind baseline): the first type, in registry order, with room for it now;
  when none has room, the type where it can start soonest. It knows which types the job fits on,
  not how fast it runs on each.

Reservations are asked only for the first job in line, cached per (type, size) for the pass (free
space only shrinks while a pass places jobs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal, Protocol

from scheduler.policy.model import MachineOption, QueuedJob, Reservation

Objective = Literal["finish", "first-fit"]
OBJECTIVES: tuple[Objective, ...] = ("finish", "first-fit")


class Planner(Protocol):
    """What the chooser asks of a pass's planner (``scheduler.policy.planners``)."""

    def fits_now(self, job: QueuedJob) -> bool: ...

    def reserve(self, job: QueuedJob) -> Reservation: ...


def typed(job: QueuedJob, option: MachineOption) -> QueuedJob:
    """The job as a job of ``option``'s type only. (Its quota was judged before, on what its
    reservation covers: its dearest option.)"""
    # Built directly rather than with dataclasses.replace: a pass settles thousands of jobs.
    fields = {name: getattr(job, name) for name in _FIELDS}
    fields.update(
        machine_type=option.machine_type,
        size=option.size,
        predicted_runtime_s=option.predicted_runtime_s,
        options=(),
    )
    return QueuedJob(**fields)


_FIELDS = tuple(QueuedJob.__dataclass_fields__)


class Chooser:
    """Settles jobs with several machine options on one, for one pass."""

    def __init__(
        self,
        planner: Planner,
        now: float,
        objective: Objective,
        *,
        timed: bool = True,
        hopeless: Callable[[str, int], bool] | None = None,
        room: Callable[[str, int], bool] | None = None,
        load: Callable[[], Mapping[str, tuple[float, int]]] | None = None,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown machine choice {objective!r}; one of {', '.join(OBJECTIVES)}")
        self._planner = planner
        self._now = now
        self._objective = objective
        # Without a time table (a count-only planner) reservations are counts, not starts on a type:
        # only first-fit is meaningful.
        self._timed = timed
        # What the pass already knows cannot start now (a size of a type that failed this pass):
        # asking the planner again would only cost time.
        self._hopeless = hopeless or (lambda kind, size: False)
        # Whether a partition of a size and type could form now; by default the planner's answer.
        self._room = room
        # Per type: (IPU-seconds running jobs still have to run, the type's IPUs), asked once.
        self._load_source = load
        self._load: dict[str, tuple[float, int]] | None = None
        self._waiting: dict[str, float] = {}  # IPU-seconds this pass settled on a type without room
        self._starts: dict[tuple[str, int], float] = {}

    def settle(self, job: QueuedJob, *, first: bool = True) -> QueuedJob:
        """``job`` as a job of the type it should run on (unchanged when it has no choice).

        ``first``: it is first in line, so where it waits matters (its reservation is made there).
        Behind the first job a job that has no room now on any type waits for the next pass, which
        asks again; it is settled on its first type without asking when each type would have room.
        """
        if job.machine_type is not None or not job.options:
            return job
        if len(job.options) == 1:
            return typed(job, job.options[0])
        return typed(job, self.choose(job, first=first))

    def _fits(self, job: QueuedJob, option: MachineOption) -> bool:
        if self._hopeless(option.machine_type, option.size):
            return False
        if self._room is not None:
            return self._room(option.machine_type, option.size)
        return self._planner.fits_now(typed(job, option))

    def choose(self, job: QueuedJob, *, first: bool = True) -> MachineOption:
        options = job.options
        room = [self._fits(job, option) for option in options]
        if self._objective == "first-fit" or not self._timed:
            for option, fits in zip(options, room, strict=True):
                if fits:
                    return option
            if not self._timed or not first:
                return options[0]
            return min(options, key=lambda o: (self._start(job, o, first), options.index(o)))

        def finish(option: MachineOption, fits: bool) -> float:
            start = self._now if fits else self._start(job, option, first)
            return start + option.predicted_runtime_s

        if job.prefer == "cost":
            ranked = sorted(
                zip(options, room, strict=True),
                key=lambda pair: (pair[0].cost_ipu_ms, options.index(pair[0])),
            )
            # The cheapest type it can ever start on; among equally cheap ones, the earliest finish.
            cheapest = [p for p in ranked if p[0].cost_ipu_ms == ranked[0][0].cost_ipu_ms]
            chosen = None
            for option, fits in sorted(cheapest, key=lambda p: finish(*p)):
                if math.isfinite(finish(option, fits)):
                    chosen = (option, fits)
                    break
            else:
                chosen = next(((o, f) for o, f in ranked if math.isfinite(finish(o, f))), ranked[0])
            return self._settled(*chosen)

        best: tuple[float, int] | None = None
        for n, (option, fits) in enumerate(zip(options, room, strict=True)):
            if fits:
                candidate = (self._now + option.predicted_runtime_s, n)
                if best is None or candidate < best:
                    best = candidate
        for n, (option, fits) in enumerate(zip(options, room, strict=True)):
            if fits:
                continue
            if best is not None and self._now + option.predicted_runtime_s >= best[0]:
                continue  # even starting at once there, it would not finish first
            candidate = (finish(option, False), n)
            if best is None or candidate < best:
                best = candidate
        if best is None or not math.isfinite(best[0]):
            # It can start on no type, not even when everything running has ended (machines are
            # down): wait for the first type, where it is explained.
            return options[0]
        return self._settled(options[best[1]], room[best[1]])

    def _settled(self, option: MachineOption, fits: bool) -> MachineOption:
        if not fits:
            kind = option.machine_type
            self._waiting[kind] = self._waiting.get(kind, 0.0) + option.size * option.predicted_runtime_s
        return option

    def _queue_start(self, option: MachineOption) -> float:
        """When a job behind others could start on a type: once the work running there and the work
        queued ahead of it there has drained through the type's IPUs."""
        if self._load is None:
            self._load = dict(self._load_source()) if self._load_source is not None else {}
        running, ipus = self._load.get(option.machine_type, (0.0, 0))
        if ipus <= 0:
            return math.inf
        return self._now + (running + self._waiting.get(option.machine_type, 0.0)) / ipus

    def _start(self, job: QueuedJob, option: MachineOption, first: bool) -> float:
        if not first:
            # Behind the first job in line, the queue ahead is what it waits for: the fluid estimate
            # (asked without building a time table, so a pass can settle thousands of jobs).
            return self._queue_start(option)
        key = (option.machine_type, option.size)
        start = self._starts.get(key)
        if start is None:
            start = self._planner.reserve(typed(job, option)).start
            self._starts[key] = start
        return start
