"""The versioned JSON form of a layout (spec/04-convert.md, CONVERT-8, CONVERT-9)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import (
    Box,
    Layout,
    LayoutError,
    Shard,
    chunk_layout,
    layout_from_dict,
    layout_from_json,
    layout_to_dict,
    layout_to_json,
)
from shardspec.metadata.serialize import from_dict, to_dict
from shardspec.metadata.strategies import chunk_layouts, shapes, valid_layouts


@st.composite
def any_layouts(draw: st.DrawFn) -> Layout:
    """Valid layouts, and arbitrary (invalid) ones: the JSON form carries both."""
    if draw(st.booleans()):
        return draw(st.one_of(valid_layouts(), chunk_layouts(max_ranks=10)))
    shape = draw(shapes(max_side=20))
    n = draw(st.integers(0, 5))
    shards = []
    for _ in range(n):
        nd = draw(st.sampled_from([len(shape), len(shape), len(shape) + 1]))
        offs = draw(st.lists(st.integers(0, 2**40), min_size=nd, max_size=nd))
        sizes = draw(st.lists(st.integers(0, 30), min_size=nd, max_size=nd))
        shards.append(Shard(Box(offs, sizes), draw(st.integers(0, 2**31))))
    return Layout(shape, shards)


@pytest.mark.rule("CONVERT-8")
@given(any_layouts())
def test_json_round_trip_is_exact_and_keeps_order(layout: Layout) -> None:
    text = layout_to_json(layout)
    back = layout_from_json(text)
    assert back.shape == layout.shape
    assert back.shards == layout.shards
    assert layout_to_json(back) == text  # stable: same layout, same text
    assert layout_from_json(text.encode()).shards == layout.shards
    assert from_dict(json.loads(text)).shards == layout.shards
    assert to_dict(layout) == json.loads(text)


@pytest.mark.rule("CONVERT-8")
def test_json_form_hand_worked() -> None:
    layout = chunk_layout((5, 2), 0, [1, 0, 2])
    assert layout_to_json(layout) == (
        '{"format":"shardspec.layout","version":1,"shape":[5,2],"shards":['
        '{"rank":1,"offsets":[0,0],"sizes":[2,2]},'
        '{"rank":0,"offsets":[2,0],"sizes":[2,2]},'
        '{"rank":2,"offsets":[4,0],"sizes":[1,2]}]}'
    )
    scalar = Layout.replicated((), [3])
    assert layout_to_dict(scalar) == {
        "format": "shardspec.layout",
        "version": 1,
        "shape": [],
        "shards": [{"rank": 3, "offsets": [], "sizes": []}],
    }
    assert layout_from_dict(layout_to_dict(scalar)).shards == scalar.shards


GOOD: dict[str, Any] = {
    "format": "shardspec.layout",
    "version": 1,
    "shape": [4, 2],
    "shards": [
        {"rank": 0, "offsets": [0, 0], "sizes": [2, 2]},
        {"rank": 1, "offsets": [2, 0], "sizes": [2, 2]},
    ],
}


def mutate(path: tuple[Any, ...], value: Any = "<delete>") -> dict[str, Any]:
    d = copy.deepcopy(GOOD)
    target: Any = d
    for p in path[:-1]:
        target = target[p]
    if value == "<delete>":
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize(
    ("path", "wrong", "right"),
    [(("shards", 1), "ofsets", "offsets"), ((), "shpae", "shape"), (("shards", 0), "Rank", "rank")],
)
def test_a_misspelt_key_is_named_as_written(path: tuple[Any, ...], wrong: str, right: str) -> None:
    d = copy.deepcopy(GOOD)
    target: Any = d
    for p in path:
        target = target[p]
    target[wrong] = target.pop(right)
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    with pytest.raises(LayoutError) as err:
        layout_from_dict(d)
    msg = str(err.value)
    assert f"{where} is missing key {right!r} and has unknown key {wrong!r}" in msg, msg
    with pytest.raises(LayoutError, match=f"unknown key {wrong!r}"):
        layout_from_json(json.dumps(d))


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize(
    ("data", "match"),
    [
        (mutate(("version",), 2), r"\$\.version must be 1 .* got 2"),
        (mutate(("version",), True), r"\$\.version must be 1 .* got True"),
        (mutate(("version",), 1.0), r"\$\.version must be 1 .* got 1\.0"),
        (mutate(("version",)), r"\$ is missing key 'version'"),
        (mutate(("format",), "torch.layout"), r"\$\.format must be 'shardspec\.layout'"),
        (mutate(("format",)), r"\$ is missing key 'format'"),
        (mutate(("extra",), 1), r"\$ has unknown key 'extra'"),
        (mutate(("shape",), [4, -2]), r"\$\.shape\[1\] must be a non-negative integer, got -2"),
        (mutate(("shape",), [4, 2.0]), r"\$\.shape\[1\] must be a non-negative integer, got float"),
        (mutate(("shape",), [True, 2]), r"\$\.shape\[0\] must be a non-negative integer, got bool"),
        (mutate(("shape",), "4,2"), r"\$\.shape must be a list of integers, got str"),
        (mutate(("shape",), [4, "2"]), r"\$\.shape\[1\] must be a non-negative integer, got str"),
        (mutate(("shape",), [4, None]), r"\$\.shape\[1\] .* got NoneType"),
        (mutate(("shards",), {}), r"\$\.shards must be a list, got dict"),
        (mutate(("shards", 1), [2, 0]), r"\$\.shards\[1\] must be an object, got list"),
        (mutate(("shards", 1, "rank")), r"\$\.shards\[1\] is missing key 'rank'"),
        (mutate(("shards", 1, "sizes")), r"\$\.shards\[1\] is missing key 'sizes'"),
        (mutate(("shards", 0, "owner"), 3), r"\$\.shards\[0\] has unknown key 'owner'"),
        (
            mutate(("shards", 1, "rank"), -1),
            r"\$\.shards\[1\]\.rank must be a non-negative integer",
        ),
        (mutate(("shards", 1, "rank"), False), r"\$\.shards\[1\]\.rank .* got bool"),
        (mutate(("shards", 1, "rank"), 1.5), r"\$\.shards\[1\]\.rank .* got float"),
        (mutate(("shards", 1, "offsets"), [2, -1]), r"\$\.shards\[1\]\.offsets\[1\] .* got -1"),
        (mutate(("shards", 0, "sizes"), [2, 2.5]), r"\$\.shards\[0\]\.sizes\[1\] .* got float"),
        (
            mutate(("shards", 0, "sizes"), [2]),
            r"\$\.shards\[0\] \(rank 0\) has 2 offsets but 1 sizes",
        ),
        ([GOOD], r"\$ must be an object, got list"),
        ("layout", r"\$ must be an object, got str"),
    ],
)
def test_malformed_dicts_are_refused_naming_the_field(data: Any, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        layout_from_dict(data)
    if isinstance(data, (dict, list)):
        with pytest.raises(LayoutError, match=match):
            layout_from_json(json.dumps(data))


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            '{"format":"shardspec.layout","format":"x","version":1,"shape":[],"shards":[]}',
            "duplicate key 'format'",
        ),
        ('{"format":"shardspec.layout","version":1,"shape":[NaN],"shards":[]}', "NaN"),
        ('{"format":"shardspec.layout","version":1,"shape":[1e3],"shards":[]}', r"\$\.shape\[0\]"),
        ('{"format": "shardspec.layout", "version": 1', "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_malformed_text_is_refused(text: str, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        layout_from_json(text)


@pytest.mark.rule("CONVERT-9")
def test_non_text_input_is_refused() -> None:
    with pytest.raises(LayoutError, match="must be str or bytes"):
        layout_from_json(GOOD)  # type: ignore[arg-type]


@pytest.mark.rule("CONVERT-9")
def test_reader_checks_structure_not_layout_rules() -> None:
    # A broken layout travels (a test may send one on purpose); validate() refuses it.
    d = mutate(("shards", 1, "offsets"), [1, 0])
    layout = layout_from_dict(d)
    assert layout.shards[1] == Shard(Box((1, 0), (2, 2)), 1)
    with pytest.raises(LayoutError):
        layout.validate()


@pytest.mark.rule("CONVERT-8")
def test_large_layout_round_trips() -> None:
    layout = chunk_layout((100_000, 3), 0, range(100_000))
    back = layout_from_json(layout_to_json(layout))
    assert back.shards == layout.shards
