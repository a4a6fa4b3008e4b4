"""Validation (spec/01-layout.md BOX-2, LAYOUT-1..3): the implementation's validator accepts
exactly the layouts the brute-force oracle calls valid."""

from __future__ import annotations

import pytest
from hypothesis import example, given

from conformance import reference
from conformance.assertions import assert_verdict, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies import (
    layouts_with_buried_empty_shard,
    perturbed_layouts,
    valid_layouts,
)
from conformance.strategies.grids import (
    large_chunk_layouts,
    large_grid_layouts,
    near_grid_layouts,
    scale_worlds,
)
from shardspec.metadata import Box, Layout, Shard, chunk_layout


def check_validator(impl: Impl, layout: Layout) -> None:
    with case():
        accepted = impl.is_valid(layout)
        assert_verdict(
            f"{impl.name}.validate", accepted, reference.is_valid(layout), describe_layout(layout)
        )


# Valid (BOX-2: empty boxes overlap nothing; LAYOUT-2: identical boxes on two ranks are
# replicas), but torch's overlap check refuses it once there are three shards.
EMPTY_REPLICAS = Layout(
    (1, 0),
    [
        Shard(Box((0, 0), (0, 0)), 0),
        Shard(Box((0, 0), (1, 0)), 0),
        Shard(Box((0, 0), (1, 0)), 1),
    ],
)
ZERO_SIZE_DEFECT = (
    "validate_non_overlapping_shards_metadata counts zero-size shards as overlapping: "
    "the valid layout of a (1, 0) tensor with [0,0]+[1,0] on ranks 0 and 1 and [0,0]+[0,0] on "
    "rank 0 is refused"
)
# the defect refuses valid layouts; accepting an invalid one would be another defect
REFUSES_A_VALID_LAYOUT = r"^torch\.validate='rejected', but should be 'accepted' "
# and the other way round: an invalid layout let through
ACCEPTS_AN_INVALID_LAYOUT = r"^torch\.validate='accepted', but should be 'rejected' "


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.known_defect(
    "torch", ZERO_SIZE_DEFECT, raises=AssertionError, match=REFUSES_A_VALID_LAYOUT
)
@given(perturbed_layouts())
@example(EMPTY_REPLICAS)
def test_validator_agrees_with_the_oracle(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "BOX-3")
@pytest.mark.known_defect(
    "torch", ZERO_SIZE_DEFECT, raises=AssertionError, match=REFUSES_A_VALID_LAYOUT
)
@given(valid_layouts())
@example(EMPTY_REPLICAS)
def test_validator_accepts_every_valid_layout(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


@pytest.mark.rule("BOX-2")
@pytest.mark.known_defect(
    "torch",
    "validate_non_overlapping_shards_metadata reports a zero-size shard lying inside another "
    "shard as an overlap",
    raises=AssertionError,
    match=REFUSES_A_VALID_LAYOUT,
)
@given(layouts_with_buried_empty_shard())
@example(Layout((2,), [Shard(Box((0,), (2,)), 0), Shard(Box((1,), (0,)), 1)]))
def test_empty_shard_inside_another_is_not_an_overlap(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


# Large layouts (64 shards and more, where shardspec validates in NumPy): the same verdicts.
# On simulated worlds (`nox -s conformance_scale`), as many cells or ranks as the simulated
# world sizes of 64 and more, 1024 first.
SCALE = scale_worlds()


def _grid_16x8(straddle: int = 0, take: bool = False) -> Layout:
    """A 16 x 8 grid of 2 x 1 cells (128 shards); the cell at (5, 3) grows by ``straddle``
    rows into the cell below it, which gives them up when ``take``."""
    cells = {(i, j): Box((2 * i, j), (2, 1)) for i in range(16) for j in range(8)}
    cells[5, 3] = Box((10, 3), (2 + straddle, 1))
    if take:
        cells[6, 3] = Box((12 + straddle, 3), (2 - straddle, 1))
    return Layout((32, 8), [Shard(b, r) for r, b in enumerate(cells.values())])


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3")
@given(near_grid_layouts(worlds=SCALE))
@example((_grid_16x8(1), "overlap"))
@example((_grid_16x8(1, take=True), "take"))
@example((_grid_16x8(-1), "gap"))
def test_validator_finds_the_one_box_straddling_a_large_grid(
    impl: Impl, layout_kind: tuple[Layout, str]
) -> None:
    check_validator(impl, layout_kind[0])


# A 2 x 2 grid whose box (0, 0) spans both rows of column 0: every start and end of the grid
# is still there and there are 4 boxes for 4 cells; only the box's end pairs with the wrong
# start (it overlaps cell (1, 0)).
SPAN_2X2 = Layout(
    (2, 2),
    [
        Shard(Box((0, 0), (2, 1)), 0),
        Shard(Box((0, 1), (1, 1)), 1),
        Shard(Box((1, 0), (1, 1)), 2),
        Shard(Box((1, 1), (1, 1)), 3),
    ],
)


@pytest.mark.rule("LAYOUT-2", "LAYOUT-3")
@given(near_grid_layouts(min_cells=2, max_cells=24))
@example((SPAN_2X2, "span"))
def test_validator_finds_the_one_box_straddling_a_small_grid(
    impl: Impl, layout_kind: tuple[Layout, str]
) -> None:
    """Small grids (a validator's plain path), one box straddling a cell boundary along any
    dim, the dims no boundary cuts included (there the box can only fall short: a gap)."""
    check_validator(impl, layout_kind[0])


CHUNKING_80 = chunk_layout((100,), 0, range(80))  # 50 chunks of 2 rows, 30 empty ones at n
# The same with rank 79's empty chunk moved by a row, inside rank 49's rows [98, 100): valid by
# BOX-2, and what the strategy's perturbation draws (a 180-row chunking found it).
EMPTY_MOVED_INSIDE = Layout(
    (100,), [*CHUNKING_80.shards[:-1], Shard(Box((99,), (0,)), CHUNKING_80.shards[-1].rank)]
)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3")
@pytest.mark.known_defect(
    "torch",
    "validate_non_overlapping_shards_metadata reports a zero-size shard lying inside another "
    "shard as an overlap (here an empty chunk of a 80-rank chunking moved inside the last rows)",
    raises=AssertionError,
    match=REFUSES_A_VALID_LAYOUT,
)
@given(large_chunk_layouts(worlds=SCALE))
@example(CHUNKING_80)
@example(EMPTY_MOVED_INSIDE)
def test_validator_agrees_with_the_oracle_on_large_chunkings(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


# An empty box at row 11, inside the 2-row cell of rows 10-11 (valid by BOX-2).
BIG_GRID_WITH_EMPTY = Layout(
    _grid_16x8().shape, [*_grid_16x8().shards, Shard(Box((11, 3), (0, 1)), 128)]
)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "BOX-2")
@pytest.mark.known_defect(
    "torch",
    "validate_non_overlapping_shards_metadata reports a zero-size shard lying inside another "
    "shard as an overlap (here in a 128-cell grid)",
    raises=AssertionError,
    match=REFUSES_A_VALID_LAYOUT,
)
@given(large_grid_layouts(worlds=SCALE))
@example(BIG_GRID_WITH_EMPTY)
def test_validator_accepts_every_large_grid(impl: Impl, layout: Layout) -> None:
    check_validator(impl, layout)


# Large layouts of a tensor with no elements (a zero side, or 0-d with one element held as
# replicas): nothing to cover, so only bounds and repeated (box, rank) pairs decide, on the
# validator's large-layout path (64 shards and more).
_EMPTY_64 = [Shard(Box((0, 0), (0, 4)), r) for r in range(64)]
_SCALAR_64 = [Shard(Box((), ()), r) for r in range(64)]
_REPEATED_EMPTY_DEFECT = (
    "validate_non_overlapping_shards_metadata and check_tensor accept the same empty "
    "ShardMetadata twice on one rank (LAYOUT-2: a (box, rank) pair listed twice is invalid)"
)


@pytest.mark.rule("LAYOUT-1", "LAYOUT-2", "LAYOUT-3", "BOX-2")
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(Layout((0, 4), _EMPTY_64), id="zero-side-replicas"),
        pytest.param(
            Layout((0, 4), [*_EMPTY_64, _EMPTY_64[7]]),
            id="zero-side-repeated",
            marks=pytest.mark.known_defect(
                "torch",
                _REPEATED_EMPTY_DEFECT,
                raises=AssertionError,
                match=ACCEPTS_AN_INVALID_LAYOUT,
            ),
        ),
        pytest.param(
            Layout((0, 4), [*_EMPTY_64[:-1], Shard(Box((0, 5), (0, 0)), 63)]),
            id="zero-side-out-of-bounds",
        ),
        pytest.param(Layout((), _SCALAR_64), id="0d-replicas"),
        pytest.param(Layout((), [*_SCALAR_64, _SCALAR_64[0]]), id="0d-repeated"),
    ],
)
def test_validator_on_large_layouts_without_elements(impl: Impl, layout: Layout) -> None:
    assert layout._columns is not None, "the case must reach the large-layout path"
    check_validator(impl, layout)
