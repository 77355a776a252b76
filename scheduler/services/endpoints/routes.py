"""The control plane's link to the data plane (scheduler/inference.py): each endpoint's last minute
of traffic read for the autoscaler, and its route published once the transaction that changed it
commits."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session

from scheduler.models import LIVE_ENDPOINT_STATES, Endpoint

if TYPE_CHECKING:
    import redis

log = logging.getLogger("ipucloud.endpoints")


ROUTE_REFRESH_S = 10.0  # wall seconds between republishing every live route (a lost publish heals)


# The data plane's Redis protocol (scheduler/inference.py), imported where it is used, so this module
# and its tests stand without it.


def _inference() -> Any:
    """The data plane's module, or None in a build without it (routes then go unpublished and the
    autoscaler sees no traffic: endpoints hold their replicas as asked)."""
    try:
        return importlib.import_module("scheduler.inference")
    except ModuleNotFoundError as exc:
        if exc.name != "scheduler.inference":
            raise
        return None


class WindowLike(Protocol):
    """`inference.Window`, the endpoint's last minute, as this module reads it."""

    @property
    def requests(self) -> int: ...
    @property
    def answered(self) -> int: ...
    @property
    def rejected_429(self) -> int: ...
    @property
    def unavailable_503(self) -> int: ...
    @property
    def cold_starts(self) -> int: ...
    @property
    def rps(self) -> float: ...
    @property
    def mean_batch(self) -> float: ...
    @property
    def queue_delay_ms(self) -> float: ...
    @property
    def p50_ms(self) -> float: ...
    @property
    def p90_ms(self) -> float: ...
    @property
    def p99_ms(self) -> float: ...
    @property
    def queued(self) -> int: ...
    @property
    def ready_replicas(self) -> int: ...
    @property
    def arrival_rps(self) -> float: ...
    @property
    def recent_queue_delay_ms(self) -> float | None: ...


def read_windows(
    client: redis.Redis, endpoint_ids: Sequence[str], now: float | None = None, seconds: float = 60.0
) -> dict[str, WindowLike]:
    """Each endpoint's last `seconds` of traffic, a minute unless the autoscaler is set otherwise
    (`inference.windows`); empty when Redis or the data plane cannot say (the autoscaler then holds
    its replicas as they are)."""
    if not endpoint_ids:
        return {}
    inference = _inference()
    if inference is None:
        return {}
    try:
        return dict(inference.windows(client, list(endpoint_ids), seconds=seconds, now=now))
    except Exception as exc:  # a hint for the autoscaler: never the reason a pass fails
        log.warning("could not read the endpoints' traffic: %s", exc)
        return {}


@dataclass(frozen=True)
class RouteFields:
    """What `inference.Route` carries of an endpoint, read while its row is at hand."""

    endpoint_id: str
    tenant_id: str
    name: str
    state: str
    signature: dict[str, Any]
    max_batch_size: int
    max_wait_ms: float
    max_queue: int
    cold_start_timeout_s: float

    @classmethod
    def of(cls, ep: Endpoint) -> RouteFields:
        return cls(
            endpoint_id=ep.id,
            tenant_id=ep.tenant_id,
            name=ep.name,
            state=ep.state,
            signature=dict(ep.signature),
            max_batch_size=int(ep.batching["max_batch_size"]),
            max_wait_ms=float(ep.batching["max_wait_ms"]),
            max_queue=ep.max_queue,
            cold_start_timeout_s=float(ep.cold_start_timeout_s),
        )

    @property
    def live(self) -> bool:
        return self.state in LIVE_ENDPOINT_STATES


def publish_routes(client: redis.Redis, routes: Iterable[RouteFields]) -> int:
    """Publish each live endpoint's route and remove each stopped one's; returns how many were
    written. Called after the commit that changed them."""
    done = 0
    inference = _inference()
    if inference is None:
        return 0
    for r in routes:
        try:
            if r.live:
                inference.publish_route(
                    client,
                    inference.Route(
                        endpoint_id=r.endpoint_id,
                        tenant_id=r.tenant_id,
                        name=r.name,
                        state=r.state,
                        signature=r.signature,
                        max_batch_size=r.max_batch_size,
                        max_wait_ms=r.max_wait_ms,
                        max_queue=r.max_queue,
                        cold_start_timeout_s=r.cold_start_timeout_s,
                    ),
                )
            else:
                inference.remove_route(client, r.endpoint_id)
            done += 1
        except Exception as exc:  # the serve pass publishes every live route again within ROUTE_REFRESH_S
            log.warning("could not publish the route of %s: %s", r.endpoint_id, exc)
    return done


def routes_after_commit(session: Session, routes: Sequence[RouteFields]) -> None:
    """Publish these routes once the session's transaction commits (never if it rolls back)."""
    from sqlalchemy import event

    from scheduler import runtime

    pending: list[RouteFields] = session.info.setdefault("ipucloud.routes", [])
    if not pending:

        def flush(s: Session) -> None:
            todo = s.info.pop("ipucloud.routes", [])
            try:
                client = runtime.current().redis
            except Exception as exc:
                log.warning("no Redis to publish routes on: %s", exc)
                return
            publish_routes(client, todo)

        event.listen(session, "after_commit", flush, once=True)
        event.listen(session, "after_rollback", lambda s: s.info.pop("ipucloud.routes", None), once=True)
    pending.extend(routes)
