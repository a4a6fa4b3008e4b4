"""The FSDP + TP layout rules (spec/07-fsdp.md, FSDP-1..5) against brute force and upstream."""

from __future__ import annotations

import itertools

import pytest
import torch
from fsdp_oracle import arange, chunk_or_empty, fsdp_cases, fsdp_local
from hypothesis import given, strategies as st

from shardspec.fsdp.rules import (
    dtensor_boxes,
    fsdp1_claimed_placements,
    fsdp1_layout,
    fsdp2_layout,
    fsdp2_placements,
    fsdp_box,
    fsdp_tp_layout,
    placements_for_fsdp,
    placements_layout,
    tp_box,
)
from shardspec.metadata import Box, LayoutError
from shardspec.metadata.dtensor_math import Split
from shardspec.metadata.placements import (
    Replicate,
    ShardDim,
    StridedShardDim,
    from_torch,
    to_split,
    to_torch,
)
from shardspec.testing.defects import known_failure


def _local_from_boxes(g: torch.Tensor, boxes: tuple[Box, ...]) -> torch.Tensor:
    """The local tensor a rank's boxes describe, built without the code under test: in every
    dim the rank holds the union of its boxes' intervals, ascending (DTENSOR-7)."""
    ix = [
        torch.tensor(
            sorted({i for b in boxes for i in range(b.offsets[d], b.offsets[d] + b.sizes[d])}),
            dtype=torch.int64,
        )
        for d in range(g.ndim)
    ]
    return g[torch.meshgrid(*ix, indexing="ij")] if ix else g


@pytest.mark.rule("FSDP-1")
@given(fsdp_cases())
def test_fsdp_box_is_fsdp_chunk_of_tp_chunk(case) -> None:  # type: ignore[no-untyped-def]
    shape, tp, tp_size, dp, sd = (
        case["shape"],
        case["tp"],
        case["tp_size"],
        case["dp"],
        case["shard_dim"],
    )
    g = arange(shape)
    for t, p in itertools.product(range(tp_size), range(dp)):
        box = fsdp_box(shape, tp, tp_size=tp_size, dp_size=dp, t=t, p=p, shard_dim=sd)
        expected = fsdp_local(g, tp, tp_size, dp, t, p, sd)
        got = g[box.slices()]
        assert got.shape == expected.shape, (
            f"box {box} has shape {tuple(got.shape)}, but should be {tuple(expected.shape)} "
            f"[shape={shape}, tp={tp}x{tp_size}, dp={dp}, (p,t)=({p},{t}), shard_dim={sd}]"
        )
        assert torch.equal(got, expected), f"box {box} holds other elements [(p,t)=({p},{t})]"


@pytest.mark.rule("FSDP-1")
@pytest.mark.parametrize(
    ("shape", "tp", "tp_size", "dp", "expected"),
    [
        # 5 rows, FSDP over 2 ranks, no TP: rank 1 holds [3, 5) (_get_box says offset 2).
        ((5, 4), Replicate(), 1, 2, {0: ((0, 0), (3, 4)), 1: ((3, 0), (2, 4))}),
        # 7 rows, TP Shard(0) over 2, FSDP over 3: ranks are (p, t) row-major = 2p + t.
        (
            (7, 10),
            ShardDim(0),
            2,
            3,
            {
                0: ((0, 0), (2, 10)),
                1: ((4, 0), (1, 10)),
                2: ((2, 0), (2, 10)),
                3: ((5, 0), (1, 10)),
                4: ((7, 0), (0, 10)),
                5: ((6, 0), (1, 10)),
            },
        ),
        # Linear(10, 7) colwise over 2x2: weight (7, 10), TP rows [0,4) [4,7).
        (
            (7, 10),
            ShardDim(0),
            2,
            2,
            {
                0: ((0, 0), (2, 10)),
                1: ((4, 0), (2, 10)),
                2: ((2, 0), (2, 10)),
                3: ((6, 0), (1, 10)),
            },
        ),
        # Linear(7, 5) rowwise over 2x2: weight (5, 7), TP columns [0,4) [4,7), FSDP rows.
        (
            (5, 7),
            ShardDim(1),
            2,
            2,
            {0: ((0, 0), (3, 4)), 1: ((0, 4), (3, 3)), 2: ((3, 0), (2, 4)), 3: ((3, 4), (2, 3))},
        ),
    ],
)
def test_fsdp1_layout_hand_worked(shape, tp, tp_size, dp, expected) -> None:  # type: ignore[no-untyped-def]
    layout = fsdp1_layout(shape, tp, dp=dp, tp_size=tp_size)
    for rank, (offs, sizes) in expected.items():
        assert layout.boxes_of(rank) == (Box(offs, sizes),), f"rank {rank}"


@pytest.mark.rule("FSDP-2")
@given(fsdp_cases())
def test_layout_is_valid_one_box_per_rank_hsdp_replicas(case) -> None:  # type: ignore[no-untyped-def]
    layout = fsdp_tp_layout(
        case["shape"],
        case["tp"],
        dp=case["dp"],
        tp_size=case["tp_size"],
        replicate=case["replicate"],
        shard_dim=case["shard_dim"],
    )
    layout.validate()
    per_group = case["dp"] * case["tp_size"]
    assert len(layout.shards) == case["replicate"] * per_group
    for s in layout.shards:
        assert len(layout.boxes_of(s.rank)) == 1
        # the same (dp, tp) coordinate in another replicate group holds the same box
        assert layout.boxes_of(s.rank % per_group) == (s.box,)


@pytest.mark.rule("FSDP-2")
def test_zero_dim_tensor_is_refused() -> None:
    with pytest.raises(LayoutError, match="0-d"):
        fsdp1_layout((), Replicate(), dp=2, tp_size=1)


@pytest.mark.rule("FSDP-2")
def test_fsdp1_and_fsdp2_agree_on_dim_0() -> None:
    for shape in [(7, 10), (5, 7), (1, 3), (0, 4)]:
        for tp in (ShardDim(0), ShardDim(1), Replicate()):
            assert fsdp1_layout(shape, tp, dp=3, tp_size=2) == fsdp2_layout(
                shape, tp, dp=3, tp_size=2
            )


@pytest.mark.rule("FSDP-3")
@given(fsdp_cases())
def test_empty_boxes_are_canonical(case) -> None:  # type: ignore[no-untyped-def]
    shape = case["shape"]
    layout = fsdp_tp_layout(
        shape, case["tp"], dp=case["dp"], tp_size=case["tp_size"], shard_dim=case["shard_dim"]
    )
    for s in layout.shards:
        for d, (o, n) in enumerate(s.box):
            if n == 0:
                assert o == shape[d], f"empty dim {d} of {s} sits at {o}, but should be {shape[d]}"


@pytest.mark.rule("FSDP-3")
def test_empty_inner_chunk_keeps_tp_columns() -> None:
    # 2 rows, TP Shard(1) over 2 (columns [0,3) [3,5)), FSDP over 3: p=2 has no rows.
    box = fsdp_box((2, 5), ShardDim(1), tp_size=2, dp_size=3, t=1, p=2)
    assert box == Box((2, 3), (0, 2))
    # TP piece empty (3 rows over 4): the FSDP chunk of nothing sits at the global end.
    assert fsdp_box((3, 2), ShardDim(0), tp_size=4, dp_size=2, t=3, p=0) == Box((3, 0), (0, 2))
    assert tp_box((3, 2), ShardDim(0), 4, 3) == Box((3, 0), (0, 2))


placements_st = st.sampled_from(["R", "S", "SS"])


@st.composite
def dtensor_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[object, ...]]:
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=2)))
    mesh = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    pls: list[object] = []
    for _ in mesh:
        kind = draw(placements_st)
        d = draw(st.integers(0, len(shape) - 1))
        if kind == "R":
            pls.append(Replicate())
        elif kind == "S":
            pls.append(ShardDim(d))
        else:
            pls.append(StridedShardDim(d, draw(st.integers(1, 4))))
    return shape, mesh, tuple(pls)


def _upstream_local(g: torch.Tensor, mesh: tuple[int, ...], pls, coord) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """DTensor's own splitting code, applied left to right on one coordinate."""
    local = g
    for k, c, p in zip(mesh, coord, pls):
        tp = to_torch(p)
        if isinstance(p, Replicate):
            continue
        pieces, _ = tp._split_tensor(local, k, with_padding=False, contiguous=True)
        local = pieces[c]
    return local


@pytest.mark.rule("FSDP-4")
@given(dtensor_cases())
def test_dtensor_boxes_match_dtensor_split(case) -> None:  # type: ignore[no-untyped-def]
    shape, mesh, pls = case
    g = arange(shape)
    for coord in itertools.product(*(range(k) for k in mesh)):
        expected = _upstream_local(g, mesh, pls, coord)
        boxes = dtensor_boxes(shape, mesh, pls, coord)
        got = _local_from_boxes(g, boxes)
        # the shape too: an empty local tensor still has a local shape (DTENSOR-5)
        assert got.shape == expected.shape, f"{coord} {pls}: {boxes} vs {tuple(expected.shape)}"
        assert torch.equal(got, expected), f"coordinate {coord} of {pls} on mesh {mesh}"
        assert sum(b.numel for b in boxes) == expected.numel()


@pytest.mark.rule("FSDP-4")
def test_strided_shard_alone_is_two_boxes() -> None:
    # 8 rows, _StridedShard(0, sf=2) over 2: coordinate 0 holds [0,2) and [4,6).
    boxes = dtensor_boxes((8,), (2,), (StridedShardDim(0, 2),), (0,))
    assert boxes == (Box((0,), (2,)), Box((4,), (2,)))
    layout = placements_layout((8, 3), (2, 2), (StridedShardDim(0, 2), Replicate()))
    assert layout.boxes_of(3) == (Box((2, 0), (2, 3)), Box((6, 0), (2, 3)))
    layout.validate()


@pytest.mark.rule("FSDP-4")
def test_dtensor_local_shape_matches_upstream_compute() -> None:
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    for shape, mesh, pls in [
        ((7, 10), (2, 2), (ShardDim(0), ShardDim(0))),
        ((7, 10), (3, 2), (StridedShardDim(0, 2), ShardDim(0))),
        ((9, 4), (2, 3), (ShardDim(1), StridedShardDim(0, 2))),
    ]:
        for coord in itertools.product(*(range(k) for k in mesh)):
            local, _ = _compute_local_shape_and_global_offset(
                shape, mesh, list(coord), [to_torch(p) for p in pls]
            )
            got = _local_from_boxes(arange(shape), dtensor_boxes(shape, mesh, pls, coord))
            assert tuple(local) == tuple(got.shape), f"{coord} {pls}"


@pytest.mark.rule("FSDP-5")
@given(fsdp_cases(max_dims=2))
def test_placements_for_fsdp_are_exact_or_none(case) -> None:  # type: ignore[no-untyped-def]
    shape, tp, tp_size, dp, rep, sd = (
        case["shape"],
        case["tp"],
        case["tp_size"],
        case["dp"],
        case["replicate"],
        case["shard_dim"],
    )
    pls = placements_for_fsdp(shape, tp, dp=dp, tp_size=tp_size, replicate=rep, shard_dim=sd)
    g = arange(shape)
    mesh = ((rep,) if rep > 1 else ()) + (dp, tp_size)
    if pls is None:
        # then the placements fully_shard uses really do misdescribe some rank
        claim = fsdp2_placements(tp, tp_size, shard_dim=sd, hsdp=rep > 1)
        mismatch = False
        for coord in itertools.product(*(range(k) for k in mesh)):
            p, t = coord[-2], coord[-1]
            got = _upstream_local(g, mesh, claim, coord)
            if not torch.equal(
                got.reshape(-1), fsdp_local(g, tp, tp_size, dp, t, p, sd).reshape(-1)
            ):
                mismatch = True
        assert mismatch, f"{claim} is exact for {case} but placements_for_fsdp said None"
        return
    for coord in itertools.product(*(range(k) for k in mesh)):
        p, t = coord[-2], coord[-1]
        got = _upstream_local(g, mesh, pls, coord)
        assert torch.equal(got, fsdp_local(g, tp, tp_size, dp, t, p, sd)), f"{coord} {pls}"


@pytest.mark.rule("FSDP-5")
def test_placements_hand_worked() -> None:
    s0 = ShardDim(0)
    assert placements_for_fsdp((7, 10), s0, dp=2, tp_size=2) == (StridedShardDim(0, 2), s0)
    assert placements_for_fsdp((5, 7), ShardDim(1), dp=2, tp_size=2) == (s0, ShardDim(1))
    assert placements_for_fsdp((7, 10), s0, dp=3, tp_size=2) is None
    assert placements_for_fsdp((8, 10), s0, dp=3, tp_size=2) == (StridedShardDim(0, 2), s0)


@pytest.mark.rule("FSDP-5")
@known_failure(
    reason="upstream: FSDP2's (_StridedShard(0, 2), Shard(0)) misdescribes 7 rows on dp=3 x "
    "tp=2 (_compute_local_shape_and_global_offset puts rank (2,0) at row 6)",
    raises=AssertionError,
    match=r"rank 4 \(2, 0\): \(1, 10\) vs Box\(offsets=\(7, 0\), sizes=\(0, 10\)\)",
)
def test_upstream_fsdp2_placements_describe_fsdp2_data() -> None:
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape = (7, 10)
    truth = fsdp2_layout(shape, ShardDim(0), dp=3, tp_size=2)
    pls = [to_torch(p) for p in fsdp2_placements(ShardDim(0), 2)]
    for rank, coord in enumerate(itertools.product(range(3), range(2))):
        local, offset = _compute_local_shape_and_global_offset(shape, (3, 2), list(coord), pls)
        (box,) = truth.boxes_of(rank)
        assert tuple(local) == box.sizes, f"rank {rank} {coord}: {local} vs {box}"
        if box.numel:
            assert tuple(offset) == box.offsets, f"rank {rank} {coord}: {offset} vs {box}"


@pytest.mark.rule("FSDP-5")
@known_failure(
    reason="upstream: FSDP1 _chunk_dtensor labels TP Shard(0) params (Shard(0), Shard(0)), "
    "dp-first nested chunking, wrong for 7 rows on 2x2",
    raises=AssertionError,
    match=r"assert Layout\(shape=",
)
def test_upstream_fsdp1_claim_describes_fsdp1_data() -> None:
    truth = fsdp1_layout((7, 10), ShardDim(0), dp=2, tp_size=2)
    claim = placements_layout((7, 10), (2, 2), fsdp1_claimed_placements(ShardDim(0)))
    assert claim == truth


@pytest.mark.rule("FSDP-5")
def test_placement_conversion_round_trips() -> None:
    for p in (ShardDim(1), StridedShardDim(0, 3), Replicate()):
        assert from_torch(to_torch(p)) == p
    assert to_split(ShardDim(1)) == Split(1, 1)
    assert to_split(StridedShardDim(0, 3)) == Split(0, 3)
    assert to_split(Replicate()) is None


# Differential tests against upstream tensor/parallel/fsdp.py on a fake process group.


def _tp_dtensor(shape: tuple[int, ...], tp_size: int, rank: int):  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import DeviceMesh, DTensor, Shard

    g = arange(shape).float()
    mesh = DeviceMesh("cpu", list(range(tp_size)))
    local = chunk_or_empty(g, tp_size, rank, 0)
    return DTensor.from_local(
        local, mesh, [Shard(0)], run_check=False, shape=g.shape, stride=g.stride()
    )


@pytest.mark.rule("FSDP-1")
@known_failure(
    reason="upstream: _get_box floor division (pytorch PR #188947)",
    raises=AssertionError,
    match=r"\(\(2, 0\), \(2, 4\)\) == \(\(3, 0\), \(2, 4\)\)",
)
def test_upstream_get_box_5_rows_on_2_ranks() -> None:
    from fsdp_fake import fake_world
    from torch.distributed.tensor.parallel.fsdp import _get_local_box

    with fake_world(1, 2):
        offsets, sizes = _get_local_box(_tp_dtensor((5, 4), 2, 1))
    expected = tp_box((5, 4), ShardDim(0), 2, 1)
    assert (tuple(offsets), tuple(sizes)) == (expected.offsets, expected.sizes)


@pytest.mark.rule("FSDP-1")
@known_failure(
    reason="upstream: _chunk_tensor overlap error for 7 rows on 3 (PR #188947)",
    raises=ValueError,
    match=r"shard_offsets=\[2, 0\], shard_sizes=\[3, 10\].* overlap",
)
def test_upstream_chunk_tensor_7_rows_on_3_ranks() -> None:
    import torch.distributed as dist
    from fsdp_fake import fake_world
    from torch.distributed.tensor.parallel.fsdp import _chunk_tensor

    with fake_world(0, 3):
        st_ = _chunk_tensor(_tp_dtensor((7, 10), 3, 0), 0, 3, 1, dist.group.WORLD)
        boxes = sorted(Box(m.shard_offsets, m.shard_sizes) for m in st_.metadata().shards_metadata)
    assert boxes == sorted(tp_box((7, 10), ShardDim(0), 3, t) for t in range(3))


@pytest.mark.rule("FSDP-4")
@pytest.mark.parametrize(
    ("shape", "mesh", "pls", "coord", "local_shape"),
    [
        # no rows, columns _StridedShard(1, 2) over 2: coordinate 0 holds columns 0, 1, 4, 5
        ((0, 8), (2,), (StridedShardDim(1, 2),), (0,), (0, 4)),
        # 3 rows over 4 (coordinate 3 has none), columns as above
        ((3, 8), (4, 2), (ShardDim(0), StridedShardDim(1, 2)), (3, 1), (0, 4)),
        # 9 columns in parts of 2 (the last 1) over 4: coordinate 0 takes columns 0, 2, 4, 6, 8
        ((9, 9), (4, 2), (StridedShardDim(1, 8), StridedShardDim(0, 10)), (0, 1), (0, 5)),
    ],
)
def test_an_empty_local_tensor_keeps_its_local_shape(  # type: ignore[no-untyped-def]
    shape, mesh, pls, coord, local_shape
) -> None:
    # fsdp's former copy of the DTensor rule gave such a rank one empty box as wide as its
    # first run, (0, 2) / (0, 1), losing the local shape torch's distribute_tensor gives.
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    boxes = dtensor_boxes(shape, mesh, pls, coord)
    assert tuple(_local_from_boxes(arange(shape), boxes).shape) == local_shape, boxes
    torch_shape, _ = _compute_local_shape_and_global_offset(
        shape, mesh, list(coord), [to_torch(p) for p in pls]
    )
    assert tuple(torch_shape) == local_shape
    (rank,) = [r for r, c in enumerate(itertools.product(*map(range, mesh))) if c == coord]
    assert placements_layout(shape, mesh, pls).boxes_of(rank) == boxes
