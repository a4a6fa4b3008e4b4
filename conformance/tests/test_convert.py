"""Converters on real ranks (spec/04-convert.md CONVERT-1, -2, -7; spec/02-dtensor.md
DTENSOR-9): a ShardedTensor built from a layout holds the reference slices and states the
layout; the DCP chunk list a DTensor reports on each rank is where its local data really sits;
``from_dtensor`` of a real DTensor gives every rank the elements it holds.

Against torch, the ShardedTensor is built by ``init_from_local_shards`` (which gathers the
shards' metadata from the ranks) and the chunk list by ``DTensor.__create_chunk_list__``; torch
has no function from a DTensor to the global layout, so that case is unsupported there.
"""

from __future__ import annotations

import itertools
import math
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
from conformance.codec import layout_from_json, placement_repr, placements_from_json
from conformance.impls import Impl
from conformance.strategies import dtensor_pool_cases, dtypes, shapes, tensors, valid_layouts
from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.testing.devices import local_worlds, max_world_size

MAX_WORLD = max(1, max_world_size())


def _boxes(items: Any) -> list[Box]:
    return [Box(o, s) for o, s in items]


def _tensor(shape: tuple[int, ...], data: Any) -> torch.Tensor:
    if data is None:  # an explicit example: distinct values
        return torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    return data.draw(tensors(shape, dtypes()), label="tensor")  # type: ignore[no-any-return]


@st.composite
def pool_layouts(draw: st.DrawFn) -> tuple[int, Layout]:
    """``(world, layout)``: a valid layout without replicas (``ShardMetadata`` has none) whose
    ranks are ranks of a pool of ``world``."""
    world = draw(st.integers(1, MAX_WORLD))
    layout = draw(valid_layouts(shapes(max_dims=3, max_side=5), max_ranks=world, replicas=False))
    return world, layout


@pytest.mark.rule("CONVERT-1", "CONVERT-2", "CONVERT-7", "CONF-1")
@pytest.mark.pool
@given(pool_layouts(), st.data())
@example((3, chunk_layout((5, 2), 0, [2, 0, 1])), None)
def test_sharded_tensor_holds_the_layout(
    impl: Impl, pools: Any, world_layout: tuple[int, Layout], data: Any
) -> None:
    """Every rank's ShardedTensor states the layout as its global metadata, holds its own boxes
    in layout order, DCP saves one chunk per box it holds, and the bytes are the reference
    slices."""
    world, layout = world_layout
    t = _tensor(layout.shape, data)
    ex = f"{describe_layout(layout)} world={world} dtype={t.dtype}"
    with case():
        if not _sharded_tensor_accepts(layout):
            raise impl.unsupported(
                "ShardedTensor's own overlap check refuses some zero-size shards of valid "
                "layouts (BOX-2; the validation area reports it)"
            )
        for r in impl.sharded_tensor(pools(world), layout, t, example=ex):
            got = layout_from_json(r.value["layout"])
            assert_layouts_equal(f"rank{r.rank}.metadata()", got, layout, ex)
            want = list(layout.boxes_of(r.rank))
            assert_boxes_equal(f"rank{r.rank}.local_shards()", _boxes(r.value["local"]), want, ex)
            assert_boxes_equal(f"rank{r.rank}.dcp_chunks", _boxes(r.value["chunks"]), want, ex)
            for i, (box, local) in enumerate(zip(want, r.tensors)):
                assert_tensor_bitwise(f"rank{r.rank}.shard{i}", local, t[box.slices()], ex)


def _sharded_tensor_accepts(layout: Layout) -> bool:
    from torch.distributed._shard.sharding_spec._internals import (
        validate_non_overlapping_shards_metadata,
    )

    from shardspec.metadata import to_shard_metadata

    try:
        validate_non_overlapping_shards_metadata(to_shard_metadata(layout))
    except ValueError:
        return False
    return True


def _describe(shape: Any, mesh: Any, placements: Any) -> str:
    return (
        f"dtensor(shape={tuple(shape)}, mesh={tuple(mesh)}, "
        f"placements=[{', '.join(placement_repr(p) for p in placements)}])"
    )


def expected_boxes(indices: list[list[int]]) -> list[Box]:
    """The boxes of a local tensor holding ``indices`` per dim: the products of each dim's
    maximal runs, in row-major order (DTENSOR-7), worked out from the index lists alone."""
    runs: list[list[tuple[int, int]]] = []
    for ix in indices:
        dim_runs: list[tuple[int, int]] = []
        for i in ix:
            if dim_runs and dim_runs[-1][0] + dim_runs[-1][1] == i:
                dim_runs[-1] = (dim_runs[-1][0], dim_runs[-1][1] + 1)
            else:
                dim_runs.append((i, 1))
        runs.append(dim_runs or [(-1, 0)])  # an empty dim: one empty run, offset not judged
    return [
        Box([max(o, 0) for o, _ in combo], [n for _, n in combo])
        for combo in itertools.product(*runs)
    ]


def _same_up_to_empty_offsets(got: list[Box], want: list[Box]) -> bool:
    # Where an empty piece sits is DTENSOR-6's question (test_dtensor.py); here only which
    # elements each chunk holds matters, so empty chunks are compared by their sizes.
    if len(got) != len(want):
        return False
    return all(
        g.sizes == w.sizes and (g.is_empty or g.offsets == w.offsets) for g, w in zip(got, want)
    )


DTENSOR_CASES = dtensor_pool_cases(max_world=MAX_WORLD, negative_dims=False)

DTENSOR_DEFECT_CHUNK_LIST = (
    "DTensor.__create_chunk_list__ reports one chunk per rank from "
    "compute_local_shape_and_global_offset; a _StridedShard local tensor holding several "
    "blocks (3 rows, [_StridedShard(0, split_factor=2)] on 2 ranks: rank 0 holds rows 0 and 2) "
    "is described as the one block [0, 2), so DCP would save row 1's place with row 2's data"
)
# what the defect gives: one box where the rank's data sits in several pieces
CHUNK_LIST_FAILURE = r"^rank\d+\.chunks=\['[^']*'\], but should be \['[^']*', '"


@pytest.mark.rule("CONVERT-7", "DTENSOR-7", "CONF-1")
@pytest.mark.known_defect(
    "torch", DTENSOR_DEFECT_CHUNK_LIST, raises=AssertionError, match=CHUNK_LIST_FAILURE
)
@pytest.mark.pool
@given(DTENSOR_CASES, st.data())
@example(((3,), (2,), [["SS", 0, 2]]), None)
def test_dtensor_chunk_list_is_where_the_local_data_sits(
    impl: Impl, pools: Any, dcase: Any, data: Any
) -> None:
    """DCP's chunk list of a real DTensor, on each rank: one chunk per block of its local
    tensor, in local order, and the local tensor's bytes are the global tensor at those
    chunks."""
    check_chunk_lists(impl, pools, dcase, _tensor(dcase[0], data))


@pytest.mark.rule("CONVERT-7", "DTENSOR-7", "CONF-1")
@pytest.mark.known_defect(
    "torch", DTENSOR_DEFECT_CHUNK_LIST, raises=AssertionError, match=CHUNK_LIST_FAILURE
)
@given(dtensor_pool_cases(negative_dims=False, worlds=local_worlds()), st.data())
@example(((3, 2), (2, 2, 2), [["R"], ["SS", 0, 2], ["R"]]), None)
def test_dtensor_chunk_lists_on_every_rank_of_a_large_mesh(
    impl: Impl, local_pools: Any, dcase: Any, data: Any
) -> None:
    """The same question for every rank of meshes of 8 to 1024 ranks (up to 4-D), answered
    by one program on torch's LocalTensorMode."""
    check_chunk_lists(impl, local_pools, dcase, _tensor(dcase[0], data))


def check_chunk_lists(impl: Impl, pools: Any, dcase: Any, t: torch.Tensor) -> None:
    shape, mesh, placements = dcase
    ex = _describe(shape, mesh, placements) + f" dtype={t.dtype}"
    coords = reference.mesh_coordinates(mesh)
    with case():
        for r in impl.dtensor_chunks(pools(math.prod(mesh)), t, mesh, placements, ex):
            indices = reference.dtensor_indices(shape, mesh, placements, coords[r.rank])
            got = _boxes(r.value["chunks"])
            want = expected_boxes(indices)
            if not _same_up_to_empty_offsets(got, want):
                assert_boxes_equal(f"rank{r.rank}.chunks", got, want, ex)
            held = reference.gather(t, reference.indices_of_boxes(got, len(shape)))
            assert_tensor_bitwise(f"rank{r.rank}.local", r.tensors[0], held, ex)


@pytest.mark.rule("DTENSOR-9", "CONF-1")
@pytest.mark.pool
@given(DTENSOR_CASES, st.data())
def test_from_dtensor_gives_every_rank_its_elements(
    impl: Impl, pools: Any, dcase: Any, data: st.DataObject
) -> None:
    """``from_dtensor`` on a real DTensor reads the same layout on every rank, equal to
    ``dtensor_layout`` of the same description, and that layout gives each rank exactly the
    elements its local tensor holds, in local order."""
    shape, mesh, placements = dcase
    t = data.draw(tensors(shape, dtypes()), label="tensor")
    ex = _describe(shape, mesh, placements) + f" dtype={t.dtype}"
    coords = reference.mesh_coordinates(mesh)
    with case():
        if impl.via == "torch":
            raise impl.unsupported(
                "torch has no function from a DTensor to the global layout (it computes one "
                "rank's local shape and offset at a time)"
            )
        results = impl.dtensor_chunks(pools(math.prod(mesh)), t, mesh, placements, ex)
        first = layout_from_json(results[0].value["layout"])
        from shardspec.metadata import dtensor_layout

        ranks = torch.arange(math.prod(mesh)).reshape(mesh)
        built = dtensor_layout(shape, ranks, placements_from_json(placements))
        assert_layouts_equal("from_dtensor(dt)", first, built, ex + " vs dtensor_layout")
        for r in results:
            layout = layout_from_json(r.value["layout"])
            assert_layouts_equal(f"rank{r.rank}.from_dtensor", layout, first, ex)
            boxes = layout.boxes_of(r.rank)
            got = reference.indices_of_boxes(boxes, len(shape))
            want = reference.dtensor_indices(shape, mesh, placements, coords[r.rank])
            assert_equal(f"rank{r.rank}.indices", got, want, ex)
            assert_tensor_bitwise(f"rank{r.rank}.local", r.tensors[0], reference.gather(t, got), ex)
        assert_equal("layout.valid", reference.is_valid(first), True, ex)
