"""TorchRec's sharding types as layouts, from a plain description (no TorchRec needed).

Each function mirrors what ``torchrec.distributed.sharding_plan`` builds for that type by
default (block sizes included), so that the layout of a TorchRec plan and the layout of its
description are equal; spec/08-torchrec.md states the rules (TORCHREC-1..9). Where TorchRec
is lenient (clipping sizes that do not add up, dropping column blocks that have no host) these
functions refuse with :class:`LayoutError` instead.

A table is 2-D: ``(rows, cols)`` = ``(num_embeddings, embedding_dim)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from shardspec.metadata import Box, Layout, LayoutError, Shard, chunk_bounds
from shardspec.metadata.box import as_index_tuple

__all__ = [
    "MIN_CW_DIM",
    "SHARDING_TYPES",
    "column_block_size",
    "column_wise",
    "data_parallel",
    "grid_shard",
    "host_ranks",
    "layout_for",
    "row_wise",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
]

# torchrec.distributed.planner.constants.MIN_CW_DIM: the lower bound of a column block when
# no column-wise shard dim is given.
MIN_CW_DIM = 128

SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "grid_shard",
)


def _table_shape(shape: Sequence[int]) -> tuple[int, int]:
    shp = as_index_tuple(shape, "table shape")
    if len(shp) != 2:
        raise LayoutError(f"an embedding table is 2-D (rows, cols), got shape {shp}")
    return shp[0], shp[1]


def _ranks(ranks: int | Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(ranks, int) and not isinstance(ranks, bool):
        if ranks <= 0:
            raise LayoutError(f"{what}: the world size must be positive, got {ranks}")
        return tuple(range(ranks))
    if isinstance(ranks, bool):
        raise LayoutError(f"{what}: ranks must be a world size or a list of ranks, got {ranks!r}")
    rks = as_index_tuple(ranks, f"{what} ranks")
    if not rks:
        raise LayoutError(f"{what} needs at least one rank")
    return rks


def _distinct(ranks: tuple[int, ...], what: str) -> None:
    if len(set(ranks)) != len(ranks):
        raise LayoutError(f"{what}: ranks {ranks} name a rank twice; each rank owns one row block")


def _split(n: int, sizes: Sequence[int], what: str) -> list[tuple[int, int]]:
    szs = as_index_tuple(sizes, f"{what} sizes")
    if sum(szs) != n:
        raise LayoutError(
            f"{what}: sizes {szs} add up to {sum(szs)} but the dim has {n}; TorchRec would clip "
            f"or leave rows unowned, so the sizes must add up exactly"
        )
    edges = [0]
    for s in szs:
        edges.append(edges[-1] + s)
    return list(itertools.pairwise(edges))


def _rows(rows: int, k: int, sizes: Sequence[int] | None, what: str) -> list[tuple[int, int]]:
    if sizes is None:
        return chunk_bounds(rows, k)
    bounds = _split(rows, sizes, what)
    if len(bounds) != k:
        raise LayoutError(f"{what}: {len(bounds)} sizes for {k} ranks")
    return bounds


def column_block_size(cols: int, min_block: int | None = None) -> int:
    """TorchRec's column block width for a table with ``cols`` columns (TORCHREC-5).

    The smallest multiple of 4 that divides ``cols`` and is at least ``min_block`` (default
    :data:`MIN_CW_DIM`); ``cols`` itself when there is none. As in TorchRec, a ``min_block``
    of 0 means the default.
    """
    if isinstance(cols, bool) or cols < 0:
        raise LayoutError(f"cols must be a non-negative int, got {cols!r}")
    lower = min_block if min_block else MIN_CW_DIM
    for width in range(lower, cols):
        if cols % width == 0 and width % 4 == 0:
            return width
    return cols


def _column_shards(
    rows: int, bounds: Sequence[tuple[int, int]], ranks: Sequence[int]
) -> list[Shard]:
    return [Shard(Box((0, a), (rows, b - a)), r) for (a, b), r in zip(bounds, ranks)]


def data_parallel(shape: Sequence[int], ranks: int | Sequence[int]) -> Layout:
    """Every rank holds the whole table (TORCHREC-1). ``ranks``: the world size or the ranks."""
    rows, cols = _table_shape(shape)
    rks = _ranks(ranks, "data_parallel")
    _distinct(rks, "data_parallel")
    return Layout.replicated((rows, cols), rks)


def table_wise(shape: Sequence[int], rank: int) -> Layout:
    """The whole table on one rank (TORCHREC-2)."""
    rows, cols = _table_shape(shape)
    (r,) = as_index_tuple([rank], "table_wise rank")
    return Layout((rows, cols), [Shard(Box.full((rows, cols)), r)])


def row_wise(
    shape: Sequence[int],
    ranks: int | Sequence[int],
    *,
    sizes: Sequence[int] | None = None,
    num_buckets: int | None = None,
) -> Layout:
    """Rows split over ``ranks`` (TORCHREC-3, TORCHREC-4).

    Default: the ``torch.chunk`` rule, block ``ceil(rows / world)``, which is what TorchRec's
    ``row_wise()`` does (10 rows on 4 ranks: 3, 3, 3, 1). ``sizes``: explicit rows per rank,
    adding up to ``rows``. ``num_buckets``: TorchRec's bucketed (ZCH) split, whole buckets of
    ``rows / num_buckets`` rows, the first ``num_buckets % world`` ranks one bucket more.
    """
    rows, cols = _table_shape(shape)
    rks = _ranks(ranks, "row_wise")
    _distinct(rks, "row_wise")
    if sizes is not None and num_buckets is not None:
        raise LayoutError("row_wise: give sizes or num_buckets, not both")
    if num_buckets is not None:
        sizes = _bucket_sizes(rows, len(rks), num_buckets)
    bounds = _rows(rows, len(rks), sizes, "row_wise")
    return Layout(
        (rows, cols), [Shard(Box((a, 0), (b - a, cols)), r) for (a, b), r in zip(bounds, rks)]
    )


def _bucket_sizes(rows: int, world: int, num_buckets: int) -> list[int]:
    if isinstance(num_buckets, bool) or num_buckets <= 0:
        raise LayoutError(f"row_wise: num_buckets must be a positive int, got {num_buckets!r}")
    if num_buckets < world:
        raise LayoutError(
            f"row_wise: {num_buckets} buckets cannot cover {world} ranks (a bucket is never split)"
        )
    if rows % num_buckets:
        raise LayoutError(f"row_wise: {rows} rows do not divide into {num_buckets} buckets")
    per_bucket = rows // num_buckets
    base, extra = divmod(num_buckets, world)
    return [per_bucket * (base + (1 if r < extra else 0)) for r in range(world)]


def column_wise(
    shape: Sequence[int], ranks: Sequence[int], *, sizes: Sequence[int] | None = None
) -> Layout:
    """Column blocks on ``ranks`` (a rank may repeat: several blocks on one rank) (TORCHREC-5,
    TORCHREC-6).

    Default, as TorchRec's ``column_wise(ranks=...)``: ``cols`` must divide by ``len(ranks)``;
    the block width is :func:`column_block_size` with ``min_block = cols // len(ranks)``; block
    ``j`` goes to ``ranks[j]``, and ranks past the last block own nothing. ``sizes``: explicit
    widths, one per rank in ``ranks``, adding up to ``cols``.
    """
    rows, cols = _table_shape(shape)
    rks = _ranks(ranks, "column_wise")
    if sizes is not None:
        bounds = _split(cols, sizes, "column_wise")
        if len(bounds) != len(rks):
            raise LayoutError(f"column_wise: {len(bounds)} sizes for {len(rks)} ranks {rks}")
    else:
        if cols % len(rks):
            raise LayoutError(
                f"column_wise: {cols} columns cannot be evenly divided across ranks {rks}; "
                f"give explicit sizes"
            )
        bounds = _blocks(cols, cols // len(rks))
    return _dedupe(Layout((rows, cols), _column_shards(rows, bounds, rks)), "column_wise")


def _blocks(cols: int, min_block: int | None) -> list[tuple[int, int]]:
    if cols == 0:
        return [(0, 0)]
    width = column_block_size(cols, min_block)
    return [(j * width, (j + 1) * width) for j in range(cols // width)]


def _dedupe(layout: Layout, what: str) -> Layout:
    # Explicit zero widths on a repeated rank can put the same empty box twice on one rank
    # (LAYOUT-2 forbids that); one is enough, it holds nothing.
    seen: set[tuple[Box, int]] = set()
    out = []
    for s in layout.shards:
        if (s.box, s.rank) in seen:
            continue
        seen.add((s.box, s.rank))
        out.append(s)
    return Layout(layout.shape, out)


def host_ranks(host_index: int, local_size: int) -> tuple[int, ...]:
    """The ranks of host ``host_index`` when every host runs ``local_size`` ranks."""
    (h, n) = as_index_tuple([host_index, local_size], "host_index and local_size")
    if n == 0:
        raise LayoutError("local_size must be positive")
    return tuple(range(h * n, (h + 1) * n))


def table_row_wise(
    shape: Sequence[int],
    host_index: int,
    local_size: int,
    *,
    sizes: Sequence[int] | None = None,
) -> Layout:
    """Rows split over the ``local_size`` ranks of one host (TORCHREC-7).

    Default, as TorchRec's ``table_row_wise(host_index)``: the ``torch.chunk`` rule over the
    host's ranks ``host_index * local_size + i``. ``sizes``: explicit rows per host rank.
    """
    rows, cols = _table_shape(shape)
    rks = host_ranks(host_index, local_size)
    bounds = _rows(rows, len(rks), sizes, "table_row_wise")
    return Layout(
        (rows, cols), [Shard(Box((a, 0), (b - a, cols)), r) for (a, b), r in zip(bounds, rks)]
    )


def table_column_wise(
    shape: Sequence[int],
    ranks: Sequence[int],
    local_size: int,
    *,
    block_size: int | None = None,
    sizes: Sequence[int] | None = None,
) -> Layout:
    """Column blocks on ranks of a single host (TORCHREC-8).

    TorchRec's planner cuts ``cols`` into blocks of :func:`column_block_size` (lower bound
    ``block_size``, default :data:`MIN_CW_DIM`) and places each on a rank of one host; here the
    placement is explicit: block ``j`` on ``ranks[j]``, one rank per block (a rank may repeat).
    ``sizes`` replaces the blocks by explicit widths.
    """
    rows, cols = _table_shape(shape)
    rks = _ranks(ranks, "table_column_wise")
    (n,) = as_index_tuple([local_size], "local_size")
    if n == 0:
        raise LayoutError("table_column_wise: local_size must be positive")
    hosts = sorted({r // n for r in rks})
    if len(hosts) != 1:
        raise LayoutError(
            f"table_column_wise: ranks {rks} span hosts {hosts} (local_size {n}); the table "
            f"must stay on one host (use column_wise across hosts)"
        )
    bounds = (
        _split(cols, sizes, "table_column_wise") if sizes is not None else _blocks(cols, block_size)
    )
    if len(bounds) != len(rks):
        raise LayoutError(
            f"table_column_wise: {len(bounds)} column blocks {bounds} but {len(rks)} ranks {rks}; "
            f"give one rank per block"
        )
    return _dedupe(Layout((rows, cols), _column_shards(rows, bounds, rks)), "table_column_wise")


def grid_shard(
    shape: Sequence[int],
    host_indexes: Sequence[int],
    local_size: int,
    *,
    block_size: int | None = None,
    sizes: Sequence[int] | None = None,
) -> Layout:
    """Column blocks, one per host, each block's rows split over that host's ranks (TORCHREC-9).

    As TorchRec's ``grid_shard(host_indexes)``: blocks of :func:`column_block_size` (lower
    bound ``block_size``, default :data:`MIN_CW_DIM`), block ``j`` on host
    ``host_indexes[j]``, its rows chunked by the ``torch.chunk`` rule over the host's
    ``local_size`` ranks. Shards are listed block by block. There must be exactly one host per
    block. ``sizes`` replaces the blocks by explicit widths.
    """
    rows, cols = _table_shape(shape)
    hosts = as_index_tuple(host_indexes, "grid_shard host_indexes")
    if len(set(hosts)) != len(hosts):
        raise LayoutError(f"grid_shard: host_indexes {hosts} name a host twice")
    bounds = _split(cols, sizes, "grid_shard") if sizes is not None else _blocks(cols, block_size)
    if len(bounds) != len(hosts):
        raise LayoutError(
            f"grid_shard: {len(bounds)} column blocks {bounds} but {len(hosts)} hosts {hosts}; "
            f"TorchRec drops the blocks that have no host (a gap), so give one host per block"
        )
    shards = []
    for (c0, c1), h in zip(bounds, hosts):
        rks = host_ranks(h, local_size)
        for (r0, r1), rank in zip(chunk_bounds(rows, len(rks)), rks):
            shards.append(Shard(Box((r0, c0), (r1 - r0, c1 - c0)), rank))
    return Layout((rows, cols), shards)


_BUILDERS: dict[str, Callable[..., Layout]] = {
    "data_parallel": data_parallel,
    "table_wise": table_wise,
    "row_wise": row_wise,
    "column_wise": column_wise,
    "table_row_wise": table_row_wise,
    "table_column_wise": table_column_wise,
    "grid_shard": grid_shard,
}


def layout_for(sharding_type: Any, shape: Sequence[int], *args: Any, **kwargs: Any) -> Layout:
    """The layout of ``sharding_type`` (a name, or TorchRec's ``ShardingType``) for a table.

    ``layout_for("row_wise", (10, 4), 4)`` is ``row_wise((10, 4), 4)``; the remaining
    arguments are those of the function of that name.
    """
    name = getattr(sharding_type, "value", sharding_type)
    try:
        build = _BUILDERS[name]
    except (KeyError, TypeError):
        raise LayoutError(
            f"unknown sharding type {sharding_type!r}; expected one of {SHARDING_TYPES}"
        ) from None
    return build(shape, *args, **kwargs)
