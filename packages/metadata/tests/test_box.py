"""Boxes (spec/01-layout.md, BOX-*)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from metadata_oracle import box_points

from shardspec.metadata import Box, LayoutError


def boxes(nd: int) -> st.SearchStrategy[Box]:
    ints = st.lists(st.integers(0, 6), min_size=nd, max_size=nd)
    return st.builds(Box, ints, ints)


@pytest.mark.rule("BOX-1")
@pytest.mark.parametrize(
    ("offsets", "sizes", "fragment"),
    [
        ((0, -1), (1, 1), "non-negative"),
        ((0, 0), (1, -2), "non-negative"),
        ((0.0,), (1,), "integers"),
        ((True,), (1,), "integers"),
        ((0, 0), (1,), "different lengths"),
    ],
)
def test_box_refuses_bad_numbers(offsets: tuple, sizes: tuple, fragment: str) -> None:
    with pytest.raises(LayoutError, match=fragment):
        Box(offsets, sizes)


@pytest.mark.rule("BOX-1")
def test_box_is_immutable_and_hashable() -> None:
    b = Box([1, 2], [3, 4])
    assert b.offsets == (1, 2) and b.sizes == (3, 4) and b.stops == (4, 6)
    with pytest.raises(AttributeError):
        b.offsets = (0, 0)  # type: ignore[misc]
    assert hash(b) == hash(Box((1, 2), (3, 4))) and b == Box((1, 2), (3, 4))
    assert b != Box((1, 2), (3, 5))


@pytest.mark.rule("BOX-1")
@given(boxes(2))
def test_box_slices_select_exactly_its_points(b: Box) -> None:
    import torch

    g = torch.arange(16 * 16).reshape(16, 16)
    picked = set(g[b.slices()].flatten().tolist())
    assert picked == {i * 16 + j for i, j in box_points(b)}


@pytest.mark.rule("BOX-2")
@given(boxes(3), boxes(3))
def test_empty_box_overlaps_nothing(a: Box, b: Box) -> None:
    empty = Box(a.offsets, (0,) + a.sizes[1:])
    assert empty.is_empty and empty.numel == 0
    assert empty.intersect(b) is None and b.intersect(empty) is None
    assert not empty.overlaps(empty)


@pytest.mark.rule("BOX-3")
def test_zero_dim_box_holds_one_element() -> None:
    b = Box((), ())
    assert b.ndim == 0 and b.numel == 1 and not b.is_empty
    assert b.intersect(b) == b and b.slices() == ()
    assert b.fits_in(())


@pytest.mark.rule("BOX-4")
@given(boxes(2), boxes(2))
def test_intersection_is_the_common_points(a: Box, b: Box) -> None:
    common = a.intersect(b)
    expected = box_points(a) & box_points(b)
    if common is None:
        assert expected == set()
    else:
        assert box_points(common) == expected and expected
    assert a.intersect(b) == b.intersect(a)


@pytest.mark.rule("BOX-4")
def test_intersection_hand_worked() -> None:
    a = Box((0, 2), (4, 3))  # rows [0,4), cols [2,5)
    b = Box((3, 0), (5, 3))  # rows [3,8), cols [0,3)
    assert a.intersect(b) == Box((3, 2), (1, 1))
    assert Box((0,), (3,)).intersect(Box((3,), (2,))) is None  # touching is not sharing
    with pytest.raises(LayoutError, match="ndim"):
        a.intersect(Box((0,), (1,)))
