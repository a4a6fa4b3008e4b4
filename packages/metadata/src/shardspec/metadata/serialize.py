"""The versioned JSON form of a layout: how layouts travel between processes and files.

    {"format": "shardspec.layout", "version": 1, "shape": [4, 6],
     "shards": [{"rank": 0, "offsets": [0, 0], "sizes": [2, 6]}, ...]}

Reading is strict (spec/04-convert.md): an unknown format or version, a missing or extra key,
a duplicate key, a bool, float or negative number is refused with a :class:`LayoutError` that
names the JSON path of the bad field (``$.shards[3].sizes[1]``). Nothing is ever unpickled.
The reader checks structure, not the layout rules: call ``validate()`` on the result for those.
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any, NoReturn

from .box import Box
from .errors import LayoutError, shorten
from .layout import Layout, Shard, require_layout

__all__ = [
    "FORMAT",
    "VERSION",
    "from_dict",
    "layout_from_dict",
    "layout_from_json",
    "layout_to_dict",
    "layout_to_json",
    "to_dict",
]

FORMAT = "shardspec.layout"
VERSION = 1
_TOP_KEYS = ("format", "version", "shape", "shards")
_SHARD_KEYS = ("rank", "offsets", "sizes")
_SHARD_KEYSET = frozenset(_SHARD_KEYS)
_INT_ONLY = {int}
_LIST_ONLY = {list}


def layout_to_dict(layout: Layout) -> dict[str, Any]:
    """The JSON-ready dict of ``layout``; shard order is kept."""
    require_layout(layout, "layout_to_dict")
    return {
        "format": FORMAT,
        "version": VERSION,
        "shape": list(layout.shape),
        "shards": [
            {"rank": s.rank, "offsets": list(s.box.offsets), "sizes": list(s.box.sizes)}
            for s in layout.shards
        ],
    }


def layout_to_json(layout: Layout) -> str:
    """Compact JSON text; the same layout (same shard order) always gives the same text."""
    require_layout(layout, "layout_to_json")
    return json.dumps(layout_to_dict(layout), separators=(",", ":"))


def layout_from_json(text: str | bytes) -> Layout:
    """Parse the JSON form written by :func:`layout_to_json`, strictly."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise LayoutError(f"layout JSON must be str or bytes, got {type(text).__name__}")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except _DuplicateKey as e:
        raise LayoutError(f"layout JSON: duplicate key {shorten(e.args[0])} in an object") from None
    except ValueError as e:  # json.JSONDecodeError, and NaN/Infinity from _no_constant
        raise LayoutError(f"layout JSON is not valid JSON: {e}") from None
    except RecursionError:  # "[" * 10**5: no layout nests deeper than three levels
        raise LayoutError("layout JSON nests too deeply to be a layout") from None
    return layout_from_dict(data)


def layout_from_dict(data: Any) -> Layout:
    """Build a layout from the dict form, strictly (see the module docstring)."""
    _check_keys(data, _TOP_KEYS, "$")
    if data["format"] != FORMAT:
        raise LayoutError(
            f"layout JSON: $.format must be {FORMAT!r}, got {shorten(data['format'])}"
        )
    version = data["version"]
    if type(version) is not int or version != VERSION:
        raise LayoutError(
            f"layout JSON: $.version must be {VERSION} (this reader knows version {VERSION} "
            f"only), got {shorten(version)}"
        )
    shape = _ints(data["shape"], "$.shape")
    shards_in = data["shards"]
    if type(shards_in) is not list:
        raise LayoutError(f"layout JSON: $.shards must be a list, got {_kind(shards_in)}")
    for i, s in enumerate(shards_in):
        if type(s) is not dict or s.keys() != _SHARD_KEYSET:
            _check_keys(s, _SHARD_KEYS, f"$.shards[{i}]")
    ranks = [s["rank"] for s in shards_in]
    offsets = [s["offsets"] for s in shards_in]
    sizes = [s["sizes"] for s in shards_in]
    # Whole-column checks run in C; only when one fails does the per-shard loop run, to name
    # the bad field. This keeps 1e5 shards at a small multiple of json.loads itself.
    ok = (
        set(map(type, offsets)) <= _LIST_ONLY
        and set(map(type, sizes)) <= _LIST_ONLY
        and list(map(len, offsets)) == list(map(len, sizes))
    )
    if ok:
        flat = [*ranks, *chain.from_iterable(offsets), *chain.from_iterable(sizes)]
        ok = not flat or (set(map(type, flat)) == _INT_ONLY and min(flat) >= 0)
    if not ok:
        _name_bad_shard_field(shards_in)
    shards = list(
        map(
            _trusted_shard,
            map(Box._trusted, map(tuple, offsets), map(tuple, sizes)),
            ranks,
        )
    )
    return Layout(shape, shards)


to_dict = layout_to_dict
from_dict = layout_from_dict


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _kind(v: Any) -> str:
    if isinstance(v, (list, dict)):
        return type(v).__name__
    return f"{type(v).__name__} {shorten(v)}"


def _check_keys(obj: Any, keys: tuple[str, ...], path: str) -> None:
    if type(obj) is not dict:
        raise LayoutError(f"layout JSON: {path} must be an object, got {_kind(obj)}")
    missing = [k for k in keys if k not in obj]
    extra = sorted(str(k) for k in obj if k not in keys)
    if missing:
        # A misspelt key ("ofsets") is both missing and unknown: name the one the user wrote.
        also = f" and has unknown key {shorten(extra[0])}" if extra else ""
        raise LayoutError(
            f"layout JSON: {path} is missing key {missing[0]!r}{also} (allowed: {', '.join(keys)})"
        )
    if extra:
        raise LayoutError(
            f"layout JSON: {path} has unknown key {shorten(extra[0])} (allowed: {', '.join(keys)})"
        )


def _name_bad_shard_field(shards_in: list[dict[str, Any]]) -> None:
    for i, s in enumerate(shards_in):
        rank = s["rank"]
        if type(rank) is not int or rank < 0:
            _bad_int(rank, f"$.shards[{i}].rank")
        offsets = _ints(s["offsets"], f"$.shards[{i}].offsets")
        sizes = _ints(s["sizes"], f"$.shards[{i}].sizes")
        if len(offsets) != len(sizes):
            raise LayoutError(
                f"layout JSON: $.shards[{i}] (rank {rank}) has {len(offsets)} offsets but "
                f"{len(sizes)} sizes",
                shards=(i,),
            )
    raise AssertionError("unreachable: a column check failed but no field is bad")


def _trusted_shard(box: Box, rank: int) -> Shard:
    # Reading 1e5 shards is dominated by per-object checks already done by the reader.
    sh = object.__new__(Shard)
    object.__setattr__(sh, "box", box)
    object.__setattr__(sh, "rank", rank)
    return sh


def _ints(value: Any, path: str) -> tuple[int, ...]:
    if type(value) is not list:
        raise LayoutError(f"layout JSON: {path} must be a list of integers, got {_kind(value)}")
    out = tuple(value)
    # `type(v) is int` refuses bool (a subclass of int) and float in one test; the set of
    # types and the minimum are computed in C, and the slow loop only runs to name the culprit.
    if out and (set(map(type, out)) != _INT_ONLY or min(out) < 0):
        for j, v in enumerate(out):
            if type(v) is not int or v < 0:
                _bad_int(v, f"{path}[{j}]")
    return out


def _bad_int(v: Any, path: str) -> NoReturn:
    if type(v) is int:
        raise LayoutError(f"layout JSON: {path} must be a non-negative integer, got {shorten(v)}")
    raise LayoutError(f"layout JSON: {path} must be a non-negative integer, got {_kind(v)}")
