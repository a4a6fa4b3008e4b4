"""The multi-rank test harness shardspec.reshard.testing.RankPool, on 2 gloo ranks: results by
rank, errors with tracebacks (BaseException too), per-rank arguments, environment, and the
failure paths (hang, error then hang, death) that must kill the pool and leave no process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from reshard_pool_cases import (
    all_reduce_rank,
    environment,
    exit_on,
    pid,
    raise_on,
    raise_then_collective,
    sleep,
    unpicklable,
)

from shardspec.reshard.testing import RankDied, RankError, RankPool

WORLD = 2


def _gone(pids: list[int]) -> bool:
    # Reaped children no longer exist; a zombie would still answer signal 0.
    for p in pids:
        try:
            os.kill(p, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    with RankPool(WORLD, timeout=120, local_size=1, env={"SHARDSPEC_PROBE": "x"}) as p:
        yield p


def test_results_come_back_by_rank_from_a_real_process_group(pool: RankPool) -> None:
    # all_reduce of the ranks 0 + 1 = 1 on every rank proves the group is real.
    assert pool.run(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]
    assert pool.run(all_reduce_rank, 5) == [(0, 7, 1.0), (1, 7, 1.0)]
    assert pool.run(all_reduce_rank, per_rank=[(10,), (20,)]) == [(0, 12, 1.0), (1, 22, 1.0)]


def test_environment_reaches_the_ranks(pool: RankPool) -> None:
    assert pool.run(environment, "LOCAL_WORLD_SIZE") == ["1", "1"]
    assert pool.run(environment, "SHARDSPEC_PROBE") == ["x", "x"]


@pytest.mark.parametrize("base", [False, True])
def test_an_error_on_a_rank_comes_back_with_its_traceback(pool: RankPool, base: bool) -> None:
    with pytest.raises(RankError, match="rank 1 raised") as info:
        pool.run(raise_on, 1, base)
    assert info.value.rank == 1
    assert info.value.type_name == ("NotAnException" if base else "ValueError")
    assert info.value.message == "bad rank 1"
    assert "reshard_pool_cases.py" in info.value.traceback
    assert pool.run_all(raise_on, 0, base)[1] == ("ok", 1)
    assert pool.run_all(raise_on, 0, base)[0][:3] == (
        "err",
        info.value.type_name,
        "bad rank 0",
    )
    assert pool.alive, "an error that every rank returned from must not kill the pool"


def test_an_unpicklable_result_is_an_error_not_a_dead_rank(pool: RankPool) -> None:
    with pytest.raises(RankError, match="cannot send the result"):
        pool.run(unpicklable)
    assert pool.run(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]


def test_per_rank_must_have_one_entry_per_rank(pool: RankPool) -> None:
    with pytest.raises(ValueError, match="per_rank has 1 entries for 2 ranks"):
        pool.run(all_reduce_rank, per_rank=[(1,)])


def test_failures_kill_the_pool_and_the_next_call_restarts_it() -> None:
    # Starting ranks takes seconds under load, so only the failing calls get short limits.
    with RankPool(WORLD, timeout=120, error_grace=2) as p:
        first = p.run(pid)
        p.timeout = 3
        with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not answer within 3"):
            p.run(sleep, 60)
        p.timeout = 120
        assert not p.alive and _gone(first)
        second = p.run(pid)
        assert set(second).isdisjoint(first)
        with pytest.raises(TimeoutError, match=r"ranks \[1\] did not answer within 2") as info:
            p.run(raise_then_collective)
        assert isinstance(info.value.__cause__, RankError)
        assert _gone(second)
        third = p.run(pid)
        with pytest.raises(RankDied, match="rank 1 died during the call"):
            p.run(exit_on, 1)
        assert _gone(third)
        assert p.run(all_reduce_rank) == [(0, 2, 1.0), (1, 2, 1.0)]
        last = p.run(pid)
    assert _gone(last)
    with pytest.raises(RuntimeError, match="closed"):
        p.run(pid)
