"""shardspec.torchrec: TorchRec's embedding sharding, said as layouts.

- :mod:`.layouts`: each sharding type (data_parallel, table_wise, row_wise, column_wise,
  table_row_wise, table_column_wise, grid_shard) as a :class:`~shardspec.metadata.Layout`
  from a plain description, with TorchRec's default block sizes; no TorchRec needed.
- :mod:`.plans`: TorchRec ``ParameterSharding`` / ``ShardingPlan`` <-> Layout.

Importing this package imports neither torch nor TorchRec.
"""

from __future__ import annotations

from .layouts import (
    MIN_CW_DIM,
    SHARDING_TYPES,
    column_block_size,
    column_wise,
    data_parallel,
    grid_shard,
    host_ranks,
    layout_for,
    row_wise,
    table_column_wise,
    table_row_wise,
    table_wise,
)
from .plans import (
    layout_from_parameter_sharding,
    layouts_from_plan,
    placement_rank,
    to_parameter_sharding,
)

__all__ = [
    "MIN_CW_DIM",
    "SHARDING_TYPES",
    "column_block_size",
    "column_wise",
    "data_parallel",
    "grid_shard",
    "host_ranks",
    "layout_for",
    "layout_from_parameter_sharding",
    "layouts_from_plan",
    "placement_rank",
    "row_wise",
    "table_column_wise",
    "table_row_wise",
    "table_wise",
    "to_parameter_sharding",
]
