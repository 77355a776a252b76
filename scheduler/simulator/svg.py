"""Plots as standalone SVG, drawn here (no plotting library): a CDF chart and a line chart.

Both take one series per policy, so the policies of a replay share the axes and a legend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 760, 430
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 46, 58
PALETTE = (
    "#1b6ac9",
    "#d1383d",
    "#2d9d4a",
    "#8b54b5",
    "#e08a14",
    "#7a5a3a",
    "#3aa8b5",
    "#777777",
    "#c2185b",
    "#1a1a1a",
)
DASHES = ("", "6 3", "2 3", "8 3 2 3", "", "6 3", "2 3", "8 3 2 3", "", "4 2")

# Log-scale ticks for durations in seconds, with the labels a reader thinks in.
TIME_TICKS = (
    (1, "1 s"),
    (10, "10 s"),
    (60, "1 min"),
    (600, "10 min"),
    (3600, "1 h"),
    (36_000, "10 h"),
    (86_400, "1 d"),
    (864_000, "10 d"),
    (8_640_000, "100 d"),
)


def _frame(title: str, x_label: str, y_label: str) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333333"/>',
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 16}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text transform="translate(18 {TOP + plot_h / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>",
    ]


def _legend(names: Sequence[str]) -> list[str]:
    parts = []
    x = WIDTH - RIGHT + 16
    for i, name in enumerate(names):
        y = TOP + 14 + 20 * i
        parts.append(
            f'<line x1="{x}" y1="{y}" x2="{x + 26}" y2="{y}" stroke="{PALETTE[i % len(PALETTE)]}" '
            f'stroke-width="2.5" stroke-dasharray="{DASHES[i % len(DASHES)]}"/>'
        )
        parts.append(f'<text x="{x + 32}" y="{y + 4}">{escape(name)}</text>')
    return parts


def _polyline(points: Sequence[tuple[float, float]], index: int) -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (
        f'<polyline fill="none" stroke="{PALETTE[index % len(PALETTE)]}" stroke-width="2" '
        f'stroke-dasharray="{DASHES[index % len(DASHES)]}" points="{coords}"/>'
    )


def _y_ticks(y_max: float, fmt: str) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = []
    for i in range(6):
        value = y_max * i / 5
        y = TOP + plot_h - plot_h * i / 5
        parts.append(
            f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e3e3e3"/>'
        )
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{format(value, fmt)}</text>')
    return parts


def cdf_chart(series: Mapping[str, Sequence[float]], *, title: str, x_label: str, points: int = 400) -> str:
    """Cumulative distribution of durations (seconds, log scale), one line per series."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ordered = {name: sorted(max(v, 1.0) for v in values) for name, values in series.items() if values}
    top = max((values[-1] for values in ordered.values()), default=10.0)
    ticks = [t for t in TIME_TICKS if t[0] <= top * 10] or [TIME_TICKS[0], TIME_TICKS[1]]
    hi = math.log10(max(top, ticks[-1][0]))

    def x_of(value: float) -> float:
        return LEFT + plot_w * (math.log10(value) / hi if hi > 0 else 0.0)

    parts = _frame(title, x_label, "share of jobs")
    parts += _y_ticks(1.0, ".1f")
    for value, label in ticks:
        x = x_of(value)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{label}</text>')
    for i, values in enumerate(ordered.values()):
        n = len(values)
        line = []
        for k in range(points + 1):
            share = k / points
            sample = values[min(n - 1, max(0, math.ceil(share * n) - 1))]
            line.append((x_of(sample), TOP + plot_h - plot_h * share))
        parts.append(_polyline(line, i))
    parts += _legend(list(ordered))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_max: float | None = None,
    y_format: str = ".1f",
) -> str:
    """One line per series through its (x, y) points, on linear axes starting at 0."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x_hi = max((x for points in series.values() for x, _ in points), default=1.0) or 1.0
    y_hi = y_max or max((y for points in series.values() for _, y in points), default=1.0) or 1.0
    parts = _frame(title, x_label, y_label)
    parts += _y_ticks(y_hi, y_format)
    step = _nice_step(x_hi / 8)
    tick = 0.0
    while tick <= x_hi + 1e-9:
        x = LEFT + plot_w * tick / x_hi
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" stroke="#333"/>'
        )
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{tick:g}</text>')
        tick += step
    for i, points in enumerate(series.values()):
        line = [(LEFT + plot_w * x / x_hi, TOP + plot_h - plot_h * min(y, y_hi) / y_hi) for x, y in points]
        parts.append(_polyline(line, i))
    parts += _legend(list(series))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def loglog_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
) -> str:
    """One line per series through its (x, y) points on log-log axes, decade grid lines labelled
    with powers of two on x (partition sizes) and powers of ten on y."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    xs = [x for points in series.values() for x, _ in points if x > 0]
    ys = [y for points in series.values() for _, y in points if y > 0]
    x_lo, x_hi = math.log2(min(xs, default=1.0)), math.log2(max(xs, default=2.0))
    if x_hi <= x_lo:
        x_hi = x_lo + 1
    y_lo = math.floor(math.log10(min(ys, default=1.0)))
    y_hi = math.ceil(math.log10(max(ys, default=10.0)))
    if y_hi <= y_lo:
        y_hi = y_lo + 1

    def at(x: float, y: float) -> tuple[float, float]:
        px = LEFT + plot_w * (math.log2(x) - x_lo) / (x_hi - x_lo)
        py = TOP + plot_h - plot_h * (math.log10(y) - y_lo) / (y_hi - y_lo)
        return px, py

    parts = _frame(title, x_label, y_label)
    for decade in range(y_lo, y_hi + 1):
        _, y = at(2**x_lo, 10.0**decade)
        parts.append(
            f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e3e3e3"/>'
        )
        label = f"{10**decade:,}" if decade >= 0 else f"{10.0**decade:g}"
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for power in range(int(x_lo), int(x_hi) + 1):
        x, _ = at(2.0**power, 10.0**y_lo)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{2**power:,}</text>')
    for i, points in enumerate(series.values()):
        line = [at(x, y) for x, y in points if x > 0 and y > 0]
        if len(line) == 1:
            cx, cy = line[0]
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{PALETTE[i % len(PALETTE)]}"/>')
        elif line:
            parts.append(_polyline(line, i))
    parts += _legend(list(series))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
