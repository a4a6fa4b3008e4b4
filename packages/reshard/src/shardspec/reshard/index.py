"""A spatial index over the distinct non-empty boxes of a layout: which boxes meet a query box.

Two structures, chosen at build time:

* **Grid** (every chunking, every DTensor layout, every product grid): when the distinct
  boxes are exactly the cells of a product of per-dim partitions, a query maps its bounds to
  a range of cells per dim with ``bisect`` and reads the box ids from a cell array.
  Build O(n log n) (vectorised), query O(d log n + output).
* **Guillotine tree** (anything else): a region is split at every position of some dim that
  no box straddles (the dim giving the most pieces wins), recursively. A query descends only
  into the children whose interval meets it, found by ``bisect``. Build O(d n log n) per level
  of the tree; a query costs O(depth log n + output) on guillotine layouts (TorchRec tables,
  nested chunkings, random cuts). A region no dim can cut is a leaf scanned linearly; only
  non-guillotine arrangements (pinwheels) reach one.

* **Scan**: up to 16 boxes (a state dict's typical tensor), a query tests each box.

Boxes are assumed pairwise disjoint (a validated layout's distinct boxes); the index never
holds empty boxes, and a query with an empty box returns nothing.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

from shardspec.metadata import Box

__all__ = ["BoxIndex"]

# Up to this many boxes a linear scan beats building an index (most state-dict tensors have a
# handful of shards, and NumPy's per-call overhead would dominate their planning).
_SCAN = 16


class BoxIndex:
    """Find the boxes (by position in ``boxes``) that share an element with a query box."""

    __slots__ = ("_boxes", "_grid", "_ndim", "_tree")

    def __init__(
        self,
        boxes: Sequence[Box],
        shape: Sequence[int],
        *,
        offsets: Any = None,
        stops: Any = None,
    ) -> None:
        """Index ``boxes`` (distinct, non-empty, pairwise disjoint). ``offsets`` / ``stops``
        may give the same boxes as (m, ndim) int64 arrays, which saves a pass over them."""
        self._boxes = boxes
        self._ndim = len(shape)
        self._grid: tuple[list[list[int]], list[list[int]], Any] | None = None
        self._tree: _Node | None = None
        if self._ndim == 0 or len(boxes) <= _SCAN:
            return
        if offsets is None or stops is None:
            import numpy as np

            m = len(boxes)
            offsets = np.array([b.offsets for b in boxes], dtype=np.int64).reshape(m, self._ndim)
            stops = offsets + np.array([b.sizes for b in boxes], dtype=np.int64).reshape(
                m, self._ndim
            )
        self._grid = _build_grid(offsets, stops, tuple(shape))
        if self._grid is None:
            self._boxes = listed = list(boxes)
            self._tree = _build_tree(listed, list(range(len(listed))), self._ndim)

    @classmethod
    def of_arrays(cls, offsets: Any, sizes: Any, shape: Sequence[int]) -> BoxIndex:
        """The index of the boxes given as (m, ndim) int64 arrays (distinct, non-empty,
        pairwise disjoint): a grid reads only the arrays; a tree or a scan makes the Box
        objects it needs (thousands of saved chunks need not all become objects)."""
        return cls(_ArrayBoxes(offsets, sizes), shape, offsets=offsets, stops=offsets + sizes)

    @property
    def kind(self) -> str:
        """``"grid"``, ``"tree"`` or ``"scan"`` (0-d or a few boxes): for tests and docs."""
        if self._grid is not None:
            return "grid"
        return "tree" if self._tree is not None else "scan"

    def query_clipped(self, q: Box) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
        """``(position, offsets, sizes)`` of ``box ∩ q`` for every indexed box that shares an
        element with ``q``."""
        if q.is_empty or not self._boxes:
            return []
        if self._grid is not None and self._ndim:
            return _clipped_grid(*self._grid, q)
        out = []
        for i in self.query(q) if self._tree is not None else range(len(self._boxes)):
            common = self._boxes[i].intersect(q)
            if common is not None:
                out.append((i, common.offsets, common.sizes))
        return out

    def query_clipped_many(
        self, offsets: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]]
    ) -> tuple[Any, Any, Any, Any] | None:
        """:meth:`query_clipped` of every box ``offsets[i]`` + ``sizes[i]`` at once, as int64
        arrays: query (k,), position (k,), offsets (k, ndim), sizes (k, ndim), in query order,
        each query's pieces in :meth:`query_clipped`'s order; None when the index is no grid
        (ask per box). A grid answers in a few NumPy passes what thousands of queries cost in
        Python."""
        if self._grid is None or not self._ndim:
            return None
        import numpy as np

        starts, stops, cells = self._grid
        nd, m = self._ndim, len(offsets)
        lo = np.asarray(offsets, dtype=np.int64).reshape(m, nd)
        hi = lo + np.asarray(sizes, dtype=np.int64).reshape(m, nd)
        first = np.empty((m, nd), dtype=np.int64)
        count = np.empty((m, nd), dtype=np.int64)
        cut_starts, cut_stops = [], []
        for d in range(nd):
            st, sp = np.asarray(starts[d], np.int64), np.asarray(stops[d], np.int64)
            cut_starts.append(st)
            cut_stops.append(sp)
            # the cells that end after lo and start before hi, as _clipped_grid's bisects
            first[:, d] = np.searchsorted(sp, lo[:, d], side="right")
            count[:, d] = np.searchsorted(st, hi[:, d], side="left") - first[:, d]
        count[(hi <= lo).any(axis=1)] = 0  # an empty query meets nothing
        per = np.clip(count, 0, None).prod(axis=1)
        query = np.repeat(np.arange(m, dtype=np.int64), per)
        k = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        cell = np.empty((len(query), nd), dtype=np.int64)
        for d in reversed(range(nd)):  # C order, as itertools.product walks the cells
            c = count[query, d]
            cell[:, d] = first[query, d] + k % c
            k //= c
        out_lo = np.empty_like(cell)
        out_n = np.empty_like(cell)
        for d in range(nd):
            a = np.maximum(cut_starts[d][cell[:, d]], lo[query, d])
            out_lo[:, d] = a
            out_n[:, d] = np.minimum(cut_stops[d][cell[:, d]], hi[query, d]) - a
        ids = cells[tuple(cell[:, d] for d in range(nd))]
        return query, np.asarray(ids, dtype=np.int64).reshape(-1), out_lo, out_n

    def query(self, q: Box) -> list[int]:
        """Positions of the indexed boxes that share at least one element with ``q``."""
        if q.is_empty or not self._boxes:
            return []
        if self._ndim == 0:
            return list(range(len(self._boxes)))
        if self._grid is None and self._tree is None:
            return [i for i, b in enumerate(self._boxes) if b.overlaps(q)]
        if self._grid is not None:
            starts, stops, cells = self._grid
            index: list[slice] = []
            for d in range(self._ndim):
                lo, hi = q.offsets[d], q.offsets[d] + q.sizes[d]
                # The cells that end after lo and start before hi.
                index.append(slice(bisect_right(stops[d], lo), bisect_left(starts[d], hi)))
            out_ids: list[int] = cells[tuple(index)].ravel().tolist()
            return out_ids
        out: list[int] = []
        assert self._tree is not None
        qlo, qhi = q.offsets, q.stops
        stack = [self._tree]
        boxes = self._boxes
        while stack:
            node = stack.pop()
            if node.children is None:
                for i in node.members:
                    b = boxes[i]
                    if all(
                        bo < h and lo_ < bo + bs
                        for bo, bs, lo_, h in zip(b.offsets, b.sizes, qlo, qhi)
                    ):
                        out.append(i)
                continue
            d = node.dim
            lo, hi = qlo[d], qhi[d]
            first = max(bisect_right(node.starts, lo) - 1, 0)
            last = bisect_left(node.starts, hi)
            stack.extend(node.children[first:last])
        return out


def _clipped_grid(
    starts: list[list[int]], stops: list[list[int]], cells: Any, q: Box
) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    # The pieces of q cut by a grid are the product of its per-dim clipped intervals, in the
    # same C order as the cell array: no per-piece intersection test is needed.
    index: list[slice] = []
    los: list[list[int]] = []
    sizes: list[list[int]] = []
    for d, (lo, n) in enumerate(zip(q.offsets, q.sizes)):
        hi = lo + n
        a, b = bisect_right(stops[d], lo), bisect_left(starts[d], hi)
        index.append(slice(a, b))
        cut_lo = [max(x, lo) for x in starts[d][a:b]]
        los.append(cut_lo)
        sizes.append([min(y, hi) - x for x, y in zip(cut_lo, stops[d][a:b])])
    ids: list[int] = cells[tuple(index)].ravel().tolist()
    return list(zip(ids, itertools.product(*los), itertools.product(*sizes)))


_KEY_WIDTH_MAX = math.isqrt(2**63 - 1)  # width * width stays below int64's top


def _build_grid(
    offs: Any, ends: Any, shape: tuple[int, ...]
) -> tuple[list[list[int]], list[list[int]], Any] | None:
    """Per-dim cell starts and stops and the cell -> box id array, or None when the boxes
    are not exactly the cells of a product grid."""
    import numpy as np

    m, nd = offs.shape
    starts: list[list[int]] = []
    stops: list[list[int]] = []
    cell_idx = []
    cells = 1
    for d in range(nd):
        # Distinct (start, stop) pairs as one int64 key each: a 1-D unique is much faster than
        # np.unique(axis=0), but start * width + stop wraps int64 once the dim passes
        # sqrt(2**63) (3e9 rows: a large embedding table), so those dims take the pairs.
        width = int(shape[d]) + 1
        if width <= _KEY_WIDTH_MAX:
            keys = np.unique(offs[:, d] * width + ends[:, d])
            s, e = keys // width, keys % width
        else:
            pairs = np.unique(np.stack([offs[:, d], ends[:, d]], axis=1), axis=0)
            s, e = pairs[:, 0], pairs[:, 1]
            keys = s
        # The intervals must tile the covered span without overlap (a partition of one dim).
        if np.any(s[1:] != e[:-1]):
            return None
        cells *= len(keys)
        if cells > m:
            return None
        starts.append([int(x) for x in s])
        stops.append([int(x) for x in e])
        cell_idx.append(np.searchsorted(s, offs[:, d]))
    if cells != m:
        return None
    grid = np.full([len(s) for s in starts], -1, dtype=np.int64)
    grid[tuple(cell_idx)] = np.arange(m, dtype=np.int64)
    if np.any(grid < 0):  # two boxes in one cell: not disjoint, so not a grid
        return None
    return starts, stops, grid


class _Node:
    __slots__ = ("children", "dim", "members", "starts")

    def __init__(
        self,
        members: list[int],
        dim: int = -1,
        starts: list[int] | None = None,
        children: list[_Node] | None = None,
    ) -> None:
        self.members = members
        self.dim = dim
        self.starts = starts or []
        self.children = children


def _build_tree(boxes: list[Box], ids: list[int], nd: int) -> _Node:
    root = _Node(ids)
    stack = [root]
    while stack:
        node = stack.pop()
        if len(node.members) <= 1:
            continue
        best: list[tuple[int, list[int]]] = []
        best_dim = -1
        for d in range(nd):
            groups = _cuts(boxes, node.members, d)
            if len(groups) > max(len(best), 1):
                best, best_dim = groups, d
        if best_dim < 0:
            continue  # an uncuttable region: a leaf, scanned linearly
        node.dim = best_dim
        node.starts = [start for start, _ in best]
        node.children = [_Node(members) for _, members in best]
        stack.extend(node.children)
    return root


def _cuts(boxes: list[Box], ids: list[int], d: int) -> list[tuple[int, list[int]]]:
    """Group ``ids`` at every position of dim ``d`` that no box straddles: (start, members)."""
    order = sorted(ids, key=lambda i: boxes[i].offsets[d])
    groups: list[tuple[int, list[int]]] = []
    reach = -1
    group_start = 0
    members: list[int] = []
    for i in order:
        start = boxes[i].offsets[d]
        stop = start + boxes[i].sizes[d]
        if start >= reach and members:
            groups.append((group_start, members))
            members = []
        if not members:
            group_start = start
        members.append(i)
        reach = max(reach, stop)
    if members:
        groups.append((group_start, members))
    return groups


class _ArrayBoxes(Sequence[Box]):
    """The boxes of (m, ndim) int64 arrays of offsets and sizes, each made when read."""

    __slots__ = ("_offsets", "_sizes")

    def __init__(self, offsets: Any, sizes: Any) -> None:
        self._offsets, self._sizes = offsets, sizes

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Box(tuple(self._offsets[i].tolist()), tuple(self._sizes[i].tolist()))
