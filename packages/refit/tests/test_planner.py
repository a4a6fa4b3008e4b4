"""The recipe vocabulary, the geometry and the per-rank planner in one process (REFIT-1,
REFIT-2, REFIT-4, REFIT-5, REFIT-11, REFIT-13): every rank's plan, carried out by hand from
the full sources, gives the reference's tensors bit for bit."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings, strategies as st
from refit_cases import geometric_cases

from shardspec.metadata import Box, Layout, Shard, chunk_layout
from shardspec.refit import (
    RefitError,
    Source,
    Target,
    concat,
    packed_layout,
    plan_refit,
    recipe,
    recipe_from_data,
    recipe_to_data,
    reference,
    scale_layout,
    unstack,
)
from shardspec.refit.executor import _as_source
from shardspec.refit.models import dense_to_vllm, moe_to_vllm
from shardspec.refit.planner import Job
from shardspec.refit.recipe import Recipe
from shardspec.reshard.reference import same_bits
from shardspec.testing.tensors import random_tensor

WORLD = 4


def carry_out(
    r: Recipe, full: dict[str, torch.Tensor], src: dict[str, Layout], dst: dict[str, Layout]
) -> dict[str, dict[int, list[torch.Tensor]]]:
    """What each rank's plan puts in its boxes (geometric recipes): zeros where it says
    padding, and each job's source box where it says the job lands."""
    got: dict[str, dict[int, list[torch.Tensor]]] = {t.name: {} for t in r.targets}
    for rank in range(WORLD):
        p = plan_refit(r, src, dst, rank)
        for tp in p.targets:
            dtype = full[tp.sources[0]].dtype
            got[tp.target.name][rank] = [torch.full(b.sizes, 7, dtype=dtype) for b in tp.boxes]
            for j, region in tp.zeros:
                got[tp.target.name][rank][j][region.relative_to(tp.boxes[j]).slices()].zero_()
        for job in p.jobs:
            tp = next(t for t in p.targets if t.target.name == job.target)
            for j, region in job.dst_mine:
                view = got[job.target][rank][j][region.relative_to(tp.boxes[j]).slices()]
                assert job.part.source is not None
                _as_source(view, job).copy_(
                    full[job.part.source][job.part.to_source(region).slices()]
                )
    return {n: {r_: ts for r_, ts in by.items() if ts} for n, by in got.items()}


def expected(
    r: Recipe, full: dict[str, torch.Tensor], src: dict[str, Layout], dst: dict[str, Layout]
) -> dict[str, dict[int, list[torch.Tensor]]]:
    shards = {
        n: {q: [t[b.slices()] for b in src[n].boxes_of(q)] for q in src[n].ranks}
        for n, t in full.items()
    }
    return reference.refit(r, shards, src, dst)


def assert_same(
    got: dict[str, dict[int, list[torch.Tensor]]], want: dict[str, dict[int, list[torch.Tensor]]]
) -> None:
    for n, by in want.items():
        for rank, ts in by.items():
            have = got[n].get(rank, [])
            assert len(have) == len(ts)
            for k, (a, b) in enumerate(zip(have, ts)):
                assert same_bits(a, b), f"{n!r} rank {rank} box #{k}: {a} should be {b}"


@pytest.mark.rule("REFIT-2", "REFIT-4", "REFIT-5", "REFIT-11")
@settings(max_examples=80, deadline=None)
@given(geometric_cases())
def test_every_ranks_plan_carried_out_gives_the_reference(
    case: tuple[Recipe, dict[str, torch.Tensor], dict[str, Layout], dict[str, Layout]],
) -> None:
    r, full, src, dst = case
    assert_same(carry_out(r, full, src, dst), expected(r, full, src, dst))


@pytest.mark.rule("REFIT-2")
@settings(max_examples=50, deadline=None)
@given(geometric_cases())
def test_a_plan_names_only_its_own_ranks_boxes(
    case: tuple[Recipe, dict[str, torch.Tensor], dict[str, Layout], dict[str, Layout]],
) -> None:
    """Each rank's plan holds its own destination boxes and its own source shards only; the
    jobs' regions and the padding tile each of its boxes exactly once."""
    r, _, src, dst = case
    for rank in range(WORLD):
        p = plan_refit(r, src, dst, rank)
        for tp in p.targets:
            assert tp.boxes == dst[tp.target.name].boxes_of(rank)
            covered = [0] * len(tp.boxes)
            for j, region in tp.zeros:
                covered[j] += region.numel
            for job in p.jobs:
                assert len(job.src_mine) <= len(src[job.part.source or ""].boxes_of(rank))
                for j, region in job.dst_mine:
                    covered[j] += region.numel
            assert covered == [b.numel for b in tp.boxes]


def walked(job: Job, src: Layout, dst: Layout, rank: int) -> tuple[Any, ...]:
    """A job's layouts and this rank's inputs and outputs by walking every shard of both
    layouts (the planner asks an index of their boxes instead)."""
    sub, part = job.sub, job.part
    shards, mine_src, counts = [], [], dict[int, int]()
    for s in src.shards:
        i = counts[s.rank] = counts.get(s.rank, -1) + 1
        cut = s.box.intersect(sub)
        if cut is not None:
            shards.append(Shard(cut.relative_to(sub), s.rank))
            if s.rank == rank:
                mine_src.append((i, cut.relative_to(s.box)))
    out, mine_dst, counts = [], [], {}
    for s in dst.shards:
        j = counts[s.rank] = counts.get(s.rank, -1) + 1
        cut = s.box.intersect(part.region)
        if cut is not None:
            out.append(Shard(part.to_source(cut).relative_to(sub), s.rank))
            if s.rank == rank:
                mine_dst.append((j, cut))
    return tuple(shards), tuple(mine_src), tuple(out), tuple(mine_dst)


@pytest.mark.rule("REFIT-2")
@settings(max_examples=80, deadline=None)
@given(geometric_cases())
def test_a_jobs_layouts_are_every_shard_cut_to_its_window(
    case: tuple[Recipe, dict[str, torch.Tensor], dict[str, Layout], dict[str, Layout]],
) -> None:
    """Shards in order (local order is part of a layout), replicas, empty boxes and several
    boxes a rank included: what the reshard executor moves is what walking every shard gives."""
    r, _, src, dst = case
    for rank in range(WORLD):
        for job in plan_refit(r, src, dst, rank).jobs:
            assert job.part.source is not None
            shards, mine_src, out, mine_dst = walked(job, src[job.part.source], dst["x"], rank)
            whole = src[job.part.source]
            part = job.part
            if (
                whole.shape == dst["x"].shape
                and part.region == Box.full(whole.shape)
                and part.dims == tuple(range(whole.ndim))
                and not any(part.src_offsets)
            ):  # the destination is the source element for element: its layout as it is
                assert job.src is whole and job.dst is dst["x"]
                assert job.dst_mine == tuple(enumerate(dst["x"].boxes_of(rank)))
            else:
                assert job.dst.shards == out
                assert job.dst_mine == mine_dst
            if job.sub == Box.full(whole.shape):  # the source as it is, empty boxes and all
                assert job.src is whole
                assert job.src_mine == tuple(
                    (i, Box.full(b.sizes)) for i, b in enumerate(whole.boxes_of(rank))
                )
            else:
                assert job.src.shards == shards
                assert job.src_mine == mine_src


@pytest.mark.rule("REFIT-1")
@settings(max_examples=30, deadline=None)
@given(geometric_cases())
def test_a_recipe_survives_its_data_form(
    case: tuple[Recipe, dict[str, torch.Tensor], dict[str, Layout], dict[str, Layout]],
) -> None:
    r = case[0]
    assert recipe_from_data(recipe_to_data(r)) == r


@pytest.mark.rule("REFIT-1")
@pytest.mark.parametrize(
    "data",
    [
        [["x", ["Source", 3]]],
        [["x", ["Concat", [["Source", "a"]], 0, 1]]],
        [["x", ["Bogus", "a"]]],
        [["x", ["Pad", ["Source", "a"], 0]]],
        [["x", ["Cast", ["Cast", ["Source", "a"], "float16"], "float32"]]],
        [["x", ["Source", "a"]], ["x", ["Source", "b"]]],
    ],
)
def test_malformed_recipe_data_is_refused(data: object) -> None:
    with pytest.raises(RefitError):
        recipe_from_data(data)


@pytest.mark.rule("REFIT-1")
def test_a_recipe_holds_targets_each_name_once() -> None:
    """An FP8 target's scales count as a name too: a target called like them is refused."""
    from shardspec.refit import QuantizeFP8

    with pytest.raises(RefitError, match="holds Targets"):
        recipe([Target("x", Source("a")), ("y", Source("b"))])  # type: ignore[list-item]
    with pytest.raises(RefitError, match="'x' is defined twice"):
        recipe([Target("x", Source("a")), Target("x", Source("b"))])
    with pytest.raises(RefitError, match="'x_scale_inv' is defined twice"):
        recipe([Target("x", QuantizeFP8(Source("a"))), Target("x_scale_inv", Source("b"))])


@pytest.mark.rule("REFIT-1")
def test_value_steps_only_wrap_the_whole_expression() -> None:
    from shardspec.refit import Cast, QuantizeFP8

    with pytest.raises(RefitError, match="'x'"):
        recipe([Target("x", concat([Cast(Source("a"), "float16"), "b"]))])
    with pytest.raises(RefitError, match="outermost"):
        recipe([Target("x", Cast(QuantizeFP8(Source("a")), "float32"))])
    recipe([Target("x", QuantizeFP8(Cast(Source("a"), "bfloat16")))])


@pytest.mark.rule("REFIT-5")
def test_unstack_gives_each_slice_its_own_name() -> None:
    full = {"w": random_tensor((3, 2, 4), torch.float32, 9)}
    r = recipe(unstack(["e0", "e1", "e2"], "w"))
    src = {"w": chunk_layout((3, 2, 4), 2, [0, 1])}
    dst = {f"e{i}": chunk_layout((2, 4), 0, [i, 3]) for i in range(3)}
    got = carry_out(r, full, src, dst)
    assert same_bits(got["e1"][1][0], full["w"][1, :1])
    assert_same(got, expected(r, full, src, dst))


@pytest.mark.rule("REFIT-13")
def test_the_built_in_recipes_name_vllms_tensors() -> None:
    dense = dense_to_vllm(2, 11, tied=True, qkv_bias=True, fp8=True)
    outs = dense.outputs()
    assert "model.layers.1.self_attn.qkv_proj.weight" in outs
    assert "model.layers.1.self_attn.qkv_proj.weight_scale_inv" in outs
    assert "model.layers.0.self_attn.qkv_proj.bias" in outs
    assert "model.layers.0.mlp.gate_up_proj.weight_scale_inv" in outs
    assert "lm_head.weight" in outs and "lm_head.weight" not in dense.sources()
    moe = moe_to_vllm(1, 11, 4, style="qwen_moe")
    assert "model.layers.0.mlp.experts.w13_weight" in moe.outputs()
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in moe.sources()
    with pytest.raises(ValueError, match="style"):
        moe_to_vllm(1, 11, 4, style="deepseek")


@pytest.mark.rule("REFIT-3")
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),
    st.integers(1, 3),
    st.integers(1, 4),
)
def test_a_packed_layout_is_each_parts_chunk_on_each_rank_in_part_order(
    heads: list[int], unit: int, tp: int
) -> None:
    sizes = [h * unit for h in heads]
    layout = packed_layout((sum(sizes), 2), 0, sizes, list(range(tp)), unit).validate()
    for rank in range(tp):
        boxes = layout.boxes_of(rank)
        assert len(boxes) == len(sizes)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for b, start, n in zip(boxes, starts, sizes):
            split = math.ceil(n // unit / tp) * unit
            lo = min(rank * split, n)
            assert (b.offsets[0], b.sizes[0]) == (start + lo, min(lo + split, n) - lo)
            assert b.offsets[0] % unit == 0 and b.sizes[0] % unit == 0


@pytest.mark.rule("REFIT-6")
def test_a_destination_of_the_wrong_shape_is_refused_naming_it() -> None:
    r = recipe([Target("x", concat(["a", "b"]))])
    src = {"a": chunk_layout((2, 2), 0, [0]), "b": chunk_layout((3, 2), 0, [0])}
    with pytest.raises(RefitError, match=r"destination 'x'.*shape"):
        plan_refit(r, src, {"x": chunk_layout((4, 2), 0, [1])}, 0)
    with pytest.raises(RefitError, match="Concat"):
        plan_refit(
            r,
            {"a": chunk_layout((2, 2), 0, [0]), "b": chunk_layout((3, 3), 0, [0])},
            {"x": chunk_layout((5, 2), 0, [1])},
            0,
        )
    gap = Layout.from_boxes((5, 2), [(Box((0, 0), (4, 2)), 1)])
    with pytest.raises(RefitError, match="destination 'x'"):
        plan_refit(r, src, {"x": gap}, 0)


@pytest.mark.rule("REFIT-7")
def test_a_scale_layout_given_must_be_the_blocks_of_its_weights_boxes_in_order() -> None:
    from shardspec.refit import QuantizeFP8

    r = recipe([Target("w", QuantizeFP8(concat(["w"], 0), (2, 2)))])
    src = {"w": chunk_layout((4, 4), 0, [0])}
    w = Layout.from_boxes(
        (4, 4), [(Box((0, 0), (2, 4)), 1), (Box((2, 0), (2, 4)), 1)]
    )  # two boxes on rank 1: their scales are its two scale tensors, in this order
    blocks = [(Box((0, 0), (1, 2)), 1), (Box((1, 0), (1, 2)), 1)]
    fine = Layout.from_boxes((2, 2), blocks)
    plan_refit(r, src, {"w": w, "w_scale_inv": fine}, 1)
    plan_refit(r, src, {"w": w}, 1)  # or left to the planner
    swapped = Layout.from_boxes((2, 2), blocks[::-1])
    assert swapped == fine  # the same boxes: only the local order differs
    # two ranks listed the other way round: each one's local order is the same, so accepted
    two = Layout.from_boxes((4, 4), [(Box((0, 0), (2, 4)), 1), (Box((2, 0), (2, 4)), 2)])
    turned = Layout.from_boxes((2, 2), [(Box((1, 0), (1, 2)), 2), (Box((0, 0), (1, 2)), 1)])
    assert turned.fingerprint() != scale_layout(two, (2, 2)).fingerprint()
    plan_refit(r, src, {"w": two, "w_scale_inv": turned}, 2)
    for wrong in (swapped, Layout.from_boxes((2, 2), [(Box((0, 0), (2, 2)), 1)]), "rows"):
        with pytest.raises(RefitError, match=r"'w_scale_inv'.*local order"):
            plan_refit(r, src, {"w": w, "w_scale_inv": wrong}, 1)  # type: ignore[dict-item]


@pytest.mark.rule("REFIT-2")
def test_recipes_and_plans_need_no_torch() -> None:
    """Planning is plain integers: importing the package, building a recipe and planning a
    rank import no torch (a planner process or a launcher need not pay for it)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from shardspec.metadata import chunk_layout\n"
        "from shardspec.refit import Target, concat, pad, plan_refit, recipe\n"
        "from shardspec.refit.models import dense_to_vllm, moe_to_vllm\n"
        "dense_to_vllm(2, 11, tied=True, fp8=True), moe_to_vllm(1, 11, 4)\n"
        "r = recipe([Target('x', pad(concat(['a', 'b']), 0, 8))])\n"
        "src = {n: chunk_layout((3, 2), 0, [0, 1]) for n in 'ab'}\n"
        "p = plan_refit(r, src, {'x': chunk_layout((8, 2), 0, [2, 3])}, 3)\n"
        "assert p.jobs and p.targets[0].zeros\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr
