"""The executor's schedule (``shardspec.reshard.schedule``) without ranks: streams, rounds,
windows, cuts and spans are plain integers, checked here against facts derived from the
global plan, from element-by-element enumeration, or from the spec's bounds (RESHARD-2, -6,
-14)."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, strategies as st

from shardspec.metadata import Layout, chunk_layout
from shardspec.metadata.strategies import shapes, valid_layouts
from shardspec.reshard import Piece, Plan, plan
from shardspec.reshard.schedule import (
    WINDOW,
    Entry,
    Streams,
    buffer_bytes,
    contiguous_span,
    local_stream,
    peers_of,
    piece_bytes,
    quotas,
    round_cuts,
    round_messages,
    rounds_needed,
    stream_len,
    windows,
)
from shardspec.testing import scaled

ITEMSIZES = (1, 2, 4, 8, 16)  # bool/int8, float16, float32, float64, complex128


@dataclass
class Job:
    """What the executor schedules a tensor with, without the tensors."""

    key: str
    plan: Plan
    itemsize: int


@dataclass(frozen=True)
class Case:
    """Tensors resharded together on a group of ``world`` ranks: (src, dst, itemsize) per key,
    in key order."""

    world: int
    tensors: tuple[tuple[Layout, Layout, int], ...]
    whole: tuple[Plan, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "whole", tuple(plan(s, d) for s, d, _ in self.tensors))

    def jobs(self, rank: int) -> list[Job]:
        return [
            Job(f"t{k}", plan(src, dst, rank), size)
            for k, (src, dst, size) in enumerate(self.tensors)
        ]


@st.composite
def cases(draw: st.DrawFn, max_tensors: int = 3) -> Case:
    world = draw(st.integers(1, 6))
    tensors = []
    for _ in range(draw(st.integers(1, max_tensors))):
        shape = st.just(draw(shapes(max_dims=3, max_side=5)))
        src = draw(valid_layouts(shape, world=world))
        dst = draw(valid_layouts(shape, world=world))
        tensors.append((src, dst, draw(st.sampled_from(ITEMSIZES))))
    return Case(world, tuple(tensors))


budgets = st.none() | st.integers(1, 400)

# More ranks than rows on both sides, different rank orders: empty chunks at the end.
FEW_ROWS = Case(
    6,
    (
        (chunk_layout((2, 3), 0, range(6)), chunk_layout((2, 3), 0, [5, 4, 3, 2, 1, 0]), 4),
        (chunk_layout((3,), 0, [1, 0, 2, 5, 4]), Layout.replicated((3,), [3]), 2),
    ),
)
# Three ranks send little each to one rank that receives it all: its receive buffer, not any
# send buffer, sets the number of rounds.
GATHER = Case(4, ((chunk_layout((12, 4), 0, range(4)), Layout.replicated((12, 4), [0]), 4),))
# 17 one-byte elements in two rounds of 16 bytes: the piece ends one byte into the second window.
SEVENTEEN = Case(2, ((Layout.replicated((17,), [0]), Layout.replicated((17,), [1]), 1),))
# A 0-d tensor, a zero-size one, and a complex128 tensor after a float64 one (padding).
ODD_SHAPES = Case(
    3,
    (
        (Layout.replicated((), [0]), Layout.replicated((), [1, 2]), 8),
        (chunk_layout((0, 4), 1, [0, 1]), chunk_layout((0, 4), 0, [2, 1]), 4),
        (chunk_layout((5, 2), 0, [0, 1]), chunk_layout((5, 2), 1, [2, 0]), 16),
        (chunk_layout((7,), 0, [2, 0]), chunk_layout((7,), 0, [1, 2, 0]), 2),
    ),
)


def check_stream_layout(entries: list[Entry[Job]], what: str) -> None:
    """Entries follow each other in order without overlap, each at a multiple of its element
    size, padded by less than one element (so a stream of one element size has no padding);
    an empty piece takes no room and adds no padding; the stream ends where the last ends."""
    end = 0
    for i, e in enumerate(entries):
        size = e.job.itemsize
        assert e.nbytes == e.piece.numel * size, f"{what} entry #{i}: {e.nbytes} bytes"
        if e.nbytes == 0:
            assert e.offset == end, f"{what} empty entry #{i} at {e.offset}, stream ends at {end}"
            continue
        assert e.offset % size == 0, f"{what} entry #{i} at {e.offset}, element size {size}"
        assert end <= e.offset < end + size, (
            f"{what} entry #{i} at {e.offset} after bytes up to {end} (element size {size})"
        )
        end = e.offset + e.nbytes
    assert stream_len(entries) == end, f"{what}: length {stream_len(entries)}, entries end {end}"


# ---------------------------------------------------------------- streams


@pytest.mark.rule("RESHARD-2", "RESHARD-6")
@given(cases())
@example(FEW_ROWS)
@example(ODD_SHAPES)
def test_every_piece_is_one_entry_of_its_pairs_stream_in_key_then_wire_order(case: Case) -> None:
    for r in range(case.world):
        jobs = case.jobs(r)
        streams = Streams(jobs, r, case.world)
        assert len(streams.sends) == len(streams.recvs) == case.world
        for peer in range(case.world):
            for sending, got in ((True, streams.sends[peer]), (False, streams.recvs[peer])):
                want = [
                    (k, p)
                    for k, whole in enumerate(case.whole)
                    for p in whole.pieces
                    if p.src_rank != p.dst_rank
                    and (p.src_rank, p.dst_rank) == ((r, peer) if sending else (peer, r))
                ]
                assert [(jobs.index(e.job), e.piece) for e in got] == want, (
                    f"rank {r} {'to' if sending else 'from'} {peer}: wrong pieces or order"
                )
                check_stream_layout(got, f"rank {r} {'to' if sending else 'from'} {peer}")
            assert streams.send_len[peer] == stream_len(streams.sends[peer])
            assert streams.recv_len[peer] == stream_len(streams.recvs[peer])
        mine = local_stream(jobs, r)
        want_local = [
            (k, p)
            for k, whole in enumerate(case.whole)
            for p in whole.pieces
            if p.src_rank == p.dst_rank == r
        ]
        assert [(jobs.index(e.job), e.piece) for e in mine] == want_local, f"rank {r} local"
        check_stream_layout(mine, f"rank {r} to itself")


@st.composite
def synthetic_jobs(draw: st.DrawFn) -> tuple[list[Job], int]:
    """Jobs whose plans rank 0 sends to up to three peers, with pieces of any size (empty
    ones included, which no planner makes) and mixed element sizes."""
    world = draw(st.integers(2, 4))
    jobs = []
    for k in range(draw(st.integers(1, 4))):
        size = draw(st.sampled_from(ITEMSIZES))
        pieces = []
        for _ in range(draw(st.integers(0, 5))):
            sizes = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
            peer = draw(st.integers(1, world - 1))
            pieces.append(Piece((0,) * len(sizes), sizes, 0, 0, 0, peer, 0, 0))
        dummy = Layout.replicated((), [0])
        jobs.append(Job(f"t{k}", Plan(dummy, dummy, None, tuple(pieces)), size))
    return jobs, world


@pytest.mark.rule("RESHARD-2", "RESHARD-6")
@given(synthetic_jobs())
def test_empty_pieces_take_no_room_and_mixed_element_sizes_stay_aligned(
    synthetic: tuple[list[Job], int],
) -> None:
    jobs, world = synthetic
    streams = Streams(jobs, 0, world)
    for peer in range(world):
        want = [(j.key, p) for j in jobs for p in j.plan.pieces if p.dst_rank == peer]
        got = streams.sends[peer]
        assert [(e.job.key, e.piece) for e in got] == want, f"stream to {peer}"
        check_stream_layout(got, f"stream to {peer}")
    assert all(not s for s in streams.recvs), "rank 0 receives nothing, yet has streams in"


# ---------------------------------------------------------------- the two ends of a pair


@pytest.mark.rule("RESHARD-6", "RESHARD-14")
@given(cases(), budgets)
@example(FEW_ROWS, 1)
@example(ODD_SHAPES, 40)
@example(GATHER, 80)
def test_sender_and_receiver_derive_the_same_stream_and_windows_within_the_bound(
    case: Case, budget: int | None
) -> None:
    ranks = range(case.world)
    streams = {r: Streams(case.jobs(r), r, case.world) for r in ranks}
    rounds = max(s.rounds_needed(budget) for s in streams.values())  # what the ranks agree on
    if rounds == 0:
        assert all(not e for s in streams.values() for e in s.sends), "rounds 0, bytes to send"
        return
    send_q = {r: quotas(streams[r].send_len, rounds) for r in ranks}
    recv_q = {r: quotas(streams[r].recv_len, rounds) for r in ranks}
    bound = math.inf if budget is None else max(budget, WINDOW * (case.world + 1))
    for r in ranks:
        for side, q, n in (
            ("send", send_q[r], streams[r].send_len),
            ("receive", recv_q[r], streams[r].recv_len),
        ):
            assert buffer_bytes(q, n) <= bound, (
                f"rank {r}: a {buffer_bytes(q, n)}-byte {side} buffer in {rounds} rounds, "
                f"bound {bound}"
            )
    for a, b in itertools.product(ranks, ranks):
        sent = [(e.job.key, e.piece, e.offset, e.nbytes) for e in streams[a].sends[b]]
        expected = [(e.job.key, e.piece, e.offset, e.nbytes) for e in streams[b].recvs[a]]
        assert sent == expected, f"rank {a} sends {b} a stream laid out unlike {b} expects"
        for t in range(rounds):
            out = windows(send_q[a], streams[a].send_len, t)[b]
            into = windows(recv_q[b], streams[b].recv_len, t)[a]
            assert out == into, f"round {t}: rank {a} sends {out} bytes to {b}, {b} expects {into}"


# ---------------------------------------------------------------- rounds and windows


@pytest.mark.rule("RESHARD-6")
@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=8),
    budgets | st.integers(1, 20_000),
    st.integers(0, 3),
)
@example([0, 0, 0], 10, 0)  # nothing moves
@example([100], 100, 0)
@example([5000, 0, 1], 1, 2)  # a budget below one window per peer
def test_rounds_keep_each_buffer_within_the_bound_and_windows_cover_each_stream_once(
    lengths: list[int], budget: int | None, extra: int
) -> None:
    world = len(lengths)
    needed = rounds_needed(lengths, budget)
    if sum(lengths) == 0:
        assert needed == 0, f"nothing moves, yet {needed} rounds"
        return
    if budget is None:
        assert needed == 1, f"no bound, yet {needed} rounds"
    # Another rank may need more rounds: the agreed number is at least this rank's.
    rounds = needed + extra
    q = quotas(lengths, rounds)
    bound = math.inf if budget is None else max(budget, WINDOW * (world + 1))
    assert buffer_bytes(q, lengths) <= bound, (
        f"{rounds} rounds of {lengths} need a {buffer_bytes(q, lengths)}-byte buffer, bound {bound}"
    )
    moved = [0] * world
    for t in range(rounds + 1):
        w = windows(q, lengths, t)
        sparse = windows(q, lengths, t, peers_of(lengths))
        assert sparse == w, f"round {t}: over the non-empty streams {sparse}, over all {w}"
        assert sum(w) <= buffer_bytes(q, lengths), f"round {t} moves {sum(w)}, buffer smaller"
        for i, n in enumerate(w):
            if n:
                assert t < rounds, f"stream {i} still has {n} bytes after the last round"
                start = t * q[i]
                assert start % WINDOW == 0, f"stream {i}: round {t} starts at byte {start}"
                assert start == moved[i], f"stream {i}: round {t} at {start}, {moved[i]} moved"
                moved[i] += n
    assert moved == lengths, f"windows moved {moved} bytes of streams of {lengths}"


@pytest.mark.rule("RESHARD-6")
@given(cases(), budgets, st.integers(0, 2), st.booleans())
@example(ODD_SHAPES, 1, 0, True)
@example(FEW_ROWS, 16, 1, False)
@example(SEVENTEEN, 20, 0, True)
@example(SEVENTEEN, 20, 0, False)
def test_round_cuts_hold_every_element_once_at_its_wire_position(
    case: Case, budget: int | None, extra: int, sending: bool
) -> None:
    for r in range(case.world):
        s = Streams(case.jobs(r), r, case.world)
        streams, lengths = (s.sends, s.send_len) if sending else (s.recvs, s.recv_len)
        rounds = s.rounds_needed(budget) + extra
        if rounds == 0:
            continue
        q = quotas(lengths, rounds)
        ptr = [0] * case.world
        sparse_ptr = [0] * case.world
        peers = peers_of(lengths)
        done: dict[int, int] = {}  # id(entry) -> elements cut so far
        for t in range(rounds):
            splits = windows(q, lengths, t)
            cuts = round_cuts(streams, ptr, q, splits, t)
            # The executor's way: only the non-empty streams looked at, the same cuts.
            sparse = round_cuts(streams, sparse_ptr, q, splits, t, peers)
            assert sparse == cuts, f"rank {r} round {t}: over {peers} {sparse}, over all {cuts}"
            # Expected from scratch: every entry's bytes inside each peer's window, peer after
            # peer, at the window's place in the buffer.
            want = []
            base = 0
            for peer, n in enumerate(splits):
                lo, hi = t * q[peer], t * q[peer] + n
                for e in streams[peer]:
                    a, b = max(e.offset, lo), min(e.offset + e.nbytes, hi)
                    if a < b:
                        want.append((id(e), a, b, base + a - lo))
                base += n
            got = [
                (id(e), e.offset + e0 * e.job.itemsize, e.offset + e1 * e.job.itemsize, pos)
                for e, e0, e1, pos in cuts
            ]
            assert got == want, f"rank {r} round {t}: cuts {got}, should be {want}"
            for e, e0, e1, _ in cuts:
                assert e0 == done.get(id(e), 0), f"rank {r} round {t}: {e.piece} cut at {e0}"
                done[id(e)] = e1
        for peer in range(case.world):
            for e in streams[peer]:
                assert done.get(id(e), 0) == e.piece.numel or e.nbytes == 0, (
                    f"rank {r} peer {peer}: {e.piece} moved {done.get(id(e), 0)} elements"
                )


# ---------------------------------------------------------------- the direct (in-place) path


def flat_indices(
    shape: tuple[int, ...], outer: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> list[int]:
    """The row-major element indices of a sub-box in a box of ``shape`` at ``outer``."""
    out = []
    for x in itertools.product(*(range(o, o + s) for o, s in zip(offsets, sizes))):
        index = 0
        for dim, (xi, o) in enumerate(zip(x, outer)):
            index = index * shape[dim] + (xi - o)
        out.append(index)
    return out


def byte_range(
    shape: tuple[int, ...], outer: tuple[int, ...], p: Piece, size: int
) -> tuple[int, int] | None:
    idx = flat_indices(shape, outer, p.offsets, p.sizes)
    if idx != list(range(idx[0], idx[0] + len(idx))):
        return None
    return idx[0] * size, (idx[-1] + 1) * size


@st.composite
def sub_boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], Piece, int]:
    shape = draw(shapes(max_dims=4, min_side=1, max_side=4))
    outer = tuple(draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape))))
    offsets, sizes = [], []
    for n, o in zip(shape, outer):
        a = draw(st.integers(0, n - 1))
        offsets.append(o + a)
        sizes.append(draw(st.integers(1, n - a)))
    piece = Piece(tuple(offsets), tuple(sizes), 0, 0, 0, 1, 0, 0)
    return shape, outer, piece, draw(st.sampled_from(ITEMSIZES))


@pytest.mark.rule("RESHARD-6")
@given(sub_boxes())
def test_piece_bytes_is_the_byte_range_of_a_row_major_sub_box(
    drawn: tuple[tuple[int, ...], tuple[int, ...], Piece, int],
) -> None:
    shape, outer, p, size = drawn
    assert piece_bytes(shape, outer, p, size) == byte_range(shape, outer, p, size)


class Holder:
    """Where rank ``rank``'s pieces lie: one object per local tensor (compared with ``is``),
    those at a local index in ``strided`` not contiguous."""

    def __init__(
        self, case: Case, jobs: list[Job], rank: int, sending: bool, strided: set[int]
    ) -> None:
        self.case = case
        self.jobs = jobs
        self.rank = rank
        self.sending = sending
        self.strided = strided
        self.tensors = {
            (k, i): object()
            for k, (src, dst, _) in enumerate(case.tensors)
            for i in range(len((src if sending else dst).boxes_of(rank)))
        }

    def __call__(self, e: Entry[Job]) -> tuple[object, tuple[int, ...], tuple[int, ...]] | None:
        k, p = self.jobs.index(e.job), e.piece
        src, dst, _ = self.case.tensors[k]
        local = p.src_local if self.sending else p.dst_local
        box = (src if self.sending else dst).boxes_of(self.rank)[local]
        if local in self.strided:
            return None
        return self.tensors[k, local], box.sizes, box.offsets


@pytest.mark.rule("RESHARD-6")
@given(cases(max_tensors=2), st.booleans(), st.sets(st.integers(0, 5)))
@example(FEW_ROWS, False, set())
def test_contiguous_span_exactly_when_the_streams_lie_back_to_back_in_one_tensor(
    case: Case, sending: bool, strided: set[int]
) -> None:
    for r in range(case.world):
        jobs = case.jobs(r)
        s = Streams(jobs, r, case.world)
        streams = s.sends if sending else s.recvs
        holder = Holder(case, jobs, r, sending, strided)
        got = contiguous_span(streams, holder)
        # From scratch: no stream carries padding, and the non-empty pieces, in stream order,
        # are row-major runs of one contiguous tensor, each right after the one before.
        runs: list[tuple[object, int, int] | None] = []
        padded = False
        for entries in streams:
            padded |= stream_len(entries) != sum(e.nbytes for e in entries)
            for e in entries:
                if e.nbytes:
                    held = holder(e)
                    where = None if held is None else byte_range(*held[1:], e.piece, e.job.itemsize)
                    runs.append(None if held is None or where is None else (held[0], *where))
        want: tuple[object, int, int] | None = None
        whole = [x for x in runs if x is not None]
        if (
            runs
            and not padded
            and len(whole) == len(runs)
            and all(x[0] is whole[0][0] for x in whole)
            and all(x[1] == before[2] for before, x in itertools.pairwise(whole))
        ):
            want = (whole[0][0], whole[0][1], whole[-1][2])
        assert got == want, f"rank {r} ({'send' if sending else 'recv'}): {got}, should be {want}"


@st.composite
def flat_streams(draw: st.DrawFn) -> list[list[tuple[int, int, int, int]]]:
    """Streams of entries (tensor, start, length, padding before it) of one-byte pieces of
    1-d tensors: mostly each run right after the one before, in one tensor, with no padding."""
    streams = []
    at = draw(st.integers(0, 8))
    for _ in range(draw(st.integers(1, 3))):
        entries = []
        for _ in range(draw(st.integers(0, 4))):
            length = draw(st.integers(0, 5))
            start = at if draw(st.integers(0, 5)) else draw(st.integers(0, 40))
            tensor = draw(st.integers(0, 1)) if draw(st.integers(0, 5)) == 0 else 0
            gap = draw(st.integers(1, 3)) if draw(st.integers(0, 5)) == 0 else 0
            entries.append((tensor, start, length, gap))
            at = start + length
        streams.append(entries)
    return streams


@pytest.mark.rule("RESHARD-6")
@given(flat_streams())
def test_contiguous_span_needs_one_tensor_no_padding_and_each_run_after_the_last(
    drawn: list[list[tuple[int, int, int, int]]],
) -> None:
    dummy = Layout.replicated((), [0])
    job = Job("t", Plan(dummy, dummy, None, ()), 1)
    tensors = (object(), object())
    held: dict[int, tuple[object, tuple[int, ...], tuple[int, ...]]] = {}
    streams = []
    for entries in drawn:
        stream: list[Entry[Job]] = []
        end = 0
        for tensor, start, length, gap in entries:
            piece = Piece((start,), (length,), 0, 0, 0, 1, 0, 0)
            e = Entry(job, piece, end + (gap if length else 0), length)
            end = e.offset + length
            stream.append(e)
            held[id(e)] = (tensors[tensor], (64,), (0,))
        streams.append(stream)
    got = contiguous_span(streams, lambda e: held[id(e)])
    runs = [x for entries in drawn for x in entries if x[2]]
    ok = (
        bool(runs)
        and all(x[0] == runs[0][0] and x[3] == 0 for x in runs)
        and all(x[1] == before[1] + before[2] for before, x in itertools.pairwise(runs))
    )
    want = (tensors[runs[0][0]], runs[0][1], runs[-1][1] + runs[-1][2]) if ok else None
    assert got == want, f"{drawn}: span {got}, should be {want}"


# ---------------------------------------------------------------- plain integers


@pytest.mark.rule("RESHARD-14")
def test_the_schedule_imports_no_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from shardspec.metadata import chunk_layout; "
        "from shardspec.reshard import plan, schedule; "
        "from types import SimpleNamespace as J; "
        "a, b = chunk_layout((8, 3), 0, [0, 1]), chunk_layout((8, 3), 1, [1, 0]); "
        "s = schedule.Streams([J(plan=plan(a, b, 0), itemsize=4)], 0, 2); "
        "assert s.send_len == [0, 32] and s.rounds_needed(None) == 1, s.send_len"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.rule("RESHARD-6")
@given(cases(), budgets, st.integers(1, 64))
@example(ODD_SHAPES, 1, 16)
@example(FEW_ROWS, 16, 1)
@example(SEVENTEEN, None, 8)
def test_round_messages_group_the_cuts_alike_at_both_ends(
    case: Case, budget: int | None, direct: int
) -> None:
    """Messages of a round hold the round's cuts in order, each cut of at least ``direct``
    bytes alone (and direct), every run of smaller cuts in one buffer span, tagged 0, 1, 2, ...
    a pair over all rounds; the sender's messages to a peer are the peer's messages from it
    (same tags, spans and sizes)."""
    streams = [Streams(case.jobs(r), r, case.world) for r in range(case.world)]
    rounds = max([s.rounds_needed(budget) for s in streams] + [1])
    by_pair: dict[tuple[int, int, int, bool], list[tuple[int, int, int, bool]]] = {}
    for r, s in enumerate(streams):
        for sending in (True, False):
            lines, lengths = (s.sends, s.send_len) if sending else (s.recvs, s.recv_len)
            q = quotas(lengths, rounds)
            ptr, cut_ptr = [0] * case.world, [0] * case.world
            counters = [0] * case.world
            tags: dict[int, int] = {}  # a pair's tags run on over the rounds of a call
            for t in range(rounds):
                splits = windows(q, lengths, t)
                cuts = round_cuts(lines, cut_ptr, q, splits, t)
                msgs = round_messages(lines, ptr, q, splits, t, None, counters, direct)
                flat = [c for m in msgs for c in m.cuts]
                assert flat == [c for c in cuts if c[2] > c[1]], f"rank {r} round {t}"
                for m in msgs:
                    sizes = [(e1 - e0) * e.job.itemsize for e, e0, e1, _ in m.cuts]
                    assert m.direct == (sizes[0] >= direct) and (len(sizes) == 1 or not m.direct)
                    assert all(n < direct for n in sizes) or m.direct
                    assert m.lo == m.cuts[0][3] and m.hi == m.cuts[-1][3] + sizes[-1]
                    assert m.tag == tags.get(m.peer, 0), f"rank {r}: tags out of order"
                    tags[m.peer] = m.tag + 1
                    src, dst = (r, m.peer) if sending else (m.peer, r)
                    by_pair.setdefault((src, dst, t, sending), []).append(
                        (m.tag, m.lo - m.cuts[0][3], m.hi - m.lo, m.direct)
                    )
    for (src, dst, t, sending), msgs in by_pair.items():
        if sending:
            other = by_pair.get((src, dst, t, False), [])
            assert [(tag, n, d) for tag, _, n, d in msgs] == [
                (tag, n, d) for tag, _, n, d in other
            ], f"{src} -> {dst} round {t}: sent {msgs}, received {other}"


@pytest.mark.rule("RESHARD-6")
@given(cases(), budgets, st.integers(1, 64), st.randoms(use_true_random=False))
@example(ODD_SHAPES, 1, 16, random.Random(0))
@example(SEVENTEEN, 20, 1, random.Random(1))
def test_a_rounds_packed_messages_fit_its_all_to_all_buffer_at_its_alignment(
    case: Case, budget: int | None, direct: int, rng: random.Random
) -> None:
    """Whichever of a round's messages a rank packs (those its tensors do not hold
    contiguously), the scratch they are packed into is no larger than the round's
    all-to-all buffer, and each lands at its offset there modulo 16."""
    from shardspec.reshard.messages import _packed_at, _packed_end

    for r in range(case.world):
        s = Streams(case.jobs(r), r, case.world)
        rounds = s.rounds_needed(budget)
        q = quotas(s.send_len, rounds) if rounds else []
        ptr, tags = [0] * case.world, [0] * case.world
        for t in range(rounds):
            splits = windows(q, s.send_len, t)
            msgs = round_messages(s.sends, ptr, q, splits, t, None, tags, direct)
            packed = [m for m in msgs if rng.random() < 0.6]
            assert _packed_end(packed) <= sum(splits), f"rank {r} round {t}"
            pos = 0
            for m in packed:
                at = _packed_at(pos, m)
                assert at >= pos and at % 16 == m.lo % 16 and at <= m.lo
                pos = at + m.hi - m.lo
