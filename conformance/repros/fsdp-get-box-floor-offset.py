"""FSDP's TP state-dict helper reports uneven TP shards at floor-division offsets."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.fsdp  # first: the module below has an import cycle
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel.fsdp import _get_local_box

DEFECT = {
    "id": "fsdp-get-box-floor-offset",
    "title": "tensor/parallel/fsdp.py _get_box states uneven TP shards at floor-division offsets",
    "area": "chunk",
    "rule": "CHUNK-1",
    "upstream": "pytorch PR #188947",
    "nproc": 2,
    "torch_does": "5 rows over 2 TP ranks: rank 1 holds rows [3, 5) but _get_box reports offset 2",
    "spec_says": "chunk i of n rows over k ranks starts at min(i * ceil(n / k), n): rank 1 at 3",
    "tests": [
        "test_chunk.py::test_fsdp_box_holds_the_local_tensor",
        "test_fsdp.py::test_chunk_tensor_states_the_rows_it_holds",
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
full = torch.arange(5).reshape(5, 1)  # row i holds the value i
dt = distribute_tensor(full, init_device_mesh("cpu", (world,)), [Shard(0)])
rows = dt.to_local().flatten().tolist()
offsets, sizes = _get_local_box(dt)
start = rows[0] if rows else full.shape[0]
box = {"rank": rank, "shape": [5], "spec": [[[start], [len(rows)]]]}
print("BOXES", json.dumps({**box, "torch": [[[offsets[0]], [sizes[0]]]]}))
bad = offsets[0] != start
if bad:
    print(
        f"DIVERGES rank {rank}: _get_local_box says rows [{offsets[0]}, {offsets[0] + sizes[0]}) "
        f"but the local tensor holds rows {rows}; the spec says offset {start}"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
