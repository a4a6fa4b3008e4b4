"""Which tensors ``reads="once"`` reads and moves as one stack (spec/09-checkpoint.md, CKPT-24;
:mod:`shardspec.checkpoint.load_stacks`), on hand-built targets: tensors of one dtype, shape,
saved chunking and destination layout (shard order included), none larger than a whole-read
chunk nor held whole by every rank; the stack's layouts are its members' with a whole leading
dim."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shardspec.checkpoint import load_stacks
from shardspec.checkpoint.load_exchange import Target, replicated
from shardspec.checkpoint.load_stacks import MEMBER_BYTES, STACK_KEY, stack_targets
from shardspec.metadata import Box, Layout, Shard, chunk_layout

torch = pytest.importorskip("torch")

ROWS = chunk_layout((6, 4), 0, [0, 1])
COLS = chunk_layout((6, 4), 1, [0, 1])
COLS_SWAPPED = Layout((6, 4), tuple(reversed(COLS.shards)))  # equal as a layout, not in order


def target(key: str, dst: Layout = COLS, chunks: Layout = ROWS, dtype: Any = None) -> Target:
    saved = SimpleNamespace(properties=SimpleNamespace(dtype=dtype or torch.float32))
    return Target(key, saved, dst, [], chunks)


def keys(targets: list[Target]) -> list[Any]:
    return [t.key if not t.members else [m.key for m in t.members] for t in targets]


@pytest.mark.rule("CKPT-24")
def test_tensors_of_one_geometry_stack_at_the_place_of_the_first() -> None:
    ts = [target("a"), target("b", dtype=torch.int32), target("c"), target("d", dst=ROWS),
          target("e"), target("f", dst=ROWS)]  # fmt: skip
    got = stack_targets(ts, 2)
    assert keys(got) == [["a", "c", "e"], "b", ["d", "f"]]
    stack = got[0]
    assert stack.key.startswith(STACK_KEY) and stack.key != got[2].key
    assert stack.dst == Layout(
        (3, 6, 4), [Shard(Box((0, *s.box.offsets), (3, *s.box.sizes)), s.rank) for s in COLS.shards]
    )
    assert [s.box for s in stack.chunks.shards] == [
        Box((0, *s.box.offsets), (3, *s.box.sizes)) for s in ROWS.shards
    ]


@pytest.mark.rule("CKPT-24")
def test_what_does_not_stack() -> None:
    big = (MEMBER_BYTES // 4) + 1  # float32 elements past a whole-read chunk
    big_rows = chunk_layout((big,), 0, [0, 1])
    whole = replicated((6, 4), 2)
    empty = chunk_layout((0, 4), 0, [0, 1])
    ts = [
        target("order-1"), target("order-2", dst=COLS_SWAPPED),  # shard order differs
        target("big-1", dst=big_rows, chunks=big_rows), target("big-2", dst=big_rows,
                                                               chunks=big_rows),
        target("whole-1", dst=whole), target("whole-2", dst=whole),  # broadcast as read
        target("empty-1", dst=empty, chunks=empty), target("empty-2", dst=empty, chunks=empty),
        target("chunks-1", dst=ROWS, chunks=COLS), target("chunks-2", dst=ROWS),  # saved apart
    ]  # fmt: skip
    assert keys(stack_targets(ts, 2)) == [
        "order-1", "order-2", "big-1", "big-2", "whole-1", "whole-2", "empty-1", "empty-2",
        "chunks-1", "chunks-2",
    ]  # fmt: skip


@pytest.mark.rule("CKPT-24")
def test_a_geometry_past_the_stack_size_makes_several_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(load_stacks, "STACK_BYTES", 3 * 24 * 4)  # three 6 x 4 float32 tensors
    ts = [target(f"t{i}") for i in range(7)]
    # 3, 3, and one left alone
    assert keys(stack_targets(ts, 2)) == [["t0", "t1", "t2"], ["t3", "t4", "t5"], "t6"]
    monkeypatch.setattr(load_stacks, "STACK_BYTES", 1)  # never fewer than two a stack
    assert keys(stack_targets(ts[:5], 2)) == [["t0", "t1"], ["t2", "t3"], "t4"]


@pytest.mark.rule("CKPT-24")
def test_whole_on_every_rank_answers_alike_past_its_cache_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardspec.checkpoint import load_exchange

    monkeypatch.setattr(load_exchange, "_WHOLE", {})
    monkeypatch.setattr(load_exchange, "_WHOLE_MAX", 2)
    layouts = [replicated((6, 4), 2), COLS, replicated((3,), 2), ROWS, replicated((6, 4), 3)]
    want = [True, False, True, False, False]  # the last: held by 3 ranks, not the 2 asked
    for _ in range(2):  # first computed, then partly from the cache, emptied along the way
        assert [load_exchange.whole_on_every_rank(x, 2) for x in layouts] == want
    assert len(load_exchange._WHOLE) <= 2
