"""What the ranks of a reshard check together before any data moves (spec/06-reshard.md).
Ranks that agree on every box but not on which rank holds one (one rank's copy of a ``src``
or ``dst`` layout differs only there) all raise the same ``ReshardError``, naming what they
disagree on and the ranks on each side, and nothing is written to their out= tensors; when
they agree the data moves, bit for bit (RESHARD-5). With ``check_replicas=True``, copies of a
replicated source box that differ in one element or one byte (its high byte, a NaN's
payload, the sign of a zero) make every rank raise the same error naming the tensor, the box
and the ranks holding each copy, again before anything is written; identical copies move bit
for bit (RESHARD-13). Through ``reshard`` (one tensor) and ``reshard_state_dict`` (several,
the difference in any one of them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given, settings

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies.agreement import (
    disagreement_cases,
    replica_cases,
    replica_change,
    replicas_of,
)
from shardspec.metadata import Box, Layout, Shard, chunk_layout


def rank_list(ranks: list[int]) -> str:
    """Ranks as RESHARD-5's messages write them: ``rank 5``, ``ranks 0, 2, 5-7`` (runs of
    three or more as a range)."""
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    runs: list[list[int]] = []
    for r in rs:
        if runs and runs[-1][-1] == r - 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)) for run in runs]
    return "ranks " + ", ".join(parts)


def _describe(c: dict[str, Any]) -> str:
    body = ", ".join(
        f"{e['key']}: {describe_layout(e['src'])} -> {describe_layout(e['dst'])} "
        f"dtype={e['tensor'].dtype}"
        for e in c["entries"]
    )
    return f"{c['api']}(world={c['world']}, out={c['out']}, {body})"


def _moved(results: list[Any], entries: list[dict[str, Any]], ex: str) -> None:
    """Every rank returned, holding its destination boxes of every entry (RESHARD-1)."""
    for r in results:
        assert_equal(f"rank{r.rank}.error", r.value["error"], None, ex)
        want = [(e, box) for e in entries for box in e["dst"].boxes_of(r.rank)]
        assert_equal(f"rank{r.rank}.len(out)", len(r.tensors), len(want), ex)
        for k, ((e, box), got) in enumerate(zip(want, r.tensors)):
            t = e["tensor"]
            ref = reference.gather(t, reference.indices_of_boxes([box], t.dim()))
            assert_tensor_bitwise(f"rank{r.rank}.{e['key']}[{k}]", got, ref, ex)


def _all_raised(results: list[Any], out: bool, ex: str, rule: str) -> str:
    """Every rank raised the same ReshardError and wrote nothing to its out= tensors."""
    for r in results:
        assert_equal(
            f"rank{r.rank} raised ReshardError", r.value["error"] is not None, True, ex, rule=rule
        )
        if out:
            assert_equal(f"rank{r.rank}.out= untouched", r.value["untouched"], True, ex, rule)
    messages = sorted({r.value["error"] for r in results})
    assert_equal("distinct messages of the ranks", len(messages), 1, f"{ex}: {messages}", rule)
    return str(messages[0])


def _contains(what: str, message: str, part: str, ex: str, rule: str) -> None:
    if part not in message:
        raise AssertionError(f"{what}={message!r}, but should name {part!r} [{ex}] (breaks {rule})")


def _t(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float64).reshape(shape).to(dtype)


def _disagree(
    world: int,
    entries: list[dict[str, Any]],
    i: int,
    side: str,
    j: int,
    to: int,
    who: int,
    out: bool = False,
) -> dict[str, Any]:
    """Rank ``who``'s copy of entry ``i``'s ``side`` has its shard ``j`` on rank ``to``."""
    layout = entries[i][side]
    shards = list(layout.shards)
    moved = shards[j]
    shards[j] = Shard(moved.box, to)
    key = entries[i]["key"]
    return {
        "world": world,
        "api": "reshard" if len(entries) == 1 else "state_dict",
        "entries": entries,
        "out": out,
        "copies": {who: {key: {side: Layout(layout.shape, shards)}}},
        "odd": {
            "rank": who,
            "key": key,
            "side": side,
            "box": moved.box,
            "from": moved.rank,
            "to": to,
        },
    }


def _entry(key: str, src: Layout, dst: Layout, dtype: torch.dtype) -> dict[str, Any]:
    return {"key": key, "src": src, "dst": dst, "tensor": _t(src.shape, dtype)}


ROWS3 = chunk_layout((6, 4), 0, [0, 1, 2])
COLS3 = chunk_layout((6, 4), 1, [2, 0, 1])
ROWS4 = chunk_layout((5, 3), 0, [0, 1, 2, 3])
COLS4 = chunk_layout((5, 3), 1, [3, 2, 1, 0])
DISAGREEMENTS = [
    # rank 2's copy of src: rows 0-1 on rank 1 (neither the owner nor the new one asks)
    _disagree(3, [_entry("t0", ROWS3, COLS3, torch.float32)], 0, "src", 0, 1, 2),
    # the last tensor of a state dict: rank 0's copy of its dst moves rank 2's row to rank 1
    _disagree(
        4,
        [_entry("t0", ROWS4, COLS4, torch.int64), _entry("t1", COLS4, ROWS4, torch.bfloat16)],
        1,
        "dst",
        2,
        1,
        0,
        out=True,
    ),
    # rank 1's own box, given away in its own copy of src
    _disagree(
        2,
        [_entry("t0", chunk_layout((4,), 0, [0, 1]), chunk_layout((4,), 0, [1, 0]), torch.uint8)],
        0,
        "src",
        1,
        0,
        1,
    ),
]
AGREEMENT = {
    "world": 4,
    "api": "state_dict",
    "out": True,
    "copies": {},
    "odd": None,
    "entries": [_entry("t0", ROWS4, COLS4, torch.float16), _entry("t1", COLS4, ROWS4, torch.int8)],
}


@pytest.mark.rule("RESHARD-5", "RESHARD-1")
@pytest.mark.pool
@settings(max_examples=15, deadline=None)
@given(disagreement_cases())
@example(DISAGREEMENTS[0])
@example(DISAGREEMENTS[1])
@example(DISAGREEMENTS[2])
@example(AGREEMENT)
def test_ranks_that_disagree_on_which_rank_holds_a_box_all_raise_before_data_moves(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    odd = c["odd"]
    ex = _describe(c)
    if odd is not None:
        ex += (
            f"; rank {odd['rank']}'s copy of {odd['key']}'s {odd['side']} has "
            f"{odd['box']} on rank {odd['to']}, not {odd['from']}"
        )
    with case():
        results = impl.reshard_checked(
            pools(c["world"]),
            c["entries"],
            api=c["api"],
            copies=c["copies"],
            out=c["out"],
            example=ex,
        )
        if odd is None:
            _moved(results, c["entries"], ex)
            return
        message = _all_raised(results, c["out"], ex, "RESHARD-5")
        part = "source layouts" if odd["side"] == "src" else "destination layouts"
        _contains("the error", message, f"disagree on the {part}", ex, "RESHARD-5")
        others = [r for r in range(c["world"]) if r != odd["rank"]]
        for ranks in (others, [odd["rank"]]):
            _contains("the error", message, f"{rank_list(ranks)} (", ex, "RESHARD-5")


def _replicas(
    world: int,
    entries: list[dict[str, Any]],
    kind: str,
    i: int,
    box: Box,
    owner: int,
    index: int,
    *,
    byte: int = 0,
    mask: int = 1,
    out: bool = False,
    noncontig: bool = False,
) -> dict[str, Any]:
    return {
        "world": world,
        "api": "reshard" if len(entries) == 1 else "state_dict",
        "out": out,
        "noncontig": noncontig,
        **replica_change(entries, kind, i, box, owner, index, byte, mask, world),
    }


def _hsdp(shape: tuple[int, ...], groups: int, size: int) -> Layout:
    base = chunk_layout(shape, 0, range(size))
    return Layout(
        shape, [Shard(s.box, s.rank + g * size) for g in range(groups) for s in base.shards]
    )


EVERYWHERE = Layout.replicated((3, 4), [0, 1, 2, 3])
HSDP = _hsdp((5, 2), 2, 2)  # rows 0-2 on ranks 0 and 2, rows 3-4 on ranks 1 and 3
HSDP_TO_ROWS = chunk_layout((5, 2), 0, [3, 1, 0, 2])
ON_THREE = Layout(
    (6,),
    [
        Shard(Box((0,), (2,)), 3),
        Shard(Box((2,), (4,)), 0),
        Shard(Box((2,), (4,)), 1),
        Shard(Box((2,), (4,)), 2),
    ],
)
REPLICAS = [
    # the last byte of the last element of the last of four copies (float32)
    _replicas(
        4,
        [_entry("t0", EVERYWHERE, chunk_layout((3, 4), 1, [0, 1, 2, 3]), torch.float32)],
        "high_byte",
        0,
        Box((0, 0), (3, 4)),
        3,
        11,
    ),
    # the last tensor of a state dict, its second replicated box, the first element's lowest
    # byte (int32; the first tensor's replicas agree)
    _replicas(
        4,
        [
            _entry("t0", HSDP, HSDP_TO_ROWS, torch.float64),
            _entry("t1", HSDP, chunk_layout((5, 2), 1, [1, 0]), torch.int32),
        ],
        "byte",
        1,
        Box((3, 0), (2, 2)),
        3,
        0,
        byte=0,
        mask=1,
        out=True,
    ),
    # a NaN's payload on the third of three owners, strided inputs (bfloat16)
    _replicas(
        4,
        [_entry("t0", ON_THREE, chunk_layout((6,), 0, [3, 2, 1, 0]), torch.bfloat16)],
        "nan_payload",
        0,
        Box((2,), (4,)),
        2,
        3,
        noncontig=True,
    ),
    # -0.0 in the middle of the first owner's copy (float16)
    _replicas(
        4,
        [_entry("t0", EVERYWHERE, chunk_layout((3, 4), 0, [2, 3, 0, 1]), torch.float16)],
        "negative_zero",
        0,
        Box((0, 0), (3, 4)),
        0,
        6,
    ),
    # identical copies move bit for bit, into out= views, from strided inputs
    _replicas(
        4,
        [
            _entry("t0", HSDP, HSDP_TO_ROWS, torch.bfloat16),
            _entry("t1", ON_THREE, chunk_layout((6,), 0, [0, 1, 2, 3]), torch.int64),
        ],
        "none",
        1,
        Box((2,), (4,)),
        0,
        0,
        out=True,
        noncontig=True,
    ),
]


@pytest.mark.rule("RESHARD-13", "RESHARD-1")
@pytest.mark.pool
@settings(max_examples=15, deadline=None)
@given(replica_cases())
@example(REPLICAS[0])
@example(REPLICAS[1])
@example(REPLICAS[2])
@example(REPLICAS[3])
@example(REPLICAS[4])
def test_replicas_that_differ_in_one_element_or_byte_make_every_rank_raise(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    bad = c["bad"]
    ex = f"{_describe(c)}, check_replicas=True, noncontig={c['noncontig']}"
    if bad is not None:
        key = c["entries"][bad["entry"]]["key"]
        ex += (
            f"; rank {bad['owner']}'s copy of {key}'s {bad['box']} changed by "
            f"{bad['kind']} at its element {bad['index']}"
        )
    with case():
        results = impl.reshard_checked(
            pools(c["world"]),
            c["entries"],
            api=c["api"],
            inputs=c["inputs"],
            check_replicas=True,
            out=c["out"],
            noncontig=c["noncontig"],
            example=ex,
        )
        if bad is None:
            _moved(results, c["entries"], ex)
            return
        message = _all_raised(results, c["out"], ex, "RESHARD-13")
        name = "the tensor" if c["api"] == "reshard" else f"tensor {key!r}"
        _contains("the error", message, f"{name}, box {bad['box']!r}: ", ex, "RESHARD-13")
        for ranks in (bad["others"], [bad["owner"]]):
            _contains("the error", message, f"{rank_list(ranks)} (", ex, "RESHARD-13")
        assert replicas_of(c["entries"][bad["entry"]]["src"])  # the case is what it says
