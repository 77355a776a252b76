"""Start-up checks: a component refuses to start, with a clear message, when its database or Redis
cannot be reached after a bounded wait, when migrations are not applied, or a secret is missing."""

from __future__ import annotations

import time

import redis
from sqlalchemy import text

from scheduler.db import make_engine
from scheduler.migrate import current_revision, head_revision
from scheduler.settings import ConfigError, Settings


def wait_for_database(settings: Settings, *, require_migrated: bool = True) -> None:
    deadline = time.monotonic() + settings.startup_wait_s
    engine = make_engine(settings.db_url)
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
    settings.secret()  # raises ConfigError when missing outside the embedded mode
    wait_for_database(settings, require_migrated=require_migrated)
    wait_for_redis(settings)
