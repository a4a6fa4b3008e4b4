"""The serialized layout form (spec/04-convert.md CONVERT-8, CONVERT-9), written by hand from
the spec, and malformed variants of it, each with what a reader's refusal must name.

``layout_json(layout)`` is the spec's text, built here without the implementation under test.
``malformed_layout_json()`` draws a valid text and breaks exactly one thing: a top level that
is not an object, a wrong format or version, a missing or unknown key (top level or shard),
a shape, rank, offset or size that is not a non-negative int (negative, bool, float, ``1e3``,
string, null, list, object), a field of the wrong kind, offsets and sizes of different
lengths, a duplicate key, ``NaN``/``Infinity``, or text that is not JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from conformance.strategies import perturbed_layouts
from shardspec.metadata import Layout

__all__ = [
    "BAD_INTS",
    "FAULTS",
    "HUGE_INT",
    "Malformed",
    "each_field_out_of_range",
    "layout_dict",
    "layout_json",
    "malformed_layout_json",
]

# Raw JSON text of values that are not a non-negative int: negative (small, and below int64),
# the wrong type (bool, float, exponent, string, null, list, object).
BAD_INTS = (
    "-1",
    "-2",
    "-9223372036854775809",
    "true",
    "false",
    "1.5",
    "1e3",
    '"3"',
    "null",
    "[]",
    "{}",
)
# An integer of more than 4300 digits (CONVERT-9): refused by the parser, so no path is named.
HUGE_INT = "9" * 4301
_MARK = "\x00bad\x00"
FAULTS = (
    "top_not_object",
    "format",
    "version",
    "top_missing",
    "top_unknown",
    "shape_kind",
    "shape_item",
    "shards_kind",
    "shard_not_object",
    "shard_missing",
    "shard_unknown",
    "rank",
    "field_kind",
    "field_item",
    "lengths",
    "duplicate",
    "constant",
    "not_json",
)


def layout_dict(layout: Layout) -> dict[str, Any]:
    return {
        "format": "shardspec.layout",
        "version": 1,
        "shape": list(layout.shape),
        "shards": [
            {"rank": s.rank, "offsets": list(s.box.offsets), "sizes": list(s.box.sizes)}
            for s in layout.shards
        ],
    }


def layout_json(layout: Layout) -> str:
    """CONVERT-8's text: compact, keys in the spec's order, shards in the layout's order."""
    return json.dumps(layout_dict(layout), separators=(",", ":"))


@dataclass(frozen=True)
class Malformed:
    """A malformed text, the fault it carries, and the strings the refusal must contain (the
    JSON path of the bad field and, for a key, the key)."""

    text: str
    fault: str
    names: tuple[str, ...]

    def __repr__(self) -> str:
        return f"Malformed({self.fault}, names={self.names}, text={self.text[:200]!r})"


def _dump(obj: Any, raw: str | None = None) -> str:
    text = json.dumps(obj, separators=(",", ":"))
    return text if raw is None else text.replace(json.dumps(_MARK), raw)


@st.composite
def malformed_layout_json(draw: st.DrawFn) -> Malformed:
    layout = draw(perturbed_layouts())  # the reader checks structure, not the layout rules
    d = layout_dict(layout)
    shards = d["shards"]
    faults = [
        f
        for f in FAULTS
        if shards or not f.startswith(("shard_", "rank", "field_", "lengths"))
        if d["shape"] or f != "shape_item"
    ]
    fault = draw(st.sampled_from(faults))
    bad = draw(st.sampled_from(BAD_INTS))
    i = draw(st.integers(0, max(0, len(shards) - 1)))
    key = draw(st.sampled_from(["rank", "offsets", "sizes"]))
    top_key = draw(st.sampled_from(["format", "version", "shape", "shards"]))
    names: tuple[str, ...]
    raw: str | None = None
    if fault == "top_not_object":
        obj: Any = draw(st.sampled_from([[d], 3, "layout", None]))
        names = ("$",)
    elif fault == "format":
        fmt = draw(st.sampled_from(["shardspec.Layout", "", 1]))
        obj, names = {**d, "format": fmt}, ("$.format",)
    elif fault == "version":
        obj, raw = {**d, "version": _MARK}, draw(st.sampled_from(["2", "0", "true", "1.0", '"1"']))
        names = ("$.version",)
    elif fault == "top_missing":
        obj = {k: v for k, v in d.items() if k != top_key}
        names = ("$", repr(top_key))
    elif fault == "top_unknown":
        obj, names = {**d, "ranks": []}, ("$", "'ranks'")
    elif fault == "shape_kind":
        obj, names = {**d, "shape": draw(st.sampled_from([3, "3", None, {}]))}, ("$.shape",)
    elif fault == "shape_item":
        j = draw(st.integers(0, len(d["shape"]) - 1))
        shape = list(d["shape"])
        shape[j] = _MARK
        obj, raw, names = {**d, "shape": shape}, bad, (f"$.shape[{j}]",)
    elif fault == "shards_kind":
        obj, names = {**d, "shards": draw(st.sampled_from([{}, 1, "x", None]))}, ("$.shards",)
    elif fault == "shard_not_object":
        new = list(shards)
        new[i] = draw(st.sampled_from([[0, [0], [1]], 1, None, "shard"]))
        obj, names = {**d, "shards": new}, (f"$.shards[{i}]",)
    elif fault in ("shard_missing", "shard_unknown", "rank", "field_kind", "field_item", "lengths"):
        new = [dict(s) for s in shards]
        s = new[i]
        path = f"$.shards[{i}]"
        if fault == "shard_missing":
            del s[key]
            names = (path, repr(key))
        elif fault == "shard_unknown":
            s["device"] = "cpu"
            names = (path, "'device'")
        elif fault == "rank":
            s["rank"], raw, names = _MARK, bad, (f"{path}.rank",)
        elif fault == "field_kind":
            field = draw(st.sampled_from(["offsets", "sizes"]))
            s[field] = draw(st.sampled_from([0, "0", None, {}]))
            names = (f"{path}.{field}",)
        elif fault == "field_item":
            field = draw(st.sampled_from(["offsets", "sizes"]))
            if not s[field]:  # a 0-d layout's box has no offsets: add a bad one
                s[field] = [0]
            j = draw(st.integers(0, len(s[field]) - 1))
            items = list(s[field])
            items[j] = _MARK
            s[field], raw, names = items, bad, (f"{path}.{field}[{j}]",)
        else:
            field = draw(st.sampled_from(["offsets", "sizes"]))
            s[field] = [*s[field], 0]
            names = (path,)
        obj = {**d, "shards": new}
    elif fault == "duplicate":
        text = _dump(d)
        if shards and draw(st.booleans()):
            # the first shard's key twice: '{"rank":r,' -> '{"rank":r,"rank":r,'
            r = shards[0]["rank"]
            text = text.replace(f'{{"rank":{r},', f'{{"rank":{r},"rank":{r},', 1)
            return Malformed(text, fault, ("'rank'",))
        return Malformed(
            text.replace('{"format"', '{"version":1,"format"', 1), fault, ("'version'",)
        )
    elif fault == "constant":
        const = draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
        return Malformed(_dump({**d, "version": _MARK}, const), fault, ())
    else:  # not_json
        text = _dump(d)
        cut = draw(st.integers(0, len(text) - 1))
        return Malformed(text[:cut], fault, ())
    return Malformed(_dump(obj, raw), fault, names)


def each_field_out_of_range() -> list[Malformed]:
    """One text per (int field, bad value): every int field of a 2-shard layout (the version,
    each shape item, each shard's rank, each offset, each size) set alone to each of BAD_INTS
    and to HUGE_INT, the rest valid. Drawn faults reach a given pair rarely; these reach each
    one in every run."""
    from shardspec.metadata import Box, Shard

    layout = Layout((4, 3), [Shard(Box((0, 0), (2, 3)), 0), Shard(Box((2, 0), (2, 3)), 1)])
    d = layout_dict(layout)
    paths: list[tuple[str, Any]] = [("$.version", ("version",))]
    paths += [(f"$.shape[{j}]", ("shape", j)) for j in range(2)]
    for i in range(2):
        paths.append((f"$.shards[{i}].rank", ("shards", i, "rank")))
        for field in ("offsets", "sizes"):
            paths += [(f"$.shards[{i}].{field}[{j}]", ("shards", i, field, j)) for j in range(2)]
    out = []
    for path, keys in paths:
        for bad in (*BAD_INTS, HUGE_INT):
            obj = json.loads(json.dumps(d))
            target = obj
            for k in keys[:-1]:
                target = target[k]
            target[keys[-1]] = _MARK
            names = () if bad == HUGE_INT else (path,)
            out.append(Malformed(_dump(obj, bad), f"out_of_range {path}={bad[:24]}", names))
    return out
