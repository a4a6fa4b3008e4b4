"""Hypothesis strategies for TorchRec tables: any sharding type, any small table, any dtype."""

from __future__ import annotations

from hypothesis import strategies as st

from shardspec.metadata import Layout
from shardspec.torchrec import (
    column_wise,
    data_parallel,
    grid_shard,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int8", "bool", "complex64")


@st.composite
def table_layouts(draw: st.DrawFn, *, world: int | None = None, max_world: int = 4) -> Layout:
    """A layout of one of the seven sharding types on ranks below ``world``: uneven rows,
    empty row blocks (more ranks than rows), 0-row tables, several column blocks per rank."""
    w = world if world is not None else draw(st.integers(1, max_world))
    rows = draw(st.integers(0, 9))
    kind = draw(
        st.sampled_from(
            [
                "data_parallel",
                "table_wise",
                "row_wise",
                "row_wise_sizes",
                "column_wise",
                "column_wise_sizes",
                "table_row_wise",
                "table_column_wise",
                "grid_shard",
            ]
        )
    )
    local = draw(st.sampled_from([d for d in range(1, w + 1) if w % d == 0]))
    hosts = w // local
    if kind == "data_parallel":
        return data_parallel((rows, draw(st.integers(0, 5))), w)
    if kind == "table_wise":
        return table_wise((rows, draw(st.integers(0, 5))), draw(st.integers(0, w - 1)))
    if kind == "row_wise":
        return row_wise((rows, draw(st.integers(1, 5))), w)
    if kind == "row_wise_sizes":
        cuts = sorted(draw(st.lists(st.integers(0, rows), min_size=w - 1, max_size=w - 1)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, rows])]
        return row_wise((rows, draw(st.integers(1, 4))), w, sizes=sizes)
    if kind == "column_wise":
        k = draw(st.integers(1, 4))
        ranks = draw(st.lists(st.integers(0, w - 1), min_size=k, max_size=k))
        return column_wise((rows, 4 * k), ranks)
    if kind == "column_wise_sizes":
        k = draw(st.integers(1, 4))
        ranks = draw(st.lists(st.integers(0, w - 1), min_size=k, max_size=k))
        sizes = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        return column_wise((rows, sum(sizes)), ranks, sizes=sizes)
    if kind == "table_row_wise":
        return table_row_wise(
            (rows, draw(st.integers(1, 4))), draw(st.integers(0, hosts - 1)), local
        )
    if kind == "table_column_wise":
        host = draw(st.integers(0, hosts - 1))
        k = draw(st.integers(1, 3))
        ranks = draw(
            st.lists(st.integers(host * local, host * local + local - 1), min_size=k, max_size=k)
        )
        return table_column_wise((rows, 4 * k), ranks, local, block_size=4)
    k = draw(st.integers(1, hosts))
    host_indexes = draw(st.permutations(range(hosts)).map(lambda p: list(p[:k])))
    return grid_shard((rows, 4 * k), host_indexes, local, block_size=4)


def make_global(shape: tuple[int, ...], dtype_name: str, seed: int):  # type: ignore[no-untyped-def]
    """A deterministic global tensor of any dtype (distinct values where the dtype allows)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)
