"""Convert a DTensor's layout, check it, draw it and reshard it on every rank.

torchrun --nproc-per-node 4 examples/reshard_dtensor.py
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

from shardspec.metadata import chunk_layout, from_dtensor
from shardspec.reshard import reshard

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
full = torch.arange(10 * 7, dtype=torch.float32).reshape(10, 7)
dt = distribute_tensor(full, mesh, [Shard(0)])  # 10 rows over 4 ranks: 3, 3, 3, 1

src = from_dtensor(dt).validate()  # the Layout: global shape + (box, rank) per shard
dst = chunk_layout(src.shape, dim=1, ranks=[3, 2, 1, 0])  # columns, ranks reversed
(mine,) = reshard([dt.to_local()], src, dst)  # one all_to_all_single, no global tensor

(box,) = dst.boxes_of(rank)
assert torch.equal(mine, full[box.slices()])
if rank == 0:
    print(src.render(), dst.render(), sep="\n\n")
dist.barrier()  # no rank tears gloo down while a peer is still sending
dist.destroy_process_group()
