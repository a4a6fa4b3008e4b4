"""pytorch#103306's own example: a 5x10 tensor replicated, sharded on 4 ranks, replicated again."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

DEFECT = {
    "id": "dtensor-uneven-shard-replicate-round-trip",
    "title": "DTensor uneven sharding corner cases: Replicate -> Shard(0) -> Replicate of a 5x10 "
    "tensor on 4 ranks gives an 8x10 tensor (pytorch#103306, checked)",
    "area": "dtensor",
    "rule": "DTENSOR-1",
    "upstream": "pytorch#103306",
    "checked": "not reproduced on torch 2.13.0 (CPU): the round trip keeps its 5x10 shape and "
    "values; kept so that every release gets a verdict on the open issue",
    "nproc": 4,
    "torch_does": "the issue reports (5, 10) -> Shard(0) -> Replicate giving (8, 10) on every "
    "rank of 4",
    "spec_says": "Shard(0) of 5 rows on 4 ranks holds the torch.chunk pieces (2, 2, 1, 0 rows); "
    "replicating them again gives the 5x10 tensor on every rank",
}

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
x = torch.arange(50.0).reshape(5, 10)  # row i holds 10 * i .. 10 * i + 9
sharded = DTensor.from_local(x, mesh, [Replicate()]).redistribute(mesh, [Shard(0)])
y = sharded.redistribute(mesh, [Replicate()]).to_local()
pieces = torch.chunk(x, 4, dim=0)
want = pieces[rank] if rank < len(pieces) else x[5:]
bad = []
mine = sharded.to_local()
if tuple(mine.shape) != tuple(want.shape) or not torch.equal(mine, want):
    bad.append(f"Shard(0) holds rows {mine[:, 0].div(10).int().tolist()}")
if tuple(y.shape) != (5, 10) or not torch.equal(y, x):
    bad.append(f"Replicate again gives shape {tuple(y.shape)}")
if bad:
    print(
        f"DIVERGES rank {rank}: {'; '.join(bad)}; the spec says Shard(0) holds rows "
        f"{want[:, 0].div(10).int().tolist()} and Replicate again gives the 5x10 tensor"
    )
    sys.stdout.flush()
    os._exit(1)
dist.barrier()
dist.destroy_process_group()
