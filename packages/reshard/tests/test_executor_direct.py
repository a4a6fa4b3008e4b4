"""The in-place exchange (the output is the collective's receive buffer, a contiguous input
its send buffer) and ``out=``, on 4 gloo ranks, against the reference bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reshard_cases import DTYPES, noncontig
from reshard_direct_cases import run_counted, run_state_dict_counted, run_state_dict_out

from shardspec.metadata import Layout, chunk_layout
from shardspec.reshard import reference
from shardspec.testing import RankFailure, RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)  # one pool of WORLD ranks for the whole session


def _inputs(src: Layout, full: torch.Tensor, contiguous: bool = True) -> list[list[torch.Tensor]]:
    return [
        [
            full[b.slices()].clone() if contiguous else noncontig(full[b.slices()], r)
            for b in src.boxes_of(r)
        ]
        for r in range(WORLD)
    ]


def _run(
    pool: RankPool,
    src: Layout,
    dst: Layout,
    full: torch.Tensor,
    kwargs: list[dict[str, Any]] | None = None,
    contiguous: bool = True,
) -> list[dict[str, int]]:
    ins = _inputs(src, full, contiguous)
    kw = kwargs or [{} for _ in range(WORLD)]
    answers = pool.call(run_counted, per_rank=[(ins[r], src, dst, kw[r]) for r in range(WORLD)])
    want = reference.reshard({r: ins[r] for r in range(WORLD)}, src, dst)
    for r, (got, _, _) in enumerate(answers):
        assert len(got) == len(want.get(r, []))
        for a, b in zip(got, want.get(r, [])):
            assert reference.same_bits(a, b), f"rank {r}: {a} should be {b} ({src} -> {dst})"
    return [a[1] for a in answers]


# Shapes whose every received piece is a multiple of 16 bytes even for 1-byte dtypes: even,
# uneven rows, uneven columns (odd-sized pieces: UNEVEN_SHAPES below).
DIRECT_SHAPES = [(16, 16), (30, 32), (32, 30)]


@pytest.mark.rule("RESHARD-1")
@pytest.mark.parametrize("shape", DIRECT_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_to_columns_receive_in_place(
    pool: RankPool, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    src, dst = chunk_layout(shape, 0, range(WORLD)), chunk_layout(shape, 1, range(WORLD))
    counts = _run(pool, src, dst, random_tensor(shape, dtype, 7))
    # Rows arrive in rank order, each a whole block of the output: every rank receives in
    # place; ranks 1 and 2 own rows in the middle, so they send those to themselves.
    assert [c["recv"] for c in counts] == [1, 1, 1, 1]
    assert [c["self"] for c in counts] == [0, 1, 1, 0]


@pytest.mark.rule("RESHARD-1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64, torch.bfloat16])
def test_columns_to_rows_send_in_place(pool: RankPool, dtype: torch.dtype) -> None:
    shape = (32, 30)
    src, dst = chunk_layout(shape, 1, range(WORLD)), chunk_layout(shape, 0, range(WORLD))
    counts = _run(pool, src, dst, random_tensor(shape, dtype, 8))
    assert [c["send"] for c in counts] == [1, 1, 1, 1]
    assert [c["recv"] for c in counts] == [0, 0, 0, 0]


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64, torch.bfloat16])
def test_non_contiguous_inputs_and_budgets(pool: RankPool, dtype: torch.dtype) -> None:
    shape = (30, 32)
    full = random_tensor(shape, dtype, 9)
    src, dst = chunk_layout(shape, 0, range(WORLD)), chunk_layout(shape, 1, range(WORLD))
    counts = _run(pool, src, dst, full, contiguous=False)
    assert [c["recv"] for c in counts] == [1, 1, 1, 1]
    # A budget that one round fits: still in place.
    roomy = [{"max_buffer_bytes": 1 << 20} for _ in range(WORLD)]
    counts = _run(pool, src, dst, full, roomy, contiguous=False)
    assert [c["recv"] for c in counts] == [1, 1, 1, 1]
    # Several rounds cut every pair's stream into windows: the general path, same result.
    tight = [{"max_buffer_bytes": 64} for _ in range(WORLD)]
    counts = _run(pool, src, dst, full, tight, contiguous=False)
    assert [c["recv"] + c["send"] + c["self"] for c in counts] == [0, 0, 0, 0]
    # Reversed, with non-contiguous inputs: nothing to send in place.
    counts = _run(pool, dst, src, full, contiguous=False)
    assert [c["send"] for c in counts] == [0, 0, 0, 0]


# Uneven in both dims, with pieces of odd byte counts for every dtype: (13, 7) has rows
# 4, 4, 4, 1 and columns 2, 2, 2, 1, so rank 0 gets 1 x 2 elements from rank 3; (7, 13) has
# rows 2, 2, 2, 1 and columns 4, 4, 4, 1; (5, 3) has rows 2, 2, 1, 0 and columns 1, 1, 1, 0
# (rank 3 holds nothing either way) and moves single elements.
UNEVEN_SHAPES = [(13, 7), (7, 13), (5, 3)]


@pytest.mark.rule("RESHARD-1")
@pytest.mark.parametrize("shape", UNEVEN_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uneven_rows_to_columns_receive_in_place(
    pool: RankPool, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    src, dst = chunk_layout(shape, 0, range(WORLD)), chunk_layout(shape, 1, range(WORLD))
    counts = _run(pool, src, dst, random_tensor(shape, dtype, 10))
    # Streams of one dtype carry no padding, whatever the piece sizes: every rank that gets a
    # column receives straight into it, routing its own rows through itself when they sit in
    # the middle (for (5, 3), rank 2's row 4 is the last of its column: no detour).
    receivers = [1, 1, 1, 0] if shape == (5, 3) else [1, 1, 1, 1]
    detours = [0, 1, 0, 0] if shape == (5, 3) else [0, 1, 1, 0]
    assert [c["recv"] for c in counts] == receivers
    assert [c["self"] for c in counts] == detours


@pytest.mark.rule("RESHARD-1")
@pytest.mark.parametrize("shape", UNEVEN_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uneven_columns_to_rows_send_in_place(
    pool: RankPool, shape: tuple[int, int], dtype: torch.dtype
) -> None:
    src, dst = chunk_layout(shape, 1, range(WORLD)), chunk_layout(shape, 0, range(WORLD))
    counts = _run(pool, src, dst, random_tensor(shape, dtype, 11))
    # Each column block's rows for rank 0, 1, 2, 3 follow each other in its memory. The rank
    # that gets a single row (rank 3; rank 2 for (5, 3)) also receives in place: the pieces
    # of one row from the column blocks in rank order, its own last.
    if shape == (5, 3):
        assert [c["send"] for c in counts] == [1, 1, 1, 0]
        assert [c["recv"] for c in counts] == [0, 0, 1, 0]
    else:
        assert [c["send"] for c in counts] == [1, 1, 1, 1]
        assert [c["recv"] for c in counts] == [0, 0, 0, 1]


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("budget", [None, 40, 1000])
@pytest.mark.parametrize(
    ("transport", "reverse"),
    [("all_to_all", False), ("all_to_all", True), ("messages", False), ("messages", True)],
)
def test_mixed_dtype_state_dict_with_odd_pieces(
    pool: RankPool, budget: int | None, contiguous: bool, transport: str, reverse: bool
) -> None:
    # Key order puts wider dtypes after narrower ones with odd-sized pieces in between (a
    # 1-byte piece, then a complex64 one), so stream offsets need padding and, in the buffer
    # (where the other peers' windows come first), pieces land at odd byte offsets. A budget
    # of 40 bytes cuts every stream into many windows.
    specs = {
        "a": ((5, 3), torch.bool),
        "b": ((7, 5), torch.complex64),
        "c": ((3, 7), torch.uint8),
        "d": ((13, 1), torch.float64),
        "e": ((9,), torch.bfloat16),
        "f": ((5, 3), torch.int8),
        "g": ((3, 3), torch.complex128),
        "h": ((0, 5), torch.int16),
        "i": ((11, 3), torch.float32),
    }
    # ``reverse``: columns to rows, so that pieces are strided where they land (unpacked at
    # odd offsets through a scratch block) rather than where they are sent from.
    src = {k: chunk_layout(s, 0, range(WORLD)) for k, (s, _) in specs.items()}
    dst = {
        k: chunk_layout(s, len(s) - 1, [3, 1, 0, 2] if len(s) > 1 else [2, 0, 3, 1])
        for k, (s, _) in specs.items()
    }
    if reverse:
        src, dst = dst, src
    full = {k: random_tensor(s, d, 20 + i) for i, (k, (s, d)) in enumerate(specs.items())}
    states = [{k: _inputs(src[k], full[k], contiguous)[r] for k in specs} for r in range(WORLD)]
    kwargs = {"max_buffer_bytes": budget, "transport": transport}
    answers = pool.call(
        run_state_dict_counted,
        per_rank=[(states[r], src, dst, kwargs) for r in range(WORLD)],
    )
    for k in specs:
        want = reference.reshard({r: states[r][k] for r in range(WORLD)}, src[k], dst[k])
        for r, (got, _) in enumerate(answers):
            assert len(got[k]) == len(want.get(r, []))
            for a, b in zip(got[k], want.get(r, [])):
                assert a.dtype == specs[k][1]
                assert reference.same_bits(a, b), f"{k} on rank {r}, budget {budget}"
    if budget == 40:
        # Many rounds: the general path on every rank.
        assert all(sum(c.values()) == 0 for _, c in answers), [c for _, c in answers]


def _outs(dst: Layout, dtype: torch.dtype, contiguous: bool = True) -> list[list[torch.Tensor]]:
    return [
        [
            torch.full(b.sizes, 3, dtype=dtype)
            if contiguous
            else noncontig(torch.full(b.sizes, 3, dtype=dtype), 0)
            for b in dst.boxes_of(r)
        ]
        for r in range(WORLD)
    ]


@pytest.mark.rule("RESHARD-1")
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("shape", [(16, 16), (13, 7), (3, 5)])
def test_out_receives_the_result(pool: RankPool, shape: tuple[int, int], contiguous: bool) -> None:
    src = chunk_layout(shape, 0, range(WORLD))
    dst = chunk_layout(shape, 1, [0, 2, 3])  # rank 1 gets nothing: out=[]
    full = random_tensor(shape, torch.float32, 11)
    ins = _inputs(src, full)
    outs = _outs(dst, torch.float32, contiguous)
    answers = pool.call(
        run_counted, per_rank=[(ins[r], src, dst, {"out": outs[r]}) for r in range(WORLD)]
    )
    want = reference.reshard({r: ins[r] for r in range(WORLD)}, src, dst)
    for r, (got, counts, same) in enumerate(answers):
        assert same, f"rank {r} did not return its out tensors"
        assert len(got) == len(want.get(r, []))
        for a, b in zip(got, want.get(r, [])):
            assert reference.same_bits(a, b)
        if not contiguous:
            assert counts["recv"] == 0


def _all_raise(answers: list[Any], *needles: str) -> None:
    assert all(isinstance(a, RankFailure) for a in answers), f"not every rank raised: {answers}"
    messages = {a.message for a in answers}
    assert len(messages) == 1, messages
    msg = messages.pop()
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


@pytest.mark.rule("RESHARD-5")
def test_bad_out_on_one_rank_raises_everywhere(pool: RankPool) -> None:
    shape = (8, 4)
    src, dst = chunk_layout(shape, 0, range(WORLD)), chunk_layout(shape, 1, range(WORLD))
    ins = _inputs(src, random_tensor(shape, torch.float32, 12))
    good = _outs(dst, torch.float32)

    def args(bad_rank: int, bad: list[torch.Tensor]) -> list[tuple[Any, ...]]:
        return [
            (ins[r], src, dst, {"out": bad if r == bad_rank else good[r]}) for r in range(WORLD)
        ]

    _all_raise(
        pool.call_all(run_counted, per_rank=args(1, [torch.zeros(8, 2)])), "rank 1", "out #0"
    )
    _all_raise(
        pool.call_all(run_counted, per_rank=args(2, [torch.zeros(8, 1, dtype=torch.float64)])),
        "rank 2",
        "torch.float64",
    )
    _all_raise(pool.call_all(run_counted, per_rank=args(3, [])), "rank 3", "0 out tensors")
    # Nothing was left half-sent: the group still works, and the good outs were not touched.
    ok = pool.call(run_counted, per_rank=args(0, good[0]))
    assert all(same for _, _, same in ok)


@pytest.mark.rule("RESHARD-5")
def test_out_dtype_of_a_rank_without_sources_is_agreed(pool: RankPool) -> None:
    shape = (8, 4)
    src = chunk_layout(shape, 0, [0, 1])  # ranks 2 and 3 hold nothing, learn the dtype
    dst = chunk_layout(shape, 1, range(WORLD))
    full = random_tensor(shape, torch.float32, 13)
    ins = _inputs(src, full)
    outs = _outs(dst, torch.float32)
    outs[3] = [torch.zeros(8, 1, dtype=torch.int32)]
    args = [(ins[r], src, dst, {"out": outs[r]}) for r in range(WORLD)]
    _all_raise(pool.call_all(run_counted, per_rank=args), "dtype", "torch.int32")


@pytest.mark.rule("RESHARD-1", "RESHARD-5")
def test_state_dict_out(pool: RankPool) -> None:
    shapes = {"a": (16, 16), "b": (5, 3)}
    dtypes = {"a": torch.bfloat16, "b": torch.complex64}
    src = {k: chunk_layout(s, 0, range(WORLD)) for k, s in shapes.items()}
    dst = {k: chunk_layout(s, 1, range(WORLD)) for k, s in shapes.items()}
    full = {k: random_tensor(s, dtypes[k], 14) for k, s in shapes.items()}
    states = [{k: _inputs(src[k], full[k])[r] for k in shapes} for r in range(WORLD)]
    outs = [{k: _outs(dst[k], dtypes[k])[r] for k in shapes} for r in range(WORLD)]
    answers = pool.call(
        run_state_dict_out,
        per_rank=[(states[r], src, dst, outs[r]) for r in range(WORLD)],
    )
    for k in shapes:
        want = reference.reshard({r: states[r][k] for r in range(WORLD)}, src[k], dst[k])
        for r, (got, same) in enumerate(answers):
            assert same
            assert len(got[k]) == len(want.get(r, []))
            for a, b in zip(got[k], want.get(r, [])):
                assert reference.same_bits(a, b), f"{k} on rank {r}"
    # A missing key on one rank: every rank raises.
    bad = [dict(outs[r]) for r in range(WORLD)]
    del bad[2]["b"]
    _all_raise(
        pool.call_all(
            run_state_dict_out, per_rank=[(states[r], src, dst, bad[r]) for r in range(WORLD)]
        ),
        "rank 2",
        "missing: ['b']",
    )


def _rows(shape: tuple[int, int], starts: list[int]) -> Layout:
    """Rank r holds rows [starts[r], starts[r + 1]) of ``shape``."""
    from shardspec.metadata import Box, Shard

    ends = [*starts[1:], shape[0]]
    return Layout(
        shape,
        [Shard(Box((a, 0), (b - a, shape[1])), r) for r, (a, b) in enumerate(zip(starts, ends))],
    )


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex64, torch.bfloat16])
def test_sends_packed_into_the_local_pieces_place(pool: RankPool, dtype: torch.dtype) -> None:
    # Rows shifted by 2: ranks 1-3 keep 6 of their 8 rows and send 2 to the rank before, so
    # their 2 rows of sends fit where their 6 local rows go in the output; with non-contiguous
    # inputs the sends must be packed, into that place (no new buffer), and the local rows
    # copied in after the last round. The out tensors start out holding the previous call's
    # values (or junk): a local row not copied in after, or a packed send left behind, shows.
    shape = (32, 256)  # 2 rows: 512 bytes or more, so either budget below takes rounds
    src, dst = _rows(shape, [0, 8, 16, 24]), _rows(shape, [0, 10, 18, 26])
    outs = _outs(dst, dtype, True)
    for seed, budget in ((13, None), (14, None), (15, 64), (16, 200)):
        full = random_tensor(shape, dtype, seed)
        ins = _inputs(src, full, contiguous=False)
        kw = [{"out": outs[r], "max_buffer_bytes": budget} for r in range(WORLD)]
        answers = pool.call(run_counted, per_rank=[(ins[r], src, dst, kw[r]) for r in range(WORLD)])
        want = reference.reshard({r: ins[r] for r in range(WORLD)}, src, dst)
        for r, (got, _, same) in enumerate(answers):
            assert same
            for a, b in zip(got, want[r]):
                assert reference.same_bits(a, b), f"rank {r}, seed {seed}, budget {budget}"
        # Rank 0 sends nothing; ranks 1 and 2 pack into their local rows' place, in every
        # round. Rank 3 receives nothing: in one round it sends its local rows to itself
        # through the collective instead, its output the receive buffer.
        scratch = [a[1]["scratch"] for a in answers]
        assert scratch == ([0, 1, 1, 1] if budget else [0, 1, 1, 0]), (seed, budget)
        assert [a[1]["self"] for a in answers] == [0, 0, 0, 0 if budget else 1]
        outs = [list(a[0]) for a in answers]  # the next call writes over these values
