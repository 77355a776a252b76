"""Forms of the dashboard: read what was typed, validate it with the API's own models, and say
what is wrong next to the field (the form is shown again with the values kept)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, EmailStr, StringConstraints, ValidationError

from scheduler.jobspec import JobSpec

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
)
INT_FIELDS = ("batch_size", "seq_len", "steps", "samples")
IPU_CHOICES = ("auto", "1", "2", "4", "8", "16", "32", "64", "128", "256")


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


def job_values(form: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    values = {k: str(form.get(k, "")).strip() for k in JOB_FIELDS}
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
        elif raw.isdigit() and len(raw) <= 13:
            numbers[name] = int(raw)
        else:
            parsed.errors[name] = "Enter a whole number."
    ipus_raw = values.get("ipus") or "auto"
    ipus: int | str = "auto"
    if ipus_raw != "auto":
        if ipus_raw.isdigit() and len(ipus_raw) <= 6:
            ipus = int(ipus_raw)
        else:
            parsed.errors["ipus"] = "Choose auto or a power of two."
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
            }
        )
    except ValidationError as exc:
        parsed.errors.update(_errors(exc))
        return parsed, None
    return parsed, spec


class TrialForm(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")]
    email: EmailStr
    organisation: Annotated[
        str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    ]
    category: Literal["individual", "university", "business"]
    intended_use: Annotated[str, StringConstraints(min_length=10, max_length=4000)]


def parse_trial(form: Mapping[str, str]) -> tuple[Parsed, TrialForm | None]:
    values = {k: str(form.get(k, "")) for k in ("name", "email", "organisation", "category", "intended_use")}
    parsed = Parsed(values)
    try:
        return parsed, TrialForm.model_validate(values)
    except ValidationError as exc:
        parsed.errors.update(_errors(exc))
        return parsed, None


def optional_float(raw: str, name: str, errors: dict[str, str], *, minimum: float = 0.0) -> float | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        errors[name] = "Enter a number."
        return None
    if not (minimum <= value <= 100_000_000) or value != value:
        errors[name] = f"Enter a number from {minimum:g} to 100,000,000."
        return None
    return value


def optional_int(
    raw: str, name: str, errors: dict[str, str], *, minimum: int = 1, maximum: int = 10**9
) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    if not raw.isdigit() or not (minimum <= int(raw) <= maximum):
        errors[name] = f"Enter a whole number from {minimum} to {maximum:,}."
        return None
    return int(raw)


def values_of(form: Mapping[str, str], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: str(form.get(k, "")).strip() for k in names}
