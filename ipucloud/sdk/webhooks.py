"""Verifying the webhooks ipucloud sends, on the receiving side (Standard Webhooks signatures).

    from ipucloud.sdk.webhooks import verify, WebhookVerificationError

    event = verify(secret, request_body_bytes, request_headers)   # raises if not genuine
    if event["type"] == "job.failed": ...

`Verifier` is the `standardwebhooks` package's `Webhook`, re-exported: a rotation's overlap sends two
signatures, and it accepts either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

__all__ = ["Verifier", "WebhookVerificationError", "verify"]


def verify(secret: str, body: bytes | str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The event (`{type, timestamp, data}`) if the body was signed with `secret` within the last five
    minutes; WebhookVerificationError otherwise. Pass the body exactly as received."""
    event: dict[str, Any] = Verifier(secret).verify(body, dict(headers))
    return event
