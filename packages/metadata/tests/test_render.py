"""Text rendering of layouts (spec/04-convert.md, CONVERT-10): hand-worked pictures."""

from __future__ import annotations

import re

import pytest
from hypothesis import given

from shardspec.metadata import Box, Layout, Shard, chunk_layout, render
from shardspec.metadata.strategies import shapes, valid_layouts


def L(shape: tuple[int, ...], *shards: tuple[tuple[int, ...], tuple[int, ...], int]) -> Layout:
    return Layout(shape, [Shard(Box(o, s), r) for o, s, r in shards])


def lines(*rows: str) -> str:
    return "\n".join(rows)


CASES = [
    pytest.param(
        chunk_layout((7,), 0, [0, 1, 2]),
        lines(
            "Layout shape=(7,): 3 shards on ranks 0-2",
            "0    3    6    7",
            "+----+----+----+",
            "| r0 | r1 | r2 |",
            "+----+----+----+",
        ),
        id="1d-uneven-chunk",
    ),
    pytest.param(
        # replicas on one region, an empty shard listed below
        L((5,), ((0,), (3,), 0), ((3,), (2,), 1), ((0,), (3,), 2), ((5,), (0,), 3)),
        lines(
            "Layout shape=(5,): 4 shards on ranks 0-3",
            "0       3       5",
            "+-------+-------+",
            "| r0,r2 |   r1  |",
            "+-------+-------+",
            "empty shards (hold no element):",
            "  shard 3 rank 3: [5:5]",
        ),
        id="1d-replicas-empty",
    ),
    pytest.param(
        chunk_layout((5, 6), 0, [0, 1, 2, 3]),
        lines(
            "Layout shape=(5, 6): 4 shards on ranks 0-3",
            "  0    6",
            "0 +----+",
            "  | r0 |",
            "2 +----+",
            "  | r1 |",
            "4 +----+",
            "  | r2 |",
            "5 +----+",
            "empty shards (hold no element):",
            "  shard 3 rank 3: [5:5, 0:6]",
        ),
        id="2d-rows-with-empty",
    ),
    pytest.param(
        # a box spanning two column segments, replicas in a cell
        L(
            (4, 6),
            ((0, 0), (2, 6), 0),
            ((2, 0), (2, 3), 1),
            ((2, 3), (2, 3), 2),
            ((2, 3), (2, 3), 5),
        ),
        lines(
            "Layout shape=(4, 6): 4 shards on ranks 0, 1, 2, 5",
            "  0       3       6",
            "0 +---------------+",
            "  |       r0      |",
            "2 +-------+-------+",
            "  |   r1  | r2,r5 |",
            "4 +-------+-------+",
        ),
        id="2d-merged-columns-replicas",
    ),
    pytest.param(
        # a box spanning two row segments; one rank holding two boxes
        L((2, 10), ((0, 0), (2, 4), 0), ((0, 4), (1, 6), 0), ((1, 4), (1, 6), 1)),
        lines(
            "Layout shape=(2, 10): 3 shards on ranks 0, 1",
            "  0    4    10",
            "0 +----+----+",
            "  | r0 | r0 |",
            "1 |    +----+",
            "  |    | r1 |",
            "2 +----+----+",
        ),
        id="2d-merged-rows",
    ),
    pytest.param(
        # a million rows draw as one line per segment; the cut labels stay exact
        chunk_layout((1_000_000, 12), 1, [0, 1, 2]),
        lines(
            "Layout shape=(1000000, 12): 3 shards on ranks 0-2",
            "        0    4    8    12",
            "      0 +----+----+----+",
            "        | r0 | r1 | r2 |",
            "1000000 +----+----+----+",
        ),
        id="2d-large-dim-scaled",
    ),
    pytest.param(
        # many replicas: three named, the rest counted
        Layout.replicated((3,), [7, 1, 0, 5, 2, 6]),
        lines(
            "Layout shape=(3,): 6 shards on ranks 0, 1, 2, 5, 6, 7",
            "0             3",
            "+-------------+",
            "| r0,r1,r2,+3 |",
            "+-------------+",
        ),
        id="1d-many-replicas",
    ),
    pytest.param(
        chunk_layout((0, 12), 1, [0, 1]),
        lines(
            "Layout shape=(0, 12): 2 shards on ranks 0, 1",
            "(no elements: a dim has size 0)",
            "empty shards (hold no element):",
            "  shard 0 rank 0: [0:0, 0:6]",
            "  shard 1 rank 1: [0:0, 6:12]",
        ),
        id="2d-zero-size",
    ),
    pytest.param(
        chunk_layout((2, 3, 4), 1, [0, 1, 2, 3]),
        lines(
            "Layout shape=(2, 3, 4): 4 shards on ranks 0-3",
            "  shard  rank  box",
            "      0     0  [0:2, 0:1, 0:4]",
            "      1     1  [0:2, 1:2, 0:4]",
            "      2     2  [0:2, 2:3, 0:4]",
            "      3     3  [0:2, 3:3, 0:4]  empty",
        ),
        id="3d-table",
    ),
    pytest.param(
        Layout.replicated((), [0, 4]),
        lines(
            "Layout shape=(): 2 shards on ranks 0, 4",
            "  shard  rank  box",
            "      0     0  []",
            "      1     4  []",
        ),
        id="0d-table",
    ),
]


@pytest.mark.rule("CONVERT-10")
@pytest.mark.parametrize(("layout", "expected"), CASES)
def test_render_hand_worked(layout: Layout, expected: str) -> None:
    got = render(layout)
    assert got == expected, f"\n{got}\n---- but should be ----\n{expected}"
    assert layout.render() == expected


@pytest.mark.rule("CONVERT-10")
def test_render_invalid_layout_is_a_table_with_the_reason() -> None:
    got = render(L((3,), ((0,), (3,), 0), ((0,), (1,), 1)))
    first, reason, *table = got.splitlines()
    assert first == "Layout shape=(3,): 2 shards on ranks 0, 1"
    assert reason.startswith("invalid layout, shown as a table: ") and "overlap" in reason
    assert table == ["  shard  rank  box", "      0     0  [0:3]", "      1     1  [0:1]"]


@pytest.mark.rule("CONVERT-10")
def test_render_too_many_cuts_is_a_table() -> None:
    got = render(chunk_layout((100,), 0, range(20))).splitlines()
    assert got[1] == "too many cuts to draw (20 segments; limit 16), shown as a table:"
    assert got[2] == "  shard  rank  box"
    assert got[-1] == "     19    19  [95:100]"
    assert len(got) == 3 + 20
    # a larger limit draws it
    assert "+" in render(chunk_layout((100,), 0, range(20)), max_cols=20)


@pytest.mark.rule("CONVERT-10")
@given(valid_layouts(shapes(min_dims=1, max_dims=2, max_side=30), max_ranks=8))
def test_render_shows_every_cut_and_every_holder(layout: Layout) -> None:
    text = render(layout)
    if layout.numel == 0:
        assert "(no elements" in text
    else:
        cut_line = text.splitlines()[1]
        cols = layout.shape[-1]
        cuts = {0, cols} | {
            x
            for s in layout.shards
            if not s.box.is_empty
            for x in (s.box.offsets[-1], s.box.stops[-1])
        }
        assert [int(t) for t in cut_line.split()] == sorted(cuts)
        picture = text.split("empty shards")[0]
        owners: dict[Box, list[int]] = {}
        for s in layout.shards:
            if not s.box.is_empty:
                owners.setdefault(s.box, []).append(s.rank)
        # Each region's label: all its ranks, or beyond four the three smallest and a count.
        want = set()
        for ranks in owners.values():
            rs = sorted(ranks)
            want.add(
                ",".join(f"r{r}" for r in rs)
                if len(rs) <= 4
                else ",".join(f"r{r}" for r in rs[:3]) + f",+{len(rs) - 3}"
            )
        labels = set(re.findall(r"r[\d,r+]*\d", picture))
        assert labels == want, f"{labels}, but should be {want}\n{text}"
    empties = [s for s in layout.shards if s.box.is_empty]
    if empties:
        listed = text.split("empty shards (hold no element):\n")[1].splitlines()
        assert len(listed) == len(empties)
