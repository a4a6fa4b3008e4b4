"""The planner (spec/06-reshard.md, RESHARD-2..4, RESHARD-7), checked element by element."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard import Piece, plan
from shardspec.reshard.blocks import flat_blocks
from shardspec.reshard.index import BoxIndex
from shardspec.reshard.planner import large_layout_paths


def points(box: Box) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(o, o + s) for o, s in box)))


@st.composite
def layout_pairs(draw: st.DrawFn, max_dims: int = 3, max_side: int = 6) -> tuple[Layout, Layout]:
    shape = draw(shapes(max_dims=max_dims, max_side=max_side))
    fixed = st.just(shape)
    return draw(valid_layouts(fixed, max_ranks=5)), draw(valid_layouts(fixed, max_ranks=5))


def check_plan_against_brute_force(src: Layout, dst: Layout, pieces: list[Piece]) -> None:
    """Every element of every destination shard comes from exactly one piece; that piece's
    source shard holds it on the sending rank; local data stays local."""
    by_dst: dict[int, list[Piece]] = {}
    for p in pieces:
        by_dst.setdefault(p.dst_shard, []).append(p)
        assert not p.box.is_empty, f"empty piece {p}"
        s, d = src.shards[p.src_shard], dst.shards[p.dst_shard]
        assert (s.rank, d.rank) == (p.src_rank, p.dst_rank), f"{p} names the wrong ranks"
        assert p.box.intersect(s.box) == p.box, f"{p} is not inside its source box {s.box}"
        assert p.box.intersect(d.box) == p.box, f"{p} is not inside its destination box {d.box}"
        assert src.boxes_of(p.src_rank)[p.src_local] == s.box, f"{p}: wrong src_local"
        assert dst.boxes_of(p.dst_rank)[p.dst_local] == d.box, f"{p}: wrong dst_local"
    held: dict[tuple[int, ...], set[int]] = {}
    for s in src.shards:
        for x in points(s.box):
            held.setdefault(x, set()).add(s.rank)
    for j, d in enumerate(dst.shards):
        count: dict[tuple[int, ...], int] = {}
        for p in by_dst.get(j, []):
            for x in points(p.box):
                count[x] = count.get(x, 0) + 1
                if d.rank in held[x]:
                    assert p.src_rank == d.rank, (
                        f"element {x} of dst shard #{j} is on rank {d.rank} already but is "
                        f"sent by rank {p.src_rank}"
                    )
        for x in points(d.box):
            assert count.get(x, 0) == 1, (
                f"element {x} of dst shard #{j} (rank {d.rank}) is assigned {count.get(x, 0)} "
                f"times, should be 1"
            )
        assert sum(count.values()) == d.box.numel, f"dst shard #{j} gets elements outside it"


@pytest.mark.rule("RESHARD-2", "RESHARD-3", "RESHARD-4")
@given(layout_pairs(), st.booleans())
def test_plan_assigns_every_element_once_from_a_holder(
    pair: tuple[Layout, Layout], force: bool
) -> None:
    src, dst = pair
    with large_layout_paths(force):
        pieces = list(plan(src, dst).pieces)
    check_plan_against_brute_force(src, dst, pieces)


@pytest.mark.rule("RESHARD-2", "RESHARD-7")
@given(layout_pairs(), st.integers(0, 6), st.booleans())
def test_rank_plan_is_the_global_plan_restricted_to_the_rank(
    pair: tuple[Layout, Layout], rank: int, force: bool
) -> None:
    """Also across the two set-up paths: the scan and the indexes give the same pieces."""
    src, dst = pair
    with large_layout_paths(not force):
        whole = plan(src, dst)
    with large_layout_paths(force):
        mine = plan(src, dst, rank)
    expected = [p for p in whole.pieces if rank in (p.src_rank, p.dst_rank)]
    assert list(mine.pieces) == expected
    assert mine.sends(rank) == [p for p in expected if p.src_rank == rank and not p.is_local]
    assert mine.receives(rank) == [p for p in expected if p.dst_rank == rank and not p.is_local]


@pytest.mark.rule("RESHARD-2")
@given(layout_pairs())
def test_sender_and_receiver_agree_on_the_wire_order(pair: tuple[Layout, Layout]) -> None:
    src, dst = pair
    ranks = set(src.ranks) | set(dst.ranks)
    plans = {r: plan(src, dst, r) for r in ranks}
    for a, b in itertools.permutations(ranks, 2):
        sent = [p for p in plans[a].sends(a) if p.dst_rank == b]
        got = [p for p in plans[b].receives(b) if p.src_rank == a]
        assert sent == got, f"rank {a} sends {sent} but rank {b} expects {got}"


@pytest.mark.rule("RESHARD-4")
@given(valid_layouts(shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), max_ranks=4))
def test_replicated_source_is_read_once_and_spread(layout: Layout) -> None:
    src = Layout.replicated(layout.shape, [0, 1, 2, 3])
    dst = layout.with_ranks({r: r + 4 for r in layout.ranks})  # no destination rank holds it
    pieces = plan(src, dst).pieces
    check_plan_against_brute_force(src, dst, list(pieces))
    for j, d in enumerate(dst.shards):
        senders = {p.src_rank for p in pieces if p.dst_shard == j}
        widest = max(d.box.sizes)
        if widest >= 4 and not d.box.is_empty:
            assert len(senders) >= 3, f"dst shard {d} is read from {senders} only"


@pytest.mark.rule("RESHARD-4")
def test_replicated_spread_hand_worked() -> None:
    # Rows [0,3) to rank 2: split 2+1 over owners 0,1; rows [3,5) to rank 3: rotated, 1+1.
    src = Layout.replicated((5, 3), [0, 1])
    dst = chunk_layout((5, 3), 0, [2, 3])
    got = [(p.box, p.src_rank, p.dst_rank) for p in plan(src, dst)]
    assert got == [
        (Box((0, 0), (2, 3)), 0, 2),
        (Box((2, 0), (1, 3)), 1, 2),
        (Box((3, 0), (1, 3)), 1, 3),
        (Box((4, 0), (1, 3)), 0, 3),
    ]


@pytest.mark.rule("RESHARD-3")
def test_replicated_source_on_destination_ranks_moves_nothing() -> None:
    src = Layout.replicated((6, 4), [0, 1, 2, 3])
    dst = chunk_layout((6, 4), 1, [3, 1, 0, 2])
    p = plan(src, dst)
    assert p.moved_elements() == 0
    assert all(x.is_local for x in p)


@pytest.mark.rule("RESHARD-2")
def test_upstream_wrong_sender_example_hand_worked() -> None:
    # 12x21 chunked on dim 0 over ranks 0-3, to the same chunks placed on [1, 2, 3, 0]:
    # rank 1 now holds rows [0, 3), which only rank 0 has.
    src = chunk_layout((12, 21), 0, [0, 1, 2, 3])
    dst = chunk_layout((12, 21), 0, [1, 2, 3, 0])
    got = [(p.box, p.src_rank, p.dst_rank) for p in plan(src, dst)]
    assert got == [
        (Box((0, 0), (3, 21)), 0, 1),
        (Box((3, 0), (3, 21)), 1, 2),
        (Box((6, 0), (3, 21)), 2, 3),
        (Box((9, 0), (3, 21)), 3, 0),
    ]


@pytest.mark.rule("RESHARD-2")
def test_shape_mismatch_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match=r"shape \(4, 2\).*shape \(2, 4\)"):
        plan(chunk_layout((4, 2), 0, [0, 1]), chunk_layout((2, 4), 0, [0, 1]))


@pytest.mark.rule("RESHARD-2")
def test_invalid_layouts_are_rejected_naming_the_side() -> None:
    good = chunk_layout((4,), 0, [0, 1])
    gap = Layout((4,), [Shard(Box((0,), (2,)), 0)])
    with pytest.raises(LayoutError, match=r"source layout: .*cover"):
        plan(gap, good)
    with pytest.raises(LayoutError, match=r"destination layout: .*cover"):
        plan(good, gap)


@pytest.mark.rule("RESHARD-2")
def test_zero_d_and_zero_size_tensors() -> None:
    scalar_src = Layout((), [Shard(Box((), ()), 2), Shard(Box((), ()), 0)])
    scalar_dst = Layout((), [Shard(Box((), ()), 1), Shard(Box((), ()), 0)])
    got = [(p.box, p.src_rank, p.dst_rank) for p in plan(scalar_src, scalar_dst)]
    # Rank 0 keeps its copy; rank 1 (dst shard #0) reads the one element from owner
    # (0 + 0) mod 2 of the owners [0, 2].
    assert got == [(Box((), ()), 0, 1), (Box((), ()), 0, 0)]
    assert len(plan(chunk_layout((0, 3), 1, [0, 1]), chunk_layout((0, 3), 0, [1, 0]))) == 0


# ---------------------------------------------------------------- complexity (by counting)


@pytest.mark.rule("RESHARD-7")
@pytest.mark.parametrize("n", [100, 400])
def test_rank_plan_work_grows_with_its_pieces_not_n_times_m(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count box intersections: a rank's plan does O(k) of them, not one per (src, dst) pair."""
    calls = [0]
    real = Box.intersect

    def counting(self: Box, other: Box) -> Box | None:
        calls[0] += 1
        return real(self, other)

    monkeypatch.setattr(Box, "intersect", counting)
    rows = chunk_layout((n, n), 0, range(n))
    cols = chunk_layout((n, n), 1, range(n))
    p = plan(rows, cols, rank=7, validate=False)
    # Rank 7 receives n pieces (one from every row chunk) and sends n pieces.
    assert len(p) == 2 * n - 1
    assert calls[0] <= 2 * len(p), f"{calls[0]} intersections for {len(p)} pieces (n*m = {n * n})"
    calls[0] = 0
    grid_a = Layout.from_boxes(
        (n, n),
        [(Box((i, j), (10, 10)), (i + j) % 97) for i in range(0, n, 10) for j in range(0, n, 10)],
    )
    # Row bands of 5 cut into columns at positions that differ per band: not a product grid,
    # so the planner's guillotine-tree path (which intersects boxes) is the one counted.
    bands = []
    for i in range(0, n, 5):
        cuts = [0, *range(3 + i % 7, n, 20), n]
        bands += [
            (Box((i, a), (5, b - a)), (i * a) % 89) for a, b in itertools.pairwise(cuts) if b > a
        ]
    grid_b = Layout.from_boxes((n, n), bands)
    grid_b.validate()
    p = plan(grid_b, grid_a, rank=3, validate=False)
    assert len(p) > 0
    assert calls[0] <= 2 * len(p) + 4, f"{calls[0]} intersections for {len(p)} pieces"


# ---------------------------------------------------------------- the box index


@pytest.mark.rule("RESHARD-7")
@given(valid_layouts(shapes(max_dims=3, max_side=6), max_ranks=4), st.data())
def test_box_index_finds_exactly_the_overlapping_boxes(layout: Layout, data: st.DataObject) -> None:
    import numpy as np

    boxes = list(dict.fromkeys(s.box for s in layout if not s.box.is_empty))
    from_arrays = data.draw(st.booleans(), label="from arrays")
    with large_layout_paths(data.draw(st.booleans())):
        if from_arrays:  # as a checkpoint's saved chunks arrive: offsets and sizes as arrays
            nd = len(layout.shape)
            offs_a = np.array([b.offsets for b in boxes], dtype=np.int64).reshape(len(boxes), nd)
            sizes_a = np.array([b.sizes for b in boxes], dtype=np.int64).reshape(len(boxes), nd)
            index = BoxIndex.of_arrays(offs_a, sizes_a, layout.shape)
        else:
            index = BoxIndex(boxes, layout.shape)
    for _ in range(3):
        offs = [data.draw(st.integers(0, n)) for n in layout.shape]
        sizes = [data.draw(st.integers(0, n - o)) for o, n in zip(offs, layout.shape)]
        q = Box(offs, sizes)
        expected = sorted(i for i, b in enumerate(boxes) if b.overlaps(q))
        assert sorted(index.query(q)) == expected, f"query {q} on {index.kind} index of {boxes}"
        clipped = sorted((i, Box(o, n)) for i, o, n in index.query_clipped(q))
        assert clipped == [(i, boxes[i].intersect(q)) for i in expected]


@pytest.mark.rule("RESHARD-7")
def test_box_index_kinds() -> None:
    assert BoxIndex(chunk_layout((99, 4), 0, range(20)).boxes_of(0), (99, 4)).kind == "scan"
    rows = [s.box for s in chunk_layout((99, 4), 0, range(20))]
    assert BoxIndex(rows, (99, 4)).kind == "grid"
    # Bands of rows cut at different columns: a guillotine layout, not a product grid.
    bands = [Box((i, 0), (1, 1 + i % 3)) for i in range(20)]
    bands += [Box((i, 1 + i % 3), (1, 3 - i % 3)) for i in range(20)]
    index = BoxIndex(bands, (20, 4))
    assert index.kind == "tree"
    assert sorted(index.query(Box((2, 1), (2, 3)))) == [2, 22, 23]
    assert sorted(index.query(Box((1, 0), (1, 2)))) == [1]


# ---------------------------------------------------------------- flat element ranges


@given(st.lists(st.integers(1, 4), max_size=4), st.data())
@pytest.mark.rule("RESHARD-6")
def test_flat_blocks_cover_the_range_in_row_major_order(
    sizes: list[int], data: st.DataObject
) -> None:
    n = math.prod(sizes)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    blocks = flat_blocks(sizes, lo, hi)
    flat = []
    for offs, szs in blocks:
        assert all(s > 0 for s in szs)
        for x in itertools.product(*(range(o, o + s) for o, s in zip(offs, szs))):
            flat.append(sum(i * math.prod(sizes[d + 1 :]) for d, i in enumerate(x)))
    assert flat == list(range(lo, hi))
    assert len(blocks) <= max(1, 2 * len(sizes) - 1)


@pytest.mark.rule("LAYOUT-6")
@pytest.mark.parametrize("n", [2**63, 2**70])
@pytest.mark.parametrize("shards", [2, 70])  # below and above the NumPy-indexed size
def test_a_dim_beyond_int64_is_a_layout_error_not_an_overflow(n: int, shards: int) -> None:
    a = chunk_layout((n,), 0, range(shards))
    b = chunk_layout((n,), 0, list(reversed(range(shards))))
    with pytest.raises(LayoutError, match="beyond int64"):
        plan(a, b)


@pytest.mark.rule("LAYOUT-6")
def test_a_rank_beyond_int64_is_a_layout_error_not_an_overflow() -> None:
    a = Layout((4,), [Shard(Box((0,), (4,)), 2**64)])
    with pytest.raises(LayoutError, match=r"rank .* beyond int64"):
        plan(a, chunk_layout((4,), 0, [0]))


@pytest.mark.rule("LAYOUT-6")
def test_the_largest_int64_dim_still_plans() -> None:
    n = 2**63 - 1
    p = plan(chunk_layout((n,), 0, [0, 1]), chunk_layout((n,), 0, [1, 0]))
    assert sum(piece.numel for piece in p.pieces) == n


@pytest.mark.rule("RESHARD-7")
@given(valid_layouts(shapes(max_dims=3, max_side=6), max_ranks=4), st.data())
def test_box_index_answers_many_queries_as_it_answers_each(
    layout: Layout, data: st.DataObject
) -> None:
    boxes = list(dict.fromkeys(s.box for s in layout if not s.box.is_empty))
    with large_layout_paths():  # a grid index even for a few boxes
        index = BoxIndex(boxes, layout.shape)
    queries = []
    for _ in range(data.draw(st.integers(0, 4))):
        offs = tuple(data.draw(st.integers(0, n)) for n in layout.shape)
        sizes = tuple(data.draw(st.integers(0, n - o)) for o, n in zip(offs, layout.shape))
        queries.append((offs, sizes))
    many = index.query_clipped_many([o for o, _ in queries], [n for _, n in queries])
    if many is None:
        assert index.kind != "grid"
        return
    each = [
        (i, pos, list(lo), list(n))
        for i, (o, s) in enumerate(queries)
        for pos, lo, n in index.query_clipped(Box(o, s))
    ]
    assert list(zip(*(a.tolist() for a in many))) == each
    for i, pos, lo, n in each:  # and each piece is the box's intersection with the query
        common = boxes[pos].intersect(Box(*queries[i]))
        assert common is not None and (common.offsets, common.sizes) == (tuple(lo), tuple(n))


@pytest.mark.rule("RESHARD-7")
def test_box_index_answers_many_queries_on_a_grid() -> None:
    # the 5 x 4 cells of 2 x 2 of a (10, 8) grid (more than a scan's few boxes)
    cells = [Box((r, c), (2, 2)) for r in range(0, 10, 2) for c in range(0, 8, 2)]
    index = BoxIndex(cells, (10, 8))
    assert index.kind == "grid"
    many = index.query_clipped_many([(1, 1), (0, 0), (9, 7)], [(2, 2), (0, 4), (1, 1)])
    assert many is not None
    q, pos, lo, n = (a.tolist() for a in many)
    assert q == [0, 0, 0, 0, 2]  # the empty query meets nothing
    assert [cells[p] for p in pos] == [cells[0], cells[1], cells[4], cells[5], cells[19]]
    assert lo == [[1, 1], [1, 2], [2, 1], [2, 2], [9, 7]]
    assert n == [[1, 1], [1, 1], [1, 1], [1, 1], [1, 1]]
