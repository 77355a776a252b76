"""Errors the SDK raises. An `ApiError` carries the server's RFC 9457 problem body."""

from __future__ import annotations

from typing import Any

import httpx


class IpucloudError(Exception):
    """Base of everything the SDK raises."""


class ServiceUnreachable(IpucloudError):
    """The server could not be reached (refused, timed out, DNS), even after retries."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"Cannot reach ipucloud at {url}: {cause}")
        self.url = url
        self.cause = cause


class ConfigurationError(IpucloudError):
    """The client has no URL or key to work with, or its config file is unreadable."""


class ApiError(IpucloudError):
    """The server answered with an error; the fields are the problem body's.

    `type` is the problem type URI (e.g. `/problems/quota-exceeded`), `slug` its last segment,
    `extra` every other member of the body (e.g. `errors`, `remaining_ipu_hours`, `retry_after`).
    """

    def __init__(
        self,
        status: int,
        *,
        type: str = "about:blank",
        title: str = "",
        detail: str = "",
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.extra = extra or {}
        self.headers = headers or {}
        super().__init__(f"{status} {title}: {detail}" if title else f"{status}: {detail}")

    @property
    def slug(self) -> str:
        return self.type.rstrip("/").rsplit("/", 1)[-1]

    @property
    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extra,
        }

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """Build the most specific subclass from a response, problem body or not."""
        body: dict[str, Any] = {}
        try:
            parsed = response.json()
            if isinstance(parsed, dict):
                body = parsed
        except ValueError:
            pass
        status = response.status_code
        type_ = str(body.pop("type", "about:blank"))
        title = str(body.pop("title", response.reason_phrase or "Error"))
        detail = body.pop("detail", None)
        if detail is None:
            detail = response.text[:500] if not body and response.text else title
        body.pop("status", None)
        kind = _classify(status, type_.rstrip("/").rsplit("/", 1)[-1])
        return kind(
            status,
            type=type_,
            title=title,
            detail=str(detail),
            extra=body,
            headers=dict(response.headers),
        )


class InvalidRequestError(ApiError):
    """400, 413, 422: the request itself is wrong (see `extra["errors"]`)."""


class AuthError(ApiError):
    """401 (no, unknown, revoked or expired key) or 403 (the key may not do this)."""


class NotFoundError(ApiError):
    """404: no such object visible to this key (another tenant's job is 404 too)."""


class ConflictError(ApiError):
    """409: the object's state forbids it (already ended, name taken, no capacity now)."""


class QuotaError(ApiError):
    """The tenant's grant or plan does not allow it: quota exceeded, plan limit, trial ended."""


class RateLimitError(ApiError):
    """429 after the client's retries ran out; `retry_after` says when to come back."""

    @property
    def retry_after(self) -> float | None:
        value = self.extra.get("retry_after") or self.headers.get("retry-after")
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None


class ServerError(ApiError):
    """5xx: the server failed or a dependency is down (after the client's retries)."""


_QUOTA_SLUGS = {"quota-exceeded", "limit-exceeded", "tenant-inactive"}


def _classify(status: int, slug: str) -> type[ApiError]:
    if slug in _QUOTA_SLUGS:
        return QuotaError
    if status in (401, 403):
        return AuthError
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status == 429:
        return RateLimitError
    if status >= 500:
        return ServerError
    if 400 <= status < 500:
        return InvalidRequestError
    return ApiError
