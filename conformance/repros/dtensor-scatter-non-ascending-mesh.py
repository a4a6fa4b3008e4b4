"""distribute_tensor's default scatter gives shards to the wrong ranks on a mesh [1, 0]."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

DEFECT = {
    "id": "dtensor-scatter-non-ascending-mesh",
    "title": "distribute_tensor's scatter (src_data_rank=0) puts shards on the wrong ranks for "
    "a mesh whose ranks are not in ascending order",
    "area": "dtensor",
    "rule": "DTENSOR-1",
    "upstream": None,
    "issue_text": """### distribute_tensor scatters by group rank, not mesh coordinate

On a 1-D mesh whose ranks are not ascending, `DeviceMesh("cpu", [1, 0])`, rank 1 is
coordinate 0 and rank 0 is coordinate 1. `distribute_tensor(torch.arange(2),
mesh, [Shard(0)])` with the default `src_data_rank=0` gives rank 0 the value 0 and rank 1
the value 1 (chunk i to the group's rank i), while `mesh.get_coordinate()`,
`compute_local_shape_and_global_offset` and `src_data_rank=None` (every rank splitting its own
copy) all give rank 0 chunk 1: the data is not where every description of it says.

```python
mesh = DeviceMesh("cpu", [1, 0])
dt = distribute_tensor(torch.arange(2), mesh, [Shard(0)])
print(dist.get_rank(), mesh.get_coordinate(), dt.to_local())  # rank 0: [1] [0]
```

Expected: rank 0 holds `[1]` (chunk 1, its coordinate). Actual: `[0]`. torch 2.13.0, CPU,
gloo, `torchrun --standalone --nproc-per-node 2`.""",
    "nproc": 2,
    "torch_does": "on DeviceMesh('cpu', [1, 0]) rank 0 (coordinate 1) receives chunk 0",
    "spec_says": "coordinate i holds chunk i: rank 0 (coordinate 1) holds row 1",
    "tests": ["test_dtensor_moves.py::test_distribute_puts_each_piece_at_its_mesh_coordinate"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = DeviceMesh("cpu", [1, 0])  # rank 1 is coordinate 0, rank 0 is coordinate 1
(coord,) = mesh.get_coordinate()
rows = distribute_tensor(torch.arange(2), mesh, [Shard(0)]).to_local().tolist()  # row i = i
box = {"rank": rank, "shape": [2], "spec": [[[coord], [1]]]}
print("BOXES", json.dumps({**box, "torch": [[[r], [1]] for r in rows]}))
bad = rows != [coord]
if bad:
    print(f"DIVERGES rank {rank}: coordinate {coord} holds rows {rows}; the spec says [{coord}]")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
