"""Checkpoint files as an implementation writes them (spec/09-checkpoint.md): a grid saved in
the implementation's own grid forms, replicas included, loads on another world size bit for
bit (CKPT-3 end to end); a save of an invalid layout (a gap, an overlap) is refused on every
rank and leaves no ``.metadata`` (CKPT-4); a damaged checkpoint (a data file missing or cut
short, no ``.metadata``) is refused on every rank (CKPT-16); and a peer's checkpoint is read
by shardspec's tools: ``inspect``, ``verify``, a load with shardspec's planner and reader
(CKPT-21) and ``shardspec.checkpoint.load`` with each read mode (CKPT-23, CKPT-24).

These are the questions a peer (Megatron-Core) answers; shardspec and torch answer the first
three through DCP."""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from conformance import reference
from conformance.assertions import assert_equal, assert_tensor_bitwise, describe_layout, fail
from conformance.cases import case
from conformance.codec import layout_from_json, layout_to_json
from conformance.impls import Impl
from conformance.strategies import (
    dtypes,
    factorizations,
    perturbed_layouts,
    placement_lists,
    shapes,
    tensors,
    valid_layouts,
    world_sizes,
)
from shardspec.checkpoint.chunks import storable
from shardspec.metadata import Box, Layout, Shard

from .test_checkpoint import _describe_load, _on_ranks, _one_per_box

FORMS = ("boxes", "rank_offsets", "grid")
# Each example is a save and a load on two pools (a peer's, seconds): a third of the profile's
# examples, never fewer than 20 (or than the profile's own when it asks for fewer).
_N = settings().max_examples
FEWER = settings(max_examples=max(min(_N, 20), _N // 3))


def _nonempty(layout: Layout) -> Layout:
    return Layout(layout.shape, [s for s in layout.shards if not s.box.is_empty])


@st.composite
def load_targets(draw: st.DrawFn, shape: tuple[int, ...], world: int) -> dict[str, Any]:
    """Where a load puts the tensor: the non-empty boxes of a valid layout of ``world`` ranks
    without replicas (a ShardedTensor), or a DTensor on a mesh of ``world`` devices (Shard,
    Replicate). Empty load boxes are test_checkpoint.py's question (torch's ShardedTensor calls
    one inside another box an overlap: validation-empty-shard-inside-another)."""
    if math.prod(shape) and draw(st.booleans()):
        dst = _nonempty(_on_ranks(draw(valid_layouts(st.just(shape), replicas=False)), world))
        return {"kind": "sharded", "layout": layout_to_json(dst)}
    mesh = draw(factorizations(world, max_dims=3))
    placements = draw(placement_lists(len(shape), len(mesh)))
    placements = [["S", p[1] % len(shape)] if p[0] != "R" else p for p in placements]
    return {"kind": "dtensor", "mesh": list(mesh), "placements": placements}


@st.composite
def grid_cases(draw: st.DrawFn, even: bool) -> dict[str, Any]:
    """A grid of chunks (the chunk rule per dim) over the save world, each cell on one rank or
    on several (replicas), loaded on another world: every split even (each dim a multiple of
    its parts), or some split uneven (empty cells included)."""
    sizes = world_sizes() if even else world_sizes().filter(lambda w: w >= 2)
    save_world, load_world = draw(sizes), draw(world_sizes())
    divisors = [c for c in range(1, save_world + 1) if save_world % c == 0]
    copies = draw(st.sampled_from([c for c in divisors if even or save_world // c >= 2]))
    ndim = draw(st.integers(1, 3))
    cut = draw(factorizations(save_world // copies, max_dims=ndim))
    parts = list(draw(st.permutations([*cut, *[1] * (ndim - len(cut))])))
    if even:
        shape = tuple(p * draw(st.integers(1, max(1, 6 // p))) for p in parts)
    else:
        split = draw(st.sampled_from([d for d, p in enumerate(parts) if p > 1]))
        shape = tuple(
            p * draw(st.integers(0, 2)) + (draw(st.integers(1, p - 1)) if d == split else 0)
            for d, p in enumerate(parts)
        )
    return {"save_world": save_world, "load_world": load_world, "parts": parts,
            "copies": copies, "load": draw(load_targets(shape, load_world)),
            "tensor": draw(tensors(shape, dtypes()))}  # fmt: skip


def _check_loaded(results: list[Any], load: dict[str, Any], t: torch.Tensor, ex: str) -> None:
    for r in results:
        if load["kind"] == "sharded":
            boxes = layout_from_json(load["layout"]).boxes_of(r.rank)
            assert_equal(f"rank{r.rank}.local shards", len(r.tensors), len(boxes), ex)
            for i, (got, b) in enumerate(zip(r.tensors, boxes)):
                assert_tensor_bitwise(f"rank{r.rank}.loaded[{i}] {b}", got, t[b.slices()], ex)
            continue
        mesh = tuple(load["mesh"])
        coord = reference.mesh_coordinates(mesh)[r.rank]
        want = reference.gather(
            t, reference.dtensor_indices(t.shape, mesh, load["placements"], coord)
        )
        assert_tensor_bitwise(f"rank{r.rank}.loaded DTensor at {coord}", r.tensors[0], want, ex)


def _grid_round_trip(impl: Impl, pools: Any, form: str, c: dict[str, Any]) -> None:
    t, load, parts, copies = c["tensor"], c["load"], c["parts"], c["copies"]
    ex = (
        f"save on {c['save_world']} ranks of a {parts} grid of {tuple(t.shape)} "
        f"x{copies} as {form}, load on {c['load_world']} ranks into {_describe_load(load)}, "
        f"dtype={t.dtype}"
    )
    with case():
        results = impl.checkpoint_grid_round_trip(
            pools(c["save_world"]), pools(c["load_world"]), parts, copies, form, t, load, ex
        )
        _check_loaded(results, load, t, ex)


@pytest.mark.rule("CKPT-3", "CONF-1")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.pool
@FEWER
@given(grid_cases(even=True))
def test_an_even_grid_saved_in_the_implementations_forms_loads_on_another_world(
    impl: Impl, pools: Any, form: str, c: dict[str, Any]
) -> None:
    _grid_round_trip(impl, pools, form, c)


# 7 rows on 2 ranks: rows 0-3 and 4-6 (CHUNK-1), loaded on 1 rank.
FOUR_THREE = {"save_world": 2, "load_world": 1, "parts": [2], "copies": 1,
              "load": {"kind": "dtensor", "mesh": [1], "placements": [["R"]]},
              "tensor": torch.arange(7, dtype=torch.float32)}  # fmt: skip
# 1 row on 2 ranks: row 0, and an empty cell (CHUNK-1), loaded on 1 rank.
ONE_ROW_TWO_CELLS = {**FOUR_THREE, "tensor": torch.arange(1, dtype=torch.float32)}


@pytest.mark.rule("CKPT-3", "CKPT-4", "CONF-1")
@pytest.mark.parametrize(
    "form",
    [
        "boxes",
        pytest.param(
            "rank_offsets",
            marks=pytest.mark.known_defect(
                "megatron",
                "from_rank_offsets derives the global shape from each rank's local shape: an "
                "uneven split gives ranks different global shapes, which only rank 0's "
                "validation sees (an AssertionError); the other ranks wait in a collective",
                raises=AssertionError,
                match=r"megatron\.save: rank 0 raised AssertionError: .*rank 1 still waiting",
            ),
        ),
        pytest.param(
            "grid",
            marks=[
                pytest.mark.known_defect(
                    "megatron",
                    "a grid stated with axis_fragmentations needs every offset divisible by "
                    "the local shape: the rank of an uneven chunk refuses its own description "
                    "while the others enter the save's collectives and wait there (repro "
                    "megatron-grid-uneven-split-hangs)",
                    raises=AssertionError,
                    match=r"megatron\.save: rank 0 still waiting.*; rank 1 raised "
                    r"CheckpointingException: Global offset \(4\) must be divisible by local "
                    r"shape",
                ),
                pytest.mark.known_defect(
                    "megatron",
                    "a grid with an empty cell (fewer rows than cells): the empty cell's rank "
                    "passes its own checks, and rank 0's global validation, which asserts "
                    "that every cell has one local shape, fails a bare assert while the "
                    "others wait in the save's collectives (repro "
                    "megatron-grid-empty-cell-asserts-on-rank-0)",
                    raises=AssertionError,
                    match=r"megatron\.save: rank 0 raised AssertionError: \(\([\d, ]*\), "
                    r"\([\d, ]*\), ShardedTensor\(.*still waiting in a collective",
                ),
            ],
        ),
    ],
)
@pytest.mark.pool
@FEWER
@given(grid_cases(even=False))
@example(FOUR_THREE)
@example(ONE_ROW_TWO_CELLS)
def test_an_uneven_grid_saved_in_the_implementations_forms_loads_on_another_world(
    impl: Impl, pools: Any, form: str, c: dict[str, Any]
) -> None:
    _grid_round_trip(impl, pools, form, c)


def _gap_or_overlap(layout: Layout) -> bool:
    """Every box in bounds (a box out of bounds holds no tensor to save), and some element in
    no box or in two different non-empty boxes (or twice on one rank): what a checkpoint
    cannot hold. Empty boxes hold nothing, and replicas are saved once."""
    if not all(
        o + n <= side
        for s in layout.shards
        for o, n, side in zip(s.box.offsets, s.box.sizes, layout.shape)
    ):
        return False
    count = torch.zeros(layout.shape, dtype=torch.int32)
    for box in {s.box for s in layout.shards}:
        count[box.slices()] += 1
    placed = [(s.box, s.rank) for s in layout.shards if not s.box.is_empty]
    twice = len(set(placed)) != len(placed)
    return twice or bool((count == 0).any()) or bool((count > 1).any())


def _in_world(layout: Layout) -> Layout:
    """``layout`` with its ranks folded into the pools' world sizes."""
    from shardspec.testing.devices import max_world_size

    return _on_ranks(layout, max(1, min(4, max_world_size())))


# Rows 0-1 on rank 0, rows 3-4 on rank 1: row 2 is in no chunk.
GAP = Layout((5,), [Shard(Box((0,), (2,)), 0), Shard(Box((3,), (2,)), 1)])
# A 0-d tensor twice on rank 0.
SCALAR_TWICE_ON_A_RANK = Layout((), [Shard(Box((), ()), 0), Shard(Box((), ()), 0)])
# Rows 0-1 on rank 0 twice, rows 2-3 on rank 1: rows 0-1 are saved twice.
TWICE_ON_A_RANK = Layout(
    (4,),
    [Shard(Box((0,), (2,)), 0), Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)],
)


@pytest.mark.rule("CKPT-4", "CONF-2")
@pytest.mark.known_defect(
    "megatron",
    "Megatron leaves a layout with a gap or an overlap to torch's global-plan check, which "
    "runs on rank 0 only: rank 0 raises, the other ranks write their data files and wait in "
    "a collective",
    raises=AssertionError,
    match=r"^save\.outcome=\{0: 'raised \w+: .*', 1: 'still waiting in a collective",
)
@pytest.mark.known_defect(
    "megatron",
    "a 0-d tensor stated twice on one rank, each as its main copy: Megatron leaves overlaps to "
    "torch's global-plan check, which skips 0-d tensors, and the save keeps one of the two "
    "without a word (repro megatron-0d-tensor-twice-on-a-rank-saved-silently)",
    raises=AssertionError,
    match=r"^save\.outcome=\{0: 'returned'(?:, \d+: 'returned')*\}, but should be 'raised on "
    r"every rank' \[save on \d+ ranks of layout\(\(\),",
)
@pytest.mark.pool
@FEWER
@given(st.builds(_in_world, perturbed_layouts(max_ranks=4)).filter(_gap_or_overlap), st.data())
@example(GAP, None)
@example(TWICE_ON_A_RANK, None)
@example(SCALAR_TWICE_ON_A_RANK, None)
def test_a_save_of_an_invalid_layout_is_refused_on_every_rank(
    impl: Impl, pools: Any, layout: Layout, data: Any
) -> None:
    world = max([s.rank for s in layout.shards], default=0) + 1
    t = (
        torch.arange(max(layout.numel, 1), dtype=torch.int32)[: layout.numel].reshape(layout.shape)
        if data is None
        else data.draw(tensors(layout.shape, dtypes()))
    )
    ex = f"save on {world} ranks of {describe_layout(layout)}, dtype={t.dtype}"
    with case(), tempfile.TemporaryDirectory(prefix="shardspec-invalid-") as path:
        outcome = impl.checkpoint_save_outcomes(pools(world), layout, t, path, ex)
        if any(not v.startswith("raised") for v in outcome.values()):
            fail("save.outcome", outcome, "raised on every rank", ex, rule="CKPT-4")
        assert_equal("files named .metadata", (Path(path) / ".metadata").exists(), False, ex)


DAMAGES = ("missing data file", "truncated data file", "no .metadata")


@st.composite
def damage_cases(draw: st.DrawFn) -> dict[str, Any]:
    save_world, load_world = draw(world_sizes()), draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=2, max_side=6).filter(lambda s: 0 not in s))
    # storable: an empty chunk where another starts is DCP's own defect (test_checkpoint.py)
    saved = _on_ranks(draw(valid_layouts(st.just(shape), replicas=False)), save_world)
    saved = storable(_one_per_box(saved))
    dst = _nonempty(_on_ranks(draw(valid_layouts(st.just(shape), replicas=False)), load_world))
    return {"save_world": save_world, "load_world": load_world, "saved": saved, "dst": dst,
            "damage": draw(st.sampled_from(DAMAGES)), "file": draw(st.integers(0, 7)),
            "tensor": draw(tensors(shape, dtypes()))}  # fmt: skip


def _needed_chunks(path: str) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of every stored non-empty chunk of ``t``: a load of all of ``t``
    reads each of them."""
    from shardspec.checkpoint.dcp_metadata import read_metadata

    md = read_metadata(path)
    where = {(i.fqn, tuple(i.offset or ())): v for i, v in md.storage_data.items()}
    chunks = md.state_dict_metadata["t"].chunks  # type: ignore[union-attr]
    infos = [where[("t", tuple(c.offsets))] for c in chunks if 0 not in tuple(c.sizes)]
    return sorted({(Path(path) / v.relative_path, v.offset, v.length) for v in infos})


def _damage(path: str, damage: str, index: int) -> str:
    """Damage the checkpoint at ``path``: remove its ``.metadata``, or remove or cut short
    (in the middle of a chunk) a data file that a load reads; returns what was done."""
    if damage == "no .metadata":
        (Path(path) / ".metadata").unlink()
        return "removed .metadata"
    victim, offset, length = _needed_chunks(path)[index % len(_needed_chunks(path))]
    if damage == "missing data file":
        victim.unlink()
        return f"removed {victim.name}"
    size, cut = victim.stat().st_size, offset + length // 2
    with open(victim, "r+b") as f:
        f.truncate(cut)
    return f"cut {victim.name} from {size} to {cut} bytes (inside a chunk)"


# Saved on 2 ranks (rows 0-1, rows 2-3), rank 1's file cut short, loaded on 2 ranks of which
# rank 0 reads only rank 0's rows.
HALF_DAMAGED = {"save_world": 2, "load_world": 2,
                "saved": Layout((4,), [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)]),
                "dst": Layout((4,), [Shard(Box((0,), (2,)), 0), Shard(Box((2,), (2,)), 1)]),
                "damage": "truncated data file", "file": 1,
                "tensor": torch.arange(4, dtype=torch.float32)}  # fmt: skip


@pytest.mark.rule("CKPT-16", "CONF-2")
@pytest.mark.known_defect(
    "megatron",
    "Megatron loads with no_dist=True: each rank reads alone, so a rank whose reads miss the "
    "damaged file returns as if the load succeeded while the others raise",
    raises=AssertionError,
    match=r"^load\.outcome=\{.*'returned'.*\}, but should be 'raised on every rank'",
)
@pytest.mark.pool
@FEWER
@given(damage_cases())
@example(HALF_DAMAGED)
def test_a_damaged_checkpoint_is_refused_on_every_rank(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    t, saved, dst = c["tensor"], c["saved"], c["dst"]
    with case(), tempfile.TemporaryDirectory(prefix="shardspec-damaged-") as path:
        ex = f"save on {c['save_world']} ranks of {describe_layout(saved)}, dtype={t.dtype}"
        outcome = impl.checkpoint_save_outcomes(pools(c["save_world"]), saved, t, path, ex)
        assert_equal("save.outcome", outcome, dict.fromkeys(outcome, "returned"), ex)
        done = _damage(path, c["damage"], c["file"])
        ex = f"{ex}; {done}; load on {c['load_world']} ranks into {describe_layout(dst)}"
        outcome = impl.checkpoint_load_outcomes(pools(c["load_world"]), path, dst, t, ex)
        if any(not v.startswith("raised") for v in outcome.values()):
            fail("load.outcome", outcome, "raised on every rank", ex, rule="CKPT-16")


@st.composite
def peer_cases(draw: st.DrawFn) -> dict[str, Any]:
    save_world, load_world = draw(world_sizes()), draw(world_sizes())
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    # storable: an empty chunk where another starts is DCP's own known defect (CKPT-4), which
    # test_checkpoint.py's round trips show; here the question is only whether we read it
    saved = _on_ranks(draw(valid_layouts(st.just(shape), replicas=False)), save_world)
    saved = storable(_one_per_box(saved))
    return {"save_world": save_world, "load_world": load_world, "saved": saved,
            "dst": storable(_one_per_box(_on_ranks(draw(valid_layouts(st.just(shape),
                                                                       replicas=False)),
                                                    load_world))),
            "tensor": draw(tensors(shape, dtypes()))}  # fmt: skip


def _cli(*argv: str) -> tuple[int, str]:
    from shardspec.checkpoint.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(list(argv))
    return rc, out.getvalue()


# Two empty chunks of different shapes at one offset (valid: CKPT-1) share one stored archive;
# `verify` called the other's shape wrong until it took any empty shape for an empty chunk.
EMPTIES_AT_ONE_OFFSET = {
    "save_world": 1,
    "load_world": 1,
    "saved": Layout((0, 1, 0), [Shard(Box((0, 0, 0), (0, 0, 0)), 0),
                                Shard(Box((0, 0, 0), (0, 1, 0)), 0)]),
    "dst": Layout((0, 1, 0), [Shard(Box((0, 0, 0), (0, 1, 0)), 0)]),
    "tensor": torch.zeros((0, 1, 0)),
}  # fmt: skip


@pytest.mark.rule("CKPT-21", "CKPT-9", "CONF-1")
@pytest.mark.pool
@FEWER
@given(peer_cases())
@example(EMPTIES_AT_ONE_OFFSET)
def test_a_peers_checkpoint_is_read_by_shardspecs_tools(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    t, saved, dst = c["tensor"], c["saved"], c["dst"]
    ex = (
        f"{impl.name} save on {c['save_world']} ranks of {describe_layout(saved)}, "
        f"dtype={t.dtype}; shardspec inspect, verify, load on {c['load_world']} ranks into "
        f"{describe_layout(dst)}"
    )
    with case(), tempfile.TemporaryDirectory(prefix="shardspec-peer-") as path:
        impl.peer_checkpoint(pools(c["save_world"]), saved, t, path, ex)
        for command in ("inspect", "verify"):
            rc, text = _cli(command, path)
            assert_equal(f"shardspec {command}.exit status", rc, 0, f"{ex}\n{text}", "CKPT-21")
        from shardspec.checkpoint.dcp_metadata import read_metadata

        md = read_metadata(path).state_dict_metadata["t"]
        assert_equal("metadata.size", tuple(md.size), tuple(t.shape), ex, "CKPT-21")
        assert_equal("metadata.dtype", md.properties.dtype, t.dtype, ex, "CKPT-21")
        args = {"kind": "sharded", "layout": layout_to_json(dst), "path": path, "fill": 1,
                "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "via": "shardspec"}  # fmt: skip
        one = torch.ones((), dtype=t.dtype)
        pool = pools(c["load_world"])
        inputs = [[one.expand(b.sizes).contiguous() for b in dst.boxes_of(r)]
                  for r in range(pool.world_size)]  # fmt: skip
        results = pool.run("checkpoint.load", args, per_rank_tensors=inputs, example=ex)
        _check_loaded(results, {"kind": "sharded", "layout": layout_to_json(dst)}, t, ex)
        # and shardspec's collective load (CKPT-23, CKPT-24), reading each way
        for reads in ("own", "once"):
            how = f"{ex}; shardspec.checkpoint.load(reads={reads!r})"
            collective = {**args, "reads": reads, "tensor_only": True}
            results = pool.run("checkpoint.collective_load", collective,
                               per_rank_tensors=inputs, example=how)  # fmt: skip
            errors = [r.value["error"] for r in results]
            assert_equal("load errors", errors, [None] * len(errors), how, "CKPT-23")
            _check_loaded(results, {"kind": "sharded", "layout": layout_to_json(dst)}, t, how)
        assert os.path.isdir(path)
