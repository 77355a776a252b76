"""Attempt keys: the short-lived credential each running attempt is handed for the V-IPU endpoint.

A Poplar program asks V-IPU about its own partition. The host agent writes, beside the attempt's
IPUoF configuration, a `vipu-cli.hcl` holding the endpoint's address and a key of the form
`ipuatt_<attempt>_<epoch>_<mac>`: an HMAC of the attempt's id and epoch under the deployment secret.
Nothing is stored for it; the endpoint recomputes the HMAC and reads the attempt on every use, so the
key works exactly while its attempt is live (placed or running at that epoch), for that attempt's
tenant and partition only, read-only. When the attempt ends, however it ends, the key stops working
at its next use: nothing has to remember to revoke it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.errors import Unauthorized
from scheduler.models import LIVE_ATTEMPT_STATES, Attempt, Partition

PREFIX = "ipuatt_"
_KEY = re.compile(r"^ipuatt_(\d{1,19})_(\d{1,19})_([A-Za-z0-9_-]{43})$")


def _mac(secret: bytes, attempt_id: int, epoch: int) -> str:
    digest = hmac.new(secret, f"ipucloud-attempt-key:{attempt_id}:{epoch}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(*, secret: bytes, attempt_id: int, epoch: int) -> str:
    """The key of one attempt at one epoch (the same every time: it is derived, not stored)."""
    return f"{PREFIX}{attempt_id}_{epoch}_{_mac(secret, attempt_id, epoch)}"


def is_attempt_key(key: str) -> bool:
    return key.startswith(PREFIX)


@dataclass(frozen=True, slots=True)
class AttemptCaller:
    """Who presents an attempt key: one live attempt, its tenant, partition and graph compile domain."""

    attempt_id: int
    tenant_id: str
    job_id: str
    partition: str
    partition_pk: int
    gcd: int


def authenticate(*, session: Session, secret: bytes, key: str) -> AttemptCaller:
    """The attempt a key belongs to, or Unauthorized (malformed, forged, or its attempt not live)."""
    m = _KEY.match(key)
    if m is None:
        raise Unauthorized("That is not an attempt key (they look like ipuatt_<attempt>_<epoch>_<mac>).")
    attempt_id, epoch, mac = int(m.group(1)), int(m.group(2)), m.group(3)
    if not hmac.compare_digest(mac, _mac(secret, attempt_id, epoch)):
        raise Unauthorized("Unknown attempt key.")
    row = session.execute(
        select(Attempt, Partition.name)
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .where(Attempt.id == attempt_id)
    ).one_or_none()
    if row is None:
        raise Unauthorized("Unknown attempt key.")
    attempt, partition = row
    if attempt.state not in LIVE_ATTEMPT_STATES or attempt.epoch != epoch:
        raise Unauthorized(
            f"This attempt key belonged to attempt {attempt_id} of job {attempt.job_id}, which has ended "
            f"({attempt.state}): an attempt's key works only while the attempt runs."
        )
    return AttemptCaller(
        attempt_id=attempt.id,
        tenant_id=attempt.tenant_id,
        job_id=attempt.job_id,
        partition=partition,
        partition_pk=attempt.partition_pk,
        gcd=attempt.gcd,
    )
