"""Loading FSDP1 + TP's sharded optimizer state back (FSDP-11).

torch's ``FSDP.optim_state_dict_to_load`` gathers every DTensor / ShardedTensor state to the
*global* shape and then checks it against the TP-local parameter shape, so no FSDP1 + TP
optimizer state dict loads. :func:`optim_state_dict_to_load` first turns each 2-D state into
this rank's TP piece (gathering along the FSDP mesh dim only, as ``all_gather_dtensor`` does
for parameters), which is the shape FSDP flattens, then hands over to torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed.tensor import DTensor

from shardspec.metadata import ConversionError

from .gather import gather_flat_sharded_tensor, gather_fsdp_dim

__all__ = ["optim_state_dict_to_load", "tp_local_optim_state"]


def _root_mesh(model: Any) -> Any:
    from torch.distributed.fsdp._traversal_utils import _get_fsdp_states

    for state in _get_fsdp_states(model):
        mesh = getattr(state, "_device_mesh", None)
        if mesh is not None:
            return mesh._get_root_mesh()
    return None


def tp_local_optim_state(osd: dict[str, Any], root_mesh: Any = None) -> dict[str, Any]:
    """A copy of a sharded FSDP1 + TP optimizer state dict whose 2-D tensor states (DTensors
    on the root mesh, flat ShardedTensors from ``chunk_dtensor``) are replaced by this rank's
    TP piece as a plain tensor. Every rank must call it (it gathers along the FSDP dim)."""
    state = {}
    for fqn, entry in osd.get("state", {}).items():
        new_entry = {}
        for name, value in entry.items():
            if isinstance(value, DTensor):
                value = gather_fsdp_dim(value) if value.device_mesh.ndim > 1 else value.to_local()
            elif isinstance(value, ShardedTensor):
                if root_mesh is None:
                    raise ConversionError(
                        f"{fqn}.{name} is a ShardedTensor: pass the model (or its root mesh) so "
                        "the FSDP mesh dim is known"
                    )
                value = gather_flat_sharded_tensor(value, root_mesh)
            new_entry[name] = value
        state[fqn] = new_entry
    return {**osd, "state": state}


def optim_state_dict_to_load(
    model: torch.nn.Module, optim: torch.optim.Optimizer, osd: dict[str, Any]
) -> dict[str, Any]:
    """``FSDP.optim_state_dict_to_load`` for an FSDP1 + TP model whose sharded optimizer state
    dict came from our hooks: call it on every rank, then ``optim.load_state_dict(result)``."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    local = tp_local_optim_state(osd, _root_mesh(model))
    return FSDP.optim_state_dict_to_load(model, optim, local)  # type: ignore[no-any-return]
