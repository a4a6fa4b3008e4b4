"""What the planner keeps by a layout's identity (shardspec.reshard.derived): computed once
per live layout, never kept for a failure, dropped with the layout, never handed to another
layout, and the same plans as a planner that keeps nothing."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from shardspec.metadata import Box, Layout, LayoutError, chunk_layout
from shardspec.reshard import derived as cache, plan


def _rows(n: int, ranks: int) -> Layout:
    """A new layout object each call (chunk_layout hands out one object per arguments)."""
    step = -(-n // ranks)
    return Layout.from_boxes(
        (n, 4),
        [(Box((lo, 0), (min(step, n - lo), 4)), r) for r, lo in enumerate(range(0, n, step))],
    )


def test_a_value_is_made_once_per_layout_object() -> None:
    calls: list[int] = []
    a = _rows(10, 3)
    b = _rows(10, 3)  # equal, but another object
    assert a == b and a is not b

    def make(layout: Layout) -> int:
        calls.append(id(layout))
        return len(calls)

    assert cache.derived(a, "t1", make) == 1
    assert cache.derived(a, "t1", make) == 1
    assert cache.derived(b, "t1", make) == 2
    assert cache.derived(a, "t2", make) == 3  # another name, another value
    assert calls == [id(a), id(b), id(a)]


def test_a_failed_check_is_not_kept() -> None:
    bad = Layout((4,), [])  # covers nothing
    for _ in range(2):
        with pytest.raises(LayoutError):
            cache.validated(bad)


def test_an_entry_goes_with_its_layout() -> None:
    a = _rows(8, 2)
    cache.derived(a, "t", lambda _: object())
    key = id(a)
    assert key in cache._CACHE
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None
    assert key not in cache._CACHE


def test_an_entry_left_at_a_recycled_address_is_not_handed_on() -> None:
    a = _rows(8, 2)
    other = _rows(8, 4)
    # as if another layout had lived at a's address and its entry were still there
    cache._CACHE[id(a)] = (weakref.ref(other), {"t": "other's"})
    try:
        assert cache.derived(a, "t", lambda _: "a's") == "a's"
    finally:
        cache._CACHE.pop(id(a), None)


def test_threads_asking_at_once_get_one_value_each() -> None:
    layouts = [chunk_layout((64, 8), 0, range(k + 1)) for k in range(8)]
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def ask() -> None:
        for layout in layouts:
            v = cache.derived(layout, "threads", lambda x: len(x.shards))
            with lock:
                seen.append((id(layout), v))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(set(seen)) == sorted((id(x), len(x.shards)) for x in layouts)


@pytest.mark.rule("RESHARD-7")
@pytest.mark.parametrize("rank", [0, 3, 7])
def test_plans_of_one_layout_against_many_equal_fresh_ones(rank: int) -> None:
    # one source planned against many destinations (a refit's experts): the kept distinct
    # boxes give the plans that fresh copies of the source give
    src = Layout.from_boxes(
        (12, 6),
        [(Box((i, 0), (1, 6)), r) for r, i in enumerate(range(12)) if r % 5 != 4]
        + [(Box((i, 0), (1, 6)), 0) for i in range(12) if i % 5 == 4],
    )
    for k in range(1, 9):
        dst = chunk_layout((12, 6), 1, range(k))
        fresh = Layout(src.shape, src.shards)
        assert plan(src, dst, rank).pieces == plan(fresh, dst, rank).pieces
        assert plan(src, dst).pieces == plan(Layout(src.shape, src.shards), dst).pieces
