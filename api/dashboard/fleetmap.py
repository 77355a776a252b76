"""The fleet as an SVG map: each POD as its machines x 4 IPUs (16 rows for a POD64, 4 for a POD16),
each IPU server beside them as its 8 C2 cards x 2 IPUs.

Cells are coloured by tenant (hue) and partition (shade) and carry the partition's letter, so the
map also reads without colour; failed machines are hatched red and crossed, draining ones outlined
amber and dashed. Every machine is a link (keyboard-focusable) to its details and actions.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

CELL_W, CELL_H, GAP = 26, 20, 2
LABEL_W, MARK_W, HEADER_H = 40, 18, 30
ROW_H = CELL_H + GAP
POD_W = LABEL_W + 4 * (CELL_W + GAP) + MARK_W
POD_GAP = 22
PODS_PER_ROW = 2  # wider than this, the map's column shrinks the IPUs past reading
LETTERS = string.ascii_uppercase + string.ascii_lowercase + string.digits

FREE = "#e9e9f0"
FAILED = "#c62828"
DRAINING = "#b26a00"


@dataclass
class PartitionKey:
    name: str
    letter: str
    colour: str
    ink: str
    tenant: str | None
    tenant_name: str | None
    kind: str | None
    ipus: int
    job: str | None = None


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def colours(tenant: str | None, partition: str) -> tuple[str, str]:
    """(fill, text colour): the tenant picks the hue, the partition the shade."""
    if tenant is None:
        hue, sat = 215, 18
    else:
        hue, sat = _digest(tenant) % 360, 62
    light = (34, 44, 54, 64)[_digest(partition) % 4]
    ink = "#ffffff" if light < 50 else "#14141f"
    return f"hsl({hue}, {sat}%, {light}%)", ink


def letters(created: Mapping[str, int]) -> dict[str, str]:
    """Each partition's letter, from its creation order (its row's key), so that it keeps its letter
    from render to render and page to page while partitions come and go around it: the letter the key
    names, or (two on one map naming the same) the next one free, the older partition first."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for name, pk in sorted(created.items(), key=lambda item: (item[1], item[0])):
        for i in range(len(LETTERS)):
            letter = LETTERS[(pk - 1 + i) % len(LETTERS)]  # the first partition ever made is A
            if letter not in taken:
                break
        else:
            letter = LETTERS[(pk - 1) % len(LETTERS)]  # more partitions on one map than letters
        taken.add(letter)
        out[name] = letter
    return out


def legend(
    view: Mapping[str, Any],
    tenant_names: Mapping[str, str],
    jobs: Mapping[str, str | None],
    created: Mapping[str, int],
) -> list[PartitionKey]:
    """The partitions on the map, each with its letter and colours, in creation order."""
    shown: set[str] = {
        ipu["partition"]
        for pod in view.get("pods", [])
        for machine in pod["machines"]
        for ipu in machine["ipus"]
        if ipu.get("partition")
    }
    # Partitions created after `created` was read come last, in name order.
    late = max(created.values(), default=0) + 1
    letter_of = letters({name: created.get(name, late + i) for i, name in enumerate(sorted(shown))})
    keys: dict[str, PartitionKey] = {}
    for pod in view.get("pods", []):
        for machine in pod["machines"]:
            for ipu in machine["ipus"]:
                name = ipu.get("partition")
                if not name:
                    continue
                if name not in keys:
                    fill, ink = colours(ipu.get("tenant"), name)
                    tenant = ipu.get("tenant")
                    keys[name] = PartitionKey(
                        name=name,
                        letter=letter_of[name],
                        colour=fill,
                        ink=ink,
                        tenant=tenant,
                        tenant_name=tenant_names.get(tenant) if tenant else None,
                        kind=ipu.get("kind"),
                        ipus=0,
                        job=jobs.get(name),
                    )
                keys[name].ipus += 1
    return sorted(keys.values(), key=lambda k: (created.get(k.name, late), k.name))


def _shape(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(IPU cells per row, rows) of a unit: a POD's machines are rows of 4 IPUs; a server's C2 cards
    are rows of 2."""
    per_row = 2 if pod.get("layout") == "server" else 4
    return per_row, sum(-(-len(m["ipus"]) // per_row) for m in pod["machines"])


def draw(view: Mapping[str, Any], keys: list[PartitionKey], *, selected: str | None = None) -> str:
    by_name = {k.name: k for k in keys}
    pods = view.get("pods", [])
    columns = max(1, min(PODS_PER_ROW, len(pods)))
    # Units of a row of the map sit side by side; the row is as tall as its tallest unit (a POD64).
    tops: list[int] = []
    height = 0
    for first in range(0, len(pods), PODS_PER_ROW):
        if first:
            height += POD_GAP
        tops.append(height)
        height += max(HEADER_H + _shape(p)[1] * ROW_H for p in pods[first : first + PODS_PER_ROW])
    width = columns * POD_W + (columns - 1) * POD_GAP
    held = sum(k.ipus for k in keys)
    total = sum(len(m["ipus"]) for p in pods for m in p["machines"])
    servers = sum(1 for p in pods if p.get("layout") == "server")
    count = len(pods) - servers
    units = f"{count} POD{'' if count == 1 else 's'}" + (
        f" and {servers} server{'' if servers == 1 else 's'}" if servers else ""
    )
    title = f"Fleet map: {units}, {held} of {total} IPUs in partitions"
    out = [
        f'<svg class="fleet-map" viewBox="0 0 {width} {max(height, 1)}" role="group" '
        'aria-labelledby="fleet-t" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="fleet-t">{escape(title)}</title>',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6d4d4"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{FAILED}" stroke-width="2"/></pattern></defs>',
    ]
    for index, pod in enumerate(pods):
        ox = (index % PODS_PER_ROW) * (POD_W + POD_GAP)
        oy = tops[index // PODS_PER_ROW]
        kind = str(pod.get("model") or pod.get("layout") or "")
        kind = f"{pod.get('machine_type', '')} {kind}".strip()
        out.append(f'<g transform="translate({ox},{oy})">')
        out.append(
            f'<text x="0" y="16" font-size="13" font-weight="600" fill="#1c1c28">{escape(pod["id"])}</text>'
            f'<text x="{POD_W - 2}" y="16" font-size="11" text-anchor="end" fill="#4a4a5e">'
            f"{escape(kind)}</text>"
        )
        per_row, _ = _shape(pod)
        row = 0
        for machine in pod["machines"]:
            out.append(_machine(machine, by_name, selected, row, per_row))
            row += -(-len(machine["ipus"]) // per_row)
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _machine(
    machine: Mapping[str, Any],
    by_name: Mapping[str, PartitionKey],
    selected: str | None,
    first_row: int,
    per_row: int,
) -> str:
    """A machine as rows of IPU cells from ``first_row``: one row of 4 for a POD's machine, 8 rows of
    2 (one per C2 card) for a server, which is one machine."""
    slot = int(machine["slot"])
    ipus = machine["ipus"]
    rows = -(-len(ipus) // per_row)
    y = HEADER_H + first_row * ROW_H
    health = machine.get("health", "up")
    held = [i for i in ipus if i.get("partition")]
    describe = f"{machine['id']}, {health}"
    if machine.get("reason"):
        describe += f" ({machine['reason']})"
    names = sorted({str(i["partition"]) for i in held})
    n = len(ipus)
    describe += f", {len(held)} of {n} IPUs in " + ", ".join(names) if held else f", all {n} IPUs free"
    href = f"/admin/fleet?machine={quote(str(machine['id']))}#machine"
    parts = [
        f'<a href="{escape(href)}" aria-label="{escape(describe)}" class="machine machine-{escape(health)}">',
        f'<rect class="machine-focus" x="-2" y="{y - 2}" width="{POD_W}" height="{rows * ROW_H + 2}" rx="3" '
        f'fill="{"#fff3c4" if machine["id"] == selected else "transparent"}"/>',
    ]
    if per_row == 4:
        parts.append(f'<text x="2" y="{y + 14}" font-size="11" fill="#4a4a5e">m{slot:02d}</text>')
    for i, ipu in enumerate(ipus):
        row, col = divmod(i, per_row)
        if col == 0 and per_row != 4:
            parts.append(
                f'<text x="2" y="{y + row * ROW_H + 14}" font-size="11" fill="#4a4a5e">c{row}</text>'
            )
        x = LABEL_W + col * (CELL_W + GAP)
        cy = y + row * ROW_H
        key = by_name.get(ipu.get("partition") or "")
        if key is not None:
            fill, ink, letter = key.colour, key.ink, key.letter
            tip = f"{ipu['id']}: partition {key.name}" + (
                f", tenant {key.tenant_name or key.tenant}" if key.tenant else ""
            )
        else:
            fill = "url(#hatch)" if health == "failed" else FREE
            ink, letter = "#14141f", ""
            tip = f"{ipu['id']}: free" + ("" if health == "up" else f" ({health})")
        parts.append(
            f'<rect x="{x}" y="{cy}" width="{CELL_W}" height="{CELL_H}" rx="2" fill="{fill}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        if letter:
            parts.append(
                f'<text x="{x + CELL_W / 2}" y="{cy + 14}" font-size="12" font-weight="600" '
                f'text-anchor="middle" fill="{ink}">{escape(letter)}</text>'
            )
    cells_w = per_row * (CELL_W + GAP) - GAP
    box_h = rows * ROW_H - GAP
    mark_x = LABEL_W + 4 * (CELL_W + GAP) - GAP + 5
    if health == "failed":
        parts.append(
            f'<rect x="{LABEL_W - 1}" y="{y - 1}" width="{cells_w + 2}" height="{box_h + 2}" fill="none" '
            f'stroke="{FAILED}" stroke-width="2"/>'
            f'<path d="M{mark_x} {y + 4} l10 12 M{mark_x + 10} {y + 4} l-10 12" stroke="{FAILED}" '
            'stroke-width="2.5"/>'
        )
    elif health == "draining":
        parts.append(
            f'<rect x="{LABEL_W - 1}" y="{y - 1}" width="{cells_w + 2}" height="{box_h + 2}" fill="none" '
            f'stroke="{DRAINING}" stroke-width="2" stroke-dasharray="4 3"/>'
            f'<path d="M{mark_x} {y + 10} h10 M{mark_x + 6} {y + 5} l5 5 l-5 5" stroke="{DRAINING}" '
            'stroke-width="2" fill="none"/>'
        )
    parts.append("</a>")
    return "".join(parts)
