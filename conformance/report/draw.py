"""report.html: every divergence, and for a layout divergence the two layouts drawn.

A drawing shows the tensor (1-D as one strip, N-D by its first two dims) twice, the boxes the
spec gives on the left and the boxes torch gave on the right, each rank in its own colour and
labelled where the box is large enough; under it, a per-rank table with the rows that differ
marked. Colours cycle through 64 distinct hues, so up to 64 ranks stay apart.
"""

from __future__ import annotations

import html
from typing import Any

from conformance.report.entries import Entry

WIDTH, HEIGHT, GAP = 360, 240, 40


def _colour(rank: int) -> str:
    hue = (rank * 137.508) % 360  # golden-angle steps: neighbours in rank order look different
    light = 62 if (rank // 16) % 2 == 0 else 45
    return f"hsl({hue:.0f}, 65%, {light}%)"


def _extent(shape: list[int]) -> tuple[int, int]:
    rows = shape[0] if shape else 1
    cols = shape[1] if len(shape) > 1 else 1
    return max(rows, 1), max(cols, 1)


def _panel(
    x0: int, title: str, shape: list[int], boxes: list[tuple[int, Any]], reach: tuple[int, int]
) -> list[str]:
    """``reach``: the extent drawn, at least the shape; larger when a box lies outside it."""
    rows, cols = _extent(shape)
    one_d = len(shape) <= 1
    # 1-D: a horizontal strip, the tensor's only dim running left to right.
    sx = WIDTH / (reach[0] if one_d else reach[1])
    sy = (HEIGHT / 3) if one_d else HEIGHT / reach[0]
    w_in, h_in = (rows * sx, sy) if one_d else (cols * sx, rows * sy)
    out = [
        f'<text x="{x0}" y="14" font-size="13" font-weight="bold">{html.escape(title)}</text>',
        f'<rect x="{x0}" y="20" width="{w_in:.1f}" height="{h_in:.1f}" '
        'fill="#f4f4f4" stroke="#999" stroke-dasharray="4 2"/>',
    ]
    for rank, (offsets, sizes) in boxes:
        if one_d:
            off, size = (offsets[0], sizes[0]) if offsets else (0, 1)
            x, y, w, h = x0 + off * sx, 20.0, size * sx, sy
        else:
            x, y = x0 + offsets[1] * sx, 20 + offsets[0] * sy
            w, h = sizes[1] * sx, sizes[0] * sy
        empty = any(s == 0 for s in sizes)
        if empty:  # an empty box: a tick where torch (or the spec) placed it
            out.append(
                f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x:.1f}" y2="{y + max(h, 8) + 4:.1f}" '
                f'stroke="{_colour(rank)}" stroke-width="3"><title>rank {rank}: empty box at '
                f"{list(offsets)}</title></line>"
            )
            continue
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
            f'fill="{_colour(rank)}" fill-opacity="0.55" stroke="#222">'
            f"<title>rank {rank}: offsets {list(offsets)}, sizes {list(sizes)}</title></rect>"
        )
        if w > 18 and h > 12:
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4:.1f}" font-size="11" '
                f'text-anchor="middle">r{rank}</text>'
            )
    return out


def layout_svg(boxes: list[dict[str, Any]]) -> str:
    """Side-by-side drawing of the spec's and torch's boxes from a repro's BOXES lines."""
    shape = list(boxes[0].get("shape", []))
    spec = [(b["rank"], box) for b in boxes for box in b.get("spec", [])]
    torch = [(b["rank"], box) for b in boxes for box in b.get("torch", [])]
    rows, cols = _extent(shape)
    for _, (offsets, sizes) in spec + torch:
        if offsets:
            rows = max(rows, offsets[0] + sizes[0])
            if len(offsets) > 1:
                cols = max(cols, offsets[1] + sizes[1])
    height = 40 + (HEIGHT / 3 if len(shape) <= 1 else HEIGHT)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * WIDTH + GAP + 10}" '
        f'height="{height:.0f}" font-family="sans-serif">'
    ]
    parts += _panel(5, f"the spec, shape {tuple(shape)}", shape, spec, (rows, cols))
    parts += _panel(5 + WIDTH + GAP, "torch (dashed: the tensor)", shape, torch, (rows, cols))
    parts.append("</svg>")
    return "\n".join(parts)


def _box_text(boxes: list[Any]) -> str:
    return "; ".join(f"{list(o)}+{list(s)}" for o, s in boxes) or "none"


def rank_table(boxes: list[dict[str, Any]]) -> str:
    rows = ["<table><tr><th>rank</th><th>the spec</th><th>torch</th></tr>"]
    for b in sorted(boxes, key=lambda b: b["rank"]):
        spec, torch = _box_text(b.get("spec", [])), _box_text(b.get("torch", []))
        mark = ' class="diff"' if spec != torch else ""
        rows.append(
            f"<tr{mark}><td>{b['rank']}</td><td>{html.escape(spec)}</td>"
            f"<td>{html.escape(torch)}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; line-height: 1.4 }
table { border-collapse: collapse; margin: .5em 0 } td, th { border: 1px solid #ccc;
padding: 2px 8px; text-align: left } tr.diff td { background: #fde2e2 }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto } .no { color: #b00 }
"""


def render_html(
    title: str, header: list[tuple[str, str]], entries: list[Entry], impl: str = "torch"
) -> str:
    out = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><table>",
    ]
    out += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in header]
    out.append("</table>")
    for e in entries:
        out.append(f'<h2 id="{e.id}">{html.escape(e.id)}: {html.escape(e.title)}</h2><ul>')
        out.append(f"<li><b>Breaks</b> {html.escape(e.rule or ', '.join(e.rules_cited))}</li>")
        out.append(f"<li><b>Upstream</b> {html.escape(e.upstream or 'not reported upstream')}</li>")
        worlds = ", ".join(map(str, e.world_sizes)) or "-"
        out.append(f"<li><b>World sizes</b> {worlds}</li>")
        if e.repro:
            ok = "reproduced" if e.reproduced else f"NOT reproduced ({e.repro_outcome})"
            cls = "" if e.reproduced else ' class="no"'
            out.append(f"<li><b>Repro</b> <code>{e.repro}</code>: <span{cls}>{ok}</span></li>")
        out.append("</ul>")
        for label, text in ((f"{impl} does", e.torch_does), ("the spec says", e.spec_says)):
            if text:
                out.append(f"<p><b>{label}</b>: {html.escape(text)}</p>")
        if e.divergences:
            out.append("<pre>" + html.escape("\n".join(e.divergences)) + "</pre>")
        if e.boxes:
            out.append(layout_svg(e.boxes))
            out.append(rank_table(e.boxes))
        for inst in e.instances[:3]:
            if inst.message:
                out.append(f"<p><code>{html.escape(inst.test)}</code></p>")
                out.append("<pre>" + html.escape(inst.message) + "</pre>")
    out.append("</body></html>")
    return "\n".join(out)
