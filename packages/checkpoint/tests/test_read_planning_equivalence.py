"""Our planner against upstream DCP read planning (``create_read_items_for_chunk_list``):
loading a checkpoint saved in one layout into another must read, for every destination
chunk, exactly the overlaps with the saved chunks that our plan's pieces cover
(spec/06-reshard.md, RESHARD-2). The cost side of the comparison is
benchmarks/bench_read_planning.py (RESHARD-7)."""

from __future__ import annotations

import pytest
from checkpoint_read_triples import layouts_of, our_triples, upstream_triples
from hypothesis import given, settings, strategies as st

from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.metadata.strategies import (
    shapes,
)
from shardspec.reshard.planner import large_layout_paths


@st.composite
def layout_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    shape = draw(shapes(max_dims=3, max_side=7))
    return draw(layouts_of(shape)), draw(layouts_of(shape))


def brute_force_triples(src: Layout, dst: Layout) -> set[tuple[Box, tuple[int, int], Box]]:
    """Every non-empty intersection of a distinct saved box with a destination shard."""
    out = set()
    for r in dst.ranks:
        for i, d in enumerate(dst.boxes_of(r)):
            for s in {sh.box for sh in src.shards}:
                cut = s.intersect(d)
                if cut is not None and not cut.is_empty:
                    out.add((s, (r, i), cut))
    return out


@pytest.mark.rule("RESHARD-2")
@given(layout_pairs(), st.booleans())
def test_pieces_equal_upstream_read_items(pair: tuple[Layout, Layout], force: bool) -> None:
    src, dst = pair
    upstream = upstream_triples(src, dst)
    # Guards the comparison itself: a bug in how read items are turned into triples would
    # otherwise make both sides agree on nothing.
    assert upstream == brute_force_triples(src, dst)
    with large_layout_paths(force):
        assert our_triples(src, dst) == upstream
        for r in dst.ranks:
            mine = {t for t in upstream if t[1][0] == r}
            assert our_triples(src, dst, rank=r) == mine, f"rank {r}'s own plan differs"


@pytest.mark.rule("RESHARD-2")
def test_rows_read_as_columns_match_upstream_beyond_the_scan_threshold() -> None:
    # 20 x 20 shards: both layouts exceed the 16-shard scan, so the bisect grid answers.
    n = 20
    src = chunk_layout((4 * n, 4 * n), 0, range(n))
    dst = chunk_layout((4 * n, 4 * n), 1, list(reversed(range(n))))
    upstream = upstream_triples(src, dst)
    assert len(upstream) == n * n
    rows = [Box((4 * i, 0), (4, 4 * n)) for i in range(n)]
    # Hand-worked: rank r holds columns [4(n-1-r), 4(n-r)); row i meets it in a 4 x 4 block.
    expected = {
        (rows[i], (r, 0), Box((4 * i, 4 * (n - 1 - r)), (4, 4))) for i in range(n) for r in range(n)
    }
    assert upstream == expected
    assert our_triples(src, dst) == expected
    assert our_triples(src, dst, rank=3) == {t for t in expected if t[1][0] == 3}


def test_layout_pairs_sources_all_make_checkpoint_metadata() -> None:
    """Meta: the CKPT-3 test below takes every draw (an assume threw away the 38% whose
    source holds a box twice); 200 draws, each source's metadata made without a refusal and
    holding each distinct box once, boxes held twice among them."""
    from shardspec.checkpoint.chunks import storable
    from shardspec.metadata import to_tensor_storage_metadata

    twice = 0

    @settings(max_examples=200, database=None, deadline=None)
    @given(layout_pairs())
    def prop(pair: tuple[Layout, Layout]) -> None:
        nonlocal twice
        src = storable(pair[0])
        boxes = [s.box for s in src.shards]
        twice += len(set(boxes)) < len(boxes)
        chunks = to_tensor_storage_metadata(src).chunks
        assert sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks) == sorted(
            {(b.offsets, b.sizes) for b in boxes}
        )

    prop()
    assert twice, "no source holding a box twice in 200 draws"


@pytest.mark.rule("CKPT-3")
@given(layout_pairs(), st.sampled_from(["direct", "all pairs", "index"]))
def test_load_planner_read_items_equal_upstreams_on_every_path(
    pair: tuple[Layout, Layout], path: str
) -> None:
    # read_items_for_chunks tries every pair directly for few chunks, as arrays for more, and
    # through an index for many: every path must read what DCP's default planner reads,
    # zero-length reads aside.
    from checkpoint_read_triples import read_item_triples
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    from shardspec.checkpoint import dcp
    from shardspec.checkpoint.chunks import storable
    from shardspec.metadata import to_chunk_list, to_tensor_storage_metadata

    src, dst = pair
    # A box held twice (a replica, or one empty box on several ranks: 38% of the draws) is
    # one chunk, as a checkpoint saves it: to_tensor_storage_metadata keeps each box once.
    md = to_tensor_storage_metadata(storable(src))  # CKPT-1: no two chunks at one offset
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcp, "_DIRECT_PAIRS", 10**9 if path == "direct" else -1)
        mp.setattr(dcp, "_ALL_PAIRS", 10**9 if path == "all pairs" else -1)
        for r in dst.ranks:
            chunks = list(to_chunk_list(dst, r))
            want = read_item_triples(
                md, r, chunks, create_read_items_for_chunk_list("t", md, chunks)
            )
            items = dcp.read_items_for_chunks("t", md, chunks)
            assert all(0 not in it.lengths for it in items), f"an empty read, {path} path"
            got = read_item_triples(md, r, chunks, items)
            assert got == want, f"rank {r}, {path} path"
