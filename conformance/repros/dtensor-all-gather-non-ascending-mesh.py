"""DTensor's redistribute/full_tensor on a mesh [1, 0] put rows out of order and lose data."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

DEFECT = {
    "id": "dtensor-all-gather-non-ascending-mesh",
    "title": "redistribute to Replicate and full_tensor concatenate by group rank, not mesh "
    "coordinate, on a mesh whose ranks are not in ascending order",
    "area": "dtensor",
    "rule": "DTENSOR-1",
    "upstream": None,
    "issue_text": """### DTensor all-gather ignores the mesh's rank order (wrong rows, lost data)

On a 1-D mesh whose ranks are not ascending, `DeviceMesh("cpu", [1, 0])`, rank 1 is
coordinate 0 and rank 0 is coordinate 1. A `Shard(0)` DTensor built with
`src_data_rank=None` holds rows `[0, 1]` at rank 1 and `[2]` at rank 0, as
`mesh.get_coordinate()` and `compute_local_shape_and_global_offset` say. Then
`dt.full_tensor()` (and `dt.redistribute(mesh, [Replicate()])`) returns `[2, 0, 0]` instead of
`[0, 1, 2]` on both ranks: the pieces are concatenated in group-rank order, and the uneven
split's padding takes the place of row 1. No error is raised.

```python
mesh = DeviceMesh("cpu", [1, 0])
dt = distribute_tensor(torch.arange(3), mesh, [Shard(0)], src_data_rank=None)
print(dist.get_rank(), dt.to_local(), dt.full_tensor())  # full_tensor: [2, 0, 0]
```

Expected: `[0, 1, 2]`. torch 2.13.0, CPU, gloo, `torchrun --standalone --nproc-per-node 2`.
Related: `distribute_tensor`'s default scatter has the same root (chunk i goes to group rank i).""",
    "nproc": 2,
    "torch_does": "on DeviceMesh('cpu', [1, 0]) full_tensor() of arange(3) sharded Shard(0) is "
    "[2, 0, 0] on both ranks: group-rank order, and padding instead of row 1",
    "spec_says": "the full tensor is [0, 1, 2]: coordinate i's piece goes at chunk i's rows",
    "tests": [
        "test_dtensor_moves.py::test_redistribute_on_a_mesh_in_any_rank_order_holds_the_oracles_pieces"
    ],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = DeviceMesh("cpu", [1, 0])  # rank 1 is coordinate 0, rank 0 is coordinate 1
dt = distribute_tensor(torch.arange(3), mesh, [Shard(0)], src_data_rank=None)  # row i = i
full = dt.full_tensor().tolist()
gathered = dt.redistribute(mesh, [Replicate()]).to_local().tolist()
bad = full != [0, 1, 2] or gathered != [0, 1, 2]
if bad:
    print(
        f"DIVERGES rank {rank}: full_tensor() gives {full}, redistribute to Replicate gives "
        f"{gathered}; the spec says [0, 1, 2]"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
