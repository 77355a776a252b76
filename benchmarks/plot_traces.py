"""Draw the docs' per-trace comparison: the JCT CDF of every policy and their average JCT as bars.

    .venv/bin/python benchmarks/plot_traces.py --run NAME=DIR [--run NAME=DIR ...] [--out docs/img]

Each DIR is what ``benchmarks/simulate_philly.py --out DIR`` wrote (a ``jobs.csv`` of every job
under every policy), or a directory of such directories (one replay per policy, each run alone so
its replay time is its own). NAME is the trace as the plots title it; what comes before its first
comma names the files, written into ``--out`` as standalone SVG drawn without a plotting library
(scheduler/simulator/svg.py): ``trace-<name>-jct-cdf.svg``, the JCT CDF of the six policies #31
compares, and ``trace-<name>-avg-jct.svg``, every policy's average JCT. docs/scheduling.md, "A second
trace", shows the committed ones and the commands that made them:

    .venv/bin/python benchmarks/simulate_philly.py --trace benchmarks/data/UniLu-Gaia-2014-2.swf.gz \\
        --policy default --out /tmp/gaia/default          # and so on, a policy each
    .venv/bin/python benchmarks/plot_traces.py --run "UniLu Gaia 2014, all 51,859 jobs=/tmp/gaia"
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.policy import POLICIES  # noqa: E402
from scheduler.simulator.svg import PALETTE, cdf_chart  # noqa: E402

# The research anchors last, each policy in the order of scheduler.policy.POLICIES otherwise.
ANCHORS = ("tiresias", "srtf-oracle")
SHIPPED = ("default", "default-classes")
# The CDF draws the policies #31 compares (ten lines on one chart cannot be told apart); the bars
# draw every policy replayed.
CDF_POLICIES = (*SHIPPED, "fifo-firstfit", "slurm-backfill", *ANCHORS)


def read_jct(directory: Path) -> dict[str, list[float]]:
    """Job completion times (s) by policy, from every jobs.csv in ``directory`` and its children."""
    found = sorted({directory / "jobs.csv", *directory.glob("*/jobs.csv")})
    jct: dict[str, list[float]] = defaultdict(list)
    for path in found:
        if not path.is_file():
            continue
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                jct[row["policy"]].append(float(row["jct_s"]))
    if not jct:
        raise SystemExit(f"no jobs.csv in {directory} or the directories in it")
    return dict(sorted(jct.items(), key=lambda item: _rank(item[0])))


def _rank(policy: str) -> tuple[int, int, str]:
    order = list(POLICIES)
    return (policy in ANCHORS, order.index(policy) if policy in order else len(order), policy)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def bar_chart(values: dict[str, float], *, title: str, unit: str) -> str:
    """Horizontal bars, one per policy, each labelled with its value."""
    width, row, left, right, top = 760, 26, 150, 90, 46
    height = top + row * len(values) + 40
    top_value = max(values.values(), default=1.0) or 1.0
    plot_w = width - left - right
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="24" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for i, (name, value) in enumerate(values.items()):
        y = top + row * i
        length = plot_w * value / top_value
        colour = PALETTE[0] if name in SHIPPED else PALETTE[7]
        if name in ANCHORS:
            colour = PALETTE[1]
        parts.append(
            f'<text x="{left - 8}" y="{y + row / 2 + 4:.1f}" text-anchor="end">{escape(name)}</text>'
        )
        parts.append(
            f'<rect x="{left}" y="{y + 4}" width="{max(length, 1):.1f}" height="{row - 8}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{left + length + 6:.1f}" y="{y + row / 2 + 4:.1f}">{value:,.2f} {unit}</text>'
        )
    bottom = top + row * len(values)
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333333"/>')
    parts.append(
        f'<text x="{left}" y="{bottom + 24}" fill="#555555">blue: default and default-classes; '
        "red: the research anchors (simulator only); grey: baselines and ablations</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for run in args.run:
        name, sep, directory = run.partition("=")
        if not sep:
            raise SystemExit(f"--run takes NAME=DIR, not {run!r}")
        jct = read_jct(Path(directory))
        counts = {len(v) for v in jct.values()}
        if len(counts) != 1:
            raise SystemExit(f"{directory}: the policies replayed different jobs ({sorted(counts)} jobs)")
        print(f"{name}: {counts.pop():,} jobs")
        stem = slug(name.split(",")[0])
        cdf = args.out / f"trace-{stem}-jct-cdf.svg"
        drawn = {policy: v for policy, v in jct.items() if policy in CDF_POLICIES} or jct
        cdf.write_text(cdf_chart(drawn, title=f"Job completion time, {name}", x_label="job completion time"))
        bars = args.out / f"trace-{stem}-avg-jct.svg"
        averages = {policy: sum(v) / len(v) / 3600 for policy, v in jct.items()}
        bars.write_text(bar_chart(averages, title=f"Average JCT, {name}", unit="h"))
        for path in (cdf, bars):
            print(f"wrote {path}")
        for policy, hours in averages.items():
            print(f"  {policy:>18}: avg JCT {hours:,.2f} h")


if __name__ == "__main__":
    main()
