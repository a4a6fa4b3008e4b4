"""Table names in their three forms (TORCHREC-19): module path + table, table, state-dict key.
No torch, no TorchRec: the plan below is duck-typed as layouts_from_plan reads it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shardspec.metadata import ConversionError
from shardspec.torchrec import layouts_from_plan, row_wise, table_wise
from shardspec.torchrec.keys import TableName, parse_table_name, resolve_table, resolve_tables


@pytest.mark.rule("TORCHREC-19")
@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("sparse.ebc.embedding_bags.t0.weight", TableName("sparse.ebc", "t0")),
        ("ebc.embeddings.t0.weight", TableName("ebc", "t0")),
        ("embedding_bags.t0.weight", TableName("", "t0")),
        ("sparse.ebc.t0", TableName("sparse.ebc", "t0")),
        ("t0", TableName("", "t0")),
    ],
)
def test_parse_each_form(name: str, want: TableName) -> None:
    assert parse_table_name(name) == want


KEYS = ["sparse.ebc.embedding_bags.t0.weight", "sparse.ebc.embedding_bags.t1.weight"]


@pytest.mark.rule("TORCHREC-19")
@pytest.mark.parametrize("name", ["sparse.ebc.t0", "t0", "sparse.ebc.embedding_bags.t0.weight"])
def test_every_form_resolves_to_the_state_dict_key(name: str) -> None:
    assert resolve_table(name, KEYS) == KEYS[0]


@pytest.mark.rule("TORCHREC-19")
def test_module_path_forms_resolve_to_state_dict_keys_and_back() -> None:
    assert resolve_table(KEYS[1], ["sparse.ebc.t0", "sparse.ebc.t1"]) == "sparse.ebc.t1"
    assert resolve_table(KEYS[1], ["t1", "t0"]) == "t1"


@pytest.mark.rule("TORCHREC-19")
def test_wrong_module_ambiguous_name_and_two_names_for_one_table_raise() -> None:
    with pytest.raises(ConversionError, match=r"no table 'other\.t0' .*state-dict key"):
        resolve_table("other.t0", KEYS)
    two = ["a.embedding_bags.t0.weight", "b.embedding_bags.t0.weight"]
    with pytest.raises(ConversionError, match="'t0' names several tables"):
        resolve_table("t0", two)
    assert resolve_table("b.t0", two) == two[1]
    with pytest.raises(ConversionError, match="name the same table"):
        resolve_tables(["t0", "sparse.ebc.t0"], KEYS)


def _sharding(layout: Any, stype: str) -> Any:
    shards = [
        SimpleNamespace(
            shard_offsets=list(s.box.offsets),
            shard_sizes=list(s.box.sizes),
            placement=f"rank:{s.rank}/cpu",
        )
        for s in layout.shards
    ]
    return SimpleNamespace(
        sharding_type=stype,
        ranks=[s.rank for s in layout.shards],
        sharding_spec=SimpleNamespace(shards=shards),
    )


@pytest.mark.rule("TORCHREC-19", "TORCHREC-10")
def test_layouts_from_plan_keys_each_table_as_shapes_names_it() -> None:
    a, b = row_wise((10, 8), 2), table_wise((7, 8), 1)
    plan = SimpleNamespace(
        plan={"sparse.ebc": {"a": _sharding(a, "row_wise"), "b": _sharding(b, "table_wise")}}
    )
    by_key = {
        "sparse.ebc.embedding_bags.a.weight": (10, 8),
        "sparse.ebc.embedding_bags.b.weight": (7, 8),
    }
    assert layouts_from_plan(plan, by_key) == {
        "sparse.ebc.embedding_bags.a.weight": a,
        "sparse.ebc.embedding_bags.b.weight": b,
    }
    assert layouts_from_plan(plan, {"a": (10, 8), "b": (7, 8)}) == {
        "sparse.ebc.a": a,
        "sparse.ebc.b": b,
    }
    with pytest.raises(ConversionError, match=r"no shape for table 'sparse\.ebc\.b'"):
        layouts_from_plan(plan, {"a": (10, 8), "other.ebc.b": (7, 8)})
