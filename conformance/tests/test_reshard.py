"""Resharding (spec/06-reshard.md): any valid layout to any other, on 1 to 4 ranks, every
dtype, strided inputs, with and without a buffer bound; every rank's output against the global
tensor, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given

from conformance import reference
from conformance.assertions import (
    GLOO_ABORT,
    assert_equal,
    assert_tensor_bitwise,
    describe_layout,
)
from conformance.cases import case
from conformance.impls import Impl
from conformance.strategies.streams import (
    large_reshard_cases,
    reshard_cases,
    run_length_cases,
    state_dict_cases,
    subgroup_cases,
)
from shardspec.metadata import chunk_layout
from shardspec.testing import RankCrash

SHARDED_TENSOR_RESHARD = pytest.mark.known_defect(
    "torch",
    "ShardedTensor.reshard picks the wrong sender when only the rank order changes "
    "(reshuffle_local_shard) and uses list all_to_all, which gloo rejects for uneven sizes "
    "(reshard_local_shard)",
    raises=(AssertionError, RankCrash),
    match=rf"{GLOO_ABORT}|(?s:raised in 'reshard\.torch_sharded'.*ProcessGroupGloo::scatter: "
    r"invalid tensor size)",
)


def _known_case(dim: int, ranks: list[int]) -> dict[str, Any]:
    """The 12x21 tensor chunked on dim 0 over ranks 0-3, to a chunking of ``dim`` over
    ``ranks``: the examples of spec/06-reshard.md's upstream note."""
    return {
        "world": 4,
        "src": chunk_layout((12, 21), 0, [0, 1, 2, 3]),
        "dst": chunk_layout((12, 21), dim, ranks),
        "tensor": torch.arange(12 * 21, dtype=torch.float32).reshape(12, 21),
        "noncontig": False,
        "max_buffer_bytes": None,
    }


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.pool
@SHARDED_TENSOR_RESHARD
@given(reshard_cases())
@example(_known_case(0, [1, 2, 3, 0]))  # upstream: the wrong sender, gloo aborts
@example(_known_case(1, [0, 1, 2, 3]))  # upstream: list all_to_all, 21 = 6+6+6+3 columns
def test_reshard_equals_the_global_tensor_sliced(impl: Impl, pools: Any, c: dict[str, Any]) -> None:
    _check_reshard(impl, pools, c)


def _check_reshard(impl: Impl, pools: Any, c: dict[str, Any]) -> None:
    src, dst, t = c["src"], c["dst"], c["tensor"]
    ex = (
        f"reshard({describe_layout(src)} -> {describe_layout(dst)}, dtype={t.dtype}, "
        f"world={c['world']}, noncontig={c['noncontig']}, "
        f"max_buffer_bytes={c['max_buffer_bytes']})"
    )
    with case():
        results = impl.reshard(
            pools(c["world"]),
            src,
            dst,
            t,
            max_buffer_bytes=c["max_buffer_bytes"],
            noncontig=c["noncontig"],
            example=ex,
        )
        for r in results:
            boxes = dst.boxes_of(r.rank)
            assert_equal(f"rank{r.rank}.len(out)", len(r.tensors), len(boxes), ex)
            for k, box in enumerate(boxes):
                want = reference.gather(t, reference.indices_of_boxes([box], t.dim()))
                assert_tensor_bitwise(f"rank{r.rank}.out[{k}]", r.tensors[k], want, ex)


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.pool
@SHARDED_TENSOR_RESHARD
@given(large_reshard_cases())
def test_large_pieces_travel_from_and_into_the_tensors_that_hold_them(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Pieces of hundreds of KiB, which gloo ranks send straight from a source shard and
    receive straight into an output where those hold them contiguously, and pack otherwise:
    every rank's output equals the global tensor sliced."""
    _check_reshard(impl, pools, c)


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.pool
@given(state_dict_cases())
def test_mixed_dtype_state_dict_unpacks_into_strided_out_tensors(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Several dtypes share each rank pair's stream; every rank's outputs, written into the
    out= views it gave (at storage offsets, strided, transposed), equal the reference, and
    nothing around the views is touched."""
    _check_state_dict(impl, pools, c)


@pytest.mark.rule("RESHARD-1", "RESHARD-6")
@pytest.mark.pool
@given(run_length_cases())
def test_every_run_length_moves_in_one_state_dict(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """One state dict holding pieces of every run length from one element up (contiguous and
    strided, every dtype, cut by drawn budgets), and pieces one element either side of the
    size at which gloo ranks send a piece from its tensor: every rank's outputs equal the
    reference, so a fast path wrong for one length only is caught in any example."""
    _check_state_dict(impl, pools, c)


@pytest.mark.rule("RESHARD-1", "RESHARD-10")
@pytest.mark.pool
@given(subgroup_cases())
def test_a_state_dict_reshards_among_a_subgroup_of_the_ranks(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """On the process group of some of the pool's ranks, whose rank i is the i-th member
    (not pool rank i): each member's outputs equal the reference at its group rank's boxes,
    and the other ranks, which take no part, get nothing."""
    _check_state_dict(impl, pools, c)


def _check_state_dict(impl: Impl, pools: Any, c: dict[str, Any]) -> None:
    entries, members = c["entries"], c.get("members")
    on = "" if members is None else f"on the group of pool ranks {members} of {c['pool']}, "
    ex = (
        f"reshard_state_dict({on}world={c['world']}, max_buffer_bytes={c['budget']}, "
        + ", ".join(
            f"{e['key']}: {describe_layout(e['src'])} -> {describe_layout(e['dst'])} "
            f"out={e['out']} pad={e['pad']}"
            for e in entries
        )
        + ")"
    )
    with case():
        if members is None:
            results = impl.reshard_state_dict(pools(c["world"]), entries, c["budget"], ex)
        else:
            results = impl.reshard_state_dict_on(
                pools(c["pool"]), members, entries, c["budget"], ex
            )
        for r in results:
            if members is not None and r.rank not in members:
                assert_equal(f"rank{r.rank} (not in the group).len(out)", len(r.tensors), 0, ex)
                continue
            me = r.rank if members is None else members.index(r.rank)
            want = [(e, box) for e in entries for box in e["dst"].boxes_of(me)]
            assert_equal(f"rank{r.rank}.len(out)", len(r.tensors), len(want), ex)
            for k, ((e, box), got) in enumerate(zip(want, r.tensors)):
                t = e["tensor"]
                ref = reference.gather(t, reference.indices_of_boxes([box], t.dim()))
                assert_tensor_bitwise(f"rank{r.rank}.{e['key']}[{k}]", got, ref, ex)
            for e in entries:
                if e["out"] is not None:
                    key = e["key"]
                    assert_equal(
                        f"rank{r.rank}.{key} returned the out= tensors",
                        r.value["same"][key],
                        True,
                        ex,
                    )
                    assert_equal(
                        f"rank{r.rank}.{key} wrote outside out=", r.value["spilled"][key], False, ex
                    )
