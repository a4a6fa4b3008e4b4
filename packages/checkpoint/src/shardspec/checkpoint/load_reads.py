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

from shardspec.metadata import Box, Layout
from shardspec.reshard.index import BoxIndex

__all__ = [
    "MIN_RUN_BYTES",
    "STRIDED_MIN_BYTES",
    "STRIDED_RUN_BYTES",
    "Run",
    "TensorReads",
    "assign_reads",
    "choose_reads",
    "contiguous_run",
    "row_runs",
]

# reads="auto" takes "once" when some read of "own" would take at least STRIDED_MIN_BYTES in
# contiguous runs shorter than STRIDED_RUN_BYTES: such reads cost a system call or a page
# fault per run, where "once" reads whole chunks and moves the bytes at memory speed.
STRIDED_RUN_BYTES = 64 * 1024
STRIDED_MIN_BYTES = 1024 * 1024
# A saved chunk is cut into row runs only down to this size: shorter reads cost more in calls
# than a slightly uneven share of the reading.
MIN_RUN_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class TensorReads:
    """One tensor of a load: its saved chunks (global boxes, in the metadata's order), its
    element size, and where the job wants it (``dst``, ranks of the load's group)."""

    key: str
    itemsize: int
    chunks: tuple[Box, ...]
    dst: Layout


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


def row_runs(chunk: Box, itemsize: int, most: int) -> list[Box]:
    """``chunk`` cut along dim 0 into the fewest near-equal row runs of at most ``most``
    bytes each (never below one row, nor below :data:`MIN_RUN_BYTES` per run)."""
    nbytes = chunk.numel * itemsize
    if chunk.ndim == 0 or nbytes <= max(most, MIN_RUN_BYTES):
        return [chunk]
    rows = chunk.sizes[0]
    parts = min(rows, math.ceil(nbytes / max(most, MIN_RUN_BYTES)))
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


@functools.lru_cache(maxsize=4096)
def _holders(dst: Layout) -> tuple[tuple[Box, ...], tuple[tuple[int, ...], ...], BoxIndex]:
    """The distinct non-empty boxes of ``dst``, the ranks holding each, and their index."""
    ranks: dict[Box, list[int]] = {}
    for s in dst.shards:
        if not s.box.is_empty:
            ranks.setdefault(s.box, []).append(s.rank)
    boxes = tuple(ranks)
    return boxes, tuple(tuple(sorted(set(r))) for r in ranks.values()), BoxIndex(boxes, dst.shape)


def _replicated(dst: Layout) -> bool:
    _, holders, _ = _holders(dst)
    return any(len(h) > 1 for h in holders)


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


def choose_reads(tensors: Sequence[TensorReads]) -> str:
    """What ``reads="auto"`` does (CKPT-25): ``"once"`` when some non-empty destination box is
    held by more than one rank (``"own"`` would read its bytes once per holder), or when some
    read of ``"own"`` would take at least :data:`STRIDED_MIN_BYTES` in contiguous runs shorter
    than :data:`STRIDED_RUN_BYTES` of its saved chunk; else ``"own"``."""
    for t in tensors:
        if t.dst.numel == 0:
            continue
        if _replicated(t.dst):
            return "once"
        if t.dst.numel * t.itemsize >= STRIDED_MIN_BYTES and _strided(t.chunks, t.dst, t.itemsize):
            return "once"
    return "own"


def assign_reads(tensors: Sequence[TensorReads], world: int) -> list[Run]:
    """Every non-empty saved chunk of ``tensors``, as row runs, each with its reader (CKPT-24).

    Runs: a chunk larger than a fair share (its tensors' saved bytes / ``world``) is cut into
    :func:`row_runs`. Readers, largest run first: the least-loaded rank that holds the run's
    first element in the destination, unless that would take it past the fair share (or the
    run itself, if larger); then the least-loaded rank of all. Ties go to the lowest rank.
    """
    total = sum(c.numel * t.itemsize for t in tensors for c in t.chunks)
    share = max(1, math.ceil(total / max(world, 1)))
    pending: list[tuple[int, int, int, Box, tuple[int, ...]]] = []
    for k, t in enumerate(tensors):
        _, holders, index = _holders(t.dst)
        for ci, c in enumerate(t.chunks):
            if c.is_empty:
                continue
            for box in row_runs(c, t.itemsize, share):
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
