"""The guillotine recursion that decides coverage and disjointness of boxes in a region.

In a region, sort the boxes by start in each dim; a position that no box straddles is a cut
and splits the region; a position no box covers is a gap (reported with that point). Layouts
built by cutting (TorchRec tables, nested chunks, random guillotine partitions) resolve in
O(n log n) per level. A region no dim can cut is checked by a sweep line for a pair of
overlapping boxes, then by volume; a missing volume is located by scanning cross-sections. This
is at worst the cost of upstream's sweep line, and is only reached by non-guillotine layouts or
overlaps.

Boxes are given as ``(starts, stops)`` tuples; results name boxes by their position in that
list.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_right, insort

__all__ = [
    "Bounds",
    "Gap",
    "Overlap",
    "Problem",
    "find_overlap",
    "gap_by_sections",
    "solve",
    "sweep_overlap",
]

Bounds = tuple[tuple[int, ...], tuple[int, ...]]  # (starts, stops)


class Overlap:
    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b


class Gap:
    __slots__ = ("point",)

    def __init__(self, point: tuple[int, ...]) -> None:
        self.point = point


Problem = Overlap | Gap


def solve(
    bounds: list[Bounds], root: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
) -> Problem | None:
    """None when the boxes ``root`` tile the region ``[lo, hi)`` exactly, else the first
    overlap or gap found."""
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
                return Gap(rlo[:d] + (gap,) + rlo[d + 1 :])
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


def _single(b: Bounds, lo: tuple[int, ...], hi: tuple[int, ...]) -> Problem | None:
    starts, stops = b
    for d in range(len(lo)):
        if starts[d] > lo[d]:
            return Gap(lo)
        if stops[d] < hi[d]:
            return Gap(lo[:d] + (stops[d],) + lo[d + 1 :])
    return None


def _cuts(
    bounds: list[Bounds], idx: list[int], d: int, lo: int, hi: int
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
    bounds: list[Bounds], idx: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
) -> Problem | None:
    pair = sweep_overlap(bounds, idx)
    if pair is not None:
        return Overlap(*pair)
    volume = sum(math.prod(b - a for a, b in zip(*bounds[i])) for i in idx)
    if volume == math.prod(b - a for a, b in zip(lo, hi)):
        return None
    return Gap(gap_by_sections(bounds, idx, lo, hi))


def find_overlap(bounds: list[Bounds]) -> tuple[int, int] | None:
    """A pair of overlapping boxes, whether or not the boxes cover the region.

    The same guillotine recursion as :func:`solve`, but a position no box covers is just
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
        pair = sweep_overlap(bounds, idx)
        if pair is not None:
            return pair
    return None


def sweep_overlap(bounds: list[Bounds], idx: list[int]) -> tuple[int, int] | None:
    """A pair of overlapping boxes, by a sweep with the boxes still open.

    The sweep runs along the dim with the most distinct starts: the open set is then small
    (along a dim every box starts at, such as two rows of offset bricks swept across their
    rows, every box stays open and the sweep is quadratic).
    """
    nd = len(bounds[idx[0]][0]) if idx else 0
    if nd == 0:
        return None
    d = max(range(nd), key=lambda k: len({bounds[i][0][k] for i in idx}))
    others = [k for k in range(nd) if k != d]
    order = sorted(idx, key=lambda i: bounds[i][0][d])
    active: list[tuple[int, int]] = []  # (stop along d, box), sorted by stop
    for i in order:
        starts, stops = bounds[i]
        # Boxes that stop at or before this start are done for good: later boxes start no
        # earlier.
        del active[: bisect_right(active, (starts[d], sys.maxsize))]
        for _, j in active:
            o_starts, o_stops = bounds[j]
            if all(starts[k] < o_stops[k] and o_starts[k] < stops[k] for k in others):
                return (j, i) if j < i else (i, j)
        insort(active, (stops[d], i))
    return None


def gap_by_sections(
    bounds: list[Bounds], idx: list[int], lo: tuple[int, ...], hi: tuple[int, ...]
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
        problem = solve(sub_bounds, list(range(len(section))), lo[1:], hi[1:])
        if isinstance(problem, Gap):
            return (x, *problem.point)
    raise AssertionError("volume was short but no gap was found")  # pragma: no cover
