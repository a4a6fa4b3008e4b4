"""SVG pictures of checkpointed tensors' chunks (``shardspec inspect --svg``).

Each 1-D or 2-D tensor is a panel: the tensor is a red rectangle (red is what no chunk
covers) and each chunk a translucent box on it, labelled with its index and, on hover, its
offsets, sizes and file (so overlaps show darker). Each dim is scaled to the panel on its own,
like the text picture, so a tall thin tensor stays readable. Tensors of other ranks and
zero-size tensors get a line of text.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from .report import TensorReport

__all__ = ["reports_svg"]

_W, _H, _PAD, _TITLE = 360.0, 180.0, 12.0, 34.0
_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")


def reports_svg(reports: Sequence[TensorReport]) -> str:
    """One SVG document with a panel per tensor, stacked vertically."""
    parts: list[str] = []
    y = _PAD
    for t in reports:
        parts.append(_text(_PAD, y + 14, f"{t.fqn}  {tuple(t.shape)} {t.dtype}", bold=True))
        verdict = "OK" if t.error is None else f"INVALID: {t.error}"
        parts.append(_text(_PAD, y + 28, verdict[:160], color="#000" if t.ok else "#c00"))
        y += _TITLE
        if t.numel == 0 or len(t.shape) not in (1, 2):
            why = "zero-size tensor" if t.numel == 0 else f"{len(t.shape)}-d tensor"
            parts.append(_text(_PAD, y + 12, f"({why}: {len(t.chunks)} chunks, not drawn)"))
            y += 24
            continue
        rows, cols = (t.shape[0], t.shape[1]) if len(t.shape) == 2 else (1, t.shape[0])
        height = _H if len(t.shape) == 2 else 40.0
        sx, sy = _W / cols, height / rows
        parts.append(
            f'<rect x="{_PAD}" y="{y}" width="{_W}" height="{height}" fill="#e15759">'
            f"<title>not in any chunk</title></rect>"
        )
        for i, c in enumerate(t.chunks):
            if any(n == 0 for n in c.sizes) or len(c.sizes) != len(t.shape):
                continue
            (r0, c0), (nr, nc) = (
                (c.offsets, c.sizes) if len(t.shape) == 2 else ((0, *c.offsets), (1, *c.sizes))
            )
            x, yy = _PAD + c0 * sx, y + r0 * sy
            tip = f"chunk #{i} offsets {c.offsets} sizes {c.sizes} in {c.file}"
            parts.append(
                f'<rect x="{x:.2f}" y="{yy:.2f}" width="{nc * sx:.2f}" height="{nr * sy:.2f}" '
                f'fill="{_COLORS[i % len(_COLORS)]}" fill-opacity="0.75" stroke="#fff">'
                f"<title>{escape(tip)}</title></rect>"
            )
            parts.append(_text(x + 3, yy + min(nr * sy, 14.0) - 2, f"#{i}", size=10))
        y += height + _PAD
    total = y + _PAD
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W + 2 * _PAD}" height="{total}" '
        f'viewBox="0 0 {_W + 2 * _PAD} {total}" font-family="monospace">\n'
        + "\n".join(parts)
        + "\n</svg>\n"
    )


def _text(
    x: float, y: float, s: str, *, bold: bool = False, color: str = "#000", size: int = 12
) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:.2f}" y="{y:.2f}" font-size="{size}" fill="{color}"{weight}>'
        f"{escape(s)}</text>"
    )
