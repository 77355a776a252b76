"""SVG charts drawn on the server: plain markup, every text escaped, no script, no inline style."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from html import escape


def daily_series(
    by_day: Sequence[Mapping[str, object]], *, days: int, today: date
) -> list[tuple[date, float]]:
    """The last `days` days ending today, zero where nothing was metered."""
    values: dict[date, float] = {}
    for row in by_day:
        try:
            d = date.fromisoformat(str(row["day"])[:10])
        except (KeyError, ValueError):
            continue
        values[d] = values.get(d, 0.0) + float(row.get("ipu_hours") or 0.0)  # type: ignore[arg-type]
    start = today - timedelta(days=days - 1)
    return [(start + timedelta(days=i), values.get(start + timedelta(days=i), 0.0)) for i in range(days)]


def nice_ceiling(value: float) -> float:
    """The next 1, 2 or 5 x 10^n at or above value (for the y axis)."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        top = step * 10**exp
        if top >= value * (1 - 1e-9):
            return float(top)
    return float(10 ** (exp + 1))


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def bar_chart(
    series: Sequence[tuple[date, float]],
    *,
    title: str,
    unit: str,
    chart_id: str,
    width: int = 720,
    height: int = 220,
) -> str:
    """A bar per day with a labelled y axis; each bar has a tooltip; scales to its container."""
    left, right, top, bottom = 48, 8, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = nice_ceiling(max((v for _, v in series), default=0.0))
    n = max(1, len(series))
    slot = plot_w / n
    bar_w = max(2.0, slot * 0.7)
    total = sum(v for _, v in series)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{chart_id}-t">{escape(title)}</title>',
        f'<desc id="{chart_id}-d">{escape(f"{total:.4f} {unit} in {n} days")}</desc>',
    ]
    for i in range(5):
        value = peak * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d4d4de" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="13" fill="#4a4a5e">'
            f"{escape(_fmt(value))}</text>"
        )
    label_every = max(1, math.ceil(n / 6))
    for i, (day, value) in enumerate(series):
        h = 0.0 if peak == 0 else plot_h * value / peak
        x = left + i * slot + (slot - bar_w) / 2
        y = top + plot_h - h
        tip = escape(f"{day.isoformat()}: {value:.4f} {unit}")
        if value > 0:
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{max(h, 1.0):.1f}" '
                f'fill="#4b4bc8" rx="1"><title>{tip}</title></rect>'
            )
        if (n - 1 - i) % label_every == 0:  # counted from today, so the last day is always labelled
            last = i == n - 1
            label_x = left + plot_w if last else left + i * slot + slot / 2
            parts.append(
                f'<text x="{label_x:.1f}" y="{height - 8}" text-anchor="{"end" if last else "middle"}" '
                f'font-size="13" fill="#4a4a5e">{escape(day.strftime("%d %b"))}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def latency_throughput_chart(
    points: Sequence[tuple[int, float, float]],
    *,
    title: str,
    chart_id: str,
    width: int = 720,
    height: int = 260,
) -> str:
    """Serving: one point per batch size at (samples/s, latency in ms), joined in batch order and
    labelled with the batch; both axes from zero. ``points`` are (batch, throughput, latency_ms)."""
    left, right, top, bottom = 56, 16, 14, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    ordered = sorted(points)
    x_top = nice_ceiling(max((t for _, t, _ in ordered), default=0.0))
    y_top = nice_ceiling(max((lat for _, _, lat in ordered), default=0.0))

    def at(throughput: float, latency: float) -> tuple[float, float]:
        return left + plot_w * throughput / x_top, top + plot_h - plot_h * latency / y_top

    summary = "; ".join(f"batch {b}: {lat:.3g} ms, {_fmt(t)} samples/s" for b, t, lat in ordered)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{chart_id}-t">{escape(title)}</title>',
        f'<desc id="{chart_id}-d">{escape(summary)}</desc>',
    ]
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d4d4de" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="13" fill="#4a4a5e">'
            f"{escape(_fmt(y_top * i / 4))}</text>"
        )
        x = left + plot_w * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="{anchor}" '
            f'font-size="13" fill="#4a4a5e">{escape(_fmt(x_top * i / 4))}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" font-size="13" '
        'fill="#4a4a5e">samples/s per replica</text>'
    )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="13" fill="#4a4a5e" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">latency, ms</text>'
    )
    coords = [at(t, lat) for _, t, lat in ordered]
    if len(coords) > 1:
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline fill="none" stroke="#4b4bc8" stroke-width="2" points="{line}"/>')
    for (batch, throughput, latency), (x, y) in zip(ordered, coords, strict=True):
        tip = escape(f"batch {batch}: {latency:.3f} ms, {throughput:,.0f} samples/s")
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#4b4bc8"><title>{tip}</title></circle>')
        parts.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="12" fill="#1a1a2e">{batch}</text>')
    parts.append("</svg>")
    return "".join(parts)


def time_series_chart(
    times: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    *,
    title: str,
    unit: str,
    chart_id: str,
    step: bool = False,
    width: int = 720,
    height: int = 240,
) -> str:
    """Lines over time (one point per minute, say), each `(label, colour, values)` with a legend; a gap
    where a value is None. `step` draws each value held until the next (replica counts). The y axis
    starts at zero; each point has a tooltip."""
    left, right, top, bottom = 56, 16, 30, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for _, _, vs in series for v in vs if v is not None]
    y_top = nice_ceiling(max(values, default=0.0))
    n = len(times)

    def x_at(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y_at(v: float) -> float:
        return top + plot_h - plot_h * v / y_top

    summary = (
        "; ".join(
            f"{label}: last {_fmt(next((v for v in reversed(vs) if v is not None), 0.0))} {unit}"
            for label, _, vs in series
        )
        if n
        else "no data yet"
    )
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{chart_id}-t">{escape(title)}</title>',
        f'<desc id="{chart_id}-d">{escape(summary)}</desc>',
    ]
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d4d4de" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="13" fill="#4a4a5e">'
            f"{escape(_fmt(y_top * i / 4))}</text>"
        )
    if n:
        for i in sorted({0, n - 1}):
            anchor = "start" if i == 0 and n > 1 else "end"
            parts.append(
                f'<text x="{x_at(i):.1f}" y="{height - 8}" text-anchor="{anchor}" font-size="13" '
                f'fill="#4a4a5e">{escape(times[i].strftime("%H:%M"))}</text>'
            )
    legend_x = float(left)
    for label, colour, vs in series:
        parts.append(
            f'<rect x="{legend_x:.1f}" y="8" width="12" height="12" fill="{escape(colour)}"/>'
            f'<text x="{legend_x + 16:.1f}" y="18" font-size="13" fill="#1a1a2e">{escape(label)}</text>'
        )
        legend_x += 28 + 8 * len(label)
        runs: list[list[tuple[float, float]]] = [[]]
        for i, v in enumerate(vs[:n]):
            if v is None:
                runs.append([])
                continue
            x, y = x_at(i), y_at(v)
            if step and runs[-1]:
                runs[-1].append((x, runs[-1][-1][1]))
            runs[-1].append((x, y))
            tip = escape(f"{times[i].strftime('%H:%M')} {label}: {_fmt(v)} {unit}")
            dot = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{escape(colour)}">'
            parts.append(f"{dot}<title>{tip}</title></circle>")
        for run in runs:
            if len(run) > 1:
                line = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                parts.append(
                    f'<polyline fill="none" stroke="{escape(colour)}" stroke-width="2" points="{line}"/>'
                )
    parts.append("</svg>")
    return "".join(parts)


SERIES_COLOURS = ("#4b4bc8", "#c8654b", "#2e8b57", "#a04bc8", "#c8a04b", "#4ba0c8", "#6b6b7e", "#c84b8a")


def sweep_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    chart_id: str,
    width: int = 720,
    height: int = 280,
) -> str:
    """A sweep's results: for each series `(label, [(x, y), ...])` (one per value of the parameters
    not on the x axis; a lone series has the label ""), its points joined in x order, each with a
    tooltip, a legend when there are several. The y axis starts at zero; x spans the values swept."""
    left, right, top, bottom = 64, 16, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    y_top = nice_ceiling(max(ys, default=0.0))
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    def at(x: float, y: float) -> tuple[float, float]:
        return left + plot_w * (x - x_lo) / (x_hi - x_lo), top + plot_h - plot_h * y / y_top

    best = max(((y, x, label) for label, pts in series for x, y in pts), default=None)
    summary = (
        f"{len(ys)} points; highest {_fmt(best[0])} {y_label} at {x_label} {_fmt(best[1])}"
        + (f" ({best[2]})" if best and best[2] else "")
        if best
        else "no results yet"
    )
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{chart_id}-t {chart_id}-d" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{chart_id}-t">{escape(title)}</title>',
        f'<desc id="{chart_id}-d">{escape(summary)}</desc>',
    ]
    for i in range(5):
        y = top + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d4d4de" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="13" fill="#4a4a5e">'
            f"{escape(_fmt(y_top * i / 4))}</text>"
        )
    for x in sorted(set(xs))[:12] if len(set(xs)) <= 12 else [x_lo + (x_hi - x_lo) * i / 4 for i in range(5)]:
        px, _ = at(x, 0)
        anchor = "start" if px <= left + 1 else "end" if px >= left + plot_w - 1 else "middle"
        parts.append(
            f'<text x="{px:.1f}" y="{top + plot_h + 16}" text-anchor="{anchor}" font-size="13" '
            f'fill="#4a4a5e">{escape(_fmt(x))}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="13" '
        f'fill="#4a4a5e">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="13" fill="#4a4a5e" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    legend_x = float(left)
    for n, (label, pts) in enumerate(series):
        colour = SERIES_COLOURS[n % len(SERIES_COLOURS)]
        if label and len(series) > 1:
            parts.append(
                f'<rect x="{legend_x:.1f}" y="8" width="12" height="12" fill="{colour}"/>'
                f'<text x="{legend_x + 16:.1f}" y="18" font-size="13" fill="#1a1a2e">{escape(label)}</text>'
            )
            legend_x += 28 + 8 * len(label)
        ordered = sorted(pts)
        coords = [at(x, y) for x, y in ordered]
        if len(coords) > 1:
            line = " ".join(f"{px:.1f},{py:.1f}" for px, py in coords)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{line}"/>')
        for (x, y), (px, py) in zip(ordered, coords, strict=True):
            tip = escape(f"{label + ': ' if label else ''}{x_label} {_fmt(x)}: {_fmt(y)} {y_label}")
            parts.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{colour}"><title>{tip}</title></circle>'
            )
    parts.append("</svg>")
    return "".join(parts)
