"""Money figures as the CLI shows them, shared by the offline and the client commands."""

from __future__ import annotations


def charged_line(
    charged: float | None, raw: float | None, machine: str | None, rate: float | None
) -> str | None:
    """What the grant is charged, with the raw IPU-hours and the type's rate beside it (the grant is
    spent at rate x IPU-hours: a figure of raw IPU-hours alone misleads on any type but rate 1)."""
    if raw is None:
        return None
    if charged is None:
        return f"{raw:,.4f} IPU-hours"
    on = f" on {machine}" if machine else ""
    at = f" at rate {rate:g}" if rate is not None else ""
    return f"{charged:,.4f} IPU-hours of the grant ({raw:,.4f} IPU-hours{on}{at})"
