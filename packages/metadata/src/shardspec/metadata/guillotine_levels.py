"""The guillotine recursion of :mod:`.guillotine`, vectorised a level at a time, for large
layouts.

All groups of one level are cut at once. Per dim, the boxes in play are sorted by (group,
start); a running maximum of the stops within each group (a segmented cummax) marks the
positions no box straddles, which are the cuts; and each group is split along the dim that
cuts it into the most pieces. Groups no dim can cut go to the Python code of
:mod:`.guillotine`: they hold the overlaps, or a non-guillotine arrangement, and are small
whenever the layout is nearly right, which is when this runs.

Boxes are columns: ``lo`` and ``hi`` (ndim x k, int64), ``hi`` exclusive; results name boxes
by column. Callers check :func:`fits` first: group numbers and coordinates share one int64
sort key.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .guillotine import Bounds, Gap, Overlap, Problem, gap_by_sections, sweep_overlap

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    _Ints = npt.NDArray[np.int64]

__all__ = [
    "find_gap_columns",
    "find_overlap_columns",
    "find_problem_columns",
    "fits",
    "one_dim_problem",
    "single_cut_dim",
]


def fits(k: int, shape: tuple[int, ...]) -> bool:
    """Whether k boxes in a tensor of ``shape`` can be keyed as group * bound + coordinate."""
    bound = max(shape, default=0) + 1
    return (k + 1) * bound < 2**62 and math.prod(shape) < 2**62


class _Sorted:
    """The boxes in play along one dim, sorted by (group, start)."""

    __slots__ = ("first", "group", "order", "run", "start")

    def __init__(self, lo: _Ints, hi: _Ints, group: _Ints, bound: int) -> None:
        import numpy as np

        base = group * bound
        self.order = np.argsort(base + lo, kind="stable")
        base = base[self.order]
        self.group = group[self.order]
        self.start = lo[self.order]
        # The furthest stop so far within the group: keys of a later group are all larger.
        self.run = np.maximum.accumulate(base + hi[self.order]) - base
        self.first = np.ones(len(self.order), dtype=bool)
        self.first[1:] = self.group[1:] != self.group[:-1]

    def cuts(self) -> npt.NDArray[np.bool_]:
        """Where a new piece starts: a group's first box, or a start no earlier box passes."""
        new: npt.NDArray[np.bool_] = self.first.copy()
        new[1:] |= self.start[1:] >= self.run[:-1]
        return new


def _spans(lo: _Ints, hi: _Ints, n: int) -> bool:
    """Whether every box spans the whole dim (of size n)."""
    return bool(lo.max() == 0 and hi.min() == n)


def find_problem_columns(lo: _Ints, hi: _Ints, shape: tuple[int, ...]) -> Problem | None:
    """What is wrong with distinct non-empty boxes in bounds: an overlapping pair of columns
    if any (the more specific fault), else a point none holds, else None: they tile."""
    import numpy as np

    d = single_cut_dim(lo, hi, shape)
    if d is not None:
        return one_dim_problem(lo, hi, shape, d)
    pair = find_overlap_columns(lo, hi, shape)
    if pair is not None:
        return Overlap(*pair)
    # Disjoint boxes in bounds cover the tensor exactly when their volumes add up to it.
    if int(np.prod(hi - lo, axis=0).sum()) == math.prod(shape):
        return None
    point = find_gap_columns(lo, hi, shape)
    assert point is not None, "the volume is short but no gap was found"
    return Gap(point)


def single_cut_dim(lo: _Ints, hi: _Ints, shape: tuple[int, ...]) -> int | None:
    """The dim that not every box spans, when there is exactly one (chunkings, row-wise
    tables): the boxes are then intervals of that dim."""
    cut = [d for d in range(lo.shape[0]) if not _spans(lo[d], hi[d], shape[d])]
    return cut[0] if len(cut) == 1 else None


def one_dim_problem(lo: _Ints, hi: _Ints, shape: tuple[int, ...], d: int) -> Problem | None:
    """For boxes that span every dim but ``d``: an overlapping pair of columns if any
    overlap, else an uncovered point, else None. One sort, as upstream's 1-D check."""
    import numpy as np

    order = np.argsort(lo[d], kind="stable")
    start, stop = lo[d, order], hi[d, order]
    run = np.maximum.accumulate(stop)
    clash = np.flatnonzero(start[1:] < run[:-1])
    if clash.size:
        k = int(clash[0]) + 1  # sorted position of a box starting inside an earlier one
        j = int(np.argmax(stop[:k] > start[k]))
        a, b = sorted((int(order[j]), int(order[k])))
        return Overlap(a, b)
    reach = np.concatenate(([0], run[:-1]))
    short = np.flatnonzero(start > reach)
    x = int(reach[short[0]]) if short.size else int(run[-1])
    if not short.size and x == shape[d]:
        return None
    point = [0] * len(shape)
    point[d] = x
    return Gap(tuple(point))


def _split(values: _Ints, keys: _Ints) -> list[tuple[int, _Ints]]:
    """``values`` grouped by ``keys``: (key, values with that key) per distinct key."""
    import numpy as np

    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], values[order]
    at = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return [
        (int(chunk_keys[0]), chunk)
        for chunk_keys, chunk in zip(np.split(keys, at), np.split(values, at))
    ]


def _bounds(lo: _Ints, hi: _Ints, members: _Ints) -> list[Bounds]:
    return [
        (tuple(a), tuple(b)) for a, b in zip(lo[:, members].T.tolist(), hi[:, members].T.tolist())
    ]


def find_overlap_columns(lo: _Ints, hi: _Ints, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """Two columns whose boxes share an element, or None when all are pairwise disjoint.

    A position no box straddles separates no overlapping pair, so cutting there (gaps
    included) keeps every overlap inside one group; groups no dim cuts are swept.
    """
    import numpy as np

    nd, k = lo.shape
    bound = max(shape, default=0) + 1
    pos = np.arange(k)
    group = np.zeros(k, dtype=np.int64)
    n_groups = 1
    while pos.size > 1:
        n = pos.size
        piece = np.empty((nd, n), dtype=np.int64)
        counts = np.empty((nd, n_groups), dtype=np.int64)
        for d in range(nd):
            if _spans(lo[d, pos], hi[d, pos], shape[d]):
                piece[d], counts[d] = group + d * n, 1
                continue
            s = _Sorted(lo[d, pos], hi[d, pos], group, bound)
            new = s.cuts()
            piece[d, s.order] = np.cumsum(new) - 1 + d * n  # numbered apart per dim
            counts[d] = np.bincount(s.group[new], minlength=n_groups)
        best = counts.argmax(axis=0)
        stuck = counts[best, np.arange(n_groups)] == 1
        col = np.arange(n)
        if stuck.any():
            at = stuck[group]
            for _, members in _split(pos[at], group[at]):
                pair = sweep_overlap(_bounds(lo, hi, members), list(range(len(members))))
                if pair is not None:
                    a, b = int(members[pair[0]]), int(members[pair[1]])
                    return (a, b) if a < b else (b, a)
            pos, group, col = pos[~at], group[~at], col[~at]
        chosen = piece[best[group], col]
        # A piece of one box overlaps nothing: it leaves. The others are the next groups.
        members = np.bincount(chosen, minlength=nd * n)
        several = members[chosen] > 1
        pos = pos[several]
        renumber = np.cumsum(members > 1) - 1
        group = renumber[chosen[several]]
        n_groups = int(renumber[-1]) + 1
    return None


def find_gap_columns(lo: _Ints, hi: _Ints, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A point of the tensor no box holds, or None when the boxes cover it. The boxes must
    be in bounds and pairwise disjoint (a group no dim cuts is judged by its volume)."""
    import numpy as np

    nd, k = lo.shape
    bound = max(shape, default=0) + 1
    pos = np.arange(k)
    group = np.zeros(k, dtype=np.int64)
    rlo = np.zeros((nd, 1), dtype=np.int64)
    rhi = np.asarray(shape, dtype=np.int64).reshape(nd, 1)
    while pos.size:
        n, n_groups = pos.size, rlo.shape[1]
        piece = np.empty((nd, n), dtype=np.int64)
        counts = np.empty((nd, n_groups), dtype=np.int64)
        piece_lo: list[_Ints] = []
        piece_hi: list[_Ints] = []
        for d in range(nd):
            if _spans(lo[d, pos], hi[d, pos], shape[d]):
                # Every box spans the dim, so every region does: no gap and no cut here.
                piece[d], counts[d] = group + d * n, 1
                piece_lo.append(np.zeros(n_groups, dtype=np.int64))
                piece_hi.append(np.full(n_groups, shape[d], dtype=np.int64))
                continue
            s = _Sorted(lo[d, pos], hi[d, pos], group, bound)
            reach = np.empty(n, dtype=np.int64)  # how far the group is covered before a box
            reach[1:] = s.run[:-1]
            reach[s.first] = rlo[d, s.group[s.first]]
            last = np.ones(n, dtype=bool)
            last[:-1] = s.first[1:]
            inside = np.flatnonzero(s.start > reach)
            at_end = np.flatnonzero(last & (s.run < rhi[d, s.group]))
            if inside.size or at_end.size:
                if inside.size and (not at_end.size or inside[0] < at_end[0]):
                    i, x = int(inside[0]), int(reach[inside[0]])
                else:
                    i, x = int(at_end[0]), int(s.run[at_end[0]])
                point = rlo[:, s.group[i]].copy()
                point[d] = x
                return tuple(int(v) for v in point)
            new = s.cuts()
            starts = np.flatnonzero(new)
            piece[d, s.order] = np.cumsum(new) - 1 + d * n  # numbered apart per dim
            counts[d] = np.bincount(s.group[new], minlength=n_groups)
            piece_lo.append(s.start[starts])
            piece_hi.append(s.run[np.append(starts[1:], n) - 1])
        best = counts.argmax(axis=0)
        uncut = counts[best, np.arange(n_groups)] == 1
        members_of = np.bincount(group, minlength=n_groups)
        # One box and no gap: the box is its region. Several and no cut: judge by volume.
        at = (uncut & (members_of > 1))[group]
        for g, members in _split(pos[at], group[at]) if at.any() else ():
            region_lo = tuple(int(v) for v in rlo[:, g])
            region_hi = tuple(int(v) for v in rhi[:, g])
            volume = int(np.prod(hi[:, members] - lo[:, members], axis=0).sum())
            if volume != math.prod(tuple(b - a for a, b in zip(region_lo, region_hi))):
                bounds = _bounds(lo, hi, members)
                return gap_by_sections(bounds, list(range(len(members))), region_lo, region_hi)
        go = ~uncut[group]
        pos, group, col = pos[go], group[go], np.flatnonzero(go)
        dim = best[group]
        chosen = piece[dim, col]
        # The pieces cut are the next groups, each in its old group's region narrowed to the
        # piece along the cut dim.
        present = np.zeros(nd * n, dtype=bool)
        present[chosen] = True
        ids = np.flatnonzero(present)
        old, cut = np.empty(nd * n, dtype=np.int64), np.empty(nd * n, dtype=np.int64)
        old[chosen], cut[chosen] = group, dim
        old, cut = old[ids], cut[ids]
        rlo, rhi = rlo[:, old], rhi[:, old]
        offset = np.cumsum([0] + [len(p) for p in piece_lo[:-1]])
        index = ids - cut * n + offset[cut]
        new_groups = np.arange(len(ids))
        rlo[cut, new_groups] = np.concatenate(piece_lo)[index]
        rhi[cut, new_groups] = np.concatenate(piece_hi)[index]
        group = (np.cumsum(present) - 1)[chosen]
    return None
