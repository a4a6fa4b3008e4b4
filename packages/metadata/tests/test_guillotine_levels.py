"""The level-wise vectorised guillotine (large layouts) against brute force (spec LAYOUT-2/3)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st
from metadata_oracle import box_points, points

from shardspec.metadata import Box, Layout, Shard
from shardspec.metadata.guillotine import Gap, Overlap
from shardspec.metadata.guillotine_levels import (
    find_gap_columns,
    find_overlap_columns,
    find_problem_columns,
    fits,
    single_cut_dim,
)
from shardspec.metadata.strategies import shapes, valid_layouts


def columns(boxes: list[Box], nd: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([b.offsets for b in boxes], dtype=np.int64).reshape(len(boxes), nd).T.copy()
    sizes = np.array([b.sizes for b in boxes], dtype=np.int64).reshape(len(boxes), nd).T
    return lo, lo + sizes


def overlapping_pairs(boxes: list[Box]) -> set[tuple[int, int]]:
    """Every (i, j), i < j, whose boxes share an element, by enumeration."""
    held = [box_points(b) for b in boxes]
    return {
        (i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if held[i] & held[j]
    }


@st.composite
def distinct_boxes(draw: st.DrawFn, *, disjoint: bool) -> tuple[tuple[int, ...], list[Box]]:
    """The distinct non-empty boxes of a valid layout, with some dropped and (unless
    ``disjoint``) some moved or grown: several faults at once, anywhere."""
    layout = draw(valid_layouts(shapes(min_dims=1, max_dims=3, max_side=6), replicas=False))
    boxes = sorted({s.box for s in layout.shards if not s.box.is_empty})
    boxes = [b for b in boxes if draw(st.integers(0, 5)) != 0]  # drop about one in six
    if not disjoint:
        for _ in range(draw(st.integers(0, 3))):
            if not boxes:
                break
            i = draw(st.integers(0, len(boxes) - 1))
            b = boxes[i]
            d = draw(st.integers(0, b.ndim - 1))
            offs, sizes = list(b.offsets), list(b.sizes)
            n = layout.shape[d]
            offs[d] = draw(st.integers(0, n - 1))
            sizes[d] = draw(st.integers(1, n - offs[d]))
            boxes[i] = Box(offs, sizes)
        boxes = sorted(set(boxes))
    return layout.shape, boxes


@pytest.mark.rule("LAYOUT-2")
@given(distinct_boxes(disjoint=False))
def test_overlap_search_finds_an_overlap_exactly_when_there_is_one(
    case: tuple[tuple[int, ...], list[Box]],
) -> None:
    shape, boxes = case
    pair = find_overlap_columns(*columns(boxes, len(shape)), shape) if boxes else None
    overlapping = overlapping_pairs(boxes)
    if pair is None:
        assert not overlapping
    else:
        assert pair in overlapping


@pytest.mark.rule("LAYOUT-3")
@given(distinct_boxes(disjoint=True))
def test_gap_search_finds_an_uncovered_point_exactly_when_there_is_one(
    case: tuple[tuple[int, ...], list[Box]],
) -> None:
    shape, boxes = case
    if not boxes:
        return
    held = set().union(*(box_points(b) for b in boxes))
    point = find_gap_columns(*columns(boxes, len(shape)), shape)
    if point is None:
        assert held == set(points(shape))
    else:
        assert point in set(points(shape)) and point not in held


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3")
@given(distinct_boxes(disjoint=False), st.booleans())
def test_the_problem_reported_is_the_overlap_first_then_the_gap(
    case: tuple[tuple[int, ...], list[Box]], one_dim: bool
) -> None:
    """Both routes: boxes cut along one dim only (one sort, as upstream) and the rest."""
    shape, boxes = case
    if one_dim:  # make every box span all dims but the first
        shape = shape[:1] + tuple(max(n, 1) for n in shape[1:])
        boxes = sorted(
            {
                Box((b.offsets[0],) + (0,) * (len(shape) - 1), (b.sizes[0], *shape[1:]))
                for b in boxes
            }
        )
    if not boxes:
        return
    lo, hi = columns(boxes, len(shape))
    if one_dim and len(shape) > 1 and len({(b.offsets[0], b.sizes[0]) for b in boxes}) > 1:
        assert single_cut_dim(lo, hi, shape) == 0
    problem = find_problem_columns(lo, hi, shape)
    overlapping = overlapping_pairs(boxes)
    held = set().union(*(box_points(b) for b in boxes))
    if overlapping:
        assert isinstance(problem, Overlap) and (problem.a, problem.b) in overlapping
    elif held != set(points(shape)):
        assert isinstance(problem, Gap) and problem.point not in held
        assert problem.point in set(points(shape))
    else:
        assert problem is None


@pytest.mark.rule("LAYOUT-3")
def test_gap_search_in_a_pinwheel_no_cut_splits() -> None:
    # Five boxes tiling a 3x3 square with no straight cut: the volume and section scan.
    pin = [((0, 0), (2, 1)), ((0, 1), (1, 2)), ((1, 2), (2, 1)), ((2, 0), (1, 2))]
    full = [Box(o, s) for o, s in pin] + [Box((1, 1), (1, 1))]
    assert find_gap_columns(*columns(full, 2), (3, 3)) is None
    assert find_overlap_columns(*columns(full, 2), (3, 3)) is None
    assert find_gap_columns(*columns(full[:4], 2), (3, 3)) == (1, 1)


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3")
def test_faults_in_large_layouts_are_found_where_they_are() -> None:
    side = 300  # a 300 x 300 brick wall: rows of bricks, odd rows shifted by half a brick
    bricks = []
    for i in range(side):
        cuts = [0, *(4 * j + 2 * (i % 2) for j in range(1, side)), 4 * side]
        bricks += [Box((2 * i, a), (2, b - a)) for a, b in itertools.pairwise(cuts)]
    shape = (2 * side, 4 * side)
    lo, hi = columns(bricks, 2)
    assert find_overlap_columns(lo, hi, shape) is None
    assert find_gap_columns(lo, hi, shape) is None
    missing = 150 * side + 77  # row 150, brick 77: starts at column 4 * 77 = 308
    rest = bricks[:missing] + bricks[missing + 1 :]
    assert find_gap_columns(*columns(rest, 2), shape) == (300, 308)
    extra = [*bricks, Box((401, 1), (2, 3))]  # across rows 200 and 201
    pair = find_overlap_columns(*columns(extra, 2), shape)
    assert pair is not None and pair[1] == len(bricks)
    assert box_points(bricks[pair[0]]) & box_points(extra[-1])
    layout = Layout(shape, [Shard(b, r) for r, b in enumerate(extra)])
    with pytest.raises(Exception, match=f"shard #{len(bricks)}"):
        layout.validate()


def test_fits_guards_the_int64_keys() -> None:
    assert fits(10**6, (10**6, 8))
    assert not fits(10**6, (2**50,))
