"""The Plan object itself (spec/06-reshard.md, RESHARD-2, RESHARD-3): iterating it, its length
and its repr, on a plan worked by hand.

Source: 4 elements chunked over ranks 0 and 1 (rank 0 holds [0, 2), rank 1 holds [2, 4)).
Destination: both ranks hold all 4. Each destination shard gets two pieces, the half its rank
already holds (a local copy) and the other half from the other rank: 4 pieces, 2 of them
local, 2 + 2 = 4 elements sent.
"""

from __future__ import annotations

import pytest

from shardspec.metadata import Layout, chunk_layout
from shardspec.reshard import Piece, plan

SRC = chunk_layout((4,), 0, [0, 1])
DST = Layout.replicated((4,), [0, 1])

# Piece(offsets, sizes, src_rank, src_shard, src_local, dst_rank, dst_shard, dst_local), by
# destination shard, then offsets.
EXPECTED = [
    Piece((0,), (2,), 0, 0, 0, 0, 0, 0),
    Piece((2,), (2,), 1, 1, 0, 0, 0, 0),
    Piece((0,), (2,), 0, 0, 0, 1, 1, 0),
    Piece((2,), (2,), 1, 1, 0, 1, 1, 0),
]


@pytest.mark.rule("RESHARD-2", "RESHARD-3")
def test_iterating_a_plan_gives_its_pieces_in_canonical_order() -> None:
    p = plan(SRC, DST)
    assert list(p) == EXPECTED
    assert list(p) == list(p)  # a fresh iterator each time
    assert [piece.is_local for piece in p] == [True, False, False, True]
    # Rank 0's view: its local copy, what it receives from 1, what it sends to 1.
    assert list(plan(SRC, DST, 0)) == [EXPECTED[0], EXPECTED[1], EXPECTED[2]]


@pytest.mark.rule("RESHARD-2", "RESHARD-3")
def test_len_of_a_plan_is_its_number_of_pieces() -> None:
    assert len(plan(SRC, DST)) == 4
    assert len(plan(SRC, DST, 0)) == 3
    assert len(plan(SRC, DST, 1)) == 3
    assert len(plan(SRC, DST, 7)) == 0  # a rank in neither layout takes no part
    assert len(plan(SRC, SRC)) == 2  # everything stays where it is


@pytest.mark.rule("RESHARD-2", "RESHARD-3")
def test_repr_of_a_plan_counts_pieces_local_copies_and_elements_sent() -> None:
    assert repr(plan(SRC, DST)) == "Plan(shape=(4,), all ranks: 4 pieces, 2 local, 4 elements sent)"
    assert repr(plan(SRC, DST, 0)) == "Plan(shape=(4,), rank 0: 3 pieces, 1 local, 4 elements sent)"
    assert repr(plan(SRC, SRC)) == "Plan(shape=(4,), all ranks: 2 pieces, 2 local, 0 elements sent)"
    assert repr(plan(SRC, DST, 7)) == "Plan(shape=(4,), rank 7: 0 pieces, 0 local, 0 elements sent)"
