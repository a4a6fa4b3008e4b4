"""The rank pool: results come back bit for bit, raising ranks fail the example with their
traceback, dead and stuck ranks are reported within the timeout and the pool comes back."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings, strategies as st

from conformance import OPS
from conformance.strategies import dtypes, shapes, tensors
from shardspec.testing import RankCrash, RankError, RankPool, scaled
from shardspec.testing.protocol import ProtocolError, decode_tensor, encode_tensor, tensor_bytes


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    p = RankPool(2, timeout=5, ops=OPS)
    yield p
    p.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited already; only its parent's wait is missing
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


@pytest.mark.rule("CONF-1")
@settings(max_examples=40)
@given(shapes(max_dims=3, max_side=4).flatmap(lambda s: tensors(s, dtypes())))
def test_tensors_round_trip_bit_for_bit(pool: RankPool, t: torch.Tensor) -> None:
    results = pool.run("pool.echo", {}, [t])
    for r in results:
        (back,) = r.tensors
        assert back.dtype == t.dtype and back.shape == t.shape
        assert tensor_bytes(back) == tensor_bytes(t)


@pytest.mark.rule("CONF-1")
def test_all_to_all_moves_uneven_splits(pool: RankPool) -> None:
    splits = [[1, 3], [0, 2]]
    ins = [
        torch.arange(4, dtype=torch.float64),
        torch.tensor([-0.0, float("nan")], dtype=torch.float64),
    ]
    out = pool.run("pool.all_to_all", {"splits": splits}, per_rank_tensors=[[ins[0]], [ins[1]]])
    assert out[0].tensors[0].tolist() == [0.0]
    got = out[1].tensors[0]
    assert got[:3].tolist() == [1.0, 2.0, 3.0]
    assert torch.signbit(got[3]) and torch.isnan(got[4])


def test_decoder_rejects_malformed_descriptors() -> None:
    desc, data = encode_tensor(torch.arange(3))
    with pytest.raises(ProtocolError, match="needs 24 bytes"):
        decode_tensor(desc, data[:-1])
    with pytest.raises(ProtocolError, match="unknown dtype"):
        decode_tensor({"dtype": "object", "shape": [1]}, b"")
    with pytest.raises(ProtocolError, match="bad shape"):
        decode_tensor({"dtype": "int64", "shape": [-1]}, b"")


@pytest.mark.rule("CONF-2")
def test_a_raising_rank_fails_the_example_with_its_traceback(pool: RankPool) -> None:
    pool.start()
    gen = pool.generation
    with pytest.raises(RankError) as info:
        pool.run(
            "pool.fail",
            {"ranks": [1], "phase": "check", "message": "bad input 42"},
            example="case-7",
        )
    text = str(info.value)
    assert "rank 1 (check)" in text and "bad input 42" in text and "case-7" in text
    assert "Traceback" in text
    # the check failed before any collective: the pool is still the same, and usable
    assert pool.generation == gen and pool.running
    assert pool.run("pool.echo", {"x": 1})[1].value["args"] == {"x": 1}


@pytest.mark.rule("CONF-2")
def test_a_rank_raising_inside_a_collective_restarts_the_pool(pool: RankPool) -> None:
    pool.start()
    gen = pool.generation
    t0 = time.monotonic()
    with pytest.raises(RankError, match="deliberate failure"):
        pool.run("pool.fail", {"ranks": [0], "phase": "run"})
    assert time.monotonic() - t0 < scaled(pool.timeout)  # not a timeout: the raise was reported
    assert pool.run("pool.echo")[0].value["world"] == 2
    assert pool.generation == gen + 1


@pytest.mark.rule("CONF-2", "CONF-15")
def test_a_rank_that_strands_the_others_is_a_finding_and_the_pool_restarts(
    pool: RankPool,
) -> None:
    # A peer's operation need not declare its collectives: rank 0 raises in one declared
    # non-collective while rank 1 waits in a barrier forever. That is the peer's defect, an
    # assertion that names both ranks, not a stuck run or a pool timeout.
    pool.start()
    gen = pool.generation
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run("pool.strand", {"ranks": [0], "message": "peer bug 17"}, example="case-strand")
    assert time.monotonic() - t0 < scaled(pool.timeout)  # the grace, not the call's timeout
    text = str(info.value)
    assert re.search(
        r"rank 0 raised ValueError: peer bug 17; rank 1 still waiting in a collective after "
        r"\d+\.\d s",
        text,
    ), text
    assert "case-strand" in text and "the pool was restarted" in text
    assert [(f.rank, f.type_name) for f in info.value.failures] == [(0, "ValueError")]
    # the next example gets a fresh pool
    assert pool.run("pool.echo")[1].value["rank"] == 1
    assert pool.generation == gen + 1


@pytest.mark.rule("CONF-2", "CONF-15")
def test_an_adapters_outcomes_read_the_pools_words_for_each_rank(pool: RankPool) -> None:
    # The checkpoint-files cases judge a refusal by what each rank did, read from the pool's
    # error (conformance/interface/checkpoint_files.py): a rank stranded in a collective must
    # not read as one that returned, whichever way the pool words it.
    from conformance.interface.checkpoint_files import split_refusal

    pool.start()
    with pytest.raises(RankError) as info:
        pool.run("pool.strand", {"ranks": [0], "message": "peer bug 18"})
    got = split_refusal(info.value, 2)
    assert got[0] == "raised ValueError: peer bug 18", got
    assert re.fullmatch(r"still waiting in a collective after \d+\.\d s", got[1]), got
    with pytest.raises(RankError) as info:
        pool.run("pool.fail", {"ranks": [1], "phase": "check", "message": "bad input 43"})
    got = split_refusal(info.value, 2)
    assert got == {0: "stopped before the collective (another rank's check failed)",
                   1: "raised ValueError: bad input 43"}, got  # fmt: skip


@pytest.mark.rule("CONF-2", "CONF-15")
def test_an_adapters_outcomes_read_several_stranded_ranks() -> None:
    from conformance.interface.checkpoint_files import split_refusal
    from shardspec.testing.dispatch import error_message
    from shardspec.testing.results import failure_from

    tb = "Traceback (most recent call last):\nValueError: rank 3 still waiting in a collective"
    raised = {"ok": False, "phase": "run", "error": tb, "restarted": True, "stranded_s": 2.5}
    replies = {0: raised, 3: {"ok": True, "restarted": True}}
    text = error_message("peer.save", "case-9", {0: raised}, replies, 4)
    got = split_refusal(RankError(text, [failure_from(0, raised)]), 4)
    waiting = "still waiting in a collective after 2.5 s"
    # rank 0's own message names rank 3 as waiting: the pool's line says who really waits
    assert got == {0: "raised ValueError: rank 3 still waiting in a collective",
                   1: waiting, 2: waiting, 3: "returned"}, (text, got)  # fmt: skip


@pytest.mark.rule("CONF-2")
def test_hypothesis_shrinks_a_rank_failure(pool: RankPool) -> None:
    seen: list[int] = []

    @settings(max_examples=30, database=None)
    @given(st.integers(0, 1000))
    def prop(n: int) -> None:
        if n >= 10:
            seen.append(n)
            pool.run("pool.fail", {"ranks": [1], "phase": "check", "message": f"n={n}"})

    with pytest.raises(RankError, match="n=10"):
        prop()
    assert seen[-1] == 10


@pytest.mark.rule("CONF-3")
def test_a_killed_rank_is_reported_and_the_pool_restarts(pool: RankPool) -> None:
    pool.start()
    old = pool.pids()
    t0 = time.monotonic()
    with pytest.raises(RankCrash, match=r"rank 1 died \(exit code 9\).*case-kill"):
        pool.run("pool.exit", {"ranks": [1], "code": 9}, example="case-kill")
    assert time.monotonic() - t0 < scaled(pool.timeout)
    assert not any(_alive(p) for p in old)
    assert pool.run("pool.echo")[1].value["rank"] == 1
    assert set(pool.pids()).isdisjoint(old)


@pytest.mark.rule("CONF-3")
def test_a_hanging_rank_times_out_and_the_pool_restarts(pool: RankPool) -> None:
    pool.start()
    old = pool.pids()
    t0 = time.monotonic()
    with pytest.raises(RankCrash, match=r"\[0\] did not answer within 1 s.*case-hang"):
        pool.run("pool.hang", {"ranks": [0]}, example="case-hang", timeout=1)
    assert 1 <= time.monotonic() - t0 < scaled(1 + 10)  # the timeout, plus killing the ranks
    assert not any(_alive(p) for p in old)
    assert pool.run("pool.echo")[0].value["rank"] == 0


@pytest.mark.rule("CONF-3")
def test_closing_leaves_no_process(pool: RankPool) -> None:
    pool.start()
    pids = pool.pids()
    pool.close()
    assert not pool.running
    assert not any(_alive(p) for p in pids)
