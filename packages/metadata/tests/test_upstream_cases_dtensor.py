"""DTensor cases taken from PyTorch's own tests, run against shardspec.metadata.

Upstream files: test/distributed/tensor/test_utils.py (LocalTest, UtilTest,
TestStridedSharding, Test2DStridedLocalShard). Each test names the upstream test it is derived
from. Expectations are upstream's hand-worked numbers where they agree with the spec, and are
also checked against a brute-force split of a real tensor (``dtensor_oracle.local_tensor``:
torch.chunk and the strided rule applied mesh dim by mesh dim). Where the spec deliberately
differs from upstream's numbers the test says so:

- a nested empty shard sits at the end of the piece it was cut from (DTENSOR-6); upstream
  reports the global dim size;
- a local tensor that is not one block is several boxes (DTENSOR-7); upstream reports one
  shape and one offset (the shape agrees with ours, the offset is our first box's).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from dtensor_oracle import arange, assemble, coords, device_mesh, local_tensor
from metadata_oracle import is_valid
from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard

from shardspec.metadata import Box, ConversionError, Layout, chunk_layout
from shardspec.metadata.dtensor import (
    dtensor_layout,
    dtensor_local_box,
    dtensor_local_boxes,
    to_dtensor_placements,
)

Expect = Callable[[tuple[int, ...]], tuple[int, int]]  # coordinate -> (dim-0 size, offset)


def ss(dim: int, f: int) -> _StridedShard:
    return _StridedShard(dim, split_factor=f)


def local_shape(boxes: Sequence[Box]) -> tuple[int, ...]:
    """The local tensor's shape: per dim, the total length of the box grid's intervals."""
    nd = boxes[0].ndim
    return tuple(sum(s for _, s in {(b.offsets[d], b.sizes[d]) for b in boxes}) for d in range(nd))


def check_against_oracle(shape: Sequence[int], mesh_shape: Sequence[int], placements: Any) -> None:
    for c in coords(mesh_shape):
        boxes = dtensor_local_boxes(shape, mesh_shape, placements, c)
        want = local_tensor(shape, mesh_shape, placements, c)
        got = assemble(shape, boxes)
        assert got.shape == want.shape and torch.equal(got, want), (c, boxes)


# ---------------------------------------------------------------------------------------------
# test_utils.py: LocalTest.test_compute_local_shape_and_global_offset_uneven


def _s_s_18(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    if dp < 3:
        return (3, 5 * dp) if tp == 0 else (2, 5 * dp + 3)
    return (2, 15) if tp == 0 else (1, 17)


def _s_s_13(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    if dp < 3:
        return (2, 4 * dp) if tp == 0 else (2, 4 * dp + 2)
    return (1, 12) if tp == 0 else (0, 13)  # empty: offset n (parent's end is n too)


def _ss_s_18(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    return (0, 18) if dp == 3 else (3, tp * 9 + 3 * dp)


def _ss_ss_39(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    if dp < 3:
        return (8, 4 * dp) if tp == 0 else (4, 4 * dp + 2)
    return (3, 12) if tp == 0 else (0, 39)


def _s_ss_18(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    if dp < 3:
        return (3, 5 * dp) if tp == 0 else (2, 5 * dp + 2)
    return (2, 15) if tp == 0 else (1, 16)


def _s_ss_s_39(c: tuple[int, ...]) -> tuple[int, int]:
    m0, m1, m2 = c
    if m0 < 3:
        if m1 == 0:
            return (2, 10 * m0 + (0, 2, 6)[m2])
        # (m0, 1, 2) is empty: upstream says offset 39; the piece it is cut from,
        # [10*m0 + 3, 10*m0 + 5) + [10*m0 + 8, 10*m0 + 10), ends at 10*m0 + 10 (DTENSOR-6)
        return (2, 10 * m0 + 3) if m2 == 0 else (2, 10 * m0 + 8) if m2 == 1 else (0, 10 * m0 + 10)
    if m1 == 0:
        return (2, 30 + 2 * m2) if m2 < 2 else (1, 36)
    return (2, 33) if m2 == 0 else (2, 37) if m2 == 1 else (0, 39)


def _fsdp_tp_4096(c: tuple[int, ...]) -> tuple[int, int]:
    dp, tp = c
    if dp == 29:
        return (0, 4096)
    return (8 if dp == 28 else 18, tp * 512 + 18 * dp)


LOCAL_CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], list[Any], Expect]] = [
    ("ss_s_4096", (4096, 4096), (30, 8), [ss(0, 8), Shard(0)], _fsdp_tp_4096),
    ("s_s_18", (18, 2), (4, 2), [Shard(0), Shard(0)], _s_s_18),
    ("s_s_13", (13, 2), (4, 2), [Shard(0), Shard(0)], _s_s_13),
    ("ss_s_18", (18, 2), (4, 2), [ss(0, 2), Shard(0)], _ss_s_18),
    ("ss_ss_39", (39, 2), (4, 2), [ss(0, 3), ss(0, 4)], _ss_ss_39),
    ("s_ss_18", (18, 2), (4, 2), [Shard(0), ss(0, 2)], _s_ss_18),
    ("s_ss_s_39", (39, 2), (4, 2, 3), [Shard(0), ss(0, 2), Shard(0)], _s_ss_s_39),
]


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-4", "DTENSOR-5", "DTENSOR-6", "DTENSOR-7")
@pytest.mark.parametrize(
    ("shape", "mesh_shape", "placements", "expect"),
    [c[1:] for c in LOCAL_CASES],
    ids=[c[0] for c in LOCAL_CASES],
)
def test_compute_local_shape_and_global_offset_uneven(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: list[Any], expect: Expect
) -> None:
    # upstream: LocalTest.test_compute_local_shape_and_global_offset_uneven; each case's
    # expected dim-0 size and offset per coordinate, with the spec's offset for nested empty
    # shards (see _s_ss_s_39). Local shape = our boxes' grid; offset = our first box's.
    layout = dtensor_layout(
        shape, torch.arange(len(coords(mesh_shape))).view(mesh_shape), placements
    )
    assert layout.is_valid()
    for flat, c in enumerate(coords(mesh_shape)):
        size, offset = expect(c)
        boxes = dtensor_local_boxes(shape, mesh_shape, placements, c)
        assert layout.boxes_of(flat) == boxes
        assert local_shape(boxes) == (size, shape[1]), c
        assert boxes[0].offsets == (offset, 0), c
        if len(boxes) == 1:
            assert dtensor_local_box(shape, mesh_shape, placements, c) == boxes[0]
    if shape[0] < 100:
        check_against_oracle(shape, mesh_shape, placements)


@pytest.mark.rule("DTENSOR-7")
def test_strided_multi_block_local_tensor_refused_as_one_box() -> None:
    # upstream reports (Shard(0), _StridedShard(0, 2)) on 18 rows at coordinate (0, 0) as
    # shape 3 at offset 0, but the rank holds rows 0, 1 and 3: two boxes, not one.
    boxes = dtensor_local_boxes((18, 2), (4, 2), [Shard(0), ss(0, 2)], (0, 0))
    assert boxes == (Box((0, 0), (2, 2)), Box((3, 0), (1, 2)))
    with pytest.raises(ConversionError, match="not one block"):
        dtensor_local_box((18, 2), (4, 2), [Shard(0), ss(0, 2)], (0, 0))


# ---------------------------------------------------------------------------------------------
# test_utils.py: UtilTest


@pytest.mark.rule("DTENSOR-1", "DTENSOR-3", "DTENSOR-5", "CHUNK-2")
@pytest.mark.parametrize("placement", [Shard(0), Replicate()])
def test_compute_local_shape_and_global_offset_1d(placement: Any) -> None:
    # upstream: UtilTest.test_compute_local_shape_and_global_offset_1D: sizes 0..16 on a
    # world of 8 (empty shards on some or all ranks, uneven and even splits); the box slices
    # exactly the local tensor.
    for n in range(2 * 8 + 1):
        for r in range(8):
            box = dtensor_local_box(torch.Size([n]), (8,), [placement], [r])
            want = local_tensor((n,), (8,), [placement], (r,))
            assert torch.equal(arange((n,))[box.slices()], want)
        if isinstance(placement, Shard):
            assert dtensor_layout((n,), list(range(8)), [placement]) == chunk_layout(
                (n,), 0, range(8)
            )


@pytest.mark.rule("DTENSOR-1", "DTENSOR-2", "DTENSOR-3", "DTENSOR-5")
@pytest.mark.parametrize(
    "placements",
    list(itertools.combinations_with_replacement([Shard(0), Shard(1), Replicate()], 2)),
    ids=str,
)
def test_compute_local_shape_and_global_offset_2d(placements: tuple[Any, Any]) -> None:
    # upstream: UtilTest.test_compute_local_shape_and_global_offset_2D: a 2 x 4 mesh, dim 0 of
    # size 1..8 and 64 // d * d elements
    for d0 in range(1, 9):
        shape = (d0, 64 // d0)
        layout = dtensor_layout(shape, torch.arange(8).view(2, 4), list(placements))
        assert is_valid(layout)
        for flat, c in enumerate(coords((2, 4))):
            box = dtensor_local_box(shape, (2, 4), placements, c)
            assert layout.boxes_of(flat) == (box,)
            assert torch.equal(
                arange(shape)[box.slices()], local_tensor(shape, (2, 4), placements, c)
            )


@pytest.mark.rule("DTENSOR-2", "DTENSOR-4", "DTENSOR-5")
def test_compute_local_shape_and_global_offset_3d() -> None:
    # upstream: UtilTest.test_compute_local_shape_and_global_offset_3D (world 8, mesh 2x2x2,
    # (16, 16), [_StridedShard(0, 2), Shard(0), Shard(0)]): shape (2, 16) at
    # 4*m0 + 8*m1 + 2*m2. (Older upstream versions refused Shard after the strided part,
    # test_strided_sharding_assumption_in_meta_compute; the spec defines it.)
    placements = [ss(0, 2), Shard(0), Shard(0)]
    for m0, m1, m2 in coords((2, 2, 2)):
        box = dtensor_local_box((16, 16), (2, 2, 2), placements, (m0, m1, m2))
        assert box == Box((4 * m0 + 8 * m1 + 2 * m2, 0), (2, 16))
    check_against_oracle((16, 16), (2, 2, 2), placements)


@pytest.mark.rule("DTENSOR-4", "DTENSOR-5", "DTENSOR-7")
def test_compute_local_shape_and_global_offset_4d() -> None:
    # upstream: UtilTest.test_compute_local_shape_and_global_offset_4D (mesh 1x2x2x2, (16, 16))
    mesh = (1, 2, 2, 2)
    first = [ss(0, 2), ss(1, 2), Shard(0), Shard(1)]
    for m0, m1, m2, m3 in coords(mesh):
        box = dtensor_local_box((16, 16), mesh, first, (m0, m1, m2, m3))
        assert box == Box((8 * m2 + 4 * m0, 8 * m3 + 4 * m1), (8, 4))
    check_against_oracle((16, 16), mesh, first)
    # Second case: upstream's shape (4, 8) and offset (8*m2 + 4*m3, 4*m1); dim 1 of the local
    # tensor is two runs ([4*m1, 4*m1 + 4) and 8 further on), so it is two boxes.
    second = [ss(0, 2), ss(1, 2), Shard(0), Shard(0)]
    for m0, m1, m2, m3 in coords(mesh):
        boxes = dtensor_local_boxes((16, 16), mesh, second, (m0, m1, m2, m3))
        row = 8 * m2 + 4 * m3
        assert boxes == (Box((row, 4 * m1), (4, 4)), Box((row, 4 * m1 + 8), (4, 4)))
        assert local_shape(boxes) == (4, 8)
    check_against_oracle((16, 16), mesh, second)


@pytest.mark.rule("DTENSOR-3", "DTENSOR-4", "DTENSOR-5")
def test_fsdp_tp_and_hsdp_tp_meta_compute() -> None:
    # upstream: UtilTest.test_fsdp_tp_meta_compute, test_uneven_fsdp_tp_meta_compute,
    # test_hsdp_tp_meta_compute (world 8); expected values agree.
    even = dtensor_layout((16, 2), torch.arange(8).view(4, 2), [ss(0, 2), Shard(0)])
    for rank, (dp, tp) in enumerate(coords((4, 2))):
        assert even.boxes_of(rank) == (Box(((tp * 4 + dp) * 2, 0), (2, 2)),)
    uneven = dtensor_layout(torch.Size([15, 5]), torch.arange(8).view(4, 2), [ss(0, 2), Shard(0)])
    sizes = [2, 2, 2, 2, 2, 2, 2, 1]
    offsets = [0, 8, 2, 10, 4, 12, 6, 14]
    for rank in range(8):
        assert uneven.boxes_of(rank) == (Box((offsets[rank], 0), (sizes[rank], 5)),)
    hsdp = dtensor_layout((8, 2), torch.arange(8).view(2, 2, 2), [Replicate(), ss(0, 2), Shard(0)])
    for rank, (_, dps, tp) in enumerate(coords((2, 2, 2))):
        assert hsdp.boxes_of(rank) == (Box(((tp * 2 + dps) * 2, 0), (2, 2)),)
    for layout in (even, uneven, hsdp):
        assert is_valid(layout)


# ---------------------------------------------------------------------------------------------
# test_utils.py: TestStridedSharding, Test2DStridedLocalShard


@pytest.mark.rule("DTENSOR-4", "DTENSOR-7")
def test_1d_mesh_strided_sharding() -> None:
    # upstream: TestStridedSharding.test_1d_mesh_strided_sharding: arange(8) on 4 ranks.
    # split_factor 1 is Shard(0): [0, 1 | 2, 3 | 4, 5 | 6, 7]; split_factor 2 gives rank r
    # rows r and r + 4: [0, 4 | 1, 5 | 2, 6 | 3, 7].
    plain = dtensor_layout((8,), [0, 1, 2, 3], [ss(0, 1)])
    assert (
        plain == dtensor_layout((8,), [0, 1, 2, 3], [Shard(0)]) == chunk_layout((8,), 0, range(4))
    )
    strided = dtensor_layout((8,), [0, 1, 2, 3], [ss(0, 2)])
    for r in range(4):
        assert strided.boxes_of(r) == (Box((r,), (1,)), Box((r + 4,), (1,)))
    assert is_valid(strided)


@pytest.mark.rule("DTENSOR-2", "DTENSOR-4")
def test_2d_mesh_strided_sharding() -> None:
    # upstream: TestStridedSharding.test_2d_mesh_strided_sharding: arange(8) on a 2 x 2 mesh.
    # Contiguous: rank (a, b) holds [4a + 2b, 4a + 2b + 2). Strided (split_factor 2 on mesh
    # dim 0): mesh dim 0 gives [0, 1, 4, 5] and [2, 3, 6, 7]; mesh dim 1 halves those.
    mesh = [[0, 1], [2, 3]]
    contiguous = dtensor_layout((8,), mesh, [ss(0, 1), ss(0, 1)])
    for r, (a, b) in enumerate(coords((2, 2))):
        assert contiguous.boxes_of(r) == (Box((4 * a + 2 * b,), (2,)),)
    strided = dtensor_layout((8,), mesh, [ss(0, 2), ss(0, 1)])
    assert [strided.boxes_of(r) for r in range(4)] == [
        (Box((0,), (2,)),),
        (Box((4,), (2,)),),
        (Box((2,), (2,)),),
        (Box((6,), (2,)),),
    ]


@pytest.mark.rule("DTENSOR-4")
def test_2d_mesh_2d_tensor_strided_sharding() -> None:
    # upstream: TestStridedSharding.test_2d_mesh_2d_tensor_strided_sharding: a (2, 4) tensor,
    # [_StridedShard(1, 2), Shard(1)]: ranks 0..3 hold columns 0, 2, 1, 3 ([[0], [4]], ...).
    layout = dtensor_layout((2, 4), [[0, 1], [2, 3]], [ss(1, 2), ss(1, 1)])
    assert [layout.boxes_of(r) for r in range(4)] == [(Box((0, c), (2, 1)),) for c in (0, 2, 1, 3)]


@pytest.mark.rule("DTENSOR-4", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.parametrize("size", [2, 3, 5, 11])
def test_2d_mesh_uneven_strided_shard(size: int) -> None:
    # upstream: TestStridedSharding.test_2d_mesh_uneven_strided_shard: full_tensor() of
    # (1, size) under [_StridedShard(1, 2), Shard(1)] on a 2 x 2 mesh gives the tensor back,
    # i.e. the pieces cover it exactly once.
    placements = [ss(1, 2), Shard(1)]
    layout = dtensor_layout((1, size), [[0, 1], [2, 3]], placements)
    assert is_valid(layout)
    check_against_oracle((1, size), (2, 2), placements)


@pytest.mark.rule("DTENSOR-2", "DTENSOR-4", "DTENSOR-9")
def test_fsdp_tp_2d_dtensor_local_shards_and_offsets() -> None:
    # upstream: Test2DStridedLocalShard: arange(8).view(4, 2) on a 2 x 2 mesh. FSDP1 + TP,
    # [Shard(0), Shard(0)]: rank r holds row r. FSDP2 + TP, [_StridedShard(0, 2), Shard(0)]:
    # ranks 0..3 hold rows 0, 2, 1, 3 (upstream's "ideal offsets" comment).
    mesh = [[0, 1], [2, 3]]
    fsdp1 = dtensor_layout((4, 2), mesh, [Shard(0), Shard(0)])
    assert [fsdp1.boxes_of(r) for r in range(4)] == [(Box((r, 0), (1, 2)),) for r in range(4)]
    fsdp2 = dtensor_layout((4, 2), mesh, [ss(0, 2), Shard(0)])
    assert [fsdp2.boxes_of(r) for r in range(4)] == [(Box((r, 0), (1, 2)),) for r in (0, 2, 1, 3)]
    back = to_dtensor_placements(fsdp2, mesh)
    assert dtensor_layout((4, 2), mesh, list(back)) == fsdp2


# ---------------------------------------------------------------------------------------------
# Meshes and arguments as upstream callers pass them


@pytest.mark.rule("DTENSOR-1", "DTENSOR-5")
def test_local_box_takes_a_device_mesh_and_its_coordinate() -> None:
    # upstream callers write compute_local_shape_and_global_offset(shape, mesh, placements)
    # with a DeviceMesh; dtensor_local_box takes the mesh (DeviceMesh, tensor of ranks, nested
    # list) as well as its shape, and the coordinate as DeviceMesh.get_coordinate() gives it.
    placements = [ss(0, 2), Shard(0)]
    ranks = torch.arange(8).view(4, 2)
    offsets = [0, 8, 2, 10, 4, 12, 6, 14]  # test_uneven_fsdp_tp_meta_compute
    for rank in range(8):
        mesh = device_mesh(ranks, rank)
        coord = mesh.get_coordinate()
        want = Box((offsets[rank], 0), (1 if rank == 7 else 2, 5))
        assert dtensor_local_box(torch.Size([15, 5]), mesh, placements, coord) == want
        assert dtensor_local_box((15, 5), ranks, placements, torch.tensor(coord)) == want
        assert dtensor_local_box([15, 5], ranks.tolist(), placements, tuple(coord)) == want
        assert dtensor_local_box([15, 5], torch.Size([4, 2]), placements, coord) == want
    layout = dtensor_layout(torch.Size([15, 5]), device_mesh(ranks, 0), placements)
    assert [layout.boxes_of(r)[0].offsets[0] for r in range(8)] == offsets


@pytest.mark.rule("DTENSOR-1")
def test_placement_arguments_refused_clearly() -> None:
    with pytest.raises(ConversionError, match="placements must be a sequence"):
        dtensor_layout((4,), [0, 1], Shard(0))  # type: ignore[arg-type]
    with pytest.raises(ConversionError, match="coordinate must be non-negative"):
        dtensor_local_box((4,), (2,), [Shard(0)], (-1,))
    with pytest.raises(ConversionError, match=r"coordinate \(2,\) is not in a mesh"):
        dtensor_local_box((4,), (2,), [Shard(0)], (2,))
    with pytest.raises(ConversionError, match="one placement per mesh dim"):
        dtensor_local_box((4,), torch.arange(4), [Shard(0), Shard(0)], (0,))
    assert dtensor_local_box((4, 6), (2,), [Shard(-1)], (1,)) == Box((0, 3), (4, 3))
    assert isinstance(dtensor_layout((4,), [0, 1], (Shard(0),)), Layout)


@pytest.mark.rule("DTENSOR-1", "DTENSOR-5")
def test_coordinate_as_a_function_and_mesh_as_torch_size() -> None:
    # upstream: newer LocalTest versions call _compute_local_shape_and_global_offset(shape,
    # mesh_shape, lambda idx: my_coordinate[idx], placements); init_device_mesh(device,
    # mesh_shape) numbers a torch.Size mesh's ranks 0..n-1 row-major.
    placements = [ss(0, 2), Shard(0)]
    for c in coords((4, 2)):
        want = dtensor_local_box((18, 2), (4, 2), placements, c)
        assert dtensor_local_box((18, 2), (4, 2), placements, lambda i, c=c: c[i]) == want
    by_size = dtensor_layout((18, 2), torch.Size([4, 2]), placements)
    assert by_size == dtensor_layout((18, 2), torch.arange(8).view(4, 2), placements)
    with pytest.raises(ConversionError, match="no ranks"):
        dtensor_layout((4,), torch.Size([0]), [Shard(0)])


@pytest.mark.rule("DTENSOR-2", "DTENSOR-4", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.parametrize(
    "placements",
    [
        [Shard(0), Shard(0), ss(0, 3)],
        [Replicate(), Shard(0), Shard(0)],
        [Shard(0), Shard(0), Shard(0)],
        [Replicate(), Shard(0), ss(0, 3)],
        [Shard(1), ss(0, 3), Shard(2)],
    ],
    ids=str,
)
def test_strided_shard_redistribution_layouts(placements: list[Any]) -> None:
    # upstream: test_redistribute.py test_strided_shard_redistribution: a (31, 13, 11) tensor
    # on a 2 x 2 x 2 mesh; every placement it redistributes between is a valid layout whose
    # local tensors are the brute-force split.
    shape, mesh = (31, 13, 11), (2, 2, 2)
    layout = dtensor_layout(shape, torch.arange(8).view(mesh), placements)
    assert layout.is_valid()
    check_against_oracle(shape, mesh, placements)


def _ordered_local(
    shape: Sequence[int], mesh: Sequence[int], order: Sequence[int], c: Sequence[int]
) -> torch.Tensor:
    """Shard dim 0 by the mesh dims in ``order`` (torch.chunk each time): a shard order."""
    t = arange(shape)
    for m in order:
        t = torch.chunk(t, mesh[m], 0)[c[m]]
    return t


@pytest.mark.rule("DTENSOR-4")
@pytest.mark.parametrize(
    ("mesh", "placements", "order"),
    [
        ((2, 4), [ss(0, 4), Shard(0)], (1, 0)),
        ((2, 3, 4), [Shard(0), ss(0, 4), Shard(0)], (0, 2, 1)),
        ((2, 3, 4), [ss(0, 12), ss(0, 4), Shard(0)], (2, 1, 0)),
    ],
)
def test_strided_shard_is_a_shard_order(
    mesh: tuple[int, ...], placements: list[Any], order: tuple[int, ...]
) -> None:
    # upstream: test_utils.py LocalTest.test_explicit_order_placements: on even splits these
    # _StridedShard placements are plain Shard(0) applied in another mesh-dim order.
    shape = (48, 3)
    for c in coords(mesh):
        (box,) = dtensor_local_boxes(shape, mesh, placements, c)
        assert torch.equal(arange(shape)[box.slices()], _ordered_local(shape, mesh, order, c))
