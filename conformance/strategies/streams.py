"""Cases for resharding many tensors at once (spec/06-reshard.md): state dicts whose tensors
have different dtypes, so one rank pair's stream carries elements of several sizes (1, 2, 4,
8 bytes) back to back, unpacked into ``out=`` tensors that are views of larger buffers:
contiguous at a storage offset, strided, or transposed.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import strategies as st

from conformance.strategies import dtypes, shapes, tensors, valid_layouts, with_replicas
from conformance.strategies.scale import largest_first, scale_shapes
from shardspec.metadata import Box, Layout, Shard, chunk_layout

__all__ = [
    "OUT_KINDS",
    "RUN_LENGTHS",
    "flatten_cases",
    "layouts_on",
    "reshard_cases",
    "run_length_cases",
    "state_dict_cases",
    "subgroup_cases",
]

# How an out= tensor sits in its buffer: "contiguous" (a buffer of its own), "offset" (a
# contiguous view at a storage offset), "strided" (every other element, at a storage offset),
# "transposed" (dims reversed in memory, at a storage offset).
OUT_KINDS = ("contiguous", "offset", "strided", "transposed")


@st.composite
def layouts_on(draw: st.DrawFn, shape: tuple[int, ...], world: int) -> Layout:
    """Any valid layout whose ranks are ranks of a pool of ``world`` (replicas included);
    a third are chunkings over every rank in some order, the case torch's resharding takes."""
    if shape and draw(st.integers(0, 2)) == 0:
        dim = draw(st.integers(0, len(shape) - 1))
        return chunk_layout(shape, dim, draw(st.permutations(range(world))))
    layout = draw(valid_layouts(st.just(shape), max_ranks=world, replicas=False))
    if draw(st.booleans()):
        layout = draw(with_replicas(layout, max_extra_ranks=0))
    return layout


@st.composite
def reshard_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """``{"world", "src", "dst", "tensor", "noncontig", "max_buffer_bytes"}``: one tensor
    between two valid layouts of a pool of 1 to ``max_world`` ranks, or of a simulated world
    (largest first, the shape drawn with it: most ranks hold data, more ranks than rows, a
    dim longer than the world)."""
    from shardspec.testing.devices import simulated_worlds

    worlds = simulated_worlds()
    if worlds:
        world = draw(largest_first(worlds), label="world")
        shape = draw(scale_shapes(world), label="shape")
    else:
        world = draw(st.integers(1, max_world), label="world")
        shape = draw(shapes(max_dims=3, max_side=6), label="shape")
    return {
        "world": world,
        "src": draw(layouts_on(shape, world), label="src"),
        "dst": draw(layouts_on(shape, world), label="dst"),
        "tensor": draw(tensors(shape, dtypes()), label="tensor"),
        "noncontig": draw(st.booleans(), label="noncontig"),
        "max_buffer_bytes": draw(st.sampled_from([None, 16, 64, 4096]), label="budget"),
    }


@st.composite
def large_reshard_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """:func:`reshard_cases`' dict for a 2-D tensor of 1-12 MiB chunked (unevenly, in drawn
    rank orders) on either dim to either dim, on 2 to ``max_world`` pooled ranks: pieces of
    hundreds of KiB, at which the executor's rounds send a piece from the tensor that holds it
    and receive it into the output (shardspec.reshard.schedule.DIRECT_BYTES), cut by the
    windows of a drawn budget or whole. Values from a drawn seed (too many to draw one by one)."""
    import torch

    world = draw(st.integers(2, max_world), label="world")
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float64]))
    item = torch.empty((), dtype=dtype).element_size()
    cols = draw(st.integers(200, 1500), label="cols")
    # a piece is about a world-squared-th of the tensor: 1-3 times DIRECT_BYTES (256 KiB)
    nbytes = draw(st.integers(world * world << 18, 3 * world * world << 18), label="bytes")
    rows = max(world, nbytes // (cols * item))
    shape = (rows, cols)

    def chunked() -> Layout:
        dim = draw(st.sampled_from([0, 1]))
        ranks = draw(st.permutations(list(range(world))))
        return chunk_layout(shape, dim, ranks)

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31), label="seed"))
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
    else:
        t = torch.randint(-128, 128, shape, generator=g).to(dtype)
    return {
        "world": world,
        "src": chunked(),
        "dst": chunked(),
        "tensor": t,
        "noncontig": draw(st.booleans(), label="noncontig"),
        "max_buffer_bytes": draw(st.sampled_from([None, 1 << 20, 3 << 20]), label="budget"),
    }


@st.composite
def state_dict_cases(
    draw: st.DrawFn, max_world: int = 4, world: int | None = None
) -> dict[str, Any]:
    """``{"world", "entries": [{"key", "src", "dst", "tensor", "out", "pad"}], "budget"}``:
    2 to 4 tensors of distinct dtypes (bool, int8 and uint8 beside 8-byte types), each with
    its own layouts; ``out`` is None for every entry (the executor allocates) or an OUT_KINDS
    kind per entry, ``pad`` the storage offset of its view. ``world``: that many ranks, not
    drawn."""
    if world is None:
        world = draw(st.integers(1, max_world), label="world")
    kinds = draw(st.lists(dtypes(), min_size=2, max_size=4, unique=True), label="dtypes")
    with_out = draw(st.booleans(), label="out")
    entries = []
    for i, dt in enumerate(kinds):
        shape = draw(shapes(max_dims=3, max_side=5))
        entries.append(
            {
                "key": f"t{i}.{str(dt).removeprefix('torch.')}",
                "src": draw(layouts_on(shape, world)),
                "dst": draw(layouts_on(shape, world)),
                "tensor": draw(tensors(shape, st.just(dt))),
                "out": draw(st.sampled_from(OUT_KINDS)) if with_out else None,
                "pad": draw(st.integers(1, 3)),
            }
        )
    budget = draw(st.sampled_from([None, 16, 48, 4096]), label="budget")
    return {"world": world, "entries": entries, "budget": budget}


# Every run of 1 to RUN_LENGTHS elements travels between two ranks in every example: a fast
# path keyed on a length (a vector width, an alignment, a threshold) meets its own case each
# time, not only when a draw happens to cut that length.
RUN_LENGTHS = 40


@st.composite
def _cut_layout(draw: st.DrawFn, shape: tuple[int, ...], world: int) -> Layout:
    """A layout drawn in a few choices (a state dict of dozens of tensors stays cheap to
    draw): whole on one rank, chunked on a dim in a drawn rank order, or cut on a dim at
    drawn points, the parts on drawn ranks (several on one rank, in drawn order)."""
    kind = draw(st.integers(0, 2))
    if kind == 0:
        rank = draw(st.integers(0, world - 1))
        return Layout(shape, [Shard(Box((0,) * len(shape), shape), rank)])
    dim = draw(st.integers(0, len(shape) - 1))
    if kind == 1:
        return chunk_layout(shape, dim, draw(st.permutations(range(world))))
    n = shape[dim]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3)))) if n > 1 else []
    bounds = [0, *cuts, n]
    shards = []
    for a, b in pairwise(bounds):
        offsets = [0] * len(shape)
        sizes = list(shape)
        offsets[dim], sizes[dim] = a, b - a
        shards.append(Shard(Box(offsets, sizes), draw(st.integers(0, world - 1))))
    return Layout(shape, draw(st.permutations(shards)))


@st.composite
def run_length_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """:func:`state_dict_cases`' dict whose pieces have every run length: a 1-D tensor of each
    length from 1 to ``RUN_LENGTHS`` moved whole from one rank to another (so each length is
    packed, or sent, and received whole); 2-D tensors with rows of those lengths between two
    drawn layouts (cut by columns their pieces are strided runs); and, without a tight budget,
    tensors of ``DIRECT_BYTES`` less one element, exactly, and one element more, moved whole
    (the size from which a piece travels from the tensor that holds it instead of being
    packed: shardspec.reshard.schedule.DIRECT_BYTES). Dtypes, out= kinds and budgets (which
    cut the runs into windows) are drawn. On simulated worlds the smallest one: its threaded
    group moves rounds by all-to-all, the transport NCCL uses, where gloo pools send messages."""
    import torch

    from shardspec.reshard.schedule import DIRECT_BYTES
    from shardspec.testing.devices import simulated_worlds

    worlds = simulated_worlds()
    world = min(worlds) if worlds else draw(st.integers(2, max_world), label="world")
    budget = draw(st.sampled_from([None, 96, 1000, 1 << 20]), label="budget")
    with_out = draw(st.booleans(), label="out")
    entries: list[dict[str, Any]] = []

    def add(shape: tuple[int, ...], src: Layout, dst: Layout, dt: torch.dtype) -> None:
        entries.append(
            {
                "key": f"t{len(entries)}.{str(dt).removeprefix('torch.')}",
                "src": src,
                "dst": dst,
                "tensor": draw(tensors(shape, st.just(dt))),
                "out": draw(st.sampled_from(OUT_KINDS)) if with_out else None,
                "pad": draw(st.integers(1, 3)),
            }
        )

    def moved_whole(n: int, dt: torch.dtype) -> None:
        shape = (n,)
        whole = Box((0,), shape)
        a, b = draw(st.permutations(range(world)))[:2]
        add(shape, Layout(shape, [Shard(whole, a)]), Layout(shape, [Shard(whole, b)]), dt)

    for n in range(1, RUN_LENGTHS + 1):
        moved_whole(n, draw(dtypes()))
    for n in range(1, RUN_LENGTHS + 1, 3):
        shape = (draw(st.integers(1, 4)), n)
        add(shape, draw(_cut_layout(shape, world)), draw(_cut_layout(shape, world)), draw(dtypes()))
    if budget is None or budget >= 1 << 20:
        dt = draw(dtypes(), label="direct dtype")
        item = torch.empty((), dtype=dt).element_size()
        for extra in (-1, 0, 1):
            moved_whole(DIRECT_BYTES // item + extra, dt)
    return {"world": world, "entries": entries, "budget": budget}


@st.composite
def subgroup_cases(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """:func:`state_dict_cases`' dict on the group of ``members``: 1 to ``pool`` - 1 ranks
    of a pool of 2 to ``max_world`` (ascending, as new_group orders them; any of them, so
    group rank i is seldom pool rank i), the layouts over the group's ranks."""
    pool = draw(st.integers(2, max_world), label="pool")
    size = draw(st.integers(1, pool - 1), label="group size")
    members = sorted(draw(st.permutations(range(pool)))[:size])
    c = draw(state_dict_cases(world=size))
    return {**c, "pool": pool, "members": members}


@st.composite
def flatten_cases(draw: st.DrawFn) -> dict[str, Any]:
    """``{"mesh": (dp, tp), "tp_dim", "weight", "buf", "owners"}`` for FSDP-8: a weight
    TP-sharded on ``tp_dim`` then FSDP-chunked (more ranks than rows included), and a buffer
    chunked over ``owners``, a drawn subset of the ranks in a drawn order, so some ranks
    often hold nothing of it."""
    mesh = draw(st.sampled_from([(1, 2), (2, 1), (2, 2), (1, 3), (3, 1), (1, 4), (4, 1)]))
    world = mesh[0] * mesh[1]
    wshape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    owners = draw(st.permutations(range(world)))[: draw(st.integers(1, world))]
    dt = draw(dtypes())
    return {
        "mesh": mesh,
        "tp_dim": draw(st.integers(0, len(wshape) - 1)),
        "weight": draw(tensors(wshape, st.just(dt))),
        "buf": draw(tensors(draw(shapes(min_dims=1, max_dims=2, max_side=5)), st.just(dt))),
        "owners": list(owners),
    }
