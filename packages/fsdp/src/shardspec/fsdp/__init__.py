"""shardspec.fsdp: FSDP (FSDP1, FSDP2, HSDP) on top of tensor parallelism, with exact boxes.

:mod:`shardspec.fsdp.rules` says which box every rank holds (plain integers, no torch).
``DTensorExtensions`` / ``install`` replace torch's FSDP1 + TP state-dict hooks with ones
built on those rules, and ``flatten_sharded_tensors`` flattens FSDP1's nested ShardedTensors
without dropping or misattributing shards. ``reshard_for`` reshards a model's and its
optimizer's state dicts for a model on another mesh (resuming there), and ``to_layouts`` /
``reshard_layouts`` / ``to_state_dict`` are the steps it is made of. The torch-facing names
import torch when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardspec.metadata.lazy import lazy_exports
from shardspec.metadata.placements import Placement, Replicate, ShardDim, StridedShardDim

from .rules import (
    dtensor_boxes,
    fsdp1_claimed_placements,
    fsdp1_layout,
    fsdp2_layout,
    fsdp2_placements,
    fsdp_box,
    fsdp_tp_layout,
    placements_for_fsdp,
    placements_layout,
    tp_box,
)

if TYPE_CHECKING:  # the lazy names, typed for mypy and editors
    from .convert import (
        model_layouts as model_layouts,
        reshard_layouts as reshard_layouts,
        to_layouts as to_layouts,
        to_state_dict as to_state_dict,
    )
    from .extensions import DTensorExtensions as DTensorExtensions, install as install
    from .flatten import flatten_sharded_tensors as flatten_sharded_tensors
    from .resume import reshard_for as reshard_for

__all__ = [
    "DTensorExtensions",
    "Placement",
    "Replicate",
    "ShardDim",
    "StridedShardDim",
    "dtensor_boxes",
    "flatten_sharded_tensors",
    "fsdp1_claimed_placements",
    "fsdp1_layout",
    "fsdp2_layout",
    "fsdp2_placements",
    "fsdp_box",
    "fsdp_tp_layout",
    "install",
    "model_layouts",
    "placements_for_fsdp",
    "placements_layout",
    "reshard_for",
    "reshard_layouts",
    "to_layouts",
    "to_state_dict",
    "tp_box",
]

_LAZY = {
    "DTensorExtensions": "extensions",
    "install": "extensions",
    "flatten_sharded_tensors": "flatten",
    "model_layouts": "convert",
    "reshard_layouts": "convert",
    "to_layouts": "convert",
    "to_state_dict": "convert",
    "reshard_for": "resume",
}


# The FSDP hooks need torch; the rules do not, so they load on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
