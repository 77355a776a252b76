"""Whose data a service call may see: one tenant's, or every tenant's.

Service functions that read or change tenants' objects take a `Scope` instead of an optional tenant
id, where `None` used to mean "every tenant": a stray `None` then read across tenants without anyone
noticing. A `Scope` is either `OneTenant(id)` or `ALL_TENANTS`, the type checker insists on one, and
the API derives it from the caller with `scope_of`, which gives every tenant only to admin keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

from scheduler.errors import Forbidden


@dataclass(frozen=True, slots=True)
class OneTenant:
    """The objects of one tenant."""

    tenant_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.tenant_id, str) or not self.tenant_id:
            raise TypeError("OneTenant needs a tenant id")


@dataclass(frozen=True, slots=True)
class AllTenants:
    """The objects of every tenant: for admin keys and the control plane itself."""


Scope = OneTenant | AllTenants
ALL_TENANTS: Final = AllTenants()


class _Caller(Protocol):
    @property
    def tenant_id(self) -> str | None: ...

    @property
    def is_admin(self) -> bool: ...


def scope_of(principal: _Caller) -> Scope:
    """What a caller may see: its tenant, or every tenant for an admin key; anything else is refused."""
    if principal.tenant_id is not None:
        return OneTenant(principal.tenant_id)
    if principal.is_admin:
        return ALL_TENANTS
    raise Forbidden("This key belongs to no tenant and is not an admin key, so it may see no tenant's data.")


def restrict(stmt: Any, column: Any, scope: Scope) -> Any:
    """`stmt` limited to the scope's rows, `column` being the rows' tenant id."""
    if isinstance(scope, OneTenant):
        return stmt.where(column == scope.tenant_id)
    return stmt


def sees(scope: Scope, tenant_id: str | None) -> bool:
    """Whether an object of `tenant_id` is visible in the scope."""
    return isinstance(scope, AllTenants) or tenant_id == scope.tenant_id
