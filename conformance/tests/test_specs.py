"""Spec inference (spec/03-specs.md SPEC-3, SPEC-5): a layout is inferred as a chunk spec
exactly when some dim and rank order chunk to it (brute force over every order), the spec
reproduces the layout, and the order of the shards does not matter."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, strategies as st

from conformance.assertions import assert_equal, assert_layouts_equal, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import chunk_layouts, permuted, shapes, valid_layouts
from shardspec.metadata import Box, Layout, Shard, chunk_layout


def is_chunk_layout(layout: Layout) -> bool:
    ranks = [s.rank for s in layout.shards]
    if not layout.shape or len(set(ranks)) != len(ranks):
        return False
    return any(
        chunk_layout(layout.shape, d, order) == layout
        for d in range(layout.ndim)
        for order in itertools.permutations(ranks)
    )


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


@pytest.mark.rule("SPEC-3", "SPEC-1")
@pytest.mark.known_defect("torch", INFER_DEFECT)
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
