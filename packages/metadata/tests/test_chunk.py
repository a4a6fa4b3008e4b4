"""The torch.chunk rule (spec/01-layout.md, CHUNK-*)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from shardspec.metadata import Box, LayoutError, chunk_bounds, chunk_layout
from shardspec.metadata.strategies import chunk_layouts, shapes


@pytest.mark.rule("CHUNK-1")
@given(st.integers(0, 40), st.integers(1, 12))
def test_chunk_bounds_match_torch_chunk(n: int, k: int) -> None:
    pieces = torch.arange(n).chunk(k)
    bounds = chunk_bounds(n, k)
    assert len(bounds) == k
    for i, (start, stop) in enumerate(bounds):
        got = list(range(start, stop))
        expected = pieces[i].tolist() if i < len(pieces) else []
        assert got == expected, f"chunk {i} of n={n}, k={k}: {got}, but should be {expected}"


@pytest.mark.rule("CHUNK-1")
@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        (5, 2, [(0, 3), (3, 5)]),  # fsdp's _get_box reports rank 1 at offset 2 here
        (7, 3, [(0, 3), (3, 6), (6, 7)]),
        (5, 4, [(0, 2), (2, 4), (4, 5), (5, 5)]),
        (0, 3, [(0, 0), (0, 0), (0, 0)]),
        (6, 4, [(0, 2), (2, 4), (4, 6), (6, 6)]),
    ],
)
def test_chunk_bounds_hand_worked(n: int, k: int, expected: list[tuple[int, int]]) -> None:
    assert chunk_bounds(n, k) == expected


@pytest.mark.rule("CHUNK-2")
@given(st.integers(0, 20), st.integers(1, 30))
def test_empty_chunks_sit_at_n(n: int, k: int) -> None:
    for start, stop in chunk_bounds(n, k):
        if start == stop:
            assert start == n


@pytest.mark.rule("CHUNK-2", "LAYOUT-1")
def test_empty_chunk_layout_hand_worked() -> None:
    layout = chunk_layout((5, 2), 0, [0, 1, 2, 3])
    assert layout.boxes_of(3) == (Box((5, 0), (0, 2)),)
    layout.validate()


@pytest.mark.rule("CHUNK-3")
@given(chunk_layouts(shapes(min_dims=1, max_side=9), max_ranks=12))
def test_chunk_layout_is_valid_one_box_per_rank(layout) -> None:  # type: ignore[no-untyped-def]
    layout.validate()
    assert sorted(s.rank for s in layout.shards) == sorted({s.rank for s in layout.shards})


@pytest.mark.rule("CHUNK-3")
@given(shapes(min_dims=1, max_side=9), st.data())
def test_chunk_layout_matches_torch_chunk_on_every_rank(shape, data) -> None:  # type: ignore[no-untyped-def]
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, 10))
    ranks = data.draw(st.permutations(range(k)))
    layout = chunk_layout(shape, dim, ranks)
    g = torch.arange(max(1, torch.Size(shape).numel())).reshape(-1)[: torch.Size(shape).numel()]
    g = g.reshape(shape)
    pieces = g.chunk(k, dim)
    for i, r in enumerate(ranks):
        (box,) = layout.boxes_of(r)
        got = g[box.slices()]
        if i < len(pieces):
            assert torch.equal(got, pieces[i]), f"rank {r} (chunk {i}) of {shape} dim {dim}"
        else:
            assert got.numel() == 0


@pytest.mark.rule("CHUNK-3")
def test_chunk_layout_refuses_bad_arguments() -> None:
    with pytest.raises(LayoutError, match="out of range"):
        chunk_layout((4,), 1, [0])
    with pytest.raises(LayoutError, match="out of range"):
        chunk_layout((), 0, [0])
    with pytest.raises(LayoutError, match="at least one rank"):
        chunk_layout((4,), 0, [])


@pytest.mark.rule("CHUNK-3")
@given(shapes(min_dims=1, max_side=9), st.data())
def test_a_rank_named_several_times_holds_its_chunks_in_order(shape, data) -> None:  # type: ignore[no-untyped-def]
    # torch's ChunkShardingSpec allows it (upstream's sharded-tensor tests place two chunks on
    # one rank): chunk i is torch.chunk's piece i on ranks[i], a rank's boxes in chunk order,
    # and from_sharding_spec reads the torch spec as the same layout.
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    from shardspec.metadata import from_sharding_spec

    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, 8))
    ranks = data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k))
    empties = [r for (start, stop), r in zip(chunk_bounds(shape[dim], k), ranks) if start == stop]
    if len(set(empties)) < len(empties):
        # Two empty chunks on one rank are the same box twice there (LAYOUT-2).
        with pytest.raises(LayoutError, match="two of the empty chunks"):
            chunk_layout(shape, dim, ranks)
        return
    layout = chunk_layout(shape, dim, ranks).validate()
    g = torch.arange(torch.Size(shape).numel()).reshape(shape)
    pieces = g.chunk(k, dim)
    chunks: dict[int, list[torch.Tensor]] = {}
    for i, r in enumerate(ranks):
        empty = g.narrow(dim % len(shape), shape[dim], 0)
        chunks.setdefault(r, []).append(pieces[i] if i < len(pieces) else empty)
    for r, want in chunks.items():
        got = [g[b.slices()] for b in layout.boxes_of(r)]
        assert len(got) == len(want), (r, layout)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (r, layout)
    spec = ChunkShardingSpec(dim, [f"rank:{r}/cpu" for r in ranks])
    assert from_sharding_spec(spec, shape) == layout
    assert [s.rank for s in from_sharding_spec(spec, shape).shards] == ranks
