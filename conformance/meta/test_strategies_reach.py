"""The strategies behind the validation, specs, serialization, resharding, flattening and
checkpoint tools areas reach the edges where seeded defects hid: layouts of 64 shards and more
(where a validator may switch algorithm) with one box straddling a cell boundary, many ranks
in a drawn order, every kind of malformed JSON, mixed element sizes in one stream unpacked
into non-contiguous out= views, a rank with nothing local; chunks that meet several of the
other layout's, a change on a chunk's last element or in a high byte, a replica changed on
its last owner or in the last key of a state dict."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import NoSuchExample

from conformance import reference
from conformance.strategies import dtensor_pool_cases, fsdp_cases, fsdp_meshes
from conformance.strategies.agreement import disagreement_cases, replica_cases, replicas_of
from conformance.strategies.checkpoint import diff_cases, offline_cases
from conformance.strategies.grids import (
    LARGE_FROM,
    STRADDLE_KINDS,
    chunkings_with_many_ranks,
    large_chunk_layouts,
    large_grid_layouts,
    near_grid_layouts,
    scale_worlds,
)
from conformance.strategies.json import FAULTS, malformed_layout_json
from conformance.strategies.refit import refit_cases
from conformance.strategies.streams import (
    RUN_LENGTHS,
    flatten_cases,
    reshard_cases,
    run_length_cases,
    state_dict_cases,
)
from shardspec.metadata import Layout

# Found, not shrunk: shrinking a 300-shard layout costs minutes and proves nothing more.
FIND = settings(max_examples=300, database=None, phases=[Phase.generate])


def reaches(
    strategy: Any, condition: Callable[[Any], bool], what: str, tries: settings = FIND
) -> None:
    try:
        find(strategy, condition, settings=tries)
    except NoSuchExample:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"{strategy!r} never produced {what}")


def _large(layout: Layout) -> bool:
    return len(layout.shards) >= LARGE_FROM


def _is_grid_of_cells(layout: Layout) -> bool:
    """Every dim's distinct intervals tile the dim (a product grid)."""
    for d, n in enumerate(layout.shape):
        ivs = sorted({(s.box.offsets[d], s.box.sizes[d]) for s in layout.shards if s.box.numel})
        end = 0
        for o, z in ivs:
            if o != end:
                return False
            end = o + z
        if end != n:
            return False
    return True


def _short_in_a_spanned_dim(layout: Layout) -> bool:
    """Some box is one or more elements short in a dim that all the other boxes span."""
    for d, n in enumerate(layout.shape):
        full = [s for s in layout.shards if s.box.offsets[d] == 0 and s.box.sizes[d] == n]
        if len(full) == len(layout.shards) - 1 and len(full) > 1 and n > 1:
            return True
    return False


def test_small_near_grids_straddle_every_way_and_fall_short_in_spanned_dims() -> None:
    for kind in STRADDLE_KINDS:
        reaches(
            near_grid_layouts(min_cells=2, max_cells=24),
            lambda lk, kind=kind: lk[1] == kind and lk[0].ndim >= 2,
            f"a small 2-D+ near-grid straddling by {kind!r}",
        )
    reaches(
        near_grid_layouts(min_cells=2, max_cells=24),
        lambda lk: _short_in_a_spanned_dim(lk[0]) and not reference.is_valid(lk[0]),
        "a box short in a dim every other box spans",
    )
    reaches(
        near_grid_layouts(),
        lambda lk: _large(lk[0]) and _short_in_a_spanned_dim(lk[0]),
        "a large near-grid with a box short in a spanned dim",
    )
    reaches(
        large_chunk_layouts(),
        lambda lay: _short_in_a_spanned_dim(lay) and not reference.is_valid(lay),
        "a large chunking with a box short in a dim every chunk spans",
    )


@pytest.mark.parametrize("kind", STRADDLE_KINDS)
def test_near_grids_are_large_and_straddle_every_way(kind: str) -> None:
    want_valid = kind == "take"
    reaches(
        near_grid_layouts(),
        lambda lk: lk[1] == kind and _large(lk[0]) and reference.is_valid(lk[0]) == want_valid,
        f"a >= {LARGE_FROM}-shard near-grid straddling by {kind!r} "
        f"({'valid' if want_valid else 'invalid'})",
    )


def test_a_valid_straddle_is_not_a_product_grid() -> None:
    reaches(
        near_grid_layouts(),
        lambda lk: reference.is_valid(lk[0]) and not _is_grid_of_cells(lk[0]),
        "a valid near-grid that is not a product grid",
    )


def test_large_grids_reach_hundreds_of_shards_empties_and_replicas() -> None:
    strat = large_grid_layouts()
    reaches(strat, lambda lay: len(lay.shards) >= 200, "a grid of 200 shards or more")
    reaches(
        strat,
        lambda lay: _large(lay) and any(s.box.is_empty for s in lay.shards),
        "a large grid with an empty shard",
    )
    reaches(
        strat,
        lambda lay: len({s.box for s in lay.shards}) < len(lay.shards),
        "a large grid with a replica",
    )
    reaches(strat, lambda lay: lay.ndim == 3, "a 3-D large grid")


def test_large_chunkings_are_valid_or_one_row_off() -> None:
    strat = large_chunk_layouts()
    reaches(strat, lambda lay: _large(lay) and reference.is_valid(lay), "a valid large chunking")
    reaches(strat, lambda lay: not reference.is_valid(lay), "a large chunking one row off")
    reaches(
        strat,
        lambda lay: sum(s.box.is_empty for s in lay.shards) >= 2,
        "a large chunking with more ranks than rows",
    )


def test_chunkings_reach_many_ranks_and_rank_gaps() -> None:
    strat = chunkings_with_many_ranks()
    reaches(strat, lambda lay: len(set(lay.ranks)) >= LARGE_FROM, f">= {LARGE_FROM} ranks")
    reaches(
        strat,
        lambda lay: len(set(lay.ranks)) >= 3 and max(lay.ranks) >= 2 * len(set(lay.ranks)) - 1,
        "ranks numbered with gaps",
    )


@pytest.mark.parametrize("fault", FAULTS)
def test_malformed_json_reaches_every_fault(fault: str) -> None:
    many = settings(FIND, max_examples=2000)  # small texts: cheap to draw
    reaches(
        malformed_layout_json(), lambda m: m.fault == fault, f"a text with fault {fault!r}", many
    )


def _sizes(c: dict[str, Any]) -> set[int]:
    return {e["tensor"].element_size() for e in c["entries"]}


def _moved_whole(c: dict[str, Any]) -> set[int]:
    """The lengths of the 1-D tensors that go whole from one rank to another."""
    out = set()
    for e in c["entries"]:
        src, dst = e["src"].shards, e["dst"].shards
        if e["tensor"].dim() == 1 and len(src) == len(dst) == 1 and src[0].rank != dst[0].rank:
            out.add(e["tensor"].numel())
    return out


@settings(max_examples=30, database=None)
@given(run_length_cases())
def test_run_length_cases_move_every_length_whole_between_two_ranks(c: dict[str, Any]) -> None:
    assert set(range(1, RUN_LENGTHS + 1)) <= _moved_whole(c)


def test_run_length_cases_reach_the_direct_threshold_and_strided_runs() -> None:
    from shardspec.reshard.schedule import DIRECT_BYTES

    strat = run_length_cases()

    def at_threshold(c: dict[str, Any]) -> bool:
        sizes = {
            (e["tensor"].numel() * e["tensor"].element_size(), e["tensor"].element_size())
            for e in c["entries"]
            if e["tensor"].numel() in _moved_whole(c)
        }
        return any(
            {(DIRECT_BYTES - item, item), (DIRECT_BYTES, item), (DIRECT_BYTES + item, item)}
            <= sizes
            for item in (1, 2, 4, 8)
        )

    reaches(strat, at_threshold, "pieces one element either side of DIRECT_BYTES")
    reaches(
        strat,
        lambda c: any(
            e["tensor"].dim() == 2
            and e["tensor"].shape[0] > 1
            and any(s.box.sizes[1] < e["tensor"].shape[1] for s in e["src"].shards)
            for e in c["entries"]
        ),
        "a 2-D tensor cut by columns (strided runs)",
    )
    reaches(strat, lambda c: c["budget"] == 96, "a budget that cuts runs into windows")


def test_state_dicts_mix_element_sizes_into_non_contiguous_outs() -> None:
    strat = state_dict_cases()
    reaches(strat, lambda c: {1, 8} <= _sizes(c), "1-byte and 8-byte tensors in one state dict")
    reaches(strat, lambda c: {1, 2, 4} <= _sizes(c), "1-, 2- and 4-byte tensors together")
    reaches(
        strat,
        lambda c: any(e["out"] == "strided" and e["tensor"].numel() > 1 for e in c["entries"]),
        "a strided out= view",
    )
    reaches(
        strat,
        lambda c: any(
            e["out"] == "transposed" and e["tensor"].dim() >= 2 and min(e["tensor"].shape) > 1
            for e in c["entries"]
        ),
        "a transposed (non-contiguous) out= view",
    )
    reaches(
        strat,
        lambda c: any(e["out"] == "offset" for e in c["entries"]),
        "an out= view at an offset",
    )
    reaches(
        strat,
        lambda c: (
            any(not e["src"].boxes_of(r) for e in c["entries"] for r in range(c["world"]))
            and c["world"] > 1
        ),
        "a rank holding no source shard of a key",
    )
    reaches(
        strat,
        lambda c: (
            c["budget"] is not None
            and sum(e["tensor"].numel() * e["tensor"].element_size() for e in c["entries"])
            > c["budget"]
        ),
        "a buffer bound smaller than the data",
    )
    reaches(
        strat,
        lambda c: any(e["tensor"].dtype == torch.bool for e in c["entries"]),
        "a bool tensor in the stream",
    )


def test_flatten_cases_leave_a_rank_with_nothing_local() -> None:
    strat = flatten_cases()
    reaches(
        strat,
        lambda c: len(c["owners"]) < c["mesh"][0] * c["mesh"][1],
        "a rank holding nothing of the buffer",
    )
    reaches(
        strat,
        lambda c: c["mesh"][0] > 1 and c["mesh"][1] > 1 and c["tp_dim"] > 0,
        "a 2-D mesh with TP on a dim other than 0",
        # about 1 draw in 20 (93 of 2,000 counted): 300 tries missed it once in a CI run
        settings(FIND, max_examples=1000),
    )
    reaches(
        strat,
        lambda c: c["weight"].shape[0] < c["mesh"][0],
        "fewer weight rows than FSDP ranks (an empty FSDP chunk)",
    )


SIM = "8,64,512,1024"


def test_fsdp_meshes_reach_hsdp_on_a_few_ranks() -> None:
    reaches(fsdp_meshes(), lambda m: len(m) == 3 and math.prod(m) == 4, "a 3-D mesh of 4 ranks")
    reaches(fsdp_meshes(), lambda m: len(m) == 4, "a 4-D mesh")


def test_fsdp_meshes_on_simulated_worlds_start_at_1024_and_reach_every_edge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", SIM)
    # The simplest example, which a run of a few examples starts with, is the largest world.
    assert math.prod(find(fsdp_meshes(), lambda m: True)) == 1024
    reaches(fsdp_meshes(), lambda m: len(m) == 4 and math.prod(m) == 1024, "a 4-D 1024 mesh")
    reaches(
        fsdp_meshes(),
        lambda m: len(m) == 3 and math.prod(m) == 512 and 1 not in m,
        "a 3-D HSDP x TP mesh of 512 without size-1 dims",
    )
    reaches(fsdp_meshes(), lambda m: m[-2] > 255 or m[-1] > 255, "dp or tp of more than 255")
    reaches(fsdp_meshes(), lambda m: 1 in m and math.prod(m) > 255, "a size-1 dim at scale")


def test_validation_layouts_on_simulated_worlds_reach_1024_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", SIM)
    worlds = scale_worlds()
    assert worlds == (1024, 512, 64)
    first = find(large_chunk_layouts(worlds=worlds), lambda lay: True)
    assert len(first.shards) == 1024 and max(first.ranks) == 1023
    reaches(
        large_chunk_layouts(worlds=worlds),
        lambda lay: len(lay.shards) == 1024 and not reference.is_valid(lay),
        "a 1024-rank chunking one row off",
    )
    reaches(
        near_grid_layouts(worlds=worlds),
        lambda lk: len(lk[0].shards) == 1024 and lk[0].ndim == 3 and not reference.is_valid(lk[0]),
        "a 3-D 1024-cell grid with a straddling box",
    )
    reaches(
        large_grid_layouts(worlds=worlds),
        lambda lay: len(lay.shards) >= 1024 and lay.ndim == 2,
        "a 2-D grid of 1024 cells",
    )


# -- the large-world edges of every strategy conformance_scale runs -----------------------
def _holders_above_255(layout: Layout) -> int:
    return len({s.rank for s in layout.shards if s.box.numel and s.rank > 255})


def _dtensor_holders_above_255(case: Any) -> int:
    shape, mesh, placements = case
    coords = reference.mesh_coordinates(mesh)
    return sum(
        1
        for rank, c in enumerate(coords)
        if rank > 255
        and all(reference.dtensor_indices(shape, mesh, placements, c))
        and math.prod(shape)
    )


def _fsdp_holders_above_255(case: Any) -> int:
    shape, mesh, tp = case
    *_, dp, tps = mesh
    n = 0
    for rank in range(256, math.prod(mesh)):
        p, t = divmod(rank % (dp * tps), tps)
        sides = list(shape)
        if tp[0] == "S":
            a, b = reference.chunk_intervals(sides[tp[1]], tps)[t]
            sides[tp[1]] = b - a
        a, b = reference.chunk_intervals(sides[0], dp)[p]
        sides[0] = b - a
        n += math.prod(sides) > 0
    return n


def first_example(strategy: Any) -> Any:
    """The example a run tries first (every choice at its simplest), as a run of
    conformance_scale's 3 examples does: not shrunk, which costs minutes at this size."""
    seen: list[Any] = []

    @settings(
        max_examples=1,
        database=None,
        phases=[Phase.generate],
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(x: Any) -> None:
        seen.append(x)

    run()
    return seen[0]


def _ci_sim_worlds() -> list[str]:
    """The SHARDSPEC_SIM_WORLDS values .ci/run gives conformance_scale: CI's own worlds must
    reach the edges too, not only the session's default."""
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    return sorted(set(re.findall(r"SHARDSPEC_SIM_WORLDS=([0-9,]+)", ci)))


@pytest.mark.parametrize("sim", [SIM, *_ci_sim_worlds()])
def test_scale_strategies_start_with_data_on_more_than_16_ranks_above_255(
    monkeypatch: pytest.MonkeyPatch, sim: str
) -> None:
    """The simplest example, the first of every run of conformance_scale (3 examples a
    property), already holds data on more than 16 ranks above 255, on the session's default
    worlds and on each set of worlds CI runs whose largest is above 255."""
    largest = max(int(w) for w in sim.split(","))
    if largest <= 255:
        pytest.skip(f"worlds {sim} have no rank above 255 (CI's smaller run)")
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", sim)
    first = first_example(reshard_cases())
    assert first["world"] == largest and _holders_above_255(first["src"]) > 16, first["src"]
    case = first_example(dtensor_pool_cases(max_world=16))
    assert math.prod(case[1]) == largest and _dtensor_holders_above_255(case) > 16, case
    case = first_example(fsdp_cases())
    assert math.prod(case[1]) == largest and _fsdp_holders_above_255(case) > 16, case
    lay = first_example(large_chunk_layouts(worlds=scale_worlds()))
    assert _holders_above_255(lay) > 16


def test_reshard_cases_at_scale_reach_the_large_world_edges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", SIM)
    reaches(
        reshard_cases(),
        lambda c: _holders_above_255(c["src"]) > 16 and _holders_above_255(c["dst"]) > 16,
        "both layouts with data on more than 16 ranks above 255",
    )
    reaches(
        reshard_cases(),
        lambda c: c["world"] > 255 and 0 < max(c["tensor"].shape) < c["world"],
        "more ranks than rows",
    )
    reaches(
        reshard_cases(),
        lambda c: c["world"] > 255 and max(c["tensor"].shape) > c["world"],
        "a dim longer than the world",
    )
    reaches(reshard_cases(), lambda c: c["world"] == 8, "the smallest simulated world")


def test_dtensor_pool_cases_at_scale_reach_the_large_world_edges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", SIM)
    strat = dtensor_pool_cases(max_world=16)
    reaches(
        strat,
        lambda c: len(c[1]) >= 2 and _dtensor_holders_above_255(c) > 16,
        "a multi-dim mesh with data on more than 16 ranks above 255",
    )
    reaches(
        strat,
        lambda c: math.prod(c[1]) > 255 and 1 in c[1] and _dtensor_holders_above_255(c) > 16,
        "a mesh dim of size 1 at scale",
    )
    reaches(
        strat,
        lambda c: any(
            p[0] == "S" and c[1][m] > c[0][p[1]] > 0 and c[1][m] > 255 for m, p in enumerate(c[2])
        ),
        "a mesh dim of more ranks than the rows it shards",
    )
    # the LocalTensorMode worlds passed explicitly get the same shapes
    reaches(
        dtensor_pool_cases(worlds=(8, 1024)),
        lambda c: math.prod(c[1]) == 1024 and _dtensor_holders_above_255(c) > 16,
        "data above rank 255 on an explicit world",
    )


def test_fsdp_cases_at_scale_reach_the_large_world_edges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSPEC_SIM_WORLDS", SIM)
    reaches(
        fsdp_cases(),
        lambda c: len(c[1]) >= 3 and c[1][-2] > 1 and _fsdp_holders_above_255(c) > 16,
        "HSDP x TP with data on more than 16 ranks above 255",
    )
    reaches(
        fsdp_cases(),
        lambda c: c[1][-2] > c[0][0] and math.prod(c[1]) > 255,
        "more FSDP ranks than rows",
    )
    reaches(fsdp_cases(), lambda c: 1 in c[1] and math.prod(c[1]) > 255, "a size-1 mesh dim")


def _meets(a: Any, b: Any) -> bool:
    return a.intersect(b) is not None and a.numel > 0 and b.numel > 0


def _fed_by_several(target: Layout, saved: Layout) -> bool:
    """Some target chunk is filled from two or more saved chunks."""
    return any(sum(_meets(t.box, s.box) for s in saved.shards) >= 2 for t in target.shards)


def test_offline_cases_cross_layouts_and_reach_replicas_empties_and_like() -> None:
    strat = offline_cases()
    reaches(
        strat,
        lambda c: (
            c["target"]["kind"] == "sharded"
            and c["saved"].ndim >= 2
            and _fed_by_several(c["target"]["layout"], c["saved"])
        ),
        "a 2-D+ target chunk filled from several saved chunks",
    )
    reaches(
        strat,
        lambda c: (
            c["target"]["kind"] == "dtensor"
            and ["R"] in c["target"]["placements"]
            and len(c["target"]["mesh"]) == 2
        ),
        "a DTensor target on a 2-D mesh with a replicated dim",
    )
    reaches(
        strat,
        lambda c: c["how"] == "like" and any(s.box.is_empty for s in c["target"]["layout"].shards),
        "a --like target with an empty chunk",
    )


def _chunk_edge(c: dict[str, Any]) -> bool:
    """The change sits on the last element of a chunk, not the tensor's last element."""
    shape = c["a"].shape
    n = math.prod(shape)
    for lay in (c["a"], c["b"]):
        for s in lay.shards:
            if s.box.numel:
                last = 0
                for o, z, side in zip(s.box.offsets, s.box.sizes, shape):
                    last = last * side + o + z - 1
                if last == c["change"]["index"] != n - 1:
                    return True
    return False


# The tools' cases draw a kind of change, a dtype and a place each: a given combination is
# one draw in fifty or so, so these look further than FIND's 300 (each stops when it finds).
TOOLS = settings(FIND, max_examples=1500)


def test_diff_cases_change_chunk_edges_high_bytes_nan_payloads_and_bounds() -> None:
    strat = diff_cases()
    reaches(strat, _chunk_edge, "a change on a chunk's last element inside the tensor")
    reaches(
        strat,
        lambda c: c["change"]["kind"] == "high_byte" and c["tensor_a"].element_size() >= 2,
        "a change in the high byte of a multi-byte element",
    )
    reaches(
        strat,
        lambda c: c["change"]["kind"] == "nan_payload" and c["tensor_a"].dtype == torch.bfloat16,
        "two bfloat16 NaNs of different payloads",
        TOOLS,
    )
    reaches(
        strat,
        lambda c: c["options"] in (["--atol", "0.5"], ["--rtol", "0.25"]),
        "a change exactly on the tolerance's bound",
        TOOLS,
    )
    reaches(
        strat,
        lambda c: _fed_by_several(c["a"], c["b"]) and _fed_by_several(c["b"], c["a"]),
        "layouts where chunks of each side meet several of the other",
    )


def test_disagreement_cases_reach_a_bystander_and_the_last_key() -> None:
    strat = disagreement_cases()
    reaches(
        strat,
        lambda c: (
            c["odd"] is not None and c["odd"]["rank"] not in (c["odd"]["from"], c["odd"]["to"])
        ),
        "a copy differing on a rank that neither held nor gets the box",
    )
    reaches(
        strat,
        lambda c: (
            c["odd"] is not None
            and c["odd"]["side"] == "dst"
            and c["odd"]["key"] == c["entries"][-1]["key"]
            and len(c["entries"]) >= 2
        ),
        "the last key's dst of a state dict",
        TOOLS,
    )
    reaches(strat, lambda c: c["odd"] is None and c["world"] >= 3, "the control on 3+ ranks")


def test_replica_cases_reach_the_last_owner_the_last_key_and_high_bytes() -> None:
    strat = replica_cases()
    reaches(
        strat,
        lambda c: (
            c["bad"] is not None
            and len(c["bad"]["others"]) >= 2
            and c["bad"]["owner"] > max(c["bad"]["others"])
        ),
        "the last of three or more owners changed",
        TOOLS,
    )
    reaches(
        strat,
        lambda c: (
            c["bad"] is not None
            and c["bad"]["entry"] == len(c["entries"]) - 1 >= 1
            and any(not replicas_of(e["src"]) for e in c["entries"])
        ),
        "the last key of a state dict changed, beside a key without replicas",
    )
    reaches(
        strat,
        lambda c: (
            c["bad"] is not None
            and c["bad"]["kind"] == "high_byte"
            and c["entries"][c["bad"]["entry"]]["tensor"].element_size() >= 4
        ),
        "the high byte of a 4-byte or wider element",
    )
    reaches(
        strat,
        lambda c: (
            c["bad"] is not None
            and c["bad"]["index"] > 0
            and c["bad"]["index"] == c["bad"]["box"].numel - 1
        ),
        "the last element of a box of several",
    )


def _kv_replicated(case: dict[str, Any]) -> bool:
    """A qkv_proj whose KV head (a non-empty box) more than one serving rank holds."""
    for name, layout in case["dst"].items():
        if name.endswith("qkv_proj.weight"):
            owners: dict[Any, set[int]] = {}
            for s in layout.shards:
                if s.box.numel:
                    owners.setdefault(s.box, set()).add(s.rank)
            if any(len(ranks) > 1 for ranks in owners.values()):
                return True
    return False


def test_refit_cases_reach_kv_heads_replicated_over_a_larger_tp() -> None:
    """vLLM's layout when the TP degree exceeds the KV heads (REFIT-3): the drawn refits
    reach it, so a refit that drops or misplaces a replica of a KV head is caught."""
    reaches(refit_cases(), _kv_replicated, "a qkv_proj with a KV head on several ranks")
