"""Text pictures of layouts: which rank holds which region.

A 1-D or 2-D layout is drawn as a grid whose lines are the cuts of the layout (every box
start and stop) labelled with their true offsets; each region shows the ranks that hold it
(several ranks: replicas). Segments are drawn at equal width whatever their length, so a
dim of a million rows draws as compactly as one of ten, and every cut is still exact.
Borders are drawn only where the owning box changes, so a box spanning several segments
reads as one region. Empty shards hold no element and are listed below the picture.
0-d and >2-D layouts, layouts with too many cuts to draw, and invalid layouts are shown as
a table of boxes.

The picture is drawn from a shape and its shards and the verdict of validating them, so that
this module needs no :class:`~shardspec.metadata.Layout`: ``Layout.render`` and ``render``
call it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

from .box import Box
from .errors import LayoutError
from .shard import Shard

__all__ = ["MAX_COLS", "MAX_ROWS", "draw"]

MAX_ROWS = 48
MAX_COLS = 16


def draw(
    shape: tuple[int, ...],
    shards: Sequence[Shard],
    problem: LayoutError | None,
    *,
    max_rows: int = MAX_ROWS,
    max_cols: int = MAX_COLS,
) -> str:
    """A multi-line picture of the layout of ``shape`` and ``shards`` (no trailing newline);
    ``problem`` is what validating it raised, None for a valid layout."""
    lines = [_header(shape, shards)]
    if problem is not None:
        lines.append(f"invalid layout, shown as a table: {problem}")
        lines += _table(shards)
        return "\n".join(lines)
    ndim = len(shape)
    if ndim not in (1, 2):
        lines += _table(shards)
        return "\n".join(lines)
    grid_shape = shape if ndim == 2 else (1, shape[0])
    boxes = [
        b if ndim == 2 else Box._trusted((0, *b.offsets), (1, *b.sizes))
        for b in (s.box for s in shards)
    ]
    row_cuts = _cuts(grid_shape[0], boxes, 0)
    col_cuts = _cuts(grid_shape[1], boxes, 1)
    if len(row_cuts) - 1 > max_rows or len(col_cuts) - 1 > max_cols:
        if ndim == 1:
            what = f"{len(col_cuts) - 1} segments; limit {max_cols}"
        else:
            what = (
                f"{len(row_cuts) - 1} row and {len(col_cuts) - 1} column segments; "
                f"limits {max_rows} and {max_cols}"
            )
        lines.append(f"too many cuts to draw ({what}), shown as a table:")
        lines += _table(shards)
        return "\n".join(lines)
    if math.prod(shape) == 0:
        lines.append("(no elements: a dim has size 0)")
    else:
        lines += _grid(shards, boxes, row_cuts, col_cuts, draw_rows=ndim == 2)
    empties = [(i, s) for i, s in enumerate(shards) if s.box.is_empty]
    if empties:
        lines.append("empty shards (hold no element):")
        lines += [f"  shard {i} rank {s.rank}: {_slices(s.box)}" for i, s in empties]
    return "\n".join(lines)


def _header(shape: tuple[int, ...], shards: Sequence[Shard]) -> str:
    ranks = tuple(sorted({s.rank for s in shards}))
    n = len(shards)
    return (
        f"Layout shape={shape}: {n} shard{'s' if n != 1 else ''} "
        f"on rank{'s' if len(ranks) != 1 else ''} {_rank_list(ranks)}"
    )


def _rank_list(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks)) if ranks else "(none)"


def _slices(box: Box) -> str:
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in box) + "]"


def _holders(ranks: list[int]) -> str:
    # Many replicas would make every cell as wide as the list; name three and count the rest.
    if len(ranks) > 4:
        return ",".join(f"r{r}" for r in ranks[:3]) + f",+{len(ranks) - 3}"
    return ",".join(f"r{r}" for r in ranks)


def _table(shards: Sequence[Shard]) -> list[str]:
    rows = [("shard", "rank", "box", "")]
    for i, s in enumerate(shards):
        rows.append((str(i), str(s.rank), _slices(s.box), "empty" if s.box.is_empty else ""))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    return [f"  {a:>{w0}}  {b:>{w1}}  {c:<{w2}}  {d}".rstrip() for a, b, c, d in rows]


def _cuts(n: int, boxes: list[Box], d: int) -> list[int]:
    cuts = {0, n}
    for b in boxes:
        if not b.is_empty:
            cuts.add(b.offsets[d])
            cuts.add(b.offsets[d] + b.sizes[d])
    return sorted(cuts)


def _grid(
    shards: Sequence[Shard],
    boxes: list[Box],
    row_cuts: list[int],
    col_cuts: list[int],
    *,
    draw_rows: bool,
) -> list[str]:
    nr, nc = len(row_cuts) - 1, len(col_cuts) - 1
    # owner[i][j]: index of the distinct box covering segment cell (i, j). A valid layout
    # covers every cell with exactly one distinct box (replicas share it).
    distinct: dict[Box, list[int]] = {}
    for b, s in zip(boxes, shards, strict=True):
        if not b.is_empty:
            distinct.setdefault(b, []).append(s.rank)
    owner = [[-1] * nc for _ in range(nr)]
    labels: list[str] = []
    first_cell: list[tuple[int, int]] = []
    spans: list[tuple[int, int]] = []
    for k, (b, ranks) in enumerate(distinct.items()):
        r0 = bisect_left(row_cuts, b.offsets[0])
        r1 = bisect_left(row_cuts, b.offsets[0] + b.sizes[0])
        c0 = bisect_left(col_cuts, b.offsets[1])
        c1 = bisect_left(col_cuts, b.offsets[1] + b.sizes[1])
        for i in range(r0, r1):
            for j in range(c0, c1):
                owner[i][j] = k
        labels.append(_holders(sorted(ranks)))
        first_cell.append((r0, c0))
        spans.append((c0, c1))
    width = max([len(x) for x in labels] + [len(str(c)) for c in col_cuts]) + 2
    gutter = max(len(str(c)) for c in row_cuts) + 1 if draw_rows else 0
    # x position of column boundary j
    xs = [gutter + j * (width + 1) for j in range(nc + 1)]
    total = xs[-1] + 1

    top = [" "] * (total + len(str(col_cuts[-1])))
    for j, c in enumerate(col_cuts):
        top[xs[j] : xs[j] + len(str(c))] = list(str(c))
    out = ["".join(top).rstrip()]

    def cell(i: int, j: int) -> int:
        return owner[i][j] if 0 <= i < nr and 0 <= j < nc else -2

    for i in range(nr + 1):
        # border line above row i (i == nr: the bottom edge)
        line = [" "] * total
        for j in range(nc):
            if cell(i - 1, j) != cell(i, j):
                for x in range(xs[j] + 1, xs[j + 1]):
                    line[x] = "-"
        for j in range(nc + 1):
            vert_above = cell(i - 1, j - 1) != cell(i - 1, j) and i >= 1
            vert_below = cell(i, j - 1) != cell(i, j) and i < nr
            horiz_left = cell(i - 1, j - 1) != cell(i, j - 1) and j >= 1
            horiz_right = cell(i - 1, j) != cell(i, j) and j < nc
            vertical, horizontal = vert_above or vert_below, horiz_left or horiz_right
            if vert_above and vert_below and not horizontal:
                line[xs[j]] = "|"
            elif horiz_left and horiz_right and not vertical:
                line[xs[j]] = "-"
            elif vertical or horizontal:
                line[xs[j]] = "+"
        label = str(row_cuts[i]).rjust(gutter - 1) if draw_rows else ""
        out.append((label + "".join(line)[len(label) :]).rstrip())
        if i == nr:
            break
        line = [" "] * total
        for j in range(nc + 1):
            if cell(i, j - 1) != cell(i, j):
                line[xs[j]] = "|"
        for k, (fr, _) in enumerate(first_cell):
            if fr == i:
                c0, c1 = spans[k]
                left, right = xs[c0] + 1, xs[c1]
                text = labels[k].center(right - left)
                line[left:right] = list(text)
        out.append("".join(line).rstrip())
    return out
