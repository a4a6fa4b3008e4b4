"""The strict LocalShardsWrapper, single process (TORCHREC-11..14). Needs torch, not TorchRec."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings, strategies as st
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper as UpstreamWrapper
from torchrec_strategies import DTYPES, make_global, table_layouts

from shardspec.metadata import Box, ConversionError, Layout, LayoutError
from shardspec.testing.defects import known_failure
from shardspec.torchrec import column_wise, row_wise
from shardspec.torchrec.wrapper import LocalShardsWrapper, stacked_shape


def wrap(layout: Layout, rank: int, full: torch.Tensor) -> LocalShardsWrapper:
    boxes = layout.boxes_of(rank)
    return LocalShardsWrapper(
        [full[b.slices()] for b in boxes], [b.offsets for b in boxes], global_shape=layout.shape
    )


# --- TORCHREC-11: shape -------------------------------------------------------------------


@pytest.mark.rule("TORCHREC-11")
def test_shape_hand_worked() -> None:
    rows = LocalShardsWrapper([torch.zeros(2, 4), torch.zeros(3, 4)], [(0, 0), (2, 0)])
    assert (tuple(rows.shape), rows.stack_dim) == ((5, 4), 0)
    cols = LocalShardsWrapper([torch.zeros(5, 3), torch.zeros(5, 5)], [(0, 0), (0, 3)])
    assert (tuple(cols.shape), cols.stack_dim) == ((5, 8), 1)
    one = LocalShardsWrapper([torch.zeros(3, 2)], [(4, 0)])
    assert tuple(one.shape) == (3, 2)
    none = LocalShardsWrapper([], [], global_shape=(7, 3))
    assert tuple(none.shape) == (0, 0)
    assert none.is_empty_shard()


@pytest.mark.rule("TORCHREC-11")
@known_failure(
    reason="upstream: LocalShardsWrapper sums shapes along dim 1 even for a row-wise stack",
    raises=AssertionError,
    match=r"\(2, 8\) == \(5, 4\)",
)
def test_upstream_shape_of_a_row_wise_stack() -> None:
    w = UpstreamWrapper([torch.zeros(2, 4), torch.zeros(3, 4)], [(0, 0), (2, 0)])
    assert tuple(w.shape) == (5, 4)


@pytest.mark.rule("TORCHREC-11")
@given(table_layouts(), st.data())
def test_shape_is_the_concatenation_along_the_stack_dim(
    layout: Layout, data: st.DataObject
) -> None:
    full = make_global(layout.shape, "float32", 0)
    for rank in layout.ranks:
        w = wrap(layout, rank, full)
        shards = w.local_shards()
        expected = torch.cat(shards, dim=w.stack_dim).shape if shards else (0, 0)
        assert tuple(w.shape) == tuple(expected), f"rank {rank}: {tuple(w.shape)} [{layout}]"
        offsets = {b.offsets for b in w.local_boxes}
        if len(offsets) > 1:
            assert len({o[w.stack_dim] for o in offsets}) > 1, "stacked along a dim that agrees"


@pytest.mark.rule("TORCHREC-11")
def test_stacked_shape_refuses_shards_that_do_not_line_up() -> None:
    with pytest.raises(LayoutError, match=r"local shard #1 .* size in dim 1 is 3, not 4"):
        stacked_shape([Box((0, 0), (2, 4)), Box((2, 0), (2, 3))])


# --- TORCHREC-12: strictness --------------------------------------------------------------


@pytest.mark.rule("TORCHREC-12")
def test_refuses_shards_and_offsets_that_disagree() -> None:
    a, b = torch.zeros(2, 4), torch.zeros(3, 4)
    with pytest.raises(LayoutError, match="2 local shards but 1 offsets"):
        LocalShardsWrapper([a, b], [(0, 0)])
    with pytest.raises(LayoutError, match=r"local shard #1 has 2 dims .* offsets \(2,\) have 1"):
        LocalShardsWrapper([a, b], [(0, 0), (2,)])
    with pytest.raises(LayoutError, match=r"local shard #1 is torch\.float64"):
        LocalShardsWrapper([a, b.double()], [(0, 0), (2, 0)])
    with pytest.raises(LayoutError, match=r"local shards #0 .* and #1 .* overlap"):
        LocalShardsWrapper([a, b], [(0, 0), (1, 0)])
    with pytest.raises(LayoutError, match=r"local shard #1 .* does not lie inside .* \(4, 4\)"):
        LocalShardsWrapper([a, b], [(0, 0), (2, 0)], global_shape=(4, 4))


@pytest.mark.rule("TORCHREC-12")
@known_failure(
    reason="upstream: LocalShardsWrapper zips shards with offsets, silently dropping shards "
    "that have no offset",
    raises=pytest.fail.Exception,
    match=r"DID NOT RAISE",
)
def test_upstream_refuses_a_short_offsets_list() -> None:
    with pytest.raises((ValueError, AssertionError)):
        UpstreamWrapper([torch.zeros(2, 4), torch.zeros(3, 4)], [(0, 0)])


@pytest.mark.rule("TORCHREC-12")
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_refuses_the_torchrec_example_offsets(rank: int) -> None:
    # torch/distributed/tensor/examples/torchrec_sharding_example.py, row-wise even: an 8x16
    # table on 4 ranks, shard offset (rank * 2, embedding_dim) -- column 16 is past the end.
    with pytest.raises(LayoutError, match=r"does not lie inside the global shape \(8, 16\)"):
        LocalShardsWrapper([torch.zeros(2, 16)], [(rank * 2, 16)], global_shape=(8, 16))
    good = LocalShardsWrapper([torch.zeros(2, 16)], [(rank * 2, 0)], global_shape=(8, 16))
    assert good.local_boxes == (Box((rank * 2, 0), (2, 16)),)


# --- TORCHREC-13: DCP ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    if dist.is_initialized():
        yield
        return
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def single_rank(layout: Layout) -> Layout:
    return layout.with_ranks(dict.fromkeys(layout.ranks, 0))


@pytest.mark.rule("TORCHREC-13")
@settings(max_examples=30)
@given(
    st.data(),
    table_layouts(world=1),
    st.sampled_from(DTYPES),
)
def test_dcp_round_trip_into_another_layout(
    one_rank_group: None, data: st.DataObject, src: Layout, dtype: str
) -> None:
    # One rank holding a stack of column or row blocks, loaded as another stack.
    shape = src.shape
    dst_kind = data.draw(st.sampled_from(["rows", "cols", "plain"]))
    full = make_global(shape, dtype, 1)
    with tempfile.TemporaryDirectory() as d:
        dcp.save({"t": wrap(src, 0, full)}, checkpoint_id=d)
        if dst_kind == "plain":
            out = torch.zeros_like(full)
            dcp.load({"t": out}, checkpoint_id=d)
            assert torch.equal(out, full)
            return
        k = data.draw(st.integers(1, 3))
        dst = single_rank(
            row_wise(shape, k)
            if dst_kind == "rows" or shape[1] == 0
            else column_wise(shape, [0] * k, sizes=_split(shape[1], k))
        )
        target = LocalShardsWrapper(
            [torch.zeros(b.sizes, dtype=full.dtype) for b in dst.boxes_of(0)],
            [b.offsets for b in dst.boxes_of(0)],
            global_shape=shape,
        )
        dcp.load({"t": target}, checkpoint_id=d)
    for t, b in zip(target.local_shards(), dst.boxes_of(0)):
        assert torch.equal(t, full[b.slices()]), f"box {b} after load [{src} -> {dst}]"


def _split(n: int, k: int) -> list[int]:
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


@pytest.mark.rule("TORCHREC-13")
def test_a_bare_wrapper_without_global_shape_cannot_be_saved(one_rank_group: None) -> None:
    w = LocalShardsWrapper([torch.zeros(2, 4)], [(0, 0)])
    with (
        tempfile.TemporaryDirectory() as d,
        pytest.raises(CheckpointException, match="needs its global_shape"),
    ):
        dcp.save({"t": w}, checkpoint_id=d)
    with pytest.raises(ConversionError, match="needs its global_shape"):
        w.__create_write_items__("t", w)


@pytest.mark.rule("TORCHREC-13")
def test_get_tensor_shard_names_what_it_holds() -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    a, b = torch.ones(2, 4), torch.zeros(3, 4)
    w = LocalShardsWrapper([a, b], [(0, 0), (2, 0)], global_shape=(5, 4))
    assert w.__get_tensor_shard__(MetadataIndex("t", torch.Size((2, 0)))) is b
    assert w.__get_tensor_shard__(MetadataIndex("t", torch.Size((0, 0)), 0)) is a
    with pytest.raises(
        ValueError, match=r"no local shard at offset .* holds \[\(0, 0\), \(2, 0\)\]"
    ):
        w.__get_tensor_shard__(MetadataIndex("t", torch.Size((1, 0))))


# --- TORCHREC-14: ops ---------------------------------------------------------------------


def _pair() -> tuple[torch.Tensor, LocalShardsWrapper]:
    full = torch.arange(20.0).view(5, 4)
    return full, LocalShardsWrapper(
        [full[:2].clone(), full[2:].clone()], [(0, 0), (2, 0)], global_shape=(5, 4)
    )


def _cat(w: torch.Tensor) -> torch.Tensor:
    assert isinstance(w, LocalShardsWrapper)
    return torch.cat(w.local_shards(), dim=w.stack_dim)


@pytest.mark.rule("TORCHREC-14")
def test_checkpoint_ops_act_shard_by_shard() -> None:
    full, w = _pair()
    z = torch.zeros_like(w)
    assert isinstance(z, LocalShardsWrapper) and torch.equal(_cat(z), torch.zeros(5, 4))
    z.copy_(w)
    assert torch.equal(_cat(z), full)
    assert torch.equal(z, w)
    z.zero_()
    assert not torch.equal(z, w) and torch.equal(_cat(z), torch.zeros(5, 4))
    z.fill_(3.0)
    assert torch.equal(_cat(z), torch.full((5, 4), 3.0))
    c = w.clone()
    c.mul_(2)
    assert torch.equal(_cat(w), full) and torch.equal(_cat(c), 2 * full)
    d = w.detach()
    assert d is not w and torch.equal(_cat(d), full)
    h = w.to(torch.float16)
    assert h.dtype == torch.float16 and torch.equal(_cat(h), full.half())
    assert tuple(torch.empty_like(w).shape) == (5, 4)
    assert tuple(w.new_empty((5, 4)).shape) == (5, 4)
    assert torch.equal(_cat(torch.sqrt(w)), torch.sqrt(full))
    assert torch.equal(_cat(torch.full_like(w, 7.0)), torch.full((5, 4), 7.0))
    e = LocalShardsWrapper([], [], global_shape=(5, 4))
    assert e.to(torch.float16).dtype == torch.float16


@pytest.mark.rule("TORCHREC-14")
@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("SGD", {"lr": 0.1, "momentum": 0.9}),
        ("Adam", {"lr": 0.1}),
        ("Adagrad", {"lr": 0.1}),
        ("AdamW", {"lr": 0.1, "weight_decay": 0.1}),
    ],
)
def test_an_optimizer_steps_a_wrapper_like_the_unsharded_parameter(
    name: str, kwargs: dict[str, float]
) -> None:
    full, w = _pair()
    grad_full = torch.linspace(-1, 1, 20).view(5, 4)
    p = torch.nn.Parameter(w.clone())
    p.grad = LocalShardsWrapper(
        [grad_full[:2].clone(), grad_full[2:].clone()], [(0, 0), (2, 0)], global_shape=(5, 4)
    )
    ref = torch.nn.Parameter(full.clone())
    ref.grad = grad_full.clone()
    opt, ref_opt = (getattr(torch.optim, name)([x], **kwargs) for x in (p, ref))
    for _ in range(3):
        opt.step()
        ref_opt.step()
    assert torch.allclose(_cat(p.detach()), ref.detach()), name


@pytest.mark.rule("TORCHREC-14")
def test_refuses_non_elementwise_ops_and_mismatched_boxes() -> None:
    _, w = _pair()
    with pytest.raises(NotImplementedError, match=r"aten\.sum\.default is not supported"):
        w.sum()
    with pytest.raises(NotImplementedError, match="only 0-d tensors broadcast"):
        w.add_(torch.ones(5, 4))
    other = LocalShardsWrapper(
        [torch.zeros(3, 4), torch.zeros(2, 4)], [(0, 0), (3, 0)], global_shape=(5, 4)
    )
    with pytest.raises(LayoutError, match="differ from destination boxes"):
        other.copy_(w)
    with pytest.raises(NotImplementedError, match="only its own shape"):
        w.view(20)
    assert not torch.equal(w, other)


@pytest.mark.rule("TORCHREC-14")
@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda w: torch.zeros_like(w), id="zeros_like"),
        pytest.param(lambda w: w.clone().copy_(w), id="copy_"),
        pytest.param(lambda w: w.clone().mul_(2), id="mul_"),
        pytest.param(lambda w: w.clone().zero_(), id="zero_"),
    ],
)
@known_failure(
    reason="upstream: torch's LocalShardsWrapper handles 8 ops; none of copy_, zeros_like, "
    "mul_, zero_ (optimizer state and checkpoint loads need them)",
    raises=NotImplementedError,
    match=r"is not supported for LocalShardsWrapper",
)
def test_upstream_supports_checkpoint_and_optimizer_ops(op: object) -> None:
    w = UpstreamWrapper([torch.ones(2, 4), torch.ones(3, 4)], [(0, 0), (2, 0)])
    op(w)  # type: ignore[operator]


@pytest.mark.rule("TORCHREC-14")
@known_failure(
    reason="upstream: LocalShardsWrapper.detach mutates and returns the same object",
    raises=AssertionError,
    match=r"is not LocalShardsWrapper",
)
def test_upstream_detach_returns_a_new_alias() -> None:
    w = UpstreamWrapper([torch.ones(2, 4)], [(0, 0)])
    assert w.detach() is not w


@pytest.mark.rule("TORCHREC-13")
def test_dcp_round_trip_on_two_ranks(ranks2: object, tmp_path: object) -> None:
    import torchrec_cases as cases

    from shardspec.torchrec import (
        column_wise,
        data_parallel,
        grid_shard,
        table_row_wise,
        table_wise,
    )

    layouts = [
        (row_wise((7, 4), 2), column_wise((7, 4), [1, 0, 1, 0], sizes=[1, 1, 1, 1]), "float32"),
        (column_wise((5, 16), [0, 1, 0, 1]), row_wise((5, 16), 2), "bfloat16"),
        (table_wise((3, 4), 1), table_row_wise((3, 4), 0, 2), "int64"),
        (data_parallel((4, 4), 2), grid_shard((4, 4), [0], 2, block_size=4), "bool"),
        (row_wise((1, 3), 2), table_wise((1, 3), 0), "complex64"),
        (row_wise((0, 3), 2), table_wise((0, 3), 1), "float16"),
    ]
    failures = ranks2.call(cases.wrapper_dcp_round_trip, layouts, 7, str(tmp_path))  # type: ignore[attr-defined]
    assert not [f for rank in failures for f in rank], failures
