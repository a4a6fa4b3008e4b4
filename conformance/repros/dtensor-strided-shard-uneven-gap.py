"""Uneven _StridedShard: the boxes DTensor states leave a gap (row 4 in none, row 2 in two).

pytorch#168134 reports this split (5 rows, split_factor 2, 2 ranks) and expects other local
data (rank 0 rows 0, 1, 3, 4). The spec agrees with torch's data (DTENSOR-4: parts [0, 3)
[3, 5), chunk i of each part to rank i); what breaks is the description of it, one box per
rank from compute_local_shape_and_global_offset, which is what DCP and resharding read.
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

DEFECT = {
    "id": "dtensor-strided-shard-uneven-gap",
    "title": "uneven _StridedShard(0, split_factor=2): compute_local_shape_and_global_offset "
    "states boxes that leave a gap and overlap",
    "area": "dtensor",
    "rule": "DTENSOR-7",
    "upstream": "pytorch#168134",
    "nproc": 2,
    "torch_does": "5 rows on 2 ranks: rank 0 holds rows 0, 1, 3 and rank 1 rows 2, 4 (as the "
    "rule says), but the stated boxes are [0, 3) and [2, 4): row 4 in none, row 2 in both",
    "spec_says": "each rank's boxes are its runs: rank 0 [0, 2) [3, 4), rank 1 [2, 3) [4, 5); "
    "together they cover every row once",
    "tests": ["test_convert.py::test_dtensor_chunk_list_is_where_the_local_data_sits"],
}

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,))
placements = [_StridedShard(0, split_factor=2)]
# the path of the upstream issue: replicate, then redistribute to the strided placement
dt = distribute_tensor(torch.arange(5), mesh, [Replicate()]).redistribute(mesh, placements)
rows = dt.to_local().tolist()  # row i holds i
spec: list = []  # maximal runs of consecutive rows, in local order
for r in rows:
    if spec and spec[-1][0][0] + spec[-1][1][0] == r:
        spec[-1][1][0] += 1
    else:
        spec.append([[r], [1]])
shape, offset = compute_local_shape_and_global_offset(dt.shape, mesh, placements)
stated = [list(offset), list(shape)]
print("BOXES", json.dumps({"rank": rank, "shape": [5], "spec": spec, "torch": [stated]}))
everyone = [None, None]
dist.all_gather_object(everyone, stated)
covered = [i for (o,), (s,) in everyone for i in range(o, o + s)]
gaps = [i for i in range(5) if i not in covered]
twice = sorted({i for i in covered if covered.count(i) > 1})
bad = [stated] != spec
if bad:
    print(
        f"DIVERGES rank {rank}: holds rows {rows} but the stated box is offset {offset[0]} "
        f"size {shape[0]}; rows in no stated box {gaps}, in two {twice}; the spec says {spec}"
    )
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if bad else 0)
