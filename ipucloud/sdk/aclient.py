"""`ipucloud.AsyncClient`: the same API as `Client`, for asyncio programs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import httpx

from ipucloud.sdk import _api
from ipucloud.sdk._core import NOT_SENT, RETRY_STATUSES, Call, RetryPolicy, SSEDecoder
from ipucloud.sdk.client import USER_AGENT, _drop_none, _event, _jsonable, stream_timeout
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


class AsyncClient:
    """Asynchronous twin of `ipucloud.Client` (same methods, awaited; iterators are async).

    async with AsyncClient() as c:
        job = await c.submit_job(name="r50", model="resnet50", steps=100, ipus=4)
        async for event in c.stream_logs(job.id):
            ...
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        creds = resolve(url, key)
        self.url = creds.url
        self.key = creds.key
        self.retry = retry or RetryPolicy()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=self.timeout,
            transport=transport,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})},
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _auth(self, call: Call[Any]) -> dict[str, str]:
        headers = dict(call.headers or {})
        if call.authenticated:
            if not self.key:
                raise ConfigurationError(
                    "No API key: pass key=, set IPUCLOUD_API_KEY or run `ipucloud login`."
                )
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    async def call(self, call: Call[T]) -> T:
        headers = self._auth(call)
        attempt = 0
        while True:
            try:
                response = await self._http.request(
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
                    await self._sleep(self.retry.delay(attempt))
                    attempt += 1
                    continue
                raise ServiceUnreachable(self.url, exc)
            if response.status_code in RETRY_STATUSES and attempt < self.retry.max_retries:
                await self._sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            if response.is_error:
                raise ApiError.from_response(response)
            return call.parse(response)

    async def _pages(self, fetch: Callable[[str | None], Awaitable[Paged[I]]]) -> AsyncIterator[I]:
        cursor: str | None = None
        while True:
            page = await fetch(cursor)
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # Catalogue and estimates -------------------------------------------------------------------------

    async def workloads(self) -> Catalogue:
        return await self.call(_api.workloads())

    async def estimate(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> Estimate:
        return await self.call(_api.estimate(_api.job_spec(spec, **fields)))

    # Sessions ----------------------------------------------------------------------------------------

    async def start_session(
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
        return await self.call(_api.start_session(body))

    async def get_session(self, session_id: str) -> Session:
        return await self.call(_api.get_session(session_id))

    async def list_sessions(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[Session]:
        """One page of the caller's sessions, newest first."""
        return await self.call(_api.list_sessions(state, limit, cursor))

    def iter_sessions(self, *, state: str | None = None, page_size: int = 50) -> AsyncIterator[Session]:
        return self._pages(lambda c: self.list_sessions(state=state, limit=page_size, cursor=c))

    async def end_session(self, session_id: str) -> Session:
        """End a session: its running jobs stop, its hold is billed up to now."""
        return await self.call(_api.end_session(session_id))

    # Jobs --------------------------------------------------------------------------------------------

    # Own models --------------------------------------------------------------------------------------

    async def push_model(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        dims: Mapping[str, int] | None = None,
        elementwise: list[str] | None = None,
    ) -> OnnxModel:
        """Upload an ONNX file as one of your models (weights stripped here first; see ``Client``)."""
        filename, graph = await asyncio.to_thread(_api.stripped_graph, path)
        return await self.call(_api.push_model(filename, graph, name, dims, elementwise))

    async def list_models(self, *, limit: int = 100, cursor: str | None = None) -> Page[OnnxModel]:
        return await self.call(_api.list_models(limit, cursor))

    def iter_models(self, *, page_size: int = 100) -> AsyncIterator[OnnxModel]:
        return self._pages(lambda c: self.list_models(limit=page_size, cursor=c))

    async def get_model(self, ref: str) -> OnnxModel:
        return await self.call(_api.get_model(ref))

    async def delete_model(self, ref: str) -> OnnxModel:
        return await self.call(_api.delete_model(ref))

    async def submit_job(
        self, spec: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> Job:
        return await self.call(_api.submit_job(_api.job_spec(spec, **fields), idempotency_key))

    async def get_job(self, job_id: str) -> Job:
        return await self.call(_api.get_job(job_id))

    async def list_jobs(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page[Job]:
        return await self.call(_api.list_jobs(state, limit, cursor))

    def iter_jobs(self, *, state: str | None = None, page_size: int = 100) -> AsyncIterator[Job]:
        return self._pages(lambda cursor: self.list_jobs(state=state, limit=page_size, cursor=cursor))

    async def cancel_job(self, job_id: str) -> Job:
        return await self.call(_api.cancel_job(job_id))

    async def resume_job(self, job_id: str) -> Job:
        """Queue a job its time limit stopped again, from its last checkpoint (within the retention)."""
        return await self.call(_api.resume_job(job_id))

    async def job_logs(self, job_id: str, *, cursor: str | None = None, limit: int = 500) -> Logs:
        return await self.call(_api.job_logs(job_id, cursor, limit))

    def iter_logs(self, job_id: str, *, page_size: int = 500) -> AsyncIterator[LogEntry]:
        return self._pages(lambda cursor: self.job_logs(job_id, cursor=cursor, limit=page_size))

    async def stream_logs(
        self, job_id: str, *, after: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Follow a job live until it ends, resuming after a dropped connection (`Last-Event-ID`).

        With `timeout`, raise TimeoutError if the job has not ended by then.
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
                async with self._http.stream(
                    "GET",
                    _api.logs_stream_path(job_id),
                    headers=headers,
                    timeout=stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES and failures < self.retry.max_retries:
                        await response.aread()
                        await self._sleep(self.retry.delay(failures, response))
                        failures += 1
                        continue
                    if response.is_error:
                        await response.aread()
                        raise ApiError.from_response(response)
                    decoder = SSEDecoder()
                    async for line in response.aiter_lines():
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
                await self._sleep(self.retry.delay(failures))
                failures += 1

    async def wait_job(self, job_id: str, *, timeout: float | None = None, poll_s: float = 1.0) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            await asyncio.sleep(poll_s)

    # Usage, trials, keys -----------------------------------------------------------------------------

    async def usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Usage:
        return await self.call(_api.usage(since, until))

    async def usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> str:
        return await self.call(_api.usage_csv(since, until))

    async def apply_for_trial(
        self, *, name: str, email: str, organisation: str, category: str, intended_use: str
    ) -> TrialApplication:
        return await self.call(
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

    async def list_keys(self, *, limit: int = 100, cursor: str | None = None) -> Page[ApiKey]:
        """The keys this key may see: an owner's tenant's, a member's own, or the admin keys."""
        return await self.call(_api.list_keys(limit, cursor))

    def iter_keys(self, *, page_size: int = 100) -> AsyncIterator[ApiKey]:
        return self._pages(lambda cursor: self.list_keys(limit=page_size, cursor=cursor))

    async def create_key(
        self, *, name: str, scopes: list[str] | None = None, expires_at: datetime | None = None
    ) -> ApiKeyCreated:
        """A new key for the caller's tenant; `api_key` is the key, shown only now."""
        body: dict[str, Any] = {"name": name}
        if scopes:
            body["scopes"] = scopes
        if expires_at:
            body["expires_at"] = expires_at.isoformat()
        return await self.call(_api.create_key(body))

    async def revoke_key(self, key_id: str) -> ApiKey:
        return await self.call(_api.revoke_key(key_id))

    # Admin -------------------------------------------------------------------------------------------

    async def create_tenant(
        self,
        *,
        name: str,
        plan: str = "trial",
        quota_ipu_hours: float | None = None,
        expires_at: datetime | None = None,
        fairshare_weight: float | None = None,
        owner_email: str | None = None,
    ) -> TenantCreated:
        body = _drop_none(
            name=name,
            plan=plan,
            quota_ipu_hours=quota_ipu_hours,
            expires_at=expires_at.isoformat() if expires_at else None,
            fairshare_weight=fairshare_weight,
            owner_email=owner_email,
        )
        return await self.call(_api.create_tenant(body))

    async def list_tenants(self, *, limit: int = 100, cursor: str | None = None) -> Page[Tenant]:
        return await self.call(_api.list_tenants(limit, cursor))

    def iter_tenants(self, *, page_size: int = 100) -> AsyncIterator[Tenant]:
        return self._pages(lambda cursor: self.list_tenants(limit=page_size, cursor=cursor))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        return await self.call(_api.get_tenant(tenant_id))

    async def update_tenant(self, tenant_id: str, **changes: Any) -> Tenant:
        return await self.call(_api.update_tenant(tenant_id, _jsonable(changes)))

    async def list_plans(self, *, limit: int = 100, cursor: str | None = None) -> Page[Plan]:
        return await self.call(_api.list_plans(limit, cursor))

    def iter_plans(self, *, page_size: int = 100) -> AsyncIterator[Plan]:
        return self._pages(lambda cursor: self.list_plans(limit=page_size, cursor=cursor))

    async def list_tenant_keys(
        self, tenant_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> Page[ApiKey]:
        return await self.call(_api.list_tenant_keys(tenant_id, limit, cursor))

    def iter_tenant_keys(self, tenant_id: str, *, page_size: int = 100) -> AsyncIterator[ApiKey]:
        return self._pages(lambda cursor: self.list_tenant_keys(tenant_id, limit=page_size, cursor=cursor))

    async def create_tenant_key(
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
        return await self.call(_api.create_tenant_key(tenant_id, body))

    async def revoke_tenant_key(self, tenant_id: str, key_id: str) -> ApiKey:
        return await self.call(_api.revoke_tenant_key(tenant_id, key_id))

    async def update_plan(self, name: str, **changes: Any) -> Plan:
        return await self.call(_api.update_plan(name, _jsonable(changes)))

    async def list_trials(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page[TrialApplication]:
        return await self.call(_api.list_trials(status, limit, cursor))

    def iter_trials(
        self, *, status: str | None = None, page_size: int = 100
    ) -> AsyncIterator[TrialApplication]:
        return self._pages(lambda cursor: self.list_trials(status=status, limit=page_size, cursor=cursor))

    async def get_trial(self, application_id: str) -> TrialApplication:
        return await self.call(_api.get_trial(application_id))

    async def approve_trial(self, application_id: str, *, plan: str | None = None) -> TrialDecision:
        return await self.call(_api.approve_trial(application_id, plan))

    async def reject_trial(self, application_id: str, *, reason: str) -> TrialApplication:
        return await self.call(_api.reject_trial(application_id, reason))

    async def fleet(self, *, pod_from: int = 0, pods: int = 64) -> Fleet:
        return await self.call(_api.fleet(pod_from, pods))

    async def racks(self) -> Racks:
        """The racks, their PODs and IPU servers, and their machines' health."""
        return await self.call(_api.racks())

    async def add_rack(self, machine_type: str, *, layout: str = "pod64", pods: int = 1) -> Rack:
        """Add a rack of `pods` PODs (two POD64s at most, or one POD16) to the running fleet."""
        return await self.call(_api.add_rack(machine_type, layout, pods))

    async def add_servers(self, model: str, *, count: int = 1) -> ServersAdded:
        """Add IPU servers (`dss8440`, `nf5568m5`) to the running fleet."""
        return await self.call(_api.add_servers(model, count))

    async def drain_rack(self, rack_id: str, *, reason: str | None = None) -> RackHealth:
        return await self.call(_api.rack_health(rack_id, "drain", reason))

    async def restore_rack(self, rack_id: str, *, reason: str | None = None) -> RackHealth:
        return await self.call(_api.rack_health(rack_id, "restore", reason))

    async def retire_rack(self, rack_id: str) -> Retired:
        """Retire a drained rack; refused (409) while it is not drained or holds live partitions."""
        return await self.call(_api.retire_rack(rack_id))

    async def retire_unit(self, unit_id: str) -> Retired:
        """Retire a drained POD (`pod0003`) or server (`srv0004`); refused (409) as `retire_rack`."""
        return await self.call(_api.retire_unit(unit_id))

    async def drain_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return await self.call(_api.machine_health(machine_id, "drain", reason))

    async def fail_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return await self.call(_api.machine_health(machine_id, "fail", reason))

    async def restore_machine(self, machine_id: str, *, reason: str | None = None) -> Machine:
        return await self.call(_api.machine_health(machine_id, "restore", reason))

    async def create_partition(
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
        return await self.call(_api.create_partition(body))

    async def list_partitions(
        self, *, tenant: str | None = None, limit: int = 200, cursor: str | None = None
    ) -> Page[Partition]:
        return await self.call(_api.list_partitions(tenant, limit, cursor))

    def iter_partitions(self, *, tenant: str | None = None, page_size: int = 200) -> AsyncIterator[Partition]:
        return self._pages(lambda cursor: self.list_partitions(tenant=tenant, limit=page_size, cursor=cursor))

    async def get_partition(self, name: str) -> Partition:
        return await self.call(_api.get_partition(name))

    async def remove_partition(self, name: str) -> Partition:
        return await self.call(_api.remove_partition(name))

    async def reset_partition(self, name: str, gcds: int | None = None) -> PartitionReset:
        return await self.call(_api.reset_partition(name, gcds))

    async def admin_usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> AdminUsage:
        return await self.call(_api.admin_usage(since, until))

    async def admin_usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> str:
        return await self.call(_api.admin_usage_csv(since, until))
