"""Gathering an FSDP + TP state back to this rank's TP piece, along the FSDP mesh dim only.

FSDP1 flattens the TP-local tensor, so ``all_gather_dtensor`` (parameters) and the optimizer
loading (:mod:`shardspec.fsdp.optim`) both need the TP piece, not the global tensor. Chunks
are padded to the widest before gathering: gloo gathers equal sizes only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor.api import ShardedTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from shardspec.metadata import ConversionError
from shardspec.metadata.dtensor_math import local_pieces
from shardspec.metadata.placements import Replicate, from_torch, to_split

from .sharded import FSDP_DIM_ATTR

__all__ = ["gather_flat_sharded_tensor", "gather_fsdp_dim"]


def gather_flat_sharded_tensor(st: ShardedTensor, root: DeviceMesh | None) -> torch.Tensor:
    """The TP piece of a flat ShardedTensor built by
    :func:`shardspec.fsdp.sharded.flat_sharded_tensor`, gathered over its FSDP mesh dim."""
    dim = getattr(st, FSDP_DIM_ATTR, None)
    if root is None or dim is None:
        raise ConversionError(
            "all_gather_dtensor got a ShardedTensor that shardspec.fsdp's chunk_dtensor did not "
            "build (it does not say which mesh dim FSDP shards); load into the state dict that "
            "model.state_dict() returned"
        )
    (shard,) = st.local_shards()
    local = shard.tensor
    group = root.get_group(dim)
    k = root.mesh.shape[dim]
    # FSDP's chunks of one TP piece are consecutive along dim 0 in group order: gather the
    # sizes, then the padded chunks, and concatenate the unpadded ones.
    # On the shard's device: an NCCL group takes CUDA tensors only.
    sizes = [torch.zeros(1, dtype=torch.int64, device=local.device) for _ in range(k)]
    mine = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    dist.all_gather(sizes, mine, group=group)
    rows = [int(x.item()) for x in sizes]
    width = max(rows)
    buf = local.new_zeros((width, *local.shape[1:]))
    buf[: local.shape[0]].copy_(local)
    outs = [torch.empty_like(buf) for _ in range(k)]
    dist.all_gather(outs, buf, group=group)
    return torch.cat([o[:n] for o, n in zip(outs, rows)], dim=0)


def gather_fsdp_dim(tensor: DTensor) -> torch.Tensor:
    """The TP-local tensor of a 2-D DTensor: gather along its one FSDP-sharded mesh dim (the
    Shard-like placement that is not the last one), padding uneven chunks for gloo."""
    mesh = tensor.device_mesh
    pls = [from_torch(p) for p in tensor.placements]
    shape = tuple(tensor.shape)
    dp_dims = [j for j, p in enumerate(pls[:-1]) if not isinstance(p, Replicate)]
    local = tensor.to_local()
    if not dp_dims:
        return local
    if len(dp_dims) != 1:
        raise ConversionError(
            f"all_gather_dtensor handles one FSDP-sharded mesh dim; placements {tensor.placements}"
        )
    (j,) = dp_dims
    coord = mesh.get_coordinate()
    assert coord is not None
    mesh_shape = tuple(mesh.mesh.shape)
    gathered_pls = list(pls)
    gathered_pls[j] = Replicate()
    target = [
        p.indices()
        for p in local_pieces(shape, mesh_shape, [to_split(p) for p in gathered_pls], coord)
    ]
    d = pls[j].dim  # type: ignore[union-attr]
    k = mesh_shape[j]
    splits = [to_split(p) for p in pls]
    peer_idx = []
    for c in range(k):
        pc = list(coord)
        pc[j] = c
        peer_idx.append(local_pieces(shape, mesh_shape, splits, pc)[d].indices())
    width = max(len(ix) for ix in peer_idx)
    pad_shape = list(local.shape)
    pad_shape[d] = width
    buf = local.new_zeros(pad_shape)
    buf.narrow(d, 0, local.shape[d]).copy_(local)
    outs = [torch.empty_like(buf) for _ in range(k)]
    dist.all_gather(outs, buf.contiguous(), group=mesh.get_group(j))
    out_shape = [len(ix) for ix in target]
    result = local.new_empty(out_shape)
    where = {g: i for i, g in enumerate(target[d])}
    for c in range(k):
        if not peer_idx[c]:
            continue
        pos = torch.tensor([where[g] for g in peer_idx[c]], dtype=torch.long, device=result.device)
        result.index_copy_(d, pos, outs[c].narrow(d, 0, len(peer_idx[c])))
    return result
