"""shardspec.fsdp: FSDP (FSDP1, FSDP2, HSDP) on top of tensor parallelism, with exact boxes.

:mod:`shardspec.fsdp.rules` says which box every rank holds (plain integers, no torch).
``DTensorExtensions`` / ``install`` replace torch's FSDP1 + TP state-dict hooks with ones
built on those rules, and ``flatten_sharded_tensors`` flattens FSDP1's nested ShardedTensors
without dropping or misattributing shards. The torch-facing names import torch when first used.
"""

from __future__ import annotations

from shardspec.metadata.lazy import lazy_exports

from .placements import Placement, Replicate, ShardDim, StridedShardDim
from .rules import (
    dtensor_boxes,
    dtensor_layout,
    fsdp1_claimed_placements,
    fsdp1_layout,
    fsdp2_layout,
    fsdp2_placements,
    fsdp_box,
    fsdp_tp_layout,
    placements_for_fsdp,
    tp_box,
)

__all__ = [
    "DTensorExtensions",
    "Placement",
    "Replicate",
    "ShardDim",
    "StridedShardDim",
    "dtensor_boxes",
    "dtensor_layout",
    "flatten_sharded_tensors",
    "fsdp1_claimed_placements",
    "fsdp1_layout",
    "fsdp2_layout",
    "fsdp2_placements",
    "fsdp_box",
    "fsdp_tp_layout",
    "install",
    "placements_for_fsdp",
    "tp_box",
]

_LAZY = {
    "DTensorExtensions": "extensions",
    "install": "extensions",
    "flatten_sharded_tensors": "flatten",
}


# The FSDP hooks need torch; the rules do not, so they load on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
