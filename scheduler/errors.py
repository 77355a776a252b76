"""Domain errors that carry their HTTP status and RFC 9457 problem type.

Service functions raise these; the API turns them into `application/problem+json` without
knowing what went wrong, and the CLI/SDK read the same fields back.
"""

from __future__ import annotations

from typing import Any, ClassVar

PROBLEM_TYPES: dict[str, tuple[str, str]] = {}


def _register(slug: str, title: str, description: str) -> str:
    PROBLEM_TYPES[slug] = (title, description)
    return slug


class DomainError(Exception):
    status: ClassVar[int] = 400
    slug: ClassVar[str] = _register("bad-request", "Bad request", "The request cannot be processed as sent.")

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    @property
    def title(self) -> str:
        return PROBLEM_TYPES[self.slug][0]

    @property
    def type_uri(self) -> str:
        return f"/problems/{self.slug}"


class InvalidRequest(DomainError):
    status = 422
    slug = _register(
        "invalid-request",
        "Invalid request",
        "A field of the request is missing, malformed or out of range; `errors` lists each one.",
    )


class Unauthorized(DomainError):
    status = 401
    slug = _register(
        "unauthorized",
        "Missing or invalid API key",
        "Send `Authorization: Bearer <api key>` with a key that is valid, not expired and not revoked.",
    )


class Forbidden(DomainError):
    status = 403
    slug = _register("forbidden", "Forbidden", "The key is valid but may not do this (scope or role).")


class NotFound(DomainError):
    status = 404
    slug = _register("not-found", "Not found", "No such object is visible to this key.")


class Gone(DomainError):
    status = 410
    slug = _register(
        "gone", "Gone", "What the link pointed to was used already or has expired; nothing more is shown."
    )


class Conflict(DomainError):
    status = 409
    slug = _register("conflict", "Conflict", "The request conflicts with the current state of the object.")


class IdempotencyConflict(Conflict):
    slug = _register(
        "idempotency-key-reused",
        "Idempotency-Key reused with another body",
        "An Idempotency-Key replays its first request only; send a new key for a different request.",
    )


class NoCapacity(Conflict):
    slug = _register(
        "no-capacity",
        "No room for that partition",
        "The fleet has no healthy, free, link-connected set of IPUs of that size and machine type now.",
    )


class QuotaExceeded(DomainError):
    status = 403
    slug = _register(
        "quota-exceeded",
        "IPU-hour quota exceeded",
        "The job's predicted cost is more than the tenant's remaining grant; ask an admin for more.",
    )


class LimitExceeded(DomainError):
    status = 409
    slug = _register(
        "limit-exceeded",
        "Plan limit reached",
        "The tenant's plan limits (queued jobs, partition size) do not allow this job now.",
    )


class TenantInactive(DomainError):
    status = 403
    slug = _register(
        "tenant-inactive",
        "Tenant suspended or trial expired",
        "The tenant cannot submit work: it is suspended or its trial has ended.",
    )


class DoesNotFit(DomainError):
    status = 422
    slug = _register(
        "does-not-fit",
        "The model does not fit",
        "Compiling the workload for that partition runs out of IPU memory; the detail suggests a fix.",
    )


class InvalidModel(DomainError):
    status = 422
    slug = _register(
        "invalid-model",
        "The model cannot be planned",
        "The uploaded file is not an ONNX graph the emulator can plan; `reason` says which problem "
        "(not-onnx, corrupt, cycle, dangling-input, unknown-operators, unsupported-operators, "
        "shape-inference, unknown-shape, too-large) and `names` lists the operators, nodes, tensors or "
        "dimensions concerned.",
    )


class UnsupportedMediaType(DomainError):
    status = 415
    slug = "unsupported-media-type"


class RateLimited(DomainError):
    status = 429
    slug = _register("rate-limited", "Too many requests", "Slow down; retry after `Retry-After` seconds.")


class PayloadTooLarge(DomainError):
    status = 413
    slug = _register("payload-too-large", "Request body too large", "The body exceeds the size limit.")


class Unavailable(DomainError):
    status = 503
    slug = _register(
        "unavailable", "Service unavailable", "A dependency (database or broker) is unreachable; retry."
    )


# Problem types raised by the HTTP layer itself, registered here so /problems documents them all.
_register("method-not-allowed", "Method not allowed", "The route exists but not with this method.")
_register(
    "unsupported-media-type",
    "Unsupported media type",
    "Send the body as the route documents: application/json, or multipart/form-data for a model upload.",
)
_register("internal-error", "Internal error", "Something failed on our side; nothing was changed.")
