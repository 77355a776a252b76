"""Forms of the dashboard: read what was typed, validate it with the API's own models, and say
what is wrong next to the field (the form is shown again with the values kept)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, EmailStr, StringConstraints, TypeAdapter, ValidationError

from scheduler.errors import InvalidRequest
from scheduler.jobspec import JobSpec
from scheduler.text import LINE, TEXT

JOB_FIELDS = (
    "name",
    "model",
    "task",
    "batch_size",
    "seq_len",
    "precision",
    "steps",
    "samples",
    "ipus",
    "machine",
    "max_runtime_s",
    "preemptible",
    "never_preempt",
    "checkpoint_every_s",
    "prefer",
    "session",
)
INT_FIELDS = ("batch_size", "seq_len", "steps", "samples")
IPU_CHOICES = ("auto", "1", "2", "4", "8", "16", "32", "64", "128", "256")
# What a number typed into a form may look like: ASCII digits only. `str.isdigit` also takes `²`,
# `①` and other Unicode digits, which `int` then refuses (a 500); `float` takes `１２`, `1_0`, `nan`.
WHOLE = re.compile(r"[0-9]{1,13}")
DECIMAL = re.compile(r"[0-9]{1,13}(\.[0-9]{0,9})?|\.[0-9]{1,9}")


def whole_number(raw: str) -> int | None:
    """The number typed, if it is one (ASCII digits, at most 13); else None."""
    return int(raw) if WHOLE.fullmatch(raw) else None


@dataclass
class Parsed:
    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def _errors(exc: ValidationError, rename: Mapping[str, str] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if not str(p).isdigit()]
        name = loc[-1] if loc else "form"
        if name in ("int", "literal['auto']", "int-constrained"):
            name = loc[-2] if len(loc) > 1 else name
        name = (rename or {}).get(name, name)
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        out.setdefault(name, message)
    return out


# Only ASCII blanks are trimmed: a field of no-break spaces is not an empty field (which means "the
# default" or "unchanged"), it is a wrong value, and is refused as one.
BLANKS = " \t\r\n"


def job_values(form: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    values = {k: str(form.get(k, "")).strip(BLANKS) for k in JOB_FIELDS}
    for k, v in (defaults or {}).items():
        if not values.get(k):
            values[k] = v
    return values


def parse_job(values: dict[str, str]) -> tuple[Parsed, JobSpec | None]:
    """A JobSpec from the submit form; blank optional fields mean "the catalogue's default"."""
    parsed = Parsed(values)
    numbers: dict[str, int | None] = {}
    for name in INT_FIELDS:
        raw = values.get(name, "")
        if raw == "":
            numbers[name] = None
        elif (number := whole_number(raw)) is not None:
            numbers[name] = number
        else:
            parsed.errors[name] = "Enter a whole number."
    ipus_raw = values.get("ipus") or "auto"
    ipus: int | str = "auto"
    if ipus_raw != "auto":
        if len(ipus_raw) <= 6 and (number := whole_number(ipus_raw)) is not None:
            ipus = number
        else:
            parsed.errors["ipus"] = "Choose auto or a power of two."
    max_runtime: int | None = None
    if values.get("max_runtime_s"):
        max_runtime = whole_number(values["max_runtime_s"])
        if max_runtime is None:
            parsed.errors["max_runtime_s"] = "Enter a whole number of seconds."
    checkpoint_every: int | None = None
    if values.get("checkpoint_every_s"):
        checkpoint_every = whole_number(values["checkpoint_every_s"])
        if checkpoint_every is None:
            parsed.errors["checkpoint_every_s"] = "Enter a whole number of seconds."
    if values.get("preemptible") not in ("", "on"):
        parsed.errors["preemptible"] = "Tick the box or leave it."
    if values.get("never_preempt") not in ("", "on"):
        parsed.errors["never_preempt"] = "Tick the box or leave it."
    if values.get("prefer") not in ("", "time", "cost"):
        parsed.errors["prefer"] = "Choose finishing first or spending least."
    if not values.get("model"):
        parsed.errors["model"] = "Choose a workload."
    if numbers.get("steps") is not None and numbers.get("samples") is not None:
        parsed.errors["samples"] = "Give steps or samples, not both."
    if parsed.errors:
        return parsed, None
    name = values.get("name") or f"{values['model']}-{values.get('task') or 'train'}"
    try:
        spec = JobSpec.model_validate(
            {
                "name": name,
                "workload": {
                    "model": values["model"],
                    "task": values.get("task") or "train",
                    "precision": values.get("precision") or "fp16",
                    **{k: v for k, v in numbers.items() if v is not None},
                },
                "ipus": ipus,
                "machine": values.get("machine") or None,
                "max_runtime_s": max_runtime,
                "preemptible": values.get("preemptible") == "on",
                "never_preempt": values.get("never_preempt") == "on",
                "checkpoint_every_s": checkpoint_every,
                "prefer": values.get("prefer") or "time",
                "session": values.get("session") or None,
            }
        )
    except ValidationError as exc:
        parsed.errors.update(_errors(exc))
        return parsed, None
    return parsed, spec


class TrialForm(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]
    email: Annotated[EmailStr, StringConstraints(max_length=254)]
    organisation: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=LINE)]
    category: Literal["individual", "university", "business"]
    intended_use: Annotated[str, StringConstraints(min_length=10, max_length=5000, pattern=TEXT)]


def parse_trial(form: Mapping[str, str]) -> tuple[Parsed, TrialForm | None]:
    # Trimmed of ASCII blanks only, as the API's patterns see them: "Ada\u2029" is not "Ada".
    names = ("name", "email", "organisation", "category", "intended_use")
    values = {k: str(form.get(k, "")).strip(BLANKS) for k in names}
    parsed = Parsed(values)
    try:
        return parsed, TrialForm.model_validate(values)
    except ValidationError as exc:
        parsed.errors.update(_errors(exc))
        return parsed, None


def optional_float(raw: str, name: str, errors: dict[str, str], *, minimum: float = 0.0) -> float | None:
    raw = raw.strip(BLANKS)
    if not raw:
        return None
    if not DECIMAL.fullmatch(raw):
        errors[name] = "Enter a number, such as 250 or 12.5."
        return None
    value = float(raw)
    if not (minimum <= value <= 100_000_000):
        errors[name] = f"Enter a number from {minimum:g} to 100,000,000."
        return None
    return value


def optional_int(
    raw: str, name: str, errors: dict[str, str], *, minimum: int = 1, maximum: int = 10**9
) -> int | None:
    raw = raw.strip(BLANKS)
    if not raw:
        return None
    value = whole_number(raw)
    if value is None or not (minimum <= value <= maximum):
        errors[name] = f"Enter a whole number from {minimum} to {maximum:,}."
        return None
    return value


def optional_datetime(raw: str, name: str, errors: dict[str, str]) -> datetime | None:
    """A date (`2026-12-31`, midnight UTC) or a date-time (without a zone: UTC), years 1970 to 2999
    once in UTC, as the API allows: `0001-01-01T00:00:00+14:00` would not even convert to UTC."""
    raw = raw.strip(BLANKS)
    if not raw:
        return None
    message = "A date such as 2026-12-31 (or a date-time), years 1970 to 2999."
    if not raw.isascii() or len(raw) > 40:
        errors[name] = message
        return None
    try:
        value = datetime.fromisoformat(raw)
        value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):
        errors[name] = message
        return None
    if not 1970 <= value.year <= 2999:
        errors[name] = message
        return None
    return value


def values_of(form: Mapping[str, str], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: str(form.get(k, "")).strip(BLANKS) for k in names}


def valid(adapter: TypeAdapter[Any], raw: str, name: str, message: str) -> Any:
    """`raw` validated by one of the API's own types (the same rules on both faces); else a 422
    naming the field."""
    try:
        return adapter.validate_python(raw)
    except ValidationError:
        raise InvalidRequest(f"{name}: {message}", field=name)
