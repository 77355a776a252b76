"""Admin: fleet, machines, partitions, usage: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from datetime import datetime

from ipucloud.sdk._core import Call, Pager, model, operation, paginated, text
from ipucloud.sdk._ops_common import V1, _drop_none, _iso, _page, seg
from ipucloud.sdk.models import (
    AdminUsage,
    Fleet,
    Machine,
    Page,
    Partition,
    PartitionReset,
    Rack,
    RackHealth,
    Racks,
    Retired,
    ServersAdded,
)


class FleetOps:
    """Admin: racks, servers, machines, partitions and usage across tenants."""

    @operation
    def fleet(self, *, pod_from: int = 0, pods: int = 64) -> Call[Fleet]:
        """Pods, machines and IPUs with the partition and tenant holding each, and a summary."""
        params = {"pod_from": pod_from, "pods": pods}
        return Call("GET", f"{V1}/admin/fleet", model(Fleet), params=params)

    @operation
    def racks(self) -> Call[Racks]:
        """The racks, their PODs and IPU servers, and their machines' health."""
        return Call("GET", f"{V1}/admin/fleet/racks", model(Racks))

    @operation
    def add_rack(self, machine_type: str, *, layout: str = "pod64", pods: int = 1) -> Call[Rack]:
        """Add a rack of `pods` PODs (two POD64s at most, or one POD16) to the running fleet."""
        body = {"machine_type": machine_type, "layout": layout, "pods": pods}
        return Call("POST", f"{V1}/admin/fleet/racks", model(Rack), json=body)

    @operation
    def add_servers(self, model: str, *, count: int = 1) -> Call[ServersAdded]:
        """Add IPU servers (`dss8440`, `nf5568m5`) to the running fleet."""
        body = {"model": model, "count": count}
        return Call("POST", f"{V1}/admin/fleet/servers", _model(ServersAdded), json=body)

    @operation
    def drain_rack(self, rack_id: str, *, reason: str | None = None) -> Call[RackHealth]:
        """Admin: drain a rack: nothing new is placed there; what runs there finishes."""
        return _rack_health(rack_id, "drain", reason)

    @operation
    def restore_rack(self, rack_id: str, *, reason: str | None = None) -> Call[RackHealth]:
        """Admin: put a drained or failed rack back in service."""
        return _rack_health(rack_id, "restore", reason)

    @operation
    def retire_rack(self, rack_id: str) -> Call[Retired]:
        """Retire a drained rack; refused (409) while it is not drained or holds live partitions."""
        return Call("DELETE", f"{V1}/admin/fleet/racks/{seg(rack_id)}", model(Retired))

    @operation
    def retire_unit(self, unit_id: str) -> Call[Retired]:
        """Retire a drained POD (`pod0003`) or server (`srv0004`); refused (409) as `retire_rack`."""
        return Call("DELETE", f"{V1}/admin/fleet/units/{seg(unit_id)}", model(Retired))

    @operation
    def drain_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: drain a machine: nothing new is placed there; what runs there finishes."""
        return _machine_health(machine_id, "drain", reason)

    @operation
    def fail_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: mark a machine failed: its attempts end (billed up to their checkpoints) and queue again."""
        return _machine_health(machine_id, "fail", reason)

    @operation
    def restore_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: put a drained or failed machine back in service."""
        return _machine_health(machine_id, "restore", reason)

    @operation
    def create_partition(
        self,
        name: str,
        *,
        size: int,
        machine_type: str | None = None,
        tenant: str | None = None,
        gcds: int = 1,
        reconfigurable: bool = False,
    ) -> Call[Partition]:
        """Admin: reserve a partition of `size` IPUs for a tenant (its jobs then run in it by name)."""
        body = _drop_none(
            id=name,
            size=size,
            machine_type=machine_type,
            tenant=tenant,
            gcds=gcds,
            reconfigurable=reconfigurable,
        )
        return Call("POST", f"{V1}/admin/partitions", model(Partition), json=body)

    @operation
    def list_partitions(
        self, *, tenant: str | None = None, limit: int = 200, cursor: str | None = None
    ) -> Call[Page[Partition]]:
        """Admin: one page of live partitions (optionally of one tenant)."""
        params = {"tenant": tenant, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/partitions", _page(Partition), params=params)

    @paginated
    def iter_partitions(self, *, tenant: str | None = None, page_size: int = 200) -> Pager[Partition]:
        """Admin: every live partition, fetched page by page."""
        return lambda cursor: FleetOps.list_partitions.build(
            self, tenant=tenant, limit=page_size, cursor=cursor
        )

    @operation
    def get_partition(self, name: str) -> Call[Partition]:
        """Admin: a partition by name: its IPUs, tenant and what runs in it."""
        return Call("GET", f"{V1}/admin/partitions/{seg(name)}", model(Partition))

    @operation
    def remove_partition(self, name: str) -> Call[Partition]:
        """Admin: release a reserved partition."""
        return Call("DELETE", f"{V1}/admin/partitions/{seg(name)}", model(Partition))

    @operation
    def reset_partition(self, name: str, gcds: int | None = None) -> Call[PartitionReset]:
        """Reset a partition's IPUs; with `gcds`, split a reconfigurable one anew into that many graph
        compile domains."""
        body = {"gcds": gcds} if gcds is not None else None
        path = f"{V1}/admin/partitions/{seg(name)}/reset"
        return Call("POST", path, model(PartitionReset), json=body)

    @operation
    def admin_usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[AdminUsage]:
        """Admin: usage across every tenant (JSON), between `since` and `until`."""
        params = {"since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/admin/usage", model(AdminUsage), params=params)

    @operation
    def admin_usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[str]:
        """Admin: usage across every tenant as CSV text, one row per job."""
        params = {"format": "csv", "since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/admin/usage", text, params=params)


# `add_servers` has a parameter named `model`, which hides the parser of that name in its body.
_model = model


def _rack_health(rack_id: str, action: str, reason: str | None) -> Call[RackHealth]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/fleet/racks/{seg(rack_id)}/{action}", model(RackHealth), json=body)


def _machine_health(machine_id: str, action: str, reason: str | None) -> Call[Machine]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/machines/{seg(machine_id)}/{action}", model(Machine), json=body)
