"""Layout validation: bounds, duplicates, pairwise disjointness and full coverage.

The algorithm, and why it is fast:

1. Per shard: ndim and bounds (empty boxes included: an empty chunk at offset = dim size is in
   bounds, one past it is not). Identical boxes are one *distinct box* held by several ranks
   (replicas); the same box twice on one rank is an error. Empty boxes take no further part:
   they hold no element, so they neither overlap nor cover.
2. Grid fast path: if, in every dim, the distinct intervals of the non-empty boxes tile
   ``[0, n)``, each box's interval in each dim is one of them, so every box is one cell of
   their product grid. Boxes in different cells are disjoint and boxes in the same cell are
   identical (replicas): the layout is valid exactly when every cell is held. This is every
   chunking, every DTensor layout and every regular grid, in O(n log n) with no pairwise work.
3. Otherwise the guillotine recursion of :mod:`.guillotine` decides coverage and
   disjointness of the distinct boxes; for large layouts the same recursion runs a level at
   a time in NumPy (:mod:`.guillotine_levels`), and boxes cut along one dim only (a chunking
   with a wrong offset or a lost row) take one sort, as upstream's 1-D check does.

Steps 1 and 2 exist twice with the same verdicts (the tests hold them to it): plain Python
over the shards, for small layouts, where NumPy's per-call overhead would dominate; and NumPy
over the columns a large layout keeps (:mod:`.columns`). A layout with a number above
``INT_LIMIT`` (2**62 - 1, so that an offset plus a size still fits int64) takes the Python
path whatever its size: Python ints are exact. Where several faults exist the report
is fixed: ndim, then bounds (the first shard out), then duplicates (the first shard that
repeats an earlier one), then an overlap before a gap.

Everything here reads a shape and its shards (and the columns of a large layout), not a
:class:`~shardspec.metadata.Layout`: ``Layout.validate`` hands them over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import add, attrgetter, contains, gt
from typing import TYPE_CHECKING, NoReturn

from .box import Box, show_ints
from .columns import INT_LIMIT, Columns
from .errors import LayoutError, shorten
from .guillotine import Bounds, Gap, Overlap, Problem, find_overlap, solve
from .guillotine_levels import find_problem_columns, fits

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .shard import Shard

__all__ = ["validate_columns", "validate_layout", "validate_shards"]

_box_bounds = attrgetter("box.offsets", "box.sizes")
_rank = attrgetter("rank")


def validate_layout(
    shape: tuple[int, ...], shards: Sequence[Shard], columns: Columns | None
) -> None:
    """Check the layout of ``shape`` and ``shards`` (``columns``: the shards as columns, which
    a large layout keeps); raise :class:`LayoutError` naming the offending shards."""
    if columns is None or max(shape, default=0) > INT_LIMIT:
        validate_shards(shape, shards)
    else:
        validate_columns(shape, shards, columns)


def validate_shards(shape: tuple[int, ...], shards: Sequence[Shard]) -> None:
    """Steps 1-2 in plain Python; every per-shard pass is a C-level map, zip or set."""
    nd = len(shape)
    m = len(shards)
    if m == 0:
        _require_shards(shape)
        return
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = list(map(_box_bounds, shards))
    offs, sizes = zip(*boxes)
    if set(map(len, sizes)) != {nd}:
        _raise_ndim(shape, shards, next(i for i, z in enumerate(sizes) if len(z) != nd))
    offs_by_dim = list(zip(*offs))
    sizes_by_dim = list(zip(*sizes))
    ends_by_dim = list(map(list, map(map, repeat(add), offs_by_dim, sizes_by_dim)))
    has_empty = nd == 0 or any(map(contains, sizes_by_dim, repeat(0)))
    if not has_empty:
        unique = set(boxes)
        if len(unique) == m:
            if _is_grid(offs_by_dim, ends_by_dim, shape, m):
                return  # m distinct boxes that are the cells of a grid tiling the tensor
        elif len(set(zip(boxes, map(_rank, shards)))) == m:
            # Replicas, no box twice on a rank: the distinct boxes must be the grid's cells.
            u_offs, u_sizes = zip(*unique)
            u_offs_by_dim = list(zip(*u_offs))
            u_ends = list(map(list, map(map, repeat(add), u_offs_by_dim, zip(*u_sizes))))
            if _is_grid(u_offs_by_dim, u_ends, shape, len(unique)):
                return

    # Something is off, or the layout has replicas or empty boxes: the checks in report order.
    if any(map(gt, map(max, ends_by_dim), shape)):
        _raise_bounds(
            shape, shards, next(i for i, s in enumerate(shards) if not s.box.fits_in(shape))
        )
    rows = list(zip(boxes, map(_rank, shards)))
    if len(set(rows)) != m:
        seen: dict[object, int] = {}
        for j, row in enumerate(rows):
            if row in seen:
                _raise_duplicate(shards, seen[row], j)
            seen[row] = j
    if nd == 0 or 0 in shape:
        return  # a 0-d tensor's one element is held by Box((), ()); an empty one needs nothing
    # The first holder of each distinct non-empty box, in shard order (reversed: first wins).
    firsts = sorted(dict(zip(reversed(boxes), range(m - 1, -1, -1))).values())
    distinct = [i for i in firsts if 0 not in sizes[i]] if has_empty else firsts
    if not distinct or not _is_grid(
        [[o[i] for i in distinct] for o in offs_by_dim],
        [[e[i] for i in distinct] for e in ends_by_dim],
        shape,
        len(distinct),
    ):
        _check_cover(shape, shards, distinct)


def _is_grid(
    offs_by_dim: Sequence[Sequence[int]],
    ends_by_dim: Sequence[list[int]],
    shape: tuple[int, ...],
    k: int,
) -> bool:
    """Whether ``k`` distinct non-empty boxes are exactly the cells of the grid their
    intervals make (then they are disjoint and cover the tensor)."""
    cells = 1
    for o, e, n in zip(offs_by_dim, ends_by_dim, shape):
        # The intervals tile [0, n) when the distinct starts and ends interleave as
        # 0 = s0 < e0 = s1 < ... < e_last = n and every box ends where its start's interval does.
        start_set, stop_set = set(o), set(e)
        if len(start_set) == 1:  # one interval: it must be the whole dim (most dims are so)
            if start_set != {0} or stop_set != {n}:
                return False
            continue
        starts, stops = sorted(start_set), sorted(stop_set)
        if starts[0] != 0 or stops[-1] != n or starts[1:] != stops[:-1]:
            return False
        # With fewer intervals than boxes, check each box ends where its start's interval
        # does. With one interval per box the pairing is forced: a box [s_i, e_j) needs
        # s_i < e_j = s_(j+1), so j >= i for every box, which only the identity satisfies.
        if 1 < len(starts) < k and list(map(dict(zip(starts, stops)).__getitem__, o)) != e:
            return False
        cells *= len(starts)
        if cells > k:
            return False
    # Distinct boxes map injectively onto cells, so as many boxes as cells fills every cell.
    return cells == k


def validate_columns(shape: tuple[int, ...], shards: Sequence[Shard], columns: Columns) -> None:
    """Steps 1-2 in NumPy over the columns of a large layout."""
    import numpy as np

    nd = len(shape)
    m = len(shards)
    if m == 0:
        _require_shards(shape)
        return
    offs, sizes, ranks = columns.offsets, columns.sizes, columns.ranks
    ends = offs + sizes
    dims = np.asarray(shape, dtype=np.int64)
    if nd and (ends.max(axis=1) > dims).any():
        _raise_bounds(shape, shards, int(np.argmax((ends > dims[:, None]).any(axis=0))))
    all_keys = [*offs, *sizes, ranks]
    if nd == 0 or 0 in shape:
        _check_duplicates(shards, all_keys)
        return

    full = bool(sizes.min() > 0)
    held = None if full else np.flatnonzero((sizes > 0).all(axis=0))
    if held is None:
        grid = _grid_cells(offs, ends, shape)
    else:
        grid = _grid_cells(offs[:, held], ends[:, held], shape) if held.size else None
    if grid is not None:
        cell, count = grid
        if cell is None or np.bincount(cell, minlength=count).min() > 0:
            # Every cell is held. Boxes in one cell are one box, so the only fault left is a
            # box twice on one rank, impossible when every shard has a cell of its own.
            if not (full and count == m):
                _check_duplicates(shards, all_keys)
            return
    sorted_rows = _check_duplicates(shards, all_keys)
    # The first holder of each distinct non-empty box, in shard order.
    if sorted_rows is None:
        firsts = np.arange(m)
    else:
        order, same_box = sorted_rows
        starts = np.flatnonzero(np.concatenate(([True], ~same_box)))
        firsts = np.minimum.reduceat(order, starts) if same_box.any() else order
    if not full:
        firsts = firsts[(sizes[:, firsts] > 0).all(axis=0)]
    firsts = np.sort(firsts)
    if not firsts.size or not fits(firsts.size, shape):
        _check_cover(shape, shards, [int(i) for i in firsts])
        return
    problem = find_problem_columns(offs[:, firsts], ends[:, firsts], shape)
    if isinstance(problem, Gap):
        _raise_gap(shape, shards, problem.point)
    if isinstance(problem, Overlap):
        a, b = int(firsts[problem.a]), int(firsts[problem.b])

        def holders(i: int) -> list[int]:
            same = (offs == offs[:, i : i + 1]).all(axis=0)
            same &= (sizes == sizes[:, i : i + 1]).all(axis=0)
            return [int(j) for j in np.flatnonzero(same)]

        _raise_overlap(shape, shards, a, b, holders(a), holders(b))


def _grid_cells(
    offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], shape: tuple[int, ...]
) -> tuple[npt.NDArray[np.int64] | None, int] | None:
    """Each box's cell in the grid of the boxes' distinct intervals, and the number of
    cells; None when some dim's intervals do not tile it, or there are more cells than boxes
    (some cell is then empty). The cells come back as None when every box has a cell of
    its own, which is then known without computing them."""
    import numpy as np

    nd, m = offs.shape
    cell: npt.NDArray[np.int64] | None = None
    count = 1
    own_cells = False
    for d in range(nd):
        n = shape[d]
        o, e = offs[d], ends[d]
        if o.max() == 0 and e.min() == n:
            continue  # every box spans the dim: one interval
        starts, stops = np.sort(o), np.sort(e)
        starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
        stops = stops[np.concatenate(([True], stops[1:] != stops[:-1]))]
        k = len(starts)
        if starts[0] != 0 or stops[-1] != n or len(stops) != k or np.any(starts[1:] != stops[:-1]):
            return None
        count *= k
        if count > m:
            return None
        if k == m:
            # Distinct starts and distinct ends, one per box: a box [s_i, e_j) needs
            # s_i < e_j = s_(j+1), so j >= i for every box, which only the identity pairing
            # satisfies. Each box is its own interval, hence its own cell.
            own_cells = True
            continue
        at = np.searchsorted(starts, o)
        if np.any(stops[at] != e):
            return None  # a box ends elsewhere than its start's interval does
        cell = at if cell is None else cell * k + at
    if own_cells:
        return None, count
    return (np.zeros(m, dtype=np.int64) if cell is None else cell), count


def _check_duplicates(
    shards: Sequence[Shard], keys: list[npt.NDArray[np.int64]]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None:
    """Raise for the first shard whose row of ``keys`` (the last key being the rank) repeats an
    earlier shard's. Returns the rows' sorted order and, between neighbours in it, whether
    they hold the same box (all keys but the rank equal); None for fewer than two rows."""
    import numpy as np

    m = len(keys[0])
    if m < 2:
        return None
    order = np.lexsort(keys[::-1])
    same_box = np.ones(m - 1, dtype=bool)
    for key in keys[:-1]:
        s = key[order]
        same_box &= s[1:] == s[:-1]
    ranks = keys[-1][order]
    same = same_box & (ranks[1:] == ranks[:-1])
    if same.any():
        # lexsort is stable: a row equal to the one before it in sorted order is a later
        # repeat.
        j = int(order[1:][same].min())
        first = np.ones(m, dtype=bool)
        for key in keys:
            first &= key == key[j]
        _raise_duplicate(shards, int(np.argmax(first)), j)
    return order, same_box


def _require_shards(shape: tuple[int, ...]) -> None:
    if math.prod(shape) != 0:
        point = (0,) * len(shape)
        raise LayoutError(
            f"the shards do not cover the tensor: element {point} of shape {show_ints(shape)} "
            f"is held by no shard (the layout has no shards)",
            kind="gap",
            point=point,
        )


def _check_cover(shape: tuple[int, ...], shards: Sequence[Shard], picked: list[int]) -> None:
    """Raise unless the distinct non-empty boxes ``picked`` (shard indices) tile the tensor."""
    nd = len(shape)
    bounds: list[Bounds] = [(shards[i].box.offsets, shards[i].box.stops) for i in picked]
    if not bounds:
        problem: Problem | None = Gap((0,) * nd)
    else:
        problem = solve(bounds, list(range(len(bounds))), (0,) * nd, shape)
    if problem is None:
        return
    if isinstance(problem, Gap):
        # A layout that overlaps and also leaves a gap is reported as the overlap: it names
        # two shards (the more specific fault), and it is what upstream's overlap checks
        # (`validate_non_overlapping_shards_metadata`, `_validate_global_plan`) report for it.
        pair = find_overlap(bounds)
        if pair is not None:
            problem = Overlap(*pair)
    if isinstance(problem, Gap):
        _raise_gap(shape, shards, problem.point)
    a, b = picked[problem.a], picked[problem.b]
    box_a, box_b = shards[a].box, shards[b].box
    _raise_overlap(
        shape,
        shards,
        a,
        b,
        [i for i, s in enumerate(shards) if s.box == box_a],
        [i for i, s in enumerate(shards) if s.box == box_b],
    )


def _raise_gap(shape: tuple[int, ...], shards: Sequence[Shard], point: tuple[int, ...]) -> NoReturn:
    raise LayoutError(
        f"the shards do not cover the tensor: element {show_ints(point)} of shape "
        f"{show_ints(shape)} is held by no shard ({len(shards)} shards)",
        kind="gap",
        point=point,
    )


def _raise_overlap(
    shape: tuple[int, ...],
    shards: Sequence[Shard],
    a: int,
    b: int,
    holders_a: list[int],
    holders_b: list[int],
) -> NoReturn:
    """Shards ``a`` and ``b`` overlap; ``holders_*`` are all the shards with each box."""
    box_a, box_b = shards[a].box, shards[b].box
    raise LayoutError(
        f"shards overlap: {_describe(box_a, shards, holders_a)} and "
        f"{_describe(box_b, shards, holders_b)} share {box_a.intersect(box_b)} "
        f"(layout shape {show_ints(shape)}); replicas must be identical boxes",
        kind="overlap",
        shards=(a, b),
    )


def _raise_ndim(shape: tuple[int, ...], shards: Sequence[Shard], i: int) -> NoReturn:
    s = shards[i]
    raise LayoutError(
        f"shard #{i} on rank {shorten(s.rank)} has {s.box.ndim} dims but the layout shape "
        f"{show_ints(shape)} has {len(shape)}: {s.box}",
        kind="ndim",
        shards=(i,),
    )


def _raise_bounds(shape: tuple[int, ...], shards: Sequence[Shard], i: int) -> NoReturn:
    box, rank = shards[i].box, shards[i].rank
    d = next(d for d in range(len(shape)) if box.offsets[d] + box.sizes[d] > shape[d])
    raise LayoutError(
        f"shard #{i} on rank {shorten(rank)} is out of bounds in dim {d}: {box} ends "
        f"at {shorten(box.offsets[d] + box.sizes[d])} but the dim has size {shorten(shape[d])} "
        f"(layout shape {show_ints(shape)})",
        kind="bounds",
        shards=(i,),
    )


def _raise_duplicate(shards: Sequence[Shard], i: int, j: int) -> NoReturn:
    s = shards[i]
    raise LayoutError(
        f"shards #{i} and #{j} are the same box {s.box} twice on rank {shorten(s.rank)}",
        kind="duplicate",
        shards=(i, j),
    )


def _describe(box: Box, shards: Sequence[Shard], holders: list[int]) -> str:
    ranks = [shards[i].rank for i in holders]
    idx = ", ".join(f"#{i}" for i in holders)
    who = f"rank {shorten(ranks[0])}" if len(ranks) == 1 else f"ranks {shorten(ranks)}"
    return f"shard {idx} {box} on {who}"
