"""Shapes every area shares: pages and their cursors, the validated scalars request bodies use
(dates, bounded numbers, names), the problem every error answers, the open base of answers built
as plain objects, and the health probes' answers."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    EmailStr,
    Field,
    StringConstraints,
)

from scheduler.errors import InvalidRequest
from scheduler.jobspec import JSON_NUMBER
from scheduler.text import LINE
from vipu.machine_types import MACHINE_TYPE_NAMES
from vipu.partitions import is_power_of_two
from vipu.topology import MAX_IPUS

T = TypeVar("T")

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$")]


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` to get the next page; null at the end."
    )


# A cursor is the key of the last item of the previous page (an id, a name, a number), as Stripe's
# `starting_after` is: every string of this shape is a valid position, so a request with any such
# cursor gets a page (possibly empty), and anything else is refused before it reaches a query.
# Empty is the first page, as if no cursor were given.
CURSOR_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,99})?$"
INT_CURSOR_PATTERN = r"^([0-9]{1,18})?$"
CursorParam = Annotated[
    str | None,
    Query(max_length=100, pattern=CURSOR_PATTERN, description="`next_cursor` of the previous page."),
]
IntCursorParam = Annotated[
    str | None,
    Query(max_length=18, pattern=INT_CURSOR_PATTERN, description="`next_cursor` of the previous page."),
]


def encode_cursor(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None or cursor == "":
        return None
    if not re.fullmatch(CURSOR_PATTERN, cursor):
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return cursor


def decode_int_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    if not re.fullmatch(INT_CURSOR_PATTERN, cursor):
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return int(cursor)


def _json_text(value: object) -> object:
    # Lax mode would read a number, or a string like "0.5", as a Unix time: RFC 3339 it must be.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not re.match(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt]", value):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


def _sane_year(value: datetime) -> datetime:
    if not 1970 <= value.year <= 2999:
        raise ValueError("the year must be between 1970 and 2999")
    return value.astimezone(UTC)


# The year range is in the spec as a pattern (formats cannot bound dates), so what the spec
# allows is exactly what is accepted, and no accepted date overflows when converted to UTC.
DATETIME_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-"
UtcDatetime = Annotated[
    AwareDatetime,
    BeforeValidator(_json_text),
    AfterValidator(_sane_year),
    Field(
        description="An RFC 3339 date-time with a timezone, years 1970 to 2999, e.g. `2027-01-31T00:00:00Z`.",
        json_schema_extra={"pattern": DATETIME_PATTERN},
    ),
]


# Bounds go inside, before the validator, or the spec would lose them (pydantic cannot push them
# through a before-validator into JSON Schema).
_NUMBER = JSON_NUMBER
Hours = Annotated[float, Field(ge=0, le=100_000_000, allow_inf_nan=False), _NUMBER]
Weight = Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False), _NUMBER]
Days = Annotated[int, Field(ge=1, le=3650), _NUMBER]
Size = Annotated[int, Field(ge=1, le=65_536), _NUMBER]
Count = Annotated[int, Field(ge=1, le=10_000_000), _NUMBER]
Seconds = Annotated[int, Field(ge=1, le=10 * 365 * 24 * 3600), _NUMBER]
Priority = Annotated[int, Field(ge=-1000, le=1000), _NUMBER]
Rate = Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False), _NUMBER]
MachineTypeName = Literal[MACHINE_TYPE_NAMES]  # type: ignore[valid-type]
POWERS_OF_TWO = [2**i for i in range(17)]


def _power_of_two(value: int | None) -> int | None:
    if value is not None and (not is_power_of_two(value) or value > MAX_IPUS):
        raise ValueError("must be a power of two from 1 to 65536")
    return value


# A partition size in a query: the spec lists the powers of two V-IPU allows (a Literal would not
# read "4" from a query string as 4).
PowerOfTwoQuery = Annotated[
    int | None,
    Query(ge=1, le=65_536, json_schema_extra={"enum": POWERS_OF_TWO}),
    AfterValidator(_power_of_two),
]
# Plans are the five a cloud is seeded with (they are edited, never created), so a body naming
# one can say exactly which names exist.
PlanName = Literal["internal", "standard", "trial", "trial-business", "trial-university"]
Email = Annotated[EmailStr, StringConstraints(max_length=254)]
PersonName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]


class Problem(BaseModel):
    """An RFC 9457 problem: every error this API returns has this shape."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A URI reference to the problem type, e.g. `/problems/quota-exceeded`.")
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = Field(
        None, description="For invalid requests: each field that is wrong and why."
    )


# Catalogue and fleet (catalogue.py, fleet.py) -------------------------------------------------------
# These answers are built by vipu/ and scheduler/services/ as plain objects; their models name
# the fields clients rely on and keep every other one (`extra="allow"`), so declaring them changed
# no answer.


class OpenOut(BaseModel):
    model_config = ConfigDict(extra="allow")


# Health -----------------------------------------------------------------------------------------------


class HealthOut(BaseModel):
    """`/healthz`: the process answers."""

    status: Literal["ok"]


class ReadyOut(BaseModel):
    """`/readyz` when ready: every dependency's check is `ok`."""

    status: Literal["ready"]
    checks: dict[str, str] = Field(description="Each dependency (`database`, `redis`) and its state.")


class NotReadyOut(Problem):
    """`/readyz` when not ready (503): a problem naming each dependency's state."""

    checks: dict[str, str] = Field(
        description="Each dependency and its state: `ok`, `migrations pending` or `unreachable: ...`."
    )
