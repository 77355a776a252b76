"""`ipucloud.Client`: the synchronous Python client of the HTTP API (httpx)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

import httpx
import orjson

from ipucloud.sdk import _api
from ipucloud.sdk._core import NOT_SENT, RETRY_STATUSES, Call, RetryPolicy, SSEDecoder
from ipucloud.sdk.config import resolve
from ipucloud.sdk.errors import ApiError, ConfigurationError, ServiceUnreachable
from ipucloud.sdk.models import (
    AdminUsage,
    ApiKey,
    ApiKeyCreated,
    Catalogue,
    Estimate,
    Fleet,
    Job,
    LogEntry,
    Logs,
    Machine,
    OnnxModel,
    Page,
    Paged,
    Partition,
    PartitionReset,
    Plan,
    Rack,
    RackHealth,
    Racks,
    Retired,
    ServersAdded,
    Session,
    StreamEvent,
    Tenant,
    TenantCreated,
    TrialApplication,
    TrialDecision,
    Usage,
)

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

USER_AGENT = "ipucloud-python/0.1.0"


def stream_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # The server sends a keep-alive comment every ~30 s of silence; twice that means it is gone.
    return httpx.Timeout(timeout.connect or 10.0, read=90.0, write=timeout.write, pool=timeout.pool)


class Client:
    """A client for one ipucloud, authenticated by one API key.

    URL and key come from the arguments, else `IPUCLOUD_URL` / `IPUCLOUD_API_KEY`, else the file
    `ipucloud login` writes. Requests answered 429 or 503 are retried with backoff, honouring
    `Retry-After`; job submissions carry an `Idempotency-Key`, so a retried submission never
    creates a second job. Errors raise `ApiError` subclasses carrying the problem body.

        with Client() as c:
            job = c.submit_job(name="r50", model="resnet50", batch_size=64, steps=100, ipus=4)
            for event in c.stream_logs(job.id):
                ...
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        creds = resolve(url, key)
        self.url = creds.url
        self.key = creds.key
        self.retry = retry or RetryPolicy()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._http = httpx.Client(
            base_url=self.url,
            timeout=self.timeout,
            transport=transport,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})},
        )

    # Plumbing ----------------------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _auth(self, call: Call[Any]) -> dict[str, str]:
        headers = dict(call.headers or {})
        if call.authenticated:
            if not self.key:
                raise ConfigurationError(
                    "No API key: pass key=, set IPUCLOUD_API_KEY or run `ipucloud login`."
                )
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    def call(self, call: Call[T]) -> T:
        """Send one call, retrying on 429/503 and on connection failures that are safe to retry."""
        headers = self._auth(call)
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=call.clean_params(),
                    json=call.json,
                    headers=headers,
                    files=call.files,
                    data=call.data,
                )
            except httpx.TransportError as exc:
                safe = isinstance(exc, NOT_SENT) or call.retry_safe_on_transport_error
                if safe and attempt < self.retry.max_retries:
                    self.retry.sleep(self.retry.delay(attempt))
                    attempt += 1
                    continue
                raise ServiceUnreachable(self.url, exc)
            if response.status_code in RETRY_STATUSES and attempt < self.retry.max_retries:
                self.retry.sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            if response.is_error:
                raise ApiError.from_response(response)
            return call.parse(response)

    def _pages(self, fetch: Callable[[str | None], Paged[I]]) -> Iterator[I]:
        cursor: str | None = None
        while True:
            page = fetch(cursor)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # Catalogue and estimates -------------------------------------------------------------------------

    def workloads(self) -> Catalogue:
        """The workload catalogue and machine types."""
        return self.call(_api.workloads())

    def estimate(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Estimate:
        """Dry run: fit, plan, time, IPU-hours and expected queue wait. Takes what `submit_job` takes."""
        return self.call(_api.estimate(_api.job_spec(spec, **fields)))

    # Own models --------------------------------------------------------------------------------------

    def push_model(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        dims: Mapping[str, int] | None = None,
        elementwise: list[str] | None = None,
    ) -> OnnxModel:
        """Upload an ONNX file as one of your models. Its weights are stripped here first, so only the
        graph travels; ``dims`` sizes its dynamic dimensions (besides the batch), ``elementwise`` names
        operators the emulator does not know that act element by element."""
        filename, graph = _api.stripped_graph(path)
        return self.call(_api.push_model(filename, graph, name, dims, elementwise))

    def list_models(self, *, limit: int = 100, cursor: str | None = None) -> Page[OnnxModel]:
        return self.call(_api.list_models(limit, cursor))

    def iter_models(self, *, page_size: int = 100) -> Iterator[OnnxModel]:
        return self._pages(lambda c: self.list_models(limit=page_size, cursor=c))

    def get_model(self, ref: str) -> OnnxModel:
        """A model by id or name."""
        return self.call(_api.get_model(ref))

    def delete_model(self, ref: str) -> OnnxModel:
        """Remove a model (refused while queued or running jobs use it)."""
        return self.call(_api.delete_model(ref))

    # Sessions ----------------------------------------------------------------------------------------

    def start_session(
        self,
        *,
        ipus: int,
        machine: str | None = None,
        max_duration_s: int | None = None,
        idle_timeout_s: int | None = None,
        gcds: int | None = None,
        name: str | None = None,
    ) -> Session:
        """Hold a partition: the session queues like a job, then its jobs (`submit_job(session=id)`)
        start at once. Durations in cluster seconds; the plan sets the defaults and the ceiling."""
        body = {
            "ipus": ipus,
            "machine": machine,
            "max_duration_s": max_duration_s,
            "idle_timeout_s": idle_timeout_s,
            "gcds": gcds,
            "name": name,
        }
        return self.call(_api.start_session(body))

    def get_session(self, session_id: str) -> Session:
        return self.call(_api.get_session(session_id))

    def list_sessions(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[Session]:
        """One page of the caller's sessions, newest first."""
        return self.call(_api.list_sessions(state, limit, cursor))

    def iter_sessions(self, *, state: str | None = None, page_size: int = 50) -> Iterator[Session]:
        return self._pages(lambda c: self.list_sessions(state=state, limit=page_size, cursor=c))

    def end_session(self, session_id: str) -> Session:
        """End a session: its running jobs stop, its hold is billed up to now."""
        return self.call(_api.end_session(session_id))

    # Jobs --------------------------------------------------------------------------------------------

    def submit_job(
        self, spec: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> Job:
        """Submit a job from a spec mapping and/or fields (`name`, `model`, `steps`, `ipus`, ...)."""
        return self.call(_api.submit_job(_api.job_spec(spec, **fields), idempotency_key))

    def get_job(self, job_id: str) -> Job:
        return self.call(_api.get_job(job_id))

    def list_jobs(self, *, state: str | None = None, limit: int = 50, cursor: str | None = None) -> Page[Job]:
        """One page of the caller's jobs, newest first."""
        return self.call(_api.list_jobs(state, limit, cursor))

    def iter_jobs(self, *, state: str | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job of the caller's tenant, newest first, fetched page by page."""
        return self._pages(lambda cursor: self.list_jobs(state=state, limit=page_size, cursor=cursor))

    def cancel_job(self, job_id: str) -> Job:
        return self.call(_api.cancel_job(job_id))

    def resume_job(self, job_id: str) -> Job:
        """Queue a job its time limit stopped again, from its last checkpoint (within the retention)."""
        return self.call(_api.resume_job(job_id))

    def job_logs(self, job_id: str, *, cursor: str | None = None, limit: int = 500) -> Logs:
        return self.call(_api.job_logs(job_id, cursor, limit))

    def iter_logs(self, job_id: str, *, page_size: int = 500) -> Iterator[LogEntry]:
        """Every event and log line written so far, oldest first."""
        return self._pages(lambda cursor: self.job_logs(job_id, cursor=cursor, limit=page_size))

    def stream_logs(
        self, job_id: str, *, after: int | None = None, timeout: float | None = None
    ) -> Iterator[StreamEvent]:
        """Follow a job live (server-sent events) until it ends; the last event is `end`.

        A dropped connection is resumed where it stopped (`Last-Event-ID`), so no line is lost
        or repeated. With `timeout`, raise TimeoutError if the job has not ended by then (checked
        whenever the server sends something, at least every 30 s).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = after
        failures = 0
        while True:
            headers = self._auth(_api.get_job(job_id))
            headers["Accept"] = "text/event-stream"
            if last_id is not None:
                headers["Last-Event-ID"] = str(last_id)
            try:
                with self._http.stream(
                    "GET",
                    _api.logs_stream_path(job_id),
                    headers=headers,
                    timeout=stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES and failures < self.retry.max_retries:
                        response.read()
                        self.retry.sleep(self.retry.delay(failures, response))
                        failures += 1
                        continue
                    if response.is_error:
                        response.read()
                        raise ApiError.from_response(response)
                    decoder = SSEDecoder()
                    for line in response.iter_lines():
                        if deadline is not None and time.monotonic() > deadline:
                            raise TimeoutError(f"job {job_id} did not end within {timeout} s")
                        frame = decoder.feed(line)
                        if frame is None:
                            continue
                        event = _event(*frame)
                        failures = 0
                        if event.id is not None:
                            last_id = event.id
                        yield event
                        if event.event == "end":
                            return
            except httpx.TransportError as exc:
                if failures >= self.retry.max_retries:
                    raise ServiceUnreachable(self.url, exc)
                self.retry.sleep(self.retry.delay(failures))
                failures += 1

    def wait_job(self, job_id: str, *, timeout: float | None = None, poll_s: float = 1.0) -> Job:
        """Poll until the job ends; raise TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            time.sleep(poll_s)

    # Usage, trials, keys -----------------------------------------------------------------------------

    def usage(self, *, since: datetime | str | None = None, until: datetime | str | None = None) -> Usage:
        """The tenant's metered IPU-hours, remaining grant and breakdowns."""
        return self.call(_api.usage(since, until))

    def usage_csv(self, *, since: datetime | str | None = None, until: datetime | str | None = None) -> str:
        return self.call(_api.usage_csv(since, until))

    def apply_for_trial(
        self, *, name: str, email: str, organisation: str, category: str, intended_use: str
    ) -> TrialApplication:
        """Apply for a free trial (no key needed); an admin approves it."""
        return self.call(
            _api.apply_for_trial(
                {
                    "name": name,
                    "email": email,
                    "organisation": organisation,
                    "category": category,
                    "intended_use": intended_use,
                }
            )
        )

    def list_keys(self, *, limit: int = 100, cursor: str | None = None) -> Page[ApiKey]:
        """The keys this key may see: an owner's tenant's, a member's own, or the admin keys."""
        return self.call(_api.list_keys(limit, cursor))

    def iter_keys(self, *, page_size: int = 100) -> Iterator[ApiKey]:
        return self._pages(lambda cursor: self.list_keys(limit=page_size, cursor=cursor))

    def create_key(
        self, *, name: str, scopes: list[str] | None = None, expires_at: datetime | None = None
    ) -> ApiKeyCreated:
        """A new key for the caller's tenant; `api_key` is the key, shown only now."""
        body: dict[str, Any] = {"name": name}
        if scopes:
            body["scopes"] = scopes
        if expires_at:
            body["expires_at"] = expires_at.isoformat()
        return self.call(_api.create_key(body))

    def revoke_key(self, key_id: str) -> ApiKey:
        return self.call(_api.revoke_key(key_id))

    # Admin -------------------------------------------------------------------------------------------

    def create_tenant(
        self,
        *,
        name: str,
        plan: str = "trial",
        quota_ipu_hours: float | None = None,
        expires_at: datetime | None = None,
        fairshare_weight: float | None = None,
        owner_email: str | None = None,
    ) -> TenantCreated:
        """Create a tenant; the result's `api_key` is its first key, shown only now."""
        body = _drop_none(
            name=name,
            plan=plan,
            quota_ipu_hours=quota_ipu_hours,
            expires_at=expires_at.isoformat() if expires_at else None,
            fairshare_weight=fairshare_weight,
            owner_email=owner_email,
        )
        return self.call(_api.create_tenant(body))

    def list_tenants(self, *, limit: int = 100, cursor: str | None = None) -> Page[Tenant]:
        return self.call(_api.list_tenants(limit, cursor))

    def iter_tenants(self, *, page_size: int = 100) -> Iterator[Tenant]:
        return self._pages(lambda cursor: self.list_tenants(limit=page_size, cursor=cursor))

    def get_tenant(self, tenant_id: str) -> Tenant:
        return self.call(_api.get_tenant(tenant_id))

    def update_tenant(self, tenant_id: str, **changes: Any) -> Tenant:
        """Change `plan`, `quota_ipu_hours`, `expires_at`, `fairshare_weight` or `status`."""
        return self.call(_api.update_tenant(tenant_id, _jsonable(changes)))

    def list_plans(self, *, limit: int = 100, cursor: str | None = None) -> Page[Plan]:
        return self.call(_api.list_plans(limit, cursor))

    def iter_plans(self, *, page_size: int = 100) -> Iterator[Plan]:
        return self._pages(lambda cursor: self.list_plans(limit=page_size, cursor=cursor))

    def list_tenant_keys(
        self, tenant_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> Page[ApiKey]:
        return self.call(_api.list_tenant_keys(tenant_id, limit, cursor))

    def iter_tenant_keys(self, tenant_id: str, *, page_size: int = 100) -> Iterator[ApiKey]:
        return self._pages(lambda cursor: self.list_tenant_keys(tenant_id, limit=page_size, cursor=cursor))

    def create_tenant_key(
        self,
        tenant_id: str,
        *,
        name: str,
        scopes: list[str] | None = None,
        expires_at: datetime | None = None,
        member_id: str | None = None,
    ) -> ApiKeyCreated:
        body = _drop_none(
            name=name,
            scopes=scopes or None,
            expires_at=expires_at.isoformat() if expires_at else None,
            member_id=member_id,
        )
        return self.call(_api.create_tenant_key(tenant_id, body))

    def revoke_tenant_key(self, tenant_id: str, key_id: str) -> ApiKey:
        return self.call(_api.revoke_tenant_key(tenant_id, key_id))

    def update_plan(self, name: str, **changes: Any) -> Plan:
        return self.call(_api.update_plan(name, _jsonable(changes)))

    def list_trials(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page[TrialApplication]:
        return self.call(_api.list_trials(status, limit, cursor))

    def iter_trials(self, *, status: str | None = None, page_size: int = 100) -> Iterator[TrialApplication]:
        return self._pages(lambda cursor: self.list_trials(status=status, limit=page_size, cursor=cursor))

    def get_trial(self, application_id: str) -> TrialApplication:
        return self.call(_api.get_trial(application_id))

    def approve_trial(self, application_id: str, *, plan: str | None = None) -> TrialDecision:
        """Approve: creates the tenant; the result's `api_key` is shown only now."""
        return self.call(_api.approve_trial(application_id, plan))

    def reject_trial(self, application_id: str, *, reason: str) -> TrialApplication:
        return self.call(_api.reject_trial(application_id, reason))

    def fleet(self, *, pod_from: int = 0, pods: int = 64) -> Fleet:
        """Pods, machines and IPUs with the partition and tenant holding each, and a summary."""
        return self.call(_api.fleet(pod_from, pods))

    def racks(self) -> Racks:
        """The racks, their PODs and IPU servers, and their machines' health."""
        return self.call(_api.racks())

    def add_rack(self, machine_type: str, *, layout: str = "pod64", pods: int = 1) -> Rack:
        """Add a rack of `pods` PODs (two POD64s at most, or one POD16) to the running fleet."""
        return self.call(_api.add_rack(machine_type, layout, pods))

    def add_servers(self, model: str, *, count: int = 1) -> ServersAdded:
        """Add IPU servers (`dss8440`, `nf5568m5`) to the running fleet."""
        return self.call(_api.add_servers(model, count))

    def drain_rack(self, rack_id: str, *, reason: str | None = None) -> RackHealth:
        return self.call(_api.rack_health(rack_id, "drain", reason))

    def restore_rack(self, rack_id: str, *, reason: str | None = None) -> RackHealth:
        return self.call(_api.rack_health(rack_id, "restore", reason))

    def retire_rack(self, rack_id: str) -> Retired:
        """Retire a drained rack; refused (409) while it is not drained or holds live partitions."""
        return self.call(_api.retire_rack(rack_id))

    def retire_unit(self, unit_id: str) -> Retired:
        """Retire a drained POD (`pod0003`) or server (`srv0004`); refused (409) as `retire_rack`."""
        return self.call(_api.retire_unit(unit_id))

    def drain_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return self.call(_api.machine_health(machine_id, "drain", reason))

    def fail_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return self.call(_api.machine_health(machine_id, "fail", reason))

    def restore_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return self.call(_api.machine_health(machine_id, "restore", reason))

    def create_partition(
        self,
        name: str,
        *,
        size: int,
        machine_type: str | None = None,
        tenant: str | None = None,
        gcds: int = 1,
        reconfigurable: bool = False,
    ) -> Partition:
        body = _drop_none(
            id=name,
            size=size,
            machine_type=machine_type,
            tenant=tenant,
            gcds=gcds,
            reconfigurable=reconfigurable,
        )
        return self.call(_api.create_partition(body))

    def list_partitions(
        self, *, tenant: str | None = None, limit: int = 200, cursor: str | None = None
    ) -> Page[Partition]:
        return self.call(_api.list_partitions(tenant, limit, cursor))

    def iter_partitions(self, *, tenant: str | None = None, page_size: int = 200) -> Iterator[Partition]:
        return self._pages(lambda cursor: self.list_partitions(tenant=tenant, limit=page_size, cursor=cursor))

    def get_partition(self, name: str) -> Partition:
        return self.call(_api.get_partition(name))

    def remove_partition(self, name: str) -> Partition:
        return self.call(_api.remove_partition(name))

    def reset_partition(self, name: str, gcds: int | None = None) -> PartitionReset:
        """Reset a partition's IPUs; with `gcds`, split a reconfigurable one anew into that many graph
        compile domains."""
        return self.call(_api.reset_partition(name, gcds))

    def admin_usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> AdminUsage:
        return self.call(_api.admin_usage(since, until))

    def admin_usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> str:
        return self.call(_api.admin_usage_csv(since, until))


def _event(event: str, event_id: str | None, data: str) -> StreamEvent:
    try:
        parsed = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError:
        parsed = {"message": data}
    if not isinstance(parsed, dict):
        parsed = {"value": parsed}
    numeric = event_id is not None and event_id.isascii() and event_id.isdigit()
    return StreamEvent(
        event=event, id=int(event_id) if event_id is not None and numeric else None, data=parsed
    )


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _jsonable(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in changes.items()}
