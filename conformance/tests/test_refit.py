"""Refit (spec/10-refit.md): small Llama-like and Mixtral-like models through the built-in
recipes, from drawn training layouts (FSDP, FSDP x TP, uneven, FSDP x PP) into drawn serving
layouts on 1 to 4 ranks (colocated, disjoint, overlapping, idle ranks; KV heads replicated
where TP exceeds them), in float32, bfloat16 and FP8 blocks, refit once or twice with new
values; every destination rank's tensors against ``shardspec.refit.reference``, bit for bit,
written into the caller's tensors. Packed serving layouts themselves against the oracle's
rows. Megatron-Core's home ground too: the same parameters (renamed or not) from one even
TP x DP x PP grid into another, packed parts split independently, whole parameters
replicated. And the refusals: one rank passing a source box of the wrong shape, leaving a
source out, holding another destination layout or another recipe makes every rank raise the
same RefitError, naming the tensor, with every out= tensor untouched."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings

from conformance import reference as oracle
from conformance.assertions import assert_equal, assert_tensor_bitwise, fail
from conformance.cases import case
from conformance.impls import Impl
from conformance.interface import Unsupported
from conformance.strategies.refit import (
    Model,
    packed_layout_cases,
    refit_case,
    refit_cases,
    refit_subgroup_cases,
    refusal_cases,
    tp_layout,
    tp_reshard_cases,
    turned,
)
from shardspec.refit import reference, scale_layout
from shardspec.testing.devices import simulated_worlds

# Each example is one or two refits of a whole model on up to 4 ranks: a third of the
# profile's examples, never fewer than 20 (or than the profile's own when it asks for fewer).
_N = settings().max_examples
FEWER = settings(max_examples=max(min(_N, 20), _N // 3))
# A refusal moves no data: one exchange of digests. Still a pool call per example.
REFUSALS = settings(max_examples=max(min(_N, 8), _N // 10))
# Small grids of a few parameters, one pool call each.
TP_RESHARDS = settings(max_examples=max(min(_N, 10), _N // 6))


def _shards(full: dict[str, Any], src: dict[str, Any]) -> dict[str, dict[int, list[Any]]]:
    return {
        n: {r: [full[n][b.slices()].clone() for b in layout.boxes_of(r)] for r in layout.ranks}
        for n, layout in src.items()
    }


# Llama-like, 2 kv heads of 2 rows, TP 2 on ranks 2 and 3 from FSDP on ranks 0 and 1: each
# serving rank holds one kv head, so a k part read one row late shows on rank 2.
GQA_TP2 = refit_case(Model(kv_heads=2, gqa=1), 4, [0, 1], [2, 3], placement="disjoint")
# The same model, colocated, in FP8 blocks of 2x2 from bfloat16, refit twice.
FP8_TWICE = refit_case(
    Model(hidden=4, kv_heads=2, gqa=3, inter=4, dtype="bfloat16", block=(2, 2)),
    4, [0, 1, 2, 3], [0, 1, 2, 3], "fsdp_tp", seeds=(1, 2), placement="colocated",
)  # fmt: skip


# Two pipeline stages of 2 training ranks each (layer 0 and the embedding on ranks 0-1, layer
# 1, the final norm and lm_head on 2-3), colocated with TP 4 serving over 2 KV heads (each
# replicated on 2 ranks), refit twice: PP's "stale after the second sync" ground.
PP2_TWICE = refit_case(
    Model(layers=2, kv_heads=2, gqa=2), 4, [0, 1, 2, 3], [0, 1, 2, 3], "fsdp_pp",
    seeds=(3, 4), placement="colocated",
)  # fmt: skip


@pytest.mark.rule("REFIT-2", "REFIT-3", "REFIT-4", "REFIT-5", "REFIT-7", "REFIT-13", "REFIT-14",
                  "REFIT-15")  # fmt: skip
@pytest.mark.pool
@FEWER
@given(refit_cases())
@example(GQA_TP2)
@example(FP8_TWICE)
@example(PP2_TWICE)
def test_every_serving_rank_holds_the_references_bytes(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Round after round (the sources changed in place in between, REFIT-15), each rank holds
    exactly the names the reference gives it, each box bit for bit (REFIT-14)."""
    with case():
        answers = impl.refit(pools(c["world"]), c["recipe"], c["rounds"], c["src"], c["dst"],
                             example=c["ex"])  # fmt: skip
        _check_rounds(c, answers)


@pytest.mark.rule("REFIT-2", "REFIT-14", "REFIT-15")
@pytest.mark.pool
@pytest.mark.skipif(
    bool(simulated_worlds()), reason="a group of some of a pool's gloo ranks; simulated worlds "
    "hold whole worlds (the same refits run on them whole above)"
)  # fmt: skip
@FEWER
@given(refit_subgroup_cases())
def test_a_refit_among_a_subgroup_of_the_ranks_uses_its_group_ranks(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """On the process group of some of the pool's ranks (group rank i is the i-th member,
    not pool rank i): each member holds what the reference gives its group rank, round after
    round, and the ranks outside the group hold nothing."""
    members = c["members"]
    ex = f"on the group of pool ranks {members} of {c['pool']}: {c['ex']}"
    with case():
        answers = impl.refit_on(pools(c["pool"]), members, c["recipe"], c["rounds"], c["src"],
                                c["dst"], example=ex)  # fmt: skip
        assert_equal("len(pool ranks)", len(answers), c["pool"], ex)
        for r, per_round in enumerate(answers):
            if r not in members:
                held = [sorted(got) for got in per_round]
                assert_equal(f"rank{r} (not in the group) holds", held, [[]] * len(held), ex)
        _check_rounds({**c, "ex": ex}, [answers[m] for m in members])


# vLLM's QKVParallelLinear at TP 4 over 8 query heads and 2 KV heads of 2 rows, on ranks
# above 255 in a shuffled order: ranks 300 and 7 share KV head 0, 511 and 256 head 1.
KV_REPLICAS = {"shape": (24, 3), "dim": 0, "parts": [16, 4, 4], "ranks": [300, 7, 511, 256],
               "unit": 2, "replicate": (1, 2),
               "ex": "packed_layout((24, 3), 0, [16, 4, 4], [300, 7, 511, 256], 2, "
                     "replicate=(1, 2))"}  # fmt: skip


@pytest.mark.rule("REFIT-3")
@given(packed_layout_cases())
@example(KV_REPLICAS)
def test_a_packed_tensor_is_each_ranks_chunk_of_each_part_or_its_kv_replica(
    impl: Impl, c: dict[str, Any]
) -> None:
    """Every rank's boxes, in local order: its chunk of each part along the packed dim (or
    the KV head vLLM gives it), whole along every other dim (REFIT-3)."""
    ex, shape, dim = c["ex"], c["shape"], c["dim"]
    with case():
        got = impl.packed_layout(shape, dim, c["parts"], c["ranks"], c["unit"], c["replicate"])
        assert_equal("shape", tuple(got.shape), tuple(shape), ex, "REFIT-3")
        want = oracle.packed_rows(c["parts"], c["unit"], len(c["ranks"]), c["replicate"])
        for rank, rows in zip(c["ranks"], want):
            boxes = got.boxes_of(rank)
            have = [(b.offsets[dim], b.stops[dim]) for b in boxes]
            assert_equal(f"rank{rank}.rows", have, rows, ex, "REFIT-3")
            for k, b in enumerate(boxes):
                whole = [(b.offsets[d], b.sizes[d]) for d in range(len(shape)) if d != dim]
                full = [(0, n) for d, n in enumerate(shape) if d != dim]
                assert_equal(f"rank{rank}.box{k}.other_dims", whole, full, ex, "REFIT-3")
        assert_equal("ranks", sorted(got.ranks), sorted(c["ranks"]), ex, "REFIT-3")


@pytest.mark.rule("REFIT-3")
@pytest.mark.parametrize(
    ("parts", "replicate", "named"),
    [([8, 3, 3], (1, 2), "part 1"), ([8, 2, 2], (3,), "[3]"), ([8, 2, 2], (-1,), "[-1]")],
)
def test_a_packed_layout_vllm_would_refuse_is_refused_naming_the_part(
    impl: Impl, parts: list[int], replicate: tuple[int, ...], named: str
) -> None:
    """3 KV heads over TP 4 (vLLM refuses the degree), a part to replicate that is not
    there: an error that names the part, never a layout."""
    ex = f"packed_layout(({sum(parts)}, 1), 0, {parts}, [0, 1, 2, 3], 1, replicate={replicate})"
    with case():
        try:
            got = impl.packed_layout((sum(parts), 1), 0, parts, [0, 1, 2, 3], 1, replicate)
        except Unsupported:
            raise
        except Exception as e:  # the adapter's own error type: its words are what count
            message = str(e)
        else:
            fail("packed_layout", got, f"an error naming {named}", ex, "REFIT-3")
        assert_equal(f"{named!r} in the error", named in message, True, ex, "REFIT-3")


def _check_rounds(c: dict[str, Any], answers: list[list[dict[str, list[Any]]]]) -> None:
    ex, recipe, src, dst = c["ex"], c["recipe"], c["src"], c["dst"]
    assert_equal("len(ranks)", len(answers), c["world"], ex)
    for i, full in enumerate(c["rounds"]):
        rule = "REFIT-15" if i else "REFIT-14"
        want = reference.refit(recipe, _shards(full, src), src, dst)
        for r, per_round in enumerate(answers):
            assert_equal(f"rank{r}.len(rounds)", len(per_round), len(c["rounds"]), ex)
            got = per_round[i]
            names = sorted(n for n, by_rank in want.items() if r in by_rank)
            assert_equal(f"round{i}.rank{r}.names", sorted(got), names, ex, rule)
            for n in names:
                have, exp = got[n], want[n][r]
                assert_equal(f"round{i}.rank{r}.len({n})", len(have), len(exp), ex, rule)
                for k, (a, b) in enumerate(zip(have, exp)):
                    assert_tensor_bitwise(f"round{i}.rank{r}.{n}[{k}]", a, b, ex, rule)


def _tp_case(
    world: int, train: list[int], t_src: int, serve: list[int], t_dst: int, pp_src: int = 1
) -> dict[str, Any]:
    """A packed parameter of parts of 4 and 8 rows (TP on dim 0) and a row-parallel one of 4
    columns (layer 0), and a whole one (layer 1), float32, refit twice; with ``pp_src`` 2,
    layer 0 trains on the first half of ``train`` and layer 1 on the second."""
    import torch

    from shardspec.metadata import Layout
    from shardspec.refit import Source, Target, recipe
    from shardspec.testing.tensors import random_tensor

    half = len(train) // pp_src
    first, last = train[:half], train[-half:]
    shapes = {"fc1.weight": (12, 2), "fc2.weight": (2, 4), "norm.weight": (3,)}
    src = {"fc1.weight": tp_layout((12, 2), 0, [4, 8], first, t_src),
           "fc2.weight": tp_layout((2, 4), 1, [4], first, t_src),
           "norm.weight": Layout.replicated((3,), last)}  # fmt: skip
    dst = {"fc1.weight": tp_layout((12, 2), 0, [4, 8], serve, t_dst),
           "fc2.weight": tp_layout((2, 4), 1, [4], serve, t_dst),
           "norm.weight": Layout.replicated((3,), serve)}  # fmt: skip
    rounds = [{n: random_tensor(s, torch.float32, seed * 10 + i)
               for i, (n, s) in enumerate(shapes.items())} for seed in (1, 2)]  # fmt: skip
    return {"world": world, "recipe": recipe(Target(n, Source(n)) for n in shapes),
            "rounds": rounds, "src": src, "dst": dst,
            "ex": f"refit(tp reshard fc1 packed 4+8, fc2 row, norm; train={train} TP {t_src} "
                  f"PP {pp_src}, serve={serve} TP {t_dst}, rounds=2)"}  # fmt: skip


# Disjoint: TP 2 on ranks 0-1 into TP 2 on ranks 2-3; colocated: TP 2 x DP 2 into TP 4 on
# the same 4 ranks (each part re-cut into quarters), and TP 2 x PP 2 into TP 4.
TP2_TO_TP2 = _tp_case(4, [0, 1], 2, [2, 3], 2)
DP2_TO_TP4 = _tp_case(4, [0, 1, 2, 3], 2, [0, 1, 2, 3], 4)
PP2_TO_TP4 = _tp_case(4, [0, 1, 2, 3], 2, [0, 1, 2, 3], 4, pp_src=2)


@pytest.mark.rule("REFIT-2", "REFIT-3", "REFIT-14", "REFIT-15")
@pytest.mark.pool
@TP_RESHARDS
@given(tp_reshard_cases())
@example(TP2_TO_TP2)
@example(DP2_TO_TP4)
@example(PP2_TO_TP4)
def test_the_same_parameters_between_tp_dp_and_pp_grids_as_megatron_reshards_them(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Megatron-Core's home ground (``megatron.core.resharding``): the same parameters,
    renamed or not, from one TP x DP x PP grid into another, packed parts split
    independently, whole parameters replicated; every rank's boxes bit for bit, round after
    round."""
    with case():
        _check_rounds(c, impl.refit(pools(c["world"]), c["recipe"], c["rounds"], c["src"],
                                    c["dst"], example=c["ex"]))  # fmt: skip


# Rank 1 of the disjoint GQA case passes its k_proj box one row short.
SHORT_K = {
    **GQA_TP2,
    "fault": {"kind": "shape", "name": "model.layers.0.self_attn.k_proj.weight", "rank": 1},
    "ex": GQA_TP2["ex"] + " fault=shape k_proj on rank 1",
}

_GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"
_TURNED = turned(scale_layout(FP8_TWICE["dst"][_GATE_UP], (2, 2)))
# Every rank gives gate_up_proj's scale layout with rank 0's boxes (gate, up: one size) in
# the other order: the same boxes (== holds), tensors of the right shapes, and the scales of
# one part would land in the other's tensor (REFIT-7).
TURNED_SCALES = {
    **FP8_TWICE,
    "rounds": FP8_TWICE["rounds"][:1],
    "dst": {**FP8_TWICE["dst"], _GATE_UP + "_scale_inv": _TURNED},
    "fault": {"kind": "layout", "name": _GATE_UP + "_scale_inv", "rank": 1, "layout": _TURNED},
    "ex": FP8_TWICE["ex"] + " fault=layout gate_up_proj's scales turned on every rank",
}


@pytest.mark.rule("REFIT-6", "REFIT-7", "REFIT-12")
@pytest.mark.pool
@REFUSALS
@given(refusal_cases())
@example(SHORT_K)
@example(TURNED_SCALES)
def test_one_ranks_mistake_is_the_same_refit_error_on_every_rank_before_data_moves(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    """Every rank raises, every rank's message is the same, every out= tensor still holds
    only the sentinel; a wrong source or destination is named in the message."""
    ex, fault = c["ex"], c["fault"]
    with case():
        results = impl.refit_refused(
            pools(c["world"]), c["recipe"], c["rounds"][0], c["src"], c["dst"],
            fault=fault, example=ex,
        )  # fmt: skip
        assert_equal("len(ranks)", len(results), c["world"], ex)
        for r, got in enumerate(results):
            assert_equal(f"rank{r} raised RefitError", got["error"] is not None, True, ex,
                         "REFIT-12")  # fmt: skip
            assert_equal(f"rank{r}.out= untouched", got["untouched"], True, ex, "REFIT-12")
        messages = sorted({str(got["error"]) for got in results})
        assert_equal("distinct messages of the ranks", len(messages), 1, f"{ex}: {messages}",
                     "REFIT-12")  # fmt: skip
        if fault["kind"] != "recipe":
            assert_equal(f"the message names {fault['name']!r}", fault["name"] in messages[0],
                         True, f"{ex}: {messages[0]}", "REFIT-6")  # fmt: skip
