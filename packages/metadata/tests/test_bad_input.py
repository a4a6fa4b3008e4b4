"""Bad input is refused with a LayoutError that says what is wrong, in a message of bounded
length (spec/01-layout.md BOX-1, LAYOUT-7; spec/04-convert.md CONVERT-9)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardspec.metadata import (
    Box,
    ChunkSpec,
    Layout,
    LayoutError,
    Shard,
    chunk_bounds,
    chunk_layout,
    chunk_size,
    infer_spec,
    layout_from_json,
)

HUGE_TEXT = "x" * (10 << 20)


def _gen(values: list[int]) -> Any:
    return (v for v in values)


@pytest.mark.rule("BOX-1")
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"\x00\x01", "text or bytes"),
        (bytearray(b"\x00"), "text or bytes"),
        ("01", "text or bytes"),
        ({0, 1}, "unordered"),
        (frozenset({0}), "unordered"),
        ({0: 1, 1: 1}, "unordered"),
        (_gen([0, 1]), "one-shot iterator"),
        (iter([0, 1]), "one-shot iterator"),
        (map(int, [0, 1]), "one-shot iterator"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_only_ordered_sequences_are_taken_as_integer_sequences(value: object, why: str) -> None:
    # bytes iterate as ints and a set of ints happens to iterate in order, so both used to
    # pass silently; a generator is empty for the second reader.
    for build, name in (
        (lambda v: Box(v, (1, 1)), "Box offsets"),
        (lambda v: Box((0, 0), v), "Box sizes"),
        (lambda v: Layout(v, []), "Layout shape"),
        (lambda v: chunk_layout((4,), 0, v), "ranks"),
    ):
        with pytest.raises(LayoutError, match=why) as ei:
            build(value)
        assert str(ei.value).startswith(name), str(ei.value)


@pytest.mark.rule("BOX-1")
def test_sequences_of_every_ordered_kind_still_work() -> None:
    import numpy as np
    import torch

    for seq in (
        (0, 1),
        [0, 1],
        range(2),
        torch.Size([0, 1]),
        np.array([0, 1]),
        torch.tensor([0, 1]),
    ):
        assert Box(seq, seq) == Box((0, 1), (0, 1))
    assert Layout((4,), (s for s in chunk_layout((4,), 0, [0, 1]).shards)).shape == (4,)


@pytest.mark.rule("BOX-1")
@pytest.mark.parametrize("shards", [5, 2.5, None, object()], ids=["int", "float", "None", "object"])
def test_layout_names_its_shards_argument(shards: object) -> None:
    with pytest.raises(LayoutError, match=r"^Layout shards must be an iterable of Shard") as ei:
        Layout((4,), shards)  # type: ignore[arg-type]
    assert "not iterable" not in str(ei.value).split("(")[0]


@pytest.mark.rule("BOX-1")
@pytest.mark.parametrize("shards", [{Shard(Box((0,), (4,)), 0)}, "ab", b"ab"], ids=repr)
def test_layout_refuses_unordered_or_text_shards(shards: object) -> None:
    with pytest.raises(LayoutError, match="ordered iterable of Shard"):
        Layout((4,), shards)  # type: ignore[arg-type]


@pytest.mark.rule("LAYOUT-7")
@pytest.mark.parametrize(
    "build",
    [
        lambda: Box((HUGE_TEXT,), (1,)),
        lambda: Box([0.5] * (1 << 20), [1] * (1 << 20)),
        lambda: Box(HUGE_TEXT, (1,)),
        lambda: Layout((4,), [HUGE_TEXT]),
        lambda: Layout((4,), [Shard(Box((0,), (4,)), 0)] * 3 + [HUGE_TEXT.encode()]),
        lambda: Shard(Box((0,), (1,)), HUGE_TEXT),
        lambda: Shard(HUGE_TEXT, 0),
        lambda: Layout((4,), HUGE_TEXT),
        lambda: chunk_layout((4,), HUGE_TEXT, [0]),
        lambda: layout_from_json('{"format": "' + HUGE_TEXT + '"}'),
        lambda: layout_from_json(
            '{"format": "shardspec.layout", "version": "' + HUGE_TEXT + '", "shape": [], '
            '"shards": []}'
        ),
        lambda: layout_from_json(
            '{"format": "shardspec.layout", "version": 1, "shape": ["' + HUGE_TEXT + '"], '
            '"shards": []}'
        ),
        lambda: layout_from_json('{"' + HUGE_TEXT + '": 1}'),
        lambda: Box((-(10**5000),), (1,)),
        lambda: Layout((4,), [Shard(Box((0,), (4,)), 0)]).with_ranks(
            {i: i for i in range(1, 10**5)}
        ),
    ],
)
def test_messages_shorten_the_offending_value(build: Callable[[], object]) -> None:
    with pytest.raises(LayoutError) as ei:
        build()
    assert len(str(ei.value)) < 1000, str(ei.value)[:2000]


@pytest.mark.rule("LAYOUT-7")
def test_shorten_keeps_short_values_whole_and_cuts_long_ones() -> None:
    from shardspec.metadata.errors import shorten

    assert shorten((1, 2, 3)) == "(1, 2, 3)"
    assert shorten(2**255) == str(2**255)
    assert shorten(-(2**300)) == "<negative int of 301 bits>"
    assert len(shorten(HUGE_TEXT)) < 100 and shorten(HUGE_TEXT).startswith("'xxx")
    assert len(shorten(list(range(10**6)))) < 100

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert shorten(Hostile()).startswith("<Hostile")


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize(
    "text",
    ["[" * 1000 + "]" * 1000, "[" * 100_000, '{"a":' * 10_000 + "1" + "}" * 10_000],
    ids=["nested lists", "unclosed", "nested objects"],
)
def test_deeply_nested_json_is_a_layout_error(text: str) -> None:
    with pytest.raises(LayoutError, match=r"nests too deeply|not valid JSON"):
        layout_from_json(text)


@pytest.mark.rule("LAYOUT-7")
@pytest.mark.parametrize(
    "build",
    [
        lambda: chunk_size(-(10**5000), 1),
        lambda: chunk_size(4, -(10**5000)),
        lambda: chunk_bounds(5, 2**64),
        lambda: chunk_layout((4,), 10**5000, [0]),
        lambda: ChunkSpec(0, [10**5000, 10**5000]),
        lambda: infer_spec("x" * (10 << 20)),
    ],
    ids=["size", "count", "2**64 chunks", "dim", "ranks", "not a layout"],
)
def test_chunk_rule_and_specs_refuse_huge_values_in_short_messages(
    build: Callable[[], object],
) -> None:
    # str() of an int above 4300 digits raises ValueError; a list of 2**64 bounds would
    # exhaust memory before anything could be reported.
    with pytest.raises(LayoutError) as ei:
        build()
    assert len(str(ei.value)) < 400
