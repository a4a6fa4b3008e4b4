"""TorchRec sharding types as layouts (spec/08-torchrec.md, TORCHREC-1..9). No TorchRec needed."""

from __future__ import annotations

import sys

import pytest
from hypothesis import assume, given, strategies as st
from torchrec_oracle import (
    brute_block_width,
    chunk_owner_index,
    cumulative_owner_index,
    owners_of,
)

from shardspec.metadata import Box, LayoutError
from shardspec.testing import scaled
from shardspec.torchrec import (
    column_block_size,
    column_wise,
    data_parallel,
    grid_shard,
    layout_for,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)

rows_st = st.integers(0, 13)
cols_st = st.integers(0, 20)
world_st = st.integers(1, 9)


def explicit_sizes(total: int, k: int) -> st.SearchStrategy[list[int]]:
    """k non-negative sizes adding up to total (zeros included)."""
    return st.lists(st.integers(0, total), min_size=k - 1, max_size=k - 1).map(
        lambda cuts: [b - a for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), total])]
    )


def test_importing_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, shardspec.torchrec; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=scaled(120),
    )
    assert out.stdout.strip() == "False"


# --- TORCHREC-1, -2 -----------------------------------------------------------------------


@pytest.mark.rule("TORCHREC-1")
@given(rows_st, cols_st, world_st)
def test_data_parallel_every_rank_holds_everything(rows: int, cols: int, world: int) -> None:
    layout = data_parallel((rows, cols), world).validate()
    for point, owners in owners_of(layout).items():
        assert owners == set(range(world)), f"{point} owned by {owners}, should be all {world}"
    assert layout.ranks == tuple(range(world))


@pytest.mark.rule("TORCHREC-2")
@given(rows_st, cols_st, st.integers(0, 7))
def test_table_wise_one_rank_holds_everything(rows: int, cols: int, rank: int) -> None:
    layout = table_wise((rows, cols), rank).validate()
    assert [s.rank for s in layout.shards] == [rank]
    for point, owners in owners_of(layout).items():
        assert owners == {rank}, f"{point} owned by {owners}"


# --- TORCHREC-3, -4: row_wise -------------------------------------------------------------


@pytest.mark.rule("TORCHREC-3")
@pytest.mark.parametrize(
    ("rows", "world", "expected"),
    [
        (10, 4, [3, 3, 3, 1]),  # ceil blocks, not 3,3,2,2 (TorchRec's own docstring example)
        (5, 4, [2, 2, 1, 0]),
        (8, 4, [2, 2, 2, 2]),
        (2, 5, [1, 1, 0, 0, 0]),
        (0, 3, [0, 0, 0]),
    ],
)
def test_row_wise_default_hand_worked(rows: int, world: int, expected: list[int]) -> None:
    layout = row_wise((rows, 3), world).validate()
    assert [s.box.sizes[0] for s in layout.shards] == expected
    assert [s.rank for s in layout.shards] == list(range(world))
    for s in layout.shards:
        if s.box.sizes[0] == 0:
            assert s.box.offsets == (rows, 0), f"empty row block at {s.box.offsets}"


@pytest.mark.rule("TORCHREC-3")
@given(rows_st, st.integers(1, 5), world_st)
def test_row_wise_default_matches_brute_force(rows: int, cols: int, world: int) -> None:
    layout = row_wise((rows, cols), world).validate()
    for (i, _j), owners in owners_of(layout).items():
        assert owners == {chunk_owner_index(i, rows, world)}, f"row {i}: {owners}"
    assert len(layout.shards) == world


@pytest.mark.rule("TORCHREC-4")
@given(st.data(), rows_st, st.integers(1, 4), st.integers(1, 6))
def test_row_wise_explicit_sizes(data: st.DataObject, rows: int, cols: int, k: int) -> None:
    sizes = data.draw(explicit_sizes(rows, k))
    ranks = data.draw(st.permutations(range(k + 2)).map(lambda p: list(p[:k])))
    layout = row_wise((rows, cols), ranks, sizes=sizes).validate()
    for (i, _j), owners in owners_of(layout).items():
        assert owners == {ranks[cumulative_owner_index(i, sizes)]}
    assert [s.box.sizes[0] for s in layout.shards] == sizes


@pytest.mark.rule("TORCHREC-4")
def test_row_wise_buckets_hand_worked() -> None:
    # TorchRec's docstring: 10 rows, 4 ranks, 5 buckets of 2 rows -> 4, 2, 2, 2.
    layout = row_wise((10, 2), 4, num_buckets=5).validate()
    assert [s.box.sizes[0] for s in layout.shards] == [4, 2, 2, 2]
    assert [s.box.offsets[0] for s in layout.shards] == [0, 4, 6, 8]


@pytest.mark.rule("TORCHREC-4")
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": [3, 3]}, "add up to 6 but the dim has 7"),
        ({"sizes": [4, 4]}, "add up to 8 but the dim has 7"),
        ({"sizes": [7]}, "1 sizes for 2 ranks"),
        ({"num_buckets": 1}, "1 buckets cannot cover 2 ranks"),
        ({"num_buckets": 3}, "7 rows do not divide into 3 buckets"),
    ],
)
def test_row_wise_refuses_bad_sizes(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        row_wise((7, 2), 2, **kwargs)  # type: ignore[arg-type]


@pytest.mark.rule("TORCHREC-3")
def test_row_wise_refuses_a_repeated_rank_and_a_3d_shape() -> None:
    with pytest.raises(LayoutError, match="name a rank twice"):
        row_wise((4, 2), [0, 0])
    with pytest.raises(LayoutError, match="2-D"):
        row_wise((4, 2, 1), 2)


# --- TORCHREC-5, -6: column_wise ----------------------------------------------------------


@pytest.mark.rule("TORCHREC-5")
@pytest.mark.parametrize(
    ("cols", "lower", "expected"),
    [(256, None, 128), (100, None, 100), (8, 2, 4), (12, 3, 4), (6, 3, 6), (16, 4, 4), (24, 5, 8)],
)
def test_column_block_size_hand_worked(cols: int, lower: int | None, expected: int) -> None:
    assert column_block_size(cols, lower) == expected


@pytest.mark.rule("TORCHREC-5")
@given(st.integers(0, 300), st.integers(0, 140))
def test_column_block_size_matches_brute_force(cols: int, lower: int) -> None:
    assert column_block_size(cols, lower) == brute_block_width(cols, lower or 128)


@pytest.mark.rule("TORCHREC-5")
def test_column_wise_hand_worked() -> None:
    # 8 columns on 4 ranks: width rounds up to 4, so only ranks 0 and 1 get a block.
    layout = column_wise((3, 8), [0, 1, 2, 3]).validate()
    assert [(s.box, s.rank) for s in layout.shards] == [
        (Box((0, 0), (3, 4)), 0),
        (Box((0, 4), (3, 4)), 1),
    ]
    # Several blocks per rank.
    layout = column_wise((2, 16), [0, 1, 0, 1]).validate()
    assert layout.boxes_of(0) == (Box((0, 0), (2, 4)), Box((0, 8), (2, 4)))
    assert layout.boxes_of(1) == (Box((0, 4), (2, 4)), Box((0, 12), (2, 4)))


@pytest.mark.rule("TORCHREC-5")
@given(st.data(), rows_st, st.integers(1, 6), st.integers(1, 6))
def test_column_wise_default_matches_brute_force(
    data: st.DataObject, rows: int, per: int, k: int
) -> None:
    cols = per * k
    ranks = data.draw(st.lists(st.integers(0, 4), min_size=k, max_size=k))
    layout = column_wise((rows, cols), ranks).validate()
    width = brute_block_width(cols, per)
    for (_i, j), owners in owners_of(layout).items():
        assert owners == {ranks[j // width]}, f"column {j} (width {width}): {owners}"
    assert len(layout.shards) == cols // width


@pytest.mark.rule("TORCHREC-5")
def test_column_wise_refuses_uneven_division() -> None:
    with pytest.raises(LayoutError, match="cannot be evenly divided"):
        column_wise((3, 10), [0, 1, 2])


@pytest.mark.rule("TORCHREC-6")
@given(st.data(), rows_st, cols_st, st.integers(1, 5))
def test_column_wise_explicit_sizes(data: st.DataObject, rows: int, cols: int, k: int) -> None:
    sizes = data.draw(explicit_sizes(cols, k))
    ranks = data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
    layout = column_wise((rows, cols), ranks, sizes=sizes).validate()
    for (_i, j), owners in owners_of(layout).items():
        assert owners == {ranks[cumulative_owner_index(j, sizes)]}


@pytest.mark.rule("TORCHREC-6")
def test_column_wise_refuses_sizes_that_do_not_add_up() -> None:
    with pytest.raises(LayoutError, match="add up to 5 but the dim has 6"):
        column_wise((2, 6), [0, 1], sizes=[2, 3])
    with pytest.raises(LayoutError, match="2 sizes for 3 ranks"):
        column_wise((2, 6), [0, 1, 2], sizes=[3, 3])


# --- TORCHREC-7, -8, -9: per host ---------------------------------------------------------


@pytest.mark.rule("TORCHREC-7")
def test_table_row_wise_hand_worked() -> None:
    layout = table_row_wise((7, 4), host_index=1, local_size=2).validate()
    assert [(s.box, s.rank) for s in layout.shards] == [
        (Box((0, 0), (4, 4)), 2),
        (Box((4, 0), (3, 4)), 3),
    ]


@pytest.mark.rule("TORCHREC-7")
@given(rows_st, st.integers(1, 4), st.integers(0, 3), st.integers(1, 4))
def test_table_row_wise_matches_brute_force(rows: int, cols: int, host: int, local: int) -> None:
    layout = table_row_wise((rows, cols), host, local).validate()
    for (i, _j), owners in owners_of(layout).items():
        assert owners == {host * local + chunk_owner_index(i, rows, local)}
    assert layout.ranks == tuple(range(host * local, host * local + local))


@pytest.mark.rule("TORCHREC-8")
def test_table_column_wise_hand_worked_and_one_host() -> None:
    layout = table_column_wise((3, 8), [2, 3], local_size=2, block_size=4).validate()
    assert [(s.box, s.rank) for s in layout.shards] == [
        (Box((0, 0), (3, 4)), 2),
        (Box((0, 4), (3, 4)), 3),
    ]
    with pytest.raises(LayoutError, match="span hosts"):
        table_column_wise((3, 8), [1, 2], local_size=2, block_size=4)
    with pytest.raises(LayoutError, match="2 column blocks"):
        table_column_wise((3, 8), [2, 3, 2], local_size=2, block_size=4)


@pytest.mark.rule("TORCHREC-8")
@given(st.data(), rows_st, st.integers(1, 4), st.integers(1, 4), st.integers(0, 2))
def test_table_column_wise_matches_brute_force(
    data: st.DataObject, rows: int, blocks: int, local: int, host: int
) -> None:
    width = 4 * data.draw(st.integers(1, 2))
    cols = width * blocks
    assume(brute_block_width(cols, width) == width)
    ranks = data.draw(
        st.lists(
            st.integers(host * local, host * local + local - 1), min_size=blocks, max_size=blocks
        )
    )
    layout = table_column_wise((rows, cols), ranks, local, block_size=width).validate()
    for (_i, j), owners in owners_of(layout).items():
        assert owners == {ranks[j // width]}


@pytest.mark.rule("TORCHREC-9")
def test_grid_shard_hand_worked() -> None:
    layout = grid_shard((5, 8), [1, 0], local_size=2, block_size=4).validate()
    assert [(s.box, s.rank) for s in layout.shards] == [
        (Box((0, 0), (3, 4)), 2),
        (Box((3, 0), (2, 4)), 3),
        (Box((0, 4), (3, 4)), 0),
        (Box((3, 4), (2, 4)), 1),
    ]


@pytest.mark.rule("TORCHREC-9")
@given(st.data(), rows_st, st.integers(1, 3), st.integers(1, 3))
def test_grid_shard_matches_brute_force(
    data: st.DataObject, rows: int, blocks: int, local: int
) -> None:
    cols = 4 * blocks
    hosts = data.draw(st.permutations(range(blocks + 1)).map(lambda p: list(p[:blocks])))
    layout = grid_shard((rows, cols), hosts, local, block_size=4).validate()
    for (i, j), owners in owners_of(layout).items():
        expected = hosts[j // 4] * local + chunk_owner_index(i, rows, local)
        assert owners == {expected}, f"({i}, {j}): {owners}, should be {expected}"


@pytest.mark.rule("TORCHREC-9")
def test_grid_shard_refuses_a_host_count_that_does_not_match_the_blocks() -> None:
    with pytest.raises(LayoutError, match=r"2 column blocks .* but 1 hosts"):
        grid_shard((4, 8), [0], local_size=2, block_size=4)
    with pytest.raises(LayoutError, match="name a host twice"):
        grid_shard((4, 8), [0, 0], local_size=2, block_size=4)


@pytest.mark.rule("TORCHREC-1", "TORCHREC-3", "TORCHREC-5", "TORCHREC-7", "TORCHREC-9")
def test_layout_for_dispatches_by_name() -> None:
    assert layout_for("row_wise", (10, 4), 4) == row_wise((10, 4), 4)
    assert layout_for("data_parallel", (3, 4), 2) == data_parallel((3, 4), 2)
    assert layout_for("grid_shard", (4, 8), [0, 1], 2, block_size=4) == grid_shard(
        (4, 8), [0, 1], 2, block_size=4
    )
    with pytest.raises(LayoutError, match="unknown sharding type 'diagonal'"):
        layout_for("diagonal", (3, 4))
