"""What the generated models (`_schemas.py`) build on: the lenient base, pages, and the helpers the
SDK adds to some answers."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")

FINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
SESSION_FINAL = "ended"


class Model(BaseModel):
    # Unknown fields are kept, so a newer server never breaks an older client.
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=False)


class Page(Model, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


class _HasState(Protocol):
    @property
    def state(self) -> str: ...


class JobHelpers:
    @property
    def done(self: _HasState) -> bool:
        return self.state in FINAL_STATES


class SessionHelpers:
    @property
    def done(self: _HasState) -> bool:
        return self.state == SESSION_FINAL
