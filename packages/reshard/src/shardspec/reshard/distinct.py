"""A layout's distinct boxes: its non-empty boxes once each (replicas are one box with several
holders), each shard's place in its rank's local order, and an index answering which shards
meet a box. Every planner over a layout (the reshard planner, a refit's jobs) stands on it;
it is derived once per layout object and kept while the layout lives."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from shardspec.metadata import Box, Layout

from . import index as _index
from .derived import derived
from .index import BoxIndex

__all__ = ["Distinct", "distinct", "large_layout_paths"]


_SMALL = 16  # layouts with at most this many shards are indexed without NumPy


@contextlib.contextmanager
def large_layout_paths(force: bool = True) -> Iterator[None]:
    """With ``force``, small layouts take the NumPy set-up and the grid / tree indexes that
    layouts of more than 16 shards take (they normally take the plain-Python scan): tests of
    the planner and of everything built on it run both paths on every generated case. Not
    thread-safe: it switches module settings for the duration."""
    global _SMALL
    saved = _SMALL, _index._SCAN
    if force:
        _SMALL, _index._SCAN = 0, 0
    try:
        yield
    finally:
        _SMALL, _index._SCAN = saved


class Distinct:
    """A layout's distinct non-empty boxes, their holders (ascending rank), and each shard's
    position in its rank's local order; built with NumPy in O(n log n)."""

    def __init__(self, layout: Layout) -> None:
        shards = layout.shards
        self.shape = layout.shape
        self.offsets: Any = None
        self.stops: Any = None
        self._index: BoxIndex | None = None
        if len(shards) <= _SMALL:
            self._small(layout)
            return
        import numpy as np

        n, nd = len(shards), layout.ndim
        offs = np.array([s.box.offsets for s in shards], dtype=np.int64).reshape(n, nd)
        sizes = np.array([s.box.sizes for s in shards], dtype=np.int64).reshape(n, nd)
        ranks = np.fromiter((s.rank for s in shards), dtype=np.int64, count=n)
        by_rank = np.argsort(ranks, kind="stable")
        sorted_ranks = ranks[by_rank]
        local = np.empty(n, dtype=np.int64)
        local[by_rank] = np.arange(n) - np.searchsorted(sorted_ranks, sorted_ranks, "left")
        self.local: list[int] = local.tolist()
        self.ranks: list[int] = ranks.tolist()
        keep = np.flatnonzero((sizes > 0).all(axis=1)) if nd else np.arange(n)
        # Sort the non-empty shards by (box, rank): replicas become runs, holders by rank.
        cols = [ranks[keep]] + [sizes[keep, d] for d in reversed(range(nd))]
        cols += [offs[keep, d] for d in reversed(range(nd))]
        order = keep[np.lexsort(cols)] if len(keep) else keep
        if len(order):
            o, z = offs[order], sizes[order]
            new = np.ones(len(order), dtype=bool)
            new[1:] = ((o[1:] != o[:-1]) | (z[1:] != z[:-1])).any(axis=1) if nd else False
            starts = np.flatnonzero(new)
        else:
            starts = np.zeros(0, dtype=np.int64)
        self.order: list[int] = order.tolist()
        bounds = np.append(starts, len(order))
        self.bounds: list[int] = bounds.tolist()
        rep = order[starts]
        self.offsets = offs[rep]
        self.stops = offs[rep] + sizes[rep]
        self.boxes = [shards[i].box for i in rep.tolist()]
        if len(order):
            group = np.cumsum(new) - 1
            self._group = np.empty(n, dtype=np.int64)
            self._group[order] = group
            self._kept = np.zeros(n, dtype=bool)
            self._kept[order] = True

    def _small(self, layout: Layout) -> None:
        # The same structures in plain Python: NumPy's per-call overhead dominates here.
        seen: dict[int, int] = {}
        self.local = []
        self.ranks = []
        runs: dict[Box, list[tuple[int, int]]] = {}
        for i, s in enumerate(layout.shards):
            k = seen.get(s.rank, 0)
            self.local.append(k)
            seen[s.rank] = k + 1
            self.ranks.append(s.rank)
            if not s.box.is_empty:
                runs.setdefault(s.box, []).append((s.rank, i))
        self.boxes = sorted(runs)
        self.order = []
        self.bounds = [0]
        self._mine: dict[int, list[int]] = {}
        for k, box in enumerate(self.boxes):
            for r, i in sorted(runs[box]):
                self.order.append(i)
                self._mine.setdefault(r, []).append(k)
            self.bounds.append(len(self.order))

    def holders(self, k: int) -> list[int]:
        """Shard indices holding distinct box ``k``, by ascending rank."""
        return self.order[self.bounds[k] : self.bounds[k + 1]]

    def of_rank(self, rank: int) -> list[int]:
        """Distinct boxes ``rank`` holds (non-empty ones)."""
        import numpy as np

        if not self.order:
            return []
        if self.offsets is None:
            return self._mine.get(rank, [])
        mine = np.flatnonzero((np.asarray(self.ranks) == rank) & self._kept)
        return sorted(set(self._group[mine].tolist()))

    def index(self) -> BoxIndex:
        """The distinct boxes, indexed (built on first use)."""
        if self._index is None:
            self._index = BoxIndex(self.boxes, self.shape, offsets=self.offsets, stops=self.stops)
        return self._index

    def meeting(self, box: Box) -> list[tuple[int, Box]]:
        """``(position, common box)`` of every shard sharing an element with ``box``, in shard
        order; the holders of one distinct box share one common-box object."""
        found: list[tuple[int, Box]] = []
        for k, offsets, sizes in self.index().query_clipped(box):
            cut = Box._trusted(offsets, sizes)
            found.extend((i, cut) for i in self.holders(k))
        found.sort(key=itemgetter(0))
        return found


def distinct(layout: Layout) -> Distinct:
    """``Distinct(layout)``, built once per layout object (see :mod:`.derived`)."""
    return derived(layout, "distinct boxes", Distinct)
