"""The collective checkpoint load (spec/09-checkpoint.md, CKPT-23 to CKPT-27) against the
reference: a real ``dcp.save`` on one world of a drawn layout, then the implementation's
collective load on another world into a ShardedTensor, a DTensor (up to 3-D meshes, nested and
uneven shards, replicas) or a plain tensor on every rank, with each ``reads`` mode. Every rank
holds the reference slice of the saved tensor and the saved non-tensor values (a nested one
filled in place, a top-level one replaced, as ``dcp.load`` does); with
``reads="once"`` no byte of the checkpoint is read by two ranks and the job reads the tensor's
bytes exactly once, counted by the ranks themselves; with ``reads="own"`` each rank reads the
bytes of its own boxes. A damaged checkpoint fails on every rank with the same error, naming
the file, and no rank returns; one whose chunk list leaves a gap or overlaps (each chunk still
finding bytes of its size) is refused on every rank with the same error naming the tensor."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import tempfile
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import assume, example, given, settings, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout
from conformance.cases import case
from conformance.codec import layout_from_json, layout_to_json
from conformance.impls import Impl
from conformance.interface.base import tensor_copy
from shardspec.checkpoint.chunks import storable
from shardspec.checkpoint.storage import storage_kind
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.testing.devices import simulated_worlds

from .test_checkpoint import (
    ROWS_TO_COLUMNS_BF16,
    _describe_load,
    _one_per_box,
    checkpoint_worlds,
    round_trips,
)

READS = ("own", "once", "auto")
# what reads="auto" is told of the storage (None: it finds out; CKPT-25)
STORAGE = (None, "local", "shared")
# Each example saves and loads through real files on two pools (about 2.5 s on 2 cores): a
# few dozen drawn examples, or the profile's own number where it asks for fewer (the
# simulated worlds, the launched run).
EXAMPLES = settings(max_examples=min(25, settings.default.max_examples), deadline=None)


@st.composite
def collective_loads(draw: st.DrawFn) -> dict[str, Any]:
    """A round trip (test_checkpoint's), sometimes into a plain tensor on every rank, with a
    read mode and, one time in five, a damaged checkpoint."""
    c = draw(round_trips())
    if draw(st.integers(0, 4)) == 0:
        # a plain tensor on every rank, or a parameter of one: a subclass the load cannot
        # read into in place, so the rank that reads it copies what it broadcast
        c["load"] = {"kind": "plain", **({"parameter": True} if draw(st.booleans()) else {})}
    _maybe_on_sub_meshes(draw, c["load"])
    c["reads"] = draw(st.sampled_from(READS))
    c["storage"] = draw(st.sampled_from(STORAGE))
    c["damage"] = draw(st.sampled_from([None] * 12 + ["truncate", "remove", "metadata"]))
    # tensors of the saved one's geometry beside it: read and moved as one stack by
    # reads="once" (CKPT-24), whose runs hold one member or, among many, several
    c["copies"] = draw(st.sampled_from([0, 0, 0, 1, 3, 24]))
    # the load's options: its exchange's buffers bounded (the moves cut into rounds), and
    # its reading threads
    c["max_buffer_bytes"] = draw(st.sampled_from([None, None, None, 96, 1000, 1 << 20]))
    c["thread_count"] = draw(st.sampled_from([None, None, 1, 3]))
    return c


def _maybe_on_sub_meshes(draw: st.DrawFn, load: dict[str, Any]) -> None:
    """One time in three, a DTensor destination on a mesh of 2+ dims goes onto the sub-meshes
    of one dim (as FSDP2 + TP puts a module outside the TP plan on the DP mesh of each TP
    coordinate): each rank sees only its own mesh (CKPT-23). The other dims become Replicate,
    which is what the whole world holds."""
    if load["kind"] != "dtensor" or len(load["mesh"]) < 2 or draw(st.integers(0, 2)):
        return
    d = draw(st.integers(0, len(load["mesh"]) - 1))
    load["placements"] = [p if i == d else ["R"] for i, p in enumerate(load["placements"])]
    load["sub"] = d


def _describe(c: dict[str, Any]) -> str:
    load = c["load"]
    where = "a plain tensor on every rank" if load["kind"] == "plain" else _describe_load(load)
    spoiled = f", the checkpoint damaged ({c['damage']})" if c.get("damage") else ""
    copies = c.get("copies", 0)
    beside = f" and {copies} tensors of its geometry (tensor_copy j of it)" if copies else ""
    options = "".join(
        f", {k}={c[k]}" for k in ("max_buffer_bytes", "thread_count") if c.get(k) is not None
    )
    return (
        f"dcp.save on {c['save_world']} ranks of ShardedTensor {c['saved']!r}{beside}{spoiled}, "
        f"collective load (reads={c['reads']}, storage={c.get('storage')}{options}) on "
        f"{c['load_world']} ranks into {where}, "
        f"dtype={c['tensor'].dtype}"
    )


def _want(t: Any, load: dict[str, Any], rank: int) -> list[Any]:
    if load["kind"] == "plain":
        return [t]
    if load["kind"] == "sharded":
        return [t[b.slices()].contiguous() for b in layout_from_json(load["layout"]).boxes_of(rank)]
    mesh = tuple(load["mesh"])
    coord = reference.mesh_coordinates(mesh)[rank]
    return [
        reference.gather(t, reference.dtensor_indices(t.shape, mesh, load["placements"], coord))
    ]


def _storage(storage: str | None) -> str:
    """The storage kind a load of a checkpoint in the temporary directory is told, or finds:
    the environment variable, else the file system's type (CKPT-25)."""
    if storage is not None:
        return storage
    env = os.environ.get("SHARDSPEC_STORAGE", "").strip().lower()
    return env or storage_kind(tempfile.gettempdir())


# CKPT-25's numbers, as the rule states them: a chunk of at most WHOLE_READ bytes is read whole
# by "own" for any part of it, and each chunk so read counts CHUNK_COST; a byte moved counts
# MOVE_COST bytes read; "once" counts EXCHANGE_COST for its exchange.
WHOLE_READ, CHUNK_COST, MOVE_COST, EXCHANGE_COST = 256 << 10, 256 << 10, 6, 16 << 20


def _auto(t: Any, load: dict[str, Any], saved: Layout, world: int, storage: str,
          copies: int) -> str:  # fmt: skip
    """CKPT-25 for ``t`` and its ``copies`` (one geometry), from the elements each rank holds
    (``_want`` of an index tensor): "own" unless it reads a saved byte twice (an element two
    ranks hold, or a small chunk read whole for two ranks' parts: no read of these tensors
    reaches the 1 MiB of the strided rule); then on shared storage "once", on local storage
    the cheaper by the rule's costs, "own" on a tie."""
    if t.numel() == 0:
        return "own"
    item = t.element_size()
    assert t.numel() * item < 1 << 20, "the strided rule is not counted here"
    ids = torch.arange(t.numel()).reshape(t.shape)
    held = [[w.reshape(-1).tolist() for w in _want(ids, load, r)] for r in range(world)]
    per = [sum(map(len, h)) * item for h in held]  # bytes of each rank's boxes
    mine = [set(itertools.chain.from_iterable(h)) for h in held]
    holders = [sum(e in m for m in mine) for e in range(t.numel())]
    # every rank holds it whole: its reads are its boxes' bytes, chunk by chunk
    whole = all(len(h) == 1 and len(h[0]) == t.numel() for h in held)
    small = []  # per small saved chunk: its bytes, and the elements each rank holds of it
    for box in {s.box for s in saved.shards if not s.box.is_empty}:
        if box.numel * item <= WHOLE_READ and not whole:
            chunk = set(ids[box.slices()].reshape(-1).tolist())
            small.append((box.numel * item, [len(chunk & m) for m in mine]))
    twice = any(h > 1 for h in holders) or any(sum(map(bool, o)) > 1 for _, o in small)
    if not twice:
        return "own"
    if storage == "shared":
        return "once"
    k = copies + 1
    own = max(
        k * (per[r] + sum(n - o[r] * item + CHUNK_COST for n, o in small if o[r]))
        for r in range(world)
    )
    needed = sum(h > 0 for h in holders) * item
    got = max(k * (p * (world - 1) // world) for p in per)
    once = (-(-k * needed // world) + CHUNK_COST * -(-k * len(small) // world)
            + MOVE_COST * got + EXCHANGE_COST)  # fmt: skip
    return "once" if once < own else "own"


def _check_local(r: Any, t: Any, load: dict[str, Any], ex: str, copies: int = 0) -> None:
    """Rank ``r``'s local tensors are the reference's, bit for bit (of ``t``, then of each of
    its ``copies``)."""
    want = [
        (f"t{j}." if j else "", i, w)
        for j, x in enumerate(_every(t, copies))
        for i, w in enumerate(_want(x, load, r.rank))
    ]
    assert_equal(f"rank{r.rank}.local tensors", len(r.tensors), len(want), ex)
    for got, (key, i, w) in zip(r.tensors, want):
        assert_tensor_bitwise(f"rank{r.rank}.{key}loaded[{i}]", got, w, ex)


def _every(t: Any, copies: int) -> list[Any]:
    return [t] + [tensor_copy(t, j) for j in range(1, copies + 1)]


def _mine(t: Any, load: dict[str, Any], rank: int) -> int:
    """Bytes of the distinct boxes ``rank`` holds (what reads="own" reads for it)."""
    return sum(w.numel() for w in _want(t, load, rank)) * t.element_size()


# Rows saved on 3 ranks (an empty chunk past the end) loaded as a plain tensor on 2: every
# rank wants every byte, so reads="once" must split the reading and move the rest.
ROWS_TO_PLAIN_ONCE = {**ROWS_TO_COLUMNS_BF16, "load": {"kind": "plain"}, "reads": "once",
                      "damage": None}  # fmt: skip
# A chunk's file cut short under reads="once": the reading rank fails, and every rank raises.
TRUNCATED_ONCE = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "damage": "truncate"}
# rows -> columns through reads="own" and reads="auto"
ROWS_TO_COLUMNS_OWN = {**ROWS_TO_COLUMNS_BF16, "reads": "own", "damage": None}
# Rows saved on 3, loaded on 4 into DTensors on the two meshes of dim 0 of a 2x2 mesh (ranks
# 0, 2 and 1, 3: FSDP2 + TP's modules outside the TP plan): each rank sees its own mesh only.
ON_SUB_MESHES_AUTO = {
    **ROWS_TO_COLUMNS_BF16,
    "load_world": 4,
    "load": {"kind": "dtensor", "mesh": [2, 2], "placements": [["S", 1], ["R"]], "sub": 0},
    "reads": "auto",
    "damage": None,
}
REPLICATED_AUTO = {
    "save_world": 2,
    "load_world": 4,
    "saved": Layout((5, 3), [Shard(Box((0, 0), (3, 3)), 1), Shard(Box((3, 0), (2, 3)), 0)]),
    "load": {"kind": "dtensor", "mesh": [2, 2], "placements": [["R"], ["S", 0]]},
    "tensor": ROWS_TO_COLUMNS_BF16["tensor"][:, :3].contiguous(),
    "reads": "auto",
    "damage": None,
}
# The same on shared storage, where "auto" reads the replicated rows once (CKPT-25); and on
# sub-meshes told the storage is local, where it reads its own
REPLICATED_AUTO_SHARED = {**REPLICATED_AUTO, "storage": "shared"}
ON_SUB_MESHES_AUTO_LOCAL = {**ON_SUB_MESHES_AUTO, "storage": "local"}

# 80 row chunks saved on 2 ranks, loaded into a ShardedTensor of 79 shards shifted by a row on
# 3 (the first holds two rows): past 64 boxes the saved chunks and the destination's
# ShardedTensorMetadata are checked with NumPy all at once (CKPT-1, CONVERT-1), and every rank
# reads pieces of two saved chunks.
MANY_CHUNKS = {
    "save_world": 2,
    "load_world": 3,
    "saved": Layout((80, 2), [Shard(Box((i, 0), (1, 2)), i % 2) for i in range(80)]),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(
            Layout(
                (80, 2),
                [Shard(Box((0, 0), (2, 2)), 0)]
                + [Shard(Box((i, 0), (1, 2)), i % 3) for i in range(2, 80)],
            )
        ),
    },
    "tensor": torch.arange(160, dtype=torch.int32).reshape(80, 2),
    "reads": "auto",
    "damage": None,
}

# From 4 ranks rank 0 sends the metadata as columns (CKPT-23). The 80 chunks above loaded on 4:
# checked from the columns' arrays, each rank's chunks found by position.
MANY_CHUNKS_ON_4 = {
    **MANY_CHUNKS,
    "load_world": 4,
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(
            Layout((80, 2), [Shard(Box((i, 0), (1, 2)), (i * 3) % 4) for i in range(80)])
        ),
    },
}
# 600 saved chunks, 150 boxes a rank on 4: past the (box, chunk) pairs one NumPy pass meets,
# each rank's boxes are found through an index of the saved chunks (a grid).
INDEXED_CHUNKS_ON_4 = {
    **MANY_CHUNKS,
    "load_world": 4,
    "saved": Layout((600, 2), [Shard(Box((i, 0), (1, 2)), i % 2) for i in range(600)]),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(
            Layout((600, 2), [Shard(Box((i, 0), (1, 2)), (i * 3) % 4) for i in range(600)])
        ),
    },
    "tensor": torch.arange(1200, dtype=torch.int32).reshape(600, 2),
}
# The same past an index, saved chunks that are no grid (odd rows cut in two columns): the
# index is a tree, asked box by box.
INDEXED_TREE_ON_4 = {
    **INDEXED_CHUNKS_ON_4,
    "saved": Layout(
        (600, 4),
        [
            Shard(Box((i, c), (1, w)), i % 2)
            for i in range(600)
            for c, w in (((0, 4),) if i % 2 == 0 else ((0, 2), (2, 2)))
        ],
    ),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(
            Layout((600, 4), [Shard(Box((i, 0), (1, 4)), (i * 3) % 4) for i in range(600)])
        ),
    },
    "tensor": torch.arange(2400, dtype=torch.int32).reshape(600, 4),
}
# Two saved chunks of 300 KiB each (past the 256 KiB a rank reads whole), loaded as columns on
# 4 ranks: each rank's reads go through the reader, which finds each chunk's storage entry in
# the column encoding by key and offsets.
BIG_CHUNKS_ON_4 = {
    "save_world": 2,
    "load_world": 4,
    "saved": Layout(
        (1200, 128), [Shard(Box((0, 0), (600, 128)), 0), Shard(Box((600, 0), (600, 128)), 1)]
    ),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(
            Layout((1200, 128), [Shard(Box((0, 32 * r), (1200, 32)), r) for r in range(4)])
        ),
    },
    "tensor": torch.arange(1200 * 128, dtype=torch.float32).reshape(1200, 128),
    "reads": "own",
    "damage": None,
}

# 25 tensors of one geometry (rows saved on 3, columns loaded on 2), read once: one stack
# (CKPT-24), its stacked chunks cut across the members into runs of several.
STACKED_ONCE = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "damage": None, "copies": 24}

# A tensor every rank holds whole, read once: its runs of at most 256 KiB are broadcast packed
# with its copies' (one broadcast a reader), into parameters, which the load cannot read into
# in place (so each reader copies back what it broadcast); runs of 300 KiB go one by one.
PARAMETERS_PLAIN_ONCE = {**ROWS_TO_PLAIN_ONCE, "load": {"kind": "plain", "parameter": True},
                         "copies": 3}  # fmt: skip
# The same on 4 ranks: a pack from each of 3 or 4 readers, more than are kept in flight, so a
# rank copies the first's runs out while the others travel.
PARAMETERS_PLAIN_ONCE_ON_4 = {**PARAMETERS_PLAIN_ONCE, "load_world": 4}
BIG_PLAIN_ONCE = {**BIG_CHUNKS_ON_4, "load_world": 2, "load": {"kind": "plain", "parameter": True},
                  "reads": "once"}  # fmt: skip

# 64 row chunks loaded as columns on 2 ranks, told the storage is local: "own" would read every
# chunk whole on both ranks; for 25 such tensors that costs more than "once"'s exchange
# (CKPT-25), for one it does not.
SHARED_SMALL_CHUNKS_LOCAL = {
    "save_world": 2,
    "load_world": 2,
    "saved": Layout((64, 4), [Shard(Box((i, 0), (1, 4)), i % 2) for i in range(64)]),
    "load": {"kind": "sharded", "layout": layout_to_json(chunk_layout((64, 4), 1, [0, 1]))},
    "tensor": torch.arange(256, dtype=torch.int32).reshape(64, 4),
    "reads": "auto",
    "storage": "local",
    "damage": None,
    "copies": 24,
}
ONE_SHARED_SMALL_CHUNKS_LOCAL = {**SHARED_SMALL_CHUNKS_LOCAL, "copies": 0}
# 4 tensors of 80 row chunks read once on 4 ranks: the metadata travels as columns (CKPT-23),
# where each member's storage entry of a stack is one row of them.
STACKED_ONCE_ON_4 = {**MANY_CHUNKS_ON_4, "reads": "once", "copies": 3}
# Tensors of 255 KiB saved whole, each chunk's archive past the 256 KiB a rank reads whole
# though its data is not: a stack whose runs the load cannot read at once, read member by member
# through the reader.
NEAR_THE_WHOLE_READ = (255 << 10) // 4
STACKED_PAST_WHOLE_READS_ON_4 = {
    "save_world": 2,
    "load_world": 4,
    "saved": Layout((NEAR_THE_WHOLE_READ,), [Shard(Box((0,), (NEAR_THE_WHOLE_READ,)), 1)]),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(chunk_layout((NEAR_THE_WHOLE_READ,), 0, [0, 1, 2, 3])),
    },
    "tensor": torch.arange(NEAR_THE_WHOLE_READ, dtype=torch.float32),
    "reads": "once",
    "damage": None,
    "copies": 1,
}


# torch's known defect wherever a damaged checkpoint is drawn (CKPT-26)
NAMES_NO_FILE = pytest.mark.known_defect(
    "torch",
    "dcp.load of a damaged checkpoint fails on every rank with an error that names no file "
    "(a truncated file: 'PytorchStreamReader failed reading zip archive'; repro "
    "dcp-load-damaged-file-names-nothing)",
    raises=AssertionError,
    match=r"^the error names the file \(.*\)=False",
)


def _examples(test: Any) -> Any:
    """The explicit examples, on pools of 2 to 4 ranks; on simulated worlds
    (conformance_scale), whose few drawn examples may damage nothing, the truncated file on
    the smallest world (a known defect must show in every run that names it)."""
    if simulated_worlds():
        w = min(simulated_worlds())
        return example({**TRUNCATED_ONCE, "save_world": w, "load_world": w})(test)
    for ex in (
        ON_SUB_MESHES_AUTO,
        REPLICATED_AUTO,
        REPLICATED_AUTO_SHARED,
        ON_SUB_MESHES_AUTO_LOCAL,
        ROWS_TO_COLUMNS_OWN,
        TRUNCATED_ONCE,
        ROWS_TO_PLAIN_ONCE,
        PARAMETERS_PLAIN_ONCE,
        PARAMETERS_PLAIN_ONCE_ON_4,
        BIG_PLAIN_ONCE,
        STACKED_ONCE,
        SHARED_SMALL_CHUNKS_LOCAL,
        ONE_SHARED_SMALL_CHUNKS_LOCAL,
        STACKED_ONCE_ON_4,
        STACKED_PAST_WHOLE_READS_ON_4,
        MANY_CHUNKS,
        MANY_CHUNKS_ON_4,
        INDEXED_CHUNKS_ON_4,
        INDEXED_TREE_ON_4,
        BIG_CHUNKS_ON_4,
    ):
        test = example(ex)(test)
    return test


@pytest.mark.rule("CKPT-23", "CKPT-24", "CKPT-25", "CKPT-26", "CKPT-27")
@NAMES_NO_FILE
@pytest.mark.pool
@EXAMPLES
@given(collective_loads())
@_examples
def test_a_collective_load_gives_every_rank_the_reference_or_fails_on_all(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    t, load = c["tensor"], c["load"]
    # an adapter written before tensors of one geometry (or the load's options) were drawn
    # runs each case alone (with the defaults)
    extra = {
        k: c[k]
        for k in ("copies", "max_buffer_bytes", "thread_count")
        if c.get(k) and _takes(impl, k)
    }
    copies = extra.get("copies", 0)
    ex = _describe({**c, "copies": 0, "max_buffer_bytes": None, "thread_count": None, **extra})
    with case():
        results = impl.checkpoint_collective_load(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], t, load, c["reads"],
            c["damage"], ex, storage=c.get("storage"), **extra,
        )  # fmt: skip
        _check_loaded(results, c, copies, ex)


def _check_loaded(results: list[Any], c: dict[str, Any], copies: int, ex: str) -> None:
    """Each result (its ``rank`` the load's rank) holds the reference, or every one failed
    alike on a damaged checkpoint (CKPT-26); with the reads counted, each mode's reads
    (CKPT-24, CKPT-25)."""
    t, load = c["tensor"], c["load"]
    errors = [r.value["error"] for r in results]
    if c["damage"] is not None:
        _check_failed_everywhere(errors, c["damage"], ex)
        return
    assert_equal("errors", errors, [None] * len(results), ex)
    for r in results:
        # a nested value filled in place, a top-level one replaced (as dcp.load does)
        assert_equal(f"rank{r.rank}.values", r.value["value"], {"v": {"n": 7}, "w": 5}, ex)
        _check_local(r, t, load, ex, copies)
    stats = [r.value["stats"] for r in results]
    if stats[0] is None:
        return  # the implementation does not count its reads
    modes = {s["reads"] for s in stats}
    assert_equal("read modes of the ranks", len(modes), 1, ex)
    mode = modes.pop()
    storage = _storage(c.get("storage"))
    auto = _auto(t, load, c["saved"], len(results), storage, copies)
    want_mode = c["reads"] if c["reads"] != "auto" else auto
    assert_equal("read mode", mode, want_mode, ex, rule="CKPT-25")
    if c["reads"] == "auto":
        assert_equal("the storage auto chose by", stats[0]["storage"], storage, ex,
                     rule="CKPT-25")  # fmt: skip
    nbytes = (copies + 1) * t.numel() * t.element_size()
    if mode == "once":
        # balanced (CKPT-24): no rank reads more than a fair share plus one run, a saved
        # chunk (these are never cut into row runs) or, with copies, a run of a stack: at
        # most an eighth of a share and a chunk (its chunk of a member) more
        largest = max((s.box.numel for s in c["saved"].shards), default=0) * t.element_size()
        share = -(-nbytes // len(stats))
        run = largest + (-(-share // 8) if copies else 0)
        heavy = [s["data_bytes"] for s in stats if s["data_bytes"] > share + run]
        assert_equal("ranks reading more than a fair share and a run", heavy, [], ex)
        # CKPT-24: the job reads each saved byte once (these chunks are never cut into
        # runs: far below the run size), counted by the ranks
        assert_equal("tensor bytes read by the job", sum(s["data_bytes"] for s in stats),
                     nbytes, ex)  # fmt: skip
        # two values, value i read by rank i mod W alone
        assert_equal("ranks that read a value", sum(bool(s["value_bytes"]) for s in stats),
                     min(2, len(stats)), ex)  # fmt: skip
        _check_no_byte_read_twice([s["ranges"] for s in stats], ex)
    else:
        for r, s in zip(results, stats):
            assert_equal(f"rank{r.rank}.tensor bytes read", s["data_bytes"],
                         (copies + 1) * _mine(t, load, r.rank), ex)  # fmt: skip


@st.composite
def loads_beside_an_idle_rank(draw: st.DrawFn) -> dict[str, Any]:
    """A round trip into a ShardedTensor on 2 ranks or more whose last rank holds no shard of
    it (the drawn boxes folded onto the others), beside the saved values (a nested dict among
    them), read with a drawn mode."""
    c = draw(round_trips(None, checkpoint_worlds().filter(lambda w: w >= 2)))
    if c["load"]["kind"] != "sharded":  # a DTensor's mesh leaves no rank idle: all on rank 0
        shape = tuple(c["tensor"].shape)
        whole = Layout(shape, [Shard(Box((0,) * len(shape), shape), 0)])
        c["load"] = {"kind": "sharded", "layout": layout_to_json(whole),
                     "whole_item_bytes": c["load"]["whole_item_bytes"]}  # fmt: skip
    dst = layout_from_json(c["load"]["layout"])
    idle = c["load_world"] - 1
    folded = Layout(dst.shape, [Shard(s.box, s.rank % idle) for s in dst.shards])
    c["load"]["layout"] = layout_to_json(storable(_one_per_box(folded)))
    c["reads"] = draw(st.sampled_from(READS))
    return {**c, "damage": None, "storage": None}


# The whole of a 4-element tensor on rank 0 of 2: rank 1 holds nothing of it, beside the
# nested value "v" (torch's _flatten_sharded_tensors drops the tensor's key on rank 1, and
# dcp.load then fails there)
ALL_ON_RANK_0 = {
    "save_world": 1,
    "load_world": 2,
    "saved": Layout((4,), [Shard(Box((0,), (4,)), 0)]),
    "load": {
        "kind": "sharded",
        "layout": layout_to_json(Layout((4,), [Shard(Box((0,), (4,)), 0)])),
        "whole_item_bytes": 1 << 18,
    },
    "tensor": torch.arange(4, dtype=torch.float32),
    "reads": "own",
    "damage": None,
    "storage": None,
}


@pytest.mark.rule("CKPT-23")
@pytest.mark.known_defect(
    "torch",
    "dcp.load fails on a rank that holds no shard of a ShardedTensor ('Missing key in "
    "checkpoint state_dict' for a nested value beside it): DCP's _flatten_sharded_tensors "
    "drops the tensor's key there (repro checkpoint-flatten-drops-entry-without-local-shard)",
    raises=AssertionError,
    match=r"^errors=.*Missing key in checkpoint state_dict",
)
@pytest.mark.pool
@EXAMPLES
@given(loads_beside_an_idle_rank())
@example(ALL_ON_RANK_0)
def test_a_rank_holding_no_shard_of_a_tensor_loads_the_values_beside_it(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """A ShardedTensor of which one rank holds nothing (FSDP's ranks past the data), loaded
    beside a nested value and a top-level one: every rank holds the reference, the idle rank
    no tensor and both values."""
    ex = _describe(c)
    with case():
        results = impl.checkpoint_collective_load(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], c["tensor"], c["load"],
            c["reads"], None, ex,
        )  # fmt: skip
        _check_loaded(results, c, 0, ex)


@st.composite
def disagreeing_loads(draw: st.DrawFn) -> dict[str, Any]:
    """A collective load (a round trip's, sometimes into a plain tensor) on 2 ranks or more,
    read "own" or "once" with or without a bound on the buffers, where one drawn rank alone
    passes the other read mode, another bound, or a state dict without one of the values."""
    c = draw(round_trips(None, checkpoint_worlds().filter(lambda w: w >= 2)))
    if draw(st.integers(0, 4)) == 0:
        c["load"] = {"kind": "plain"}
    c["reads"] = draw(st.sampled_from(("own", "once")))
    c["max_buffer_bytes"] = draw(st.sampled_from([None, 1 << 20]))
    rank = draw(st.integers(0, c["load_world"] - 1), label="odd rank")
    kind = draw(st.sampled_from(["reads", "max_buffer_bytes", "drop"]))
    if kind == "reads":
        odd: dict[str, Any] = {"reads": "once" if c["reads"] == "own" else "own"}
    elif kind == "max_buffer_bytes":
        odd = {"max_buffer_bytes": 4096 if c["max_buffer_bytes"] is None else None}
    else:
        odd = {"drop": draw(st.sampled_from(["v", "w"]))}
    return {**c, "odd": {"rank": rank, **odd}}


# rows -> columns on 2 ranks: rank 1 reads "once" where rank 0 reads "own"; rank 0 bounds the
# buffers where rank 1 does not; rank 1's state dict has no "w"
ODD_READS = {**ROWS_TO_COLUMNS_BF16, "reads": "own", "max_buffer_bytes": None,
             "odd": {"rank": 1, "reads": "once"}}  # fmt: skip
ODD_BOUND = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "max_buffer_bytes": None,
             "odd": {"rank": 0, "max_buffer_bytes": 4096}}  # fmt: skip
ODD_KEYS = {**ODD_READS, "odd": {"rank": 1, "drop": "w"}}


@pytest.mark.rule("CKPT-23", "CKPT-26")
@pytest.mark.pool
@EXAMPLES
@given(disagreeing_loads())
@example(ODD_READS)
@example(ODD_BOUND)
@example(ODD_KEYS)
def test_ranks_that_disagree_on_a_collective_load_raise_the_same_error_before_it_reads(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """One rank passes another read mode, another bound on the buffers, or a state dict
    without one of the values: every rank raises the same LoadError (the digest of CKPT-23
    covers the mode, the bound and the keys) and none has read anything into its tensors or
    values (they still hold what the load started from)."""
    odd = c["odd"]
    passes = ", ".join(f"{k}={v!r}" for k, v in odd.items() if k != "rank")
    ex = f"{_describe(c)}, where rank {odd['rank']} alone passes {passes}"
    if not hasattr(impl, "checkpoint_collective_load_disagreeing"):
        pytest.skip(f"{impl.name}'s adapter predates ranks that disagree on a collective load")
    t, load = c["tensor"], c["load"]
    with case():
        results = impl.checkpoint_collective_load_disagreeing(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], t, load, c["reads"],
            c["max_buffer_bytes"], odd, ex,
        )  # fmt: skip
        errors = [r.value["error"] for r in results]
        assert_equal("ranks that returned", [e is None for e in errors], [False] * len(errors),
                     ex, rule="CKPT-26")  # fmt: skip
        assert_equal("distinct errors", len(set(errors)), 1, ex, rule="CKPT-26")
        assert_equal("the error's type", str(errors[0]).split(":")[0], "LoadError", ex,
                     rule="CKPT-26")  # fmt: skip
        for r in results:
            values = {"v": {"n": 0}, "w": 0}
            if r.rank == odd["rank"] and odd.get("drop"):
                del values[odd["drop"]]
            assert_equal(f"rank{r.rank}.values (untouched)", r.value["value"], values, ex)
            want = _want(torch.ones_like(t), load, r.rank)
            assert_equal(f"rank{r.rank}.local tensors", len(r.tensors), len(want), ex)
            for i, (got, w) in enumerate(zip(r.tensors, want)):
                assert_tensor_bitwise(f"rank{r.rank}.untouched[{i}]", got, w, ex)


@st.composite
def subgroup_loads(draw: st.DrawFn, max_world: int = 4) -> dict[str, Any]:
    """A collective load (as :func:`collective_loads` draws it, sub-meshes included) on the
    group of ``members``: 1 to ``pool`` - 1 ranks of a pool of 2 to ``max_world`` (ascending, as
    new_group orders them; any of them, so group rank i is seldom pool rank i, and group rank
    0, which reads the metadata for the others, is often not pool rank 0), the destination's
    layout or mesh over the group's ranks. Saved on 1 to ``max_world`` ranks."""
    pool = draw(st.integers(2, max_world), label="pool")
    size = draw(st.integers(1, pool - 1), label="group size")
    members = sorted(draw(st.permutations(range(pool)))[:size])
    c = draw(round_trips(st.integers(1, max_world), st.just(size)))
    if draw(st.integers(0, 4)) == 0:
        c["load"] = {"kind": "plain"}
    _maybe_on_sub_meshes(draw, c["load"])
    c["reads"] = draw(st.sampled_from(READS))
    c["storage"] = draw(st.sampled_from(STORAGE))
    c["damage"] = draw(st.sampled_from([None] * 8 + ["truncate", "metadata"]))
    c["copies"] = draw(st.sampled_from([0, 0, 1, 3]))
    return {**c, "pool": pool, "members": members}


# Rows saved on 3 ranks, loaded as columns read once on the group of pool ranks 1 and 3 of 4:
# the group's rank 0 (pool rank 1) reads the metadata for both, and each member's boxes are
# those of its group rank.
ROWS_TO_COLUMNS_ON_1_3 = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "storage": None,
                          "damage": None, "copies": 3, "pool": 4, "members": [1, 3]}  # fmt: skip
# A DTensor sharded by columns (3, 3 and 1 of 7) on a mesh of pool ranks 0, 2 and 3, read as
# "own", and as "auto" told the storage is shared.
DTENSOR_ON_0_2_3 = {
    **ROWS_TO_COLUMNS_BF16,
    "load_world": 3,
    "load": {"kind": "dtensor", "mesh": [3], "placements": [["S", 1]]},
    "reads": "own",
    "storage": None,
    "damage": None,
    "copies": 0,
    "pool": 4,
    "members": [0, 2, 3],
}
DTENSOR_ON_0_2_3_AUTO = {**DTENSOR_ON_0_2_3, "reads": "auto", "storage": "shared"}
# On the group of pool ranks 1, 2 and 3 of 4, a DTensor on the meshes of dim 0 of a 1x3 mesh:
# each member on a mesh of itself alone (CKPT-23: every rank sees its own mesh only, and the
# meshes' first ranks are found among the group's ranks), read once.
ON_SUB_MESHES_OF_A_GROUP = {
    **ON_SUB_MESHES_AUTO,
    "load_world": 3,
    "load": {"kind": "dtensor", "mesh": [1, 3], "placements": [["S", 1], ["R"]], "sub": 0},
    "reads": "once",
    "storage": None,
    "copies": 0,
    "pool": 4,
    "members": [1, 2, 3],
}
# A truncated file under "once" on the group of pool ranks 2 and 3: both members fail alike.
TRUNCATED_ON_2_3 = {**ROWS_TO_COLUMNS_ON_1_3, "damage": "truncate", "copies": 0,
                    "members": [2, 3]}  # fmt: skip


@pytest.mark.rule("CKPT-23", "CKPT-24", "CKPT-26")
@NAMES_NO_FILE
@pytest.mark.pool
@EXAMPLES
@given(subgroup_loads())
@example(ROWS_TO_COLUMNS_ON_1_3)
@example(DTENSOR_ON_0_2_3)
@example(DTENSOR_ON_0_2_3_AUTO)
@example(TRUNCATED_ON_2_3)
@example(ON_SUB_MESHES_OF_A_GROUP)
def test_a_collective_load_among_a_subgroup_of_the_ranks_uses_its_group_ranks(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """The collective load on the process group of some of the pool's ranks, whose rank i is
    the i-th member (not pool rank i): each member holds the reference at its group rank's
    boxes (or every member fails alike on a damaged checkpoint), its reads are its group
    rank's, and the other ranks take no part."""
    if not hasattr(impl, "checkpoint_collective_load_on"):
        pytest.skip(f"{impl.name}'s adapter predates the collective load on a subgroup")
    members = c["members"]
    copies = c["copies"] if _takes(impl, "copies") else 0
    ex = (
        f"{_describe({**c, 'copies': copies})}, the load on the group of pool ranks {members} "
        f"of {c['pool']} (rank<i> below is group rank i: pool rank members[i])"
    )
    with case():
        results = impl.checkpoint_collective_load_on(
            pools(c["save_world"]), pools(c["pool"]), members, c["saved"], c["tensor"],
            c["load"], c["reads"], c["damage"], ex, storage=c["storage"], copies=copies,
        )  # fmt: skip
        assert_equal("ranks that answered", [r.rank for r in results], list(range(c["pool"])), ex)
        for r in results:
            if r.rank not in members:
                assert_equal(f"pool rank {r.rank} (not in the group): error, value, tensors",
                             (r.value["error"], r.value["value"], len(r.tensors)), (None, None, 0),
                             ex)  # fmt: skip
        mine = [replace(r, rank=members.index(r.rank)) for r in results if r.rank in members]
        _check_loaded(mine, c, copies, ex)


def _takes(impl: Any, name: str) -> bool:
    """Whether the adapter's collective load takes the keyword ``name`` (or any keyword)."""
    params = inspect.signature(impl.checkpoint_collective_load).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _check_failed_everywhere(errors: list[str | None], damage: str, ex: str) -> None:
    """CKPT-26: every rank raised, the same error, naming the damaged file."""
    assert_equal("ranks that returned", [e is None for e in errors], [False] * len(errors), ex)
    assert_equal("distinct errors", len(set(errors)), 1, ex)
    first = str(errors[0])
    named = ".metadata" if damage == "metadata" else r"__\d+_\d+\.distcp"
    assert_equal(f"the error names the file ({named})", bool(re.search(named, first)), True,
                 f"{ex}: {first}")  # fmt: skip


def _check_no_byte_read_twice(ranges: list[list[list[Any]]], ex: str) -> None:
    spans = sorted((f, a, b, rank) for rank, rs in enumerate(ranges) for f, a, b in rs)
    # sorted by start: any two ranges that overlap imply two neighbours that do
    for (f1, _, b1, r1), (f2, a2, b2, r2) in itertools.pairwise(spans):
        if f1 == f2 and a2 < b1:
            raise AssertionError(
                f"bytes [{a2}, {min(b1, b2)}) of {f1} read by rank {r1} and rank {r2} "
                f"with reads='once' [{ex}]"
            )


@st.composite
def safetensors_loads(draw: st.DrawFn) -> dict[str, Any]:
    """A drawn tensor and destination (as round_trips draws them, or a plain tensor), in a
    Hugging Face checkpoint of 1 to 3 shards, loaded with a drawn read mode."""
    c = draw(round_trips())
    if draw(st.integers(0, 3)) == 0:
        c["load"] = {"kind": "plain"}
    c["reads"] = draw(st.sampled_from(READS))
    c["files"] = draw(st.integers(1, 3))
    return c


@pytest.mark.rule("CKPT-22", "CKPT-23", "CKPT-24")
@pytest.mark.pool
@EXAMPLES
@given(safetensors_loads())
def test_a_safetensors_checkpoint_loads_the_reference_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    t, load = c["tensor"], c["load"]
    where = "a plain tensor on every rank" if load["kind"] == "plain" else _describe_load(load)
    ex = (
        f"safetensors checkpoint of {c['files']} file(s) holding t={tuple(t.shape)} {t.dtype}, "
        f"collective load (reads={c['reads']}) on {c['load_world']} ranks into {where}"
    )
    with case():
        results = impl.checkpoint_safetensors_load(
            pools(c["load_world"]), t, c["files"], load, c["reads"], ex
        )
        assert_equal("errors", [r.value["error"] for r in results], [None] * len(results), ex)
        for r in results:
            _check_local(r, t, load, ex)
        stats = [r.value["stats"] for r in results]
        if stats[0] is not None and stats[0]["reads"] == "once":
            nbytes = t.numel() * t.element_size()
            assert_equal("tensor bytes read by the job", sum(s["data_bytes"] for s in stats),
                         nbytes, ex)  # fmt: skip
            _check_no_byte_read_twice([s["ranges"] for s in stats], ex)


@st.composite
def hf_sharded_loads(draw: st.DrawFn) -> dict[str, Any]:
    """A drawn tensor and destination (as round_trips draws them, or a plain tensor) saved in
    DCP's Hugging Face format: each saved box on a rank of its own (the writer keeps one chunk
    of a tensor a file), no empty box where another starts (CKPT-1: DCP keys a chunk by its
    offset); one time in four a file lost or cut short."""
    from shardspec.checkpoint.chunks import storable
    from shardspec.testing.devices import world_sizes as sizes

    c = draw(round_trips())
    shards = storable(c["saved"]).shards
    if len(shards) > max(sizes()):
        shards = [s for s in shards if not s.box.is_empty]
    assume(1 <= len(shards) <= max(sizes()))
    c["saved"] = Layout(c["saved"].shape, [Shard(s.box, i) for i, s in enumerate(shards)])
    c["save_world"] = len(shards)
    if draw(st.integers(0, 3)) == 0:
        c["load"] = {"kind": "plain"}
    c["reads"] = draw(st.sampled_from(READS))
    damage = draw(st.sampled_from([None] * 3 + ["remove", "truncate"]))
    nonempty = sum(1 for s in shards if not s.box.is_empty)
    c["damage"] = damage if nonempty and damage else None
    return c


# 4 rows on 2 ranks (rows 0-1, rows 2-3); rank 0's file lost: rows 0-1 are in no file, but the
# chunk left still spans all 4 rows.
HF_LOST_FIRST = {"save_world": 2, "load_world": 2,
                 "saved": Layout((4,), [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)]),
                 "load": {"kind": "plain"}, "reads": "own", "damage": "remove",
                 "tensor": torch.arange(4, dtype=torch.float32)}  # fmt: skip
HF_ROWS_TO_COLUMNS = {"save_world": 3, "load_world": 2,
                      "saved": Layout((5, 3), [Shard(Box((0, 0), (2, 3)), 0),
                                               Shard(Box((2, 0), (2, 3)), 1),
                                               Shard(Box((4, 0), (1, 3)), 2)]),
                      "load": {"kind": "dtensor", "mesh": [2], "placements": [["S", 1]]},
                      "reads": "once", "damage": None,
                      "tensor": torch.arange(15, dtype=torch.int32).reshape(5, 3)}  # fmt: skip


@pytest.mark.rule("CKPT-28", "CKPT-23", "CKPT-26")
@pytest.mark.known_defect(
    "torch",
    "dcp.load with HuggingFaceStorageReader takes a tensor's shape as its chunks' bounding box "
    "and never checks that the chunks fill it: with one rank's file lost, its rows keep what "
    "the destination held, on every rank, and the load returns (repro "
    "dcp-hf-load-lost-file-silently)",
    raises=AssertionError,
    match=r"^ranks that returned=\[True",
)
@pytest.mark.pool
@EXAMPLES
@given(hf_sharded_loads())
@example(HF_LOST_FIRST)
@example(HF_ROWS_TO_COLUMNS)
def test_dcps_hugging_face_format_loads_the_reference_or_fails_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    # Two empty boxes at one offset: DCP's writer keeps one chunk an offset (CKPT-1), and
    # the one it drops may be all that said how far the tensor reaches; a load into the
    # tensor's shape is then refused (CKPT-28), and either outcome is right.
    offsets = [s.box.offsets for s in c["saved"].shards]
    refused = True if c["damage"] else None if len(set(offsets)) < len(offsets) else False
    _hf_round_trip(impl, pools, c, refused=refused)


def _hf_round_trip(impl: Impl, pools: Any, c: dict[str, Any], refused: bool | None) -> None:
    """A save in DCP's Hugging Face format and a collective load of it: refused alike on
    every rank (``refused``), the reference on every rank (not ``refused``), or either
    (None)."""
    t, load = c["tensor"], c["load"]
    where = "a plain tensor on every rank" if load["kind"] == "plain" else _describe_load(load)
    ex = (
        f"DCP Hugging Face checkpoint of t={tuple(t.shape)} {t.dtype} saved on "
        f"{c['save_world']} ranks as {describe_layout(c['saved'])}"
        + (f", the file at t's origin: {c['damage']}" if c["damage"] else "")
        + f"; collective load (reads={c['reads']}) on {c['load_world']} ranks into {where}"
    )
    with case():
        results = impl.checkpoint_hf_sharded_load(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], t, load, c["reads"],
            c["damage"], ex,
        )  # fmt: skip
        errors = [r.value["error"] for r in results]
        if refused or (refused is None and any(e is not None for e in errors)):
            assert_equal("ranks that returned", [e is None for e in errors],
                         [False] * len(errors), ex)  # fmt: skip
            assert_equal("distinct errors", len(set(errors)), 1, ex)
            return
        assert_equal("errors", errors, [None] * len(results), ex)
        for r in results:
            _check_local(r, t, load, ex)


@st.composite
def hf_crowded_saves(draw: st.DrawFn) -> dict[str, Any]:
    """A round trip (test_checkpoint's) whose save puts two or more non-empty boxes of the
    tensor on one rank, saved in DCP's Hugging Face format."""
    c = draw(round_trips())
    from shardspec.checkpoint.chunks import storable

    c["saved"] = storable(c["saved"])
    held = [s.rank for s in c["saved"].shards if not s.box.is_empty]
    assume(len(held) != len(set(held)))
    if draw(st.integers(0, 3)) == 0:
        c["load"] = {"kind": "plain"}
    c["reads"] = draw(st.sampled_from(READS))
    c["damage"] = None
    return c


# rows 0-1 and 4-5 on rank 0, rows 2-3 and 6-7 on rank 1
HF_TWO_A_RANK = {"save_world": 2, "load_world": 1,
                 "saved": Layout((8,), [Shard(Box((2 * i,), (2,)), i % 2) for i in range(4)]),
                 "load": {"kind": "plain"}, "reads": "own", "damage": None,
                 "tensor": torch.arange(8, dtype=torch.float32)}  # fmt: skip


@pytest.mark.rule("CKPT-28", "CKPT-26")
@pytest.mark.known_defect(
    "torch",
    "HuggingFaceStorageWriter keeps one chunk of a tensor a rank (its file's tensors are keyed "
    "by name), and HuggingFaceStorageReader loads what is left without a word: the lost "
    "chunks' elements keep what the destination held (repro dcp-hf-writer-keeps-one-chunk-a-rank)",
    raises=AssertionError,
    match=r"^rank\d+\.loaded\[\d+\]",
)
@pytest.mark.pool
@EXAMPLES
@given(hf_crowded_saves())
@example(HF_TWO_A_RANK)
def test_dcps_hugging_face_format_of_several_chunks_a_rank_loads_or_fails_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    # what the writer kept may not be the tensor: then refused, alike, on every rank
    _hf_round_trip(impl, pools, c, refused=None)


@st.composite
def spoiled_loads(draw: st.DrawFn, damages: tuple[str, ...]) -> dict[str, Any]:
    """A collective load (as :func:`collective_loads` draws it) of a non-empty tensor whose
    ``.metadata`` was spoiled by one of ``damages`` (:func:`conformance.faults.damage.damage`),
    each chunk still finding stored bytes of its size."""
    c = draw(round_trips().filter(lambda c: c["tensor"].numel() > 0))
    if draw(st.integers(0, 4)) == 0:
        c["load"] = {"kind": "plain"}
    c["reads"] = draw(st.sampled_from(READS))
    c["damage"] = draw(st.sampled_from(damages))
    return c


def _spoiled_examples(first: dict[str, Any], second: dict[str, Any]) -> Any:
    """Both explicit examples on pools; on simulated worlds the first on the smallest world (a
    known defect must show in every run that names it)."""

    def add(test: Any) -> Any:
        if simulated_worlds():
            w = min(simulated_worlds())
            return example({**first, "save_world": w, "load_world": w})(test)
        return example(second)(example(first)(test))

    return add


def _refused_alike(impl: Impl, pools: Any, c: dict[str, Any]) -> None:
    """Every rank raised, the same error, naming the tensor's key."""
    ex = _describe(c)
    with case():
        results = impl.checkpoint_collective_load(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], c["tensor"], c["load"],
            c["reads"], c["damage"], ex,
        )  # fmt: skip
        errors = [r.value["error"] for r in results]
        assert_equal("ranks that returned", [e is None for e in errors], [False] * len(errors),
                     ex)  # fmt: skip
        assert_equal("distinct errors", len(set(errors)), 1, ex)
        first = str(errors[0])
        assert_equal("the error names the tensor ('t')", bool(re.search(r"['\"]t['\"]", first)),
                     True, f"{ex}: {first}")  # fmt: skip


# The rows of ROWS_TO_COLUMNS_BF16: rows 0-1 (the largest chunk) left out, read once; or
# those rows moved down one (row 0 in no chunk, row 2 in two), each rank reading for itself.
GAP_ONCE = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "damage": "gap"}
OVERLAP_OWN = {**ROWS_TO_COLUMNS_BF16, "reads": "own", "damage": "overlap"}


@pytest.mark.rule("CKPT-1", "CKPT-26")
@pytest.mark.known_defect(
    "torch",
    "dcp.load checks no saved chunk list: a checkpoint whose chunks leave a gap or overlap "
    "loads silently, the elements no chunk holds keeping their old values (repro "
    "dcp-load-damaged-checkpoint-silently)",
    raises=AssertionError,
    match=r"^(ranks that returned|distinct errors|the error names the tensor)",
)
@pytest.mark.pool
@settings(max_examples=min(10, settings.default.max_examples), deadline=None)
@given(spoiled_loads(("gap", "overlap")))
@_spoiled_examples(GAP_ONCE, OVERLAP_OWN)
def test_a_collective_load_refuses_a_chunk_list_with_a_gap_or_an_overlap_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """CKPT-1 through the collective load: a chunk list that does not tile the tensor is
    refused on every rank with the same error, naming the tensor's key, whatever the read
    mode and the destination (CKPT-26). Every chunk left still finds bytes of its own size,
    so a load that skips the check returns, holding what no chunk gave."""
    _refused_alike(impl, pools, c)


# A storage entry naming its file through "..", read once; a chunk's offsets as floats, each
# rank reading for itself.
OUTSIDE_ONCE = {**ROWS_TO_COLUMNS_BF16, "reads": "once", "damage": "outside"}
FLOATS_OWN = {**ROWS_TO_COLUMNS_BF16, "reads": "own", "damage": "floats"}


@pytest.mark.rule("CKPT-5", "CKPT-26")
@pytest.mark.known_defect(
    "torch",
    "DCP's FileSystemReader unpickles .metadata with pickle.load and reads what its entries "
    "name: a file named through '..' (or an absolute path) is read from outside the "
    "checkpoint, offsets that are floats are taken as ints, and the load returns (repro "
    "dcp-load-follows-paths-outside-the-checkpoint)",
    raises=AssertionError,
    match=r"^(ranks that returned|distinct errors|the error names the tensor)",
)
@pytest.mark.pool
@settings(max_examples=min(10, settings.default.max_examples), deadline=None)
@given(spoiled_loads(("outside", "floats")))
@_spoiled_examples(OUTSIDE_ONCE, FLOATS_OWN)
def test_a_collective_load_refuses_fields_no_dcp_writer_writes_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """CKPT-5 through the collective load: a storage entry naming a file outside the
    checkpoint's directory, or a chunk's offsets that are not ints, is refused on every rank
    with the same error, naming the tensor's key, before any data moves (CKPT-26), whatever
    the read mode. Each still finds the chunk's bytes, so a load that does not look
    returns."""
    _refused_alike(impl, pools, c)


# ------------------------------------------------ reads="once" at the sizes of its own paths
# CKPT-24's sizes, restated here from the spec (not imported from the implementation): a saved
# chunk larger than both the fair share and this is read in row runs; a run larger than a
# small chunk (256 KiB) is not read whole with its neighbours.
RUN_BYTES = 4 << 20


@st.composite
def large_once_loads(draw: st.DrawFn) -> dict[str, Any]:
    """A 2-D tensor of 4-10 MiB saved in 1-3 row chunks of drawn (uneven) heights, loaded
    with reads="once" as rows, as columns, whole on every rank (a plain tensor, or Replicate),
    or replicated in part (a 2-D mesh): the sizes at which "once" cuts chunks into row runs of
    counts that need not divide, maps runs of the file instead of reading them with their
    neighbours, and reads a tensor every rank holds whole into its own destination."""
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8]))
    item = torch.empty((), dtype=dtype).element_size()
    cols = draw(st.integers(1, 700))
    nbytes = draw(st.integers(RUN_BYTES + 1, 10 << 20))
    rows = max(2, -(-nbytes // (cols * item)))
    sizes = checkpoint_worlds()
    save_world, load_world = draw(sizes), draw(sizes)
    k = draw(st.sampled_from([1, 1, 2, 3]))
    cuts = sorted(draw(st.sets(st.integers(1, rows - 1), min_size=k - 1, max_size=k - 1)))
    edges = [0, *cuts, rows]
    saved = Layout(
        (rows, cols),
        [Shard(Box((a, 0), (b - a, cols)), i % save_world) for i, (a, b) in
         enumerate(itertools.pairwise(edges))],
    )  # fmt: skip
    how = draw(st.sampled_from(["rows", "columns", "plain", "replicate", "2-D"]))
    load: dict[str, Any]
    if how == "plain":
        load = {"kind": "plain"}
    elif how == "2-D" and load_world % 2 == 0 and load_world > 2:
        load = {"kind": "dtensor", "mesh": [2, load_world // 2], "placements": [["R"], ["S", 1]]}
    else:
        placement = {"rows": ["S", 0], "columns": ["S", 1]}.get(how, ["R"])
        load = {"kind": "dtensor", "mesh": [load_world], "placements": [placement]}
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if dtype.is_floating_point:
        t = torch.randn(rows, cols, generator=g).to(dtype)
    else:
        t = torch.randint(0, 120, (rows, cols), generator=g).to(dtype)
    return {"save_world": save_world, "load_world": load_world, "saved": saved, "load": load,
            "tensor": t, "reads": "once", "damage": None}  # fmt: skip


def _big(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols).to(dtype)


# One 9 MiB chunk loaded as columns on 3: three row runs of 769, 768 and 768 rows, each mapped
# and sent in part to the other two.
ONE_CHUNK_AS_COLUMNS_ON_3 = {
    "save_world": 1,
    "load_world": 3,
    "saved": Layout((2305, 1024), [Shard(Box((0, 0), (2305, 1024)), 0)]),
    "load": {"kind": "dtensor", "mesh": [3], "placements": [["S", 1]]},
    "tensor": _big(2305, 1024),
    "reads": "once",
    "damage": None,
}
# 6 MiB as a plain tensor on 2: two runs of 769 and 768 rows, each read into its reader's own
# destination and broadcast from there.
PLAIN_ON_2 = {
    **ONE_CHUNK_AS_COLUMNS_ON_3,
    "load_world": 2,
    "saved": Layout((1537, 1024), [Shard(Box((0, 0), (1537, 1024)), 0)]),
    "load": {"kind": "plain"},
    "tensor": _big(1537, 1024),
}
# Two uneven chunks (5 and 3 MiB) saved on 2, loaded on a 2 x 2 mesh as [Replicate, Shard(1)]:
# replicated in part, so mapped and exchanged, not broadcast.
PARTLY_REPLICATED_ON_4 = {
    "save_world": 2,
    "load_world": 4,
    "saved": Layout(
        (2049, 1024), [Shard(Box((0, 0), (1281, 1024)), 0), Shard(Box((1281, 0), (768, 1024)), 1)]
    ),
    "load": {"kind": "dtensor", "mesh": [2, 2], "placements": [["R"], ["S", 1]]},
    "tensor": _big(2049, 1024, torch.bfloat16),
    "reads": "once",
    "damage": None,
}


def _large_examples(test: Any) -> Any:
    if simulated_worlds():
        w = min(simulated_worlds())
        columns = {"kind": "dtensor", "mesh": [w], "placements": [["S", 1]]}
        return example({**ONE_CHUNK_AS_COLUMNS_ON_3, "load_world": w, "load": columns})(test)
    for ex in (ONE_CHUNK_AS_COLUMNS_ON_3, PLAIN_ON_2, PARTLY_REPLICATED_ON_4):
        test = example(ex)(test)
    return test


@pytest.mark.rule("CKPT-24", "CKPT-27")
@pytest.mark.pool
@settings(max_examples=min(8, settings.default.max_examples), deadline=None)
@given(large_once_loads())
@_large_examples
def test_reads_once_cuts_maps_and_broadcasts_large_chunks_into_the_reference(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Every rank holds the reference; the job reads the tensor's bytes once, counted by the
    ranks; a rank reads no more than twice the larger of the fair share and the run size, and
    of a single saved chunk no more than one run (so a chunk past both is read in runs)."""
    t, load = c["tensor"], c["load"]
    ex = _describe(c) + f", shape {tuple(t.shape)}"
    with case():
        results = impl.checkpoint_collective_load(
            pools(c["save_world"]), pools(c["load_world"]), c["saved"], t, load, "once", None,
            ex,
        )  # fmt: skip
        assert_equal("errors", [r.value["error"] for r in results], [None] * len(results), ex)
        for r in results:
            _check_local(r, t, load, ex)
        stats = [r.value["stats"] for r in results]
        if stats[0] is None:
            return  # the implementation does not count its reads
        assert_equal("read modes of the ranks", {s["reads"] for s in stats}, {"once"}, ex)
        nbytes = t.numel() * t.element_size()
        read = [s["data_bytes"] for s in stats]
        assert_equal("tensor bytes read by the job", sum(read), nbytes, ex, rule="CKPT-24")
        share = -(-nbytes // len(stats))
        run = max(share, RUN_BYTES) + t.shape[1] * t.element_size()  # near-equal: a row more
        heavy = [(r, n) for r, n in enumerate(read) if n > 2 * run]
        assert_equal("ranks reading past twice a run", heavy, [], ex, rule="CKPT-24")
        if len(c["saved"].shards) == 1 and nbytes > max(share, RUN_BYTES):
            # one chunk past both bounds: read in runs, none longer than the bound and a row
            past = [(r, n) for r, n in enumerate(read) if n > run]
            assert_equal("ranks reading past one run of the one chunk", past, [], ex,
                         rule="CKPT-24")  # fmt: skip
