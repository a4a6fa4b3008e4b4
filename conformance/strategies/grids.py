"""Large layouts for the validation area: regular grids and chunkings of 64 to a few hundred
shards (as many as a simulated world, up to 1024, under `nox -s conformance_scale`), where a
validator may switch to another algorithm (shardspec's validates layouts of 64 shards or more
in NumPy), and the same grids with one box straddling a cell boundary.

A straddling box hides one mistake in an otherwise regular grid: it reaches into its
neighbour's cell (an overlap), stops short of its own cell's end (a gap), moves by a row (both),
or takes part of the neighbour's cell that the neighbour gives up (valid, but no longer a product
grid). The brute-force oracle decides; the strategies only make sure every kind turns up.
Sizes stay small (a few thousand elements; tens of thousands for the 1024 cells of a simulated
world) so the oracle's enumeration stays cheap.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from itertools import accumulate, pairwise

from hypothesis import strategies as st

from shardspec.metadata import Box, Layout, Shard, chunk_layout

__all__ = [
    "LARGE_FROM",
    "STRADDLE_KINDS",
    "chunkings_with_many_ranks",
    "large_chunk_layouts",
    "large_grid_layouts",
    "large_layouts",
    "near_grid_layouts",
    "scale_worlds",
]

# The number of shards from which the layouts here start: shardspec's NumPy threshold
# (shardspec.metadata.columns.COLUMNS_FROM), restated so the suite does not read the
# implementation's constants.
LARGE_FROM = 64
STRADDLE_KINDS = ("overlap", "span", "gap", "shift", "take")


def scale_worlds() -> tuple[int, ...]:
    """The simulated world sizes (SHARDSPEC_SIM_WORLDS) of LARGE_FROM ranks or more, largest
    first; empty when none are set. Passed as ``worlds`` below, they make the layouts exactly
    that many cells or ranks (1024: rank numbers above 255), the largest first, so a run of a
    few examples starts there."""
    from shardspec.testing.devices import simulated_worlds

    return tuple(sorted((w for w in simulated_worlds() if w >= LARGE_FROM), reverse=True))


@st.composite
def _cell_counts(
    draw: st.DrawFn, max_cells: int, worlds: Sequence[int], min_cells: int = LARGE_FROM
) -> tuple[int, ...]:
    """Per-dim cell counts (1-D to 3-D) whose product lies in [min_cells, max_cells]; the
    last dim's count is drawn within the range the others leave. With ``worlds``: a
    factorization of one of them (size-1 dims included)."""
    if worlds:
        from conformance.strategies import factorizations

        return draw(factorizations(draw(st.sampled_from(worlds)), max_dims=3))
    nd = draw(st.integers(1, 3))
    # a count of 1: a dim no boundary cuts, which a straddling box can only fall short in
    lead = [draw(st.integers(1, 8)) for _ in range(nd - 1)]
    rest = math.prod(lead)
    low = max(1, -(-min_cells // rest))
    last = draw(st.integers(low, max(low, max_cells // rest)))
    return (*lead, last)


@st.composite
def _grid(
    draw: st.DrawFn, max_cells: int, worlds: Sequence[int], min_cells: int = LARGE_FROM
) -> tuple[tuple[int, ...], list[list[tuple[int, int]]]]:
    """A shape and, per dim, its cells as consecutive (start, stop) intervals of size 1-3."""
    counts = draw(_cell_counts(max_cells, worlds, min_cells))
    rnd = draw(_bulk())
    per_dim: list[list[tuple[int, int]]] = []
    for k in counts:
        sizes = [rnd.randint(1, 3) for _ in range(k)]
        edges = [0, *accumulate(sizes)]
        per_dim.append(list(pairwise(edges)))
    return tuple(iv[-1][1] for iv in per_dim), per_dim


def _bulk() -> st.SearchStrategy[random.Random]:
    # Hundreds of sizes and rank orders come from one seeded generator: drawing each value
    # separately makes Hypothesis' generation too slow for its health check.
    return st.randoms(use_true_random=False)


def _order(draw: st.DrawFn, k: int) -> list[int]:
    order = list(range(k))
    draw(_bulk()).shuffle(order)
    return order


def _cells(per_dim: list[list[tuple[int, int]]]) -> list[Box]:
    cells = [Box((), ())]
    for intervals in per_dim:
        cells = [Box((*c.offsets, a), (*c.sizes, b - a)) for c in cells for (a, b) in intervals]
    return cells


@st.composite
def large_grid_layouts(
    draw: st.DrawFn, *, max_cells: int = 300, worlds: Sequence[int] = ()
) -> Layout:
    """A valid regular grid of LARGE_FROM..max_cells cells (with ``worlds``: as many cells as
    one of them), one rank per cell in a drawn order, sometimes with empty boxes on extra ranks
    and a few replicated cells."""
    shape, per_dim = draw(_grid(max_cells, worlds))
    cells = _cells(per_dim)
    order = _order(draw, len(cells))
    shards = [Shard(c, r) for c, r in zip(cells, order)]
    extra = len(cells)
    for _ in range(draw(st.integers(0, 2))):  # empty boxes, at a cell's corner or at the end
        d = draw(st.integers(0, len(shape) - 1))
        corner = draw(st.sampled_from(cells))
        offs = list(corner.offsets)
        offs[d] = draw(st.sampled_from([offs[d], shape[d]]))
        sizes = list(corner.sizes)
        sizes[d] = 0
        shards.append(Shard(Box(offs, sizes), extra))
        extra += 1
    for _ in range(draw(st.integers(0, 2))):  # replicas: the same cell on another rank
        shards.append(Shard(draw(st.sampled_from(cells)), extra))
        extra += 1
    return Layout(shape, shards)


def _neighbour(per_dim: list[list[tuple[int, int]]], cell: Box, d: int) -> Box | None:
    """The cell after ``cell`` along dim ``d``, or None at the end."""
    starts = [a for a, _ in per_dim[d]]
    i = starts.index(cell.offsets[d])
    if i + 1 == len(per_dim[d]):
        return None
    a, b = per_dim[d][i + 1]
    offs, sizes = list(cell.offsets), list(cell.sizes)
    offs[d], sizes[d] = a, b - a
    return Box(offs, sizes)


def _with(box: Box, d: int, offset: int, size: int) -> Box:
    offs, sizes = list(box.offsets), list(box.sizes)
    offs[d], sizes[d] = offset, size
    return Box(offs, sizes)


@st.composite
def near_grid_layouts(
    draw: st.DrawFn,
    *,
    max_cells: int = 300,
    worlds: Sequence[int] = (),
    min_cells: int = LARGE_FROM,
) -> tuple[Layout, str]:
    """``(layout, kind)``: a large regular grid (one cell per rank; ``worlds`` as in
    :func:`large_grid_layouts`) with one box straddling a cell boundary along one dim; ``kind``
    is one of STRADDLE_KINDS (``min_cells`` below LARGE_FROM: small grids, which a validator
    checks on its plain path):

    - ``overlap``: the box grows into the next cell, which keeps its rows;
    - ``span``: the box grows over the whole next cell, so it ends where that cell does: every
      start and end of the grid is unchanged and there are as many boxes as cells, only the
      pairing of starts with ends says the box crosses a boundary;
    - ``gap``: the box shrinks, and nothing covers the rows it gave up;
    - ``shift``: the box moves by ``delta`` rows (an overlap on one side, a gap on the other);
    - ``take``: the box grows into the next cell and the next cell gives those rows up
      (valid, but no longer a product grid).
    """
    shape, per_dim = draw(_grid(max_cells, worlds, min_cells))
    cells = _cells(per_dim)
    d = draw(st.integers(0, len(shape) - 1))
    movable = [c for c in cells if _neighbour(per_dim, c, d) is not None]
    kind = draw(st.sampled_from(STRADDLE_KINDS))
    if not movable:  # one cell along d: the box can only shrink
        kind = "gap"
        movable = cells
    i = cells.index(draw(st.sampled_from(movable)))
    box = cells[i]
    o, n = box.offsets[d], box.sizes[d]
    if kind == "gap":
        cut = draw(st.integers(1, n))
        at_start = draw(st.booleans())
        cells[i] = _with(box, d, o + cut if at_start else o, n - cut)
    else:
        nxt = _neighbour(per_dim, box, d)
        assert nxt is not None
        j = cells.index(nxt)
        delta = draw(st.integers(1, nxt.sizes[d]))
        if kind == "span":
            cells[i] = _with(box, d, o, n + nxt.sizes[d])
        elif kind == "overlap":
            cells[i] = _with(box, d, o, n + delta)
        elif kind == "shift":
            cells[i] = _with(box, d, o + delta, n)
        else:  # take
            cells[i] = _with(box, d, o, n + delta)
            cells[j] = _with(nxt, d, nxt.offsets[d] + delta, nxt.sizes[d] - delta)
    order = _order(draw, len(cells))
    return Layout(shape, [Shard(c, r) for c, r in zip(cells, order)]), kind


@st.composite
def large_chunk_layouts(
    draw: st.DrawFn, *, max_ranks: int = 300, perturb: bool = True, worlds: Sequence[int] = ()
) -> Layout:
    """A chunking over LARGE_FROM..max_ranks ranks (with ``worlds``: over as many ranks as one
    of them, the largest first, the chunked dim drawn with it; more ranks than rows included,
    so empty chunks at the end), in a drawn rank order and shard order; with ``perturb``, maybe
    one box moved or resized by one element along any dim, the spanned ones included (about
    half are then invalid)."""
    from conformance.strategies.scale import largest_first, long_sides

    if worlds:  # the largest first, the chunked dim drawn with the world (data on most ranks)
        k = draw(largest_first(worlds))
        n = draw(long_sides(k))
    else:
        k = draw(st.integers(LARGE_FROM, max_ranks))
        n = draw(st.integers(1, 3 * k))
    other = draw(st.lists(st.integers(1, 3), max_size=2))
    dim = draw(st.integers(0, len(other)))
    shape = (*other[:dim], n, *other[dim:])
    layout = chunk_layout(shape, dim, _order(draw, k))
    shards = [layout.shards[i] for i in _order(draw, k)]
    if not perturb or draw(st.booleans()):
        return Layout(shape, shards)
    i = draw(st.integers(0, k - 1))
    # any dim: the chunked one, or one every box spans (a box one short there leaves a gap
    # that no chunk boundary explains; moved by one, it leaves the tensor)
    d = draw(st.integers(0, len(shape) - 1))
    b = shards[i].box
    o, s = b.offsets[d], b.sizes[d]
    delta = draw(st.sampled_from([-1, 1]))
    if draw(st.booleans()):
        shards[i] = Shard(_with(b, d, max(0, o + delta), s), shards[i].rank)
    else:
        shards[i] = Shard(_with(b, d, o, max(0, s + delta)), shards[i].rank)
    return Layout(shape, shards)


def chunkings_with_many_ranks() -> st.SearchStrategy[Layout]:
    """Valid chunkings in a drawn rank order and shard order: over 64 to 96 ranks, or over a
    few ranks numbered with gaps (1, 3, 5, ...), where a reversed or rotated rank order shows
    on every box."""
    from conformance.strategies import chunk_layouts, permuted, shapes

    return st.one_of(
        large_chunk_layouts(max_ranks=96, perturb=False),
        chunk_layouts(shapes(min_dims=1, max_dims=2, max_side=12), max_ranks=12)
        .map(lambda lay: lay.with_ranks({r: 2 * r + 1 for r in lay.ranks}))
        .flatmap(permuted),
    )


def large_layouts() -> st.SearchStrategy[Layout]:
    """Valid large grids, near-grids (one straddling box) and large chunkings, mixed."""
    return st.one_of(
        large_grid_layouts(),
        near_grid_layouts().map(lambda lk: lk[0]),
        large_chunk_layouts(),
    )
