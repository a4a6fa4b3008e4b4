"""shardspec.metadata: the layout model.

A sharded tensor is a global shape plus boxes, each owned by a rank. Everything else — torch's
ShardMetadata, DTensor placements, DCP chunk lists, TorchRec plans — converts into or out of a
:class:`Layout`. Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .box import Box
from .chunk import chunk_bounds, chunk_layout, chunk_size
from .errors import ConversionError, LayoutError
from .flat import FlatLayout, FlatPiece, flat_from_layout
from .infer import infer_spec
from .layout import Layout, Shard, render
from .lazy import lazy_exports
from .serialize import layout_from_dict, layout_from_json, layout_to_dict, layout_to_json
from .specs import ChunkSpec, EnumerableSpec

if TYPE_CHECKING:  # the lazy names, typed for mypy and editors
    from .dcp import (
        chunk_owners as chunk_owners,
        from_tensor_storage_metadata as from_tensor_storage_metadata,
        to_chunk_list as to_chunk_list,
        to_tensor_storage_metadata as to_tensor_storage_metadata,
    )
    from .dtensor import (
        dtensor_layout as dtensor_layout,
        dtensor_local_box as dtensor_local_box,
        dtensor_local_boxes as dtensor_local_boxes,
        dtensor_local_slices as dtensor_local_slices,
        from_dtensor as from_dtensor,
        to_dtensor_placements as to_dtensor_placements,
    )
    from .shard_metadata import (
        from_shard_metadata as from_shard_metadata,
        from_sharded_tensor_metadata as from_sharded_tensor_metadata,
        from_sharding_spec as from_sharding_spec,
        to_shard_metadata as to_shard_metadata,
        to_sharded_tensor_metadata as to_sharded_tensor_metadata,
        to_sharding_spec as to_sharding_spec,
    )

# Converters to and from torch types import torch; they load on first use so that
# `import shardspec.metadata` stays torch-free. name -> submodule that defines it.
_LAZY: dict[str, str] = {
    "from_shard_metadata": "shard_metadata",
    "to_shard_metadata": "shard_metadata",
    "from_sharded_tensor_metadata": "shard_metadata",
    "to_sharded_tensor_metadata": "shard_metadata",
    "from_sharding_spec": "shard_metadata",
    "to_sharding_spec": "shard_metadata",
    "from_tensor_storage_metadata": "dcp",
    "to_tensor_storage_metadata": "dcp",
    "to_chunk_list": "dcp",
    "chunk_owners": "dcp",
    "dtensor_layout": "dtensor",
    "dtensor_local_box": "dtensor",
    "dtensor_local_boxes": "dtensor",
    "dtensor_local_slices": "dtensor",
    "to_dtensor_placements": "dtensor",
    "from_dtensor": "dtensor",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "Box",
    "ChunkSpec",
    "ConversionError",
    "EnumerableSpec",
    "FlatLayout",
    "FlatPiece",
    "Layout",
    "LayoutError",
    "Shard",
    "chunk_bounds",
    "chunk_layout",
    "chunk_size",
    "flat_from_layout",
    "infer_spec",
    "layout_from_dict",
    "layout_from_json",
    "layout_to_dict",
    "layout_to_json",
    "render",
    *_LAZY,
]
