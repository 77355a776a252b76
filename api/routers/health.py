"""Liveness, readiness and Prometheus metrics, at the root."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.deps import RuntimeDep
from api.problems import problem
from api.schemas import HealthOut, NotReadyOut, ReadyOut
from scheduler.migrate import is_up_to_date

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyOut,
    summary="The database (migrated) and Redis answer",
    responses={503: {"model": NotReadyOut, "description": "Not ready: `checks` says which dependency."}},
)
def readyz(runtime: RuntimeDep) -> Response:
    checks: dict[str, str] = {}
    db = runtime.db
    try:
        with db.read() as s:
            s.execute(text("SELECT 1"))
        checks["database"] = "ok" if is_up_to_date(db.engine) else "migrations pending"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        runtime.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unreachable: {type(exc).__name__}"
    if all(v == "ok" for v in checks.values()):
        return Response(
            content=b'{"status":"ready","checks":' + _json(checks) + b"}", media_type="application/json"
        )
    return problem(
        503,
        "Not ready: " + ", ".join(f"{k} {v}" for k, v in checks.items()),
        slug="unavailable",
        checks=checks,
    )


def _json(d: dict[str, str]) -> bytes:
    import orjson

    return orjson.dumps(d)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "The Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
def metrics() -> Response:
    from api.metrics import registry

    return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)
