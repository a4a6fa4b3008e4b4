"""TorchRec embedding tables (spec/08-torchrec.md): each sharding type's layout against a
brute-force owner map, and the LocalShardsWrapper's shape and chunks. Against torch, the
layouts come from TorchRec's own plan helpers (skipped with the reason when TorchRec is not
installed) and the wrapper is ``torch.distributed.tensor._shards_wrapper``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, strategies as st

from conformance.assertions import GLOO_SIZE_MISMATCH, assert_equal, fail
from conformance.cases import case
from conformance.impls import Impl
from shardspec.metadata import Box, Layout, LayoutError


def owner_map(layout: Layout) -> dict[tuple[int, int], set[int]]:
    rows, cols = layout.shape
    return {
        (i, j): {s.rank for s in layout.shards if s.box.contains_point((i, j))}
        for i in range(rows)
        for j in range(cols)
    }


def chunk_index(i: int, n: int, k: int) -> int:
    size = -(-n // k)
    return i // size


def block_width(cols: int, lower: int) -> int:
    w = lower
    while w < cols:
        if w % 4 == 0 and cols % w == 0:
            return w
        w += 1
    return cols


def expected_owner(
    stype: str, p: dict[str, Any], shape: tuple[int, int], world: int, local: int, i: int, j: int
) -> set[int]:
    """Who owns (i, j), element by element from the rule statements (TORCHREC-1..9)."""
    rows, cols = shape
    if stype == "data_parallel":
        return set(range(world))
    if stype == "table_wise":
        return {p["rank"]}
    if stype == "row_wise":
        return {chunk_index(i, rows, world)}
    if stype == "column_wise":
        ranks = p["ranks"]
        return {ranks[j // block_width(cols, cols // len(ranks) or 128)]}
    if stype == "table_row_wise":
        return {p["host_index"] * local + chunk_index(i, rows, local)}
    if stype == "table_column_wise":
        return {p["ranks"][j // block_width(cols, p["block_size"])]}
    if stype == "grid_shard":
        host = p["host_indexes"][j // block_width(cols, 128)]
        return {host * local + chunk_index(i, rows, local)}
    raise AssertionError(stype)


@st.composite
def descriptions(draw: st.DrawFn) -> tuple[str, tuple[int, int], int, int, dict[str, Any]]:
    local = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 3))
    world = local * hosts
    rows = draw(st.integers(1, 12))
    stype = draw(
        st.sampled_from(
            [
                "data_parallel",
                "table_wise",
                "row_wise",
                "column_wise",
                "table_row_wise",
                "table_column_wise",
                "grid_shard",
            ]
        )
    )
    p: dict[str, Any] = {}
    if stype == "table_wise":
        p["rank"] = draw(st.integers(0, world - 1))
        cols = draw(st.integers(1, 9))
    elif stype == "column_wise":
        k = draw(st.integers(1, 4))
        p["ranks"] = draw(st.lists(st.integers(0, world - 1), min_size=k, max_size=k))
        cols = k * draw(st.sampled_from([1, 2, 4, 8, 40]))
    elif stype == "table_row_wise":
        p["host_index"] = draw(st.integers(0, hosts - 1))
        cols = draw(st.integers(1, 9))
    elif stype == "table_column_wise":
        h = draw(st.integers(0, hosts - 1))
        k = draw(st.integers(1, 3))
        p["block_size"] = 4
        p["ranks"] = draw(
            st.lists(st.integers(h * local, h * local + local - 1), min_size=k, max_size=k)
        )
        cols = 4 * k
    elif stype == "grid_shard":
        k = draw(st.integers(1, hosts))
        p["host_indexes"] = draw(st.permutations(range(hosts)).map(lambda q: list(q[:k])))
        cols = 128 * k
    else:
        cols = draw(st.integers(1, 9))
    return stype, (rows, cols), world, local, p


@pytest.mark.rule(
    "TORCHREC-1",
    "TORCHREC-2",
    "TORCHREC-3",
    "TORCHREC-5",
    "TORCHREC-7",
    "TORCHREC-8",
    "TORCHREC-9",
    "TORCHREC-10",
)
@given(descriptions())
def test_torchrec_layout_matches_the_owner_map(
    impl: Impl, desc: tuple[str, tuple[int, int], int, int, dict[str, Any]]
) -> None:
    stype, shape, world, local, p = desc
    ex = f"{stype}(shape={shape}, world={world}, local_size={local}, {p})"
    with case():
        layout = impl.torchrec_layout(stype, shape, world, local, p)
        try:
            layout.validate()
        except LayoutError as e:
            fail("layout", f"invalid ({e})", "valid", ex)
        for (i, j), owners in owner_map(layout).items():
            want = expected_owner(stype, p, shape, world, local, i, j)
            assert_equal(f"owners[{i}, {j}]", sorted(owners), sorted(want), ex)


@pytest.mark.rule("TORCHREC-3")
@pytest.mark.known_defect(
    "torch",
    "torchrec row_wise() divides by a block size of 0 on a table with 0 rows",
    raises=ZeroDivisionError,
    match=r"division (or modulo )?by zero",
)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_torchrec_row_wise_of_a_table_with_no_rows(impl: Impl, world: int) -> None:
    with case():
        layout = impl.torchrec_layout("row_wise", (0, 4), world, world, {})
        assert_equal("layout.valid", layout.is_valid(), True, f"row_wise((0, 4), world={world})")


@pytest.mark.rule("TORCHREC-9")
@pytest.mark.known_defect(
    "torch",
    "torchrec grid_shard(host_indexes) with fewer hosts than column blocks drops the blocks "
    "that have no host (a gap) instead of refusing",
    raises=AssertionError,
    match=r"^layout\.valid=False, but should be True \[grid_shard\(",
)
def test_torchrec_grid_with_too_few_hosts_is_refused(impl: Impl) -> None:
    ex = "grid_shard((10, 256), host_indexes=[1], local_size=2, world=4)"
    with case():
        try:
            layout = impl.torchrec_layout("grid_shard", (10, 256), 4, 2, {"host_indexes": [1]})
        except ValueError:
            return  # refused: the rule's answer
        assert_equal("layout.valid", layout.is_valid(), True, ex)


@st.composite
def stacks(draw: st.DrawFn, dim: int) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """Two to four blocks of a table stacked along ``dim`` (rows or columns), uneven."""
    other = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    shards, offsets, at = [], [], 0
    for n in sizes:
        shape = (n, other) if dim == 0 else (other, n)
        shards.append(torch.zeros(shape))
        offsets.append((at, 0) if dim == 0 else (0, at))
        at += n
    return shards, offsets


def _check_stack(
    impl: Impl, shards: list[torch.Tensor], offsets: list[tuple[int, int]], dim: int
) -> None:
    ex = f"wrapper(shards={[tuple(t.shape) for t in shards]}, offsets={offsets})"
    want = list(shards[0].shape)
    want[dim] = sum(t.shape[dim] for t in shards)
    with case():
        shape, chunks = impl.shards_wrapper(shards, offsets)
        assert_equal("wrapper.shape", tuple(shape), tuple(want), ex)
        assert_equal(
            "wrapper.chunks",
            chunks,
            [Box(o, tuple(t.shape)) for o, t in zip(offsets, shards)],
            ex,
        )


@pytest.mark.rule("TORCHREC-11", "TORCHREC-13")
@given(stacks(1))
def test_wrapper_of_column_blocks(impl: Impl, stack: Any) -> None:
    _check_stack(impl, *stack, dim=1)


@pytest.mark.rule("TORCHREC-11")
@pytest.mark.known_defect(
    "torch",
    "LocalShardsWrapper sums 2-D shard shapes along dim 1 even for a row-wise stack",
    raises=AssertionError,
    match=r"^wrapper\.shape=\(\d+, \d+\), but should be \(\d+, \d+\) \[wrapper\(",
)
@given(stacks(0))
def test_wrapper_of_row_blocks(impl: Impl, stack: Any) -> None:
    _check_stack(impl, *stack, dim=0)


@pytest.mark.rule("TORCHREC-12")
@pytest.mark.known_defect(
    "torch",
    "LocalShardsWrapper zips shards with offsets, silently dropping the shards that have no offset",
    raises=AssertionError,
    match=r"^wrapper=\(.*\), but should be 'refused' \[wrapper\(",
)
def test_wrapper_refuses_a_short_offsets_list(impl: Impl) -> None:
    ex = "wrapper(shards=[(2, 4), (3, 4)], offsets=[(0, 0)])"
    with case():
        try:
            got = impl.shards_wrapper([torch.zeros(2, 4), torch.zeros(3, 4)], [(0, 0)])
        except (ValueError, AssertionError):
            return
        fail("wrapper", got, "refused", ex)


# The ops a checkpoint load (copy_, detach, to) and an optimizer's state (zeros_like, mul_,
# addcmul_, ...) apply to a wrapper parameter, each with its operand ``o`` (a second wrapper
# of the same boxes); the reference applies the same op to each plain shard.
WRAPPER_OPS: dict[str, Any] = {
    "clone": lambda w, o: w.clone(),
    "zeros_like": lambda w, o: torch.zeros_like(w),
    "copy_": lambda w, o: w.copy_(o),
    "mul_": lambda w, o: w.mul_(3.0),
    "add_": lambda w, o: w.add_(o),
    "addcmul_": lambda w, o: w.addcmul_(o, o, value=0.5),
    "zero_": lambda w, o: w.zero_(),
}


@pytest.mark.rule("TORCHREC-14")
@pytest.mark.known_defect(
    "torch",
    "LocalShardsWrapper handles 8 ops (_to_copy, view, equal, detach, clone, new_empty and "
    "the all-gather pair): zeros_like, copy_, mul_ and the other ops a checkpoint load or an "
    "optimizer step applies raise (repro torchrec-wrapper-handles-few-ops)",
    raises=NotImplementedError,
    match=r"aten\.\w+\.\w+ is not supported for LocalShardsWrapper",
)
@given(stacks(1), st.sampled_from(sorted(WRAPPER_OPS)))
def test_wrapper_runs_load_and_optimizer_ops_shard_by_shard(
    impl: Impl, stack: Any, name: str
) -> None:
    shards, offsets = stack
    g = torch.Generator().manual_seed(len(shards))
    values = [torch.randn(t.shape, generator=g) for t in shards]
    others = [torch.randn(t.shape, generator=g) for t in shards]
    ex = f"{name} on wrapper(shards={[tuple(t.shape) for t in shards]}, offsets={offsets})"
    op = WRAPPER_OPS[name]
    want = [op(v.clone(), o) for v, o in zip(values, others)]
    with case():
        w = impl.wrapper_object([v.clone() for v in values], offsets)
        o = impl.wrapper_object(others, offsets)
        got = [t.clone() for t in op(w, o).local_shards()]
        assert_equal("shard shapes", [t.shape for t in got], [t.shape for t in want], ex)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_equal(f"shard {i} equals the op on its plain shard", torch.equal(a, b), True, ex)


# Real models moved between plans (TORCHREC-17): shardspec's reshard_model into a model of the
# destination plan, or TorchRec's own DistributedModelParallel.reshard in place. Each world is
# 2 fresh gloo ranks; building the models (TorchRec imports slowly) gets its own generous limit,
# the move a short one: three small tables move in milliseconds, so a rank still waiting after
# MOVE_TIMEOUT is hung, not slow.
MODEL_WORLD = 2
BUILD_TIMEOUT = 300.0
MOVE_TIMEOUT = 60.0


def _model_reshard(impl: Impl, pair: str, hash_seed: str) -> None:
    from shardspec.testing.optional import torchrec_error

    # missing, or installed but its kernels built for another torch (OSError): no verdict
    error = torchrec_error()
    if error is not None:
        pytest.skip(f"{error} (nox -s torchrec)")
    from conformance.models.torchrec import PAIRS, move_and_check, prepare
    from shardspec.testing import RankCrash, RankError, RankFailure, RankPool

    ex = f"{pair}: {PAIRS[pair]} on {MODEL_WORLD} gloo ranks, PYTHONHASHSEED={hash_seed}"
    with case():
        if impl.via is None:
            raise impl.unsupported("resharding a TorchRec model")
        pool = RankPool(
            MODEL_WORLD,
            timeout=BUILD_TIMEOUT,
            startup_timeout=BUILD_TIMEOUT,
            backend_name="gloo",
            device="cpu",
            env={"PYTHONHASHSEED": hash_seed},
        )
        try:
            built = pool.call(prepare, impl.via, [pair])
            assert_equal("pairs built", built, [1] * MODEL_WORLD, ex)
            try:
                answers = pool.call_all(move_and_check, impl.via, timeout=MOVE_TIMEOUT)
            except RankError as e:  # some ranks raised while the others waited for them
                raised = "; ".join(
                    f"rank {f.rank}: {f.type_name}: {f.message.splitlines()[0]}" for f in e.failures
                )
                fail("ranks", f"raised while the others hung ({raised})", "every rank answers", ex)
            except RankCrash as e:
                text = str(e)
                # the first line says which rank died or hung; a rank that gloo aborted also
                # names gloo's complaint, which tells the known defect from another death
                why = text.splitlines()[0]
                if GLOO_SIZE_MISMATCH in text:
                    why += f"; gloo: {GLOO_SIZE_MISMATCH}"
                fail(
                    "ranks",
                    f"hung or died while moving the tables ({why})",
                    "every rank answers",
                    ex,
                )
        finally:
            pool.close()
        errors = [
            f"rank {r}: {a.type_name}: {a.message}"
            for r, a in enumerate(answers)
            if isinstance(a, RankFailure)
        ]
        assert_equal("rank errors", errors, [], ex)
        problems = [p for a in answers for p in a]
        assert_equal("problems", problems, [], ex)


@pytest.mark.rule("TORCHREC-17", "CONF-1")
@pytest.mark.known_defect(
    "torch",
    "TorchRec's dynamic sharding tags each isend/irecv with Python's hash() of a tuple "
    "holding the table name (dynamic_sharding._generate_tag): hash() of a str is salted per "
    "process, so the ranks' tags differ and gloo, which matches tags, never completes the "
    "transfer (NCCL ignores tags); not reported upstream "
    "(repro torchrec-reshard-tags-from-salted-hash)",
    raises=AssertionError,
    # the defect is a hang in the move itself: building the models must have succeeded
    match=r"^ranks=.hung or died while moving the tables \(rank\(s\) \[[\d, ]+\] did not "
    r"answer within ",
)
def test_torchrec_model_reshard_between_plans_holds_the_reference(impl: Impl) -> None:
    # Every process salts str hashes on its own, as Python does by default.
    _model_reshard(impl, "table_wise", "random")


@pytest.mark.rule("TORCHREC-17", "CONF-1")
@pytest.mark.parametrize(
    "pair",
    [
        "table_wise",
        "column_wise, one block per rank",
        pytest.param(
            "row_wise to table_wise",
            marks=pytest.mark.known_defect(
                "torch",
                "TorchRec has no way to move a row_wise table to another plan (torchrec#2534): "
                "its dynamic sharding moves table_wise and column_wise tables only, and "
                "DistributedModelParallel.reshard of a row_wise table fails: an IndexError in "
                "create_embedding_bag_sharding on every rank when it is the only table moved, "
                "a shard-count mismatch on one rank while the other waits when other tables "
                "move too (repro torchrec-dmp-reshard-row-wise-table)",
                raises=AssertionError,
                # one table moved: IndexError on every rank (the repro); among others that
                # move, the ranks disagree on the table's shards and one waits for the other
                match=r"^(rank errors=\[.rank \d+: IndexError: list index out of range|ranks="
                r".raised while the others hung \(rank \d+: RuntimeError: Failed to "
                r"initialize sharded tensor for table 't0': Number of local shards)",
            ),
        ),
        pytest.param(
            "column_wise, two blocks on a rank",
            marks=pytest.mark.known_defect(
                "torch",
                "TorchRec's dynamic sharding receives every column block of a table into the "
                "rank's first local shard (dynamic_sharding._prepare_shard_distribution_comm_ops"
                ", its own TODO: 'assume only one tensor is available'): a rank given two "
                "blocks posts a 0-byte receive for the second and gloo aborts ('Received data "
                "size doesn't match expected size'); not reported upstream "
                "(repro torchrec-reshard-two-blocks-on-a-rank)",
                raises=AssertionError,
                match=r"^ranks=.hung or died while moving the tables \(rank \d+ died \(exit "
                rf"code -6\)[^']*; gloo: {GLOO_SIZE_MISMATCH}",
            ),
        ),
    ],
)
def test_torchrec_model_reshard_with_one_hash_seed_holds_the_reference(
    impl: Impl, pair: str
) -> None:
    # TorchRec's workaround for the defect above: one hash seed on every rank, so its data
    # movement itself is checked against the reference.
    _model_reshard(impl, pair, "0")
