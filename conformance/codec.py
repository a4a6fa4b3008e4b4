"""JSON forms of layouts and DTensor placements for the pool's headers.

Layouts use ``shardspec.metadata.serialize`` (the project's versioned JSON form) when it is
installed, and otherwise this module's minimal form ``{"shape": [...], "shards": [[offsets,
sizes, rank], ...]}``; both reject malformed input with ``ValueError``.
"""

from __future__ import annotations

from typing import Any

from shardspec.metadata import Box, Layout, Shard

__all__ = [
    "layout_from_json",
    "layout_to_json",
    "placement_repr",
    "placements_from_json",
    "placements_to_json",
]


def _minimal_to_json(layout: Layout) -> dict[str, Any]:
    return {
        "shape": list(layout.shape),
        "shards": [[list(s.box.offsets), list(s.box.sizes), s.rank] for s in layout.shards],
    }


def _minimal_from_json(obj: Any) -> Layout:
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise ValueError(f"not a layout JSON object: {obj!r}")
    shards = []
    for i, item in enumerate(obj["shards"]):
        if not (isinstance(item, list) and len(item) == 3):
            raise ValueError(f"layout shard #{i} must be [offsets, sizes, rank], got {item!r}")
        offs, sizes, rank = item
        shards.append(Shard(Box(offs, sizes), rank))
    return Layout(obj.get("shape"), shards)  # type: ignore[arg-type]


try:  # the project's versioned JSON form, once it exists
    from shardspec.metadata.serialize import layout_from_dict as _from, layout_to_dict as _to
except ImportError:  # pragma: no cover - depends on what has landed
    _to, _from = _minimal_to_json, _minimal_from_json


def layout_to_json(layout: Layout) -> Any:
    return _to(layout)


def layout_from_json(obj: Any) -> Layout:
    return _from(obj)  # type: ignore[no-any-return]


# Placements: ["S", dim] Shard, ["R"] Replicate, ["SS", dim, split_factor] _StridedShard.
def placement_repr(p: list[Any]) -> str:
    if p[0] == "S":
        return f"S({p[1]})"
    if p[0] == "SS":
        return f"SS({p[1]},sf={p[2]})"
    return "R"


def placements_from_json(obj: Any) -> list[Any]:
    """The torch placement objects of a JSON placement list (``shardspec.metadata.placements``'
    form, DTENSOR-11; dims kept as written, negative included; imports torch)."""
    from shardspec.metadata.placements import placement_from_json, to_torch

    return [to_torch(placement_from_json(p)) for p in obj]


def placements_to_json(placements: Any) -> list[Any]:
    """The JSON form of torch placement objects (dims kept as written, negative included)."""
    from shardspec.metadata.placements import from_torch, placement_to_json

    return [placement_to_json(from_torch(p)) for p in placements]
