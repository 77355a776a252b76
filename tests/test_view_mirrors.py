"""A read model's two spellings cannot drift: each TypedDict view a scheduler service returns and the
pydantic model the API answers it as (its mirror) have the same keys, the same required keys, and
types that carry the view's values into the model (a `Literal` or a `datetime` may narrow a `str`, a
`float` may take an `int`, a nested view goes where its own mirror does).

`MIRRORS` lists the one-to-one pairs (the same field names on both sides when this test was written);
a new pair belongs here, and `test_no_unlisted_mirror` finds one that is not."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, Required, TypedDict, Union

import pytest
from pydantic import BaseModel

# (TypedDict view, its pydantic mirror), both as "module:Name".
MIRRORS = [
    ("scheduler.services.batch.attempts.progress:ProgressView", "api.schemas.jobs:Progress"),
    ("scheduler.services.batch.attempts.progress:ProgressView", "api.vipu_server:Progress"),
    ("scheduler.services.batch.checkpoints:CheckpointView", "api.schemas.jobs:CheckpointOut"),
    ("scheduler.services.batch.dependencies:StoredDependencies", "api.schemas.jobs:DependsOnOut"),
    ("scheduler.services.batch.dependencies:StoredDependency", "api.schemas.jobs:DependencyOut"),
    ("scheduler.services.endpoints.plans:BatchFigure", "api.schemas.endpoints:ServeBatch"),
    ("scheduler.services.endpoints.views:EndpointJson", "api.schemas.endpoints:EndpointOut"),
    ("scheduler.services.endpoints.views:ReplicaView", "api.schemas.endpoints:EndpointReplica"),
    ("scheduler.services.endpoints.plans:ServeFigures", "api.schemas.endpoints:ServePlanOut"),
    ("scheduler.services.endpoints.stats:StatView", "api.schemas.endpoints:EndpointMinute"),
    ("scheduler.services.endpoints.views:WindowView", "api.schemas.endpoints:EndpointWindow"),
    ("scheduler.services.batch.estimates:ArrayTotalsView", "api.routers.catalogue:ArrayTotalsOut"),
    ("scheduler.services.batch.estimates:ElementEstimateView", "api.routers.catalogue:ElementEstimateOut"),
    ("scheduler.services.batch.estimates:ServeRowView", "api.schemas.catalogue:ServeRowOut"),
    ("scheduler.services.capacity.fleet:RackUnitView", "api.schemas.fleet:RackUnitOut"),
    ("scheduler.services.capacity.fleet:RackView", "api.schemas.fleet:RackOut"),
    ("scheduler.services.tenancy.mail:SettingsView", "api.schemas.notifications:NotificationSettingsOut"),
    ("scheduler.services.capacity.partitions:FleetIpuView", "api.schemas.fleet:FleetIpuOut"),
    ("scheduler.services.capacity.partitions:FleetMachineView", "api.schemas.fleet:FleetMachineOut"),
    ("scheduler.services.capacity.partitions:FleetUnitView", "api.schemas.fleet:FleetPodOut"),
    ("scheduler.services.capacity.partitions:FleetView", "api.schemas.fleet:FleetOut"),
    ("scheduler.services.sessions.views:SessionEventView", "api.schemas.sessions:SessionEvent"),
    ("scheduler.services.sessions.views:SessionJobView", "api.schemas.sessions:SessionJob"),
    ("scheduler.services.sessions.views:SessionJson", "api.schemas.sessions:SessionOut"),
    ("scheduler.services.sessions.views:SessionPartitionView", "api.schemas.sessions:SessionPartition"),
    ("scheduler.services.tenancy.usage:UsageDayRow", "api.schemas.billing:UsageDay"),
    ("scheduler.services.tenancy.usage:UsageEndpointRow", "api.schemas.billing:UsageEndpoint"),
    ("scheduler.services.tenancy.usage:UsageJobRow", "api.schemas.billing:UsageJob"),
    ("scheduler.services.tenancy.usage:UsageMachineTypeRow", "api.schemas.billing:UsageMachineType"),
    ("scheduler.services.tenancy.usage:UsagePartitionSizeRow", "api.schemas.billing:UsagePartitionSize"),
    ("scheduler.services.tenancy.usage:UsageWorkloadRow", "api.schemas.billing:UsageWorkload"),
    ("scheduler.services.views:WaitView", "api.schemas.jobs:WaitReason"),
    ("scheduler.services.capacity.vipu_user:AllocationView", "api.vipu_server:Allocation"),
    ("scheduler.services.capacity.vipu_user:CreatedView", "api.vipu_server:CreatePartitionReply"),
    ("scheduler.services.capacity.vipu_user:GcdView", "api.vipu_server:Gcd"),
    ("scheduler.services.capacity.vipu_user:IpuAttributesView", "api.vipu_server:IpuAttributes"),
    ("scheduler.services.capacity.vipu_user:IpuofConfigView", "api.vipu_server:GetPartitionIpuofConfigReply"),
    ("scheduler.services.capacity.vipu_user:PartitionStatusView", "api.vipu_server:PartitionStatus"),
    ("scheduler.services.capacity.vipu_user:ProcessView", "api.vipu_server:Process"),
    ("scheduler.services.capacity.vipu_user:ResetView", "api.vipu_server:ResetPartitionReply"),
]


def _load(ref: str) -> Any:
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def _strip(t: Any) -> Any:
    while typing.get_origin(t) in (Annotated, NotRequired, Required):
        t = typing.get_args(t)[0]
    return t


def _members(t: Any) -> list[Any]:
    t = _strip(t)
    if typing.get_origin(t) in (Union, types.UnionType):
        return [m for a in typing.get_args(t) for m in _members(a)]
    if typing.get_origin(t) is Literal:
        return [type(v) for v in typing.get_args(t)]
    return [t]


def _fits(view_t: Any, model_t: Any, mirrors: set[tuple[Any, Any]]) -> bool:
    """Whether every value the view's type allows is one the model's field takes."""
    targets = _members(model_t)
    return all(any(_one(v, m, mirrors) for m in targets) for v in _members(view_t))


def _one(v: Any, m: Any, mirrors: set[tuple[Any, Any]]) -> bool:
    if m is Any or v is Any or v == m:
        return True
    if typing.is_typeddict(v):
        return (v, m) in mirrors or m is dict or typing.get_args(m) == (str, Any)
    if typing.get_origin(v) is dict and inspect.isclass(m) and issubclass(m, BaseModel):
        # A view that types a fixed set of keys loosely (`dict[str, int]`) into a model that names them.
        value = typing.get_args(v)[1]
        return all(_fits(value, f.annotation, mirrors) for f in m.model_fields.values())
    if m is float and v is int:
        return True
    if m is datetime and v is str:  # ISO 8601 in the view, parsed by the model
        return True
    if m is str and v is datetime:  # a model that keeps the ISO text
        return False
    vo, mo = typing.get_origin(v), typing.get_origin(m)
    if vo is not None and vo == mo:
        va, ma = typing.get_args(v), typing.get_args(m)
        if vo is tuple and va[-1:] == (Ellipsis,) and ma[-1:] == (Ellipsis,):
            va, ma = va[:1], ma[:1]
        return len(va) == len(ma) and all(_fits(a, b, mirrors) for a, b in zip(va, ma, strict=True))
    if vo is not None and mo is None and inspect.isclass(m) and inspect.isclass(vo):
        return issubclass(vo, m)  # list[int] into a bare `list`
    return False


def _required(view: Any, hint: Any) -> bool:
    # `__required_keys__` misses `NotRequired` in string annotations (PEP 563) before Python 3.12.
    origin = typing.get_origin(hint)
    return origin is Required or (view.__total__ and origin is not NotRequired)


def drift(view: Any, model: type[BaseModel], mirrors: set[tuple[Any, Any]]) -> list[str]:
    """How `model` no longer mirrors `view`: one line per difference (none when they agree)."""
    hints = typing.get_type_hints(view, include_extras=True)
    fields = model.model_fields
    problems = [f"{k}: in {view.__name__} only" for k in hints.keys() - fields.keys()]
    problems += [f"{k}: in {model.__name__} only" for k in fields.keys() - hints.keys()]
    for k in sorted(hints.keys() & fields.keys()):
        field = fields[k]
        if field.is_required() and not _required(view, hints[k]):
            problems.append(f"{k}: {model.__name__} requires it, {view.__name__} may leave it out")
        if not _fits(hints[k], field.annotation, mirrors):
            problems.append(
                f"{k}: {view.__name__} says {hints[k]}, {model.__name__} takes {field.annotation}"
            )
    return problems


def _mirrors() -> set[tuple[Any, Any]]:
    return {(_load(v), _load(m)) for v, m in MIRRORS}


@pytest.mark.parametrize(
    ("view", "model"), MIRRORS, ids=[f"{v.split(':')[1]}={m.split(':')[1]}" for v, m in MIRRORS]
)
def test_a_view_and_its_model_agree(view: str, model: str) -> None:
    assert drift(_load(view), _load(model), _mirrors()) == []


def test_no_unlisted_mirror() -> None:
    """A TypedDict view in the scheduler and a pydantic model in the API with the same field names are
    a mirrored pair: listed above, so that the two cannot drift apart unseen."""
    import api
    import scheduler.services

    def classes(pkg: Any) -> list[Any]:
        found = []
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            module = importlib.import_module(info.name)
            found += [
                (info.name, n, o)
                for n, o in vars(module).items()
                if getattr(o, "__module__", None) == info.name
            ]
        return found

    views = [
        (f"{m}:{n}", set(o.__annotations__))
        for m, n, o in classes(scheduler.services)
        if typing.is_typeddict(o)
    ]
    models = [
        (f"{m}:{n}", set(o.model_fields))
        for m, n, o in classes(api)
        if inspect.isclass(o) and issubclass(o, BaseModel) and o.model_fields
    ]
    pairs = {(v, m) for v, vf in views for m, mf in models if vf and vf == mf}
    assert pairs - set(MIRRORS) == set()


class _Inner(TypedDict):
    a: int


class _InnerOut(BaseModel):
    a: int


class _View(TypedDict):
    n: float
    when: str
    maybe: NotRequired[int]
    inner: _Inner
    extra: str


class _Out(BaseModel):
    n: int
    when: datetime
    maybe: int
    inner: _InnerOut


def test_drift_is_seen() -> None:
    """The comparison itself: a key on one side only, a wider type, an optional key the model needs."""

    assert drift(_View, _Out, {(_Inner, _InnerOut)}) == [
        "extra: in _View only",
        "maybe: _Out requires it, _View may leave it out",
        f"n: _View says {float}, _Out takes {int}",
    ]
    assert [p for p in drift(_View, _Out, set()) if p.startswith("inner:")]
