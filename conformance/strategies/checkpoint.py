"""Cases for the checkpoint command's tools (spec/09-checkpoint.md): offline rewriting
(``shardspec reshard``, CKPT-17) and ``shardspec diff --values`` (CKPT-10).

Both must hold whatever the two chunk layouts, and their bugs hide where one chunk of a side
meets several of the other: the layouts drawn here mostly cross (rows against columns or
blocks, one dim cut at shifted boundaries, grids against guillotine cuts), with uneven and
empty chunks and ranks holding several chunks or none. A changed element of a ``diff`` is
put where off-by-one bugs live: the first or last element of the tensor or of a chunk of
either side, or anywhere; its change is a drawn byte (the high byte of a multi-byte element
included), a NaN payload or -0.0 (which are no change of value: CKPT-10 compares values, NaN
equal to NaN), or a change within a drawn tolerance.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.strategies import (
    dtypes,
    factorizations,
    shapes,
    tensors,
    valid_layouts,
    world_sizes,
)
from shardspec.checkpoint.chunks import storable
from shardspec.metadata import Box, Layout, Shard
from shardspec.metadata.strategies import partitions

__all__ = [
    "CHANGE_KINDS",
    "POSITIONS",
    "crossing_pair",
    "cut_layout",
    "diff_cases",
    "offline_cases",
    "savable",
]


def savable(layout: Layout) -> Layout:
    """What one ShardedTensor holds and one checkpoint stores of ``layout``: each box once
    (two identical empty boxes too: torch calls them an overlap), and no empty box at the
    offset of a non-empty one (CKPT-1's offset rule)."""
    seen: set[Box] = set()
    keep = []
    for s in layout.shards:
        if s.box not in seen:
            seen.add(s.box)
            keep.append(s)
    return storable(Layout(layout.shape, keep))


def _on_ranks(layout: Layout, world: int) -> Layout:
    return Layout(layout.shape, [Shard(s.box, s.rank % world) for s in layout.shards])


@st.composite
def cut_layout(
    draw: st.DrawFn, shape: tuple[int, ...], world: int, dims: tuple[int, ...]
) -> Layout:
    """The grid of ``shape`` cut along ``dims`` at drawn boundaries (repeated cuts and cuts
    at the ends make empty cells), each cell on a drawn rank below ``world``."""
    per_dim = [
        draw(partitions(n, max_parts=4)) if d in dims else [(0, n)] for d, n in enumerate(shape)
    ]
    cells = [Box((), ())]
    for intervals in per_dim:
        cells = [Box((*c.offsets, a), (*c.sizes, b - a)) for c in cells for (a, b) in intervals]
    return Layout(shape, [Shard(c, draw(st.integers(0, world - 1))) for c in cells])


@st.composite
def crossing_pair(
    draw: st.DrawFn, shape: tuple[int, ...], world_a: int, world_b: int
) -> tuple[Layout, Layout]:
    """Two savable layouts of ``shape`` (on ``world_a`` and ``world_b`` ranks) that mostly
    cross: ``rows_cols`` cuts different dims, ``shifted`` the same dims at other boundaries,
    ``blocks`` several dims against one, ``any`` two valid layouts of any kind."""
    kind = draw(st.sampled_from(["rows_cols", "shifted", "blocks", "any"]))
    nd = len(shape)
    if nd == 0 or kind == "any":
        a, b = (
            _on_ranks(draw(valid_layouts(st.just(shape), replicas=False)), w)
            for w in (world_a, world_b)
        )
    elif kind == "rows_cols" and nd >= 2:
        d1, d2 = draw(st.permutations(range(nd)))[:2]
        a = draw(cut_layout(shape, world_a, (d1,)))
        b = draw(cut_layout(shape, world_b, (d2,)))
    elif kind == "blocks" and nd >= 2:
        d = draw(st.integers(0, nd - 1))
        a = draw(cut_layout(shape, world_a, (d,)))
        b = draw(cut_layout(shape, world_b, tuple(range(nd))))
    else:  # shifted (and what needs two dims on a 1-D tensor)
        ds = tuple(sorted(draw(st.sets(st.integers(0, nd - 1), min_size=1, max_size=nd))))
        a = draw(cut_layout(shape, world_a, ds))
        b = draw(cut_layout(shape, world_b, ds))
    if draw(st.booleans()):
        a, b = b, a  # either side may be the one with more chunks
        a, b = _on_ranks(a, world_a), _on_ranks(b, world_b)
    return savable(a), savable(b)


def _dtensor_targets(draw: st.DrawFn, ndim: int, world: int) -> dict[str, Any]:
    """A DTensor on a mesh of ``world`` ranks (up to 2-D) whose placements shard each tensor
    dim at most once (Shard and Replicate: replicated boxes in the target layout)."""
    mesh = draw(factorizations(world, max_dims=2))
    placements: list[Any] = []
    free = list(range(ndim))
    for _ in mesh:
        if free and draw(st.booleans()):
            placements.append(["S", free.pop(draw(st.integers(0, len(free) - 1)))])
        else:
            placements.append(["R"])
    return {"kind": "dtensor", "mesh": list(mesh), "placements": placements}


@st.composite
def offline_cases(draw: st.DrawFn) -> dict[str, Any]:
    """``{"save_world", "load_world", "saved", "target", "how", "tensor"}``: a checkpoint of
    ``saved`` (a layout of the save world) to rewrite for a target job on the load world,
    whose target is a ShardedTensor (``{"kind": "sharded", "layout": Layout}``) or a DTensor
    (``{"kind": "dtensor", "mesh", "placements"}``); ``how`` is ``layouts`` (the file
    ``layouts_of`` writes on the target job) or ``like`` (a checkpoint the target job saved;
    ShardedTensor targets only)."""
    save_world, load_world = draw(world_sizes()), draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    saved, dst = draw(crossing_pair(shape, save_world, load_world))
    target: dict[str, Any]
    if draw(st.integers(0, 3)) == 0:
        target = _dtensor_targets(draw, len(shape), load_world)
        how = "layouts"
    else:
        target = {"kind": "sharded", "layout": dst}
        how = draw(st.sampled_from(["layouts", "like"]))
    t = draw(tensors(shape, dtypes()))
    return {
        "save_world": save_world,
        "load_world": load_world,
        "saved": saved,
        "target": target,
        "how": how,
        "tensor": t,
    }


# Where a changed element sits: the tensor's first, middle or last element, anywhere, or the
# first or last element of a drawn chunk of either side (where one chunk meets the next).
POSITIONS = ("first", "last", "middle", "any", "chunk_first", "chunk_last")
# How it changes: one byte xor a drawn mask ("byte"; "high_byte" the element's most
# significant byte), every bit ("all_bits"), two NaNs of different payloads ("nan_payload"),
# 0.0 against -0.0 ("negative_zero"), or a change with a tolerance drawn at, below or above
# it ("tolerance"); "none" changes nothing.
CHANGE_KINDS = (
    "none",
    "byte",
    "high_byte",
    "all_bits",
    "nan_payload",
    "negative_zero",
    "tolerance",
)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _position(draw: st.DrawFn, shape: tuple[int, ...], layouts: tuple[Layout, Layout]) -> int:
    n = math.prod(shape)
    where = draw(st.sampled_from(POSITIONS))
    if where == "first":
        return 0
    if where == "last":
        return n - 1
    if where == "middle":
        return n // 2
    chunks = [s.box for lay in layouts for s in lay.shards if not s.box.is_empty]
    if where == "any" or not chunks:
        return draw(st.integers(0, n - 1))
    box = draw(st.sampled_from(chunks))
    corner = box.offsets if where == "chunk_first" else tuple(o + z - 1 for o, z in box)
    flat = 0
    for i, side in zip(corner, shape):
        flat = flat * side + i
    return flat


@st.composite
def diff_cases(draw: st.DrawFn) -> dict[str, Any]:
    """``{"world_a", "world_b", "a", "b", "tensor_a", "tensor_b", "options", "change"}``:
    two checkpoints of one tensor under two (mostly crossing) layouts, the second with at
    most one element changed (``change``: kind, flat index, byte), and the options of
    ``diff --values`` (a drawn ``--atol``/``--rtol`` for a tolerance)."""
    world_a, world_b = draw(world_sizes()), draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    a, b = draw(crossing_pair(shape, world_a, world_b))
    kind = draw(st.sampled_from(CHANGE_KINDS))
    dtype = draw(
        st.sampled_from(_FLOATS)
        if kind in ("nan_payload", "negative_zero", "tolerance")
        else dtypes()
    )
    ta = draw(tensors(shape, st.just(dtype))).contiguous()
    index = _position(draw, shape, (a, b))
    byte = draw(st.integers(0, ta.element_size() - 1))
    mask = draw(st.integers(1, 255))
    tol = (draw(st.sampled_from(["--atol", "--rtol"])), draw(st.sampled_from([0.5, 1.0, 2.0])))
    return {
        "world_a": world_a,
        "world_b": world_b,
        "a": a,
        "b": b,
        **changed(ta, kind, index, byte, mask, tol),
    }


def changed(
    ta: torch.Tensor,
    kind: str,
    index: int,
    byte: int = 0,
    mask: int = 1,
    tol: tuple[str, float] = ("--atol", 1.0),
) -> dict[str, Any]:
    """``tensor_a`` (``ta``, maybe set at ``index`` first), ``tensor_b`` (a copy with the
    element at flat ``index`` changed as ``kind`` says), ``options`` and ``change``. A
    tolerance change is 1.5 against 2.0 (exact in every float dtype) with ``tol`` = (option,
    scale): ``--atol 0.5*scale`` or ``--rtol 0.25*scale``, so scale 1 sits on the bound."""
    ta = _fresh(ta)
    item = ta.element_size()
    options: list[str] = []
    fa = ta.reshape(-1)
    if kind == "nan_payload":  # two quiet NaNs of different payloads: the same value
        fa[index] = float("nan")
    elif kind == "negative_zero":
        fa[index] = 0.0
    elif kind == "tolerance":
        fa[index] = 1.5
    tb = _fresh(ta)
    fb = tb.reshape(-1)
    raw = fb.view(torch.uint8) if ta.dtype != torch.bool else None
    if kind in ("byte", "high_byte", "all_bits") and ta.dtype == torch.bool:
        fb[index] = ~fb[index]
    elif kind in ("byte", "high_byte"):
        assert raw is not None
        at = index * item + (item - 1 if kind == "high_byte" else byte)  # little-endian
        raw[at] ^= mask
    elif kind == "all_bits":
        assert raw is not None
        raw[index * item : (index + 1) * item] ^= 0xFF
    elif kind == "nan_payload":
        assert raw is not None
        raw[index * item] ^= 1  # the lowest mantissa bit: still a NaN
    elif kind == "negative_zero":
        fb[index] = -0.0
    elif kind == "tolerance":
        fb[index] = 2.0
        option, scale = tol
        options = [option, repr((0.5 if option == "--atol" else 0.25) * scale)]
    return {
        "tensor_a": ta,
        "tensor_b": tb,
        "options": options,
        "change": {"kind": kind, "index": index},
    }


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy with row-major strides: a one-element view keeps its stride through
    ``.contiguous()`` and ``.clone()``, which a dtype view refuses."""
    return torch.empty(t.shape, dtype=t.dtype).copy_(t)
