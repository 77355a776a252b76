"""The database: typed SQLAlchemy 2 models. The scheduler owns it; nothing else writes SQL.

Money-like amounts (quota, usage, meter events) are integer IPU-milliseconds of cluster time, so
sums are exact on every database.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.model_base import Base, BigIntPK, UTCDateTime, utcnow


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptState(enum.StrEnum):
    PLACED = "placed"  # partition held, outbox row written, not yet taken by a worker
    RUNNING = "running"  # a worker holds the lease
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the job's own fault (does not fit, exhausted quota): billed for what ran
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"  # platform fault (lease expired, worker gone): never billed
    HANDED_BACK = "handed_back"  # worker shut down gracefully and returned it: never billed
    PREEMPTED = "preempted"  # made room for higher-priority work: never billed
    INTERRUPTED = "interrupted"  # a machine under it failed: never billed, not held against the job


LIVE_ATTEMPT_STATES = frozenset({AttemptState.PLACED, AttemptState.RUNNING})

# The task of an inference endpoint's replica: a holder job (hidden from the job list) whose attempt a
# host agent runs as a model server until it is drained (scheduler/services/endpoints/).
SERVE_TASK = "serve"
PLATFORM_FAULT_STATES = frozenset(
    {AttemptState.LOST, AttemptState.HANDED_BACK, AttemptState.PREEMPTED, AttemptState.INTERRUPTED}
)


class Plan(Base):
    __tablename__ = "plans"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # trial | standard | internal
    description: Mapped[str] = mapped_column(String(500), default="")
    quota_ipu_hours: Mapped[float] = mapped_column(Float)  # grant given to a new tenant
    trial_days: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_partition_size: Mapped[int] = mapped_column(Integer)
    max_concurrent_jobs: Mapped[int] = mapped_column(Integer)
    max_queued_jobs: Mapped[int] = mapped_column(Integer)
    max_runtime_s: Mapped[int] = mapped_column(BigInteger)
    idle_timeout_s: Mapped[int] = mapped_column(BigInteger)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    fairshare_weight: Mapped[float] = mapped_column(Float, default=1.0)
    # Grant units per IPU-hour by machine type where this plan differs from the registry's
    # (`vipu.machine_types`), and the types its tenants may use (None: every type).
    rates: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    machine_types: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # A tenant's own ONNX graphs: how many it may keep, and their bytes (weights stripped) together.
    max_models: Mapped[int] = mapped_column(Integer, default=10, server_default="10")
    max_model_bytes: Mapped[int] = mapped_column(
        BigInteger, default=256 * 2**20, server_default=str(256 * 2**20)
    )
    # Preemptible work runs at its rates times (1 - discount) (docs/checkpoints.md).
    preemptible_discount: Mapped[float] = mapped_column(Float, default=0.5, server_default="0.5")
    # Its tenants' jobs are never preempted, whatever each job says (docs/scheduling.md).
    never_preempt: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # How long after a job stopped at its time limit its owner may still resume it from its checkpoint.
    checkpoint_retention_s: Mapped[int] = mapped_column(
        BigInteger, default=7 * 86400, server_default=str(7 * 86400)
    )
    # Webhooks a tenant on this plan may register (scheduler/services/tenancy/notifications.py).
    max_webhooks: Mapped[int] = mapped_column(Integer, default=10, server_default="10")
    # The longest a session may hold its partition, in cluster seconds (scheduler/services/sessions/).
    max_session_s: Mapped[int] = mapped_column(BigInteger, default=6 * 3600, server_default=str(6 * 3600))
    # Inference endpoints (scheduler/services/endpoints/): how many a tenant may keep, the most
    # replicas one may scale to, and the IPUs all of a tenant's endpoints may hold at their maxima.
    max_endpoints: Mapped[int] = mapped_column(Integer, default=2, server_default="2")
    max_endpoint_replicas: Mapped[int] = mapped_column(Integer, default=2, server_default="2")
    max_endpoint_ipus: Mapped[int] = mapped_column(Integer, default=8, server_default="8")
    # The most elements one job array or sweep may have (scheduler/services/batch/arrays.py).
    max_array_size: Mapped[int] = mapped_column(Integer, default=64, server_default="64")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    plan_name: Mapped[str] = mapped_column(ForeignKey("plans.name"))
    status: Mapped[str] = mapped_column(String(16), default="active")  # active | suspended
    category: Mapped[str | None] = mapped_column(String(16), nullable=True)
    organisation: Mapped[str | None] = mapped_column(String(200), nullable=True)
    contact_email: Mapped[str | None] = mapped_column(String(254), nullable=True)
    quota_ipu_ms: Mapped[int] = mapped_column(BigInteger)
    used_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    fairshare_weight: Mapped[float] = mapped_column(Float, default=1.0)
    # Fair share (scheduler.services.batch.scheduling): decayed IPU-seconds of cluster time as last sampled,
    # the `used_ipu_ms` counter at that sample, and when. Sampled by the scheduler, so a pass reads
    # each tenant's standing in O(1) instead of summing its meter events.
    fairshare_usage_ipu_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    fairshare_used_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    fairshare_sampled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # An upper bound on the tenant's queued jobs, kept under its row lock by admission: the exact
    # count as of the last recount plus every job admitted since (jobs that start or end only make
    # it higher than the truth). Admission counts the queue only when this bound reaches the plan's
    # limit, so a long queue costs nothing per submission (scheduler.services.batch.jobs).
    queued_jobs_bound: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


# Tenant names are unique whatever their case (`Acme` and `acme` would be one customer to a person);
# `name` keeps its own unique constraint as well (migration 0015_hardening).
Index("uq_tenants_name_lower", func.lower(Tenant.name), unique=True)


class Member(Base):
    __tablename__ = "members"
    __table_args__ = (UniqueConstraint("tenant_id", "email", name="uq_members_tenant_email"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True, index=True)
    email: Mapped[str] = mapped_column(String(254))
    name: Mapped[str] = mapped_column(String(100), default="")
    role: Mapped[str] = mapped_column(String(16))  # admin (global, no tenant) | owner | member
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    lookup: Mapped[str] = mapped_column(String(32), unique=True)  # public part of the key
    key_hash: Mapped[str] = mapped_column(String(128))  # HMAC-SHA256 of the whole key
    name: Mapped[str] = mapped_column(String(100), default="")
    scopes: Mapped[str] = mapped_column(String(64))  # space separated: read submit admin
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True, index=True)
    member_id: Mapped[str | None] = mapped_column(ForeignKey("members.id"), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The key that created this one (None for keys the cloud made itself), for the audit trail.
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)


class TrialApplication(Base):
    __tablename__ = "trial_applications"
    __table_args__ = (
        # One pending application per address: the database refuses the duplicate, so two racing
        # submissions cannot both get in.
        Index(
            "uq_trial_applications_pending_email",
            "email",
            unique=True,
            sqlite_where=text("status = 'pending'"),
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    email: Mapped[str] = mapped_column(String(254))
    organisation: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(16))  # business | university | individual
    intended_use: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    plan: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the plan it was approved on
    decided_by: Mapped[str | None] = mapped_column(String(40), nullable=True)  # the admin key's id


class Machine(Base):
    __tablename__ = "machines"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # pod0003-m07, or a server's srv0004
    pod: Mapped[int] = mapped_column(Integer, index=True)  # the unit (POD or server) index
    rack: Mapped[int] = mapped_column(Integer)
    slot: Mapped[int] = mapped_column(Integer)  # machine in the unit: ring position in a POD, 0 in a server
    machine_type: Mapped[str] = mapped_column(String(16))
    layout: Mapped[str] = mapped_column(
        String(16), default="pod64", server_default="pod64"
    )  # pod64|pod16|server
    model: Mapped[str | None] = mapped_column(String(16), nullable=True)  # a server's model, e.g. dss8440
    # A retired machine has left the fleet; its rows stay for the partitions and bills that name it.
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    health: Mapped[str] = mapped_column(String(16), default="up")
    health_reason: Mapped[str | None] = mapped_column(String(500), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Ipu(Base):
    __tablename__ = "ipus"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # pod0003-m07-i2, srv0004-i13
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # position in its unit: ring position in a POD64
    health: Mapped[str] = mapped_column(String(16), default="up")


class Partition(Base):
    __tablename__ = "partitions"
    __table_args__ = (
        # A name is unique among live partitions only, so V-IPU's `remove` then `create p1` works.
        Index(
            "uq_partitions_live_name",
            "name",
            unique=True,
            sqlite_where=text("released_at IS NULL"),
            postgresql_where=text("released_at IS NULL"),
        ),
    )

    pk: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))  # job | reserved
    size: Mapped[int] = mapped_column(Integer)
    machine_type: Mapped[str] = mapped_column(String(16))
    gcds: Mapped[int] = mapped_column(Integer, default=1)
    reconfigurable: Mapped[bool] = mapped_column(Boolean, default=False)
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True, index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), nullable=True, index=True)
    ipu_ids: Mapped[list[str]] = mapped_column(JSON)  # kept after release, for history
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)


class IpuAssignment(Base):
    """Live assignments only: the primary key on the IPU makes double allocation impossible."""

    __tablename__ = "ipu_assignments"

    ipu_id: Mapped[str] = mapped_column(ForeignKey("ipus.id"), primary_key=True)
    partition_pk: Mapped[int] = mapped_column(ForeignKey("partitions.pk"), index=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        Index("ix_jobs_state_priority", "state", "priority"),
        Index("ix_jobs_tenant_created", "tenant_id", "id"),
        # Counting a tenant's queued jobs at admission reads only its own queued entries.
        Index("ix_jobs_tenant_state", "tenant_id", "state"),
        Index("ix_jobs_session_id", "session_id", "id"),
        Index("ix_jobs_endpoint_id", "endpoint_id", "state"),
        Index("ix_jobs_array_id", "array_id", "array_index"),
        # The scheduler reads the jobs held for their dependencies every pass (few, by this index).
        Index("ix_jobs_held_for", "held_for"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the workload as submitted, normalised
    model: Mapped[str] = mapped_column(String(40))
    task: Mapped[str] = mapped_column(String(16))
    ipus: Mapped[int] = mapped_column(Integer)  # resolved partition size ("auto" is resolved at submit)
    ipus_requested: Mapped[str] = mapped_column(String(8))  # "auto" or the number asked for
    machine_type: Mapped[str | None] = mapped_column(String(16), nullable=True)  # None: any type
    # For a job that may run on several types: per type, {"ipus", "predicted_runtime_s", "rate"}.
    options: Mapped[dict[str, dict[str, float]] | None] = mapped_column(JSON, nullable=True)
    prefer: Mapped[str] = mapped_column(String(8), default="time", server_default="time")  # time | cost
    partition_name: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a reserved partition
    session_id: Mapped[str | None] = mapped_column(String(40), nullable=True)  # runs in this session
    # A replica of this inference endpoint (task `serve`): its holder job (scheduler/services/endpoints/).
    endpoint_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_runtime_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Preemptible work (cheaper; non-preemptible work of any tenant may stop it after a warning) and
    # how often a training job checkpoints, in cluster seconds (docs/checkpoints.md).
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Opted out of preemption: never stopped for other work, charged as without it (docs/scheduling.md).
    never_preempt: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    checkpoint_every_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Run time (cluster s) its time limit no longer counts: what it had run when its owner resumed it.
    runtime_base_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    predicted_runtime_s: Mapped[float] = mapped_column(Float)
    reserved_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)  # quota held for this job
    state: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED)
    reason: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # Why a queued job waits, as the scheduler's last pass explained it.
    wait: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The 202 body as first sent, so an Idempotency-Key replay returns exactly that response.
    submit_response: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Who submitted it (the member of the key), and what of its life it asked to be mailed about
    # (`notify.on`, as Slurm's --mail-type): scheduler/services/tenancy/mail.py.
    submitted_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    notify: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # An element of a job array or sweep (scheduler/services/batch/arrays.py): the array, its index there,
    # and the swept parameters it was given (paths into the spec, e.g. `workload.batch_size`).
    array_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Dependencies: {"mode": "all" | "any", "on": [{"job": id, "type": ...}], "on_unsatisfiable":
    # "cancel" | "hold"}; `held_for` is "dependency" while they keep it from the scheduler.
    depends_on: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    held_for: Mapped[str | None] = mapped_column(String(16), nullable=True)
    singleton: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")


class JobArray(Base):
    """One handle for many jobs: a job array or a parameter sweep. Its elements are ordinary jobs
    (`Job.array_id`, `Job.array_index`); its figures are read from them."""

    __tablename__ = "arrays"
    __table_args__ = (
        Index("ix_arrays_tenant_id", "tenant_id", "id"),
        # Two first submissions with one key cannot both land (migration 0016_array_idem); NULLs
        # (no key) never collide.
        Index("uq_arrays_tenant_idempotency_key", "tenant_id", "idempotency_key", unique=True),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(Integer)
    indices: Mapped[str] = mapped_column(String(1000))  # as given, e.g. "0-99:2" or "1,5,7"
    max_running: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sweep: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the sweep as asked for
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the base spec its elements were made from
    reserved_at_submit_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class JobEvent(Base):
    """The job's history and log: state changes, placement, worker log lines, progress."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))  # state | log | progress
    message: Mapped[str] = mapped_column(String(2000))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
        # An agent's own attempts, for its lapse and its periodic look at what it should be running.
        Index("ix_attempts_agent", "worker", "agent_epoch", "state"),
        # One live attempt per graph compile domain: a job partition has one, a reserved partition
        # with N GCDs runs up to N jobs at once.
        Index(
            "uq_attempts_live_partition_gcd",
            "partition_pk",
            "gcd",
            unique=True,
            sqlite_where=text("state IN ('placed', 'running')"),
            postgresql_where=text("state IN ('placed', 'running')"),
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default=AttemptState.PLACED)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)  # fencing token for worker writes
    partition_pk: Mapped[int] = mapped_column(ForeignKey("partitions.pk"), index=True)
    # The partition's graph compile domain it runs on (IPUOF_VIPU_API_GCD_ID); `size` is that GCD's
    # IPUs, what it holds and is billed for.
    gcd: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    size: Mapped[int] = mapped_column(Integer)
    machine_type: Mapped[str] = mapped_column(String(16))
    rate: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")  # grant units per IPU-hour
    queue_wait_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # wall s from submission to here
    # The host agent that took it (its name) and the incarnation of that agent (its lease epoch):
    # the attempt is live exactly as long as that incarnation's lease is (scheduler.services.capacity.agents).
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    agent_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The run's timeline, fixed when it was taken (vipu.emulator.Timeline plus the time scale), so
    # anyone can derive where a running attempt is instead of the agent writing it every second.
    timeline: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    placed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cluster_s: Mapped[float] = mapped_column(Float, default=0.0)  # cluster time billed so far (final at end)
    metered_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)  # ticks billed so far
    # How much of the job's quota reservation those ticks consumed, to restore it if not billed.
    reservation_used_ipu_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    ticks: Mapped[int] = mapped_column(Integer, default=0)
    # Cluster seconds at its start that are not billed: restoring a checkpoint (compile and load of a
    # resumed run) is the platform's cost, so the tenant pays for every step once.
    unbilled_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # A preemption warning: the attempt checkpoints and ends itself by then, or is stopped.
    preempt_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # As it ended: attempts.ProgressView, written whole (JSON, so never changed in place).
    progress: Mapped[Mapping[str, Any] | None] = mapped_column(JSON, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(1000), nullable=True)


class Checkpoint(Base):
    """A training job's saved state: the step it had completed, its samples and the executable that
    ran it. Written by the host agent in its tick's transaction; a new attempt resumes from the last."""

    __tablename__ = "checkpoints"
    __table_args__ = (
        # A replayed tick writes nothing twice.
        UniqueConstraint("attempt_id", "step", name="uq_checkpoints_attempt_step"),
        Index("ix_checkpoints_job_id_id", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"))
    attempt: Mapped[int] = mapped_column(Integer)  # the attempt's number
    step: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(BigInteger)
    executable_key: Mapped[str] = mapped_column(String(80))
    machine_type: Mapped[str] = mapped_column(String(16))
    # Where in the attempt's run (its own cluster time), and the job's run time kept by it: the
    # billed cluster time of every attempt up to this checkpoint.
    cluster_s: Mapped[float] = mapped_column(Float)
    run_s: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(String(16))  # periodic | preemption | time_limit | shutdown
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AgentState(enum.StrEnum):
    ACTIVE = "active"  # holds its lease, renewed by its heartbeat
    STOPPED = "stopped"  # shut down and handed back what it ran
    LAPSED = "lapsed"  # its lease ran out: the reconciler ended everything it held


class Agent(Base):
    """A host agent (`ipucloud worker`): one lease for every attempt it drives.

    Like slurmd's node heartbeat or the kubelet's node Lease, liveness is per host: the agent renews
    `lease_expires_at` with one heartbeat for all its attempts, and `epoch` names its incarnation.
    A restarted agent registers again under a new epoch; writes of the old one are refused.
    """

    __tablename__ = "agents"
    __table_args__ = (Index("ix_agents_state_lease", "state", "lease_expires_at"),)

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default=AgentState.ACTIVE)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # As of its last heartbeat: attempts it drives and the IPUs they hold.
    running: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ipus_busy: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class OutboxMessage(Base):
    """'Attempt N of job J is ready', written in the placement's transaction, published after."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_pending", "published_at", "acked_at"),
        # Which queues workers are taking from right now (scheduler.services.capacity.reconciler).
        Index("ix_outbox_acked_at", "acked_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    queue: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    publish_count: Mapped[int] = mapped_column(Integer, default=0)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class MeterEvent(Base):
    """One billed slice of an attempt. Its id is deterministic, so a replay inserts nothing twice."""

    __tablename__ = "meter_events"
    __table_args__ = (Index("ix_meter_events_tenant_at", "tenant_id", "at"),)

    id: Mapped[str] = mapped_column(String(80), primary_key=True)  # att:<attempt>:tick:<n> | :settle
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # tick | settle
    ipu_ms: Mapped[int] = mapped_column(BigInteger)  # grant spent (rate x IPU-ms); negative refunds
    machine_type: Mapped[str | None] = mapped_column(String(16), nullable=True)
    rate: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")
    raw_ipu_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # IPU-ms run, before the rate
    partition_size: Mapped[int] = mapped_column(Integer)
    cluster_s: Mapped[float] = mapped_column(Float)
    workload: Mapped[str] = mapped_column(String(40))
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)  # settle: the attempt's end
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LeaderLease(Base):
    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class OwnModel(Base):
    """A tenant's own ONNX graph, its weights stripped: small enough to live in the database, where every
    API process and host agent reads it (no shared file system needed). Immutable once stored."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_models_tenant_name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    sha256: Mapped[str] = mapped_column(String(64))  # of the stored (stripped) graph: its content
    graph: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    graph_bytes: Mapped[int] = mapped_column(BigInteger)
    uploaded_bytes: Mapped[int] = mapped_column(BigInteger)
    weights_stripped_bytes: Mapped[int] = mapped_column(BigInteger)
    dims: Mapped[dict[str, int]] = mapped_column(JSON)  # default sizes of the graph's dynamic dimensions
    elementwise: Mapped[list[str]] = mapped_column(JSON)  # operators the tenant declared element-wise
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)  # vipu.emulator.onnxgraph.describe()
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Executable(Base):
    """The executable cache: a compiled graph by its key, so a rerun skips compilation."""

    __tablename__ = "executables"

    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    machine_type: Mapped[str] = mapped_column(String(16))
    compile_s: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    hits: Mapped[int] = mapped_column(BigInteger, default=0)


class ReconcilerAction(Base):
    """What the scheduler's reconciler repaired, one row per repair: the durable record behind the
    cluster counters in the API's `/metrics` (the reconciler runs in another process)."""

    __tablename__ = "reconciler_actions"
    __table_args__ = (Index("ix_reconciler_actions_action_at", "action", "at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # lease_expired | outbox_republished | orphan_partition_freed | attempt_of_ended_job_ended
    # | cancel_completed
    action: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    attempt_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    partition_pk: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    leader_epoch: Mapped[int] = mapped_column(BigInteger)
    detail: Mapped[str] = mapped_column(String(500), default="")


class SessionState(enum.StrEnum):
    STARTING = "starting"  # queued for a partition like a job
    ACTIVE = "active"  # holds its partition; its jobs start on it at once
    ENDED = "ended"


class IpuSession(Base):
    """A held partition (scheduler/services/sessions/). It queues as its holder job (`job_id`,
    task `session`), whose attempt on graph compile domain -1 holds the partition and is metered
    per held IPU-second; the session's own jobs run on GCDs 0.. of that partition."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_tenant_id", "tenant_id", "id"),
        Index("ix_sessions_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(100), default="")
    state: Mapped[str] = mapped_column(String(16), default=SessionState.STARTING)
    ended_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ended_detail: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    ipus: Mapped[int] = mapped_column(Integer)
    machine: Mapped[str] = mapped_column(String(16))  # as asked: a type or `any`
    gcds: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    max_duration_s: Mapped[int] = mapped_column(BigInteger)  # cluster seconds
    idle_timeout_s: Mapped[int] = mapped_column(BigInteger)  # cluster seconds
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)  # the holder job
    attempt_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # the holding attempt
    partition_pk: Mapped[int | None] = mapped_column(ForeignKey("partitions.pk"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The earliest its idle countdown may start from: its start, or later once a warning that was
    # missed has been given its time (scheduler/services/sessions/sweep.py). Jobs' ends move it on.
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The deadline the last warning was about (wall time), so each is announced once.
    warned_for: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class EndpointState(enum.StrEnum):
    PROVISIONING = "provisioning"  # replicas asked for, none serving yet
    READY = "ready"  # as many replicas serving as it wants
    SCALED_TO_ZERO = "scaled-to-zero"  # idle: no replica held; a request starts one (a cold start)
    DEGRADED = "degraded"  # a replica was lost or failed and is being replaced
    FAILED = "failed"  # its replicas fail to start again and again: nothing more is tried
    STOPPED = "stopped"  # deleted, or its tenant's grant ran out (`reason`)


LIVE_ENDPOINT_STATES = frozenset(
    {EndpointState.PROVISIONING, EndpointState.READY, EndpointState.SCALED_TO_ZERO, EndpointState.DEGRADED}
)


class Endpoint(Base):
    """An inference endpoint: a model served by replicas, each a holder job (task `serve`) whose
    attempt a host agent runs as a model server (scheduler/services/endpoints/). All durations are
    cluster seconds."""

    __tablename__ = "endpoints"
    __table_args__ = (
        Index("ix_endpoints_tenant_id", "tenant_id", "id"),
        Index("ix_endpoints_state", "state"),
        # A name is its tenant's among endpoints not stopped, so a deleted one's name can be used again.
        Index(
            "uq_endpoints_live_name",
            "tenant_id",
            "name",
            unique=True,
            sqlite_where=text("state NOT IN ('stopped', 'failed')"),
            postgresql_where=text("state NOT IN ('stopped', 'failed')"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(63))
    model: Mapped[str] = mapped_column(String(40))  # a catalogue name or the tenant's own model's id
    model_name: Mapped[str] = mapped_column(String(100))  # as asked (an own model's name)
    workload: Mapped[dict[str, Any]] = mapped_column(JSON)  # a job's stored workload, task infer
    machine: Mapped[str] = mapped_column(String(16))  # a type or `any`
    ipus_per_replica: Mapped[int] = mapped_column(Integer)  # resolved (the largest over its types)
    ipus_requested: Mapped[str] = mapped_column(String(8))  # "auto" or the number asked for
    # Per machine type it may run on: the replica's IPUs and the serve plan's figures.
    serve: Mapped[dict[str, Any]] = mapped_column(JSON)
    signature: Mapped[dict[str, Any]] = mapped_column(JSON)  # vipu.emulator.serving.Signature
    replicas_min: Mapped[int] = mapped_column(Integer)
    replicas_max: Mapped[int] = mapped_column(Integer)
    desired_replicas: Mapped[int] = mapped_column(Integer)
    autoscaling: Mapped[dict[str, Any]] = mapped_column(JSON)
    batching: Mapped[dict[str, Any]] = mapped_column(JSON)  # max_batch_size, max_wait_ms
    max_queue: Mapped[int] = mapped_column(Integer)
    cold_start_timeout_s: Mapped[float] = mapped_column(Float)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default=EndpointState.PROVISIONING)
    reason: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # The autoscaler's memory (wall clock): since when the queue delay has been above its target, since
    # when the load would fit in fewer replicas, since when no request came, and since when replicas
    # lost or failed are being replaced.
    above_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    below_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    degraded_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Replica holder jobs that failed in a row (reset by one that serves); `failed` at FAILURE_LIMIT.
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Replica jobs that ended before this were looked at by the serve pass.
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The last minute rolled up into endpoint_stats.
    rolled_up_to: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class EndpointStat(Base):
    """One minute of an endpoint's traffic, rolled up by the scheduler's serve pass from the data
    plane's counters (scheduler/inference.py): the history behind the dashboard's charts."""

    __tablename__ = "endpoint_stats"

    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id"), primary_key=True)
    minute: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)  # answered 503
    rejected: Mapped[int] = mapped_column(BigInteger, default=0)  # answered 429
    cold_starts: Mapped[int] = mapped_column(Integer, default=0)
    p50_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p90_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_batch: Mapped[float | None] = mapped_column(Float, nullable=True)
    queue_delay_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    replicas: Mapped[int] = mapped_column(Integer, default=0)  # serving at the minute's end
    desired: Mapped[int] = mapped_column(Integer, default=0)


# The notification tables (events, webhooks, deliveries) share Base's metadata: importing the models
# registers every table (what migrations and the test databases read).
from scheduler.notify_models import Event, Webhook, WebhookDelivery  # noqa: E402, F401
