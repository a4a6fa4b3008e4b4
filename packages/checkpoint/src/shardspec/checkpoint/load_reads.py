"""Who reads which saved bytes in :func:`shardspec.checkpoint.load` (CKPT-24, CKPT-25).

Pure integer work on boxes, the same on every rank (each derives it from the same metadata and
the same destination layouts, so nothing is sent to agree on it but a digest):

* :func:`choose_reads` — the rule ``reads="auto"`` follows.
* :func:`assign_reads` — for ``reads="once"``: every non-empty saved chunk a destination needs,
  cut along dim 0 into row runs when it is larger than a fair share, given to one reader rank,
  preferring a rank that holds the run's first element in the destination and balancing the
  bytes each rank reads.

A row run of a saved chunk is one contiguous byte range of the chunk's storage (chunks are
stored row-major), so a reader reads each run in one long read.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardspec.metadata import Box, Layout
from shardspec.metadata.columns import INT_LIMIT
from shardspec.reshard.index import BoxIndex

__all__ = [
    "CHUNK_COST",
    "EXCHANGE_COST",
    "MIN_RUN_BYTES",
    "MOVE_COST",
    "STACK_PARTS",
    "STORAGE",
    "STRIDED_MIN_BYTES",
    "STRIDED_RUN_BYTES",
    "Run",
    "TensorReads",
    "assign_reads",
    "choose_reads",
    "contiguous_run",
    "read_costs",
    "row_runs",
]

# reads="auto" takes "once" when some read of "own" would take at least STRIDED_MIN_BYTES in
# contiguous runs shorter than STRIDED_RUN_BYTES: such reads cost a system call or a page
# fault per run, where "once" reads whole chunks and moves the bytes at memory speed.
STRIDED_RUN_BYTES = 64 * 1024
STRIDED_MIN_BYTES = 1024 * 1024
# The storage kinds reads="auto" tells apart (CKPT-25; shardspec.checkpoint.storage).
STORAGE = ("local", "shared")
# On local storage, what moving a byte to another rank costs against reading one: one
# all_to_all_single of 512 MiB took 0.244 s on 2 gloo ranks where the job read 1 GiB of
# page-cached files in 0.085 s (5.7x; spec/09-checkpoint.md, "Measured"). Measured on gloo
# over loopback only; NCCL's ratio is not measured here.
MOVE_COST = 6
# On local storage reads="auto" counts, for every saved chunk a rank reads whole (one of at most
# WHOLE_ITEM_BYTES: "own" reads such a chunk whole for any part of it, CKPT-14), this many
# bytes beside the chunk's own: what a chunk costs in Python (its entry found, its bytes
# located, its pieces copied: some 25 us, about the time of 256 KiB of page-cached reading).
# 2,000 tensors of 4 chunks loaded as columns on 4 ranks: "own" 8,000 chunks a rank, 0.40 s;
# "once" 2,000, 0.33 s (spec/09-checkpoint.md, "Measured").
CHUNK_COST = 256 * 1024
# And "once" counts this many for its exchange's fixed costs (its agreements and collectives:
# one small tensor loaded on 4 gloo ranks took 2-8 ms more with "once", spec "Measured"), so
# that a few small tensors stay with "own".
EXCHANGE_COST = 16 * 1024 * 1024
# A stacked chunk is cut into runs of at most a fair share over this.
STACK_PARTS = 8
# A saved chunk is cut into row runs only down to this size: shorter reads cost more in calls
# than a slightly uneven share of the reading.
MIN_RUN_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class TensorReads:
    """One tensor of a load: its saved chunks (global boxes, in the metadata's order, or their
    checked layout, chunk i on "rank" i), its element size, and where the job wants it
    (``dst``, ranks of the load's group)."""

    key: str
    itemsize: int
    chunks: tuple[Box, ...] | Layout
    dst: Layout
    # a stack of tensors of one geometry (load_stacks): dim 0 counts its members
    stacked: bool = False

    @functools.cached_property
    def boxes(self) -> tuple[Box, ...]:
        """The saved chunks as boxes: made from a layout only when asked (``reads="auto"``
        decides most loads of W chunks from arrays, without W objects)."""
        c = self.chunks
        return tuple(s.box for s in c.shards) if isinstance(c, Layout) else c


@dataclass(frozen=True)
class Run:
    """Rows of one saved chunk read by one rank: ``box`` (global) lies in saved chunk number
    ``chunk`` of tensor ``key`` and spans all of the chunk's dims but the first."""

    key: str
    chunk: int
    box: Box
    reader: int
    nbytes: int


def contiguous_run(chunk: Box, part: Box) -> int:
    """Elements of the longest contiguous stretches ``part`` (inside ``chunk``) occupies in
    the chunk's row-major storage."""
    run = 1
    for d in range(chunk.ndim - 1, -1, -1):
        run *= part.sizes[d]
        if part.sizes[d] != chunk.sizes[d]:
            break
    return run


def row_runs(chunk: Box, itemsize: int, most: int, least: int | None = None) -> list[Box]:
    """``chunk`` cut along dim 0 into the fewest near-equal row runs of at most ``most``
    bytes each (never below one row, nor below ``least`` bytes per run, by default
    :data:`MIN_RUN_BYTES`)."""
    nbytes = chunk.numel * itemsize
    most = max(most, MIN_RUN_BYTES if least is None else least, 1)
    if chunk.ndim == 0 or nbytes <= most:
        return [chunk]
    rows = chunk.sizes[0]
    parts = min(rows, math.ceil(nbytes / most))
    if parts <= 1:
        return [chunk]
    out = []
    base, extra = divmod(rows, parts)
    start = chunk.offsets[0]
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(Box((start, *chunk.offsets[1:]), (n, *chunk.sizes[1:])))
        start += n
    return out


# From this many boxes (saved or destination) choose_reads works on the layouts' arrays: box
# by box it cost O(W) Python objects per tensor on every rank of a W-rank job. Up to
# _ALL_PAIRS (saved chunk, destination box) pairs it meets them all in one NumPy pass (a few
# MiB of temporaries), past that through a grid index of the destination's boxes.
_ARRAYS_FROM = 64
_ALL_PAIRS = 1 << 16


@functools.lru_cache(maxsize=4096)
def _holders(dst: Layout) -> tuple[tuple[Box, ...], tuple[tuple[int, ...], ...], BoxIndex]:
    """The distinct non-empty boxes of ``dst``, the ranks holding each, and their index."""
    ranks: dict[Box, list[int]] = {}
    for s in dst.shards:
        if not s.box.is_empty:
            ranks.setdefault(s.box, []).append(s.rank)
    boxes = tuple(ranks)
    return boxes, tuple(tuple(sorted(set(r))) for r in ranks.values()), BoxIndex(boxes, dst.shape)


# _replicated_arrays of each large destination layout, by identity: the tensors of one shape,
# mesh and placements share one layout object (shardspec.metadata.dtensor caches it). An entry
# holds its layout, so no other object can take its id while it lives: the cache is bounded.
_REPLICATED: dict[int, tuple[Layout, bool]] = {}
_REPLICATED_MAX = 64


def _replicated(dst: Layout) -> bool:
    if len(dst) >= _ARRAYS_FROM and dst.ndim:
        hit = _REPLICATED.get(id(dst))
        if hit is not None and hit[0] is dst:
            return hit[1]
        found = _replicated_arrays(dst)
        if len(_REPLICATED) >= _REPLICATED_MAX:
            _REPLICATED.clear()
        _REPLICATED[id(dst)] = (dst, found)
        return found
    _, holders, _ = _holders(dst)
    return any(len(h) > 1 for h in holders)


def _replicated_arrays(dst: Layout) -> bool:
    """:func:`_replicated` from the layout's arrays: some non-empty box on two ranks."""
    import numpy as np

    offs, sizes = dst.box_arrays()
    keep = (sizes > 0).all(axis=1)
    rows = _sorted_rows(
        np.concatenate([offs[keep], sizes[keep], dst.rank_array()[keep][:, None]], axis=1)
    )
    # equal boxes are neighbours, in rank order: two ranks of one box meet somewhere
    same_box = (rows[1:, :-1] == rows[:-1, :-1]).all(axis=1)
    return bool((same_box & (rows[1:, -1] != rows[:-1, -1])).any())


def _sorted_rows(rows: Any) -> Any:
    """The rows of a 2-d int64 array in lexicographic order (one lexsort: ``np.unique`` by rows
    sorts a structured view, ten times slower)."""
    import numpy as np

    return rows[np.lexsort(rows.T[::-1])] if rows.shape[1] else rows


def _strided_of(t: TensorReads) -> bool:
    if (
        isinstance(t.chunks, Layout)
        and max(len(t.chunks), len(t.dst)) >= _ARRAYS_FROM
        and t.dst.ndim
        and t.dst.numel <= INT_LIMIT
    ):
        found = _strided_arrays(t.chunks, t.dst, t.itemsize)
        if found is not None:
            return found
    return _strided(t.boxes, t.dst, t.itemsize)


def _strided_arrays(saved: Layout, dst: Layout, itemsize: int) -> bool | None:
    """:func:`_strided` from the layouts' arrays; None when there are too many pairs to meet
    at once and the destination's distinct boxes are no grid (the box path answers)."""
    import numpy as np

    nd = dst.ndim
    offs, sizes = dst.box_arrays()
    keep = (sizes > 0).all(axis=1)
    boxes = _sorted_rows(np.concatenate([offs[keep], sizes[keep]], axis=1))
    if len(boxes) > 1:  # each box once
        boxes = boxes[np.concatenate([[True], (boxes[1:] != boxes[:-1]).any(axis=1)])]
    b_off, b_stop = boxes[:, :nd], boxes[:, :nd] + boxes[:, nd:]
    c_off, c_sizes = saved.box_arrays()
    c_keep = (c_sizes > 0).all(axis=1)
    c_off, c_sizes = c_off[c_keep], c_sizes[c_keep]
    if len(boxes) * len(c_off) <= _ALL_PAIRS:
        lo = np.maximum(c_off[:, None, :], b_off[None, :, :])
        hi = np.minimum((c_off + c_sizes)[:, None, :], b_stop[None, :, :])
        q, b = np.nonzero((hi > lo).all(axis=2))
        lengths = hi[q, b] - lo[q, b]
    else:
        index = BoxIndex.of_arrays(b_off, boxes[:, nd:], dst.shape)
        many = index.query_clipped_many(c_off, c_sizes) if index.kind == "grid" else None
        if many is None:
            return None
        q, _, _, lengths = many
    whole = lengths == c_sizes[q]
    # contiguous_run: the part's sizes from the last dim up to and including the first dim
    # where the part is narrower than its chunk
    run = np.ones(len(q), dtype=np.int64)
    going = np.ones(len(q), dtype=bool)
    for d in reversed(range(nd)):
        run = np.where(going, run * lengths[:, d], run)
        going &= whole[:, d]
    big = lengths.prod(axis=1) >= -(-STRIDED_MIN_BYTES // itemsize)
    short = run < -(-STRIDED_RUN_BYTES // itemsize)
    return bool((big & short).any())


@functools.lru_cache(maxsize=4096)
def _strided(chunks: tuple[Box, ...], dst: Layout, itemsize: int) -> bool:
    _, _, index = _holders(dst)
    for c in chunks:
        for _, offsets, sizes in index.query_clipped(c):
            part = Box(offsets, sizes)
            if (
                part.numel * itemsize >= STRIDED_MIN_BYTES
                and contiguous_run(c, part) * itemsize < STRIDED_RUN_BYTES
            ):
                return True
    return False


def _rereads(tensors: Sequence[TensorReads], world: int) -> bool:
    """Whether ``"own"`` would read some saved bytes more than once across the job: a
    non-empty destination box held by more than one rank (read once per holder), a read
    of at least :data:`STRIDED_MIN_BYTES` in contiguous runs shorter than
    :data:`STRIDED_RUN_BYTES` of its saved chunk (read by its whole span, which the ranks
    holding the rest of that span read too), or a chunk it reads whole (:func:`_whole_reads`)
    that boxes of two ranks overlap."""
    for t in tensors:
        if t.dst.numel == 0:
            continue
        if _replicated(t.dst):
            return True
        if t.dst.numel * t.itemsize >= STRIDED_MIN_BYTES and _strided_of(t):
            return True
        whole = _whole_reads(t, world)
        if whole is not None and whole.shared:
            return True
    return False


@dataclass(frozen=True)
class _WholeReads:
    """What ``"own"`` reads of one tensor's small saved chunks (of at most
    ``WHOLE_ITEM_BYTES``, each read whole for any part of it), per rank of the job."""

    shared: bool  # some such chunk overlaps boxes of two ranks
    excess: tuple[int, ...]  # bytes read beyond the rank's boxes: the rest of those chunks
    touched: tuple[int, ...]  # such chunks the rank reads
    chunks: int  # the tensor's non-empty such chunks


# _whole_reads by geometry (saved chunks, destination, element size, world): a model's layers
# share theirs, and a load asks of every tensor.
_WHOLE_READS: dict[tuple[Any, ...], _WholeReads | None] = {}
_WHOLE_READS_MAX = 4096
_NOT_CACHED: Any = object()


def _whole_reads(t: TensorReads, world: int) -> _WholeReads | None:
    """What ``"own"`` reads whole of ``t``'s small saved chunks, or None for a tensor every
    rank of ``world`` holds whole (its reads are counted by its boxes: a chunk is all of the
    rank's for each rank)."""
    from .dcp_reader import WHOLE_ITEM_BYTES

    chunks = t.chunks.fingerprint() if isinstance(t.chunks, Layout) else t.chunks
    key = (chunks, t.dst.fingerprint(), t.itemsize, world)
    hit = _WHOLE_READS.get(key, _NOT_CACHED)
    if hit is not _NOT_CACHED:
        return hit  # type: ignore[no-any-return]
    boxes, holders, index = _holders(t.dst)
    found: _WholeReads | None = None
    whole = Box((0,) * t.dst.ndim, t.dst.shape)
    if not (len(t.dst) == world and boxes == (whole,) and holders[0] == tuple(range(world))):
        excess, touched = [0] * world, [0] * world
        shared, count = False, 0
        for c in t.boxes:
            size = c.numel * t.itemsize
            if c.is_empty or size > WHOLE_ITEM_BYTES:
                continue
            count += 1
            over: dict[int, int] = {}
            for pos, _, sizes in index.query_clipped(c):
                n = math.prod(sizes)
                for r in holders[pos]:
                    if r < world:
                        over[r] = over.get(r, 0) + n
            shared |= len(over) > 1
            for r, n in over.items():
                touched[r] += 1
                excess[r] += size - n * t.itemsize
        found = _WholeReads(shared, tuple(excess), tuple(touched), count)
    if len(_WHOLE_READS) >= _WHOLE_READS_MAX:
        _WHOLE_READS.clear()
    _WHOLE_READS[key] = found
    return found


def read_costs(tensors: Sequence[TensorReads], world: int) -> tuple[int, int]:
    """The cost of each mode on local storage, in bytes read by the slowest rank (a byte
    moved between ranks counts :data:`MOVE_COST` bytes read): ``(own, once)``.

    ``own``: the most any rank reads, its boxes' bytes, or for a part of a saved chunk in
    contiguous runs shorter than :data:`STRIDED_RUN_BYTES`, the span of the chunk's storage
    from the part's first element to its last (the reader reads the pages between).
    ``once``: the needed bytes (each distinct non-empty destination box's) over ``world``, plus
    the most any rank receives: the bytes of its boxes that another rank read, counted as
    ``(world - 1) / world`` of them (the runs are spread evenly over the ranks).
    Of a tensor not every rank holds whole, a saved chunk of at most ``WHOLE_ITEM_BYTES``
    (:func:`_whole_reads`) counts for ``own`` whole (all its bytes, for every rank whose boxes
    overlap it) and :data:`CHUNK_COST` more for each such rank; for ``once``
    :data:`CHUNK_COST` for each, over ``world`` (each is read by one rank). ``once`` counts
    :data:`EXCHANGE_COST` more, once."""
    w = max(world, 1)
    own = [0] * w
    got = [0] * w
    needed = 0
    chunks = 0
    for t in tensors:
        if t.dst.numel == 0:
            continue
        per = _bytes_per_rank(t.dst, t.itemsize, w)
        distinct = _distinct_bytes(t.dst, t.itemsize)
        needed += distinct
        extra = [0] * w
        if t.dst.numel * t.itemsize >= STRIDED_MIN_BYTES and len(t.dst) < _ARRAYS_FROM:
            extra = _span_excess(t, w)
        whole = _whole_reads(t, w)
        if whole is not None:
            chunks += whole.chunks
            extra = [e + x + CHUNK_COST * n for e, x, n in zip(extra, whole.excess, whole.touched)]
        for r in range(w):
            own[r] += per[r] + extra[r]
            got[r] += per[r] * (w - 1) // w
    once = math.ceil(needed / w) + CHUNK_COST * math.ceil(chunks / w) + MOVE_COST * max(got)
    return max(own), once + EXCHANGE_COST


def _bytes_per_rank(dst: Layout, itemsize: int, world: int) -> list[int]:
    out = [0] * world
    if len(dst) >= _ARRAYS_FROM and dst.ndim:
        import numpy as np

        _, sizes = dst.box_arrays()
        sums = np.bincount(dst.rank_array(), weights=sizes.prod(axis=1), minlength=world)
        return [int(x) * itemsize for x in sums[:world]]
    for sh in dst.shards:
        if sh.rank < world:
            out[sh.rank] += sh.box.numel * itemsize
    return out


def _distinct_bytes(dst: Layout, itemsize: int) -> int:
    if len(dst) >= _ARRAYS_FROM and dst.ndim:
        import numpy as np

        offs, sizes = dst.box_arrays()
        rows = _sorted_rows(np.concatenate([offs, sizes], axis=1))
        if len(rows) > 1:
            rows = rows[np.concatenate([[True], (rows[1:] != rows[:-1]).any(axis=1)])]
        return int(rows[:, dst.ndim :].prod(axis=1).sum()) * itemsize
    return sum(b.numel for b in {s.box for s in dst.shards}) * itemsize


def _span_excess(t: TensorReads, world: int) -> list[int]:
    """Per rank, the bytes ``"own"`` reads beyond its boxes': the gaps inside the span of each
    part it reads in short runs (of a large tensor's few boxes; a layout of many boxes is
    counted by its boxes' bytes alone)."""
    out = [0] * world
    if len(t.boxes) >= _ARRAYS_FROM:
        return out
    for sh in t.dst.shards:
        if sh.box.is_empty or sh.rank >= world:
            continue
        for c in t.boxes:
            part = c.intersect(sh.box)
            if part is None or part.is_empty:
                continue
            if contiguous_run(c, part) * t.itemsize >= STRIDED_RUN_BYTES:
                continue
            first = sum((p - o) * st for p, o, st in zip(part.offsets, c.offsets, _strides(c)))
            last = first + sum((n - 1) * st for n, st in zip(part.sizes, _strides(c)))
            out[sh.rank] += (last - first + 1 - part.numel) * t.itemsize
    return out


def _strides(c: Box) -> list[int]:
    strides = [1] * c.ndim
    for d in range(c.ndim - 2, -1, -1):
        strides[d] = strides[d + 1] * c.sizes[d + 1]
    return strides


def choose_reads(
    tensors: Sequence[TensorReads], storage: str = "shared", world: int | None = None
) -> str:
    """What ``reads="auto"`` does (CKPT-25). Nothing to choose unless ``"own"`` would read some
    saved bytes more than once across the job (:func:`_rereads`: replicas, long strided
    reads, small chunks it reads whole for two ranks' parts): else ``"own"``, which reads
    each needed byte once and moves none. When it would:

    * ``storage="shared"`` (a network or parallel file system, whose bandwidth the whole job
      shares): ``"once"``, which reads each needed byte once;
    * ``storage="local"`` (each node reads its own disk or page cache): the cheaper of the two
      by :func:`read_costs` on ``world`` ranks (default: the destinations' ranks), ``"own"``
      on a tie: moving a byte costs more than reading one there (:data:`MOVE_COST`).
    """
    if storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {storage!r}")
    if world is None:
        world = 1 + max((max(t.dst.ranks, default=0) for t in tensors), default=0)
    if not _rereads(tensors, world):
        return "own"
    if storage == "shared":
        return "once"
    own, once = read_costs(tensors, world)
    return "once" if once < own else "own"


def assign_reads(tensors: Sequence[TensorReads], world: int) -> list[Run]:
    """Every non-empty saved chunk of ``tensors``, as row runs, each with its reader (CKPT-24).

    Runs: a chunk larger than a fair share (its tensors' saved bytes / ``world``) is cut into
    :func:`row_runs`; a stacked chunk (``stacked``) into runs across its members of at most
    1/:data:`STACK_PARTS` of a share (a member's chunk at least). Readers, largest run first:
    the least-loaded rank that holds the run's first element in the destination, unless that
    would take it past the fair share (or the run itself, if larger); then the least-loaded
    rank of all. Ties go to the lowest rank.
    """
    total = sum(c.numel * t.itemsize for t in tensors for c in t.boxes)
    share = max(1, math.ceil(total / max(world, 1)))
    pending: list[tuple[int, int, int, Box, tuple[int, ...]]] = []
    for k, t in enumerate(tensors):
        _, holders, index = _holders(t.dst)
        for ci, c in enumerate(t.boxes):
            if c.is_empty:
                continue
            # a stacked chunk is the same chunk of many tensors: cut across them into runs of
            # at most an eighth of a share, so that the reads balance within that
            cut = (
                row_runs(c, t.itemsize, -(-share // STACK_PARTS), 0)
                if t.stacked
                else row_runs(c, t.itemsize, share)
            )
            for box in cut:
                first = Box(box.offsets, (1,) * box.ndim)
                hit = index.query(first)
                home = holders[hit[0]] if hit else ()
                pending.append((k, ci, box.numel * t.itemsize, box, home))
    # Largest first (LPT); ties in the tensors' and chunks' order, which every rank shares.
    order = sorted(range(len(pending)), key=lambda i: (-pending[i][2], i))
    load = [0] * world
    heap = [(0, r) for r in range(world)]
    runs: list[Run | None] = [None] * len(pending)
    for i in order:
        k, ci, nbytes, box, home = pending[i]
        cap = max(share, nbytes)
        reader = -1
        for r in home:
            if r < world and load[r] + nbytes <= cap and (reader < 0 or load[r] < load[reader]):
                reader = r
        if reader < 0:
            while True:  # entries go stale as loads grow; the first current one is least
                w, r = heapq.heappop(heap)
                if w == load[r]:
                    reader = r
                    break
        load[reader] += nbytes
        heapq.heappush(heap, (load[reader], reader))
        runs[i] = Run(tensors[k].key, ci, box, reader, nbytes)
    return [r for r in runs if r is not None]
