"""The chunk rule (spec/01-layout.md CHUNK-1..3, LAYOUT-1) wherever an implementation chunks:
its chunk spec, its resharding path and its FSDP state-dict boxes, against ``torch.chunk`` of
an index tensor."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import example, given, strategies as st

from conformance import reference
from conformance.assertions import (
    assert_boxes_equal,
    assert_equal,
    assert_layouts_equal,
    assert_tensor_bitwise,
    describe_layout,
)
from conformance.cases import case
from conformance.codec import layout_from_json
from conformance.impls import Impl
from conformance.strategies import chunk_args, dtypes, shapes, tensors, uneven_chunk_args
from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.testing.devices import max_world_size

MAX_WORLD = max(1, max_world_size())
ChunkFn = Callable[[tuple[int, ...], int, list[int]], Layout]


def expected_boxes(shape: tuple[int, ...], dim: int, k: int) -> list[Box]:
    d = dim % len(shape)
    out = []
    for start, stop in reference.chunk_intervals(shape[d], k):
        offs = [0] * len(shape)
        offs[d] = start
        sizes = list(shape)
        sizes[d] = stop - start
        out.append(Box(offs, sizes))
    return out


def check_chunk_rule(build: ChunkFn, shape: tuple[int, ...], dim: int, ranks: list[int]) -> None:
    """CHUNK-1 and CHUNK-3: one box per listed rank; chunk i's elements are torch.chunk's.
    Empty chunks are checked for their size only; CHUNK-2 fixes their offset."""
    ex = f"chunk(shape={shape}, dim={dim}, ranks={ranks})"
    got = build(shape, dim, ranks)
    assert_equal("layout.shape", got.shape, shape, ex)
    assert_equal("len(layout.shards)", len(got.shards), len(ranks), ex)
    for rank, want in zip(ranks, expected_boxes(shape, dim, len(ranks))):
        boxes = got.boxes_of(rank)
        assert_equal(f"len(boxes_of({rank}))", len(boxes), 1, ex)
        if want.is_empty:
            assert_equal(f"boxes_of({rank})[0].sizes", boxes[0].sizes, want.sizes, ex)
        else:
            assert_boxes_equal(f"boxes_of({rank})", boxes, [want], ex)


def check_empty_chunks(build: ChunkFn, shape: tuple[int, ...], dim: int, ranks: list[int]) -> None:
    """CHUNK-2 and LAYOUT-1: empty chunks sit at offset n, and the layout is valid."""
    ex = f"chunk(shape={shape}, dim={dim}, ranks={ranks})"
    got = build(shape, dim, ranks)
    for rank, want in zip(ranks, expected_boxes(shape, dim, len(ranks))):
        if want.is_empty:
            assert_boxes_equal(f"boxes_of({rank})", got.boxes_of(rank), [want], ex)
    assert_equal("valid", reference.is_valid(got), True, f"{ex} -> {describe_layout(got)}")


# More ranks than shardspec's chunk_layout caches layouts for (4096): its uncached path.
MANY_RANKS = 4100


@pytest.mark.rule("CHUNK-1", "CHUNK-3")
@given(chunk_args())
@example(((MANY_RANKS + 7,), 0, list(reversed(range(MANY_RANKS)))))
def test_chunk_spec_follows_the_chunk_rule(impl: Impl, args: Any) -> None:
    with case():
        check_chunk_rule(impl.chunk_layout, *args)


@pytest.mark.rule("CHUNK-2", "LAYOUT-1")
@pytest.mark.known_defect(
    "torch",
    "ChunkShardingSpec.build_metadata puts empty chunks past the end (offset 6 for a dim of 5 "
    "over 4 ranks), which its own check_tensor rejects",
    raises=AssertionError,
    match=r"^boxes_of\(\d+\)=.*, but should be .* \[chunk\(",
)
@given(uneven_chunk_args())
@example(((5000, 2), 0, list(range(MANY_RANKS))))  # 2500 chunks of 2 rows, 1600 empty
def test_chunk_spec_puts_empty_chunks_at_n(impl: Impl, args: Any) -> None:
    with case():
        check_empty_chunks(impl.chunk_layout, *args)


def _dense(args: Any) -> Any:
    # The resharding path chunks over a whole process group: ranks are 0..k-1 in some order.
    shape, dim, ranks = args
    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    return shape, dim, order


@pytest.mark.rule("CHUNK-1", "CHUNK-3")
@given(chunk_args().map(_dense))
def test_reshard_path_follows_the_chunk_rule(impl: Impl, args: Any) -> None:
    with case():
        check_chunk_rule(impl.reshard_chunk_layout, *args)


@pytest.mark.rule("CHUNK-2", "LAYOUT-1")
@given(uneven_chunk_args().map(_dense))
def test_reshard_path_puts_empty_chunks_at_n(impl: Impl, args: Any) -> None:
    with case():
        check_empty_chunks(impl.reshard_chunk_layout, *args)


@pytest.mark.rule("CHUNK-1", "CONF-1")
@pytest.mark.known_defect(
    "torch",
    "tensor/parallel/fsdp.py _get_box computes offsets with floor division: for 5 rows on 2 "
    "ranks rank 1 holds [3, 5) but is reported at offset 2",
    issue="PR #188947",
    raises=AssertionError,
    # the floor offset names rows the rank does not hold: other bytes, or a box past the end
    match=r"^rank\d+\.(box fits=False, but should be True|local\.flat\[\d+\]=.*; bytes differ\])",
)
@pytest.mark.pool
@given(st.integers(1, MAX_WORLD), shapes(min_dims=1, max_dims=3, max_side=7), st.data())
def test_fsdp_box_holds_the_local_tensor(
    impl: Impl, pools: Any, world: int, shape: tuple[int, ...], data: st.DataObject
) -> None:
    """On real ranks: the box the FSDP state-dict path reports for a DTensor chunked on a 1-D
    mesh is where the rank's local tensor really sits in the global tensor."""
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    t = data.draw(tensors(shape, dtypes()), label="tensor")
    ex = f"fsdp(shape={shape}, dim={dim}, world={world}, dtype={t.dtype})"
    with case():
        got = impl.fsdp_local_boxes(pools(world), t, dim)
        for rank, (box, local) in enumerate(got):
            assert_equal(f"rank{rank}.box.sizes", box.sizes, tuple(local.shape), ex)
            assert_equal(f"rank{rank}.box fits", box.fits_in(shape), True, f"{ex} box={box}")
            assert_tensor_bitwise(f"rank{rank}.local", local, t[box.slices()], f"{ex} box={box}")


def _rows_tensor(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
    return torch.arange(math.prod(shape)).reshape(shape).to(dtype)


@pytest.mark.rule("FSDP-6", "CHUNK-2", "CHUNK-3", "CONF-1")
@pytest.mark.known_defect(
    "torch",
    "fsdp/_shard_utils.py _create_chunk_sharded_tensor lists only the chunks torch.chunk "
    "returns: with more ranks than rows (2 rows on 3 ranks) the empty chunk of rank 2 is "
    "dropped from the metadata, so the ShardedTensor names no box for that rank",
    raises=AssertionError,
    match=r"^rank\d+\.metadata\(\)\.boxes_of\(\d+\)=\[\], but should be ",
)
@pytest.mark.pool
@given(st.integers(1, MAX_WORLD), shapes(min_dims=1, max_dims=3, max_side=7), dtypes())
@example(3, (2, 3), torch.float32)
def test_fsdp_chunk_sharded_tensor_lists_every_chunk(
    impl: Impl, pools: Any, world: int, shape: tuple[int, ...], dtype: Any
) -> None:
    """FSDP's state-dict ShardedTensor of a plain tensor chunked on dim 0 over W ranks: its
    metadata is chunk_layout(shape, 0, range(W)) (empty chunks included, at offset n), each
    rank holds its chunk, and the bytes are the reference slice."""
    t = _rows_tensor(shape, dtype)
    ex = f"fsdp_chunk(shape={shape}, world={world}, dtype={dtype})"
    want = chunk_layout(shape, 0, range(world))
    with case():
        for r in impl.fsdp_chunk_tensor(pools(world), t, ex):
            got = layout_from_json(r.value["layout"])
            assert_layouts_equal(f"rank{r.rank}.metadata()", got, want, ex)
            mine = [Box(o, s) for o, s in r.value["local"]]
            assert_boxes_equal(
                f"rank{r.rank}.local_shards()", mine, list(want.boxes_of(r.rank)), ex
            )
            for box, local in zip(mine, r.tensors):
                assert_tensor_bitwise(f"rank{r.rank}.local", local, t[box.slices()], ex)


@pytest.mark.rule("FSDP-6", "CHUNK-1", "CONF-1")
@pytest.mark.known_defect(
    "torch",
    "tensor/parallel/fsdp.py _chunk_tensor states TP shards at floor-division offsets and "
    "names the wrong owners: for 7 rows on 3 TP ranks the outer ShardedTensor's metadata "
    "(offsets 0, 2, 4 for sizes 3, 3, 1) has overlapping boxes, so the call raises an overlap "
    "error; for even splits it names rank 1 as the owner of the other ranks' shards",
    issue="PR #188947",
    raises=AssertionError,
    match=r"(?s)^rank\d+\.outer\.metadata\(\)[.\w()]*=.*, but should be |raised in "
    r"'fsdp\.chunk_dtensor'.*ValueError: Shards ShardMetadata\(.*\) and ShardMetadata\(.*\) "
    r"overlap",
)
@pytest.mark.pool
@given(st.integers(1, MAX_WORLD), shapes(min_dims=1, max_dims=2, max_side=7), dtypes())
@example(3, (7, 2), torch.float32)
def test_fsdp_chunk_tensor_of_a_tp_shard(
    impl: Impl, pools: Any, world: int, shape: tuple[int, ...], dtype: Any
) -> None:
    """FSDP1 + TP's chunk hook on a DTensor ``Shard(0)`` over W TP ranks (FSDP over each rank
    alone): the outer metadata is the TP chunk layout with the real owners, and the inner
    ShardedTensor holds the rank's TP chunk, bit for bit."""
    t = _rows_tensor(shape, dtype)
    ex = f"fsdp_chunk_tensor(shape={shape}, tp={world}, dtype={dtype})"
    tp = chunk_layout(shape, 0, range(world))
    with case():
        for r in impl.fsdp_chunk_dtensor(pools(world), t, ex):
            outer = layout_from_json(r.value["outer"])
            assert_layouts_equal(f"rank{r.rank}.outer.metadata()", outer, tp, ex)
            (box,) = tp.boxes_of(r.rank)
            inner_want = chunk_layout(box.sizes, 0, [r.rank])
            inner = layout_from_json(r.value["inner"])
            assert_layouts_equal(f"rank{r.rank}.inner.metadata()", inner, inner_want, ex)
            for local in r.tensors:
                assert_tensor_bitwise(f"rank{r.rank}.inner.local", local, t[box.slices()], ex)
