"""Chunk and enumerable specs (spec/03-specs.md, SPEC-1, SPEC-2)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from metadata_oracle import box_points

from shardspec.metadata import Box, ChunkSpec, EnumerableSpec, Layout, LayoutError, Shard
from shardspec.metadata.strategies import shapes, valid_layouts


@pytest.mark.rule("SPEC-1")
@given(shapes(min_dims=1, max_dims=3, max_side=7), st.data())
def test_chunk_spec_layout_is_torch_chunk_by_enumeration(shape, data) -> None:  # type: ignore[no-untyped-def]
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, 9))
    ranks = data.draw(st.permutations(range(k)))
    layout = ChunkSpec(dim, ranks).layout(shape)
    d = dim % len(shape)
    n = shape[d]
    split = -(-n // k)
    assert layout.shape == shape
    for i, r in enumerate(ranks):
        (box,) = layout.boxes_of(r)
        # Element-wise: rank ranks[i] holds exactly the indices whose dim-d coordinate lies in
        # chunk i of [0, n), i.e. i*split <= x < (i+1)*split.
        want = {p for p in box_points(Box.full(shape)) if i * split <= p[d] < (i + 1) * split}
        assert box_points(box) == want, f"rank {r} (chunk {i}) of {shape} dim {dim}"
        if box.sizes[d] == 0:
            assert box.offsets[d] == n, f"empty chunk {i} of {shape} dim {dim} not at n={n}"


@pytest.mark.rule("SPEC-1")
def test_chunk_spec_hand_worked() -> None:
    layout = ChunkSpec(1, [2, 0]).layout((2, 5))
    assert layout == Layout((2, 5), [Shard(Box((0, 0), (2, 3)), 2), Shard(Box((0, 3), (2, 2)), 0)])
    assert ChunkSpec(-1, [2, 0]).layout((2, 5)) == layout


@pytest.mark.rule("SPEC-1")
@pytest.mark.parametrize(
    ("dim", "ranks", "match"),
    [
        (0, [], "at least one rank"),
        (0, [1, 1], "name a rank twice"),
        (0, [-1], "non-negative"),
        (True, [0], "dim must be an int"),
        (1.0, [0], "dim must be an int"),
        (0, [0.0], "integers"),
    ],
)
def test_chunk_spec_refuses_bad_fields(dim: object, ranks: list[object], match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        ChunkSpec(dim, ranks)  # type: ignore[arg-type]


@pytest.mark.rule("SPEC-1")
def test_chunk_spec_is_frozen_and_compares_by_value() -> None:
    spec = ChunkSpec(0, [1, 0])
    assert spec == ChunkSpec(0, (1, 0))
    assert spec != ChunkSpec(0, (0, 1))
    assert hash(spec) == hash(ChunkSpec(0, (1, 0)))
    with pytest.raises(AttributeError):
        spec.dim = 1  # type: ignore[misc]


@pytest.mark.rule("SPEC-1")
def test_chunk_spec_refuses_bad_dim_for_shape() -> None:
    with pytest.raises(LayoutError, match="out of range"):
        ChunkSpec(2, [0]).layout((3, 3))
    with pytest.raises(LayoutError, match="out of range"):
        ChunkSpec(0, [0]).layout(())


@pytest.mark.rule("SPEC-2")
@given(valid_layouts(shapes(max_dims=3, max_side=5)))
def test_enumerable_spec_gives_back_its_layout(layout: Layout) -> None:
    spec = EnumerableSpec(layout)
    assert spec.layout(layout.shape) is layout
    assert spec.shape == layout.shape
    assert spec == EnumerableSpec(Layout(layout.shape, reversed(layout.shards)))


@pytest.mark.rule("SPEC-2")
def test_enumerable_spec_refuses_other_shape_and_invalid_layout() -> None:
    layout = Layout((4,), [Shard(Box((0,), (4,)), 0)])
    with pytest.raises(LayoutError, match=r"written for shape \(4,\), not \(5,\)"):
        EnumerableSpec(layout).layout((5,))
    gap = Layout((4,), [Shard(Box((0,), (3,)), 0)])
    with pytest.raises(LayoutError):
        EnumerableSpec(gap)
    with pytest.raises(LayoutError, match="needs a Layout"):
        EnumerableSpec([Shard(Box((0,), (4,)), 0)])  # type: ignore[arg-type]
