"""``decide_at_root``: rank 0 of the group decides from every rank's record and every rank
gets its verdict (RESHARD-5, CKPT-23), on a pool of 4 gloo ranks, on the world and on a
subgroup whose rank 0 is not global rank 0."""

from __future__ import annotations

import pytest
from agreement_cases import run_decide

from shardspec.testing import RankPool, get_pool

WORLD = 4
pytestmark = pytest.mark.rule("RESHARD-5", "CKPT-23")


@pytest.fixture(scope="module")
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


@pytest.mark.parametrize(
    ("members", "joined"), [(None, "r0,r1,r2,r3"), ([1, 3], "r1,r3"), ([2], "r2")]
)
def test_every_member_gets_rank_0s_verdict_on_the_records_in_group_rank_order(
    pool: RankPool, members: list[int] | None, joined: str
) -> None:
    got = pool.call(run_decide, members, "join", 0)
    n = len(joined.split(","))
    for rank, answer in enumerate(got):
        if members is None or rank in members:
            assert answer == (joined, -n)
        else:
            assert answer is None


def test_a_rule_that_raises_on_rank_0_is_every_ranks_error(pool: RankPool) -> None:
    got = pool.call(run_decide, [0, 2, 3], "raise", 0)
    for rank in (0, 2, 3):
        error, value = got[rank]
        assert error is not None and value == 0
        assert error.startswith("the agreement's rule failed on rank 0: ZeroDivisionError")
    assert got[1] is None


ROOM = 8192 - 13  # the verdict's size less its head


@pytest.mark.parametrize("width", [100, ROOM - 1, ROOM, 20000])
def test_a_message_that_does_not_fit_the_verdict_is_cut_and_says_so(
    pool: RankPool, width: int
) -> None:
    """A message of ``width`` characters, the last of 2 bytes in UTF-8: up to ROOM bytes
    (width ROOM - 1) it arrives whole, one byte more and it is cut, and says so."""
    sent = "x" * (width - 1) + "é"
    got = pool.call(run_decide, None, "long", width)
    assert len(set(got)) == 1
    error, value = got[0]
    assert value == 2**40
    assert error is not None
    if width < ROOM:
        assert error == sent
    else:
        assert error.endswith(" [cut: the message was longer]")
        assert len(error.encode()) <= ROOM
        assert error.startswith("x" * 1000)
