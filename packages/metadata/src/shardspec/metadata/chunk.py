"""The ``torch.chunk`` rule and the layouts it produces."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .box import Box, as_index, as_index_tuple, show_ints
from .errors import LayoutError, shorten
from .layout import Layout, Shard

__all__ = ["MAX_CHUNKS", "chunk_bounds", "chunk_layout", "chunk_size"]

# A chunk per rank: no process group comes near this, and a list of 2**64 bounds (what a
# malformed count asks for) would exhaust memory before anything could be reported.
MAX_CHUNKS = 1 << 24


def chunk_size(n: int, k: int) -> int:
    """``torch.chunk``'s split size: ceil(n / k)."""
    if type(n) is not int or type(k) is not int:  # the fast path is plain ints
        n, k = as_index(n, "chunked dim size"), as_index(k, "number of chunks")
    if n < 0:
        raise LayoutError(f"cannot chunk a dim of size {shorten(n)}: sizes are non-negative")
    if k <= 0:
        raise LayoutError(
            f"cannot chunk into {shorten(k)} pieces: the number of chunks must be positive"
        )
    return -(-n // k)


def chunk_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of the ``k`` chunks of a dim of size ``n``.

    Chunk ``i`` is ``[min(i*split, n), min((i+1)*split, n))`` with ``split = ceil(n / k)``:
    ``torch.chunk``'s pieces in order, then empty chunks at offset ``n`` for the ranks
    ``torch.chunk`` gives nothing (it returns fewer than ``k`` pieces when ``n`` is small).
    """
    split = chunk_size(n, k)
    n, k = int(n), int(k)  # checked by chunk_size
    if k > MAX_CHUNKS:
        raise LayoutError(
            f"cannot chunk into {shorten(k)} pieces: the list of bounds would not fit in memory "
            f"(at most {MAX_CHUNKS}, more than any process group has ranks)"
        )
    return [(min(i * split, n), min((i + 1) * split, n)) for i in range(k)]


def chunk_layout(shape: Sequence[int], dim: int, ranks: Sequence[int]) -> Layout:
    """The layout of ``torch.chunk(t, len(ranks), dim)`` with chunk ``i`` on ``ranks[i]``.

    Chunks past the data are empty boxes at offset ``shape[dim]``. A rank named several
    times holds several chunks, in the listed order, as with torch's ``ChunkShardingSpec``
    (CHUNK-3). A 0-d tensor cannot be chunked.
    """
    shp = as_index_tuple(shape, "shape")
    nd = len(shp)
    dim = as_index(dim, "chunk dim")
    if not -nd <= dim < nd or nd == 0:
        raise LayoutError(
            f"dim {shorten(dim)} is out of range for shape {show_ints(shp)} (ndim {nd})"
        )
    dim %= nd
    rks = as_index_tuple(ranks, "ranks")
    if not rks:
        raise LayoutError("chunk_layout needs at least one rank")
    if len(rks) <= CACHED_UP_TO:
        return _cached_chunk_layout(shp, dim, rks)
    return _chunk_layout(shp, dim, rks)


# A state dict asks for the same few (shape, dim, ranks) thousands of times; a Layout is
# immutable, so one object serves them all (bench_state_dict). Layouts of a few ranks only: a
# million-shard chunking is built once and would only pin its memory here.
CACHED_UP_TO = 4096


def _chunk_layout(shp: tuple[int, ...], dim: int, rks: tuple[int, ...]) -> Layout:
    nd = len(shp)
    shards = []
    held: set[tuple[int, int]] = set()
    for (start, stop), rank in zip(chunk_bounds(shp[dim], len(rks)), rks):
        if (start, rank) in held:
            # Only the empty chunks at offset n repeat: one rank would hold the same box twice,
            # which no valid layout does (LAYOUT-2).
            raise LayoutError(
                f"ranks {shorten(rks)} put two of the empty chunks past the data of dim {dim} "
                f"(size {shp[dim]}) on rank {rank}: the same box twice on one rank"
            )
        held.add((start, rank))
        offsets = (0,) * dim + (start,) + (0,) * (nd - dim - 1)
        sizes = shp[:dim] + (stop - start,) + shp[dim + 1 :]
        shards.append(Shard(Box._trusted(offsets, sizes), rank))
    return Layout(shp, shards)


_cached_chunk_layout = functools.lru_cache(maxsize=1024)(_chunk_layout)
