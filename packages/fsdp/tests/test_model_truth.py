"""The shared FSDP + TP model's truth (``shardspec.testing.fsdp_model.truth_layout``: the chunk
rule alone) and this package's rules agree on every parameter and mesh the worlds run, so the
worlds' checks, which hold state dicts to that truth, hold them to FSDP-1 as the rules say it."""

from __future__ import annotations

import pytest

from shardspec.fsdp.rules import fsdp_tp_layout
from shardspec.metadata import Layout
from shardspec.metadata.placements import Replicate, ShardDim
from shardspec.testing.fsdp_model import TP_DIM, make_model, truth_layout


def rules_layout(name: str, shape: tuple[int, ...], dp: int, tp: int) -> Layout:
    if name in TP_DIM:
        d = TP_DIM[name]
        return fsdp_tp_layout(shape, Replicate() if d is None else ShardDim(d), dp=dp, tp_size=tp)
    # outside the TP plan: chunked over dp, held alike by every TP coordinate, which as a layout
    # on (replicate=tp, dp, tp=1) lists the ranks tp-major
    ranks = [p * tp + t for t in range(tp) for p in range(dp)]
    return fsdp_tp_layout(shape, Replicate(), dp=dp, tp_size=1, replicate=tp, ranks=ranks)


@pytest.mark.rule("FSDP-1")
@pytest.mark.parametrize(
    ("dp", "tp"), [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2), (1, 4), (4, 2)]
)
def test_the_shared_models_truth_is_what_the_fsdp_rules_give(dp: int, tp: int) -> None:
    shapes = {n: tuple(p.shape) for n, p in make_model().named_parameters()}
    shapes["extra.norm"] = (5,)  # a parameter outside the TP plan
    for name, shape in shapes.items():
        want, got = rules_layout(name, shape, dp, tp), truth_layout(name, shape, dp, tp)
        for rank in range(dp * tp):
            assert got.boxes_of(rank) == want.boxes_of(rank), (name, shape, dp, tp, rank)
        assert sorted(s.rank for s in got.shards) == list(range(dp * tp))
