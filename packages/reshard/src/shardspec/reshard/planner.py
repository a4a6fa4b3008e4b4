"""The resharding planner: which piece of which source shard fills each destination shard.

For every non-empty destination shard, the pieces are its intersections with the distinct
non-empty source boxes (source boxes are pairwise disjoint, so every element of the
destination comes from exactly one distinct source box). Who sends a piece:

1. the destination rank itself, whenever it owns that source box: the piece is a local copy;
2. otherwise the only owner, when the box is not replicated;
3. otherwise (a replicated box read by a rank that holds no replica) the piece is cut into
   ``min(r, extent)`` parts along its first dim with at least ``r`` elements (else its largest
   dim) for ``r`` owners, and part ``i`` is sent by owner ``(i + destination index) mod r``
   (owners in ascending rank order). The bytes are spread evenly over the owners, every
   element is still read once, and the rule needs no global state, so each rank can compute
   its own share without planning for the others.

Cost. Building the two box indexes (see :mod:`shardspec.reshard.index`) is
O((n + m) log(n + m)) for n source and m destination shards; with ``rank`` given, the
queries cost O(log(n + m) + k) per own box on grid and guillotine layouts, where k is the
number of pieces the rank sends or receives. No step visits every (source, destination) pair.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

from shardspec.metadata import Box, Layout, LayoutError, chunk_bounds
from shardspec.metadata.errors import shorten

from .derived import validated
from .distinct import distinct, large_layout_paths

__all__ = ["Piece", "Plan", "large_layout_paths", "plan"]


class Piece(NamedTuple):
    """One box of elements moving from a source shard to a destination shard.

    ``offsets`` / ``sizes`` are the box in global coordinates (``box`` builds the Box).
    ``src_shard`` / ``dst_shard`` index ``src.shards`` and ``dst.shards``; ``src_local`` /
    ``dst_local`` are the positions of those shards in their rank's local storage order (the
    index into the list of local tensors). A plain tuple, because plans hold 10^5 of them.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    src_rank: int
    src_shard: int
    src_local: int
    dst_rank: int
    dst_shard: int
    dst_local: int

    @property
    def box(self) -> Box:
        return Box._trusted(self.offsets, self.sizes)

    @property
    def is_local(self) -> bool:
        """The sender is the receiver: a copy on one rank, never sent."""
        return self.src_rank == self.dst_rank

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


class Plan:
    """The pieces of a reshard, in canonical order: by destination shard, then box offsets.

    With ``rank`` set, only the pieces that rank sends or receives (local copies included)
    are present. Every sender and receiver derives the same list for their pair, so the order
    is the wire order.
    """

    __slots__ = ("dst", "pieces", "rank", "src")

    def __init__(
        self, src: Layout, dst: Layout, rank: int | None, pieces: tuple[Piece, ...]
    ) -> None:
        self.src = src
        self.dst = dst
        self.rank = rank
        self.pieces = pieces

    def __iter__(self) -> Iterator[Piece]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def __repr__(self) -> str:
        who = "all ranks" if self.rank is None else f"rank {self.rank}"
        nloc = sum(p.is_local for p in self.pieces)
        return (
            f"Plan(shape={self.src.shape}, {who}: {len(self.pieces)} pieces, {nloc} local, "
            f"{self.moved_elements()} elements sent)"
        )

    def _check_rank(self, rank: int) -> None:
        if self.rank is not None and rank != self.rank:
            raise ValueError(f"this plan was made for rank {self.rank}; it has no view of {rank}")

    def local(self, rank: int) -> list[Piece]:
        """Pieces copied on ``rank`` without communication."""
        self._check_rank(rank)
        return [p for p in self.pieces if p.is_local and p.src_rank == rank]

    def sends(self, rank: int) -> list[Piece]:
        """Pieces ``rank`` sends to another rank, in wire order."""
        self._check_rank(rank)
        return [p for p in self.pieces if p.src_rank == rank and not p.is_local]

    def receives(self, rank: int) -> list[Piece]:
        """Pieces ``rank`` receives from another rank, in wire order."""
        self._check_rank(rank)
        return [p for p in self.pieces if p.dst_rank == rank and not p.is_local]

    def moved_elements(self) -> int:
        """Elements that cross between ranks (in this plan's view)."""
        return sum(p.numel for p in self.pieces if not p.is_local)


def plan(src: Layout, dst: Layout, rank: int | None = None, *, validate: bool = True) -> Plan:
    """Plan moving a tensor from layout ``src`` to layout ``dst``.

    The layouts may use different ranks and different numbers of ranks: a rank may only send,
    only receive, or take no part. Both are validated (``LayoutError`` names the offending
    shards) unless ``validate=False`` (for callers that already did). With ``rank``, only the
    pieces that rank sends or receives are planned, at a cost that does not grow with the
    other ranks' pieces.
    """
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        raise TypeError(
            f"plan() takes two Layouts, got {type(src).__name__} and {type(dst).__name__}"
        )
    if src.shape != dst.shape:
        raise LayoutError(
            f"cannot reshard between shapes: source layout has shape {src.shape}, "
            f"destination layout has shape {dst.shape}"
        )
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be a non-negative int or None, got {rank!r}")
    for what, layout in (("source", src), ("destination", dst)):
        _require_int64(layout, what)
    if validate:
        try:
            validated(src)
        except LayoutError as e:
            raise LayoutError(
                f"source layout: {e}", kind=e.kind, shards=e.shards, point=e.point
            ) from e
        try:
            validated(dst)
        except LayoutError as e:
            raise LayoutError(
                f"destination layout: {e}", kind=e.kind, shards=e.shards, point=e.point
            ) from e
    return _Planner(src, dst).run(rank)


_INT64_MAX = 2**63 - 1


def _require_int64(layout: Layout, what: str) -> None:
    """The planner indexes boxes with int64 arrays: a dim or rank beyond int64 would wrap.
    No tensor has such a dim, so it is refused rather than planned exactly (LAYOUT-6)."""
    big = [d for d in layout.shape if d > _INT64_MAX]
    if big:
        raise LayoutError(
            f"{what} layout: shape {shorten(layout.shape)} has a dim beyond int64 "
            f"({shorten(big[0])}); no tensor can be resharded at that size"
        )
    top = max(layout.ranks, default=0)
    if top > _INT64_MAX:
        raise LayoutError(f"{what} layout: rank {shorten(top)} is beyond int64")


class _Planner:
    def __init__(self, src: Layout, dst: Layout) -> None:
        self.src = src
        self.dst = dst
        self.s = distinct(src)
        self.d = distinct(dst)
        self.src_local = self.s.local
        self.dst_local = self.d.local
        self.src_index = self.s.index()

    def run(self, rank: int | None) -> Plan:
        pieces: list[Piece] = []
        dst_shards = self.dst.shards
        if rank is None:
            for j, s in enumerate(dst_shards):
                self._fill(j, s.box, s.rank, pieces)
        else:
            for j, s in enumerate(dst_shards):
                if s.rank == rank:
                    self._fill(j, s.box, s.rank, pieces)
            self._sends(rank, pieces)
        pieces.sort(key=lambda p: (p.dst_shard, p.offsets))
        return Plan(self.src, self.dst, rank, tuple(pieces))

    def _sends(self, rank: int, out: list[Piece]) -> None:
        mine = self.s.of_rank(rank)
        if not mine:
            return
        # Every distinct destination box is indexed (a whole layout is a grid more often than
        # the other ranks' part of it); this rank's own destinations were planned already.
        index = self.d.index()
        dst_ranks = self.d.ranks
        for k in mine:
            for t, offs, sizes in index.query_clipped(self.s.boxes[k]):
                for j in self.d.holders(t):
                    if dst_ranks[j] != rank:
                        self._emit(k, j, offs, sizes, dst_ranks[j], rank, out)

    def _fill(self, j: int, box: Box, dst_rank: int, out: list[Piece]) -> None:
        for k, offs, sizes in self.src_index.query_clipped(box):
            self._emit(k, j, offs, sizes, dst_rank, None, out)

    def _emit(
        self,
        k: int,
        j: int,
        offs: tuple[int, ...],
        sizes: tuple[int, ...],
        dst_rank: int,
        only_sender: int | None,
        out: list[Piece],
    ) -> None:
        """The pieces of destination shard ``j`` cut from distinct source box ``k``
        (``offs`` / ``sizes`` are their intersection); with ``only_sender``, only that rank's."""
        s = self.s
        lo, hi = s.bounds[k], s.bounds[k + 1]
        if hi - lo == 1:  # the common case: one holder, no choice to make
            i = s.order[lo]
            r = s.ranks[i]
            if only_sender is None or only_sender == r:
                out.append(
                    Piece(offs, sizes, r, i, self.src_local[i], dst_rank, j, self.dst_local[j])
                )
            return
        owners = [(s.ranks[i], i) for i in s.order[lo:hi]]
        dst_local = self.dst_local[j]
        for r, i in owners:
            if r == dst_rank:
                if only_sender is None or only_sender == r:
                    out.append(Piece(offs, sizes, r, i, self.src_local[i], dst_rank, j, dst_local))
                return
        for p_offs, p_sizes, (r, i) in _spread(offs, sizes, owners, j):
            if only_sender is None or only_sender == r:
                out.append(Piece(p_offs, p_sizes, r, i, self.src_local[i], dst_rank, j, dst_local))


def _spread(
    offsets: tuple[int, ...], sizes: tuple[int, ...], owners: list[tuple[int, int]], j: int
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, int]]]:
    """Cut a box into parts, one per owner (fewer if the box is too small), rotated by the
    destination shard index so that small pieces of many destinations spread too."""
    r = len(owners)
    if not sizes:
        return [(offsets, sizes, owners[j % r])]
    dim = next(
        (d for d, n in enumerate(sizes) if n >= r), max(range(len(sizes)), key=sizes.__getitem__)
    )
    parts = chunk_bounds(sizes[dim], min(r, sizes[dim]))
    out = []
    for p, (a, b) in enumerate(parts):
        if a == b:  # chunking n < r-ish sizes leaves empty chunks at the end
            continue
        offs = offsets[:dim] + (offsets[dim] + a,) + offsets[dim + 1 :]
        szs = sizes[:dim] + (b - a,) + sizes[dim + 1 :]
        out.append((offs, szs, owners[(p + j) % r]))
    return out
