"""Layout.equivalent (LAYOUT-8): same shape, same ranks, each rank the same elements, checked
against a brute-force oracle that lists every element each rank holds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout
from shardspec.metadata.strategies import permuted, shapes, valid_layouts


def held(layout: Layout) -> dict[int, set[tuple[int, ...]]]:
    """rank -> every element (index tuple) it holds: the oracle."""
    out: dict[int, set[tuple[int, ...]]] = {r: set() for r in layout.ranks}
    for s in layout.shards:
        ranges = [range(o, o + n) for o, n in zip(s.box.offsets, s.box.sizes)]
        out[s.rank].update(itertools.product(*ranges))
    return out


def oracle(a: Layout, b: Layout) -> bool:
    return a.shape == b.shape and held(a) == held(b)


@st.composite
def rewritten(draw: st.DrawFn, layout: Layout) -> Layout:
    """The same layout written another way: a box cut in two, empty boxes added (at any
    in-bounds offset) or dropped where the rank keeps another box, the shards reordered;
    sometimes, also a real change (a box moved to another rank, or dropped)."""
    shards = list(draw(permuted(layout)).shards)
    nd = len(layout.shape)
    if shards and nd and draw(st.booleans()):
        i = draw(st.integers(0, len(shards) - 1))
        s = shards[i]
        d = draw(st.integers(0, nd - 1))
        if s.box.sizes[d] >= 2:
            cut = draw(st.integers(1, s.box.sizes[d] - 1))
            lo = Box(s.box.offsets, s.box.sizes[:d] + (cut,) + s.box.sizes[d + 1 :])
            hi_off = s.box.offsets[:d] + (s.box.offsets[d] + cut,) + s.box.offsets[d + 1 :]
            hi_size = s.box.sizes[:d] + (s.box.sizes[d] - cut,) + s.box.sizes[d + 1 :]
            shards[i : i + 1] = [Shard(lo, s.rank), Shard(Box(hi_off, hi_size), s.rank)]
    if shards and nd and draw(st.booleans()):
        r = draw(st.sampled_from([s.rank for s in shards]))
        offs = tuple(draw(st.integers(0, n)) for n in layout.shape)
        sizes = tuple(
            0 if k == 0 else draw(st.integers(0, n - o))
            for k, (o, n) in enumerate(zip(offs, layout.shape))
        )
        empty = Box(offs, sizes)
        if empty.is_empty and all(s.box != empty or s.rank != r for s in shards):
            shards.append(Shard(empty, r))
    if shards and draw(st.integers(0, 3)) == 0:
        i = draw(st.integers(0, len(shards) - 1))
        moved = shards[i]
        # Only onto a rank none of whose boxes it overlaps: a rank holding overlapping boxes
        # (the same box twice, say, where it held a replica) is outside what equivalence is
        # defined for, and Layout.equivalent rightly raises there.
        targets = [
            r
            for r in range(max(s.rank for s in shards) + 2)
            if r != moved.rank
            and not any(s.rank == r and s.box.overlaps(moved.box) for s in shards)
        ]
        if targets and draw(st.booleans()):
            shards[i] = Shard(moved.box, draw(st.sampled_from(targets)))
        else:
            del shards[i]
    return Layout(layout.shape, shards)


@pytest.mark.rule("LAYOUT-8")
@given(valid_layouts(shapes(max_dims=3, max_side=5)), st.data())
def test_equivalent_is_same_elements_on_same_ranks(layout: Layout, data: st.DataObject) -> None:
    other = data.draw(rewritten(layout))
    assert layout.equivalent(other) == oracle(layout, other) == other.equivalent(layout)
    assert layout.equivalent(layout)
    if layout == other:
        assert layout.equivalent(other)


@pytest.mark.rule("LAYOUT-8")
def test_equivalent_hand_worked_cases() -> None:
    whole = Layout((4, 2), [Shard(Box((0, 0), (4, 2)), 0)])
    halves = Layout((4, 2), [Shard(Box((2, 0), (2, 2)), 0), Shard(Box((0, 0), (2, 2)), 0)])
    assert whole.equivalent(halves) and whole != halves
    # Empty chunks hold nothing, wherever they sit; the rank still takes part.
    a = chunk_layout((2,), 0, [0, 1, 2])
    b = Layout(
        (2,), [Shard(Box((0,), (1,)), 0), Shard(Box((1,), (1,)), 1), Shard(Box((0,), (0,)), 2)]
    )
    assert a.equivalent(b) and a != b
    assert not a.equivalent(chunk_layout((2,), 0, [0, 1]))  # rank 2 is not in it
    assert not a.equivalent(chunk_layout((2,), 0, [1, 0, 2]))  # rows on other ranks
    assert not whole.equivalent(Layout((4, 3), [Shard(Box((0, 0), (4, 3)), 0)]))
    # Same volume, other elements.
    c = Layout((4,), [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)])
    d = Layout(
        (4,), [Shard(Box((1,), (2,)), 0), Shard(Box((0,), (1,)), 1), Shard(Box((3,), (1,)), 1)]
    )
    assert not c.equivalent(d)


@pytest.mark.rule("LAYOUT-8")
def test_equivalent_refuses_overlap_on_one_rank_and_non_layouts() -> None:
    a = Layout((4,), [Shard(Box((0,), (3,)), 0), Shard(Box((2,), (2,)), 0)])
    b = Layout((4,), [Shard(Box((0,), (4,)), 0)])
    with pytest.raises(LayoutError, match=r"rank 0 holds overlapping boxes"):
        a.equivalent(b)
    with pytest.raises(LayoutError, match="needs a Layout"):
        b.equivalent("layout")  # type: ignore[arg-type]
