"""shardspec.torchrec: TorchRec's embedding sharding, said as layouts.

- :mod:`.layouts`: each sharding type (data_parallel, table_wise, row_wise, column_wise,
  table_row_wise, table_column_wise, grid_shard) as a :class:`~shardspec.metadata.Layout`
  from a plain description, with TorchRec's default block sizes; no TorchRec needed.
- :mod:`.plans`: TorchRec ``ParameterSharding`` / ``ShardingPlan`` <-> Layout.
- :mod:`.wrapper`: a strict ``LocalShardsWrapper`` (shape, checks, DCP protocol, ops).
- :mod:`.dtensor`: TorchRec's DTensor output <-> Layout (the truth is in the wrapper offsets).
- :mod:`.model`: read a sharded model's tables as layouts + local shards; reshard a live model
  to another plan in memory (:func:`reshard_model`); load with a layout check.

Importing this package imports neither torch nor TorchRec; the torch-backed names load on
first use.
"""

from __future__ import annotations

from shardspec.metadata.lazy import lazy_exports

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

# name -> submodule; these import torch, so they load on first use.
_LAZY: dict[str, str] = {
    "LocalShardsWrapper": "wrapper",
    "stacked_shape": "wrapper",
    "as_wrapper": "dtensor",
    "claimed_layout": "dtensor",
    "gather_layout": "dtensor",
    "layout_from_local_boxes": "dtensor",
    "to_dtensor": "dtensor",
    "torchrec_placements": "dtensor",
    "TableState": "model",
    "load_state": "model",
    "read_state": "model",
    "reshard_model": "model",
    "reshard_states": "model",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    *_LAZY,
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
