"""Catalogue and estimates: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ipucloud.sdk._core import Call, model, operation
from ipucloud.sdk._ops_common import V1, _answer, _drop_none, job_spec
from ipucloud.sdk.models import Catalogue, Estimate


class CatalogueOps:
    """The workload catalogue and what a job or an endpoint would cost (`estimate`)."""

    @operation
    def workloads(self) -> Call[Catalogue]:
        """The workload catalogue and machine types."""
        return Call("GET", f"{V1}/workloads", model(Catalogue))

    @operation
    def estimate(
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
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        serve_batch_sizes: Sequence[int] | None = None,
        max_rows: int | None = None,
        **more: Any,
    ) -> Call[Estimate]:
        """Dry run of a job: whether it fits, its plan, time, what the grant would be charged (with
        the raw IPU-hours and the type's rate), what submitting it reserves, and the expected queue
        wait, for the machine type `prefer` would run it on (named in the answer). Takes what
        `submit_job` takes; with `serve_batch_sizes` (inference), also a serving replica's latency and
        throughput at each batch size.

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
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md). With `array` or
        `sweep` (what `submit_array` takes), a row per element (`elements`, at most `max_rows`) and the
        whole (`totals`), starts forecast within its `max_running`."""
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
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            **more,
        )
        full = job_spec(spec, **fields)
        body: dict[str, Any] = {"workload": full["workload"], "ipus": full.get("ipus", "auto")}
        if full.get("machine"):
            body["machine"] = full["machine"]
        # As the job would be submitted: the type it is answered for follows `prefer` (time or cost).
        for key in ("prefer", "max_runtime_s", "preemptible", "array", "sweep"):
            if full.get(key) is not None:
                body[key] = full[key]
        if max_rows is not None:
            body["max_rows"] = max_rows
        if serve_batch_sizes is not None:
            body["serve"] = {"batch_sizes": list(serve_batch_sizes)}
        return Call("POST", f"{V1}/estimates", _answer(Estimate), json=body)
