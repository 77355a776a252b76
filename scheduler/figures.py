"""Figures as people read them: a count of floating-point operations in the unit that fits it.

A small model's forward pass is kilo- or mega-FLOPs: shown in GFLOP with two decimals it read
"0.00 GFLOP", which says nothing. The dashboard and the CLI both write FLOPs through `flops`.
"""

from __future__ import annotations

_UNITS = ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"))


def flops(value: float | None, missing: str = "-") -> str:
    """``value`` FLOPs with three significant figures or more, in the largest unit it is one of:
    22,420,000,000 -> "22.4 GFLOP", 6,430,000 -> "6.43 MFLOP", 512 -> "512 FLOP"."""
    if value is None:
        return missing
    v = float(value)
    for scale, unit in _UNITS:
        if abs(v) >= scale:
            x = v / scale
            return f"{x:,.{_decimals(x)}f} {unit}"
    return f"{v:,.0f} FLOP"


def _decimals(x: float) -> int:
    x = abs(x)
    return 2 if x < 10 else 1 if x < 100 else 0
