"""Refit on real gloo ranks (spec/10-refit.md), one pool of 4 ranks for the module; every
rank's outputs are compared with the single-process reference bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from refit_cases import Case, check, geometric_cases, run_engine, run_refit, run_twice

from shardspec.metadata import Layout, chunk_layout
from shardspec.refit import (
    RefitError,
    Target,
    concat,
    packed_layout,
    pad,
    quantize_fp8,
    recipe,
    recipe_to_data,
    rename,
    stack,
)
from shardspec.refit.models import dense_to_vllm, moe_to_vllm
from shardspec.reshard.reference import same_bits
from shardspec.testing import RankPool, get_pool
from shardspec.testing.tensors import random_tensor

WORLD = 4


@pytest.fixture
def pool() -> RankPool:
    return get_pool(WORLD, timeout=120)


def run(pool: RankPool, case: Case) -> list[object]:
    return pool.call(run_refit, per_rank=[case.args(r) for r in range(WORLD)])


def gqa_case(
    tp: list[int],
    train: list[int],
    dtype: torch.dtype = torch.float32,
    heads: tuple[int, int] = (7, 2),
    replicate: tuple[int, ...] = (),
) -> Case:
    """q of 7 heads, k and v of 2 (head_dim 2, hidden 3): uneven under TP 2 and TP 3.
    ``heads``: other (q, kv) head counts; ``replicate``: packed_layout's, for KV heads."""
    hd, hidden = 2, 3
    sizes = {"q": heads[0] * hd, "k": heads[1] * hd, "v": heads[1] * hd}
    full = {n: random_tensor((s, hidden), dtype, i) for i, (n, s) in enumerate(sizes.items())}
    r = recipe([Target("qkv", concat(["q", "k", "v"], 0))])
    src = {n: chunk_layout(t.shape, 0, train) for n, t in full.items()}
    shape = (sum(sizes.values()), hidden)
    dst = {"qkv": packed_layout(shape, 0, list(sizes.values()), tp, hd, replicate=replicate)}
    return Case(f"gqa tp={tp} train={train} heads={heads} replicate={replicate}", r, full, src, dst)


@pytest.mark.rule("REFIT-2", "REFIT-3", "REFIT-14")
@pytest.mark.parametrize(
    ("tp", "train"),
    [([2, 3], [0, 1]), ([1, 2, 3], [0, 1]), ([0, 1, 2], [0, 1, 2, 3]), ([3, 0], [2])],
)
def test_packed_gqa_qkv_under_tp_matches_the_reference(
    pool: RankPool, tp: list[int], train: list[int]
) -> None:
    """TP 2 and 3 with uneven heads per rank; disjoint, overlapping and colocated sides."""
    case = gqa_case(tp, train)
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-2", "REFIT-3", "REFIT-14")
@pytest.mark.parametrize(
    ("tp", "train", "heads"),
    [([0, 1, 2, 3], [0, 1], (4, 1)), ([3, 2, 1, 0], [1, 2, 3], (8, 2)), ([2, 3], [0], (2, 1))],
)
def test_kv_heads_fewer_than_tp_are_replicated_as_vllm_replicates_them(
    pool: RankPool, tp: list[int], train: list[int], heads: tuple[int, int]
) -> None:
    """TP 4 over 1 and 2 KV heads, TP 2 over 1: every serving rank gets its KV heads' copy,
    each from the one training rank that holds it (a replicated destination)."""
    case = gqa_case(tp, train, heads=heads, replicate=(1, 2))
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-3", "REFIT-14")
@pytest.mark.parametrize("tp", [[2, 3], [1, 2, 3]])
def test_an_engines_packed_parameter_is_written_in_place(pool: RankPool, tp: list[int]) -> None:
    """One qkv tensor per serving rank (its q, k and v chunks end to end, as vLLM holds it),
    written through views: its storage stays, and it reads as the reference's boxes in order."""
    case = gqa_case(tp, [0, 1])
    answers = pool.call(
        run_engine,
        per_rank=[
            (recipe_to_data(case.recipe), case.state(r), case.src, case.dst, 0)
            for r in range(WORLD)
        ],
    )
    want = case.expected()["qkv"]
    for rank, (engines, in_place) in enumerate(answers):
        assert in_place, f"rank {rank}: the engine's tensor moved"
        if rank in want:
            assert same_bits(engines["qkv"], torch.cat(want[rank])), f"rank {rank}"
        else:
            assert engines == {}


@pytest.mark.rule("REFIT-2", "REFIT-3")
def test_the_packed_layout_holds_each_ranks_chunk_of_each_part_in_part_order() -> None:
    """By hand: q 14 rows, k and v 4 (heads of 2) on 3 ranks: rank 0 holds q[0:6], k[0:2],
    v[0:2]; rank 2 holds q[12:14] and empty chunks of k and v."""
    layout = packed_layout((22, 3), 0, [14, 4, 4], [5, 6, 7], unit=2)
    rows = {r: [(b.offsets[0], b.stops[0]) for b in layout.boxes_of(r)] for r in (5, 6, 7)}
    assert rows == {
        5: [(0, 6), (14, 16), (18, 20)],
        6: [(6, 12), (16, 18), (20, 22)],
        7: [(12, 14), (18, 18), (22, 22)],
    }


@pytest.mark.rule("REFIT-3")
def test_replicated_kv_heads_follow_vllms_shard_id_by_hand() -> None:
    """vLLM's QKVParallelLinear at TP 4 over 8 query heads and 2 KV heads (head_dim 1):
    ``num_kv_head_replicas = 4 // 2``, and rank r loads KV head ``r // 2``; q stays chunked.
    With 3 KV heads over TP 4 vLLM refuses the TP degree, and so does the layout."""
    layout = packed_layout((12, 1), 0, [8, 2, 2], [0, 1, 2, 3], 1, replicate=(1, 2)).validate()
    rows = {r: [(b.offsets[0], b.stops[0]) for b in layout.boxes_of(r)] for r in range(4)}
    assert rows == {
        0: [(0, 2), (8, 9), (10, 11)],
        1: [(2, 4), (8, 9), (10, 11)],
        2: [(4, 6), (9, 10), (11, 12)],
        3: [(6, 8), (9, 10), (11, 12)],
    }
    # as many KV heads as ranks or more: chunked as without replicate
    assert packed_layout((12, 1), 0, [4, 4, 4], [0, 1, 2, 3], replicate=(1, 2)) == packed_layout(
        (12, 1), 0, [4, 4, 4], [0, 1, 2, 3]
    )
    with pytest.raises(RefitError, match=r"part 1 has 3 units of 1 over 4 ranks"):
        packed_layout((14, 1), 0, [8, 3, 3], [0, 1, 2, 3], replicate=(1, 2))
    with pytest.raises(RefitError, match=r"replicate names parts \[3\]"):
        packed_layout((12, 1), 0, [8, 2, 2], [0, 1, 2, 3], replicate=(3,))


@pytest.mark.rule("REFIT-4", "REFIT-14")
@pytest.mark.parametrize("tp", [[2, 3], [1, 2, 3]])
def test_a_vocabulary_not_divisible_by_tp_is_padded_with_zeros(
    pool: RankPool, tp: list[int]
) -> None:
    vocab, hidden = 11, 3
    full = {"emb": random_tensor((vocab, hidden), torch.bfloat16, 5)}
    r = recipe([Target("emb", pad("emb", 0, 12)), Target("head", pad("emb", 0, 12))])
    src = {"emb": chunk_layout((vocab, hidden), 0, [0, 1])}
    dst = {n: chunk_layout((12, hidden), 0, tp) for n in ("emb", "head")}
    case = Case(f"padded vocab tp={tp}", r, full, src, dst)
    want = case.expected()
    assert (want["emb"][tp[-1]][0][-1] == 0).all()  # the padding row is zeros
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-5", "REFIT-14")
def test_experts_stacked_and_split_by_expert_parallelism(pool: RankPool) -> None:
    """Mixtral-style: 3 experts' w1/w3 packed into w13 [3, 2I, H] and w2 stacked [3, H, I],
    EP over ranks 2 and 3 (2 experts and 1), from experts sharded on ranks 0 and 1."""
    r = moe_to_vllm(1, 5, 3, padded=6)
    shapes = {}
    for n in r.sources():
        if "w2" in n:
            shapes[n] = (4, 6)
        elif ".w1." in n or ".w3." in n:
            shapes[n] = (6, 4)
        elif "embed" in n or "lm_head" in n:
            shapes[n] = (5, 4)
        elif "gate.weight" in n:
            shapes[n] = (3, 4)
        elif "proj" in n:
            shapes[n] = (4, 4) if "o_proj" in n or "q_proj" in n else (2, 4)
        else:
            shapes[n] = (4,)
    full = {n: random_tensor(s, torch.float32, i) for i, (n, s) in enumerate(shapes.items())}
    src = {n: chunk_layout(s, 0, [0, 1]) for n, s in shapes.items()}
    geo = {t.name: t for t in r.targets}
    dst: dict[str, Layout] = {}
    for name in geo:
        shape = {
            "w13_weight": (3, 12, 4),
            "w2_weight": (3, 4, 6),
        }.get(name.rsplit(".", 1)[-1])
        if shape is not None:
            dst[name] = chunk_layout(shape, 0, [2, 3])
    e = "model.layers.0.block_sparse_moe.experts"
    assert set(dst) == {f"{e}.w13_weight", f"{e}.w2_weight"}
    for t in r.targets:
        if t.name not in dst:
            from shardspec.refit.geometry import geometry

            g = geometry(t.expr, dict(shapes), t.name)
            dst[t.name] = Layout.replicated(g.shape, [2, 3])
    case = Case("moe ep=2", r, full, src, dst)
    want = case.expected()
    w13 = torch.stack(
        [torch.cat([full[f"{e}.{x}.w1.weight"], full[f"{e}.{x}.w3.weight"]]) for x in range(3)]
    )
    assert same_bits(want[f"{e}.w13_weight"][2][0], w13[:2])
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-7", "REFIT-8", "REFIT-10", "REFIT-14")
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_blocks_on_the_ranks_that_hold_them(pool: RankPool, ue8m0: bool) -> None:
    """A 9x7 weight (partial edge blocks of 4x4), with an all-zero block, cast to bf16 first,
    row-split over ranks 2 and 3 on a block boundary, from a column split on ranks 0 and 1."""
    w = random_tensor((9, 7), torch.float32, 3) * 100
    w[4:8, 0:4] = 0
    from shardspec.refit import Cast, QuantizeFP8

    r = recipe(
        [
            Target(
                "w",
                QuantizeFP8(Cast(concat(["a", "b"], 0, packed=False), "bfloat16"), (4, 4), ue8m0),
            )
        ]
    )
    full = {"a": w[:5].clone(), "b": w[5:].clone()}
    src = {n: chunk_layout(t.shape, 1, [0, 1]) for n, t in full.items()}
    dst = {
        "w": Layout.from_boxes(
            (9, 7), [(b, r_) for b, r_ in _rows((9, 7), [(0, 4), (4, 9)], [2, 3])]
        )
    }
    case = Case(f"fp8 ue8m0={ue8m0}", r, full, src, dst)
    want = case.expected()
    assert want["w_scale_inv"][3][0][0, 0].item() == 1.0  # the all-zero block
    check(case, run(pool, case), WORLD)


def _rows(
    shape: tuple[int, int], bounds: list[tuple[int, int]], ranks: list[int]
) -> list[tuple[object, int]]:
    from shardspec.metadata import Box

    return [(Box((lo, 0), (hi - lo, shape[1])), r) for (lo, hi), r in zip(bounds, ranks)]


@pytest.mark.rule("REFIT-13", "REFIT-14")
@pytest.mark.parametrize("fp8", [False, True])
def test_the_dense_recipe_from_fsdp_to_tp_on_other_ranks(pool: RankPool, fp8: bool) -> None:
    """Llama-like, 1 layer, GQA (4 heads, 2 kv heads of 2), vocabulary 11 padded to 12, tied
    embeddings, bf16: FSDP on ranks 0-1 to TP 2 on ranks 2-3 (and FP8 blocks of 2x2)."""
    r = dense_to_vllm(1, 11, 12, tied=True, fp8=fp8, block=(2, 2))
    h, hd = 4, 2
    p = "model.layers.0"
    shapes = {
        "model.embed_tokens.weight": (11, h),
        "model.norm.weight": (h,),
        f"{p}.self_attn.q_proj.weight": (4 * hd, h),
        f"{p}.self_attn.k_proj.weight": (2 * hd, h),
        f"{p}.self_attn.v_proj.weight": (2 * hd, h),
        f"{p}.self_attn.o_proj.weight": (h, 4 * hd),
        f"{p}.mlp.gate_proj.weight": (8, h),
        f"{p}.mlp.up_proj.weight": (8, h),
        f"{p}.mlp.down_proj.weight": (h, 8),
        f"{p}.input_layernorm.weight": (h,),
        f"{p}.post_attention_layernorm.weight": (h,),
    }
    full = {n: random_tensor(s, torch.bfloat16, i) for i, (n, s) in enumerate(shapes.items())}
    src = {n: chunk_layout(s, 0, [0, 1]) for n, s in shapes.items()}
    tp = [2, 3]
    dst = {
        f"{p}.self_attn.qkv_proj.weight": packed_layout((16, h), 0, [8, 4, 4], tp, hd),
        f"{p}.self_attn.o_proj.weight": chunk_layout((h, 8), 1, tp),
        f"{p}.mlp.gate_up_proj.weight": packed_layout((16, h), 0, [8, 8], tp),
        f"{p}.mlp.down_proj.weight": chunk_layout((h, 8), 1, tp),
        "model.embed_tokens.weight": chunk_layout((12, h), 0, tp),
        "lm_head.weight": chunk_layout((12, h), 0, tp),
    }
    for n in (
        "model.norm.weight",
        f"{p}.input_layernorm.weight",
        f"{p}.post_attention_layernorm.weight",
    ):
        dst[n] = Layout.replicated((h,), tp)
    case = Case(f"dense fp8={fp8}", r, full, src, dst)
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-14")
@pytest.mark.parametrize(
    ("train", "serve"),
    [([0, 1, 2, 3], [3, 2, 1, 0]), ([0, 1], [2, 3]), ([0], [1]), ([2], [2])],
    ids=["colocated", "disjoint", "idle-ranks", "one-rank-both"],
)
def test_colocated_disjoint_and_idle_ranks(
    pool: RankPool, train: list[int], serve: list[int]
) -> None:
    """Ranks that hold neither side still call refit (the group spans everyone) and get no
    tensors; the budget forces several rounds."""
    full = {"x": random_tensor((5, 6), torch.float16, 1), "y": random_tensor((6,), torch.int64, 2)}
    r = recipe([rename("x2", "x"), Target("yx", stack(["y", "y"], 1))])
    src = {"x": chunk_layout((5, 6), 1, train), "y": chunk_layout((6,), 0, train)}
    dst = {"x2": chunk_layout((5, 6), 0, serve), "yx": chunk_layout((6, 2), 0, serve)}
    case = Case(f"{train}->{serve}", r, full, src, dst, budget=24)
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-15")
def test_a_second_refit_after_the_source_changes_delivers_the_new_values(pool: RankPool) -> None:
    case = gqa_case([2, 3], [0, 1])
    new = {n: t * 2 + 1 for n, t in case.full.items()}
    case2 = Case("second", case.recipe, new, case.src, case.dst)
    answers = pool.call(
        run_twice,
        per_rank=[
            (
                recipe_to_data(case.recipe),
                case.state(r),
                case2.state(r),
                case.src,
                case.dst,
                case.args(r)[4],
                None,
            )
            for r in range(WORLD)
        ],
    )
    first, second = case.expected(), case2.expected()
    for rank, (one, two, same, hit) in enumerate(answers):
        assert same, f"rank {rank}: the second refit moved an out tensor"
        assert hit == 1, f"rank {rank}: the second refit planned again ({hit} cache hits)"
        for k, t in enumerate(first["qkv"].get(rank, [])):
            assert same_bits(one["qkv"][k], t)
            assert same_bits(two["qkv"][k], second["qkv"][rank][k]), (
                f"rank {rank}: the second refit left stale values"
            )


@pytest.mark.rule("REFIT-14")
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(geometric_cases(), st.sampled_from([None, 16, 64]))
def test_drawn_recipes_and_layouts_on_gloo_ranks_match_the_reference(
    pool: RankPool, case: tuple[Any, ...], budget: int | None
) -> None:
    r, full, src, dst = case
    c = Case("drawn", r, full, src, dst, budget)
    check(c, run(pool, c), WORLD)


def ep_tp_layout(
    shape: tuple[int, ...], groups: list[list[int]], dim: int, parts: list[int]
) -> Layout:
    """Experts (dim 0) split over expert-parallel groups, each group's slice packed along
    ``dim`` over its tensor-parallel ranks."""
    from shardspec.metadata import Box, Shard, chunk_bounds

    shards = []
    for (lo, hi), ranks in zip(chunk_bounds(shape[0], len(groups)), groups):
        inner = packed_layout((hi - lo, *shape[1:]), dim, parts, ranks)
        for s in inner.shards:
            offs = (lo + s.box.offsets[0], *s.box.offsets[1:])
            shards.append(Shard(Box(offs, s.box.sizes), s.rank))
    return Layout(shape, shards)


@pytest.mark.rule("REFIT-5", "REFIT-7", "REFIT-13", "REFIT-14")
@pytest.mark.parametrize("fp8", [False, True])
def test_experts_under_ep_and_tp_colocated_with_fsdp(pool: RankPool, fp8: bool) -> None:
    """4 experts (I = 4, H = 4) trained under FSDP on all 4 ranks, served EP 2 x TP 2 on the
    same ranks: w13 packed (gate then up) along dim 1, w2 split along dim 2; FP8 blocks of
    2x2 on each expert's slice."""
    e, i, h = 4, 4, 4
    gate = [f"experts.{x}.w1" for x in range(e)]
    up = [f"experts.{x}.w3" for x in range(e)]
    down = [f"experts.{x}.w2" for x in range(e)]
    w13 = stack([concat([g, u], 0) for g, u in zip(gate, up)])
    w2 = stack(down)
    targets = [Target("w13_weight", w13), Target("w2_weight", w2)]
    if fp8:
        targets = [Target(t.name, quantize_fp8(t.expr, (2, 2))) for t in targets]
    r = recipe(targets)
    shapes = dict.fromkeys(gate + up, (i, h)) | dict.fromkeys(down, (h, i))
    full = {n: random_tensor(s, torch.bfloat16, k) for k, (n, s) in enumerate(shapes.items())}
    src = {n: chunk_layout(s, 0, [0, 1, 2, 3]) for n, s in shapes.items()}
    groups = [[0, 1], [2, 3]]
    dst = {
        "w13_weight": ep_tp_layout((e, 2 * i, h), groups, 1, [i, i]),
        "w2_weight": ep_tp_layout((e, h, i), groups, 2, [i]),
    }
    case = Case(f"ep x tp fp8={fp8}", r, full, src, dst)
    check(case, run(pool, case), WORLD)


@pytest.mark.rule("REFIT-4", "REFIT-14")
def test_a_destination_of_padding_alone_takes_its_sources_dtype(pool: RankPool) -> None:
    """Regression (found by the drawn plans): row 0 of an empty bf16 source padded to 16 rows
    is all padding; it was made float32, the dtype of no source."""
    from shardspec.refit import Pad, Select, Source

    r = recipe([Target("x", Select(Pad(Source("s"), 0, 16), 0, 0))])
    full = {"s": torch.zeros((0, 3), dtype=torch.bfloat16)}
    src = {"s": chunk_layout((0, 3), 0, [0])}
    dst = {"x": chunk_layout((3,), 0, [1, 2])}
    case = Case("padding alone", r, full, src, dst)
    assert case.expected()["x"][1][0].dtype == torch.bfloat16
    check(case, run(pool, case), WORLD)
