"""Flattening nested ShardedTensors (spec/07-fsdp.md FSDP-8): on a ("dp", "tp") mesh of pool
ranks, an FSDP1 + TP SHARDED_STATE_DICT flattened by the implementation keeps every key on
every rank (a ShardedTensor with nothing local on a rank included), states the 2-D layout of
FSDP-1 with the real owners, and each rank's local data is the reference slice."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import example, given

from conformance import reference
from conformance.assertions import assert_equal, assert_layouts_equal, assert_tensor_bitwise
from conformance.cases import case
from conformance.codec import layout_from_json
from conformance.impls import Impl
from conformance.strategies.streams import flatten_cases
from shardspec.metadata import Box, Layout, Shard

KEYS = ["buf", "layer.n", "layer.w"]


def _box(shape: tuple[int, ...], dim: int, start: int, stop: int, base: Box | None = None) -> Box:
    offs = list(base.offsets) if base else [0] * len(shape)
    sizes = list(base.sizes) if base else list(shape)
    offs[dim], sizes[dim] = offs[dim] + start, stop - start
    return Box(offs, sizes)


def fsdp_tp_boxes(shape: tuple[int, ...], dp: int, tp: int, tp_dim: int) -> dict[int, Box]:
    """FSDP-1 by hand: rank (p, t) of the row-major mesh holds FSDP chunk p (dim 0) of TP
    chunk t (``tp_dim``) of the global tensor."""
    out = {}
    for t, (a, b) in enumerate(reference.chunk_intervals(shape[tp_dim], tp)):
        piece = _box(shape, tp_dim, a, b)
        for p, (c, e) in enumerate(reference.chunk_intervals(piece.sizes[0], dp)):
            out[p * tp + t] = _box(shape, 0, c, e, piece)
    return out


def _chunked(shape: tuple[int, ...], owners: list[int]) -> Layout:
    return Layout(
        shape,
        [
            Shard(_box(shape, 0, a, b), r)
            for (a, b), r in zip(reference.chunk_intervals(shape[0], len(owners)), owners)
        ],
    )


CASE_EMPTY_OWNER = {
    "mesh": (1, 2),
    "tp_dim": 0,
    "weight": torch.arange(12.0).reshape(4, 3),
    "buf": torch.arange(2.0),
    "owners": [0],  # rank 1 holds nothing of buf
}


@pytest.mark.rule("FSDP-8", "FSDP-1")
@pytest.mark.pool
@pytest.mark.known_defect(
    "torch",
    "checkpoint/_sharded_tensor_utils.py _flatten_sharded_tensors drops a ShardedTensor with no "
    "local shard on this rank (the key is missing there), and FSDP1's _chunk_tensor states the "
    "flat shards on a stand-in rank",
    raises=AssertionError,
    match=r"^rank\d+\.(keys|[\w.]+)=.*, but should be ",
)
@given(flatten_cases())
@example(CASE_EMPTY_OWNER)
def test_flattening_keeps_every_key_and_states_the_2d_layout(
    impl: Impl, pools: Any, c: dict[str, Any]
) -> None:
    (dp, tp), d, w, buf, owners = c["mesh"], c["tp_dim"], c["weight"], c["buf"], c["owners"]
    ex = (
        f"flatten(mesh=(dp={dp}, tp={tp}), weight {tuple(w.shape)} TP Shard({d}), "
        f"buf {tuple(buf.shape)} on ranks {owners}, dtype={w.dtype})"
    )
    want_w = fsdp_tp_boxes(tuple(w.shape), dp, tp, d)
    want_buf = _chunked(tuple(buf.shape), owners)
    with case():
        results = impl.flatten(pools(dp * tp), (dp, tp), d, w, buf, owners, ex)
        for r in results:
            v = r.value
            assert_equal(f"rank{r.rank}.keys", sorted(v["keys"]), KEYS, ex)
            data = iter(r.tensors)
            for key in [k for k in v["keys"] if k in v["entries"]]:  # the data's order
                entry = v["entries"][key]
                stated = layout_from_json(entry["layout"])
                local = [Box(o, s) for o, s in entry["local"]]
                g = w if key == "layer.w" else buf
                if key == "layer.w":
                    nonempty = {(s.box, s.rank) for s in stated.shards if not s.box.is_empty}
                    expected = {(b, rk) for rk, b in want_w.items() if not b.is_empty}
                    assert_equal(f"rank{r.rank}.{key} stated boxes", nonempty, expected, ex)
                    mine = want_w[r.rank]
                    assert_equal(f"rank{r.rank}.{key} local shards", len(local), 1, ex)
                    if not mine.is_empty:
                        assert_equal(f"rank{r.rank}.{key} local box", local[0], mine, ex)
                else:
                    assert_layouts_equal(f"rank{r.rank}.{key} layout", stated, want_buf, ex)
                    assert_equal(
                        f"rank{r.rank}.{key} local boxes",
                        local,
                        list(want_buf.boxes_of(r.rank)),
                        ex,
                    )
                for b in local:
                    got = next(data)
                    ref = g[want_w[r.rank].slices()] if key == "layer.w" else g[b.slices()]
                    assert_tensor_bitwise(f"rank{r.rank}.{key} local {b}", got, ref, ex)
