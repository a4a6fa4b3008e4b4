"""Flat layouts (spec/11-flat.md, FLAT-*): ranges against a materialised tensor of element
indices, ZeRO's partitions against a buffer built the way DeepSpeed builds it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import example, given, strategies as st

from shardspec.metadata import Box, Layout, LayoutError, Shard
from shardspec.metadata.flat import (
    FlatLayout,
    FlatPiece,
    box_range,
    box_ranges,
    flat_from_layout,
    range_boxes,
    zero3_layout,
    zero12_partition,
)
from shardspec.metadata.strategies import shapes, valid_layouts


def _ids(shape: tuple[int, ...]) -> torch.Tensor:
    """Each element's row-major index (FLAT-1's definition, by torch's own memory order)."""
    return torch.arange(math.prod(shape)).reshape(shape)


def _elements(shape: tuple[int, ...], box: Box) -> list[int]:
    ids = _ids(shape)
    return ids[tuple(slice(o, o + s) for o, s in zip(box.offsets, box.sizes))].reshape(-1).tolist()


@st.composite
def _ranges(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int]:
    shape = draw(shapes(max_dims=4, max_side=6))
    n = math.prod(shape)
    a = draw(st.integers(0, n))
    b = draw(st.integers(a, n))
    return shape, a, b


@pytest.mark.rule("FLAT-1", "FLAT-2")
@given(_ranges())
@example(((3, 5), 3, 12))  # head, whole row, tail
@example(((2, 3, 4), 5, 19))  # heads and tails on two levels: 5 boxes
@example(((), 0, 1))  # a 0-d tensor's one element
@example(((4, 0, 3), 0, 0))  # no elements
def test_range_boxes_hold_the_range_in_order(case: tuple[tuple[int, ...], int, int]) -> None:
    shape, a, b = case
    boxes = range_boxes(shape, a, b)
    got = [i for box in boxes for i in _elements(shape, box)]
    assert got == list(range(a, b)), f"range_boxes{shape, a, b} = {boxes} hold {got}"
    assert all(box.numel for box in boxes), f"an empty box among {boxes}"
    assert len(boxes) <= max(2 * len(shape) - 1, 1), f"{len(boxes)} boxes for ndim {len(shape)}"


@pytest.mark.rule("FLAT-2")
def test_range_boxes_hand_worked() -> None:
    assert range_boxes((3, 5), 3, 12) == [
        Box((0, 3), (1, 2)),
        Box((1, 0), (1, 5)),
        Box((2, 0), (1, 2)),
    ]
    assert range_boxes((3, 5), 0, 10) == [Box((0, 0), (2, 5))]
    assert range_boxes((2, 3, 4), 5, 19) == [
        Box((0, 1, 1), (1, 1, 3)),
        Box((0, 2, 0), (1, 1, 4)),
        Box((1, 0, 0), (1, 1, 4)),
        Box((1, 1, 0), (1, 1, 3)),
    ]
    assert range_boxes((), 0, 1) == [Box((), ())]
    assert range_boxes((7,), 2, 2) == []


@pytest.mark.rule("FLAT-1")
@pytest.mark.parametrize(
    ("shape", "a", "b", "match"),
    [((3, 5), 0, 16, "not within the 15 elements"), ((), 0, 2, "not within the 1 elements")],
)
def test_a_range_past_the_end_is_refused(
    shape: tuple[int, ...], a: int, b: int, match: str
) -> None:
    with pytest.raises(LayoutError, match=match):
        range_boxes(shape, a, b)
    with pytest.raises(LayoutError, match="rank 3: stop 1 is before start 2"):
        FlatPiece(3, 2, 1)


@st.composite
def _boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], Box]:
    shape = draw(shapes(max_dims=4, max_side=5))
    offsets, sizes = [], []
    for n in shape:
        o = draw(st.integers(0, n))
        offsets.append(o)
        sizes.append(draw(st.integers(0, n - o)))
    return shape, Box(tuple(offsets), tuple(sizes))


@pytest.mark.rule("FLAT-3")
@given(_boxes())
@example(((3, 5), Box((1, 0), (2, 5))))  # whole rows: one range
@example(((3, 4, 5), Box((0, 1, 0), (2, 2, 5))))  # two runs of 10
@example(((3, 5), Box((0, 1), (3, 2))))  # a column block: one range a row
def test_box_ranges_hold_the_boxs_elements(case: tuple[tuple[int, ...], Box]) -> None:
    shape, box = case
    ranges = box_ranges(shape, box)
    got = [i for a, b in ranges for i in range(a, b)]
    want = _elements(shape, box)
    assert got == want, f"box_ranges({shape}, {box}) = {ranges}, elements {want}"
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(ranges)), f"{ranges} not maximal"
    one = box_range(shape, box)
    contiguous = bool(want) and want == list(range(want[0], want[-1] + 1))
    assert (one is not None) == contiguous, f"box_range({shape}, {box}) = {one}: {want}"
    if one is not None:
        assert one == (want[0], want[-1] + 1)
        assert range_boxes(shape, *one) == [box], f"{box} is one range, {one}, yet not its box"


@st.composite
def _flat_layouts(draw: st.DrawFn) -> FlatLayout:
    """A valid flat layout: the elements cut at drawn points, each range on one or more ranks
    (replicas), each rank's pieces in a drawn order in its buffer."""
    shape = draw(shapes(max_dims=3, max_side=6))
    n = math.prod(shape)
    cuts = sorted(set(draw(st.lists(st.integers(0, n), max_size=6))) | {0, n})
    world = draw(st.integers(1, 5))
    owned: dict[int, list[tuple[int, int]]] = {}
    for a, b in itertools.pairwise(cuts):
        for r in draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world)):
            owned.setdefault(r, []).append((a, b))
    pieces = []
    for r, ranges in owned.items():
        at = 0
        for a, b in draw(st.permutations(ranges)):
            pieces.append(FlatPiece(r, a, b, at))
            at += b - a + draw(st.integers(0, 2))  # room between pieces is allowed
    if not pieces:  # no elements: someone still holds the tensor
        pieces.append(FlatPiece(0, 0, 0))
    return FlatLayout(shape, draw(st.permutations(pieces)))


@pytest.mark.rule("FLAT-4", "FLAT-5")
@given(_flat_layouts())
def test_a_valid_flat_layout_is_the_same_elements_as_its_layout(flat: FlatLayout) -> None:
    flat.validate()
    layout = flat.to_layout()
    layout.validate()
    for r in {p.rank for p in flat.pieces}:
        by_buffer = sorted(flat.pieces_of(r), key=lambda p: p.at)
        want = [i for p in by_buffer for i in range(p.start, p.stop)]
        got = [i for box in layout.boxes_of(r) for i in _elements(flat.shape, box)]
        assert got == want, f"rank {r}: the layout's boxes hold {got}, its pieces {want}"
    back = flat_from_layout(layout)
    back.validate()
    assert back.to_layout().equivalent(layout), f"{flat} -> {layout} -> {back}"


@pytest.mark.rule("FLAT-5")
@given(valid_layouts(max_ranks=4))
def test_a_layout_round_trips_through_its_flat_ranges(layout: Layout) -> None:
    flat = flat_from_layout(layout)
    flat.validate()
    again = flat.to_layout()
    assert again.equivalent(layout), f"{layout} -> {flat} -> {again}"
    assert flat_from_layout(again) == flat, "the flat form of the round trip changed"


@pytest.mark.rule("FLAT-5")
def test_ranges_that_are_boxes_round_trip_unchanged() -> None:
    flat = FlatLayout((4, 5), [FlatPiece(0, 0, 10, 0), FlatPiece(1, 10, 20, 0)])
    layout = flat.to_layout()
    assert layout == Layout((4, 5), [Shard(Box((0, 0), (2, 5)), 0), Shard(Box((2, 0), (2, 5)), 1)])
    assert flat_from_layout(layout) == flat


@pytest.mark.rule("FLAT-4")
@pytest.mark.parametrize(
    ("pieces", "kind", "match"),
    [
        ([FlatPiece(0, 0, 16)], "bounds", r"piece #0 \(rank 0\) holds \[0, 16\), past the 15"),
        ([FlatPiece(0, 0, 7), FlatPiece(1, 6, 15)], "overlap", r"#0 \(rank 0.*#1 \(rank 1"),
        ([FlatPiece(0, 0, 7), FlatPiece(1, 8, 15)], "gap", r"elements \[7, 8\)"),
        ([FlatPiece(0, 0, 7)], "gap", r"elements \[7, 15\)"),
        ([FlatPiece(2, 0, 15), FlatPiece(2, 0, 15, 15)], "duplicate", "both give rank 2"),
        ([FlatPiece(0, 0, 7, 0), FlatPiece(0, 7, 15, 6)], "overlap", "rank 0 overlap in its"),
    ],
)
def test_an_invalid_flat_layout_names_its_pieces(
    pieces: list[FlatPiece], kind: str, match: str
) -> None:
    with pytest.raises(LayoutError, match=match) as e:
        FlatLayout((3, 5), pieces).validate()
    assert e.value.kind == kind


@pytest.mark.rule("FLAT-4")
@given(_flat_layouts(), st.data())
def test_removing_or_moving_one_piece_is_caught(flat: FlatLayout, data: st.DataObject) -> None:
    real = [i for i, p in enumerate(flat.pieces) if p.numel]
    if not real:
        return
    i = data.draw(st.sampled_from(real))
    p = flat.pieces[i]
    # moved one element on: past the end, element `start` left to no one (p held it alone),
    # or a range that overlaps p's replicas without being theirs (p longer than 1)
    moved = FlatPiece(p.rank, p.start + 1, p.stop + 1, p.at)
    alone = sum((q.start, q.stop) == (p.start, p.stop) for q in flat.pieces) == 1
    if alone or p.numel > 1:
        with pytest.raises(LayoutError):
            FlatLayout(
                flat.shape, [moved if k == i else q for k, q in enumerate(flat.pieces)]
            ).validate()
    if alone:
        with pytest.raises(LayoutError, match="no piece holds"):
            FlatLayout(flat.shape, [q for k, q in enumerate(flat.pieces) if k != i]).validate()


def _deepspeed_buffer(
    shapes_: list[tuple[int, ...]], dp: int, alignment: int, round_robin: bool
) -> list[list[tuple[int, int] | None]]:
    """Each rank's partition as DeepSpeed builds it, element by element: (parameter, its
    row-major index), None for padding. Written from stage_1_and_2.py, not from the code under
    test: reorder, concatenate, pad to a multiple of alignment * dp, split in dp equal parts."""
    order = list(range(len(shapes_)))
    if round_robin:
        groups: dict[int, list[int]] = {}
        for i in order:
            groups.setdefault(i % dp, []).append(i)
        order = [i for j in groups for i in groups[j]]
    flat: list[tuple[int, int] | None] = [
        (k, i) for k in order for i in range(math.prod(shapes_[k]))
    ]
    while len(flat) % (alignment * dp):
        flat.append(None)
    size = len(flat) // dp
    return [flat[r * size : (r + 1) * size] for r in range(dp)]


@pytest.mark.rule("FLAT-6")
@given(
    st.lists(shapes(max_dims=3, max_side=5), min_size=1, max_size=5),
    st.integers(1, 6),
    st.sampled_from([1, 2, 4]),
    st.booleans(),
)
@example([(3, 5), (7,)], 2, 2, False)
@example([(2, 2), (3,), (1,), (5,)], 2, 2, True)  # reordered: 0, 2, then 1, 3
def test_zero12_partition_is_deepspeeds_buffer(
    shapes_: list[tuple[int, ...]], dp: int, alignment: int, round_robin: bool
) -> None:
    part = zero12_partition(shapes_, dp, alignment=alignment, round_robin=round_robin)
    buffers = _deepspeed_buffer(shapes_, dp, alignment, round_robin)
    assert part.partition == len(buffers[0]) and part.padded == part.partition * dp
    assert part.numel == sum(math.prod(s) for s in shapes_)
    for r, buf in enumerate(buffers):
        held: list[tuple[int, int] | None] = [None] * len(buf)
        for k, layout in enumerate(part.layouts):
            assert layout.shape == tuple(shapes_[k])
            for p in layout.pieces_of(r):
                for j in range(p.numel):
                    held[p.at + j] = (k, p.start + j)
        assert held == buf, f"rank {r}: the pieces place {held}, DeepSpeed's partition is {buf}"
        lo, hi = part.padding_of(r)
        assert all(x is None for x in buf[lo:hi]) and all(x is not None for x in buf[:lo])
    for layout in part.layouts:
        layout.validate()
        # as boxes and back: the same ranges on the same ranks (a layout has no `at`)
        back = flat_from_layout(layout.to_layout())
        assert {(p.rank, p.start, p.stop) for p in back.pieces if p.numel} == {
            (p.rank, p.start, p.stop) for p in layout.pieces if p.numel
        }, f"{layout} -> {back}"


@pytest.mark.rule("FLAT-6")
def test_zero12_partition_hand_worked() -> None:
    # 15 + 7 = 22 elements, padded to 24 (a multiple of 2 * 2), 12 a rank
    part = zero12_partition([(3, 5), (7,)], 2)
    assert (part.numel, part.padded, part.partition) == (22, 24, 12)
    w, b = part.layouts
    assert set(w.pieces) == {FlatPiece(0, 0, 12, 0), FlatPiece(1, 12, 15, 0)}
    assert set(b.pieces) == {FlatPiece(1, 0, 7, 3)}
    assert part.padding_of(0) == (12, 12) and part.padding_of(1) == (10, 12)
    assert w.to_layout().boxes_of(0) == (Box((0, 0), (2, 5)), Box((2, 0), (1, 2)))
    assert w.to_layout().boxes_of(1) == (Box((2, 2), (1, 3)),)


@pytest.mark.rule("FLAT-7")
@given(shapes(max_dims=3, max_side=6), st.integers(1, 8))
@example((7,), 3)
@example((2,), 4)  # ranks past the data
@example((0, 3), 2)
def test_zero3_layout_is_each_ranks_ceil_slice(shape: tuple[int, ...], dp: int) -> None:
    flat = zero3_layout(shape, dp)
    flat.validate()
    n = math.prod(shape)
    # DeepSpeed: pad to a multiple of dp, each rank `aligned // dp` elements, narrow the flat
    # view where they are real
    aligned = n + ((dp - n % dp) if n % dp else 0)
    p = aligned // dp
    ids = list(range(n)) + [-1] * (aligned - n)
    for r in range(dp):
        (piece,) = flat.pieces_of(r)
        want = [i for i in ids[r * p : (r + 1) * p] if i >= 0]
        assert list(range(piece.start, piece.stop)) == want, f"rank {r}: {piece}, want {want}"
        assert piece.at == 0
    back = flat_from_layout(flat.to_layout())
    if shape:
        assert back == flat, f"ZeRO-3's {flat} as boxes and back: {back}"
    else:  # no box says that a rank holds nothing of a 0-d tensor
        assert back == FlatLayout((), [FlatPiece(0, 0, 1)]), back


@pytest.mark.rule("FLAT-7")
def test_zero3_layout_hand_worked() -> None:
    assert zero3_layout((7,), 3).pieces == (
        FlatPiece(0, 0, 3),
        FlatPiece(1, 3, 6),
        FlatPiece(2, 6, 7),
    )
    assert zero3_layout((2,), 4).pieces == (
        FlatPiece(0, 0, 1),
        FlatPiece(1, 1, 2),
        FlatPiece(2, 2, 2),
        FlatPiece(3, 2, 2),
    )


@pytest.mark.rule("FLAT-1", "FLAT-4")
def test_bad_input_is_a_layout_error_naming_it() -> None:
    with pytest.raises(LayoutError, match="FlatLayout piece #1 must be a FlatPiece"):
        FlatLayout((4,), [FlatPiece(0, 0, 4), (1, 0, 4)])  # type: ignore[list-item]
    with pytest.raises(LayoutError, match="dp and alignment must be positive"):
        zero12_partition([(4,)], 0)
    with pytest.raises(LayoutError, match="dp must be positive"):
        zero3_layout((4,), 0)
    with pytest.raises(LayoutError, match="does not lie within shape"):
        box_ranges((3, 5), Box((2, 0), (2, 5)))
    with pytest.raises(LayoutError, match="a Box is needed, got tuple"):
        box_range((3, 5), ((0, 0), (1, 1)))  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=r"FlatPiece\.start must be non-negative, got -1"):
        FlatPiece(0, -1, 3)
    with pytest.raises(LayoutError, match=r"\[-1, 3\) is not within"):
        range_boxes((4,), -1, 3)
    with pytest.raises(LayoutError, match="dp must be positive, got -2"):
        zero3_layout((4,), -2)


@pytest.mark.rule("FLAT-4")
def test_flat_layouts_compare_whatever_the_piece_order() -> None:
    a = FlatLayout((4,), [FlatPiece(0, 0, 2), FlatPiece(1, 2, 4)])
    b = FlatLayout((4,), [FlatPiece(1, 2, 4), FlatPiece(0, 0, 2)])
    assert a == b and hash(a) == hash(b)
    assert a != FlatLayout((4,), [FlatPiece(0, 0, 2), FlatPiece(1, 2, 4, 1)])
    assert a != (4,) and "FlatPiece(rank=1, start=2, stop=4, at=0)" in repr(a)
