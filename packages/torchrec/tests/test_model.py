"""TorchRec models on 2 and 4 gloo ranks: plans, DTensor truth, in-memory reshards between
plans (TORCHREC-10, -15, -16..18). One world per size for the session (conftest)."""

from __future__ import annotations

from typing import Any

import pytest

from shardspec.testing.optional import import_or_skip

import_or_skip("torchrec", "nox -s torchrec installs it")
import_or_skip("fbgemm_gpu", "nox -s torchrec installs fbgemm-gpu-cpu")

import torchrec_cases as cases  # noqa: E402

pytestmark = pytest.mark.torchrec


def S(stype: str, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return (stype, args, kwargs)


def all_tables(stype: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {t: S(stype, *args, **kwargs) for t in cases.TABLES}


# Explicit plans of every sharding type that runs on CPU. Tables: t0 11x8, t1 7x16, t2 5x8.
# The fused kernel needs every local width to be a multiple of 4.
PLANS_2 = {
    "data_parallel": all_tables("data_parallel", 2),
    "table_wise": {"t0": S("table_wise", 1), "t1": S("table_wise", 0), "t2": S("table_wise", 1)},
    "row_wise": all_tables("row_wise", 2),
    "column_wise": {
        "t0": S("column_wise", [0, 1]),
        "t1": S("column_wise", [1, 0, 1, 0]),  # two 4-column blocks per rank
        "t2": S("column_wise", [1]),
    },
    "table_row_wise": all_tables("table_row_wise", 0, 2),
    "table_column_wise": {
        "t0": S("table_column_wise", [1, 0], 2, block_size=4),
        "t1": S("table_column_wise", [0, 1], 2, block_size=8),
        "t2": S("table_column_wise", [0, 1], 2, block_size=4),
    },
}

PLANS_4 = {
    "row_wise": all_tables("row_wise", 4),
    "table_wise": {"t0": S("table_wise", 3), "t1": S("table_wise", 2), "t2": S("table_wise", 0)},
    "column_wise": {
        "t0": S("column_wise", [3, 2, 1, 0]),  # 8 columns on 4 ranks: two blocks (TORCHREC-5)
        "t1": S("column_wise", [0, 1, 2, 3]),
        "t2": S("column_wise", [2]),
    },
    "table_row_wise": {
        "t0": S("table_row_wise", 1, 2),
        "t1": S("table_row_wise", 0, 2),
        "t2": S("table_row_wise", 1, 2),
    },
    "table_column_wise": {
        "t0": S("table_column_wise", [2, 3], 2, block_size=4),
        "t1": S("table_column_wise", [1, 0], 2, block_size=8),
        "t2": S("table_column_wise", [3, 3], 2, block_size=4),
    },
    "grid_shard": {
        "t0": S("grid_shard", [1, 0], 2, block_size=4),
        "t1": S("grid_shard", [0, 1], 2, block_size=8),
        "t2": S("grid_shard", [1, 0], 2, block_size=4),
    },
    "data_parallel": all_tables("data_parallel", 4),
}

# (name, source plan, destination plan, source as DTensor, destination as DTensor)
PAIRS_2 = [
    ("row_wise->table_wise", PLANS_2["row_wise"], PLANS_2["table_wise"], False, False),
    (
        "column_wise->column_wise reversed",
        PLANS_2["column_wise"],
        {
            "t0": S("column_wise", [1, 0]),
            "t1": S("column_wise", [0, 0, 1, 1]),
            "t2": S("column_wise", [0]),
        },
        False,
        False,
    ),
    ("table_wise->row_wise (DTensor)", PLANS_2["table_wise"], PLANS_2["row_wise"], True, False),
    ("data_parallel->column_wise", PLANS_2["data_parallel"], PLANS_2["column_wise"], False, True),
    (
        "table_column_wise->table_row_wise",
        PLANS_2["table_column_wise"],
        PLANS_2["table_row_wise"],
        True,
        True,
    ),
]

PAIRS_4 = [
    (
        "row_wise on 4 -> table_wise on 2 of them",
        PLANS_4["row_wise"],
        {"t0": S("table_wise", 2), "t1": S("table_wise", 3), "t2": S("table_wise", 2)},
        False,
        False,
    ),
    ("column_wise->grid_shard", PLANS_4["column_wise"], PLANS_4["grid_shard"], False, False),
    (
        "table_row_wise host 1 -> host 0",
        PLANS_4["table_row_wise"],
        {t: S("table_row_wise", 1 - h, 2) for t, h in (("t0", 1), ("t1", 0), ("t2", 1))},
        True,
        False,
    ),
    ("grid_shard->row_wise (DTensor both)", PLANS_4["grid_shard"], PLANS_4["row_wise"], True, True),
    (
        "table_column_wise->data_parallel",
        PLANS_4["table_column_wise"],
        PLANS_4["data_parallel"],
        False,
        False,
    ),
    ("data_parallel->table_wise", PLANS_4["data_parallel"], PLANS_4["table_wise"], False, True),
]


def no_failures(per_rank: list[list[str]]) -> None:
    failures = [f for rank in per_rank for f in rank]
    assert not failures, "\n".join(failures)


@pytest.mark.rule(
    "TORCHREC-10",
    "TORCHREC-1",
    "TORCHREC-2",
    "TORCHREC-3",
    "TORCHREC-5",
    "TORCHREC-7",
    "TORCHREC-8",
    "TORCHREC-16",
)
@pytest.mark.parametrize("output_dtensor", [False, True], ids=["ShardedTensor", "DTensor"])
def test_plans_on_2_ranks(ranks2: Any, output_dtensor: bool) -> None:
    no_failures(ranks2.call(cases.check_plans, PLANS_2, output_dtensor))


@pytest.mark.rule("TORCHREC-10", "TORCHREC-7", "TORCHREC-8", "TORCHREC-9", "TORCHREC-16")
@pytest.mark.parametrize("output_dtensor", [False, True], ids=["ShardedTensor", "DTensor"])
def test_plans_on_4_ranks(ranks4: Any, output_dtensor: bool) -> None:
    plans = dict(PLANS_4)
    if output_dtensor:
        # TorchRec cannot build the DTensor of a table_column_wise table on a rank that holds
        # none of it (test_plans.py::test_upstream_dtensor_shape_of_table_column_wise).
        del plans["table_column_wise"]
    no_failures(ranks4.call(cases.check_plans, plans, output_dtensor))


@pytest.mark.rule("TORCHREC-17")
def test_reshard_between_plans_on_2_ranks(ranks2: Any) -> None:
    no_failures(ranks2.call(cases.check_pairs, PAIRS_2))


@pytest.mark.rule("TORCHREC-17")
def test_reshard_between_plans_on_4_ranks(ranks4: Any) -> None:
    no_failures(ranks4.call(cases.check_pairs, PAIRS_4))


@pytest.mark.rule("TORCHREC-17")
def test_reshard_writes_the_destination_weights_in_place_on_2_ranks(ranks2: Any) -> None:
    no_failures(ranks2.call(cases.check_in_place, PAIRS_2))


@pytest.mark.rule("TORCHREC-17")
def test_reshard_writes_the_destination_weights_in_place_on_4_ranks(ranks4: Any) -> None:
    no_failures(ranks4.call(cases.check_in_place, PAIRS_4[:2]))


@pytest.mark.rule("TORCHREC-18")
def test_loading_shards_of_another_plan_is_refused_on_every_rank(ranks4: Any) -> None:
    per_rank = ranks4.call(cases.check_refusal, PLANS_4["row_wise"], PLANS_4["table_wise"])
    for rank, (refused, untouched, loaded, missing) in enumerate(per_rank):
        assert "cannot load 'embedding_bags.t0.weight'" in refused, f"rank {rank}: {refused}"
        assert "reshard them to the model's layout first" in refused, f"rank {rank}: {refused}"
        assert untouched == "untouched=True", f"rank {rank}: a refused load copied something"
        assert loaded == "loaded=True", f"rank {rank}: a matching load did not land"
        assert "embedding_bags.t0.weight" in missing and missing != "no error", (
            f"rank {rank}: resharding with a table missing was not refused: {missing}"
        )


def _truth(pool: Any, plans: dict[str, Any]) -> dict[str, tuple[bool, bool]]:
    per_rank = pool.call(cases.dtensor_truth, plans)
    assert all(r == per_rank[0] for r in per_rank), "ranks disagree on the gathered layouts"
    return per_rank[0]  # type: ignore[no-any-return]


@pytest.mark.rule("TORCHREC-15")
def test_gathered_dtensor_layout_is_the_plan_layout(ranks4: Any) -> None:
    truth = _truth(ranks4, {k: v for k, v in PLANS_4.items() if k != "table_column_wise"})
    wrong = [k for k, (ok, _) in truth.items() if not ok]
    assert not wrong, f"gathered wrapper layouts differ from the plan for {wrong}"
    # Row-wise placements (Shard(0)) do describe the layout.
    assert all(claim for k, (_, claim) in truth.items() if k.startswith("row_wise."))


@pytest.mark.rule("TORCHREC-15")
@pytest.mark.parametrize("plan", ["table_wise", "table_row_wise", "grid_shard"])
@pytest.mark.xfail(
    strict=True,
    reason="upstream: TorchRec's DTensor placements (Replicate for table_wise, Shard(1) for "
    "table_row_wise and grid_shard) do not describe the table's layout",
)
def test_upstream_dtensor_placements_describe_the_layout(ranks4: Any, plan: str) -> None:
    truth = _truth(ranks4, {plan: PLANS_4[plan]})
    assert all(claim for _, claim in truth.values()), truth


@pytest.mark.rule("TORCHREC-19")
def test_layouts_from_plan_and_read_state_round_trip_on_4_ranks(ranks4: Any) -> None:
    no_failures(
        ranks4.call(cases.check_plan_keys_round_trip, PLANS_4["row_wise"], PLANS_4["grid_shard"])
    )
