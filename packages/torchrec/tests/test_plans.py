"""TorchRec's own plans read as layouts equal our descriptions (TORCHREC-10). Needs TorchRec."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis import given, strategies as st

from shardspec.metadata import Box, ConversionError, Layout, Shard
from shardspec.testing.optional import import_or_skip
from shardspec.torchrec import (
    column_wise,
    data_parallel,
    grid_shard,
    layout_from_parameter_sharding,
    layouts_from_plan,
    placement_rank,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
    to_parameter_sharding,
)

import_or_skip("torchrec", "nox -s torchrec installs it")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torchrec.distributed import sharding_plan as sp  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402

SHARDER = EmbeddingBagCollectionSharder()


def torchrec_ps(gen: Any, shape: tuple[int, int], local_size: int, world: int) -> Any:
    param = nn.Parameter(torch.empty(shape, device="meta"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRec warns when a width overrides the block size
        return gen(param, local_size, world, "cpu", SHARDER)


def read(gen: Any, shape: tuple[int, int], local_size: int, world: int) -> Layout:
    return layout_from_parameter_sharding(torchrec_ps(gen, shape, local_size, world), shape)


@pytest.mark.rule("TORCHREC-10", "TORCHREC-1", "TORCHREC-2", "TORCHREC-3", "TORCHREC-7")
@given(st.integers(1, 40), st.integers(1, 300), st.integers(1, 4), st.integers(1, 3))
def test_torchrec_row_and_table_plans_equal_our_layouts(
    rows: int, cols: int, local: int, hosts: int
) -> None:
    world = local * hosts
    shape = (rows, cols)
    assert read(sp.data_parallel(), shape, local, world) == data_parallel(shape, world)
    assert read(sp.table_wise(rank=world - 1), shape, local, world) == table_wise(shape, world - 1)
    got = read(sp.row_wise(), shape, local, world).validate()
    assert got == row_wise(shape, world)
    got = read(sp.table_row_wise(host_index=hosts - 1), shape, local, world).validate()
    assert got == table_row_wise(shape, hosts - 1, local)


@pytest.mark.rule("TORCHREC-10", "TORCHREC-5")
@given(st.data(), st.integers(0, 9), st.integers(1, 6), st.integers(1, 70))
def test_torchrec_column_wise_plans_equal_our_layouts(
    data: st.DataObject, rows: int, k: int, per: int
) -> None:
    ranks = data.draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))
    shape = (rows, per * k)
    got = read(sp.column_wise(ranks=ranks), shape, 6, 6).validate()
    assert got == column_wise(shape, ranks)


@pytest.mark.rule("TORCHREC-10", "TORCHREC-9")
@given(st.integers(1, 9), st.integers(1, 3), st.integers(1, 3))
def test_torchrec_grid_plans_equal_our_layouts(rows: int, blocks: int, local: int) -> None:
    # The helper always uses the default block (>= 128 columns), so build wide tables.
    shape = (rows, 128 * blocks)
    hosts = list(range(blocks))[::-1]
    got = read(sp.grid_shard(host_indexes=hosts), shape, local, local * blocks).validate()
    assert got == grid_shard(shape, hosts, local)


@pytest.mark.rule("TORCHREC-3")
@pytest.mark.xfail(
    strict=True,
    reason="upstream: torchrec row_wise() on a table with 0 rows divides by its block size 0 "
    "(ZeroDivisionError in _calculate_rw_shard_sizes_and_offsets)",
)
def test_upstream_row_wise_of_an_empty_table() -> None:
    assert read(sp.row_wise(), (0, 4), 2, 2) == row_wise((0, 4), 2)


@pytest.mark.rule("TORCHREC-6", "TORCHREC-10")
def test_torchrec_column_wise_sizes_place_width_i_on_rank_i() -> None:
    got = read(sp.column_wise(size_per_rank=[3, 5]), (2, 8), 2, 2)
    assert got == column_wise((2, 8), [0, 1], sizes=[3, 5])


@pytest.mark.rule("TORCHREC-9")
@pytest.mark.xfail(
    strict=True,
    reason="upstream: torchrec grid_shard(host_indexes) with fewer hosts than column blocks "
    "drops the blocks that have no host, leaving columns unowned",
)
def test_upstream_grid_shard_with_too_few_hosts_covers_the_table() -> None:
    read(sp.grid_shard(host_indexes=[1]), (10, 256), 2, 4).validate()


@pytest.mark.rule("TORCHREC-4", "TORCHREC-10")
@pytest.mark.xfail(
    strict=True,
    reason="upstream: torchrec row_wise(sizes_placement) on 'cpu' writes placement rank:0/cpu "
    "for every shard while ranks says 0..W-1",
)
def test_upstream_row_wise_explicit_sizes_plan_agrees_with_itself() -> None:
    got = read(sp.row_wise(([4, 4, 2, 0], "cpu")), (10, 8), 4, 4)
    assert got == row_wise((10, 8), 4, sizes=[4, 4, 2, 0])


@pytest.mark.rule("TORCHREC-4")
@pytest.mark.xfail(
    strict=True,
    reason="upstream: torchrec row_wise(sizes_placement) clips sizes that add up to more than "
    "the rows instead of refusing them",
)
def test_upstream_row_wise_refuses_sizes_that_overshoot() -> None:
    with pytest.raises(ValueError, match="Cannot fit"):
        torchrec_ps(sp.row_wise(([8, 8], "cpu")), (10, 8), 2, 2)


@pytest.mark.rule("TORCHREC-10")
def test_reading_refuses_placements_that_contradict_ranks() -> None:
    ps = torchrec_ps(sp.row_wise(([4, 6], "cpu")), (10, 8), 2, 2)
    with pytest.raises(ConversionError, match=r"shard #1 .* placed on rank 0 but ranks \[0, 1\]"):
        layout_from_parameter_sharding(ps, (10, 8))


@pytest.mark.rule("TORCHREC-10")
def test_placement_rank_reads_strings_and_remote_devices() -> None:
    from torch.distributed.remote_device import _remote_device

    assert placement_rank("rank:3/cpu") == 3
    assert placement_rank(_remote_device("rank:2/cpu")) == 2
    with pytest.raises(ConversionError, match="names no rank"):
        placement_rank("cpu")


@pytest.mark.rule("TORCHREC-10")
@given(st.integers(0, 12), st.integers(1, 8), st.integers(1, 4))
def test_to_parameter_sharding_round_trips(rows: int, cols: int, world: int) -> None:
    for stype, layout in [
        ("row_wise", row_wise((rows, cols), world)),
        ("table_wise", table_wise((rows, cols), world - 1)),
        ("data_parallel", data_parallel((rows, cols), world)),
        ("column_wise", column_wise((rows, cols), [world - 1] * 1)),
    ]:
        ps = to_parameter_sharding(layout, stype)
        assert ps.sharding_type == stype
        assert layout_from_parameter_sharding(ps, (rows, cols)) == layout


@pytest.mark.rule("TORCHREC-10")
def test_to_parameter_sharding_refuses_a_partial_data_parallel() -> None:
    bad = Layout((2, 2), [Shard(Box((0, 0), (2, 2)), 1)])
    with pytest.raises(ConversionError, match="data_parallel needs the whole table on ranks 0"):
        to_parameter_sharding(bad, "data_parallel")


@pytest.mark.rule("TORCHREC-10")
def test_layouts_from_plan_keys_by_module_and_table() -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.types import ShardingPlan

    tables = [
        EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=r, feature_names=[f"f_{n}"])
        for n, r in [("a", 10), ("b", 7)]
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    module_plan = sp.construct_module_sharding_plan(
        ebc,
        {"a": sp.row_wise(), "b": sp.table_wise(rank=1)},
        local_size=2,
        world_size=2,
        device_type="cpu",
    )
    plan = ShardingPlan({"sparse.ebc": module_plan})
    got = layouts_from_plan(plan, {"a": (10, 8), "sparse.ebc.b": (7, 8)})
    assert got == {"sparse.ebc.a": row_wise((10, 8), 2), "sparse.ebc.b": table_wise((7, 8), 1)}
    with pytest.raises(ConversionError, match=r"no shape for table 'sparse\.ebc\.b'"):
        layouts_from_plan(plan, {"a": (10, 8)})


@pytest.mark.rule("TORCHREC-15")
@pytest.mark.xfail(
    strict=True,
    reason="upstream: torchrec create_global_tensor_shape_stride_from_metadata has no "
    "table_column_wise branch (shape None), so output_dtensor crashes on a rank that holds no "
    "block of such a table",
)
def test_upstream_dtensor_shape_of_table_column_wise() -> None:
    from torchrec.distributed.utils import create_global_tensor_shape_stride_from_metadata

    layout = table_column_wise((5, 8), [2, 3], 2, block_size=4)
    ps = to_parameter_sharding(layout, "table_column_wise")
    shape, _ = create_global_tensor_shape_stride_from_metadata(ps, 2)
    assert tuple(shape) == (5, 8)
