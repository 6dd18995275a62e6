"""The demo's HTML report: self-contained (inline SVG, no scripts), so it opens anywhere."""

from __future__ import annotations

import html
from collections.abc import Sequence

WIDTH, HEIGHT, PAD = 640, 220, 40


def _scale(values: Sequence[float], lo: float, hi: float, out_lo: float, out_hi: float) -> list[float]:
    span = (hi - lo) or 1.0
    return [out_lo + (v - lo) / span * (out_hi - out_lo) for v in values]


def line_chart(title: str, xs: Sequence[float], series: dict[str, Sequence[float]], y_label: str) -> str:
    colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"]
    if not xs:
        return f"<h3>{html.escape(title)}</h3><p>no data</p>"
    top = max((max(s) for s in series.values() if s), default=1.0) or 1.0
    px = _scale(xs, min(xs), max(xs), PAD, WIDTH - 10)
    parts = [f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">',
             f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - 10}" y2="{HEIGHT - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>',
             f'<text x="4" y="16" font-size="11">{top:g}</text>',
             f'<text x="4" y="{HEIGHT - PAD}" font-size="11">0</text>',
             f'<text x="{PAD}" y="{HEIGHT - 8}" font-size="11">{html.escape(y_label)}</text>']
    for i, (name, ys) in enumerate(series.items()):
        py = _scale(ys, 0, top, HEIGHT - PAD, 10)
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(px, py, strict=False))
        color = colors[i % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{WIDTH - 200}" y="{20 + 14 * i}" font-size="12" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return f"<h3>{html.escape(title)}</h3>" + "".join(parts)


def bar_chart(title: str, bars: dict[str, float], unit: str) -> str:
    if not bars:
        return f"<h3>{html.escape(title)}</h3><p>no data</p>"
    top = max(bars.values()) or 1.0
    row = 22
    height = row * len(bars) + 10
    parts = [f'<svg class="chart" width="{WIDTH}" height="{height}" role="img" aria-label="{html.escape(title)}">']
    for i, (name, value) in enumerate(sorted(bars.items(), key=lambda kv: -kv[1])):
        width = (WIDTH - 260) * value / top
        y = 5 + i * row
        parts.append(f'<text x="0" y="{y + 14}" font-size="12">{html.escape(name)}</text>')
        parts.append(f'<rect x="150" y="{y}" width="{width:.1f}" height="16" fill="#2563eb"/>')
        parts.append(f'<text x="{155 + width:.1f}" y="{y + 13}" font-size="11">{value:,.2f} {html.escape(unit)}</text>')
    parts.append("</svg>")
    return f"<h3>{html.escape(title)}</h3>" + "".join(parts)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(title: str, summary_rows: Sequence[Sequence[object]], charts: Sequence[str],
           tables: Sequence[tuple[str, str]]) -> str:
    sections = "".join(f"<section>{c}</section>" for c in charts)
    extra = "".join(f"<section><h3>{html.escape(t)}</h3>{body}</section>" for t, body in tables)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:1000px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ddd;padding:4px 8px;text-align:left}}
section{{margin:1.5rem 0}}.chart{{background:#fafafa;border:1px solid #eee}}</style></head>
<body><h1>{html.escape(title)}</h1>
<section><h2>Summary</h2>{table(("what", "value"), summary_rows)}</section>
<h2>Charts</h2>{sections}{extra}
</body></html>
"""
