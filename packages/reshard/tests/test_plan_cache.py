"""The executor's plans cached by the layouts' fingerprints: a second reshard between layouts
of the same content (other objects, other data) plans nothing and delivers the new data; other
layouts plan anew; the cache stays within its bound."""

from __future__ import annotations

import pytest
import torch
from reshard_direct_cases import run_plans_cached

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.reshard import executor, reference
from shardspec.testing import RankPool, get_pool

WORLD = 4
SHAPE = (37, 23)  # no other test of this process reshards this shape


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


def _rows() -> Layout:
    return chunk_layout(SHAPE, 0, list(range(WORLD)))


def _columns(order: list[int]) -> Layout:
    return chunk_layout(SHAPE, 1, order)


@pytest.mark.rule("RESHARD-1")
def test_a_layout_pair_seen_before_reuses_its_plan_and_delivers_the_new_data(
    pool: RankPool,
) -> None:
    calls = [
        (_rows(), _columns([0, 1, 2, 3])),
        (_rows(), _columns([0, 1, 2, 3])),  # the same content, new objects
        (_rows(), _columns([3, 1, 0, 2])),  # other ranks: another plan
    ]
    fulls = [torch.arange(37 * 23, dtype=torch.float32).reshape(SHAPE) * (i + 1) for i in range(3)]
    per_rank = [
        ([([full[b.slices()].clone() for b in src.boxes_of(r)], src, dst)
          for (src, dst), full in zip(calls, fulls)],)
        for r in range(WORLD)
    ]  # fmt: skip
    answers = pool.call(run_plans_cached, per_rank=per_rank)
    for r, answer in enumerate(answers):
        assert [cached for _, cached in answer] == [False, True, False], r
        for (got, _), (src, dst), full in zip(answer, calls, fulls):
            ins = {q: [full[b.slices()].clone() for b in src.boxes_of(q)] for q in range(WORLD)}
            want = reference.reshard(ins, src, dst).get(r, [])
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert reference.same_bits(a, b), f"rank {r}: {a} should be {b}"


def test_the_cache_keeps_its_bound_and_drops_the_least_recent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(executor, "_PLANS", type(executor._PLANS)())
    monkeypatch.setattr(executor, "_plans_held", [0])
    monkeypatch.setattr(executor, "_PLANS_MAX", 2)
    layouts = [Layout((n,), [Shard(Box((0,), (n,)), 0)]) for n in (3, 4, 5)]
    key = [(x.fingerprint(), x.fingerprint(), 0) for x in layouts]
    first = executor._plan(layouts[0], layouts[0], 0)
    executor._plan(layouts[1], layouts[1], 0)
    assert executor._plan(layouts[0], layouts[0], 0) is first  # now the most recent
    executor._plan(layouts[2], layouts[2], 0)
    assert list(executor._PLANS) == [key[0], key[2]]
    assert executor._plans_held == [2]  # one piece a plan


def test_the_cache_keeps_its_bound_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "_PLANS", type(executor._PLANS)())
    monkeypatch.setattr(executor, "_plans_held", [0])
    monkeypatch.setattr(executor, "_PLANS_PIECES", 4)
    rows = [Layout((4, 2), [Shard(Box((i, 0), (1, 2)), 0) for i in range(4)])]
    rows.append(Layout((4, 2), [Shard(Box((0, 0), (4, 2)), 0)]))
    wide = Layout((5, 2), [Shard(Box((i, 0), (1, 2)), 0) for i in range(5)])
    executor._plan(rows[0], rows[1], 0)  # 4 pieces: kept
    assert executor._plans_held == [4] and len(executor._PLANS) == 1
    executor._plan(rows[1], rows[1], 0)  # 1 more: the oldest goes
    assert executor._plans_held == [1] and len(executor._PLANS) == 1
    executor._plan(wide, Layout((5, 2), [Shard(Box((0, 0), (5, 2)), 0)]), 0)  # 5: not kept
    assert executor._plans_held == [1] and len(executor._PLANS) == 1
