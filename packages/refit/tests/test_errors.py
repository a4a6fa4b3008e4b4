"""Refusals on real gloo ranks (REFIT-6, REFIT-10, REFIT-12): every rank raises the same
RefitError naming the tensor, before any data moves, and the out tensors keep their values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from refit_cases import Case, run_refit

from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.refit import QuantizeFP8, Target, concat, recipe, recipe_to_data, rename
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


def base() -> Case:
    full = {
        "q": random_tensor((4, 3), torch.float32, 1),
        "k": random_tensor((2, 3), torch.float32, 2),
    }
    r = recipe([Target("qk", concat(["q", "k"], 0))])
    src = {n: chunk_layout(t.shape, 0, [0, 1]) for n, t in full.items()}
    dst = {"qk": chunk_layout((6, 3), 0, [2, 3])}
    return Case("base", r, full, src, dst)


def refused(pool: RankPool, per_rank: list[tuple[Any, ...]], *words: str) -> str:
    answers = pool.call(run_refit, per_rank=per_rank)
    messages = {a[1] for a in answers if a[0] == "err"}
    assert all(a[0] == "err" for a in answers), f"not every rank refused: {answers}"
    assert len(messages) == 1, f"ranks raised different errors: {messages}"
    assert all(a[2] for a in answers), "a refused refit wrote into an out tensor"
    msg = messages.pop()
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def args(case: Case, **change: Any) -> list[tuple[Any, ...]]:
    out = []
    for r in range(WORLD):
        a = list(case.args(r))
        for k, v in change.items():
            a[{"recipe": 0, "state": 1, "src": 2, "dst": 3, "out": 4}[k]] = v(r, a)
        out.append(tuple(a))
    return out


@pytest.mark.rule("REFIT-6", "REFIT-12")
def test_an_uncovered_destination_element_is_refused(pool: RankPool) -> None:
    case = base()
    gap = Layout.from_boxes((6, 3), [(Box((0, 0), (3, 3)), 2), (Box((4, 0), (2, 3)), 3)])
    refused(pool, args(case, dst=lambda r, a: {"qk": gap}), "'qk'")


@pytest.mark.rule("REFIT-6", "REFIT-12")
def test_a_doubly_covered_destination_element_is_refused(pool: RankPool) -> None:
    case = base()
    twice = Layout.from_boxes((6, 3), [(Box((0, 0), (4, 3)), 2), (Box((3, 0), (3, 3)), 3)])
    refused(pool, args(case, dst=lambda r, a: {"qk": twice}), "'qk'")


@pytest.mark.rule("REFIT-6", "REFIT-12")
@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("missing source", ("source 'k'", "missing")),
        ("extra source", ("source 'z'", "not read")),
        ("missing destination", ("destination 'qk'", "no layout")),
        ("extra destination", ("destination 'zz'", "not made")),
        ("shape", ("destination 'qk'", "shape")),
    ],
)
def test_names_and_shapes_that_do_not_match_the_recipe_are_refused(
    pool: RankPool, change: str, words: tuple[str, ...]
) -> None:
    case = base()
    z = chunk_layout((2,), 0, [0])
    edits = {
        "missing source": {"src": lambda r, a: {"q": a[2]["q"]}},
        "extra source": {"src": lambda r, a: {**a[2], "z": z}},
        "missing destination": {"dst": lambda r, a: {}, "out": lambda r, a: {}},
        "extra destination": {"dst": lambda r, a: {**a[3], "zz": z}},
        "shape": {
            "dst": lambda r, a: {"qk": chunk_layout((7, 3), 0, [2, 3])},
            "out": lambda r, a: {},
        },
    }[change]
    refused(pool, args(case, **edits), *words)


@pytest.mark.rule("REFIT-6", "REFIT-12")
def test_a_dtype_mismatch_on_one_rank_is_refused_on_every_rank(pool: RankPool) -> None:
    """Only rank 3's out tensor is float64: rank 0, which holds no destination, refuses too."""
    case = base()

    def out(r: int, a: tuple[Any, ...]) -> Any:
        return {n: [t.double() for t in ts] for n, ts in a[4].items()} if r == 3 else a[4]

    refused(pool, args(case, out=out), "destination 'qk'", "dtype", "rank 3")


@pytest.mark.rule("REFIT-6", "REFIT-12")
def test_parts_of_different_dtypes_are_refused(pool: RankPool) -> None:
    case = base()

    def state(r: int, a: tuple[Any, ...]) -> Any:
        return {n: [t.half() if n == "k" else t for t in ts] for n, ts in a[1].items()}

    refused(pool, args(case, state=state), "destination 'qk'", "dtype")


@pytest.mark.rule("REFIT-12")
def test_ranks_that_disagree_on_a_layout_are_refused(pool: RankPool) -> None:
    case = base()
    other = chunk_layout((6, 3), 0, [3, 2])
    refused(
        pool,
        args(case, dst=lambda r, a: {"qk": other} if r == 1 else a[3]),
        "ranks disagree",
        "'qk'",
    )


@pytest.mark.rule("REFIT-12")
def test_ranks_that_disagree_on_the_recipe_are_refused(pool: RankPool) -> None:
    case = base()
    other = recipe_to_data(recipe([Target("qk", concat(["k", "q"], 0))]))
    refused(
        pool,
        args(case, recipe=lambda r, a: other if r == 2 else a[0]),
        "ranks disagree on the recipe",
    )


@pytest.mark.rule("REFIT-10", "REFIT-12")
def test_a_shard_cutting_through_a_quantization_block_is_refused(pool: RankPool) -> None:
    """Rows 0-2 and 3-5 under blocks of 2 rows: block [2, 4) straddles ranks 2 and 3 (as vLLM
    refuses such a TP size)."""
    full = {"w": random_tensor((6, 4), torch.float32, 4)}
    r = recipe([Target("w", QuantizeFP8(concat(["w"], 0), (2, 2)))])
    case = Case("fp8 straddle", r, full, {"w": chunk_layout((6, 4), 0, [0, 1])}, {})
    dst = {"w": chunk_layout((6, 4), 0, [2, 3])}
    per_rank = [
        (recipe_to_data(r), case.state(rank), case.src, dst, {}, None) for rank in range(WORLD)
    ]
    refused(pool, per_rank, "destination 'w'", "cuts through a 2x2 quantization block")


@pytest.mark.rule("REFIT-12")
def test_a_wrong_local_shard_on_one_rank_is_refused_on_every_rank(pool: RankPool) -> None:
    case = base()

    def state(r: int, a: tuple[Any, ...]) -> Any:
        return {n: [t[:1] for t in ts] for n, ts in a[1].items()} if r == 1 else a[1]

    refused(pool, args(case, state=state), "source", "rank 1")


def test_rename_is_a_target_of_one_source() -> None:
    assert rename("b", "a").expr.name == "a"  # type: ignore[union-attr]
