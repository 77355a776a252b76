"""Jobs and arrays: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk._ops_common import V1, _answer, _drop_none, _page, job_spec, seg
from ipucloud.sdk.models import Array, ArrayAction, Job, LogEntry, Logs, Page


class JobOps:
    """Jobs, job arrays and their logs (following a log stream is in `client.py`/`aclient.py`)."""

    @operation
    def submit_job(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        model: str | None = None,
        task: str | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        precision: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        dims: Mapping[str, int] | None = None,
        optimizer: str | None = None,
        workload: Mapping[str, Any] | None = None,
        ipus: int | str | None = None,
        machine: str | None = None,
        prefer: str | None = None,
        partition: str | None = None,
        session: str | None = None,
        priority: int | None = None,
        max_runtime_s: int | None = None,
        preemptible: bool | None = None,
        never_preempt: bool | None = None,
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Call[Job]:
        """Submit a job; returns it queued (`wait_job` or `stream_logs` follow it).

        `idempotency_key`: submitting again with the same key returns the same job (one is made up
        when none is given, so the client's own retries never submit twice).

        A job spec is `spec` (a mapping, e.g. a JSON or YAML file read), overridden by the keywords
        given; None means "not given". The workload: `model` (a catalogue workload or one of your
        uploaded models, by name or id), `task` (train or infer), `batch_size`, `seq_len`,
        `precision` (fp16 or fp32), `steps` or `samples`, `dims` (an uploaded model's dynamic
        dimensions), `optimizer`; or all of it as `workload`. The job: `name`, `ipus` (a power of two
        or "auto"), `machine` (a type, or "any"), `prefer` ("time" or "cost", with machine any),
        `partition` (a reserved one), `session` (an active session of yours), `priority` (-100..100),
        `max_runtime_s`, `preemptible` or `never_preempt`, `checkpoint_every_s`,
        `notify` (e.g. {"on": ["end"]}),
        `depends_on` ({"all": [{"job": ID, "type": "afterok"}]}), `on_unsatisfiable` ("cancel" or
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md)."""
        fields = _drop_none(
            name=name,
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,
            steps=steps,
            samples=samples,
            dims=dims,
            optimizer=optimizer,
            workload=workload,
            ipus=ipus,
            machine=machine,
            prefer=prefer,
            partition=partition,
            session=session,
            priority=priority,
            max_runtime_s=max_runtime_s,
            preemptible=preemptible,
            never_preempt=never_preempt,
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            **more,
        )
        # A generated key makes the client's own retries safe: a replay returns the first job.
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        body = job_spec(spec, **fields)
        return Call("POST", f"{V1}/jobs", _answer(Job), json=body, headers={"Idempotency-Key": key})

    @operation
    def submit_array(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        array: Mapping[str, Any] | None = None,
        sweep: Mapping[str, Any] | None = None,
        name: str | None = None,
        model: str | None = None,
        task: str | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        precision: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        dims: Mapping[str, int] | None = None,
        optimizer: str | None = None,
        workload: Mapping[str, Any] | None = None,
        ipus: int | str | None = None,
        machine: str | None = None,
        prefer: str | None = None,
        partition: str | None = None,
        session: str | None = None,
        priority: int | None = None,
        max_runtime_s: int | None = None,
        preemptible: bool | None = None,
        never_preempt: bool | None = None,
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Call[Array]:
        """Submit a job array (`array={"indices": "0-99", "max_running": 10}`) or a parameter sweep
        (`sweep={"method": "grid", "parameters": {...}}`): one handle for its elements, each an
        ordinary job of the spec the other arguments give.

        A job spec is `spec` (a mapping, e.g. a JSON or YAML file read), overridden by the keywords
        given; None means "not given". The workload: `model` (a catalogue workload or one of your
        uploaded models, by name or id), `task` (train or infer), `batch_size`, `seq_len`,
        `precision` (fp16 or fp32), `steps` or `samples`, `dims` (an uploaded model's dynamic
        dimensions), `optimizer`; or all of it as `workload`. The job: `name`, `ipus` (a power of two
        or "auto"), `machine` (a type, or "any"), `prefer` ("time" or "cost", with machine any),
        `partition` (a reserved one), `session` (an active session of yours), `priority` (-100..100),
        `max_runtime_s`, `preemptible` or `never_preempt`, `checkpoint_every_s`,
        `notify` (e.g. {"on": ["end"]}),
        `depends_on` ({"all": [{"job": ID, "type": "afterok"}]}), `on_unsatisfiable` ("cancel" or
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md)."""
        fields = _drop_none(
            name=name,
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,
            steps=steps,
            samples=samples,
            dims=dims,
            optimizer=optimizer,
            workload=workload,
            ipus=ipus,
            machine=machine,
            prefer=prefer,
            partition=partition,
            session=session,
            priority=priority,
            max_runtime_s=max_runtime_s,
            preemptible=preemptible,
            never_preempt=never_preempt,
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            array=array,
            sweep=sweep,
            **more,
        )
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        body = job_spec(spec, **fields)
        if "array" not in body and "sweep" not in body:
            raise ValueError("give `array` or `sweep`")
        return Call("POST", f"{V1}/jobs", _answer(Array), json=body, headers={"Idempotency-Key": key})

    @operation
    def get_array(self, array_id: str) -> Call[Array]:
        """A job array or sweep of yours by id: its elements by state."""
        return Call("GET", f"{V1}/arrays/{seg(array_id)}", model(Array))

    @operation
    def list_arrays(self, *, limit: int = 50, cursor: str | None = None) -> Call[Page[Array]]:
        """One page of the caller's arrays and sweeps, newest first."""
        return Call("GET", f"{V1}/arrays", _page(Array), params={"limit": limit, "cursor": cursor})

    @operation
    def array_jobs(
        self, array_id: str, *, state: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[Job]]:
        """One page of an array's elements, by index."""
        params = {"state": state, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/arrays/{seg(array_id)}/jobs", _page(Job), params=params)

    @paginated
    def iter_array_jobs(self, array_id: str, *, state: str | None = None, page_size: int = 500) -> Pager[Job]:
        """Every element of an array, by index, page by page."""
        return lambda cursor: JobOps.array_jobs.build(
            self, array_id, state=state, limit=page_size, cursor=cursor
        )

    @operation
    def cancel_array(self, array_id: str, indices: str | None = None) -> Call[ArrayAction]:
        """Cancel an array's queued and running elements: all of them, or those of `indices` (`1,5-9`)."""
        return Call(
            "POST",
            f"{V1}/arrays/{seg(array_id)}/cancel",
            model(ArrayAction),
            json=_drop_none(indices=indices),
        )

    @operation
    def retry_array(self, array_id: str, indices: str = "failed") -> Call[ArrayAction]:
        """Queue an array's failed or cancelled elements again (`failed`: all of them)."""
        return Call(
            "POST", f"{V1}/arrays/{seg(array_id)}/retry", model(ArrayAction), json={"indices": indices}
        )

    @operation
    def update_array(self, array_id: str, *, max_running: int | None) -> Call[Array]:
        """Change how many of its elements run at once (None lifts the limit)."""
        return Call("PATCH", f"{V1}/arrays/{seg(array_id)}", model(Array), json={"max_running": max_running})

    @operation
    def get_job(self, job_id: str) -> Call[Job]:
        """A job of yours by id: state, progress, wait reason, prediction and usage."""
        return Call("GET", f"{V1}/jobs/{seg(job_id)}", model(Job))

    @operation
    def list_jobs(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None, expand: bool = False
    ) -> Call[Page[Job]]:
        """One page of the caller's jobs, newest first; an array's queued elements are one row
        (`folded`) unless `expand`."""
        params = {"state": state, "limit": limit, "cursor": cursor, "expand": expand or None}
        return Call("GET", f"{V1}/jobs", _page(Job), params=params)

    @paginated
    def iter_jobs(self, *, state: str | None = None, page_size: int = 100) -> Pager[Job]:
        """Every job of the caller's tenant, newest first, fetched page by page."""
        return lambda cursor: JobOps.list_jobs.build(self, state=state, limit=page_size, cursor=cursor)

    @operation
    def cancel_job(self, job_id: str) -> Call[Job]:
        """Cancel a job of yours: a queued one ends at once, a running one is stopped and billed up to now."""
        return Call("POST", f"{V1}/jobs/{seg(job_id)}/cancel", model(Job))

    @operation
    def resume_job(self, job_id: str) -> Call[Job]:
        """Queue a job its time limit stopped again, from its last checkpoint (within the retention)."""
        return Call("POST", f"{V1}/jobs/{seg(job_id)}/resume", model(Job))

    @operation
    def job_logs(self, job_id: str, *, cursor: str | None = None, limit: int = 500) -> Call[Logs]:
        """One page of a job's log (state changes and the run's lines), oldest first."""
        params = {"cursor": cursor, "limit": limit}
        return Call("GET", f"{V1}/jobs/{seg(job_id)}/logs", model(Logs), params=params)

    @paginated
    def iter_logs(self, job_id: str, *, page_size: int = 500) -> Pager[LogEntry]:
        """Every event and log line written so far, oldest first."""
        return lambda cursor: JobOps.job_logs.build(self, job_id, cursor=cursor, limit=page_size)
