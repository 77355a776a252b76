"""The cloud's two clocks and the one object that converts between them.

Users see cluster time: what a job would take on real IPUs. The emulated cluster runs
`time_scale` cluster seconds per wall second (`IPUCLOUD_TIME_SCALE`; 1 by default, 60 under
`ipucloud up`), so every run time, quota, session limit and retry schedule counted in cluster
seconds lasts `1 / time_scale` of that on the wall clock, and every wall interval a process
measures is `time_scale` times as long in cluster time. That arithmetic lives here, once, in a
`Clock` the process's runtime owns (`Runtime.clock`); code reaches it explicitly (the API's
`ClockDep`, the loop's and the agent's runtime), never by reading the setting and multiplying.

Cluster time has no epoch of its own: an instant is always a wall instant (an aware UTC datetime,
what the database stores), and "cluster now" is the cluster seconds elapsed since a wall instant
(`cluster_since`). Leases are judged against yet another reading of the wall clock, the
database's (`scheduler.services.clock.db_now`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from scheduler.settings import Settings

CLUSTER = "cluster time"
WALL = "wall clock"


@dataclass(frozen=True)
class Clock:
    """`scale`: cluster seconds per wall second (> 0). `name` is what a figure in cluster seconds
    is labelled with where a person reads it; `wall_name` the same for wall-clock figures."""

    scale: float = 1.0
    name: str = field(default=CLUSTER)
    wall_name: str = field(default=WALL)

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"a clock's scale must be positive, not {self.scale!r}")

    @classmethod
    def of(cls, settings: Settings) -> Clock:
        """The clock a process's settings describe (`IPUCLOUD_TIME_SCALE`): how `Runtime` builds its
        own, and what code handed only the settings (an estimate) converts with."""
        return cls(settings.time_scale)

    def wall_now(self) -> datetime:
        """Now on the wall clock, an aware UTC datetime (this host's; see the module's docstring)."""
        # Not models.utcnow: `ipucloud up` names its clock before anything may load SQLAlchemy.
        return datetime.now(UTC)

    # Durations.
    def to_wall(self, cluster_s: float) -> float:
        """Wall seconds that `cluster_s` cluster seconds take."""
        return cluster_s / self.scale

    def to_cluster(self, wall_s: float) -> float:
        """Cluster seconds that pass in `wall_s` wall seconds."""
        return wall_s * self.scale

    def wall_delta(self, cluster_s: float) -> timedelta:
        """`to_wall` as a timedelta, to add to a wall instant."""
        return timedelta(seconds=cluster_s / self.scale)

    # Instants.
    def cluster_since(self, start: datetime, now: datetime) -> float:
        """Cluster seconds between two wall instants."""
        return (now - start).total_seconds() * self.scale

    def wall_after(self, start: datetime, cluster_s: float) -> datetime:
        """The wall instant `cluster_s` cluster seconds after `start`."""
        return start + timedelta(seconds=cluster_s / self.scale)


# Cluster time at the wall clock's pace: the default where a caller states no scale (tests, tools).
UNSCALED = Clock()
