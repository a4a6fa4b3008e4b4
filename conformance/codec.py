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
    """The torch placement objects of a JSON placement list (imports torch)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out: list[Any] = []
    for p in obj:
        if p == ["R"]:
            out.append(Replicate())
        elif isinstance(p, list) and len(p) == 2 and p[0] == "S" and isinstance(p[1], int):
            out.append(Shard(p[1]))
        elif isinstance(p, list) and len(p) == 3 and p[0] == "SS":
            out.append(_StridedShard(p[1], split_factor=p[2]))
        else:
            raise ValueError(f"bad placement {p!r}: expected ['S', d], ['R'] or ['SS', d, f]")
    return out


def placements_to_json(placements: Any) -> list[Any]:
    """The JSON form of torch placement objects (dims kept as written, negative included)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out: list[Any] = []
    for p in placements:
        if isinstance(p, _StridedShard):
            out.append(["SS", int(p.dim), int(p.split_factor)])
        elif isinstance(p, Shard):
            out.append(["S", int(p.dim)])
        elif isinstance(p, Replicate):
            out.append(["R"])
        else:
            raise ValueError(f"placement {p!r} has no JSON form here")
    return out
