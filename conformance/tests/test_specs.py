"""Spec inference (spec/03-specs.md SPEC-3, SPEC-5): a layout is inferred as a chunk spec
exactly when some dim and rank order chunk to it (brute force over every order), the spec
reproduces the layout, and the order of the shards does not matter."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from conformance.assertions import assert_equal, assert_layouts_equal, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import chunk_layouts, permuted, shapes, valid_layouts
from shardspec.metadata import Layout, chunk_layout


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


@pytest.mark.rule("SPEC-3", "SPEC-1")
@given(LAYOUTS)
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


@pytest.mark.rule("SPEC-5")
@given(LAYOUTS, st.data())
def test_inference_does_not_depend_on_shard_order(
    impl: Impl, layout: Layout, data: st.DataObject
) -> None:
    other = data.draw(permuted(layout), label="reordered")
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
