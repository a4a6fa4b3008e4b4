"""What the Megatron-Core peer's refit adapter tells Megatron (``conformance/peers/megatron/
rosters.py``): each rank's ``ParameterMetadata`` as Megatron's own ``extract_param_metadata``
would read it off a Megatron model in that layout, hand-worked; and what it refuses to
express, with the reason. Pure: runs without Megatron."""

from __future__ import annotations

import pytest

from conformance.peers.megatron.rosters import Inexpressible, rosters, sharding
from conformance.strategies.refit import tp_layout
from shardspec.metadata import Box, Layout, chunk_layout
from shardspec.refit import Concat, Source, Target, recipe


def test_a_packed_parameter_on_tp2_x_dp2_is_its_parts_chunks_and_its_groups() -> None:
    # parts of 4 and 8 rows on ranks 0-3, TP innermost: TP groups [0, 1] and [2, 3]
    got = sharding("fc1", tp_layout((12, 3), 0, [4, 8], [0, 1, 2, 3], 2))
    assert sorted(got) == [0, 1, 2, 3]
    s = got[3]
    assert (s.local_shape, s.is_tp, s.partition_dim, s.partition_sizes) == ((6, 3), True, 0, [2, 4])
    assert (s.tp, s.dp, s.split_dim, s.pieces) == ([2, 3], [1, 3], 0, (2, 4))
    assert (got[0].tp, got[0].dp) == ([0, 1], [0, 2])


def test_a_row_parallel_parameter_splits_dim_1_and_a_whole_one_takes_its_ranks_groups() -> None:
    src = {"w": tp_layout((2, 4), 1, [4], [1, 2], 2), "n": Layout.replicated((3,), [1, 2])}
    r = recipe([Target("w", Source("w")), Target("m", Source("n"))])
    dtypes = {"w": "float32", "n": "bfloat16"}
    meta = rosters(r, src, {"w": src["w"], "m": src["n"]}, dtypes, 3)
    assert meta[0] == {"src": [], "dst": []}
    w, n = meta[2]["src"]
    assert (w["shape"], w["is_tp"], w["partition_dim"], w["partition_sizes"]) == (
        [2, 2],
        True,
        1,
        None,
    )
    assert (w["tp"], w["dp"]) == ([1, 2], [2])
    # the whole parameter: its rank's TP and DP groups, resolved to the target's name
    assert (n["name"], n["resolved_name"], n["dtype"], n["shape"], n["is_tp"]) == (
        "n", "m", "bfloat16", [3], False)  # fmt: skip
    assert (n["tp"], n["dp"]) == ([1, 2], [2])
    assert [m["name"] for m in meta[1]["dst"]] == ["w", "m"]


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        (chunk_layout((5, 2), 0, [0, 1]), "equal, contiguous chunks"),
        (chunk_layout((1, 2), 0, [0, 1]), "equal, contiguous chunks"),
        (
            Layout.from_boxes(
                (4, 4),
                [
                    (Box((0, 0), (2, 2)), 0),
                    (Box((2, 2), (2, 2)), 1),
                    (Box((0, 2), (2, 2)), 2),
                    (Box((2, 0), (2, 2)), 3),
                ],
            ),
            r"split along dims \[0, 1\]",
        ),
        (chunk_layout((4, 2), 0, [1, 0]), "ascending order"),
        (
            Layout.from_boxes(
                (4,), [(Box((0,), (2,)), 0), (Box((2,), (2,)), 1), (Box((0,), (2,)), 2)]
            ),
            "replicates whole TP groups",
        ),
    ],
    ids=["uneven", "empty chunk", "two dims", "out of rank order", "half a replica"],
)
def test_what_megatron_cannot_hold_is_refused_with_the_reason(layout: Layout, why: str) -> None:
    with pytest.raises(Inexpressible, match=why):
        sharding("w", layout)


def test_a_target_built_from_several_sources_is_refused_naming_it() -> None:
    r = recipe([Target("qkv", Concat((Source("q"), Source("k")), 0, packed=True))])
    layouts = {"q": Layout.replicated((2,), [0]), "k": Layout.replicated((2,), [0])}
    with pytest.raises(Inexpressible, match=r"target 'qkv'.*no packing of separate tensors"):
        rosters(
            r, layouts, {"qkv": Layout.replicated((4,), [0])}, {"q": "float32", "k": "float32"}, 1
        )


def test_a_pipeline_stage_holds_only_its_own_layers_parameters() -> None:
    # layer 0 on stage 0 (ranks 0-1, TP 2), layer 1 on stage 1 (ranks 2-3, TP 2)
    src = {"l0": tp_layout((4, 2), 0, [4], [0, 1], 2), "l1": tp_layout((4, 2), 0, [4], [2, 3], 2)}
    r = recipe([Target("l0", Source("l0")), Target("l1", Source("l1"))])
    meta = rosters(r, src, src, dict.fromkeys(src, "float32"), 4)
    assert [[m["name"] for m in mine["src"]] for mine in meta] == [["l0"], ["l0"], ["l1"], ["l1"]]
    assert [m["tp"] for mine in meta for m in mine["dst"]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
