"""Layout validation: bounds, duplicates, pairwise disjointness and full coverage.

The algorithm, and why it is fast:

1. Per shard: ndim and bounds (empty boxes included: an empty chunk at offset = dim size is in
   bounds, one past it is not). Identical boxes are folded into one *distinct box* with the
   list of its owners (replicas); the same box twice on one rank is an error. Empty boxes take
   no further part: they hold no element, so they neither overlap nor cover.
2. Grid fast path (vectorised): if, in every dim, the distinct intervals of the boxes tile
   ``[0, n)`` exactly, and the number of distinct boxes equals the product of the interval
   counts, then the boxes are the cells of a product grid: disjoint and covering. This is
   every chunking, every DTensor layout and every regular grid, in O(n log n).
3. Otherwise a guillotine recursion over regions: in a region, sort the boxes by start in each
   dim; a position that no box straddles is a cut and splits the region; a position no box
   covers is a gap (reported with that point). Layouts built by cutting (TorchRec tables,
   nested chunks, random guillotine partitions) resolve in O(n log n) per level.
4. A region no dim can cut is checked by a sweep line for a pair of overlapping boxes, then
   by volume; a missing volume is located by scanning cross-sections. This is at worst the
   cost of upstream's sweep line, and is only reached by non-guillotine layouts or overlaps.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_right, insort
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

from .box import Box
from .errors import LayoutError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .layout import Layout, Shard

__all__ = ["validate_layout"]

_Bounds = tuple[tuple[int, ...], tuple[int, ...]]  # (starts, stops)


class _Overlap:
    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b


class _Gap:
    __slots__ = ("point",)

    def __init__(self, point: tuple[int, ...]) -> None:
        self.point = point


_Problem = _Overlap | _Gap
_box_sizes = attrgetter("box.sizes")


def validate_layout(layout: Layout) -> None:
    import numpy as np

    shape = layout.shape
    nd = len(shape)
    shards = layout.shards
    m = len(shards)

    # The per-shard ndim scan runs in C (map/attrgetter); the loop below only names the culprit.
    ndims = set(map(len, map(_box_sizes, shards)))
    for i, s in enumerate(shards if ndims - {nd} else ()):
        if len(s.box.sizes) != nd:
            raise LayoutError(
                f"shard #{i} on rank {s.rank} has {s.box.ndim} dims but the layout shape "
                f"{shape} has {nd}: {s.box}",
                kind="ndim",
                shards=(i,),
            )
    if m == 0:
        if math.prod(shape) != 0:
            raise LayoutError(
                f"the shards do not cover the tensor: element {(0,) * nd} of shape {shape} "
                f"is held by no shard (the layout has no shards)",
                kind="gap",
                point=(0,) * nd,
            )
        return

    # One row per shard: offsets, sizes, rank. Everything below is vectorised over rows.
    width = 2 * nd + 1
    rows = np.fromiter(
        chain.from_iterable(s.box.offsets + s.box.sizes + (s.rank,) for s in shards),
        dtype=np.int64,
        count=m * width,
    ).reshape(m, width)
    offs, sizes = rows[:, :nd], rows[:, nd : 2 * nd]
    ends = offs + sizes

    if nd:
        outside = np.nonzero((ends > np.asarray(shape, dtype=np.int64)).any(axis=1))[0]
        if outside.size:
            i = int(outside[0])
            box = shards[i].box
            d = next(d for d in range(nd) if box.offsets[d] + box.sizes[d] > shape[d])
            raise LayoutError(
                f"shard #{i} on rank {shards[i].rank} is out of bounds in dim {d}: {box} ends "
                f"at {box.offsets[d] + box.sizes[d]} but the dim has size {shape[d]} "
                f"(layout shape {shape})",
                kind="bounds",
                shards=(i,),
            )

    # Sorting rows by (box, rank) puts replicas of a box next to each other and the same
    # (box, rank) twice in consecutive rows.
    order = np.lexsort(rows.T[::-1]) if width > 1 else np.argsort(rows[:, 0], kind="stable")
    ranked = rows[order]
    if m > 1:
        same_row = (ranked[1:] == ranked[:-1]).all(axis=1)
        if same_row.any():
            k = int(np.argmax(same_row))
            i, j = sorted((int(order[k]), int(order[k + 1])))
            raise LayoutError(
                f"shards #{i} and #{j} are the same box {shards[i].box} twice on rank "
                f"{shards[i].rank}",
                kind="duplicate",
                shards=(i, j),
            )
        new_box = np.ones(m, dtype=bool)
        new_box[1:] = ~(ranked[1:, : 2 * nd] == ranked[:-1, : 2 * nd]).all(axis=1)
        distinct = np.sort(order[new_box])
    else:
        distinct = order

    if math.prod(shape) == 0:
        return  # nothing to cover; every box is empty and in bounds
    if nd == 0:
        return  # at least one shard holds Box((), ()): the one element is covered

    distinct = distinct[(sizes[distinct] > 0).all(axis=1)]
    if distinct.size and _is_exact_grid(offs[distinct], ends[distinct], shape):
        return
    picked = [int(i) for i in distinct]
    bounds = [(shards[i].box.offsets, shards[i].box.stops) for i in picked]
    if not bounds:
        problem: _Problem | None = _Gap((0,) * nd)
    else:
        problem = _solve(bounds, list(range(len(bounds))), (0,) * nd, shape)
    if problem is None:
        return
    if isinstance(problem, _Gap):
        # A layout that overlaps and also leaves a gap is reported as the overlap: it names
        # two shards (the more specific fault), and it is what upstream's overlap checks
        # (`validate_non_overlapping_shards_metadata`, `_validate_global_plan`) report for it.
        pair = _find_overlap(bounds)
        if pair is not None:
            problem = _Overlap(*pair)
    if isinstance(problem, _Gap):
        raise LayoutError(
            f"the shards do not cover the tensor: element {problem.point} of shape {shape} "
            f"is held by no shard ({m} shards)",
            kind="gap",
            point=problem.point,
        )
    a, b = picked[problem.a], picked[problem.b]
    box_a, box_b = shards[a].box, shards[b].box
    raise LayoutError(
        f"shards overlap: {_describe(box_a, shards)} and {_describe(box_b, shards)} share "
        f"{box_a.intersect(box_b)} (layout shape {shape}); replicas must be identical boxes",
        kind="overlap",
        shards=(a, b),
    )


def _describe(box: Box, shards: tuple[Shard, ...]) -> str:
    holders = [i for i, s in enumerate(shards) if s.box == box]
    ranks = [shards[i].rank for i in holders]
    idx = ", ".join(f"#{i}" for i in holders)
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    return f"shard {idx} {box} on {who}"


def _is_exact_grid(
    offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], shape: tuple[int, ...]
) -> bool:
    import numpy as np

    m, nd = offs.shape
    cells = 1
    for d in range(nd):
        n = shape[d]
        if n < 3_000_000_000:  # (n + 1) ** 2 fits in int64: one sortable key per interval
            # Sort, then drop repeats: several times faster than np.unique's hash path here.
            keys = np.sort(offs[:, d] * (n + 1) + ends[:, d])
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
            starts, stops = keys // (n + 1), keys % (n + 1)
        else:
            pairs = np.unique(np.stack([offs[:, d], ends[:, d]], axis=1), axis=0)
            starts, stops = pairs[:, 0], pairs[:, 1]
        if starts[0] != 0 or stops[-1] != n or np.any(starts[1:] != stops[:-1]):
            return False
        cells *= len(starts)
        if cells > m:
            return False
    # Distinct boxes map injectively onto cells (each dim's intervals tile the dim), so as many
    # boxes as cells means every cell is taken exactly once.
    return bool(cells == m)


def _solve(
    bounds: list[_Bounds], root: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
) -> _Problem | None:
    nd = len(lo)
    stack: list[tuple[list[int], tuple[int, ...], tuple[int, ...]]] = [(root, lo, hi)]
    while stack:
        idx, rlo, rhi = stack.pop()
        if len(idx) == 1:
            problem = _single(bounds[idx[0]], rlo, rhi)
            if problem is not None:
                return problem
            continue
        best: list[tuple[int, int, list[int]]] | None = None
        best_dim = -1
        for d in range(nd):
            groups, gap = _cuts(bounds, idx, d, rlo[d], rhi[d])
            if gap is not None:
                return _Gap(rlo[:d] + (gap,) + rlo[d + 1 :])
            if len(groups) > 1 and (best is None or len(groups) > len(best)):
                best, best_dim = groups, d
        if best is None:
            problem = _uncut(bounds, idx, rlo, rhi)
            if problem is not None:
                return problem
            continue
        d = best_dim
        for start, stop, members in best:
            stack.append(
                (members, rlo[:d] + (start,) + rlo[d + 1 :], rhi[:d] + (stop,) + rhi[d + 1 :])
            )
    return None


def _single(b: _Bounds, lo: tuple[int, ...], hi: tuple[int, ...]) -> _Problem | None:
    starts, stops = b
    for d in range(len(lo)):
        if starts[d] > lo[d]:
            return _Gap(lo)
        if stops[d] < hi[d]:
            return _Gap(lo[:d] + (stops[d],) + lo[d + 1 :])
    return None


def _cuts(
    bounds: list[_Bounds], idx: list[int], d: int, lo: int, hi: int
) -> tuple[list[tuple[int, int, list[int]]], int | None]:
    """Split ``idx`` at every position of dim ``d`` that no box straddles.

    Returns the groups as (start, stop, members), or a position in [lo, hi) that no box
    covers (a gap), as the second item.
    """
    order = sorted(idx, key=lambda i: bounds[i][0][d])
    groups: list[tuple[int, int, list[int]]] = []
    reach = lo
    g_start = lo
    members: list[int] = []
    for i in order:
        start, stop = bounds[i][0][d], bounds[i][1][d]
        if start > reach:
            return [], reach
        if start == reach and members:
            groups.append((g_start, reach, members))
            members = []
            g_start = start
        members.append(i)
        if stop > reach:
            reach = stop
    if reach < hi:
        return [], reach
    groups.append((g_start, reach, members))
    return groups, None


def _uncut(
    bounds: list[_Bounds], idx: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
) -> _Problem | None:
    pair = _sweep_overlap(bounds, idx)
    if pair is not None:
        return _Overlap(*pair)
    volume = sum(math.prod(b - a for a, b in zip(*bounds[i])) for i in idx)
    if volume == math.prod(b - a for a, b in zip(lo, hi)):
        return None
    return _Gap(_gap_by_sections(bounds, idx, lo, hi))


def _find_overlap(bounds: list[_Bounds]) -> tuple[int, int] | None:
    """A pair of overlapping boxes, whether or not the boxes cover the region.

    The same guillotine recursion as :func:`_solve`, but a position no box covers is just
    another cut; only groups no dim can split go to the sweep line.
    """
    nd = len(bounds[0][0]) if bounds else 0
    stack: list[list[int]] = [list(range(len(bounds)))]
    while stack:
        idx = stack.pop()
        if len(idx) < 2:
            continue
        best: list[list[int]] = [idx]
        for d in range(nd):
            order = sorted(idx, key=lambda i: bounds[i][0][d])
            groups: list[list[int]] = []
            reach = -1
            for i in order:
                if bounds[i][0][d] >= reach:
                    groups.append([])
                groups[-1].append(i)
                reach = max(reach, bounds[i][1][d])
            if len(groups) > len(best):
                best = groups
        if len(best) > 1:
            stack.extend(best)
            continue
        pair = _sweep_overlap(bounds, idx)
        if pair is not None:
            return pair
    return None


def _sweep_overlap(bounds: list[_Bounds], idx: list[int]) -> tuple[int, int] | None:
    """A pair of overlapping boxes, by a sweep along dim 0 with the boxes still open."""
    order = sorted(idx, key=lambda i: bounds[i][0][0])
    active: list[tuple[int, int]] = []  # (stop in dim 0, box), sorted by stop
    for i in order:
        starts, stops = bounds[i]
        # Boxes that stop at or before this start are done for good: later boxes start no
        # earlier.
        del active[: bisect_right(active, (starts[0], sys.maxsize))]
        for _, j in active:
            o_starts, o_stops = bounds[j]
            if all(
                starts[k] < o_stops[k] and o_starts[k] < stops[k] for k in range(1, len(starts))
            ):
                return (j, i) if j < i else (i, j)
        insort(active, (stops[0], i))
    return None


def _gap_by_sections(
    bounds: list[_Bounds], idx: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
) -> tuple[int, ...]:
    """A point of the region no box holds, given that the boxes are pairwise disjoint.

    The cross-section along dim 0 only changes at box starts and stops, so checking the
    (disjoint) cross-section at each such position finds the gap.
    """
    xs = {lo[0]}
    for i in idx:
        for x in (bounds[i][0][0], bounds[i][1][0]):
            if lo[0] <= x < hi[0]:
                xs.add(x)
    for x in sorted(xs):
        section = [i for i in idx if bounds[i][0][0] <= x < bounds[i][1][0]]
        if len(lo) == 1:
            if not section:
                return (x,)
            continue
        sub_bounds = [(bounds[i][0][1:], bounds[i][1][1:]) for i in section]
        if not sub_bounds:
            return (x, *lo[1:])
        problem = _solve(sub_bounds, list(range(len(section))), lo[1:], hi[1:])
        if isinstance(problem, _Gap):
            return (x, *problem.point)
    raise AssertionError("volume was short but no gap was found")  # pragma: no cover
