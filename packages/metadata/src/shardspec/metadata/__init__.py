"""shardspec.metadata: the layout model.

A sharded tensor is a global shape plus boxes, each owned by a rank. Everything else — torch's
ShardMetadata, DTensor placements, DCP chunk lists, TorchRec plans — converts into or out of a
:class:`Layout`. Importing this package does not import torch.
"""

from __future__ import annotations

from .box import Box
from .chunk import chunk_bounds, chunk_layout, chunk_size
from .errors import ConversionError, LayoutError
from .layout import Layout, Shard

__all__ = [
    "Box",
    "ConversionError",
    "Layout",
    "LayoutError",
    "Shard",
    "chunk_bounds",
    "chunk_layout",
    "chunk_size",
]
