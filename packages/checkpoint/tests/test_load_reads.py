"""Who reads what in ``shardspec.checkpoint.load`` (spec/09-checkpoint.md, CKPT-24, CKPT-25):
``assign_reads`` and ``row_runs`` on drawn saved chunkings and destinations (the runs tile the
non-empty chunks, each a row run inside its chunk, one reader each, loads bounded), and
``choose_reads`` on hand-worked cases."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shardspec.checkpoint import load_reads
from shardspec.checkpoint.load_reads import (
    TensorReads,
    assign_reads,
    choose_reads,
    contiguous_run,
    row_runs,
)
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts


def _elements(box: Box) -> set[tuple[int, ...]]:
    import itertools

    return set(itertools.product(*(range(o, o + n) for o, n in zip(box.offsets, box.sizes))))


@st.composite
def loads(draw: st.DrawFn) -> tuple[list[TensorReads], int]:
    world = draw(st.integers(1, 6))
    tensors = []
    for k in range(draw(st.integers(1, 3))):
        shape = draw(shapes(min_dims=0, max_dims=3, max_side=6))
        saved = draw(valid_layouts(st.just(shape), replicas=False))
        dst = draw(valid_layouts(st.just(shape), world=world))
        dst = Layout(shape, [Shard(s.box, s.rank % world) for s in dst.shards])
        itemsize = draw(st.sampled_from([1, 2, 4, 8]))
        chunks = tuple(s.box for s in saved.shards)
        if draw(st.integers(0, 2)) == 0:  # a stack of n tensors of this geometry
            n = draw(st.integers(1, 40))
            chunks = tuple(_lift(b, n) for b in chunks)
            dst = Layout((n, *shape), [Shard(_lift(s.box, n), s.rank) for s in dst.shards])
            tensors.append(TensorReads(f"t{k}", itemsize, chunks, dst, stacked=True))
        else:
            tensors.append(TensorReads(f"t{k}", itemsize, chunks, dst))
    return tensors, world


def _lift(box: Box, n: int) -> Box:
    return Box((0, *box.offsets), (n, *box.sizes))


@pytest.fixture(params=[True, False], ids=["runs-cut-small", "runs-as-shipped"])
def small_runs(request: Any, monkeypatch: pytest.MonkeyPatch) -> bool:
    # The shipped minimum run (4 MiB) is never reached by drawn shapes: lower it to 1 byte so
    # that chunks are cut into row runs too.
    if request.param:
        monkeypatch.setattr(load_reads, "MIN_RUN_BYTES", 1)
    return bool(request.param)


@pytest.mark.rule("CKPT-24")
# the fixture only sets a module constant for the whole test: nothing to reset per input
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=loads())
def test_the_runs_tile_every_non_empty_chunk_once_each_with_one_reader(
    small_runs: bool, case: tuple[list[TensorReads], int]
) -> None:
    tensors, world = case
    runs = assign_reads(tensors, world)
    by_key = {t.key: t for t in tensors}
    per_chunk: dict[tuple[str, int], list[Box]] = {}
    load = Counter[int]()
    for run in runs:
        t = by_key[run.key]
        chunk = t.chunks[run.chunk]
        assert 0 <= run.reader < world
        assert not run.box.is_empty
        assert run.nbytes == run.box.numel * t.itemsize
        # a row run: inside its chunk, spanning every dim but the first
        assert chunk.intersect(run.box) == run.box
        assert run.box.sizes[1:] == chunk.sizes[1:] and run.box.offsets[1:] == chunk.offsets[1:]
        per_chunk.setdefault((run.key, run.chunk), []).append(run.box)
        load[run.reader] += run.nbytes
    for t in tensors:
        for i, c in enumerate(t.chunks):
            got = per_chunk.pop((t.key, i), [])
            if c.is_empty:
                assert got == []
                continue
            cells = [_elements(b) for b in got]
            assert sum(map(len, cells)) == c.numel  # no element twice
            assert set().union(*cells) == _elements(c)  # and every one
    assert per_chunk == {}
    total = sum(c.numel * t.itemsize for t in tensors for c in t.chunks)
    share = math.ceil(total / world)
    largest = max((r.nbytes for r in runs), default=0)
    assert max(load.values(), default=0) <= share + largest
    for run in runs:
        t = by_key[run.key]
        if t.stacked:  # cut across its members: at most an eighth of a share, or one member
            member = run.nbytes // run.box.sizes[0]
            assert run.nbytes <= max(math.ceil(share / load_reads.STACK_PARTS), member) + member


@pytest.mark.rule("CKPT-24")
@given(st.integers(0, 50), st.integers(0, 4), st.integers(1, 8), st.integers(1, 400))
def test_row_runs_are_the_fewest_near_equal_runs_within_the_bound(
    rows: int, inner: int, itemsize: int, most: int
) -> None:
    chunk = Box((3, 1), (rows, inner))
    old = load_reads.MIN_RUN_BYTES
    load_reads.MIN_RUN_BYTES = 1
    try:
        runs = row_runs(chunk, itemsize, most)
    finally:
        load_reads.MIN_RUN_BYTES = old
    assert sum(r.sizes[0] for r in runs) == rows
    assert [r.offsets[0] for r in runs] == [3 + sum(r.sizes[0] for r in runs[:i])
                                             for i in range(len(runs))]  # fmt: skip
    sizes = [r.sizes[0] for r in runs]
    assert max(sizes) - min(sizes) <= 1
    row_bytes = inner * itemsize
    if row_bytes and rows * row_bytes > most:
        # each run within the bound unless one row alone exceeds it; no fewer runs would do
        assert len(runs) == min(rows, math.ceil(rows * row_bytes / most))
    else:
        assert runs == [chunk]


def test_contiguous_run_counts_the_trailing_full_dims() -> None:
    chunk = Box((0, 0, 0), (4, 6, 8))
    assert contiguous_run(chunk, Box((1, 0, 0), (2, 6, 8))) == 96  # rows: one run
    assert contiguous_run(chunk, Box((0, 2, 0), (4, 3, 8))) == 24  # a cut in dim 1
    assert contiguous_run(chunk, Box((0, 0, 4), (4, 6, 4))) == 4  # a cut in the last dim
    assert contiguous_run(Box((), ()), Box((), ())) == 1


BIG = (2048, 1024)  # float32: 8 MiB
LARGE = (8192, 1024)  # float32: 32 MiB
HUGE = (32768, 1024)  # float32: 128 MiB


@pytest.mark.rule("CKPT-25")
def test_auto_reads_once_for_replicas_long_strided_reads_and_shared_small_chunks_only() -> None:
    rows4 = tuple(s.box for s in chunk_layout(BIG, 0, [0, 1, 2, 3]).shards)
    cols2 = chunk_layout(BIG, 1, [0, 1])
    rows2 = chunk_layout(BIG, 0, [0, 1])
    whole = Box((0, 0), BIG)
    replicated = Layout(BIG, [Shard(whole, 0), Shard(whole, 1)])
    # rows -> columns: pieces of 1 MiB in runs of 2 KiB
    assert choose_reads([TensorReads("w", 4, rows4, cols2)]) == "once"
    # rows -> rows: long runs of each rank's own
    assert choose_reads([TensorReads("w", 4, rows4, rows2)]) == "own"
    # a replicated destination, however small
    tiny = (3, 2)
    assert choose_reads([TensorReads("b", 1, (Box((0, 0), tiny),),
                                     Layout(tiny, [Shard(Box((0, 0), tiny), r) for r in (0, 1)]))
                         ]) == "once"  # fmt: skip
    assert choose_reads([TensorReads("w", 4, rows4, replicated)]) == "once"
    # small strided pieces (48 x 40 float32 rows -> columns): each rank reads every small
    # chunk whole for its columns, so each is read twice (CKPT-14)
    small = (48, 40)
    s_rows = tuple(s.box for s in chunk_layout(small, 0, [0, 1, 2, 3]).shards)
    assert choose_reads([TensorReads("s", 4, s_rows, chunk_layout(small, 1, [0, 1]))]) == "once"
    # the same as rows: each chunk is one rank's
    assert choose_reads([TensorReads("s", 4, s_rows, chunk_layout(small, 0, [0, 1]))]) == "own"
    # a pre-resharded checkpoint: each saved chunk is one rank's box
    assert choose_reads([TensorReads("w", 4, tuple(s.box for s in cols2.shards), cols2)]) == "own"
    # an empty tensor replicated: nothing to read twice
    empty = Layout((0, 3), [Shard(Box((0, 0), (0, 3)), r) for r in (0, 1)])
    assert choose_reads([TensorReads("e", 4, (Box((0, 0), (0, 3)),), empty)]) == "own"


@pytest.mark.rule("CKPT-25")
def test_auto_on_local_storage_takes_the_cheaper_mode_and_own_on_a_tie() -> None:
    # 32 MiB: a rank's part of a row chunk reaches the 1 MiB of the strided rule
    rows4 = tuple(s.box for s in chunk_layout(LARGE, 0, [0, 1, 2, 3]).shards)
    whole = Box((0, 0), LARGE)
    cases = {
        # each rank reads the whole 32 MiB span of its columns itself; once reads 16 MiB a
        # rank and moves half of each rank's 16 MiB (8 MiB, at 6x a read): own is cheaper
        "rows -> 2 column ranks": (chunk_layout(LARGE, 1, [0, 1]), "own", "once"),
        # replicated on 4: own reads 32 MiB a rank, once moves 24 MiB to each
        "replicated on 4": (Layout(LARGE, [Shard(whole, r) for r in range(4)]), "own", "once"),
        # 8 column ranks of 512-byte runs: own reads 32 MiB a rank for the 4 MiB it wants,
        # once reads 4 MiB a rank and moves 3.5 MiB to each (21 MiB at 6x), and its exchange
        # counts 16 MiB: own is cheaper; at 128 MiB own reads 128 MiB, once 16 + 6 x 14 + 16
        "rows -> 8 column ranks": (chunk_layout(LARGE, 1, list(range(8))), "own", "once"),
        "rows -> 8 column ranks, 128 MiB": (chunk_layout(HUGE, 1, list(range(8))), "once", "once"),
        # long runs of each rank's own: nothing is read twice, nothing to choose
        "rows -> 2 row ranks": (chunk_layout(LARGE, 0, [0, 1]), "own", "own"),
    }
    for name, (dst, local, shared) in cases.items():
        rows = (
            rows4
            if dst.shape == LARGE
            else tuple(s.box for s in chunk_layout(dst.shape, 0, [0, 1, 2, 3]).shards)
        )
        t = [TensorReads("w", 4, rows, dst)]
        world = len(set(dst.ranks))
        own, once = load_reads.read_costs(t, world)
        assert choose_reads(t, "local", world) == local, (name, own, once)
        assert (once < own) == (local == "once"), (name, own, once)
        assert choose_reads(t, "shared", world) == shared, name
    # the costs' parts, counted by hand for the 8 column ranks (float32, 4 row chunks of
    # 2048 x 1024): own's span of a rank's 128 columns in a chunk is 2047 rows and 128
    # elements; once reads 32 MiB / 8 and moves 7/8 of each rank's 4 MiB
    t = [TensorReads("w", 4, rows4, chunk_layout(LARGE, 1, list(range(8))))]
    span = (2047 * 1024 + 128) * 4
    once = (4 << 20) + 6 * ((4 << 20) * 7 // 8) + (16 << 20)
    assert load_reads.read_costs(t, 8) == (4 * span, once)
    # a tie goes to own: moving is the riskier cost (the other ranks' network, memory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_reads, "read_costs", lambda *_: (5, 5))
        assert choose_reads(t, "local", 8) == "own"
        mp.setattr(load_reads, "read_costs", lambda *_: (5, 4))
        assert choose_reads(t, "local", 8) == "once"
    with pytest.raises(ValueError, match="storage must be one of"):
        choose_reads(t, "nfs", 8)


@pytest.mark.rule("CKPT-25")
def test_auto_on_local_storage_counts_the_small_chunks_each_mode_reads() -> None:
    # 48 x 40 float32 saved as 4 row chunks of 1,920 bytes, loaded as columns on 2 ranks.
    # own: a rank's 960 columns' bytes of each chunk, read with the rest of the chunk (960
    # more), 4 chunks at 256 KiB each; once: half the bytes, 2 chunks, moving half a rank's
    # 3,840 bytes at 6x, and 16 MiB for its exchange
    small = (48, 40)
    rows = tuple(s.box for s in chunk_layout(small, 0, [0, 1, 2, 3]).shards)
    t = TensorReads("s", 4, rows, chunk_layout(small, 1, [0, 1]))
    own = 3840 + 4 * 960 + 4 * (256 << 10)
    once = 3840 + 2 * (256 << 10) + 6 * 1920 + (16 << 20)
    assert load_reads.read_costs([t], 2) == (own, once)
    assert choose_reads([t], "local", 2) == "own"  # one tensor: the exchange costs more
    # 2,000 of them: 8,000 chunks a rank against 4,000 and the exchange once
    many = [TensorReads(f"s{i}", 4, rows, t.dst) for i in range(2000)]
    own_many = 2000 * own
    once_many = 2000 * 3840 + 4000 * (256 << 10) + 6 * 2000 * 1920 + (16 << 20)
    assert load_reads.read_costs(many, 2) == (own_many, once_many)
    assert choose_reads(many, "local", 2) == "once"
    # chunks past the whole-read size (256 KiB) are read in part: counted by their bytes
    big = (8192, 40)  # 4 row chunks of 320 KiB, loaded as rows on 2 ranks
    b_rows = tuple(s.box for s in chunk_layout(big, 0, [0, 1, 2, 3]).shards)
    tb = TensorReads("b", 4, b_rows, chunk_layout(big, 0, [0, 1]))
    half = 4096 * 40 * 4
    assert load_reads.read_costs([tb], 2) == (half, half + 6 * (half // 2) + (16 << 20))


@pytest.mark.rule("CKPT-25")
@settings(max_examples=150, deadline=None)
@given(
    st.data(),
    st.integers(1, 64),
    st.integers(1, 4096),
    st.sampled_from(["all pairs", "index"]),
)
def test_auto_decides_the_same_from_arrays_as_from_boxes(
    data: st.DataObject, min_bytes: int, run_bytes: int, path: str
) -> None:
    # A load of W chunks decides reads="auto" from the layouts' arrays: the same answer as box
    # by box, for every tensor, at thresholds the drawn shapes reach.
    shape = data.draw(shapes(min_dims=0, max_dims=3, max_side=9))
    world = data.draw(st.integers(1, 8))
    saved = data.draw(valid_layouts(st.just(shape), replicas=False))
    dst = data.draw(valid_layouts(st.just(shape), world=world))
    chunks = Layout(shape, [Shard(s.box, i) for i, s in enumerate(saved.shards)])
    t = TensorReads("t", data.draw(st.sampled_from([1, 2, 4, 8])), chunks, dst)
    load_reads._strided.cache_clear()  # its entries are made at the shipped thresholds
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_reads, "STRIDED_MIN_BYTES", min_bytes)
        mp.setattr(load_reads, "STRIDED_RUN_BYTES", run_bytes)
        mp.setattr(load_reads, "_ALL_PAIRS", 1 << 30 if path == "all pairs" else -1)
        boxes = load_reads._holders(dst)[1]
        want_replicated = any(len(h) > 1 for h in boxes)
        if dst.ndim:
            assert load_reads._replicated_arrays(dst) == want_replicated
        if want_replicated:
            return  # _strided is asked only of destinations without replicas
        want = load_reads._strided.__wrapped__(t.boxes, dst, t.itemsize)
        if dst.ndim and dst.numel:
            got = load_reads._strided_arrays(chunks, dst, t.itemsize)
            assert got in (want, None if path == "index" else want)
        mp.setattr(load_reads, "_ARRAYS_FROM", 0)
        load_reads._strided.cache_clear()
        assert load_reads._strided_of(t) == want
        load_reads._strided.cache_clear()


@pytest.mark.rule("CKPT-25")
@settings(max_examples=60, deadline=None)
@given(
    st.integers(24, 40),  # 24 or more non-empty boxes either way: past the scan, a grid
    st.integers(1, 40),
    st.sampled_from([0, 1]),
    st.integers(1, 8192),
    st.integers(1, 4096),
)
def test_auto_decides_the_same_through_a_grid_index(
    ranks: int, saved_chunks: int, dim: int, min_bytes: int, run_bytes: int
) -> None:
    # More destination boxes than a scan takes: the index path, as a grid.
    shape = (64, 48)
    dst = chunk_layout(shape, dim, list(range(ranks)))
    saved = chunk_layout(shape, 0, list(range(saved_chunks)))
    load_reads._strided.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_reads, "STRIDED_MIN_BYTES", min_bytes)
        mp.setattr(load_reads, "STRIDED_RUN_BYTES", run_bytes)
        mp.setattr(load_reads, "_ALL_PAIRS", -1)
        want = load_reads._strided.__wrapped__(tuple(s.box for s in saved.shards), dst, 4)
        assert load_reads._strided_arrays(saved, dst, 4) == want
    load_reads._strided.cache_clear()


@pytest.mark.rule("CKPT-24")
def test_a_pre_resharded_checkpoint_is_read_by_the_ranks_that_hold_it() -> None:
    dst = chunk_layout(BIG, 0, [3, 2, 1, 0])
    runs = assign_reads([TensorReads("w", 4, tuple(s.box for s in dst.shards), dst)], 4)
    assert {(r.box, r.reader) for r in runs} == {(s.box, s.rank) for s in dst.shards}


@pytest.mark.rule("CKPT-24")
def test_a_replicated_model_is_read_once_spread_over_the_ranks() -> None:
    # 8 tensors of 8 MiB replicated on 4 ranks: each rank reads two of them
    whole = Box((0, 0), BIG)
    dst = Layout(BIG, [Shard(whole, r) for r in range(4)])
    tensors = [TensorReads(f"w{i}", 4, (whole,), dst) for i in range(8)]
    runs = assign_reads(tensors, 4)
    assert len(runs) == 8
    assert Counter(r.reader for r in runs) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_the_package_exports_the_function_load_whatever_was_imported_first() -> None:
    """A submodule named ``load`` would replace the package's ``load`` once imported."""
    import importlib

    importlib.import_module("shardspec.checkpoint.collective_load")
    from shardspec.checkpoint import LoadStats, load

    assert callable(load) and load.__name__ == "load" and LoadStats.__name__ == "LoadStats"
