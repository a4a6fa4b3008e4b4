"""Spec inference (spec/03-specs.md SPEC-3, SPEC-5): a layout is inferred as a chunk spec
exactly when some dim and rank order chunk to it (brute force over every order), the spec
reproduces the layout, and the order of the shards does not matter."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_layouts_equal, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import chunk_layouts, permuted, shapes, valid_layouts
from conformance.strategies.grids import chunkings_with_many_ranks
from shardspec.metadata import Box, Layout, Shard, chunk_layout


def _chunk_boxes(shape: tuple[int, ...], dim: int, k: int) -> Counter[Box]:
    nd = len(shape)
    return Counter(
        Box(
            [a if d == dim else 0 for d in range(nd)],
            [b - a if d == dim else shape[d] for d in range(nd)],
        )
        for a, b in reference.chunk_intervals(shape[dim], k)
    )


def is_chunk_layout(layout: Layout) -> bool:
    """Some dim and rank order chunk to ``layout``: each rank holds one box, and the boxes are
    the chunk rule's boxes of some dim (then the order that lists each box's ranks is one)."""
    ranks = [s.rank for s in layout.shards]
    if not layout.shape or len(set(ranks)) != len(ranks):
        return False
    boxes = Counter(s.box for s in layout.shards)
    return any(_chunk_boxes(layout.shape, d, len(ranks)) == boxes for d in range(layout.ndim))


LAYOUTS = st.one_of(
    chunk_layouts(shapes(min_dims=1, max_dims=3, max_side=6), max_ranks=5).flatmap(permuted),
    valid_layouts(shapes(max_dims=3, max_side=5), max_ranks=4, replicas=False),
)


# The smallest layouts on which torch's _infer_sharding_spec_from_shards_metadata answers
# differently for two orders of the same shards (found by exhaustive search over 3-D shapes
# up to (2, 2, 0) and two shards): an empty (1, 1, 0) tensor, shard A cut along dim 0, shard B
# along dim 1. No chunking gives it. torch treats dim 0 as "unset" (`if not
# chunk_sharding_dim`), so in the order A, B it takes B's dim 1 and answers a chunk spec on
# dim 1; in the order B, A it sees two dims and answers Enumerable.
_A = Shard(Box((1, 0, 0), (0, 1, 0)), 0)
_B = Shard(Box((0, 1, 0), (1, 0, 0)), 1)
MIXED_DIMS = Layout((1, 1, 0), [_A, _B])
# A chunk layout with its empty chunk at n (CHUNK-2): torch expects it past the end.
EMPTY_AT_N = chunk_layout((5, 2), 0, [0, 1, 2, 3])

INFER_DEFECT = (
    "_infer_sharding_spec_from_shards_metadata treats dim 0 as 'unset' (`if not "
    "chunk_sharding_dim`), so a layout whose shards are cut along dims 0 and 1 is inferred as a "
    "chunk spec on dim 1 when a dim-0 shard comes first ((1, 1, 0) tensor, A=[1,0,0]+[0,1,0] "
    "on rank 0 then B=[0,1,0]+[1,0,0] on rank 1); it also expects empty chunks past the end "
    "(offset split*i, as build_metadata writes them), so a chunk layout with its empty chunk "
    "at n is inferred Enumerable"
)
# the wrong answer the defect gives: a chunk spec for a layout no chunking gives, or the
# chunk layout's ranks and boxes lost to Enumerable
INFER_FAILURE = (
    r"^(is_chunk_spec|isinstance\(spec, ChunkShardingSpec\)|infer_spec\(L\)[.\w()]*)=.*, "
    r"but should be "
)


@pytest.mark.rule("SPEC-3", "SPEC-1")
@pytest.mark.known_defect("torch", INFER_DEFECT, raises=AssertionError, match=INFER_FAILURE)
@given(LAYOUTS)
@example(MIXED_DIMS)
@example(EMPTY_AT_N)
def test_inferred_spec_is_chunk_exactly_when_a_chunking_gives_the_layout(
    impl: Impl, layout: Layout
) -> None:
    ex = describe_layout(layout)
    with case():
        got = impl.infer_chunk(layout)
        assert_equal("is_chunk_spec", got is not None, is_chunk_layout(layout), ex)
        if got is not None:
            dim, ranks = got
            assert_layouts_equal(
                f"chunk_layout(dim={dim}, ranks={ranks})",
                chunk_layout(layout.shape, dim, ranks),
                layout,
                ex,
            )


def _with_order(layout: Layout) -> st.SearchStrategy[tuple[Layout, list[int]]]:
    return st.tuples(st.just(layout), st.permutations(range(len(layout.shards))))


@pytest.mark.rule("SPEC-5")
@pytest.mark.known_defect(
    "torch",
    "_infer_sharding_spec_from_shards_metadata depends on shard order: it treats dim 0 as "
    "'unset', so the (1, 1, 0) layout A=[1,0,0]+[0,1,0] (rank 0), B=[0,1,0]+[1,0,0] (rank 1) "
    "is a chunk spec on dim 1 in the order A, B and Enumerable in the order B, A",
    raises=AssertionError,
    match=r"^infer\(reordered\)='\w+(\(dim=\d+\))?', but should be ",
)
@given(LAYOUTS.flatmap(_with_order))
@example((MIXED_DIMS, [1, 0]))
def test_inference_does_not_depend_on_shard_order(
    impl: Impl, layout_order: tuple[Layout, list[int]]
) -> None:
    layout, order = layout_order
    other = Layout(layout.shape, [layout.shards[i] for i in order])
    with case():
        first = impl.infer_chunk(layout)
        second = impl.infer_chunk(other)
        first_kind = "enumerable" if first is None else f"chunk(dim={first[0]})"
        second_kind = "enumerable" if second is None else f"chunk(dim={second[0]})"
        assert_equal(
            "infer(reordered)",
            second_kind,
            first_kind,
            f"{describe_layout(layout)} reordered as {describe_layout(other)}",
        )


_MANY = st.one_of(LAYOUTS, chunkings_with_many_ranks())


@pytest.mark.rule("SPEC-3", "SPEC-1")
@pytest.mark.known_defect("torch", INFER_DEFECT, raises=AssertionError, match=INFER_FAILURE)
@given(_MANY)
@example(MIXED_DIMS)
@example(chunk_layout((7, 3), 1, [2, 0, 1]))
def test_inferred_spec_gives_back_the_layout_ranks_included(impl: Impl, layout: Layout) -> None:
    ex = describe_layout(layout)
    with case():
        assert_layouts_equal(
            "infer_spec(L).layout(L.shape)", impl.inferred_layout(layout), layout, ex
        )


@pytest.mark.rule("CONVERT-3", "CONVERT-4")
@pytest.mark.known_defect("torch", INFER_DEFECT, raises=AssertionError, match=INFER_FAILURE)
@given(_MANY)
@example(MIXED_DIMS)
@example(EMPTY_AT_N)
def test_torch_sharding_spec_says_the_layout_ranks_included(impl: Impl, layout: Layout) -> None:
    """The torch spec of a layout, read by hand (chunk rule, placements' ranks), is the
    layout; it is a ChunkShardingSpec exactly when some chunking gives the layout."""
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    ex = describe_layout(layout)
    with case():
        spec = impl.sharding_spec(layout)
        assert_equal(
            "isinstance(spec, ChunkShardingSpec)",
            isinstance(spec, ChunkShardingSpec),
            is_chunk_layout(layout),
            f"{ex} spec={spec}",
        )
        assert_layouts_equal(
            "layout_of(to_sharding_spec(L))",
            reference.layout_of_torch_spec(spec, layout.shape),
            layout,
            ex,
        )
