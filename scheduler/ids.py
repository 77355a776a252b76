"""Public identifiers: a readable prefix and a time-ordered body (ULID-like).

Time order makes ids usable as pagination cursors and keeps B-tree inserts at the right edge.
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    ms = int(time.time() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    return f"{prefix}_{_b32(ms, 10)}{_b32(rand, 16)}"


def id_floor(prefix: str, at_s: float) -> str:
    """No id of ``prefix`` made at or after epoch second ``at_s`` sorts below this (a range scan of
    the primary key finds the ids made since)."""
    return f"{prefix}_{_b32(int(at_s * 1000), 10)}"


def is_valid_id(value: str, prefix: str) -> bool:
    head, _, body = value.partition("_")
    return head == prefix and len(body) == 26 and all(c in _ALPHABET for c in body)
