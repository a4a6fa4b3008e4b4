"""DTensor placements as layouts (spec/02-dtensor.md, DTENSOR-1..8).

Every expectation comes from splitting a real tensor (``dtensor_oracle.local_tensor``: torch.chunk
and the strided rule, mesh dim by mesh dim), from torch's own ``distribute_tensor`` and
``compute_local_shape_and_global_offset``, or from hand-worked cases.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from dtensor_oracle import (
    arange,
    assemble,
    coords,
    device_mesh,
    flat_mesh,
    local_tensor,
    torch_local_tensors,
    torch_shape_and_offset,
)
from hypothesis import given, strategies as st
from metadata_oracle import is_valid
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from shardspec.metadata import Box, ConversionError, Layout, chunk_layout
from shardspec.metadata.dtensor import (
    dtensor_layout,
    dtensor_local_box,
    dtensor_local_boxes,
    dtensor_local_slices,
    mesh_ranks,
)
from shardspec.metadata.dtensor_math import Split, local_boxes, local_pieces
from shardspec.metadata.strategies import dtensor_cases, shapes
from shardspec.testing.defects import known_failure


def S(d: int) -> Shard:
    return Shard(d)


def SS(d: int, f: int) -> _StridedShard:
    return _StridedShard(d, split_factor=f)


R = Replicate


def boxes_by_rank(layout: Layout) -> dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    return {r: [(b.offsets, b.sizes) for b in layout.boxes_of(r)] for r in layout.ranks}


def _check_against_oracle(shape: Any, mesh: Any, placements: Any) -> Layout:
    layout = dtensor_layout(shape, mesh, placements)
    mesh_shape, ranks = flat_mesh(mesh)
    assert sorted(s.rank for s in layout.shards) == sorted(
        r for r in ranks for _ in layout.boxes_of(r)
    )
    for c, rank in zip(coords(mesh_shape), ranks):
        expected = local_tensor(shape, mesh_shape, placements, c)
        boxes = layout.boxes_of(rank)
        assert boxes, f"rank {rank} at {c} has no box [{shape}, {mesh}, {placements}]"
        got = assemble(shape, boxes)
        assert got.shape == expected.shape, (
            f"local shape={tuple(got.shape)}, but should be {tuple(expected.shape)} "
            f"[rank {rank} at {c}, shape={shape}, mesh={mesh}, placements={placements}]"
        )
        assert torch.equal(got, expected), (
            f"local values={got.tolist()}, but should be {expected.tolist()} "
            f"[rank {rank} at {c}, shape={shape}, mesh={mesh}, placements={placements}]"
        )
    return layout


# --- the brute-force differential: every coordinate's elements ------------------------------


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-3", "DTENSOR-4", "DTENSOR-5", "DTENSOR-7")
@given(dtensor_cases())
def test_layout_holds_exactly_the_local_tensor_of_every_coordinate(case: Any) -> None:
    shape, mesh, placements = case
    layout = _check_against_oracle(shape, mesh, placements)
    layout.validate()
    assert is_valid(layout)


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-4", "DTENSOR-5", "DTENSOR-7")
@given(dtensor_cases(shapes(max_dims=3, max_side=9), max_ranks=16))
def test_layout_matches_torch_distribute_tensor(case: Any) -> None:
    shape, mesh, placements = case
    layout = dtensor_layout(shape, mesh, placements)
    locals_ = torch_local_tensors(shape, mesh, placements)
    for rank, t in locals_.items():
        got = assemble(shape, layout.boxes_of(rank))
        assert got.shape == t.shape and torch.equal(got, t), (
            f"rank {rank}: ours {got.tolist()} (shape {tuple(got.shape)}), torch's "
            f"distribute_tensor {t.tolist()} (shape {tuple(t.shape)}) "
            f"[shape={shape}, mesh={mesh}, placements={placements}]"
        )


@pytest.mark.rule("DTENSOR-5", "DTENSOR-6")
@given(dtensor_cases())
def test_local_shape_and_offset_match_torch(case: Any) -> None:
    """Local shape always; the global offset in every dim where the rank holds something.
    Where a dim is empty torch says offset = global dim size (DTENSOR-6 Upstream)."""
    shape, mesh, placements = case
    mesh_shape, _ = flat_mesh(mesh)
    for c in coords(mesh_shape):
        boxes = dtensor_local_boxes(shape, mesh_shape, placements, c)
        t_shape, t_offset = torch_shape_and_offset(shape, mesh_shape, placements, c)
        ours_shape = tuple(
            sum(s for _, s in {(b.offsets[d], b.sizes[d]) for b in boxes})
            for d in range(len(shape))
        )
        assert ours_shape == t_shape, f"local shape={ours_shape}, torch {t_shape} [{case}, {c}]"
        for d in range(len(shape)):
            held = [b for b in boxes if b.sizes[d]]
            if held:
                first = min(b.offsets[d] for b in held)
                assert t_offset[d] == first, f"dim {d}: torch {t_offset}, ours {boxes} [{c}]"
            else:
                assert t_offset[d] in (0, shape[d]), f"dim {d}: torch {t_offset} [{c}]"


# --- hand-worked cases ----------------------------------------------------------------------


@pytest.mark.rule("DTENSOR-1")
def test_shard_one_mesh_dim_hand_worked() -> None:
    layout = dtensor_layout((5, 2), [3, 1, 0, 2], [S(0)])
    assert boxes_by_rank(layout) == {
        3: [((0, 0), (2, 2))],
        1: [((2, 0), (2, 2))],
        0: [((4, 0), (1, 2))],
        2: [((5, 0), (0, 2))],  # past the data: empty at offset 5 (CHUNK-2)
    }
    assert layout == chunk_layout((5, 2), 0, [3, 1, 0, 2])


@pytest.mark.rule("DTENSOR-2")
def test_nested_shard_hand_worked_torch_docstring() -> None:
    # compute_local_shape_and_global_offset's own docstring example.
    layout = dtensor_layout((2, 5), [[0, 1], [2, 3]], [S(1), S(1)])
    assert boxes_by_rank(layout) == {
        0: [((0, 0), (2, 2))],
        1: [((0, 2), (2, 1))],
        2: [((0, 3), (2, 1))],
        3: [((0, 4), (2, 1))],
    }


@pytest.mark.rule("DTENSOR-2", "DTENSOR-6")
def test_nested_uneven_empty_shard_sits_at_its_parents_end() -> None:
    # 5 rows over 2 -> [0,3) and [3,5); [0,3) over 4 -> 1,1,1 and an empty chunk at 3.
    layout = dtensor_layout((5,), [[0, 1, 2, 3], [4, 5, 6, 7]], [S(0), S(0)])
    assert boxes_by_rank(layout) == {
        0: [((0,), (1,))],
        1: [((1,), (1,))],
        2: [((2,), (1,))],
        3: [((3,), (0,))],
        4: [((3,), (1,))],
        5: [((4,), (1,))],
        6: [((5,), (0,))],
        7: [((5,), (0,))],
    }
    layout.validate()


@pytest.mark.rule("DTENSOR-3")
def test_replicate_gives_replicas() -> None:
    layout = dtensor_layout((4, 3), [[5, 7], [1, 2]], [R(), S(1)])
    assert boxes_by_rank(layout) == {
        5: [((0, 0), (4, 2))],
        7: [((0, 2), (4, 1))],
        1: [((0, 0), (4, 2))],
        2: [((0, 2), (4, 1))],
    }
    assert dtensor_layout((), [[0, 1], [2, 3]], [R(), R()]) == Layout.replicated((), range(4))
    assert dtensor_layout((0, 3), [4, 2], [R()]) == Layout.replicated((0, 3), [4, 2])


@pytest.mark.rule("DTENSOR-3")
@given(dtensor_cases())
def test_ranks_differing_only_in_replicate_dims_hold_the_same_boxes(case: Any) -> None:
    shape, mesh, placements = case
    mesh_shape, ranks = flat_mesh(mesh)
    layout = dtensor_layout(shape, mesh, placements)
    sharded = [m for m, p in enumerate(placements) if not isinstance(p, Replicate)]
    seen: dict[tuple[int, ...], tuple[Box, ...]] = {}
    for c, r in zip(coords(mesh_shape), ranks):
        key = tuple(c[m] for m in sharded)
        assert seen.setdefault(key, layout.boxes_of(r)) == layout.boxes_of(r)


@pytest.mark.rule("DTENSOR-4")
def test_strided_shard_docstring_example() -> None:
    # _StridedShard's docstring: FSDP2 + TP, rows 8 on a 2x2 mesh; ranks hold row blocks 0,2,1,3.
    layout = dtensor_layout((8, 8), [[0, 1], [2, 3]], [SS(0, 2), S(0)])
    assert boxes_by_rank(layout) == {
        0: [((0, 0), (2, 8))],
        1: [((4, 0), (2, 8))],
        2: [((2, 0), (2, 8))],
        3: [((6, 0), (2, 8))],
    }


@pytest.mark.rule("DTENSOR-4", "DTENSOR-7")
def test_strided_shard_not_one_block_hand_worked() -> None:
    # 11 rows: S(0) over 2 -> [0,6) and [6,11). SS(0, 2) over 4 on [0,6): chunk into [0,3) and
    # [3,6), chunk each over 4 (1,1,1,0): coordinate i takes row i of each -> {i, 3+i}.
    mesh = [[3, 1, 0, 2], [7, 5, 4, 6]]
    layout = dtensor_layout((11, 2), mesh, [S(0), SS(0, 2)])
    got = boxes_by_rank(layout)
    assert got[3] == [((0, 0), (1, 2)), ((3, 0), (1, 2))]
    assert got[1] == [((1, 0), (1, 2)), ((4, 0), (1, 2))]
    assert got[0] == [((2, 0), (1, 2)), ((5, 0), (1, 2))]
    assert got[2] == [((6, 0), (0, 2))]  # empty: at the end of its parent [0, 6)
    # [6,11) -> [6,9) and [9,11); over 4: {6,9}, {7,10}, {8}, {}
    assert got[7] == [((6, 0), (1, 2)), ((9, 0), (1, 2))]
    assert got[4] == [((8, 0), (1, 2))]
    assert got[6] == [((11, 0), (0, 2))]
    layout.validate()


@pytest.mark.rule("DTENSOR-4", "DTENSOR-7")
def test_strided_boxes_form_a_grid_over_two_dims() -> None:
    # Both dims strided: rank 0 holds rows {0, 2} x cols {0, 2} -> four 1x1 boxes, row-major.
    layout = dtensor_layout((4, 4), [[0, 1], [2, 3]], [SS(0, 2), SS(1, 2)])
    assert boxes_by_rank(layout)[0] == [
        ((0, 0), (1, 1)),
        ((0, 2), (1, 1)),
        ((2, 0), (1, 1)),
        ((2, 2), (1, 1)),
    ]
    assert dtensor_local_slices(layout.boxes_of(0)) == [
        (slice(0, 1), slice(0, 1)),
        (slice(0, 1), slice(1, 2)),
        (slice(1, 2), slice(0, 1)),
        (slice(1, 2), slice(1, 2)),
    ]


@pytest.mark.rule("DTENSOR-4")
def test_strided_runs_that_touch_are_one_block() -> None:
    # 3 rows, SS(0, 2) over 2: pieces [0,2) and [2,3) -> coordinate 0 gets {0} + {2},
    # coordinate 1 gets {1}. With split_factor 3 every piece has one row: coordinate 0 gets
    # all three rows, which touch, so it is one box.
    layout = dtensor_layout((3,), [0, 1], [SS(0, 3)])
    assert boxes_by_rank(layout) == {0: [((0,), (3,))], 1: [((3,), (0,))]}
    layout = dtensor_layout((3,), [0, 1], [SS(0, 2)])
    assert boxes_by_rank(layout) == {0: [((0,), (1,)), ((2,), (1,))], 1: [((1,), (1,))]}


@pytest.mark.rule("DTENSOR-7")
@given(dtensor_cases())
def test_local_slices_place_each_box_in_the_local_tensor(case: Any) -> None:
    shape, mesh, placements = case
    mesh_shape, ranks = flat_mesh(mesh)
    layout = dtensor_layout(shape, mesh, placements)
    g = arange(shape)
    for c, r in zip(coords(mesh_shape), ranks):
        local = local_tensor(shape, mesh_shape, placements, c)
        boxes = layout.boxes_of(r)
        covered = 0
        for box, sl in zip(boxes, dtensor_local_slices(boxes)):
            assert torch.equal(local[sl], g[box.slices()]), f"rank {r} box {box} at {sl}"
            covered += box.numel
        assert covered == local.numel()
        assert list(boxes) == sorted(boxes), "boxes are listed in row-major (offset) order"


# --- the single-box accessor ----------------------------------------------------------------


@pytest.mark.rule("DTENSOR-5")
@given(dtensor_cases())
def test_local_box_is_the_one_box_or_refuses(case: Any) -> None:
    shape, mesh, placements = case
    mesh_shape, _ = flat_mesh(mesh)
    for c in coords(mesh_shape):
        boxes = dtensor_local_boxes(shape, mesh_shape, placements, c)
        if len(boxes) == 1:
            assert dtensor_local_box(shape, mesh_shape, placements, c) == boxes[0]
            local = local_tensor(shape, mesh_shape, placements, c)
            assert tuple(local.shape) == boxes[0].sizes
        else:
            with pytest.raises(ConversionError, match="not one block"):
                dtensor_local_box(shape, mesh_shape, placements, c)


@pytest.mark.rule("DTENSOR-5")
def test_local_box_hand_worked() -> None:
    # 7 rows on a 2x2 mesh, S(0) twice: [0,4) -> [0,2),[2,4); [4,7) -> [4,6),[6,7).
    assert dtensor_local_box((7, 3), (2, 2), [S(0), S(0)], (1, 1)) == Box((6, 0), (1, 3))
    assert dtensor_local_box((7, 3), (2, 2), [S(0), S(1)], (1, 1)) == Box((4, 2), (3, 1))
    assert dtensor_local_box((), (3,), [R()], (2,)) == Box((), ())
    with pytest.raises(ConversionError, match="not in a mesh"):
        dtensor_local_box((7,), (2, 2), [S(0), S(0)], (2, 0))


# --- torch's deviations ---------------------------------------------------------------------


@pytest.mark.rule("DTENSOR-6")
@known_failure(
    reason="upstream: compute_local_shape_and_global_offset puts a nested empty shard at the "
    "global dim size (5), not at the end of the piece it was cut from (3)",
    raises=AssertionError,
    match=r"\(5,\) != \(3,\)",
)
def test_torch_nested_empty_shard_offset() -> None:
    ours = dtensor_local_box((5,), (2, 4), [S(0), S(0)], (0, 3))
    assert ours == Box((3,), (0,))
    assert torch_shape_and_offset((5,), (2, 4), [S(0), S(0)], (0, 3)) == ((0,), (3,))


@pytest.mark.rule("DTENSOR-7")
@known_failure(
    reason="upstream: compute_local_shape_and_global_offset describes a _StridedShard local "
    "tensor that is not one block as one box (shape (2,), offset (0,)) though it holds rows "
    "0 and 3",
    raises=AssertionError,
    match=r"tensor\(\[0, 1\]\), tensor\(\[0, 3\]\)",
)
def test_torch_strided_local_tensor_is_not_the_box_torch_reports() -> None:
    shape, mesh_shape, placements, c = (11,), (2, 4), [S(0), SS(0, 2)], (0, 0)
    local = local_tensor(shape, mesh_shape, placements, c)
    assert local.tolist() == [0, 3]
    size, offset = torch_shape_and_offset(shape, mesh_shape, placements, c)
    reported = Box(offset, size)
    assert torch.equal(arange(shape)[reported.slices()], local)


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.rule("DTENSOR-8")
@pytest.mark.parametrize("partial", [Partial(), Partial("max")])
def test_partial_has_no_layout(partial: Partial) -> None:
    with pytest.raises(ConversionError, match="partial tensor has no layout until"):
        dtensor_layout((4,), [[0, 1], [2, 3]], [S(0), partial])


@pytest.mark.rule("DTENSOR-1")
def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConversionError, match="one placement per mesh dim"):
        dtensor_layout((4,), [[0, 1], [2, 3]], [S(0)])
    with pytest.raises(ConversionError, match="does not have"):
        dtensor_layout((4,), [0, 1], [S(1)])
    with pytest.raises(ConversionError, match="does not have"):
        dtensor_layout((), [0, 1], [S(0)])
    with pytest.raises(ConversionError, match="split_factor 0"):
        dtensor_layout((4,), [0, 1], [SS(0, 0)])
    with pytest.raises(ConversionError, match="more than once"):
        dtensor_layout((4,), [0, 0], [S(0)])
    with pytest.raises(ConversionError, match="ragged"):
        dtensor_layout((4,), [[0, 1], [2]], [S(0), S(0)])
    with pytest.raises(ConversionError, match="size 0"):
        dtensor_layout((4,), [], [])
    with pytest.raises(ConversionError, match="must be integers"):
        dtensor_layout((4,), [0.0, 1.0], [S(0)])


@pytest.mark.rule("DTENSOR-1")
def test_negative_dims_are_normalised_like_torch() -> None:
    assert dtensor_layout((3, 5), [0, 1], [S(-1)]) == dtensor_layout((3, 5), [0, 1], [S(1)])


@pytest.mark.rule("DTENSOR-1")
def test_mesh_forms() -> None:
    nested = [[3, 1, 0], [5, 4, 2]]
    expected = dtensor_layout((7, 4), nested, [S(1), S(0)])
    assert dtensor_layout((7, 4), torch.tensor(nested), [S(1), S(0)]) == expected
    assert dtensor_layout((7, 4), tuple(map(tuple, nested)), [S(1), S(0)]) == expected
    assert dtensor_layout((7, 4), device_mesh(nested, 4), [S(1), S(0)]) == expected
    assert mesh_ranks(nested) == ((2, 3), (3, 1, 0, 5, 4, 2))


@pytest.mark.rule("DTENSOR-2", "DTENSOR-5", "DTENSOR-6")
@pytest.mark.parametrize(
    ("shape", "mesh", "placements"),
    [
        ((5, 3), [[3, 1, 0, 2], [7, 5, 4, 6]], [S(0), S(0)]),
        ((2, 5), [[0, 1], [2, 3]], [S(1), S(1)]),
        ((8, 8), [[2, 0], [1, 3]], [SS(0, 2), S(0)]),
        ((3, 0, 4), [[[1], [0]]], [R(), S(2), S(1)]),
    ],
)
def test_public_torch_api_on_real_fake_ranks(shape: Any, mesh: Any, placements: Any) -> None:
    """Each rank as its own (fake) process group member, through the public
    ``compute_local_shape_and_global_offset(shape, mesh, placements)`` and ``distribute_tensor``
    with its default scatter from coordinate 0 (the fake backend moves no data, so only shapes
    are compared there)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this process")
    layout = dtensor_layout(shape, mesh, placements)
    mesh_shape, ranks = flat_mesh(mesh)
    for rank in ranks:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=max(ranks) + 1)
        try:
            dm = DeviceMesh("cpu", torch.tensor(mesh))
            size, offset = compute_local_shape_and_global_offset(shape, dm, placements)
            (box,) = layout.boxes_of(rank)
            assert tuple(size) == box.sizes, f"rank {rank}: torch {size}, ours {box}"
            expected = tuple(
                o if s else shape[d] for d, (o, s) in enumerate(zip(box.offsets, box.sizes))
            )
            assert tuple(offset) == expected, f"rank {rank}: torch {offset}, ours {box}"
            if all(n % k == 0 for n, k in zip(shape, mesh_shape)):
                dt = distribute_tensor(arange(shape), dm, placements)
                assert tuple(dt.to_local().shape) == box.sizes
        finally:
            dist.destroy_process_group()


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2")
@given(st.integers(0, 30), st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_nested_shards_of_one_dim_refine_left_to_right(n: int, sides: list[int]) -> None:
    """S(0) on every mesh dim: coordinates in row-major order hold consecutive, in-order
    pieces, each the chunk of its parent (a hand-checkable consequence of DTENSOR-2)."""
    mesh = torch.arange(int(torch.tensor(sides).prod())).reshape(sides).tolist()
    layout = dtensor_layout((n,), mesh, [S(0)] * len(sides))
    nonempty = [b for s in layout.shards for b in [s.box] if b.sizes[0]]
    assert [b.offsets[0] for b in nonempty] == sorted(b.offsets[0] for b in nonempty)
    assert sum(b.sizes[0] for b in nonempty) == n


def _as_splits(placements: Any, ndim: int) -> list[Split | None]:
    out: list[Split | None] = []
    for p in placements:
        if isinstance(p, Replicate):
            out.append(None)
        else:
            f = p.split_factor if isinstance(p, _StridedShard) else 1
            out.append(Split(p.dim % ndim, f))
    return out


@pytest.mark.rule("DTENSOR-5", "DTENSOR-7")
@given(dtensor_cases())
def test_local_pieces_index_the_local_tensor(case: Any) -> None:
    """The torch-free entry point (shardspec.fsdp and other torch-free callers use it): each
    dim's piece lists the global indices of the local tensor along that dim, in local order,
    and its boxes are the grid of the pieces' runs."""
    shape, mesh, placements = case
    mesh_shape, _ = flat_mesh(mesh)
    splits = _as_splits(placements, len(shape))
    g = arange(shape)
    for c in coords(mesh_shape):
        pieces = local_pieces(shape, mesh_shape, splits, c)
        want = local_tensor(shape, mesh_shape, placements, c)
        ix = [torch.tensor(p.indices(), dtype=torch.long) for p in pieces]
        got = g[torch.meshgrid(*ix, indexing="ij")] if ix else g
        assert got.shape == want.shape and torch.equal(got, want), f"{case} at {c}: {pieces}"
        assert local_boxes(shape, mesh_shape, splits, c) == dtensor_local_boxes(
            shape, mesh_shape, placements, c
        )


@pytest.mark.rule("DTENSOR-5", "DTENSOR-7")
def test_local_pieces_hand_worked() -> None:
    # 8 rows, _StridedShard(0, 2) over 2: coordinate 1 holds rows 2, 3, 6, 7.
    (rows,) = local_pieces((8,), (2,), [Split(0, 2)], (1,))
    assert rows.indices() == [2, 3, 6, 7] and rows.runs == ((2, 4), (6, 8))
    # 5 rows over 4 then 2: coordinate (3, 1) is empty, at the end of its parent [5, 5).
    (rows,) = local_pieces((5,), (4, 2), [Split(0), Split(0)], (3, 1))
    assert rows.indices() == [] and rows.end == 5
    with pytest.raises(ConversionError, match="coordinate"):
        local_pieces((5,), (4,), [Split(0)], (4,))


# --- the strategies reach the edges (a strategy that misses one is a bug) -------------------


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    return flat_mesh(mesh)[0]


def _nested(case: Any) -> bool:
    shards = [p.dim % len(case[0]) for p in case[2] if not isinstance(p, Replicate)]
    return len(shards) != len(set(shards))


def _multi_box(case: Any) -> bool:
    layout = dtensor_layout(*case)
    return any(len(layout.boxes_of(r)) > 1 for r in layout.ranks)


def _empty_nested(case: Any) -> bool:
    layout = dtensor_layout(*case)
    return _nested(case) and any(
        s.box.is_empty and 0 < s.box.offsets[d] < case[0][d]
        for s in layout.shards
        for d in range(len(case[0]))
        if s.box.sizes[d] == 0
    )


@pytest.mark.parametrize(
    ("what", "predicate"),
    [
        ("a 0-d tensor", lambda c: c[0] == ()),
        ("a zero-size dim", lambda c: 0 in c[0]),
        ("a 4-D mesh", lambda c: len(_mesh_shape(c[1])) == 4),
        (
            "a size-1 mesh dim beside a bigger one",
            lambda c: 1 in _mesh_shape(c[1]) and max(_mesh_shape(c[1])) > 1,
        ),
        (
            "ranks not numbered in mesh order",
            lambda c: flat_mesh(c[1])[1] != sorted(flat_mesh(c[1])[1]),
        ),
        (
            "more ranks on a sharding mesh dim than rows",
            lambda c: any(
                not isinstance(p, Replicate)
                and c[0]
                and _mesh_shape(c[1])[m] > c[0][p.dim % len(c[0])]
                for m, p in enumerate(c[2])
            ),
        ),
        (
            "a negative shard dim",
            lambda c: any(not isinstance(p, Replicate) and p.dim < 0 for p in c[2]),
        ),
        ("nested shards of one dim", _nested),
        (
            "a _StridedShard with split_factor > 1",
            lambda c: any(isinstance(p, _StridedShard) and p.split_factor > 1 for p in c[2]),
        ),
        ("a local tensor that is several boxes", _multi_box),
        ("a nested empty shard inside the dim", _empty_nested),
    ],
)
def test_dtensor_cases_reach(what: str, predicate: Any) -> None:
    from hypothesis import find, settings as hsettings

    find(dtensor_cases(), predicate, settings=hsettings(max_examples=5000, database=None))


# --- large meshes: the layout built as columns ----------------------------------------------


@st.composite
def _large_mesh_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Any], list[Any]]:
    """(shape, mesh, placements) on 64 to 1,040 mesh coordinates, where ``mesh_layout`` builds
    the layout as int64 columns: small dims (more ranks than rows, empty pieces), shuffled
    rank numbers, every placement kind."""
    from hypothesis import assume

    from shardspec.metadata.strategies import dtensor_placements

    sides = draw(
        st.lists(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 64, 65]), min_size=1, max_size=3)
    )
    total = 1
    for k in sides:
        total *= k
    assume(64 <= total <= 1040)
    shp = draw(shapes(max_dims=3, max_side=70))
    order = draw(st.permutations(range(total)))
    t = torch.tensor(order).reshape(sides)
    placements = draw(dtensor_placements(len(shp), len(sides)))
    return shp, t.tolist(), placements


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-3", "DTENSOR-5", "DTENSOR-7")
@given(_large_mesh_cases())
def test_large_mesh_layout_is_the_box_by_box_layout(case: Any) -> None:
    # The column build must give the same shards in the same order as the reference build
    # (box by box, checked against the oracle on every mesh the other tests draw).
    from shardspec.metadata.dtensor import _splits
    from shardspec.metadata.dtensor_math import _mesh_boxes, mesh_layout

    shape, mesh, placements = case
    mesh_shape, ranks = flat_mesh(mesh)
    splits = _splits(placements, len(shape))
    got = mesh_layout(shape, mesh_shape, tuple(ranks), splits)
    if all(type(p) in (Shard, Replicate) for p in placements):
        assert got._shards is None, "Shard/Replicate on a large mesh: one box a coordinate"
    want = _mesh_boxes(shape, mesh_shape, tuple(ranks), splits)
    for r in ranks[:3] + ranks[-3:]:  # a rank's shards, asked for before the whole tuple
        assert got.shards_of(r) == want.shards_of(r)
    assert got.shards == want.shards
    assert got.fingerprint() == want.fingerprint()
    assert got.ranks == want.ranks


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-3", "DTENSOR-5", "DTENSOR-7")
@given(_large_mesh_cases())
def test_large_mesh_layout_holds_exactly_the_local_tensor_of_every_coordinate(case: Any) -> None:
    shape, mesh, placements = case
    _check_against_oracle(shape, mesh, placements).validate()


@pytest.mark.rule("DTENSOR-2", "DTENSOR-6")
def test_large_mesh_nested_uneven_hand_worked() -> None:
    # 10 rows over 8: chunks of 2, so coordinates 0..4 take [0,2) .. [8,10) and 5..7 are empty
    # at 10. Each parent of 2 rows over 8: [p, p+1), [p+1, p+2), then six empty at p+2.
    mesh = torch.arange(64).reshape(8, 8).tolist()
    layout = dtensor_layout((10, 3), mesh, [S(0), S(0)])
    assert layout._shards is None  # built as columns
    assert layout.boxes_of(0) == (Box((0, 0), (1, 3)),)
    assert layout.boxes_of(1) == (Box((1, 0), (1, 3)),)
    assert layout.boxes_of(2) == (Box((2, 0), (0, 3)),)
    assert layout.boxes_of(7) == (Box((2, 0), (0, 3)),)
    assert layout.boxes_of(4 * 8 + 1) == (Box((9, 0), (1, 3)),)
    assert layout.boxes_of(4 * 8 + 5) == (Box((10, 0), (0, 3)),)
    assert layout.boxes_of(7 * 8 + 3) == (Box((10, 0), (0, 3)),)
    replicated = dtensor_layout((5,), list(range(100, 164)), [R()])
    assert replicated == Layout.replicated((5,), range(100, 164))
    layout.validate()
