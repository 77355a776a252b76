"""Start-up checks: a component refuses to start, with a clear message, when its database or Redis
cannot be reached after a bounded wait, when migrations are not applied, or a secret is missing."""

from __future__ import annotations

import time

import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from scheduler.db import is_sqlite, make_engine, normalise_url
from scheduler.migrate import current_revision, head_revision
from scheduler.settings import ConfigError, Settings


def _probe_engine(settings: Settings) -> Engine:
    """An engine whose every connection attempt gives up in seconds: a host that drops packets
    (a cut link, a firewall) would otherwise hold one attempt for TCP's full SYN timeout, minutes
    past the bounded wait."""
    url = normalise_url(settings.db_url)
    if is_sqlite(url):
        return make_engine(url)
    timeout = max(1, min(5, round(settings.startup_wait_s) or 1))
    return create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": timeout})


def static_problems(settings: Settings) -> list[str]:
    """What is missing from the configuration itself, found before waiting for anything."""
    if settings.embedded:
        return []
    problems = []
    if not settings.database_url:
        problems.append(
            "IPUCLOUD_DATABASE_URL is not set (required outside `ipucloud up`; every host must share "
            "one PostgreSQL, e.g. postgresql://ipucloud:PASSWORD@db.example:5432/ipucloud)"
        )
    if not settings.redis_url:
        problems.append(
            "IPUCLOUD_REDIS_URL is not set (required outside `ipucloud up`, e.g. redis://redis:6379/0)"
        )
    try:
        settings.secret()
    except ConfigError as exc:
        problems.append(
            f"{exc}; generate one with `python -c 'import secrets; print(secrets.token_urlsafe(48))'`"
        )
    return problems


def wait_for_database(settings: Settings, *, require_migrated: bool = True) -> None:
    deadline = time.monotonic() + settings.startup_wait_s
    engine = _probe_engine(settings)
    last: Exception | None = None
    try:
        while True:
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
                break
            except Exception as exc:
                last = exc
                if time.monotonic() >= deadline:
                    where = engine.url.render_as_string(hide_password=True)
                    raise ConfigError(
                        f"The database at {where} is unreachable after {settings.startup_wait_s:g} s: {last}"
                    )
                time.sleep(0.5)
        if require_migrated:
            have, want = current_revision(engine), head_revision()
            if have != want:
                raise ConfigError(
                    f"The database schema is at {have or 'nothing'}, the code needs {want}: "
                    "run `ipucloud migrate` first."
                )
    finally:
        engine.dispose()


def wait_for_redis(settings: Settings) -> None:
    url = settings.broker_url
    deadline = time.monotonic() + settings.startup_wait_s
    while True:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
            client.ping()
            client.close()
            return
        except redis.RedisError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"Redis at {_redact(url)} is unreachable after {settings.startup_wait_s:g} s: {exc}"
                )
            time.sleep(0.5)


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def check_all(settings: Settings, *, require_migrated: bool = True) -> None:
    problems = static_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))
    wait_for_database(settings, require_migrated=require_migrated)
    wait_for_redis(settings)
