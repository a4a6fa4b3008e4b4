"""Cases for what the ranks of a reshard must agree on before any data moves
(spec/06-reshard.md): layouts that differ on one rank only in which rank holds one box
(RESHARD-5), and replicated source boxes whose copies differ in one element or one byte
(RESHARD-13).

Both are facts no single rank can see: each rank's own arguments are valid, and only the
collective checks find the difference. So the difference is drawn where a check that
looks at part of its input would miss it: any box of any entry of a state dict (the last
one included), on any rank's copy; and for replicas a box with two to four owners (the
whole tensor everywhere, HSDP-like groups, a few boxes copied), the copy of any owner
changed in its first, middle, last or any element, in one byte (the high byte of a
multi-byte element included), in every bit, in a NaN's payload, or 0.0 made -0.0.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.strategies import dtypes, shapes, tensors, valid_layouts
from conformance.strategies.streams import layouts_on
from shardspec.metadata import Layout, Shard, chunk_layout

__all__ = ["REPLICA_CHANGES", "disagreement_cases", "replica_cases", "replicated_layouts"]


@st.composite
def _entries(
    draw: st.DrawFn, world: int, n: int, src: Any = None, replicated: int | None = None
) -> list[dict[str, Any]]:
    """``n`` tensors (``key``, ``src``, ``dst``, global ``tensor``) of drawn shapes and
    dtypes on ``world`` ranks; ``src`` drawn by ``src`` (default: any layout), except that
    entries other than ``replicated`` may take any layout too."""
    entries = []
    for i in range(n):
        shape = draw(shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
        dt = draw(dtypes())
        mine = src if src is not None and (i == replicated or draw(st.booleans())) else None
        entries.append(
            {
                "key": f"t{i}",
                "src": draw(mine(shape, world) if mine is not None else layouts_on(shape, world)),
                "dst": draw(layouts_on(shape, world)),
                "tensor": draw(tensors(shape, st.just(dt))),
            }
        )
    return entries


@st.composite
def disagreement_cases(draw: st.DrawFn) -> dict[str, Any]:
    """``{"world", "api", "entries", "copies", "out", "odd"}``: one tensor (``api``
    ``reshard``) or two or three (``state_dict``) on a pool of 2 to 4 ranks. Unless the case
    is the control (``copies`` empty, ``odd`` None), rank ``odd["rank"]`` passes its own copy
    of one entry's ``src`` or ``dst`` (``copies[rank][key][side]``) in which one non-empty
    box is held by another rank. ``out``: whether the ranks give out= tensors."""
    world = draw(st.integers(2, 4))
    api = draw(st.sampled_from(["reshard", "state_dict"]))
    entries = draw(_entries(world, 1 if api == "reshard" else draw(st.integers(2, 3))))
    out = draw(st.booleans())
    control = {
        "world": world,
        "api": api,
        "entries": entries,
        "copies": {},
        "out": out,
        "odd": None,
    }
    if draw(st.integers(0, 3)) == 0:
        return control
    moves = [
        (i, side, j, q)
        for i, e in enumerate(entries)
        for side in ("src", "dst")
        for j, s in enumerate(e[side].shards)
        if s.box.numel
        for q in range(world)
        if q != s.rank and Shard(s.box, q) not in e[side].shards
    ]
    if not moves:  # every rank holds every box: no owner can change
        return control
    i, side, j, q = draw(st.sampled_from(moves))
    who = draw(st.integers(0, world - 1))
    layout = entries[i][side]
    shards = list(layout.shards)
    shards[j] = Shard(shards[j].box, q)
    key = entries[i]["key"]
    return {
        **control,
        "copies": {who: {key: {side: Layout(layout.shape, shards)}}},
        "odd": {
            "rank": who,
            "key": key,
            "side": side,
            "box": layout.shards[j].box,
            "from": layout.shards[j].rank,
            "to": q,
        },
    }


@st.composite
def replicated_layouts(draw: st.DrawFn, shape: tuple[int, ...], world: int) -> Layout:
    """A source layout with at least one non-empty box on two or more ranks: the whole
    tensor on every rank or on a drawn few (``everywhere``), chunks replicated across
    HSDP-like groups (``hsdp``: chunk ``i`` on ranks ``i, i + s, i + 2s, ...``), or any
    valid layout with a few boxes copied to other ranks (``partial``)."""
    kind = draw(st.sampled_from(["everywhere", "hsdp", "partial"]))
    if kind == "everywhere":
        ranks = draw(st.permutations(range(world)))[: draw(st.integers(2, world))]
        return Layout.replicated(shape, sorted(ranks))
    if kind == "hsdp":
        groups = draw(st.sampled_from([g for g in range(2, world + 1) if world % g == 0]))
        size = world // groups
        base = chunk_layout(shape, draw(st.integers(0, len(shape) - 1)), range(size))
        return Layout(
            shape, [Shard(s.box, s.rank + g * size) for g in range(groups) for s in base.shards]
        )
    layout = draw(valid_layouts(st.just(shape), replicas=False, world=world))
    shards = list(layout.shards)
    full = [s for s in shards if s.box.numel]
    for s in draw(st.lists(st.sampled_from(full), min_size=1, max_size=3)):
        others = [r for r in range(world) if Shard(s.box, r) not in shards]
        if others:
            shards.append(Shard(s.box, draw(st.sampled_from(others))))
    return Layout(shape, shards)


# How one copy of a replicated box differs: one byte xor a drawn mask, the element's most
# significant byte, every bit, a NaN's payload (every copy NaN, one of another payload), 0.0
# against -0.0; "none" is the control (every copy the same).
REPLICA_CHANGES = ("none", "byte", "high_byte", "all_bits", "nan_payload", "negative_zero")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def replicas_of(layout: Layout) -> dict[Any, list[int]]:
    """Each non-empty box ``layout`` holds on two or more ranks, with its owners."""
    owners: dict[Any, list[int]] = {}
    for s in layout.shards:
        if s.box.numel:
            owners.setdefault(s.box, []).append(s.rank)
    return {b: r for b, r in owners.items() if len(r) > 1}


@st.composite
def replica_cases(draw: st.DrawFn) -> dict[str, Any]:
    """``{"world", "api", "entries", "inputs", "bad", "out", "noncontig"}``: one tensor or
    several on 2 to 4 ranks, one of them with replicated source boxes (the others maybe,
    maybe not); ``inputs[r]`` are rank r's source shards of every entry in order, the global
    tensor's slices except that, unless the change is ``none``, the copy of one replicated
    box on one owner differs (``bad``: the entry's index, the box, the owner whose copy
    differs, the other owners, the change)."""
    world = draw(st.integers(2, 4))
    api = draw(st.sampled_from(["reshard", "state_dict"]))
    n = 1 if api == "reshard" else draw(st.integers(2, 3))
    i = draw(st.integers(0, n - 1))  # the entry whose replica may change
    entries = draw(_entries(world, n, replicated_layouts, replicated=i))
    kind = draw(st.sampled_from(REPLICA_CHANGES))
    boxes = replicas_of(entries[i]["src"])
    box = draw(st.sampled_from(sorted(boxes, key=lambda b: (b.offsets, b.sizes))))
    owner = draw(st.sampled_from(boxes[box]))
    where = draw(st.sampled_from(["first", "last", "middle", "any"]))
    numel = box.numel
    index = {"first": 0, "last": numel - 1, "middle": numel // 2}.get(where)
    if index is None:
        index = draw(st.integers(0, numel - 1))
    byte = draw(st.integers(0, 15))
    mask = draw(st.integers(1, 255))
    return {
        "world": world,
        "api": api,
        "entries": entries,
        "out": draw(st.booleans()),
        "noncontig": draw(st.booleans()),
        **replica_change(entries, kind, i, box, owner, index, byte, mask, world),
    }


def replica_change(
    entries: list[dict[str, Any]],
    kind: str,
    i: int,
    box: Any,
    owner: int,
    index: int,
    byte: int = 0,
    mask: int = 1,
    world: int = 1,
) -> dict[str, Any]:
    """``inputs`` (per rank its source shards) and ``bad`` for a change ``kind`` of the copy
    of ``box`` of entry ``i`` on rank ``owner`` at the box's flat element ``index``. A NaN
    or -0.0 change needs a float entry: of another dtype, its high byte changes instead.
    The entry's global tensor is updated where every copy changes (the NaN of a payload
    change, the 0.0 of a sign change), so the reference is the tensor the others hold."""
    e = entries[i]
    t = torch.empty(e["tensor"].shape, dtype=e["tensor"].dtype).copy_(e["tensor"])
    if kind in ("nan_payload", "negative_zero") and t.dtype not in _FLOATS:
        kind = "high_byte"
    if kind in ("nan_payload", "negative_zero"):
        region = t[box.slices()]
        # a copy of its own: a contiguous region's reshape is a view of it, and copy_ then
        # refuses to read and write the same memory
        flat = region.reshape(-1).clone()
        flat[index] = float("nan") if kind == "nan_payload" else 0.0
        region.copy_(flat.reshape(region.shape))
    entries = [*entries[:i], {**e, "tensor": t}, *entries[i + 1 :]]
    inputs: list[list[torch.Tensor]] = []
    for r in range(world):
        mine = []
        for j, ent in enumerate(entries):
            for b in ent["src"].boxes_of(r):
                region = ent["tensor"][b.slices()]
                piece = torch.empty(region.shape, dtype=region.dtype).copy_(region)
                if j == i and r == owner and b == box and kind != "none":
                    _change(piece, kind, index, byte, mask)
                mine.append(piece)
        inputs.append(mine)
    others = sorted(r for r in replicas_of(e["src"])[box] if r != owner)
    bad = None
    if kind != "none":
        bad = {
            "entry": i,
            "box": box,
            "owner": owner,
            "others": others,
            "kind": kind,
            "index": index,
        }
    return {"entries": entries, "inputs": inputs, "bad": bad}


def _change(piece: torch.Tensor, kind: str, index: int, byte: int, mask: int) -> None:
    flat = piece.reshape(-1)
    if piece.dtype == torch.bool:
        flat[index] = ~flat[index]
        return
    if kind == "negative_zero":
        flat[index] = -0.0
        return
    item = piece.element_size()
    raw = flat.view(torch.uint8)
    if kind == "all_bits":
        raw[index * item : (index + 1) * item] ^= 0xFF
    elif kind == "nan_payload":
        raw[index * item] ^= 1  # the lowest mantissa bit: still a NaN
    else:  # little-endian: the last byte of an element is its most significant
        raw[index * item + (item - 1 if kind == "high_byte" else byte % item)] ^= mask
