"""A self-contained HTML capacity report: the table, the diagnosis, and an inline
SVG plot of throughput against streams (no scripts, no external files)."""

from __future__ import annotations

import html
import math

from .capacity import Review, format_duration, text_report

W, H, PAD = 640, 340, 50


def _plot(r: Review) -> str:
    rows = [x for x in r.rows if x.bits_per_second]
    if not rows:
        return "<p>No successful test to plot.</p>"
    top = max([x.bits_per_second or 0 for x in rows] + [x.expected.bits_per_second for x in rows if x.expected])
    top = top * 1.1 / 1e9
    xs = sorted({x.streams for x in r.rows})
    span = max(1.0, math.log2(xs[-1]) - math.log2(xs[0]))

    def px(streams: int) -> float:
        return PAD + (math.log2(streams) - math.log2(xs[0])) / span * (W - 2 * PAD)

    def py(gbps: float) -> float:
        return H - PAD - gbps / top * (H - 2 * PAD)

    measured = " ".join(f"{px(x.streams):.1f},{py((x.bits_per_second or 0) / 1e9):.1f}" for x in rows)
    expected = " ".join(f"{px(x.streams):.1f},{py(x.expected.bits_per_second / 1e9):.1f}" for x in rows if x.expected)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
        'font-size="12" role="img" aria-label="throughput against streams">',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#444"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#444"/>',
    ]
    for s in xs:
        parts.append(f'<text x="{px(s):.1f}" y="{H - PAD + 16}" text-anchor="middle">{s}</text>')
    for i in range(5):
        g = top * i / 4
        parts.append(f'<text x="{PAD - 6}" y="{py(g) + 4:.1f}" text-anchor="end">{g:.2g}</text>')
        parts.append(f'<line x1="{PAD}" y1="{py(g):.1f}" x2="{W - PAD}" y2="{py(g):.1f}" stroke="#ddd"/>')
    parts += [
        f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">parallel streams</text>',
        f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">Gbit/s</text>',
        f'<polyline points="{expected}" fill="none" stroke="#c33" stroke-dasharray="6 4"/>' if expected else "",
        f'<polyline points="{measured}" fill="none" stroke="#36c" stroke-width="2"/>',
        *(
            f'<circle cx="{px(x.streams):.1f}" cy="{py((x.bits_per_second or 0) / 1e9):.1f}" r="4" fill="#36c"/>'
            for x in rows
        ),
        f'<text x="{W - PAD}" y="{PAD - 20}" text-anchor="end" fill="#36c">measured</text>',
        f'<text x="{W - PAD}" y="{PAD - 6}" text-anchor="end" fill="#c33">expected (smallest limit)</text>',
        "</svg>",
    ]
    return "\n".join(p for p in parts if p)


def html_report(r: Review) -> str:
    knee = r.knee()
    t = r.transfer(knee)
    headline = ""
    if knee and t and r.volume_bytes:
        cost = f" for about ${t['cost']:,.0f}" if "cost" in t else ""
        headline = (
            f"<p class=headline>{r.volume_bytes / 1e12:g} TB in about {format_duration(t['seconds'])} "
            f"with {knee.streams} stream(s){cost}"
            f"{' (at the baseline: the measured rate ran on burst credits)' if 'burst_seconds' in t else ''}.</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pathprobe capacity review: {html.escape(r.target)}</title>
<style>body{{font-family:sans-serif;max-width:760px;margin:2em auto;color:#222}}
pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}.headline{{font-size:1.3em}}</style></head>
<body><h1>Capacity review: {html.escape(r.target)}</h1>
{headline}
{_plot(r)}
<pre>{html.escape(text_report(r))}</pre>
</body></html>
"""
