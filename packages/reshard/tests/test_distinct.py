"""A layout's distinct boxes (shardspec.reshard.distinct) against walking its shards: the
shards a window meets, their common boxes, each shard's local position, on both the NumPy
and the plain-Python set-up."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import Box, Layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard.distinct import Distinct, distinct, large_layout_paths


@st.composite
def windows(draw: st.DrawFn, shape: tuple[int, ...]) -> Box:
    offs, sizes = [], []
    for n in shape:
        lo = draw(st.integers(0, n))
        offs.append(lo)
        sizes.append(draw(st.integers(0, n - lo)))
    return Box(offs, sizes)


@pytest.mark.rule("RESHARD-7")
@given(
    valid_layouts(shapes(max_dims=3, max_side=6), max_ranks=4),
    st.booleans(),
    st.data(),
)
def test_meeting_is_every_shard_cut_to_the_window_in_shard_order(
    layout: Layout, large: bool, data: st.DataObject
) -> None:
    with large_layout_paths(large):
        d = Distinct(layout)
    window = data.draw(windows(layout.shape))
    expected = [
        (i, cut)
        for i, s in enumerate(layout.shards)
        if (cut := s.box.intersect(window)) is not None
    ]
    assert d.meeting(window) == expected
    counts: dict[int, int] = {}
    for i, s in enumerate(layout.shards):
        assert d.local[i] == counts.get(s.rank, 0)
        assert d.ranks[i] == s.rank
        counts[s.rank] = counts.get(s.rank, 0) + 1


@pytest.mark.rule("RESHARD-7")
def test_distinct_is_kept_with_its_layout() -> None:
    layout = Layout.replicated((4, 2), [0, 1, 2])
    d = distinct(layout)
    assert distinct(layout) is d
    assert distinct(Layout.replicated((4, 2), [0, 1, 2])) is not d
    assert [i for i, _ in d.meeting(Box((1, 0), (2, 2)))] == [0, 1, 2]
    assert d.boxes == [Box((0, 0), (4, 2))] and d.holders(0) == [0, 1, 2]
