"""The DCP planners' planning, without ranks (spec/09-checkpoint.md): read items against the
default planner's for drawn checkpoints and destinations, and the chunk check before any
read. Real loads on gloo ranks are in test_dcp_load.py."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from checkpoint_read_triples import layouts_of, read_item_triples
from hypothesis import given, strategies as st

from shardspec.checkpoint.chunks import ChunkError, check_chunks, storable
from shardspec.checkpoint.dcp import read_items_for_chunks
from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.metadata.dcp import to_chunk_list, to_tensor_storage_metadata
from shardspec.metadata.strategies import (
    shapes,
)
from shardspec.reshard.planner import large_layout_paths

torch = pytest.importorskip("torch")
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner_helpers import (  # noqa: E402
    create_read_items_for_chunk_list,
)


def md_of(shape: tuple[int, ...], boxes: list[Box]) -> TensorStorageMetadata:
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.float32),
        size=torch.Size(shape),
        chunks=[
            ChunkStorageMetadata(offsets=torch.Size(b.offsets), sizes=torch.Size(b.sizes))
            for b in boxes
        ],
    )


def brute_force(md: TensorStorageMetadata, rank: int, local: list[ChunkStorageMetadata]) -> set:
    """Every non-empty intersection of a saved chunk with a local chunk, by hand."""
    out = set()
    for j, d in enumerate(local):
        dbox = Box(tuple(d.offsets), tuple(d.sizes))
        for s in md.chunks:
            sbox = Box(tuple(s.offsets), tuple(s.sizes))
            cut = sbox.intersect(dbox)
            if cut is not None and not cut.is_empty:
                out.add((sbox, (rank, j), cut))
    return out


@pytest.mark.rule("CKPT-3")
@given(st.data(), st.booleans())
def test_read_items_equal_the_default_planners(data: st.DataObject, force: bool) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=7))
    saved, dest = data.draw(layouts_of(shape)), data.draw(layouts_of(shape))
    md = to_tensor_storage_metadata(storable(saved))  # CKPT-1: no two chunks at one offset
    for r in dest.ranks:
        local = to_chunk_list(dest, r)
        upstream = create_read_items_for_chunk_list("t", md, local)
        with large_layout_paths(force):
            ours = read_items_for_chunks("t", md, local)
        expected = brute_force(md, r, local)
        assert read_item_triples(md, r, local, upstream) == expected
        assert read_item_triples(md, r, local, ours) == expected
        # Nothing read twice and nothing empty: the reads tile the local chunks exactly.
        assert all(all(n > 0 for n in it.lengths) or not it.lengths for it in ours)
        want = sum(Box(tuple(c.offsets), tuple(c.sizes)).numel for c in local)
        assert sum(torch.Size(it.lengths).numel() for it in ours) == want


@pytest.mark.rule("CKPT-3")
def test_rows_read_as_columns_hand_worked() -> None:
    # 6 x 4 saved as rows [0,3) [3,6); read as columns [0,2) [2,4) on one rank.
    md = md_of((6, 4), [Box((0, 0), (3, 4)), Box((3, 0), (3, 4))])
    local = [
        ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size((6, 2)))
        for o in ((0, 0), (0, 2))
    ]
    items = read_items_for_chunks("w", md, local)
    got = sorted(
        (
            it.storage_index.index,
            tuple(it.storage_offsets),
            it.dest_index.index,
            tuple(it.dest_offsets),
            tuple(it.lengths),
        )
        for it in items
    )
    assert got == [
        (0, (0, 0), 0, (0, 0), (3, 2)),
        (0, (0, 2), 1, (0, 0), (3, 2)),
        (1, (0, 0), 0, (3, 0), (3, 2)),
        (1, (0, 2), 1, (3, 0), (3, 2)),
    ]
    assert all(it.dest_index.fqn == "w" and it.storage_index.fqn == "w" for it in items)


BAD = [
    # (boxes, kind, culprit chunks, words the message must hold)
    ([Box((0, 0), (3, 4)), Box((2, 0), (4, 4))], "overlap", (0, 1), ["#0", "#1", "overlap"]),
    ([Box((0, 0), (3, 4)), Box((4, 0), (2, 4))], "gap", (), ["gap", "4 of 24", "(3, 0)"]),
    ([Box((0, 0), (3, 4)), Box((3, 0), (4, 4))], "bounds", (1,), ["#1", "out of bounds"]),
    ([Box((0, 0), (6, 4)), Box((0, 0), (6, 4))], "overlap", (0, 1), ["same box", "#0", "#1"]),
    ([Box((0,), (6,))], "ndim", (0,), ["#0"]),
]


@pytest.mark.rule("CKPT-1")
@pytest.mark.parametrize(("boxes", "kind", "culprits", "words"), BAD)
def test_bad_chunks_are_named_before_any_read(
    boxes: list[Box], kind: str, culprits: tuple[int, ...], words: list[str]
) -> None:
    md = md_of((6, 4), boxes)
    local = to_chunk_list(chunk_layout((6, 4), 0, [0]), 0)
    with pytest.raises(ChunkError) as err:
        read_items_for_chunks("layer.w", md, local)
    e = err.value
    assert e.kind == kind and e.chunks == culprits and e.fqn == "layer.w"
    assert "'layer.w'" in str(e)
    for w in words:
        assert w in str(e), (w, str(e))


@pytest.mark.rule("CKPT-1")
def test_a_rank_with_no_local_chunks_still_checks_the_checkpoint() -> None:
    md = md_of((6, 4), [Box((0, 0), (3, 4))])
    with pytest.raises(ChunkError, match="gap"):
        read_items_for_chunks("w", md, [])


@pytest.mark.rule("CKPT-1")
@given(st.data())
def test_chunk_check_agrees_with_layout_validation(data: st.DataObject) -> None:
    # Any valid layout's distinct boxes pass; dropping a non-empty chunk leaves a gap named
    # at an element of the dropped box; duplicating one is an overlap naming both copies.
    shape = data.draw(shapes(max_dims=3, max_side=6))
    layout = storable(data.draw(layouts_of(shape)))
    boxes = list(dict.fromkeys(s.box for s in layout.shards))
    got = check_chunks("t", shape, [(b.offsets, b.sizes) for b in boxes])
    assert got == Layout(shape, [Shard(b, i) for i, b in enumerate(boxes)])
    full = [i for i, b in enumerate(boxes) if not b.is_empty]
    if not full:
        return
    k = data.draw(st.sampled_from(full))
    with pytest.raises(ChunkError) as gap:
        check_chunks("t", shape, [(b.offsets, b.sizes) for i, b in enumerate(boxes) if i != k])
    assert gap.value.kind == "gap" and gap.value.point is not None
    point, lost = gap.value.point, boxes[k]
    assert all(o <= x < o + n for x, o, n in zip(point, lost.offsets, lost.sizes)), point
    assert f"{boxes[k].numel} of {Layout(shape, []).numel}" in str(gap.value)
    twice = [*boxes, boxes[k]]
    with pytest.raises(ChunkError) as dup:
        check_chunks("t", shape, [(b.offsets, b.sizes) for b in twice])
    assert dup.value.kind == "overlap" and dup.value.chunks == (k, len(boxes))
    if not shape:  # a 0-d tensor has no empty box
        return
    # An empty chunk at a non-empty chunk's offset: DCP would file both under one key.
    shadow = Box(boxes[k].offsets, (0,) * len(shape))
    with pytest.raises(ChunkError) as same:
        check_chunks("t", shape, [(b.offsets, b.sizes) for b in [*boxes, shadow]])
    assert same.value.kind == "offset" and same.value.chunks == (k, len(boxes))


@pytest.mark.rule("CKPT-1")
def test_chunk_errors_survive_pickling() -> None:
    # DCP gathers each rank's planning error to the coordinator as a pickle; one that cannot
    # be rebuilt fails there and leaves the other ranks waiting (a hang, found on gloo).
    import pickle

    md = md_of((6, 4), [Box((0, 0), (3, 4)), Box((2, 0), (4, 4))])
    with pytest.raises(ChunkError) as err:
        read_items_for_chunks("w", md, [])
    back = pickle.loads(pickle.dumps(err.value))
    assert type(back) is ChunkError and str(back) == str(err.value)
    assert (back.fqn, back.kind, back.chunks, back.point) == ("w", "overlap", (0, 1), None)


@pytest.mark.rule("CKPT-2", "CKPT-3")
def test_shifted_columns_read_exactly_the_two_overlaps_of_each_chunk() -> None:
    # n column chunks of width 4 read as n + 1 chunks shifted by 2: the answer has 2n reads,
    # hand-worked; upstream's sweep along rows keeps every saved chunk open for every local
    # chunk here (n * (n + 1) overlap tests), ours queries an index (bench_dcp_load.py).
    n = 2000
    shape = (8, 4 * n)
    saved = [Box((0, 4 * i), (8, 4)) for i in range(n)]
    md = md_of(shape, saved)
    cuts = [0, *range(2, 4 * n, 4), 4 * n]
    local = [
        ChunkStorageMetadata(offsets=torch.Size((0, a)), sizes=torch.Size((8, b - a)))
        for a, b in pairwise(cuts)
    ]
    items = read_items_for_chunks("w", md, local)
    got = {(it.storage_index.index, it.dest_index.index, tuple(it.lengths)) for it in items}
    want = {(0, 0, (8, 2)), (n - 1, n, (8, 2))}
    want |= {(i, i, (8, 2)) for i in range(1, n)} | {(i, i + 1, (8, 2)) for i in range(n - 1)}
    assert len(items) == 2 * n and got == want


def save_plans(*ranks: list[Box], shape: tuple[int, ...] = (6, 4)) -> list[Any]:
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    props = TensorProperties(dtype=torch.float32)
    return [
        SavePlan(
            [
                WriteItem(
                    index=MetadataIndex("w", torch.Size(b.offsets)),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(torch.Size(b.offsets), torch.Size(b.sizes)),
                        properties=props,
                        size=torch.Size(shape),
                    ),
                )
                for b in boxes
            ]
        )
        for boxes in ranks
    ]


@pytest.mark.rule("CKPT-4")
def test_save_planner_checks_the_global_plan_with_the_chunk_rule() -> None:
    from torch.distributed.checkpoint import DefaultSavePlanner

    from shardspec.checkpoint.dcp import SavePlanner

    top, bottom = Box((0, 0), (3, 4)), Box((3, 0), (3, 4))
    ours = SavePlanner(flatten_state_dict=False)
    plans, md = ours.create_global_plan(save_plans([top], [bottom]))
    d_plans, d_md = DefaultSavePlanner(flatten_state_dict=False).create_global_plan(
        save_plans([top], [bottom])
    )
    assert md == d_md and plans == d_plans  # a valid plan is the default planner's
    with pytest.raises(ChunkError, match=r"'w'.*#0.*#1.*overlap") as err:
        ours.create_global_plan(save_plans([top], [Box((2, 0), (4, 4))]))
    assert err.value.chunks == (0, 1)
    with pytest.raises(ChunkError, match="gap"):
        ours.create_global_plan(save_plans([top], []))
    with pytest.raises(ChunkError, match="out of bounds"):
        ours.create_global_plan(save_plans([top], [Box((3, 0), (4, 4))]))
    # One process saving a part of a tensor is allowed, as upstream allows it; an overlap is not.
    ours.create_global_plan(save_plans([top]))
    with pytest.raises(ChunkError, match="overlap"):
        ours.create_global_plan(save_plans([top, Box((1, 0), (2, 4))]))


@pytest.mark.rule("CKPT-1")
def test_what_reaches_the_caller_of_a_load_with_a_gap(tmp_path: Any) -> None:
    """``dcp.load`` raises DCP's CheckpointException, a BaseException that neither
    ``except ChunkError`` nor ``except Exception`` catches; ``chunk_error`` finds ours in it."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from shardspec.checkpoint.dcp import LoadPlanner, chunk_error

    ck = tmp_path / "ck"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        dcp.save({"w": torch.arange(24.0).reshape(6, 4)}, checkpoint_id=str(ck), no_dist=True)
    md = pickle.loads((ck / ".metadata").read_bytes())  # ours, trusted
    (c,) = md.state_dict_metadata["w"].chunks
    md.state_dict_metadata["w"].chunks[0] = type(c)(c.offsets, torch.Size([4, 4]))  # rows 4:6 lost
    (ck / ".metadata").write_bytes(pickle.dumps(md))
    sd = {"w": torch.zeros(6, 4)}
    caught: BaseException | None = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            dcp.load(sd, checkpoint_id=str(ck), planner=LoadPlanner(), no_dist=True)
    except Exception:  # what a user writes first: it must not be what catches this
        pytest.fail("dcp.load's error is an Exception now: update the README and CKPT-1")
    except BaseException as e:
        caught = e
    assert isinstance(caught, CheckpointException) and not isinstance(caught, ChunkError)
    found = chunk_error(caught)
    assert isinstance(found, ChunkError)
    assert (found.fqn, found.kind, found.point) == ("w", "gap", (4, 0))
    assert torch.equal(sd["w"], torch.zeros(6, 4))  # nothing was read
    assert chunk_error(found) is found
    assert chunk_error(RuntimeError("other")) is None
    try:
        raise RuntimeError("wrapped") from found
    except RuntimeError as outer:
        assert chunk_error(outer) is found
