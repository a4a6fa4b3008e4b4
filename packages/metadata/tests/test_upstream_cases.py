"""Cases taken from PyTorch's own tests, run against shardspec.metadata.

Each test names the upstream test it is derived from. The inputs (shapes, shard lists, rank
orders) are upstream's; the expectations are hand-worked or brute-forced here, and equal
upstream's expected values except where the spec deliberately differs (each such place says
so: empty chunks at offset n, CHUNK-2; a layout that overlaps and leaves a gap is reported as
the overlap, LAYOUT-2). DTensor cases are in test_upstream_cases_dtensor.py.

Upstream files: test/distributed/_shard/sharding_spec/test_sharding_spec.py,
test/distributed/checkpoint/test_planner.py,
test/distributed/tensor/parallel/test_tp_fsdp_shard_metadata.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from metadata_oracle import box_points, is_valid, points
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec._internals import check_tensor
from torch.distributed._shard.sharding_spec.chunk_sharding_spec import ChunkShardingSpec
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.tensor.placement_types import Replicate, Shard as DShard

from shardspec.metadata import (
    Box,
    ChunkSpec,
    ConversionError,
    EnumerableSpec,
    Layout,
    LayoutError,
    Shard,
    chunk_bounds,
    chunk_layout,
    chunk_size,
    dtensor_layout,
    from_shard_metadata,
    from_sharding_spec,
    from_tensor_storage_metadata,
    infer_spec,
    layout_to_json,
    render,
    to_chunk_list,
    to_shard_metadata,
    to_sharded_tensor_metadata,
    to_sharding_spec,
    to_tensor_storage_metadata,
)


def layout_of(shape: tuple[int, ...], boxes: list[tuple[list[int], list[int]]]) -> Layout:
    """Shard ``i`` is ``boxes[i]`` on rank ``i`` (upstream's ``cuda:i`` placements)."""
    return Layout(shape, [Shard(Box(o, s), i) for i, (o, s) in enumerate(boxes)])


# ---------------------------------------------------------------------------------------------
# test_sharding_spec.py: split sizes and chunk arithmetic


@pytest.mark.rule("CHUNK-1")
@pytest.mark.parametrize(
    ("n", "k", "split"),
    [(11, 4, 3), (12, 4, 3), (13, 4, 4), (5, 4, 2), (11, 1, 11), (11, 11, 1)],
)
def test_get_split_size(n: int, k: int, split: int) -> None:
    # upstream: TestShardingSpec.test_get_split_size (expected values agree: ceil(n / k))
    assert chunk_size(n, k) == split == math.ceil(n / k)
    assert max(b - a for a, b in chunk_bounds(n, k)) == split


@pytest.mark.rule("CHUNK-1", "CHUNK-2")
@pytest.mark.parametrize(
    ("n", "split", "idx", "size"),
    [(11, 3, 0, 3), (11, 3, 3, 2), (13, 4, 0, 4), (13, 4, 3, 1), (5, 2, 3, 0)],
)
def test_get_chunked_dim_size(n: int, split: int, idx: int, size: int) -> None:
    # upstream: TestShardingSpec.test_get_chunked_dim_size, whose split sizes are those of a
    # world of 4 (ceil(n / 4)). Sizes agree; the empty chunk (5, 2, 3) sits at n = 5 here
    # (CHUNK-2), where upstream's offset split * idx = 6 lies past the end.
    assert chunk_size(n, 4) == split
    start, stop = chunk_bounds(n, 4)[idx]
    assert stop - start == size
    assert start == (min(idx * split, n))
    layout = chunk_layout((n,), 0, [0, 1, 2, 3])
    assert layout.boxes_of(idx) == (Box((start,), (size,)),)
    assert layout.is_valid()


@pytest.mark.rule("SPEC-1", "CONVERT-4")
@pytest.mark.parametrize(
    ("order", "rank", "offset", "size"),
    [
        ([0, 1, 2, 3], 1, 6, 6),
        ([0, 1, 2, 3], 3, 18, 3),
        ([3, 2, 1, 0], 1, 12, 6),
        ([3, 2, 1, 0], 3, 0, 6),
    ],
)
def test_get_chunk_sharding_params(order: list[int], rank: int, offset: int, size: int) -> None:
    # upstream: TestShardingSpec.test_get_chunk_sharding_params (21 rows over 4 ranks, then
    # the placements swapped to ranks 3, 2, 1, 0); expected (offset, size) agree.
    want = (Box((offset,), (size,)),)
    assert chunk_layout((21,), 0, order).boxes_of(rank) == want
    assert ChunkSpec(0, order).layout((21,)).boxes_of(rank) == want
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in order])
    assert from_sharding_spec(spec, (21,)).boxes_of(rank) == want


# ---------------------------------------------------------------------------------------------
# test_sharding_spec.py: EnumerableShardingSpec and check_tensor

ROW_WISE = ((10, 5), [([0, 0], [5, 5]), ([5, 0], [5, 5])])
GRID_2X2 = ((6, 6), [([0, 0], [3, 3]), ([0, 3], [3, 3]), ([3, 0], [3, 3]), ([3, 3], [3, 3])])
UNEVEN = ((6, 6), [([0, 0], [2, 4]), ([0, 4], [4, 2]), ([2, 0], [4, 4]), ([4, 4], [2, 2])])


@pytest.mark.rule("SPEC-2", "SPEC-3", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.parametrize("case", [ROW_WISE, GRID_2X2, UNEVEN], ids=["row", "grid", "uneven"])
def test_enumerable_sharding_spec_valid(case: tuple[tuple[int, int], list]) -> None:  # type: ignore[type-arg]
    # upstream: TestShardingSpec.test_enumerable_sharding_spec, valid specs, which pass
    # check_tensor. Valid here too (brute force agrees); the row-wise one is exactly the
    # chunk layout of dim 0 over ranks 0, 1, so it infers a ChunkSpec.
    shape, boxes = case
    layout = layout_of(shape, boxes)
    assert is_valid(layout)
    assert EnumerableSpec(layout).layout(torch.Size(shape)) == layout.validate()
    spec = infer_spec(layout)
    if case is ROW_WISE:
        assert spec == ChunkSpec(0, (0, 1))
    else:
        assert isinstance(spec, EnumerableSpec)
    assert spec.layout(shape) == layout
    torch_spec = to_sharding_spec(layout, device="cpu")
    assert from_sharding_spec(torch_spec, shape) == layout
    check_tensor(to_shard_metadata(layout), torch.Size(shape))  # torch agrees it is whole


@pytest.mark.rule("CONVERT-1")
def test_enumerable_sharding_spec_device_placements_have_no_rank() -> None:
    # upstream: test_enumerable_sharding_spec writes placements "cuda:0", "cuda:1". They name
    # no rank, and a layout names the owner of every box: the converter refuses them, naming
    # the shard.
    shards = [
        ShardMetadata(shard_offsets=[0, 0], shard_sizes=[5, 5], placement="cpu"),
        ShardMetadata(shard_offsets=[5, 0], shard_sizes=[5, 5], placement="cpu"),
    ]
    with pytest.raises(ConversionError, match=r"shard #0 .*without a rank"):
        from_shard_metadata(shards, torch.Size([10, 5]))


@pytest.mark.rule("BOX-1")
@pytest.mark.parametrize(
    ("offsets", "sizes", "match"),
    [
        ([0, 0], [1], "different lengths"),  # upstream: "same number of elements"
        ([-1, 0], [1, 1], "non-negative"),  # upstream: "shard_offsets should be >=0"
        ([0, 0], [-1, 1], "non-negative"),  # upstream: "shard_sizes should be >= 0"
    ],
)
def test_invalid_shard_metadata_fields(offsets: list[int], sizes: list[int], match: str) -> None:
    # upstream: test_enumerable_sharding_spec, invalid ShardMetadata
    with pytest.raises(LayoutError, match=match):
        Box(offsets, sizes)


@pytest.mark.rule("SPEC-2", "LAYOUT-3", "CONVERT-5")
def test_empty_shard_list() -> None:
    # upstream: EnumerableShardingSpec([]) raises "Empty shard list provided". An empty layout
    # of a non-empty tensor leaves element (0, 0) uncovered; torch's type cannot hold the one
    # valid empty layout (a tensor with no elements) either.
    with pytest.raises(LayoutError, match=r"element \(0, 0\)") as err:
        EnumerableSpec(Layout((10, 5), []))
    assert err.value.kind == "gap"
    empty = Layout((0, 5), [])
    assert EnumerableSpec(empty).layout((0, 5)) == empty
    with pytest.raises(ConversionError, match="at least one shard"):
        to_sharding_spec(empty)


@pytest.mark.rule("LAYOUT-1")
def test_inconsistent_shard_ndims() -> None:
    # upstream: "Found inconsistent ranks for shards" (a 2-D and a 3-D shard)
    layout = layout_of((1, 1), [([0, 0], [1, 1]), ([0, 0, 0], [1, 1, 1])])
    with pytest.raises(LayoutError, match="shard #1 on rank 1 has 3 dims") as err:
        layout.validate()
    assert err.value.kind == "ndim"
    assert err.value.shards == (1,)


@pytest.mark.rule("LAYOUT-2")
def test_enumerable_overlap() -> None:
    # upstream: "Shards.*overlap" for [0,3)x[0,3) and [2,5)x[0,3)
    layout = layout_of((5, 3), [([0, 0], [3, 3]), ([2, 0], [3, 3])])
    with pytest.raises(
        LayoutError, match=r"overlap.*share Box\(offsets=\(2, 0\), sizes=\(1, 3\)\)"
    ):
        EnumerableSpec(layout)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-3")
def test_check_tensor_failures() -> None:
    # upstream: check_tensor's three refusals in test_enumerable_sharding_spec
    rows = [([0, 0], [5, 5]), ([5, 0], [5, 5])]
    # "Rank of tensor is.*but shards rank": 2-D shards, 3-D tensor
    with pytest.raises(LayoutError, match="has 2 dims but the layout shape") as e1:
        layout_of((10, 10, 10), rows).validate()
    assert e1.value.kind == "ndim"
    # "exceeds tensor dim": 5 columns in a tensor of 3
    with pytest.raises(LayoutError, match="out of bounds in dim 1") as e2:
        layout_of((10, 3), rows).validate()
    assert (e2.value.kind, e2.value.shards) == ("bounds", (0,))
    # "does not match tensor volume": here the uncovered element is named
    diagonal = layout_of((10, 10), [([0, 0], [5, 5]), ([5, 5], [5, 5])])
    with pytest.raises(LayoutError, match="do not cover") as e3:
        diagonal.validate()
    assert e3.value.kind == "gap"
    assert e3.value.point is not None
    assert not any(e3.value.point in box_points(s.box) for s in diagonal.shards)


# ---------------------------------------------------------------------------------------------
# test_sharding_spec.py: _infer_sharding_spec_from_shards_metadata


@pytest.mark.rule("SPEC-3")
def test_infer_enumerable_cases() -> None:
    # upstream: TestShardingSpec._infer_enum_sharding_spec_case. All three are enumerable.
    uneven = layout_of((15, 5), [([0, 0], [5, 5]), ([5, 0], [10, 5])])  # 5 + 10 is not 8 + 7
    grid = layout_of(
        (10, 10),
        [([0, 0], [5, 5]), ([5, 0], [5, 5]), ([0, 5], [5, 5]), ([5, 5], [5, 5])],
    )
    # both shards on the same device: one rank holding two boxes
    two_on_one = Layout((25,), [Shard(Box((0,), (16,)), 0), Shard(Box((16,), (9,)), 0)])
    for layout in (uneven, grid, two_on_one):
        spec = infer_spec(layout)
        assert isinstance(spec, EnumerableSpec)
        assert spec.layout(layout.shape) == layout


INFER_CHUNK_CASES = [
    (0, (4, 16)),
    (0, (5, 15, 16)),
    (1, (12, 16)),
    (2, (4, 18, 15)),
    (3, (7, 12, 16, 37)),
    (4, (50, 4, 18, 15, 77)),
]


@pytest.mark.rule("SPEC-3", "SPEC-5", "CHUNK-2")
@pytest.mark.parametrize(("dim", "shape"), INFER_CHUNK_CASES)
def test_infer_chunk_cases(dim: int, shape: tuple[int, ...]) -> None:
    # upstream: test_infer_sharding_spec_from_shards_metadata, which builds the chunk shards of
    # random placement orders of ranks 0..3 and lists them in rank order (not chunk order);
    # here every order. Upstream puts the empty chunk of (5, 15, 16) at split * 3 = 6; the
    # chunk layout has it at n = 5 (CHUNK-2) and still infers the chunk spec.
    n = shape[dim]
    split = -(-n // 4)
    for order in itertools.permutations(range(4)):
        shards = []
        for chunk, rank in enumerate(order):
            start, stop = min(chunk * split, n), min((chunk + 1) * split, n)
            offsets = [0] * len(shape)
            offsets[dim] = start
            sizes = list(shape)
            sizes[dim] = stop - start
            shards.append(Shard(Box(offsets, sizes), rank))
        shards.sort(key=lambda s: s.rank)
        layout = Layout(shape, shards)
        assert infer_spec(layout) == ChunkSpec(dim, order)
        torch_spec = to_sharding_spec(layout)
        assert isinstance(torch_spec, ChunkShardingSpec)
        assert torch_spec.dim == dim
        assert [p.rank() for p in torch_spec.placements] == list(order)


@pytest.mark.rule("LAYOUT-1", "CONVERT-2")
def test_infer_chunk_case_with_upstream_past_the_end_offset() -> None:
    # upstream's own shard list for (5, 15, 16) on dim 0 has the empty chunk at offset 6,
    # past the end: refused, and the converter says where that offset comes from.
    md = [
        ShardMetadata([0, 0, 0], [2, 15, 16], "rank:0/cpu"),
        ShardMetadata([2, 0, 0], [2, 15, 16], "rank:1/cpu"),
        ShardMetadata([4, 0, 0], [1, 15, 16], "rank:2/cpu"),
        ShardMetadata([6, 0, 0], [0, 15, 16], "rank:3/cpu"),
    ]
    with pytest.raises(ConversionError, match=r"past the end.*from_sharding_spec"):
        from_shard_metadata(md, torch.Size([5, 15, 16]))
    raw = Layout(
        (5, 15, 16), [Shard(Box(m.shard_offsets, m.shard_sizes), i) for i, m in enumerate(md)]
    )
    with pytest.raises(LayoutError, match="out of bounds in dim 0") as err:
        raw.validate()
    assert err.value.shards == (3,)


# ---------------------------------------------------------------------------------------------
# test_sharding_spec.py: test_check_overlapping (validate_non_overlapping_shards_metadata)

OVERLAP_CASES = [
    # (shape, shard boxes, the shared box or None); shapes are the smallest that hold the boxes
    ((10, 5), [([0, 0], [5, 5]), ([5, 0], [5, 5])], None),
    ((9, 5), [([0, 0], [5, 5]), ([4, 0], [5, 5])], ([4, 0], [1, 5])),
    ((5, 9), [([0, 0], [5, 5]), ([0, 4], [5, 5])], ([0, 4], [5, 1])),
    ((10, 10, 10), [([5, 0, 5], [5, 5, 5]), ([5, 5, 5], [5, 5, 5])], None),
    ((10, 9, 10), [([5, 0, 5], [5, 5, 5]), ([5, 4, 5], [5, 5, 5])], ([5, 4, 5], [5, 1, 5])),
    ((10, 9, 14), [([5, 0, 5], [5, 5, 5]), ([5, 4, 9], [5, 5, 5])], ([5, 4, 9], [5, 1, 1])),
]


@pytest.mark.rule("BOX-4", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.parametrize(("shape", "boxes", "shared"), OVERLAP_CASES)
def test_check_overlapping(
    shape: tuple[int, ...],
    boxes: list[tuple[list[int], list[int]]],
    shared: tuple[list[int], list[int]] | None,
) -> None:
    # upstream: TestShardingSpec.test_check_overlapping. Overlap verdicts agree. Our validate
    # also checks coverage; the 3-D cases leave most of the tensor uncovered, and a layout
    # that overlaps AND leaves a gap is reported as the overlap (it names both shards).
    a, b = (Box(o, s) for o, s in boxes)
    want = None if shared is None else Box(*shared)
    assert a.intersect(b) == want == b.intersect(a)
    brute = box_points(a) & box_points(b)
    assert brute == (set() if want is None else box_points(want))
    layout = layout_of(shape, boxes)
    covered = box_points(a) | box_points(b)
    if want is not None:
        with pytest.raises(LayoutError, match="overlap") as err:
            layout.validate()
        assert (err.value.kind, err.value.shards) == ("overlap", (0, 1))
        assert str(want) in str(err.value)
    elif covered == set(points(shape)):
        layout.validate()
    else:
        with pytest.raises(LayoutError, match="do not cover") as err:
            layout.validate()
        assert err.value.kind == "gap"


@st.composite
def _loose_layouts(draw: st.DrawFn) -> Layout:
    """Arbitrary in-bounds boxes, one rank each: overlaps, gaps, both, neither."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    shards = []
    for rank in range(draw(st.integers(1, 5))):
        offs, sizes = [], []
        for n in shape:
            o = draw(st.integers(0, n))
            offs.append(o)
            sizes.append(draw(st.integers(0, n - o)))
        shards.append(Shard(Box(offs, sizes), rank))
    return Layout(shape, shards)


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3")
@given(_loose_layouts())
def test_overlap_is_reported_before_gap(layout: Layout) -> None:
    # A layout that overlaps is reported as an overlap whether or not it also has a gap
    # (upstream's overlap checks run without a coverage check; the fix for the case of
    # test_check_overlapping's 3-D shards and TestValidateGlobalPlan's [0,2) + [1,3) of 4).
    boxes = [s.box for s in layout.shards]
    overlapping = any(
        a != b and box_points(a) & box_points(b) for a, b in itertools.combinations(boxes, 2)
    )
    covered = set().union(*(box_points(b) for b in boxes))
    try:
        layout.validate()
    except LayoutError as e:
        if overlapping:
            assert e.kind == "overlap", str(e)
            i, j = e.shards
            assert box_points(layout.shards[i].box) & box_points(layout.shards[j].box)
        else:
            assert e.kind == "gap", str(e)
            assert e.point is not None and e.point not in covered
    else:
        assert not overlapping and is_valid(layout)


# ---------------------------------------------------------------------------------------------
# test_sharding_spec.py: TestCustomShardingSpec (GridShardingSpec)


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3", "SPEC-3", "DTENSOR-1")
def test_custom_grid_sharding_spec() -> None:
    # upstream: test_custom_sharding_spec, a grid spec with grid_size 4 on an 8 x 8 tensor:
    # 4 x 4 blocks, placement row * 2 + col. Valid (check_tensor accepts it there), not a
    # chunking of one dim, and the layout DTensor gives with [Shard(0), Shard(1)] on a 2 x 2 mesh.

    grid = 4
    shards = [
        Shard(Box((r * grid, c * grid), (grid, grid)), r * 2 + c)
        for r, c in itertools.product(range(2), range(2))
    ]
    layout = Layout(torch.Size([8, 8]), shards).validate()
    assert isinstance(infer_spec(layout), EnumerableSpec)
    assert layout == dtensor_layout((8, 8), [[0, 1], [2, 3]], [DShard(0), DShard(1)])
    check_tensor(to_shard_metadata(layout), torch.Size([8, 8]))


# ---------------------------------------------------------------------------------------------
# test_tp_fsdp_shard_metadata.py: TestGetBoxForUnevenShards (_get_box_for, fixed upstream to
# follow torch.chunk; DESIGN.md records the floor-division version it replaced)


@pytest.mark.rule("CHUNK-1", "CHUNK-2", "DTENSOR-1")
@pytest.mark.parametrize(
    ("n", "offsets", "sizes"),
    [
        (5, [0, 2, 4], [2, 2, 1]),
        (7, [0, 3, 6], [3, 3, 1]),
        (10, [0, 4, 8], [4, 4, 2]),
        (6, [0, 2, 4], [2, 2, 2]),
        (1, [0, 1, 1], [1, 0, 0]),
    ],
)
def test_get_box_for_uneven_shards(n: int, offsets: list[int], sizes: list[int]) -> None:
    # upstream: test_get_box_for_shard_offsets; expected values agree (the empty shards of
    # 1 over 3 sit at offset n = 1, CHUNK-2)

    want = [Box((o,), (s,)) for o, s in zip(offsets, sizes)]
    assert [b for r in range(3) for b in chunk_layout((n,), 0, [0, 1, 2]).boxes_of(r)] == want
    dt = dtensor_layout((n,), [0, 1, 2], [DShard(0)])
    assert [b for r in range(3) for b in dt.boxes_of(r)] == want
    chunks = torch.chunk(torch.arange(n), 3)
    for r, box in enumerate(want):  # brute force: what torch.chunk hands rank r
        got = chunks[r].tolist() if r < len(chunks) else []
        assert got == list(range(box.offsets[0], box.offsets[0] + box.sizes[0]))


@pytest.mark.rule("DTENSOR-1", "DTENSOR-3")
def test_get_box_for_replicate_and_dim1() -> None:
    # upstream: test_get_box_for_replicated_placement, test_get_box_for_multidim_non_zero_shard_dim

    rep = dtensor_layout((5,), [0, 1, 2], [Replicate()])
    assert [rep.boxes_of(r) for r in range(3)] == [(Box((0,), (5,)),)] * 3
    col = dtensor_layout((4, 7), [0, 1, 2], [DShard(1)])
    assert [col.boxes_of(r)[0] for r in range(3)] == [
        Box((0, 0), (4, 3)),
        Box((0, 3), (4, 3)),
        Box((0, 6), (4, 1)),
    ]
    assert col == chunk_layout((4, 7), 1, [0, 1, 2])


# ---------------------------------------------------------------------------------------------
# test_planner.py (DCP)


def _sharded_tensor_md(
    world_size: int, shards_per_rank: int, shard_size: int = 8
) -> list[ShardMetadata]:
    """The ShardMetadata of upstream's create_sharded_tensor helper."""
    return [
        ShardMetadata([i * shard_size], [shard_size], f"rank:{i // shards_per_rank}/cpu")
        for i in range(world_size * shards_per_rank)
    ]


@pytest.mark.rule("CONVERT-1", "CONVERT-6", "CONVERT-7")
@pytest.mark.parametrize("shards_per_rank", [1, 2])
def test_planner_sharded_tensor_chunks(shards_per_rank: int) -> None:
    # upstream: TestSavePlan.test_local_plan (rank 1 of 4 writes the chunk at [8], size [8])
    # and test_global_plan (the metadata lists every chunk); also 2 shards per rank.
    md = _sharded_tensor_md(4, shards_per_rank)
    layout = from_shard_metadata(md, torch.Size([8 * len(md)]))
    mine = to_chunk_list(layout, 1)
    want = [(8 * i, 8) for i in range(len(md)) if i // shards_per_rank == 1]
    assert [(c.offsets, c.sizes) for c in mine] == [
        (torch.Size([o]), torch.Size([s])) for o, s in want
    ]
    storage = to_tensor_storage_metadata(layout)
    assert [(c.offsets[0], c.sizes[0]) for c in storage.chunks] == [
        (8 * i, 8) for i in range(len(md))
    ]
    owners = [i // shards_per_rank for i in range(len(md))]
    assert from_tensor_storage_metadata(storage, ranks=owners) == layout


def _read_pieces(
    dest: Box, stored: list[Box]
) -> list[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(stored chunk index, storage offsets, dest offsets, lengths) of each piece ``dest``
    reads, from box intersection alone."""
    out = []
    for i, box in enumerate(stored):
        common = dest.intersect(box)
        if common is not None:
            out.append(
                (i, common.relative_to(box).offsets, common.relative_to(dest).offsets, common.sizes)
            )
    return out


@pytest.mark.rule("BOX-4", "CONVERT-6")
def test_create_read_item_from_chunks() -> None:
    # upstream: TestPlannerHelpers.test_create_read_item_from_chunks: 16 elements stored as
    # [0, 8) + [8, 16), read into [4, 11): storage offset 4 length 4, then storage offset 0
    # length 3 at dest offset 4.
    stored = chunk_layout((16,), 0, [0, 1])
    dest = Box((4,), (7,))
    want = [(0, (4,), (0,), (4,)), (1, (0,), (4,), (3,))]
    assert _read_pieces(dest, [s.box for s in stored.shards]) == want
    md = to_tensor_storage_metadata(stored)
    items = create_read_items_for_chunk_list(
        "foo", md, [ChunkStorageMetadata(torch.Size([4]), torch.Size([7]))]
    )
    got = [
        (
            tuple(ri.storage_index.offset),
            tuple(ri.storage_offsets),
            tuple(ri.dest_offsets),
            tuple(ri.lengths),
        )
        for ri in items
    ]
    assert got == [((0,), (4,), (0,), (4,)), ((8,), (0,), (4,), (3,))]


@pytest.mark.rule("BOX-4", "CHUNK-1")
@pytest.mark.parametrize(
    ("n", "saved_world", "loaded_world", "want"),
    [
        # test_load_with_resharding, 8 -> 4: rank 1 holds [32, 64), reads two whole chunks
        (128, 8, 4, [(2, (0,), (0,), (16,)), (3, (0,), (16,), (16,))]),
        # test_load_with_resharding, 4 -> 8: rank 1 holds [16, 32), the upper half of chunk 0
        (128, 4, 8, [(0, (16,), (0,), (16,))]),
        # test_load_with_world_size_diff_by_one, 4 -> 3: rank 1 holds [40, 80)
        (120, 4, 3, [(1, (10,), (0,), (20,)), (2, (0,), (20,), (20,))]),
    ],
)
def test_load_with_resharding(
    n: int, saved_world: int, loaded_world: int, want: list[tuple[int, ...]]
) -> None:
    # upstream: TestSavePlan.test_load_with_resharding / test_load_with_world_size_diff_by_one
    # (even shards of n // world, which here is the chunk layout); expected pieces agree.
    saved = chunk_layout((n,), 0, range(saved_world))
    loaded = chunk_layout((n,), 0, range(loaded_world))
    (dest,) = loaded.boxes_of(1)
    assert _read_pieces(dest, [s.box for s in saved.shards]) == want


@pytest.mark.rule("LAYOUT-2", "CONVERT-6")
def test_validate_global_plan_cases() -> None:
    # upstream: TestValidateGlobalPlan. Four unit chunks of 4 are valid; [0, 2) + [1, 3) of 4
    # overlap (and leave [3, 4) uncovered): reported as the overlap, as upstream does.
    from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

    def md(chunks: list[tuple[int, int]]) -> TensorStorageMetadata:
        return TensorStorageMetadata(
            properties=TensorProperties(dtype=torch.float32),
            size=torch.Size([4]),
            chunks=[ChunkStorageMetadata(torch.Size([o]), torch.Size([s])) for o, s in chunks],
        )

    units = from_tensor_storage_metadata(md([(i, 1) for i in range(4)]))
    assert units == chunk_layout((4,), 0, [0, 1, 2, 3])
    with pytest.raises(LayoutError, match="overlap") as err:
        from_tensor_storage_metadata(md([(0, 2), (1, 2)]))
    assert (err.value.kind, err.value.shards) == ("overlap", (0, 1))


# ---------------------------------------------------------------------------------------------
# Arguments as upstream code hands them over: torch.Size shapes, numpy / torch integers,
# negative dims (ChunkShardingSpec(-1, ...)).


@pytest.mark.rule("BOX-1", "SPEC-1", "CHUNK-3")
def test_upstream_argument_types_are_accepted() -> None:
    shape = torch.Size([4, 6])
    assert chunk_layout(shape, -1, [0, 1]) == chunk_layout((4, 6), 1, [0, 1])
    assert ChunkSpec(-1, [0, 1]).layout(shape) == chunk_layout((4, 6), 1, [0, 1])
    # integers from numpy and torch (ranks read off a mesh tensor, dims off a spec)
    spec = ChunkSpec(np.int64(0), torch.arange(2))
    assert (spec.dim, spec.ranks) == (0, (0, 1))
    assert type(spec.dim) is int
    assert chunk_layout(shape, torch.tensor(1), [0, 1]) == chunk_layout((4, 6), 1, [0, 1])
    s = Shard(Box(torch.tensor([0, 1]), torch.Size([2, 2])), np.int64(3))
    assert s == Shard(Box((0, 1), (2, 2)), 3)
    assert type(s.rank) is int
    assert Shard(Box((0,), (1,)), torch.tensor(2)).rank == 2
    assert Layout(shape, chunk_layout(shape, 0, [0, 1]).shards).validate().shape == (4, 6)


@pytest.mark.rule("BOX-1", "SPEC-1", "CHUNK-3")
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: chunk_layout((4, 4), True, [0, 1]), "chunk dim must be an int"),
        (lambda: chunk_layout((4, 4), 1.0, [0, 1]), "chunk dim must be an int"),
        (lambda: ChunkSpec(np.float64(0.0), [0]), "ChunkSpec dim must be an int"),
        (lambda: Shard(Box((0,), (1,)), np.bool_(True)), "rank must be a non-negative int"),
        (lambda: Shard(Box((0,), (1,)), np.int64(-1)), "rank must be a non-negative int"),
        (lambda: Shard(Box((0,), (1,)), 1.0), "rank must be a non-negative int"),
        (lambda: chunk_layout(5, 0, [0]), "shape must be a sequence of integers, got 5"),
        (lambda: Box(0, 1), "must be a sequence of integers"),
        (lambda: Box([torch.tensor([0, 1])], [1]), "must be integers"),
    ],
)
def test_upstream_argument_types_are_refused_clearly(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LayoutError, match=match):
        call()


@pytest.mark.rule("SPEC-1", "CONVERT-4", "SPEC-3")
def test_chunked_sharding_spec_valid_specs() -> None:
    # upstream: TestShardingSpec.test_chunked_sharding_spec: valid specs include a negative
    # dim (-1) and the same rank twice ("rank:0/cuda:0", "rank:0/cuda:1"). The torch spec
    # reads as a layout with two boxes on rank 0 (an enumerable spec), the layout chunk_layout
    # gives for ranks [0, 0]; ChunkSpec, one box per rank, refuses the repeated rank.
    neg = from_sharding_spec(ChunkShardingSpec(-1, ["rank:0/cpu", "rank:1/cpu"]), (3, 5))
    assert neg == chunk_layout((3, 5), 1, [0, 1]) == ChunkSpec(-1, [0, 1]).layout((3, 5))
    twice = from_sharding_spec(ChunkShardingSpec(0, ["rank:0/cpu", "rank:0/cpu"]), (5, 2))
    assert twice.boxes_of(0) == (Box((0, 0), (3, 2)), Box((3, 0), (2, 2)))
    assert twice == chunk_layout((5, 2), 0, [0, 0])
    assert isinstance(infer_spec(twice), EnumerableSpec)
    with pytest.raises(LayoutError, match="name a rank twice"):
        ChunkSpec(0, [0, 0])
    with pytest.raises(ConversionError, match="without a rank"):
        from_sharding_spec(ChunkShardingSpec(0, ["cpu", "cpu"]), (4,))


@pytest.mark.rule("CHUNK-1", "CHUNK-2", "DTENSOR-1")
def test_chunk_bounds_match_dtensor_shard_size_and_offset() -> None:
    # torch's Shard.local_shard_size_and_offset (what compute_local_shape_and_global_offset
    # calls per mesh dim), for every size up to 20 over 1..8 chunks: the same sizes, and the
    # same offsets, empty chunks included (at n).

    for n in range(21):
        for k in range(1, 9):
            for i, (start, stop) in enumerate(chunk_bounds(n, k)):
                size, offset = DShard.local_shard_size_and_offset(n, k, i)
                assert (int(size), int(offset)) == (stop - start, start), (n, k, i)


# ---------------------------------------------------------------------------------------------
# test_sharded_tensor.py: init_from_local_shards with a 2 x 2 grid of 5 x 5 shards of 10 x 10


def _grid_md(rank0_size: int) -> list[ShardMetadata]:
    return [
        ShardMetadata([r // 2 * 5, r % 2 * 5], [5, 5] if r else [rank0_size] * 2, f"rank:{r}/cpu")
        for r in range(4)
    ]


@pytest.mark.rule("CONVERT-1", "LAYOUT-2", "LAYOUT-3")
def test_init_from_local_shards_grid_cases() -> None:
    # upstream: test_init_from_local_shards (valid), ..._invalid_shards_overlap (rank 0 holds
    # 6 x 6: "overlap") and ..._invalid_shards_gaps (rank 0 holds 4 x 4: "does not match
    # tensor volume"; here the uncovered element is named).
    grid = from_shard_metadata(_grid_md(5), torch.Size([10, 10]))
    assert grid == dtensor_layout((10, 10), [[0, 1], [2, 3]], [DShard(0), DShard(1)])
    with pytest.raises(LayoutError, match="overlap") as over:
        from_shard_metadata(_grid_md(6), torch.Size([10, 10]))
    assert over.value.kind == "overlap" and 0 in over.value.shards
    with pytest.raises(LayoutError, match="do not cover") as gap:
        from_shard_metadata(_grid_md(4), torch.Size([10, 10]))
    assert gap.value.point is not None
    assert gap.value.point[0] < 5 and gap.value.point[1] < 5
    assert 4 in gap.value.point


@pytest.mark.rule("BOX-2", "LAYOUT-3", "SPEC-4", "CONVERT-6")
def test_init_from_local_shards_with_all_zeros() -> None:
    # upstream: test_init_from_local_shards_and_global_metadata_with_all_zeros: a (0, 0)
    # tensor, every rank holding the empty box at (0, 0). Valid; it is the chunk layout of
    # dim 0 over ranks 0..3 (the smallest dim, ranks ascending), and DCP stores one chunk.
    md = [ShardMetadata([0, 0], [0, 0], f"rank:{r}/cpu") for r in range(4)]
    layout = from_shard_metadata(md, torch.Size([0, 0]))
    assert infer_spec(layout) == ChunkSpec(0, (0, 1, 2, 3))
    storage = to_tensor_storage_metadata(layout)
    assert [(tuple(c.offsets), tuple(c.sizes)) for c in storage.chunks] == [((0, 0), (0, 0))]
    assert from_tensor_storage_metadata(storage, ranks=[(0, 1, 2, 3)]) == layout


# ---------------------------------------------------------------------------------------------
# test_dtensor_resharding.py: DCP saves a DTensor under one placement and loads it under another

_ONE_D = [[DShard(0)], [Replicate()]]
_TWO_D = [
    [Replicate(), Replicate()],
    [Replicate(), DShard(0)],
    [DShard(0), Replicate()],
    [DShard(0), DShard(0)],
]
_RESHARD_CASES = (
    [((4, 4), [0, 1, 2, 3], a, [0, 1, 2, 3], b) for a in _ONE_D for b in _ONE_D if a != b]
    + [((8, 8), [[0, 1], [2, 3]], a, [[0, 1], [2, 3]], b) for a in _TWO_D for b in _TWO_D if a != b]
    + [((8, 8), [0, 1, 2, 3], a, [[0, 1], [2, 3]], b) for a in _ONE_D for b in _TWO_D]
    + [((8, 8), [[0, 1], [2, 3]], a, [0, 1, 2, 3], b) for a in _TWO_D for b in _ONE_D]
)


@pytest.mark.rule("BOX-4", "CONVERT-6", "DTENSOR-3")
@pytest.mark.parametrize(("shape", "src_mesh", "src", "dst_mesh", "dst"), _RESHARD_CASES)
def test_dtensor_reshard_through_checkpoint(
    shape: tuple[int, int],
    src_mesh: list,
    src: list,
    dst_mesh: list,
    dst: list,  # type: ignore[type-arg]
) -> None:
    # upstream: TestDTensorReshardPlacementChange (1-D and 2-D placement changes) and
    # TestDTensorReshardMeshChange (1-D <-> 2-D meshes): arange data saved under one layout
    # and read under another. The checkpoint holds each distinct box once; every rank's new
    # box is exactly the union of its intersections with the stored chunks, and reading
    # them gives the rank its slice of the global tensor.
    saved = dtensor_layout(shape, src_mesh, src)
    storage = to_tensor_storage_metadata(saved)
    stored = [Box(tuple(c.offsets), tuple(c.sizes)) for c in storage.chunks]
    assert len(stored) == len({s.box for s in saved.shards})
    full = torch.arange(math.prod(shape)).view(shape)
    loaded = dtensor_layout(shape, dst_mesh, dst)
    for s in loaded.shards:
        out = torch.full(s.box.sizes, -1)
        for i, st_off, dst_off, lengths in _read_pieces(s.box, stored):
            piece = full[stored[i].slices()][
                tuple(slice(o, o + n) for o, n in zip(st_off, lengths))
            ]
            target = tuple(slice(o, o + n) for o, n in zip(dst_off, lengths))
            assert bool((out[target] == -1).all())  # each element read once
            out[target] = piece
        assert torch.equal(out, full[s.box.slices()])


@pytest.mark.rule("CHUNK-1", "SPEC-3")
def test_chunk_arithmetic_and_inference_refuse_non_layouts_clearly() -> None:
    # get_split_size / get_chunked_dim_size callers hand over torch.Size entries and numpy
    # ints; anything else is a LayoutError that names it, not a TypeError from deep inside.
    assert chunk_size(np.int64(11), torch.tensor(4)) == 3
    assert type(chunk_size(np.int64(11), 4)) is int
    assert chunk_bounds(torch.Size([5])[0], np.int64(4)) == [(0, 2), (2, 4), (4, 5), (5, 5)]
    for n, k, match in [
        (-1, 2, "non-negative"),
        (5, 0, "must be positive"),
        (None, 2, "chunked dim size must be an int"),
        (5, 1.5, "number of chunks must be an int"),
        (True, 2, "must be an int"),
        ([5], 2, "must be an int"),
    ]:
        with pytest.raises(LayoutError, match=match):
            chunk_bounds(n, k)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="infer_spec needs a Layout, got list"):
        infer_spec([Shard(Box((0,), (4,)), 0)])  # type: ignore[arg-type]


def _dcp_metadata() -> object:
    from torch.distributed.checkpoint.metadata import Metadata

    return Metadata(
        state_dict_metadata={"st": to_tensor_storage_metadata(chunk_layout((8,), 0, [0, 1]))}
    )


_LAYOUT = chunk_layout((4, 4), 0, [0, 1])
_MISUSE = [
    # the objects upstream code holds, handed to the wrong converter
    (
        lambda: to_sharding_spec(to_shard_metadata(_LAYOUT)),
        LayoutError,
        "to_sharding_spec needs a Layout, got list",
    ),
    (
        lambda: to_tensor_storage_metadata(ChunkShardingSpec(0, ["rank:0/cpu"])),
        LayoutError,
        "needs a Layout, got ChunkShardingSpec",
    ),
    (lambda: to_chunk_list([_LAYOUT], 0), LayoutError, "to_chunk_list needs a Layout"),
    (lambda: to_chunk_list(_LAYOUT, [0]), ConversionError, "rank must hold ranks"),
    (
        lambda: from_shard_metadata(ChunkShardingSpec(0, ["rank:0/cpu"]), (4,)),
        ConversionError,
        "from_sharding_spec",
    ),
    (
        lambda: from_shard_metadata(to_sharded_tensor_metadata(_LAYOUT), (4, 4)),
        ConversionError,
        "from_sharded_tensor_metadata",
    ),
    (
        lambda: from_shard_metadata([Box((0,), (4,))], (4,)),
        ConversionError,
        "shard #0 is a Box, not a ShardMetadata",
    ),
    (lambda: from_shard_metadata(None, (4,)), ConversionError, "got NoneType"),
    (
        lambda: from_tensor_storage_metadata(_dcp_metadata()),
        ConversionError,
        r"state_dict_metadata\[fqn\]",
    ),
    (lambda: from_tensor_storage_metadata(_LAYOUT), ConversionError, "got Layout"),
    (
        lambda: from_tensor_storage_metadata(to_tensor_storage_metadata(_LAYOUT), ranks=3),
        ConversionError,
        "ranks must be a sequence",
    ),
    (
        lambda: layout_to_json(_LAYOUT.shards),
        LayoutError,
        "layout_to_json needs a Layout, got tuple",
    ),
    (lambda: render(None), LayoutError, "render needs a Layout, got NoneType"),
    (lambda: Box((0,), (1,)).intersect((0, 1)), LayoutError, "it is not a Box"),
    (lambda: Box((0,), (1,)).relative_to(None), LayoutError, "relative to a Box"),
    (lambda: Box.from_bounds(None, None), LayoutError, "must be a sequence of integers"),
    (lambda: _LAYOUT.with_ranks({0: 5}), LayoutError, "gives no new rank for rank 1"),
    (lambda: Layout.replicated((2,), 3), LayoutError, "ranks must be a sequence of integers"),
]


@pytest.mark.rule("CONVERT-1", "CONVERT-6", "CONVERT-7", "BOX-4")
@pytest.mark.parametrize(("call", "error", "match"), _MISUSE)
def test_misuse_is_refused_with_a_pointer(call, error: type, match: str) -> None:  # type: ignore[no-untyped-def]
    # Was AttributeError / TypeError / KeyError from deep inside; now the error names what
    # came instead and, where there is one, the converter that takes it.
    with pytest.raises(error, match=match):
        call()


@pytest.mark.rule("CONVERT-7")
def test_to_chunk_list_takes_numpy_and_torch_ranks() -> None:
    # DCP hooks get their rank from dist.get_rank() or a mesh tensor
    want = [(c.offsets, c.sizes) for c in to_chunk_list(_LAYOUT, 1)]
    for rank in (np.int64(1), torch.tensor(1)):
        assert [(c.offsets, c.sizes) for c in to_chunk_list(_LAYOUT, rank)] == want
    assert want == [(torch.Size([2, 0]), torch.Size([2, 4]))]
