"""The executor's rounds as point-to-point messages (gloo's transport): pieces of at least
``DIRECT_BYTES`` travel from and into the tensors where those hold them contiguously, the
rest through the round's buffers; the buffers of bounded calls are kept for the next call.
On 4 gloo ranks, against the reference bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from reshard_cases import noncontig
from reshard_direct_cases import run_kept, run_state_dict_counted

from shardspec.metadata import Layout, chunk_layout
from shardspec.reshard import reference
from shardspec.reshard.schedule import DIRECT_BYTES
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4
# float32 rows of 1024: a quarter of the rows by a quarter of the columns is DIRECT_BYTES
BIG = (1024, 1024)


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


def _state(
    layouts: dict[str, Layout], fulls: dict[str, torch.Tensor], contiguous: bool
) -> list[dict[str, list[torch.Tensor]]]:
    return [
        {
            k: [
                full[b.slices()].clone() if contiguous else noncontig(full[b.slices()], r)
                for b in layouts[k].boxes_of(r)
            ]
            for k, full in fulls.items()
        }
        for r in range(WORLD)
    ]


def _check(
    pool: RankPool,
    src: dict[str, Layout],
    dst: dict[str, Layout],
    fulls: dict[str, torch.Tensor],
    kwargs: dict[str, Any],
    contiguous: bool = True,
    transposed_out: bool = False,
) -> list[dict[str, int]]:
    state = _state(src, fulls, contiguous)
    per_rank = []
    for r in range(WORLD):
        kw = dict(kwargs, transport="messages")
        if transposed_out:
            # out tensors whose elements are all their own but not row-major: every direct
            # receive must go through the buffer instead
            kw["out"] = {
                k: [
                    torch.empty(tuple(reversed(b.sizes)), dtype=full.dtype).T
                    if len(b.sizes) == 2
                    else torch.empty(b.sizes, dtype=full.dtype)
                    for b in dst[k].boxes_of(r)
                ]
                for k, full in fulls.items()
            }
        per_rank.append((state[r], src, dst, kw))
    answers = pool.call(run_state_dict_counted, per_rank=per_rank)
    for k in fulls:
        want = reference.reshard({r: state[r][k] for r in range(WORLD)}, src[k], dst[k])
        for r, (got, _) in enumerate(answers):
            assert len(got[k]) == len(want.get(r, []))
            for i, (a, b) in enumerate(zip(got[k], want.get(r, []))):
                assert reference.same_bits(a, b), f"{k!r} rank {r} shard #{i} differs"
    return [a[1] for a in answers]


def test_a_quarter_of_rows_by_a_quarter_of_columns_is_the_direct_size() -> None:
    assert BIG[0] // WORLD * (BIG[1] // WORLD) * 4 == DIRECT_BYTES


@pytest.mark.rule("RESHARD-1", "RESHARD-2")
def test_rows_to_columns_receive_large_pieces_into_the_outputs(pool: RankPool) -> None:
    full = random_tensor(BIG, torch.float32, 3)
    src = {"w": chunk_layout(BIG, 0, range(WORLD))}
    dst = {"w": chunk_layout(BIG, 1, range(WORLD))}
    counts = _check(pool, src, dst, {"w": full}, {})
    # a piece is strided in its row chunk (packed to send) and rows of a column chunk
    # (contiguous): each rank receives its 3 remote pieces straight into its output, one by
    # one, or (ranks 0 and 3, whose own rows do not sit between them) with the output as the
    # whole receive buffer
    assert [(c["received directly"], c["recv"]) for c in counts] == [(0, 1), (3, 0), (3, 0), (0, 1)]
    assert [c["sent directly"] for c in counts] == [0] * WORLD


@pytest.mark.rule("RESHARD-1", "RESHARD-2")
def test_columns_to_rows_send_large_pieces_from_the_inputs(pool: RankPool) -> None:
    full = random_tensor(BIG, torch.float32, 4)
    src = {"w": chunk_layout(BIG, 1, [3, 1, 0, 2])}
    dst = {"w": chunk_layout(BIG, 0, range(WORLD))}
    counts = _check(pool, src, dst, {"w": full}, {})
    assert [(c["sent directly"], c["send"]) for c in counts] == [(0, 1), (3, 0), (3, 0), (0, 1)]
    assert [c["received directly"] for c in counts] == [0] * WORLD


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.parametrize("budget", [None, 700_000, 3_000_000])
def test_large_and_small_pieces_of_several_dtypes_in_rounds(
    pool: RankPool, budget: int | None
) -> None:
    """Large pieces cut by the rounds' windows, between small ones in the same stream."""
    fulls = {
        "a.big": random_tensor((1024, 1030), torch.float32, 5),
        "b.small": random_tensor((9, 7), torch.bfloat16, 6),
        "c.bytes": random_tensor((2048, 515), torch.int8, 7),
        "d.wide": random_tensor((600, 300), torch.float64, 8),
        "e.tiny": random_tensor((3,), torch.int64, 9),
    }
    src = {
        "a.big": chunk_layout((1024, 1030), 0, range(WORLD)),
        "b.small": chunk_layout((9, 7), 1, [2, 0]),
        "c.bytes": chunk_layout((2048, 515), 1, [1, 2, 3, 0]),
        "d.wide": chunk_layout((600, 300), 0, [3, 2, 1, 0]),
        "e.tiny": Layout.replicated((3,), [1]),
    }
    dst = {
        "a.big": chunk_layout((1024, 1030), 1, [1, 2, 3, 0]),
        "b.small": chunk_layout((9, 7), 0, range(WORLD)),
        "c.bytes": chunk_layout((2048, 515), 0, range(WORLD)),
        "d.wide": chunk_layout((600, 300), 0, range(WORLD)),
        "e.tiny": Layout.replicated((3,), range(WORLD)),
    }
    counts = _check(pool, src, dst, fulls, {"max_buffer_bytes": budget})
    if budget is None:
        assert sum(c["received directly"] for c in counts) > 0
        assert sum(c["sent directly"] for c in counts) > 0


@pytest.mark.rule("RESHARD-1")
def test_strided_inputs_and_outputs_take_the_buffer(pool: RankPool) -> None:
    """Pieces large enough to go direct, in tensors that do not hold them contiguously."""
    full = random_tensor(BIG, torch.float32, 10)
    src = {"w": chunk_layout(BIG, 1, range(WORLD))}
    dst = {"w": chunk_layout(BIG, 0, [2, 3, 0, 1])}
    counts = _check(pool, src, dst, {"w": full}, {}, contiguous=False, transposed_out=True)
    assert [c["received directly"] for c in counts] == [0] * WORLD


@pytest.mark.rule("RESHARD-6")
def test_bounded_calls_keep_their_buffers_and_reuse_them(pool: RankPool) -> None:
    """A second call (other sizes) reuses the first's buffers and is still exact; an unbounded
    call keeps none; release_buffers frees them."""
    calls = []
    for seed, shape in enumerate([(512, 300), (300, 512), (64, 64)]):
        full = random_tensor(shape, torch.float32, 20 + seed)
        src = {"x": chunk_layout(shape, 0, range(WORLD))}
        dst = {"x": chunk_layout(shape, 1, [3, 2, 1, 0])}
        calls.append((full, src, dst))
    per_rank = []
    for r in range(WORLD):
        mine = [
            ({"x": [f[b.slices()].clone() for b in s["x"].boxes_of(r)]}, s, d) for f, s, d in calls
        ]
        per_rank.append((mine, 100_000))
    answers = pool.call(run_kept, per_rank=per_rank)
    for r, got in enumerate(answers):
        assert [n for _, n in got] == [2, 2, 2, 0], f"rank {r} kept {[n for _, n in got]}"
        for (res, _), (full, _, dst) in zip(got, calls):
            for a, b in zip(res["x"], dst["x"].boxes_of(r)):
                assert reference.same_bits(a, full[b.slices()]), f"rank {r} differs"
    unbounded = pool.call(run_kept, per_rank=[(p[0][:1], None) for p in per_rank])
    assert all([n for _, n in got] == [0, 0] for got in unbounded)
