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
from typing import TYPE_CHECKING

from .box import Box
from .errors import LayoutError

if TYPE_CHECKING:
    from .layout import Layout

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


def validate_layout(layout: Layout) -> None:
    shape = layout.shape
    nd = len(shape)
    shards = layout.shards

    owners: dict[Box, list[int]] = {}  # distinct box -> indices of the shards holding it
    for i, s in enumerate(shards):
        box = s.box
        if box.ndim != nd:
            raise LayoutError(
                f"shard #{i} on rank {s.rank} has {box.ndim} dims but the layout shape "
                f"{shape} has {nd}: {box}",
                kind="ndim",
                shards=(i,),
            )
        for d in range(nd):
            if box.offsets[d] + box.sizes[d] > shape[d]:
                raise LayoutError(
                    f"shard #{i} on rank {s.rank} is out of bounds in dim {d}: {box} ends at "
                    f"{box.offsets[d] + box.sizes[d]} but the dim has size {shape[d]} "
                    f"(layout shape {shape})",
                    kind="bounds",
                    shards=(i,),
                )
        holders = owners.get(box)
        if holders is None:
            owners[box] = [i]
        else:
            for j in holders:
                if shards[j].rank == s.rank:
                    raise LayoutError(
                        f"shards #{j} and #{i} are the same box {box} twice on rank {s.rank}",
                        kind="duplicate",
                        shards=(j, i),
                    )
            holders.append(i)

    if math.prod(shape) == 0:
        return  # nothing to cover; every box is empty and in bounds

    distinct = [b for b in owners if not b.is_empty]
    problem = _find_problem(distinct, shape)
    if problem is None:
        return
    if isinstance(problem, _Gap):
        raise LayoutError(
            f"the shards do not cover the tensor: element {problem.point} of shape {shape} "
            f"is held by no shard ({len(shards)} shards)",
            kind="gap",
            point=problem.point,
        )
    a, b = distinct[problem.a], distinct[problem.b]
    common = a.intersect(b)
    raise LayoutError(
        f"shards overlap: {_describe(a, owners[a], shards)} and "
        f"{_describe(b, owners[b], shards)} share {common} (layout shape {shape}); "
        f"replicas must be identical boxes",
        kind="overlap",
        shards=(owners[a][0], owners[b][0]),
    )


def _describe(box: Box, holders: list[int], shards: tuple[object, ...]) -> str:
    ranks = [shards[i].rank for i in holders]  # type: ignore[attr-defined]
    idx = ", ".join(f"#{i}" for i in holders)
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    return f"shard {idx} {box} on {who}"


def _find_problem(boxes: list[Box], shape: tuple[int, ...]) -> _Problem | None:
    nd = len(shape)
    if nd == 0:
        return None if boxes else _Gap(())
    if not boxes:
        return _Gap((0,) * nd)
    if _is_exact_grid(boxes, shape):
        return None
    bounds = [(b.offsets, b.stops) for b in boxes]
    return _solve(bounds, list(range(len(boxes))), (0,) * nd, shape)


def _is_exact_grid(boxes: list[Box], shape: tuple[int, ...]) -> bool:
    import numpy as np

    m = len(boxes)
    nd = len(shape)
    offs = np.fromiter(
        (o for b in boxes for o in b.offsets), dtype=np.int64, count=m * nd
    ).reshape(m, nd)
    ends = offs + np.fromiter(
        (s for b in boxes for s in b.sizes), dtype=np.int64, count=m * nd
    ).reshape(m, nd)
    cells = 1
    for d in range(nd):
        intervals = np.unique(np.stack([offs[:, d], ends[:, d]], axis=1), axis=0)
        starts, stops = intervals[:, 0], intervals[:, 1]
        if starts[0] != 0 or stops[-1] != shape[d] or np.any(starts[1:] != stops[:-1]):
            return False
        cells *= len(intervals)
        if cells > m:
            return False
    # Distinct boxes map injectively onto cells (each dim's intervals tile the dim), so as many
    # boxes as cells means every cell is taken exactly once.
    return cells == m


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
            stack.append((members, rlo[:d] + (start,) + rlo[d + 1 :], rhi[:d] + (stop,) + rhi[d + 1 :]))
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
