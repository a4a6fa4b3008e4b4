"""Upstream DCP read planning and shardspec's planner, reduced to the same facts.

Both answer "which part of which saved chunk fills which part of which destination chunk".
The common form is a set of triples ``(source box, (destination rank, local index), overlap
box in global coordinates)``. Shared by test_read_planning_equivalence.py and
benchmarks/bench_read_planning.py, so the benchmark asserts the equivalence it times.

DCP saves each distinct box once, so replicated sources become one chunk; a replicated source
piece that our planner cut into parts for several senders (RESHARD-4) is merged back before
comparing. Upstream's zero-volume read items are dropped: its overlap test calls an empty
chunk lying strictly inside another one an overlap and emits a read of length 0, which moves
nothing (the same misjudgement as in its overlap validation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import strategies as st

from shardspec.metadata import Box, Layout
from shardspec.metadata.dcp import to_chunk_list, to_tensor_storage_metadata
from shardspec.metadata.strategies import (
    chunk_layouts,
    grid_layouts,
    guillotine_layouts,
    permuted,
    with_replicas,
)
from shardspec.reshard import Piece, plan

Triple = tuple[Box, tuple[int, int], Box]


def read_item_triples(
    md: Any, rank: int, local_chunks: Sequence[Any], items: Sequence[Any]
) -> set[Triple]:
    """The triples of one rank's ``ReadItem`` list (``md``: the saved TensorStorageMetadata,
    ``local_chunks``: the chunks that list was planned for)."""
    out: set[Triple] = set()
    for it in items:
        saved = md.chunks[it.storage_index.index]
        dest = local_chunks[it.dest_index.index]
        assert tuple(it.storage_index.offset) == tuple(saved.offsets), it
        assert tuple(it.dest_index.offset) == tuple(dest.offsets), it
        lengths = tuple(it.lengths)
        at = tuple(o + d for o, d in zip(saved.offsets, it.storage_offsets))
        at_dest = tuple(o + d for o, d in zip(dest.offsets, it.dest_offsets))
        assert at == at_dest, f"read item {it} lands elsewhere in the destination than it reads"
        box = Box(at, lengths)
        if box.is_empty:
            continue
        key = (rank, it.dest_index.index)
        out.add((Box(tuple(saved.offsets), tuple(saved.sizes)), key, box))
    return out


def upstream_triples(src: Layout, dst: Layout, ranks: Iterable[int] | None = None) -> set[Triple]:
    """What DCP plans when every rank of ``dst`` (or those in ``ranks``) loads a checkpoint
    saved in ``src``: one ``create_read_items_for_chunk_list`` call per rank."""
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    md = to_tensor_storage_metadata(src)
    out: set[Triple] = set()
    for r in dst.ranks if ranks is None else ranks:
        chunks = to_chunk_list(dst, r)
        items = create_read_items_for_chunk_list("t", md, chunks)
        out |= read_item_triples(md, r, list(chunks), items)
    return out


def piece_triples(src: Layout, pieces: Iterable[Piece]) -> set[Triple]:
    """The triples of our pieces, the parts of one (source box, destination shard) merged."""
    parts: dict[tuple[Box, tuple[int, int]], list[Piece]] = {}
    for p in pieces:
        key = (src.shards[p.src_shard].box, (p.dst_rank, p.dst_local))
        parts.setdefault(key, []).append(p)
    out: set[Triple] = set()
    for (sbox, dkey), ps in parts.items():
        lo = tuple(min(p.offsets[d] for p in ps) for d in range(len(sbox.offsets)))
        hi = tuple(max(p.offsets[d] + p.sizes[d] for p in ps) for d in range(len(sbox.offsets)))
        whole = Box(lo, tuple(h - a for a, h in zip(lo, hi)))
        assert sum(p.numel for p in ps) == whole.numel, (
            f"the parts {ps} of source box {sbox} for destination {dkey} do not tile {whole}"
        )
        out.add((sbox, dkey, whole))
    return out


def our_triples(src: Layout, dst: Layout, rank: int | None = None) -> set[Triple]:
    """Our plan as triples; with ``rank``, that rank's own plan, keeping what it receives
    or copies (DCP plans reads only, so what the rank sends has no counterpart there)."""
    pieces = plan(src, dst, rank=rank).pieces
    if rank is not None:
        pieces = tuple(p for p in pieces if p.dst_rank == rank)
    return piece_triples(src, pieces)


@st.composite
def layouts_of(draw: st.DrawFn, shape: tuple[int, ...]) -> Layout:
    """The layouts both planners are compared on: chunkings, grids and guillotine cuts of
    ``shape`` (grids only for 0-d), with or without replicas, in any shard order."""
    fixed = st.just(shape)
    options = [grid_layouts(fixed, max_ranks=5)]
    if shape:
        options += [chunk_layouts(fixed, max_ranks=5), guillotine_layouts(fixed, max_ranks=5)]
    layout = draw(st.one_of(options))
    if draw(st.booleans()):
        layout = draw(with_replicas(layout))
    return draw(permuted(layout))
