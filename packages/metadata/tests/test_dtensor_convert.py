"""Layout -> DTensor placements and DTensor -> Layout (spec/02-dtensor.md, DTENSOR-9..10)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dtensor_oracle import device_mesh, flat_mesh, torch_dtensor
from hypothesis import given, strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from shardspec.metadata import Box, ConversionError, Layout, Shard as LShard, chunk_layout
from shardspec.metadata.dtensor import dtensor_layout, from_dtensor, to_dtensor_placements
from shardspec.metadata.strategies import (
    device_meshes,
    dtensor_cases,
    shapes,
    valid_layouts,
)


def SS(d: int, f: int) -> _StridedShard:
    return _StridedShard(d, split_factor=f)


def L(shape: tuple[int, ...], *shards: tuple[tuple[int, ...], tuple[int, ...], int]) -> Layout:
    return Layout(shape, [LShard(Box(o, s), r) for o, s, r in shards])


def same_storage(a: Layout, b: Layout) -> bool:
    """Equal layouts whose ranks also list their boxes in the same (local storage) order."""
    return a == b and all(a.boxes_of(r) == b.boxes_of(r) for r in a.ranks)


@pytest.mark.rule("DTENSOR-9")
@given(dtensor_cases())
def test_round_trip(case: Any) -> None:
    shape, mesh, placements = case
    layout = dtensor_layout(shape, mesh, placements)
    found = to_dtensor_placements(layout, mesh)
    again = dtensor_layout(shape, mesh, found)
    assert same_storage(again, layout), (
        f"placements {found} give {again}, but should give {layout} (from {placements})"
    )


@pytest.mark.rule("DTENSOR-9")
@given(dtensor_cases(shapes(max_dims=3, max_side=40), max_ranks=16))
def test_round_trip_long_dims(case: Any) -> None:
    # Long dims make many split factors distinguishable, which exercises reading the factor
    # back from the pieces rather than guessing it.
    shape, mesh, placements = case
    layout = dtensor_layout(shape, mesh, placements)
    assert same_storage(dtensor_layout(shape, mesh, to_dtensor_placements(layout, mesh)), layout)


@pytest.mark.rule("DTENSOR-9")
def test_prefers_shard_and_replicate() -> None:
    mesh = [[0, 1], [2, 3]]
    layout = dtensor_layout((8, 6), mesh, [Shard(1), Replicate()])
    assert to_dtensor_placements(layout, mesh) == (Shard(1), Replicate())
    assert to_dtensor_placements(chunk_layout((5,), 0, [4, 7, 1]), [4, 7, 1]) == (Shard(0),)
    strided = dtensor_layout((8, 8), mesh, [SS(0, 2), Shard(0)])
    assert to_dtensor_placements(strided, mesh) == (SS(0, 2), Shard(0))
    # Split factors 5..8 all chunk 9 rows into pieces of ceil(9/f) = 2 (4 gives 3), so they
    # give one layout and the smallest is chosen.
    assert to_dtensor_placements(dtensor_layout((9,), [0, 1], [SS(0, 7)]), [0, 1]) == (SS(0, 5),)


@pytest.mark.rule("DTENSOR-10")
@given(valid_layouts(shapes(max_dims=3, max_side=6), max_ranks=6), st.data())
def test_any_layout_round_trips_or_is_refused(layout: Layout, data: st.DataObject) -> None:
    """Never a wrong answer: placements found for an arbitrary layout reproduce it exactly."""
    ranks = sorted(layout.ranks) or [0]
    mesh = data.draw(device_meshes(max_dims=3, max_ranks=8))
    if data.draw(st.booleans()):
        # A mesh over exactly the layout's ranks, so that refusals are not just "wrong ranks".
        perm = data.draw(st.permutations(ranks))
        shape = data.draw(st.sampled_from([(len(perm),), *_two_d(len(perm))]))
        mesh = torch.tensor(perm).reshape(shape).tolist()
    try:
        found = to_dtensor_placements(layout, mesh)
    except ConversionError as e:
        assert str(e)
        return
    assert same_storage(dtensor_layout(layout.shape, mesh, found), layout)


def _two_d(n: int) -> list[tuple[int, int]]:
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


@pytest.mark.rule("DTENSOR-10")
@pytest.mark.parametrize(
    ("layout", "mesh", "match"),
    [
        # uneven, but not the chunk rule: [0,1) + [1,5) instead of [0,3) + [3,5)
        (L((5,), ((0,), (1,), 0), ((1,), (4,), 1)), [0, 1], "no Shard"),
        # the chunks in an order no placement gives
        (chunk_layout((6,), 0, [1, 0]), [0, 1], "no Shard"),
        (chunk_layout((6,), 0, [0, 1, 2]), [0, 1], "not in the mesh"),
        (chunk_layout((6,), 0, [0, 1]), [0, 1, 2], "hold no shard"),
        # one mesh dim cannot shard two tensor dims
        (
            L(
                (2, 2),
                ((0, 0), (1, 1), 0),
                ((0, 1), (1, 1), 1),
                ((1, 0), (1, 1), 2),
                ((1, 1), (1, 1), 3),
            ),
            [0, 1, 2, 3],
            "one placement shards one tensor dim",
        ),
        # a rank's two boxes in an order DTensor's local tensor does not use
        (
            L((4,), ((2,), (1,), 0), ((0,), (1,), 0), ((1,), (1,), 1), ((3,), (1,), 1)),
            [0, 1],
            "ascending",
        ),
        # a rank's boxes that are not the product of its per-dim intervals
        (
            L((3, 3), ((0, 0), (1, 1), 0), ((2, 2), (1, 1), 0), ((0, 0), (3, 3), 1)),
            [0, 1],
            "not a DTensor local tensor",
        ),
        # adjacent runs on one rank are one block in DTensor
        (L((4,), ((0,), (1,), 0), ((1,), (1,), 0), ((2,), (2,), 1)), [0, 1], "adjacent"),
        # overlapping pieces
        (L((4,), ((0,), (3,), 0), ((1,), (3,), 1)), [0, 1], "overlap"),
        # a gap
        (L((4,), ((0,), (1,), 0), ((2,), (2,), 1)), [0, 1], "not the whole dim"),
        # an empty chunk that is not where the chunk rule puts it
        (L((2,), ((0,), (2,), 0), ((0,), (0,), 1)), [0, 1], "no Shard"),
    ],
)
def test_refusals_name_the_reason(layout: Layout, mesh: Any, match: str) -> None:
    with pytest.raises(ConversionError, match=match):
        to_dtensor_placements(layout, mesh)


@pytest.mark.rule("DTENSOR-10")
def test_refuses_torch_nested_empty_offset() -> None:
    """A layout with a nested empty shard at the global dim size (as torch reports it) is not
    what DTensor holds under DTENSOR-6, and is refused rather than silently accepted."""
    ours = dtensor_layout((5,), [[0, 1, 2, 3], [4, 5, 6, 7]], [Shard(0), Shard(0)])
    moved = Layout(
        (5,),
        [LShard(Box((5,), (0,)), s.rank) if s.rank == 3 else s for s in ours.shards],
    )
    moved.validate()
    with pytest.raises(ConversionError):
        to_dtensor_placements(moved, [[0, 1, 2, 3], [4, 5, 6, 7]])


# --- from_dtensor ---------------------------------------------------------------------------


@pytest.mark.rule("DTENSOR-9")
@given(dtensor_cases(shapes(max_dims=3, max_side=9), max_ranks=8))
def test_from_dtensor_and_spec(case: Any) -> None:
    shape, mesh, placements = case
    _, ranks = flat_mesh(mesh)
    expected = dtensor_layout(shape, mesh, placements)
    for rank in ranks[:2]:
        dt = torch_dtensor(shape, mesh, placements, rank)
        assert from_dtensor(dt) == expected
        assert from_dtensor(dt._spec) == expected


@pytest.mark.rule("DTENSOR-8", "DTENSOR-9")
def test_from_dtensor_refusals() -> None:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    with pytest.raises(ConversionError, match="no tensor_meta"):
        from_dtensor(DTensorSpec(device_mesh([0, 1], 0), (Shard(0),)))
    partial = torch_dtensor((4,), [0, 1], [Partial()], 1)
    with pytest.raises(ConversionError, match="partial tensor has no layout"):
        from_dtensor(partial)
    with pytest.raises(ConversionError, match="DTensor or a DTensorSpec"):
        from_dtensor(torch.zeros(3))
